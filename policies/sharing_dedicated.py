"""``dedicated``: every model on GPUs of its own (the cost reference, DESIGN §9).

Model k (in the trace's order) takes the next ``tp`` GPUs; nothing is shared, nothing moves, and each model's
KV pool is what SGLang sizes on a GPU of its own (``--mem-fraction-static``), so a model on its dedicated GPU is
served exactly as a single engine serves it. The fleet needs Σ tp GPUs (:meth:`Dedicated.gpus_needed`)."""

from __future__ import annotations

from typing import Sequence

from prism.policies.sharing import Action, FleetView, SharingScheme, activate


class Dedicated(SharingScheme):
    name = "dedicated"
    elastic = False
    models_apart = True

    @staticmethod
    def gpus_needed(tps: Sequence[int]) -> int:
        return sum(tps)

    def start(self, fleet: FleetView) -> list[Action]:
        out, first = [], 0
        for m in fleet.models.values():
            out.append(activate(m.name, range(first, first + m.tp)))
            first += m.tp
        return out
