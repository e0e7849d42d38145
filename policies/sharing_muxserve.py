"""``muxserve``: every model resident from the start, sharing its GPU's KV memory elastically (pages on demand),
with no eviction and no migration (MuxServe-style, DESIGN §9's baseline).

The placement is ``static``'s (:func:`~prism.policies.sharing_static.static_placement`: Prism's KV-pressure greedy
on the expected demand), without ``static``'s per-model KV floors: no model's KV is capped below its GPU, each
maps pages as its requests need them, so a bursting model takes the memory an idle one leaves."""

from __future__ import annotations

from prism.policies.sharing import Action, FleetView, SharingScheme, activate
from prism.policies.sharing_static import static_placement


class MuxServe(SharingScheme):
    name = "muxserve"

    def start(self, fleet: FleetView) -> list[Action]:
        return [activate(name, gpus) for name, gpus in static_placement(fleet, self.name, floors=False).items()]
