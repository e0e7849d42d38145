"""What an engine does around its policies when it admits a request, lets one go, or releases a front end's
window: one implementation, which the simulator's engine and the SGLang plugin both call, so that the
simulated and the live run of a method count, label and inform their policies alike.

* :class:`Bookkeeper`: a request's admission (lane, counters, the eviction policy's and the demand hints'
  view of the running batch), the end of a round (the scheduler's ``on_dispatch``) and a request leaving the
  running batch (finished or retracted);
* :func:`release_window`: one round of an admission front end over the requests its window held;
* :class:`Backlog`: the pending set of a front end that holds the backlog, and when its requests go.
"""

from __future__ import annotations

from typing import Any, Callable, MutableMapping, Sequence

from prism.counters import (ADMITTED_LANE, FRONT_ALIGNMENT_MOVES, FRONTEND_HELD, FRONTEND_PASSED, FRONTEND_WINDOWS,
                            REPREFILL_HIT_TOKENS, REPREFILLED_TOKENS)

from prism.policies.base import DemandHints, EvictionPolicy, SchedContext, Scheduler, WaitingRequest


class Bookkeeper:
    """One engine's bookkeeping of admissions: ``counters`` is the engine's counter set."""

    __slots__ = ("scheduler", "eviction", "hints", "counters")

    def __init__(self, scheduler: Scheduler, eviction: EvictionPolicy, hints: DemandHints,
                 counters: MutableMapping[str, int]) -> None:
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
                   submit: Callable[[Any], None], counters: MutableMapping[str, int], room: int | None = None,
                   counter: str = FRONTEND_WINDOWS) -> list:
    """An admission front end's round: ``scheduler`` orders the requests a window ``held``; the first ``room``
    of them in plan order (None: all) are realigned to their plan's segment order, labelled with their lane and
    handed to the engine (``submit``) in that order, and count as dispatched. Returns the others, in plan
    order (they stay held: a front end that holds the backlog plans them again with the next window's)."""
    plan = scheduler.plan(held, ctx)
    order = plan.order if isinstance(plan.order, list) else list(plan.order)
    released = order if room is None or room >= len(order) else order[:room]
    for seq in released:
        seq.realign(plan.align.get(seq.id))
        seq.lane = plan.lane(seq.id)
        submit(seq)
    scheduler.on_dispatch(released, ctx)
    counters[counter] += 1
    return [] if released is order else list(order[len(released):])


class Backlog:
    """The pending set of a front end that holds the backlog (DESIGN §3's reading of the paper): requests wait
    here, not in the backend's FIFO queue, while the backend is full; each window releases what the backend
    has room for, in plan order (QAS: its cold lane's ``q_cold`` oldest first, then the hot lane), from the
    whole pending set; an arrival that finds room and nothing held goes at once (a round of its own aligns
    it), so below the knee the front end adds no wait. The simulator's and the live front end keep one each;
    they say how much room the backend has (its free slots) and when a window closes."""

    __slots__ = ("scheduler", "counters", "pending")

    def __init__(self, scheduler: Scheduler, counters: MutableMapping[str, int]) -> None:
        self.scheduler, self.counters = scheduler, counters
        self.pending: list = []  # in the last plan's order, then arrivals since

    def arrive(self, seq, room: int, context: Callable[[int], SchedContext],
               submit: Callable[[Any], None]) -> bool:
        """``seq`` reaches the front end while the backend has ``room`` free slots: True if it went at once
        (``context(batch_hint)``: the round's view of the engine), False if it is held."""
        if self.pending or room <= 0:
            self.pending.append(seq)
            self.counters[FRONTEND_HELD] += 1
            return False
        release_window(self.scheduler, [seq], context(1), submit, self.counters, counter=FRONTEND_PASSED)
        return True

    def release(self, room: int, context: Callable[[int], SchedContext], submit: Callable[[Any], None],
                by: float | None = None) -> int:
        """A window closes with ``room`` free slots in the backend: one round over the pending requests that
        arrived by ``by`` (None: all), the first ``room`` of its order released; the number released."""
        eligible, later = self.pending, []
        if by is not None and any(s.arrival > by for s in eligible):
            later = [s for s in eligible if s.arrival > by]
            eligible = [s for s in eligible if s.arrival <= by]
        if room <= 0 or not eligible:
            return 0
        n = min(room, len(eligible))
        self.pending = release_window(self.scheduler, eligible, context(n), submit, self.counters, room=n) + later
        return n


__all__ = ["Bookkeeper", "release_window", "Backlog"]
