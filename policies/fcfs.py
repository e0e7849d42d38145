"""First come, first served: the order of arrival, nothing else."""

from __future__ import annotations

from typing import Sequence

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


class FCFS(Scheduler):
    name = "fcfs"

    def keeps_order(self, n_waiting: int) -> bool:
        """Always: the queue's order is the plan (ContextPilot asks its engine order, ``contextpilot.py``)."""
        return True

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        # the queue is in arrival order already, as in SGLang, whose FCFS does not sort: a retracted request
        # rejoins at the back. It is handed back itself, so that an engine drops the admitted head in place
        # rather than copy a long backlog every round
        return Plan(waiting if isinstance(waiting, list) else list(waiting))
