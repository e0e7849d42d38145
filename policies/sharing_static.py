"""``static``: every model resident from the start, each with a fixed share of its GPU's KV memory (static
partition, DESIGN §9's baseline).

Placement (:func:`static_placement`, shared with ``muxserve``): Prism's KV-pressure greedy (Algorithm 1,
``policies/placement.py``) run once, on each model's *expected* demand over the whole trace (its request rate ×
mean tokens, the a-priori load a static deployment is sized for) rather than a measured one; every model must
fit beside the others with the KV of its largest request (its floor), or the fleet is too small for the scheme.
Shares: each resident's floor, and what a GPU's memory leaves after its residents' weights (in whole pages, as
mapped) and floors, split among them in proportion to their expected demand."""

from __future__ import annotations

from prism.errors import UserError
from prism.policies.placement import ModelLoad, place
from prism.policies.sharing import Action, FleetView, ModelView, SharingScheme, activate


class FleetTooSmall(UserError):
    """The scheme cannot place every model on this fleet (a sweep or a plan counts it as 0% attainment)."""


def expected_load(m: ModelView, floor: bool = False) -> ModelLoad:
    """The model's expected demand and its weights as its GPUs map them; ``floor``: with its KV floor (a fixed
    pool that must hold its largest request beside the other residents')."""
    return ModelLoad(m.name, m.expected_rate * m.expected_tokens, m.kv_bytes_per_token,
                     m.mapped_weight_bytes * m.tp, m.tpot_slo_s, m.tp, min_kv_bytes=m.min_kv_bytes if floor else 0.0)


def static_placement(fleet: FleetView, scheme: str, floors: bool) -> dict[str, tuple[int, ...]]:
    """Algorithm 1 on the expected demand, every GPU keeping room for the fleet's largest request and, with
    ``floors`` (fixed pools), for each resident's; raises :class:`FleetTooSmall` if a model does not fit."""
    models = list(fleet.models.values())
    result = place([expected_load(m, floors) for m in models], [g.capacity_bytes for g in fleet.gpus],
                   nodes=[g.node for g in fleet.gpus], min_kv_bytes=max(m.min_kv_bytes for m in models))
    if result.unplaced:
        raise FleetTooSmall(f"{scheme}: {len(fleet.gpus)} GPUs cannot hold every model with room for its KV "
                            f"({', '.join(result.unplaced)} left out)")
    return dict(result.gpus)


class Static(SharingScheme):
    name = "static"
    elastic = False

    def start(self, fleet: FleetView) -> list[Action]:
        self.placed = static_placement(fleet, self.name, floors=True)
        return [activate(name, gpus) for name, gpus in self.placed.items()]

    def kv_limit(self, fleet: FleetView, gpu: int, model: str) -> float:
        """This model's share, in bytes of this GPU, of what the residents' weights leave."""
        residents = [fleet.models[n] for n, g in self.placed.items() if gpu in g]
        floor = {m.name: m.min_kv_bytes / m.tp for m in residents}
        demand = {m.name: expected_load(m).demand / m.tp for m in residents}
        spare = (fleet.gpus[gpu].capacity_bytes - sum(m.mapped_weight_bytes for m in residents)
                 - sum(floor.values()))  # >= 0: the placement kept room for every floor
        total = sum(demand.values())
        share = demand[model] / total if total > 0 else 1 / len(residents)
        return floor[model] + spare * share
