"""The waiting queue a scheduler expects at its next round, so that a round reads only what joined it since.

An engine admits the head of the order a round hands it and keeps the rest in that order (SGLang 0.5.23's
``Scheduler._get_new_batch_prefill_raw``, ``managers/scheduler.py:4319``, filters the admitted out of its sorted
queue; ``sim/engine.py``); arrivals and retracted requests join at the back. So the
next round's queue starts with the last order less its admitted head, and a scheduler that keeps state per
request (k-LPM's ranks, ContextPilot's index) has only the rest to take in. Whether that holds is checked, not
assumed: the queue must start with the expected requests themselves (a list comparison in C, by identity first),
else the scheduler takes the whole queue in afresh.
"""

from __future__ import annotations

from typing import Sequence


class ExpectedQueue:
    """The queue expected at the next round: ``expect`` the order handed to the engine, ``dispatched`` its admitted
    head, then ``joined`` tells what came after it."""

    __slots__ = ("_expected",)

    def __init__(self) -> None:
        self._expected: list | None = []  # None: not known (the next round takes the whole queue)

    def expect(self, order: list) -> None:
        """A round handed the engine ``order`` (a list the engine does not change: a copy where the engine may
        drop its admitted head in place)."""
        self._expected = order

    def dispatched(self, admitted: Sequence) -> bool:
        """The engine took ``admitted``: whether it was the expected order's head (else nothing is expected)."""
        expected, n = self._expected, len(admitted)
        if expected is None or list(admitted) != expected[:n]:
            self._expected = None
            return False
        self._expected = expected[n:]
        return True

    def joined(self, waiting: Sequence) -> Sequence | None:
        """The requests after the expected ones in this round's queue, or None if it does not start with them."""
        expected = self._expected
        if expected is None:
            return None
        m = len(expected)
        if len(waiting) < m or waiting[:m] != expected:  # a queue not a list is never equal: taken afresh
            return None
        return waiting[m:]
