"""What an engine does around its policies when it admits a request, lets one go, or releases a front end's
window: one implementation, which the simulator's engine and the SGLang plugin both call, so that the
simulated and the live run of a method count, label and inform their policies alike.

* :class:`Bookkeeper`: a request's admission (lane, counters, the eviction policy's and the demand hints'
  view of the running batch), the end of a round (the scheduler's ``on_dispatch``) and a request leaving the
  running batch (finished or retracted);
* :func:`release_window`: one round of an admission front end over the requests its window held.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

from prism.counters import (ADMITTED_LANE, FRONT_ALIGNMENT_MOVES, FRONTEND_WINDOWS, REPREFILL_HIT_TOKENS,
                            REPREFILLED_TOKENS)

from prism.policies.base import DemandHints, EvictionPolicy, SchedContext, Scheduler, WaitingRequest


class Bookkeeper:
    """One engine's bookkeeping of admissions: ``counters`` is the engine's counter set."""

    __slots__ = ("scheduler", "eviction", "hints", "counters")

    def __init__(self, scheduler: Scheduler, eviction: EvictionPolicy, hints: DemandHints,
                 counters: Counter) -> None:
        self.scheduler, self.eviction, self.hints, self.counters = scheduler, eviction, hints, counters

    def admit(self, seq, lane: str, hit: int, new: int, again: bool) -> None:
        """``seq`` joins the running batch with ``hit`` prompt tokens cached and ``new`` to compute, in the
        ``lane`` its plan gave it (a lane set earlier, by a front end or a first admission, stays); ``again``:
        a retracted request prefilled again, whose tokens are counted apart (its first hit is its record's)."""
        counters = self.counters
        if again:
            counters[REPREFILL_HIT_TOKENS] += hit
            counters[REPREFILLED_TOKENS] += new
        if not seq.lane:
            seq.lane = lane
        counters[ADMITTED_LANE[seq.lane]] += 1
        counters[FRONT_ALIGNMENT_MOVES] += seq.realigned
        self.eviction.on_admit(seq)
        self.hints.admit(seq.shared_ids())

    def dispatched(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        """The round is over: the scheduler learns what the engine admitted (QAS predicts its next batch and
        publishes P̂ for DART)."""
        if admitted:
            self.scheduler.on_dispatch(admitted, ctx)

    def release(self, seq) -> None:
        """``seq`` left the running batch (finished or retracted): its segments are no longer active."""
        self.hints.release(seq.shared_ids())


def release_window(scheduler: Scheduler, held: Sequence[WaitingRequest], ctx: SchedContext,
                   submit: Callable[[WaitingRequest], None], counters: Counter) -> None:
    """An admission front end's round: ``scheduler`` orders the requests a window ``held``; each is realigned
    to its plan's segment order, labelled with its lane and handed to the engine (``submit``) in plan order;
    the whole window counts as dispatched."""
    plan = scheduler.plan(held, ctx)
    for seq in plan.order:
        seq.realign(plan.align.get(seq.id))
        seq.lane = plan.lane(seq.id)
        submit(seq)
    scheduler.on_dispatch(plan.order, ctx)
    counters[FRONTEND_WINDOWS] += 1


__all__ = ["Bookkeeper", "release_window"]
