"""First come, first served: the order of arrival, nothing else."""

from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


class FCFS(Scheduler):
    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        # stable: equal arrival times keep queue (submission) order
        return Plan(sorted(waiting, key=attrgetter("arrival")))
