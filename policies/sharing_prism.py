"""``prism``: Prism's sharing (OSDI'26 §5-§7; DESIGN §9): elastic KV, on-demand activation from an engine pool
with parallel loading, KV-pressure placement with a migration threshold, idle eviction when memory is needed,
and one deadline-ordered request queue per GPU.

* **Start** (:meth:`PrismSharing.start`): with no demand measured yet, the models are placed by memory alone,
  largest first, each on the GPU with the most memory left, as long as the GPU keeps room for the fleet's largest
  request (as an activation does); the others wait for a request.
* **Activation** (:meth:`PrismSharing.wake`): a model with requests and no engine goes to the GPU of lowest KV
  pressure ratio that fits its weights (``policies/placement.py`` ``place_woken``); where none fits, models idle
  for more than ``idle_s`` (45 s, App. A.4) are evicted, longest idle first, from the GPU where that frees enough;
  else the model waits for the next tick. Other models' KV shrinks to make room (the fleet's balloon: cached
  prefixes at once, live KV as requests finish).
* **Placement** (:meth:`PrismSharing.tick`, every ``interval_s``): Algorithm 1 on every active model's measured
  token rate (prompt tokens admitted and tokens decoded, over the fleet's rate window, about 60 s) with its
  current GPUs; a model moves only if that lowers its GPU's KVPR by more than τ (``tau``, here relative: a share
  of the fleet's mean KVPR, since KVPR's units scale with the load; the paper publishes no value). Default 1:
  measured on ``traces/multimodel.yaml`` on 2 GPUs, τ = 0.3 / 1 / 3 moved models 33 / 2 / 0 times in 600 s (the
  paper: 3 migrations in its 10-minute run of 8 models on 2 GPUs) for 0.952 / 0.966 / 0.979 attainment: a move
  costs the model its cached prefixes and a reload. A move starts only where its weights fit now beside the
  copies there (:meth:`PrismSharing._startable`); the rest wait for a later tick.
* **Local arbitration**: ``queue: deadline`` orders each GPU's waiting requests of all its models by
  Moore-Hodgson on TTFT deadlines (``policies/moore_hodgson.py``); ``fcfs`` is the ablation.

Each part can be switched off for ablations: ``placement: false`` (no periodic moves), ``queue: fcfs``,
``engine_pool: false`` (cold engine starts), ``parallel_links: 1`` (one host link per load; 0: every GPU of the
node, gathered over NVLink, the paper's)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from prism.config import choice, nonneg, positive
from prism.policies.placement import ModelLoad, idle_models, place, place_woken
from prism.policies.sharing import ACTIVE, EVICTED, Action, FleetView, ModelView, SharingScheme, activate, evict, \
    migrate


@dataclass
class PrismSharingConfig:
    interval_s: float = positive(5.0, "seconds between KV-pressure placements (the paper: every few seconds)")
    tau: float = nonneg(1.0, "migration threshold: a move must lower its GPU's KVPR by this share of the fleet's "
                             "mean KVPR")
    idle_s: float = positive(45.0, "a model idle this long may be evicted when memory is needed (App. A.4)")
    placement: bool = True  # periodic KV-pressure placement (false: the ablation without it)
    queue: str = choice("deadline", ("deadline", "fcfs"), "each GPU's request order: Moore-Hodgson on TTFT "
                                                          "deadlines, or first come first served (ablation)")
    engine_pool: bool = True  # activations take a pre-initialized engine (false: cold starts)
    parallel_links: int = nonneg(0, "host links one weight load uses (0: every GPU of the node, over NVLink; 1: "
                                    "the target's own)")


def _load(m: ModelView, current: bool = True) -> ModelLoad:
    return ModelLoad(m.name, m.token_rate, m.kv_bytes_per_token, m.weight_bytes, m.tpot_slo_s, m.tp,
                     tuple(m.gpus) if current and m.state == ACTIVE else ())


class PrismSharing(SharingScheme):
    measures_rates = True  # Algorithm 1's KVPR
    name = "prism"
    Knobs = PrismSharingConfig

    def __init__(self, knobs: PrismSharingConfig | None = None) -> None:
        super().__init__(knobs or PrismSharingConfig())
        k = self.knobs
        self.queue, self.interval_s = k.queue, k.interval_s
        self.engine_pool, self.parallel_links = k.engine_pool, k.parallel_links

    def _gpu_loads(self, fleet: FleetView, planned: Sequence[Action] = ()) -> list[tuple[float, float]]:
        """(Σd, Σw) per GPU over the models with weights there, shares of TP models split, as they will be after
        the ``planned`` actions (decided but not yet carried out; a moving model is on both its old and new GPUs
        while it moves)."""
        gone = {a.model for a in planned if a.kind == "evict"}
        coming = {a.model: a.gpus for a in planned if a.kind == "activate"}
        moving = {a.model: a.gpus for a in planned if a.kind == "migrate"}
        loads = [[0.0, 0.0] for _ in fleet.gpus]
        for m in fleet.models.values():
            gpus = coming.get(m.name, () if m.state == EVICTED or m.name in gone else m.gpus)
            d = _load(m, False).demand
            for g in (*gpus, *moving.get(m.name, ())):
                loads[g][0] += d / m.tp
                loads[g][1] += m.weight_bytes / m.tp
        return [(d, w) for d, w in loads]

    def start(self, fleet: FleetView) -> list[Action]:
        free = {g.index: g.capacity_bytes for g in fleet.gpus}
        room = self._room(fleet)  # as an activation leaves: no model's largest request is ever shut out
        out = []
        for m in sorted(fleet.models.values(), key=lambda m: (-m.weight_bytes, m.name)):
            if m.tp != 1:
                continue  # a TP model waits for its first request (placement then picks a node)
            best = max(free, key=lambda i: (free[i], -i))
            if free[best] - m.weight_bytes > room:
                out.append(activate(m.name, [best]))
                free[best] -= m.weight_bytes
        return out

    def _room(self, fleet: FleetView) -> float:
        """The KV room every GPU keeps beside its weights: the fleet's largest request."""
        return max(m.min_kv_bytes for m in fleet.models.values())

    def wake(self, fleet: FleetView, model: str) -> list[Action]:
        return self._wake(fleet, model, [])

    def _wake(self, fleet: FleetView, model: str, planned: Sequence[Action]) -> list[Action]:
        """The actions that activate ``model``, after the ``planned`` ones of the same decision (several models
        woken at once must not count the same free memory twice)."""
        m = fleet.models[model]
        caps = [g.capacity_bytes for g in fleet.gpus]
        nodes = [g.node for g in fleet.gpus]
        room = self._room(fleet)
        gpus = place_woken(_load(m, False), self._gpu_loads(fleet, planned), caps, nodes, room)
        if gpus is not None:
            return [activate(model, gpus)]
        # memory is needed: evict idle models, longest idle first, where that makes room
        taken = {a.model for a in planned}
        busy = {n for n, v in fleet.models.items() if v.busy or v.pending or v.state not in (ACTIVE, EVICTED)}
        idle = idle_models({n: v.last_active for n, v in fleet.models.items() if v.state == ACTIVE and n not in taken},
                           busy, fleet.now, self.knobs.idle_s)
        gone: list[str] = []
        for name in idle:
            gone.append(name)
            gpus = place_woken(_load(m, False), self._gpu_loads(fleet, [*planned, *map(evict, gone)]), caps, nodes,
                               room)
            if gpus is not None:
                return [*(evict(n) for n in gone if set(fleet.models[n].gpus) & set(gpus)), activate(model, gpus)]
        return []

    def _wake_waiting(self, fleet: FleetView, planned: Sequence[Action] = ()) -> list[Action]:
        """Models still waiting for room: try again, one after the other, after the ``planned`` actions."""
        planned = list(planned)
        for name, m in fleet.models.items():
            if m.pending and m.state == EVICTED:
                planned += self._wake(fleet, name, planned)
        return planned

    def tick(self, fleet: FleetView) -> list[Action]:
        out: list[Action] = []
        if self.knobs.placement:
            active = [m for m in fleet.models.values() if m.state == ACTIVE]
            if active:
                caps = [g.capacity_bytes for g in fleet.gpus]
                loads = self._gpu_loads(fleet)
                ratios = [d / (c - w) if c > w else math.inf for (d, w), c in zip(loads, caps)]
                finite = [r for r in ratios if math.isfinite(r)]
                mean = sum(finite) / len(finite) if finite else 0.0
                result = place([_load(m) for m in active], caps, self.knobs.tau * mean,
                               [g.node for g in fleet.gpus], self._room(fleet))
                out += self._startable(fleet, [migrate(n, result.gpus[n]) for n in result.moved])
        return self._wake_waiting(fleet, out)

    def _startable(self, fleet: FleetView, moves: list[Action]) -> list[Action]:
        """The moves whose weights fit on their GPUs now, beside the weights of every copy there (loading ones
        too) and the fleet's largest request; the others wait for a later tick: a move that needs another model
        to leave first could wait for it forever (two models trading GPUs each wait for the other's weights)."""
        room = self._room(fleet)
        left = {g.index: g.capacity_bytes - sum(fleet.models[n].mapped_weight_bytes for n in g.resident)
                for g in fleet.gpus}
        out = []
        for a in moves:
            weights = fleet.models[a.model].mapped_weight_bytes
            if all(left[i] - weights > room for i in a.gpus):
                for i in a.gpus:
                    left[i] -= weights
                out.append(a)
        return out

    def idle(self, fleet: FleetView, model: str) -> list[Action]:
        return self._wake_waiting(fleet)
