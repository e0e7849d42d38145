"""First come, first served: the order of arrival, nothing else.

Requests join an engine's waiting queue at its back as they arrive (a front end hands a window over at one
instant, in its own order) and leave it from the front, so the queue is in arrival order already: FCFS hands
it back as it is, checking only the arrivals since the last round, which costs nothing per round however
long the backlog. A queue found out of arrival order is sorted, stably."""

from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


class FCFS(Scheduler):
    def __init__(self) -> None:
        self._tail: tuple[int, WaitingRequest | None] = (0, None)  # (length, last request) of the queue handed back

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if isinstance(waiting, list) and self._in_arrival_order(waiting):
            self._tail = (len(waiting), waiting[-1] if waiting else None)
            return Plan(waiting)
        order = sorted(waiting, key=attrgetter("arrival"))  # stable: equal times keep queue (submission) order
        self._tail = (len(order), order[-1] if order else None)
        return Plan(order)

    def _in_arrival_order(self, waiting: list) -> bool:
        """Whether ``waiting`` is in arrival order, checked on the arrivals only: the part handed back last
        round stays in place but for its admitted head (its last request then stands where it should)."""
        n, last = self._tail
        if n == 0:
            start = 0
        elif n <= len(waiting) and waiting[n - 1] is last:
            start = n - 1
        else:
            return False
        prev = waiting[start].arrival if waiting else 0.0
        for r in waiting[start + 1:]:
            if r.arrival < prev:
                return False
            prev = r.arrival
        return True

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        n, last = self._tail
        self._tail = (n - len(admitted), last if n > len(admitted) else None)
