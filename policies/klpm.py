"""k-LPM (Dexter et al. 2025): longest-prefix-match with a guaranteed FCFS share.

Out of every k admissions, one goes to the oldest waiting request and k-1 to the requests with the longest
cached prefix (greedily, against the cache as it is at the start of the round). k=1 is FCFS; as k grows it
becomes LPM. The admission count carries across rounds, so the FCFS share holds however the engine's
budgets cut each batch: the last of every k admissions is the FCFS one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from prism.config import positive

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


@dataclass
class KLPMConfig:
    k: int = positive(2, "one FCFS admission in every k (1 = FCFS; large = LPM)")


class KLPM(Scheduler):
    def __init__(self, config: KLPMConfig | None = None) -> None:
        self.config = config or KLPMConfig()
        self.admitted = 0  # admissions so far, across rounds

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        k = self.config.k
        fifo = sorted(waiting, key=lambda r: (r.arrival, r.id))
        matched = {r.id: ctx.cache.match_len(r.key) for r in waiting}
        by_hit = sorted(fifo, key=lambda r: -matched[r.id])  # stable: older first among equal hits
        taken: set[int] = set()
        order, cold = [], set()
        fi = hi = 0
        for slot in range(len(waiting)):
            if (self.admitted + slot) % k == k - 1:
                while fifo[fi].id in taken:
                    fi += 1
                pick = fifo[fi]
                cold.add(pick.id)
            else:
                while by_hit[hi].id in taken:
                    hi += 1
                pick = by_hit[hi]
            taken.add(pick.id)
            order.append(pick)
        return Plan(order, lanes=dict.fromkeys(cold, "cold"))

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        self.admitted += len(admitted)
