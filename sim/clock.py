"""An iteration's time passing without a SimPy event, where no other event can come first.

An engine iteration is a timeout: SimPy pushes it on its event heap, pops it at its time, and resumes the
engine's generator; on a single engine that is about half of what a decode step costs the simulator. When the
heap holds nothing due before the iteration ends, that timeout is the next event SimPy would process, and
nothing else runs meanwhile: only a running process schedules events, the engine is the one running, and it is
the only process waiting on whatever resumed it (its last timeout, its wake-up, its GPU's compute slot; a wait
shared with another process would let that one run after the engine in the same step, and so break this). The
engine may set the clock to the iteration's end itself and go on, as processing the timeout would have had it
do. An event due at the very same time goes first (it was scheduled earlier, or is urgent), so then the engine
yields the timeout as usual. The clock reads the same float either way: SimPy sets it to ``now + delay``, as
here. Whatever the engine then schedules (a finish's callbacks, a slot handed to another engine) is on the heap
before its next iteration asks again.

The timeout it yields is one event of its own, scheduled again for each wait, where ``env.timeout`` makes a new
object every time: the engines of a fleet wait on most of their iterations (another GPU's comes first), and making
the object is over a third of what scheduling and processing a wait costs (0.25 of 0.65 µs). SimPy sees a timeout:
the same entry on its heap (the end, normal priority, the next serial number), processed as a timeout is (a success
without a value), though it is a plain event, not a ``simpy.Timeout``. It is safe because the engine alone waits on
it, and only once SimPy has processed its last use (checked: an engine is never interrupted mid-wait).
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.events import NORMAL


class Ticker:
    """One engine's clock: :meth:`elapse` lets an iteration's time pass."""

    __slots__ = ("env", "_wait")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._wait = simpy.Event(env)
        self._wait._ok, self._wait._value = True, None  # a timeout's outcome

    def elapse(self, delay: float) -> simpy.Event | None:
        """Let ``delay`` seconds pass for the running process: None when the clock has moved on at once (no other
        event is due by then), else the event to yield, due at the end."""
        env = self.env
        end = env._now + delay
        heap = env._queue  # SimPy's own (time, priority, serial, event) heap: Environment.peek without its call
        if heap and heap[0][0] <= end:
            wait = self._wait
            if wait.callbacks:  # still waited on: its last use is on the heap (an interrupt would leave it there)
                raise RuntimeError("an engine's wait was scheduled again before SimPy processed it")
            wait.callbacks = []  # SimPy emptied them (None) when it processed the last wait
            heappush(heap, (end, NORMAL, next(env._eid), wait))  # Environment.schedule, as a Timeout does
            return wait
        env._now = end  # what Environment.step sets on popping the timeout (simpy/core.py)
        return None
