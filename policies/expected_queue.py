"""The waiting queue a scheduler expects at its next round, so that a round reads only what joined it since.

An engine admits the head of the order a round hands it and keeps the rest in that order (SGLang 0.5.23's
``Scheduler._get_new_batch_prefill_raw``, ``managers/scheduler.py:4319``, filters the admitted out of its sorted
queue; ``sim/engine.py``); arrivals and retracted requests join at the back. So the
next round's queue starts with the last order less its admitted head, and a scheduler that keeps state per
request (k-LPM's ranks, ContextPilot's index) has only the rest to take in. Whether that holds is known or
checked, never assumed: an engine that keeps its queue itself says how many requests it kept
(``SchedContext.kept``: the simulated engine); for any other (the live plugin, whose views of SGLang's queue are
a new list each round) the queue must start with the expected requests themselves (a list comparison in C, by
identity first), else the scheduler takes the whole queue in afresh. The known count spares two copies of the
queue a round, and each copy touches every request (docs/benchmarks.md, ninth pass).
"""

from __future__ import annotations

from typing import Sequence


class ExpectedQueue:
    """The queue expected at the next round: ``expect`` the order handed to the engine, ``dispatched`` its admitted
    head, then ``joined`` tells what came after it. ``kept`` is the round's ``SchedContext.kept``."""

    __slots__ = ("_known", "_order", "_len", "_taken")

    def __init__(self) -> None:
        self._known = True  # False: the next round takes the whole queue
        self._order: list | None = []  # the last order handed to the engine (None: its length only)
        self._len = 0  # the queue's length when handed
        self._taken = 0  # its head the engine admitted

    def expect(self, order: list | None, length: int = 0) -> None:
        """A round handed the engine ``order`` (the list itself, not a copy: an engine that does not report what
        it kept leaves it as it is; one that does may drop its admitted head in place). None, with the queue's
        ``length``: a plan that leaves the queue to the engine (``Plan.keep_queue``, for an engine that says what
        it kept)."""
        self._known, self._order, self._taken = True, order, 0
        self._len = length if order is None else len(order)

    def dispatched(self, admitted: Sequence, kept: int | None) -> bool:
        """The engine took ``admitted``: whether it was the expected order's head (else nothing is expected). An
        engine that reports what it kept admits the head by construction."""
        order, start = self._order, self._taken
        if not self._known or (kept is None and (order is None
                                                  or list(admitted) != order[start:start + len(admitted)])):
            self._known = False
            return False
        self._taken += len(admitted)
        return True

    def joined(self, waiting: Sequence, kept: int | None) -> Sequence | None:
        """The requests after the expected ones in this round's queue, or None if it does not start with them."""
        if not self._known:
            return None
        m, order = self._len - self._taken, self._order
        if kept is not None:  # the engine says how many it kept
            return waiting[m:] if kept == m else None
        if order is None or len(waiting) < m or waiting[:m] != order[self._taken:]:  # not a list: never equal
            return None
        return waiting[m:]
