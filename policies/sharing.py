"""How several models share a fleet of GPUs: what a sharing scheme sees of the fleet, and what it decides.

A *sharing scheme* (Prism, OSDI'26 §5-§7, and its baselines: DESIGN §9) decides which models are resident on
which GPUs, when a model is activated, evicted or moved, and how much KV each resident model may hold. Like the
schedulers, a scheme never imports an engine: the fleet simulator (``sim/fleet.py``) shows it the fleet through
:class:`FleetView` and carries out the :class:`Action` it returns. One scheme per file, behind the registry
(``policies/registry.py``'s ``SHARING``):

=============  ===========================================================================================
``dedicated``  each model on GPUs of its own, its KV pool sized as SGLang sizes it: the cost reference
``static``     every model resident, fixed KV shares (static partition), static greedy placement
``muxserve``   every model resident, elastic KV (pages on demand), static greedy placement, no eviction or
               migration (MuxServe-style)
``timeshare``  one model active per GPU, swapped in on demand once the active one idles (QLM-like); cold
               engine starts optionally (ServerlessLLM-like)
``prism``      KV-pressure placement every ``interval_s`` with the migration threshold τ, idle eviction,
               elastic KV, the engine pool with parallel loading, and one deadline-ordered queue per GPU
=============  ===========================================================================================

A scheme's hooks, each returning a list of actions the fleet carries out in order:

* :meth:`SharingScheme.start`: at time 0 (the models resident from the start);
* :meth:`SharingScheme.wake`: a request came for a model that is neither active nor loading;
* :meth:`SharingScheme.tick`: every ``interval_s`` (schemes with a periodic decision);
* :meth:`SharingScheme.idle`: a model's engine has nothing left to do (a swap can happen now).

and its settings: :meth:`SharingScheme.kv_limit` (a fixed KV share, or None: elastic), ``queue`` (``fcfs``:
each model's engine orders its own queue by its method; ``deadline``: the GPU's shared Moore-Hodgson order,
:mod:`prism.policies.moore_hodgson`), ``engine_pool`` and ``parallel_links`` (how an activation starts its engine
and loads weights: ``calibration/loading.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from prism.policies.base import Policy

#: model states (DESIGN §9): evicted (weights in host memory only) -> loading -> active -> draining -> evicted
EVICTED, LOADING, ACTIVE, DRAINING = "evicted", "loading", "active", "draining"


class GpuView(Protocol):
    index: int
    node: int
    capacity_bytes: float  # memory the GPU hands out to models (weights and KV)
    free_bytes: float  # not mapped by any model now
    resident: tuple[str, ...]  # models with weights on it (loading, active or draining)


class ModelView(Protocol):
    name: str
    tp: int
    weight_bytes: float  # all shards
    mapped_weight_bytes: float  # one GPU's shard in whole pages of its memory: what its weights take there
    min_kv_bytes: float  # KV of its largest request in whole blocks (all shards): what it needs to serve at all
    kv_bytes_per_token: float  # all shards
    ttft_slo_s: float
    tpot_slo_s: float
    state: str  # EVICTED, LOADING, ACTIVE or DRAINING
    gpus: tuple[int, ...]  # where its weights are (the newest copy's, while one drains)
    token_rate: float  # prompt tokens admitted + decode tokens per second over the last window
    expected_rate: float  # requests per second over the whole trace (what a static placement plans for)
    expected_tokens: float  # mean prompt + output tokens of its requests
    last_active: float  # when its last request arrived or finished (-inf: never)
    busy: bool  # requests running or queued in its engines
    pending: int  # requests waiting for it to be activated
    oldest_pending: float  # arrival of the oldest of them (inf: none)


class FleetView(Protocol):
    now: float
    gpus: Sequence[GpuView]
    models: Mapping[str, ModelView]


@dataclass(frozen=True)
class Action:
    """``activate``: load ``model`` onto ``gpus``; ``evict``: drain it and free its GPUs; ``migrate``: load it
    onto ``gpus`` and drain the old copy once the new one serves."""

    kind: str
    model: str
    gpus: tuple[int, ...] = ()


def activate(model: str, gpus: Sequence[int]) -> Action:
    return Action("activate", model, tuple(gpus))


def evict(model: str) -> Action:
    return Action("evict", model)


def migrate(model: str, gpus: Sequence[int]) -> Action:
    return Action("migrate", model, tuple(gpus))


class SharingScheme(Policy):
    """The default of every hook: nothing to do; elastic KV; each engine orders its own queue."""

    queue = "fcfs"
    interval_s: float | None = None  # seconds between ticks (None: the scheme has none)
    elastic = True  # KV pages on demand under a balloon limit; False: each model keeps a fixed pool
    engine_pool = True  # an activation takes a pre-initialized engine (no engine start)
    parallel_links = 1  # host links one weight load uses at once (0: every GPU of the node, over NVLink)
    #: it reads each model's measured token rate (``ModelView.token_rate``): the fleet counts every iteration's
    #: tokens only for a scheme that does (a rate entry an iteration costs a shared fleet's run 3-5%: bench_fleet.py)
    measures_rates = False
    #: every model on GPUs of its own from the start, and nothing ever moves (no tick, wake or idle action): the
    #: models share nothing, so the fleet may run each on a clock of its own (``sim/fleet.py``)
    models_apart = False

    def __init__(self, knobs=None) -> None:
        self.knobs = knobs

    def start(self, fleet: FleetView) -> list[Action]:
        return []

    def wake(self, fleet: FleetView, model: str) -> list[Action]:
        return []

    def tick(self, fleet: FleetView) -> list[Action]:
        return []

    def idle(self, fleet: FleetView, model: str) -> list[Action]:
        return []

    def kv_limit(self, fleet: FleetView, gpu: int, model: str) -> float | None:
        """A resident model's fixed KV share on ``gpu``, in bytes (None: elastic, up to the GPU's free pages)."""
        return None


def models_by_demand(fleet: FleetView) -> list[ModelView]:
    """The models, most expected KV demand first (requests/s x tokens x KV bytes / TPOT SLO), by name on ties."""
    return sorted(fleet.models.values(), key=lambda m: (-m.expected_rate * m.expected_tokens * m.kv_bytes_per_token
                                                         / m.tpot_slo_s, m.name))


__all__ = ["EVICTED", "LOADING", "ACTIVE", "DRAINING", "GpuView", "ModelView", "FleetView", "Action",
           "activate", "evict", "migrate", "SharingScheme", "models_by_demand"]
