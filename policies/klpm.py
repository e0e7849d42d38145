"""k-LPM (Dexter et al. 2025): longest-prefix-match with a guaranteed FCFS share.

Out of every k admissions, one goes to the oldest waiting request and k-1 to the requests with the longest
cached prefix (greedily, against the cache as it is at the start of the round). k=1 is FCFS; as k grows it
becomes LPM. The admission count carries across rounds, so the FCFS share holds however the engine's
budgets cut each batch: the last of every k admissions is the FCFS one.

Cost per round: a prefix match per waiting request and two sorts (C-level keys); the picks are made only for
the ``batch_hint`` requests the engine can admit this round (the rest follow in FIFO order: the next round
picks afresh from the cache as it is then). Matches are kept between rounds (:mod:`prism.policies.match_memo`):
a request is matched again only where the cache changed under its match, so a round past the knee, with
thousands waiting, walks the tree for the requests that arrived and those whose cached prefix changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Sequence

from prism.config import positive

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest
from prism.policies.match_memo import MatchMemo


@dataclass
class KLPMConfig:
    k: int = positive(2, "one FCFS admission in every k (1 = FCFS; large = LPM)")


class KLPM(Scheduler):
    name = "klpm"
    Knobs = KLPMConfig

    def __init__(self, config: KLPMConfig | None = None) -> None:
        self.config = config or KLPMConfig()
        self.admitted = 0  # admissions so far, across rounds
        self.matches = MatchMemo()

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        k = self.config.k
        fifo = sorted(waiting, key=attrgetter("arrival", "id"))
        match_len, cache = self.matches.match_len, ctx.cache
        hits = [match_len(cache, r.id, r.key) for r in fifo]
        by_hit = sorted(range(len(fifo)), key=hits.__getitem__, reverse=True)  # stable: older first among equals
        taken = [False] * len(fifo)
        order, cold = [], []
        fi = hi = 0
        # the engine admits at most batch_hint requests this round, and the next round picks afresh: past them
        # the queue follows in FIFO order
        slots = min(len(fifo), ctx.batch_hint) if ctx.batch_hint > 0 else len(fifo)
        for slot in range(slots):
            if (self.admitted + slot) % k == k - 1:
                while taken[fi]:
                    fi += 1
                pick = fi
                cold.append(fifo[pick].id)
            else:
                while taken[by_hit[hi]]:
                    hi += 1
                pick = by_hit[hi]
            taken[pick] = True
            order.append(fifo[pick])
        if slots < len(fifo):
            order += [r for r, t in zip(fifo, taken) if not t]
        return Plan(order, lanes=dict.fromkeys(cold, "cold"))

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        self.admitted += len(admitted)
        self.matches.forget(r.id for r in admitted)
