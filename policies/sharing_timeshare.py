"""``timeshare``: one model active per GPU at a time, swapped on demand (QLM-like; DESIGN §9's baseline).

Each model has a home GPU (models by expected demand, dealt to the GPUs in turn; a model of tp GPUs takes tp
consecutive ones); the most demanded model of each GPU starts active. A request for a model that is not
active waits; its GPU swaps it in once the active model has nothing running or queued (a swap waits for the
engine to idle: the model's requests are never dropped), the model whose oldest waiting request is oldest
first. ``timeshare.cold_start`` starts each swapped-in engine from scratch (ServerlessLLM-like: an SGLang
process and its CUDA graphs, ``cold_start_s``) where the default takes one from a pool of initialized engines."""

from __future__ import annotations

from dataclasses import dataclass

from prism.policies.sharing import ACTIVE, LOADING, Action, FleetView, SharingScheme, activate, evict, \
    models_by_demand


@dataclass
class TimeShareConfig:
    cold_start: bool = False  # each swap starts its engine from scratch (ServerlessLLM-like)


class TimeShare(SharingScheme):
    name = "timeshare"
    Knobs = TimeShareConfig
    elastic = False  # the active model has the GPU to itself: a fixed pool, as SGLang sizes it

    def __init__(self, knobs: TimeShareConfig | None = None) -> None:
        super().__init__(knobs or TimeShareConfig())
        self.engine_pool = not self.knobs.cold_start
        self.home: dict[str, tuple[int, ...]] = {}

    def start(self, fleet: FleetView) -> list[Action]:
        n, nxt = len(fleet.gpus), 0
        for m in models_by_demand(fleet):
            first = nxt if nxt + m.tp <= n else 0
            self.home[m.name] = tuple(range(first, first + m.tp))
            nxt = (first + m.tp) % n
        out, taken = [], set()
        for m in models_by_demand(fleet):
            if not taken & set(self.home[m.name]):
                out.append(activate(m.name, self.home[m.name]))
                taken |= set(self.home[m.name])
        return out

    def _holders(self, fleet: FleetView, gpus: tuple[int, ...]) -> list[str]:
        """The models whose weights are on any of these GPUs."""
        return [n for n, m in fleet.models.items() if m.state != "evicted" and set(m.gpus) & set(gpus)]

    def wake(self, fleet: FleetView, model: str) -> list[Action]:
        home = self.home[model]
        holders = self._holders(fleet, home)
        if any(fleet.models[h].state != ACTIVE or fleet.models[h].busy for h in holders):
            return []  # a swap waits for the GPU's engine to idle (idle() retries)
        return [*(evict(h) for h in holders), activate(model, home)]

    def idle(self, fleet: FleetView, model: str) -> list[Action]:
        """A model idles: swap in the waiting models whose home GPUs have no busy engine, the one whose oldest
        request has waited longest first. Not only those homed where the idle model is: a model of tp GPUs that
        leaves frees GPUs another waiting model may be homed on alone."""
        waiting = sorted((m for n, m in fleet.models.items() if m.pending and m.state not in (ACTIVE, LOADING)),
                         key=lambda m: (m.oldest_pending, m.name))
        out: list[Action] = []
        taken: set[int] = set()  # GPUs this decision already swaps
        for m in waiting:
            home = set(self.home[m.name])
            if home & taken:
                continue
            actions = self.wake(fleet, m.name)
            if actions:
                out += actions
                taken |= home.union(*(fleet.models[a.model].gpus for a in actions if a.kind == "evict"))
        return out
