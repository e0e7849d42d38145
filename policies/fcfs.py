"""First come, first served: the order of arrival, nothing else."""

from __future__ import annotations

from typing import Sequence

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


class FCFS(Scheduler):
    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        # the queue is in arrival order already, as in SGLang, whose FCFS does not sort: a retracted request
        # rejoins at the back
        return Plan(list(waiting))
