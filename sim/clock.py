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

An engine that is the run's only process (no router, no front end, no other model's engine) is sent its arrivals
by its clock too (:meth:`Ticker.feed`), not by a client's process: each arrival is another SimPy event, and
nearly every iteration's would make the engine wait as well (prefix20, 20,480 requests: 37,558 events, 3-6% of
a whole process by wall time, 2.7% by instructions). The clock sends them as the process would have been
resumed: at the times its timeouts would have set (the clock plus the gap, which may differ from the arrival in
the last bit), those due during an iteration before it ends, and an idle engine waits for the next. A tie is
settled as SimPy's heap settles it: the first arrival pending when an iteration starts goes before the
iteration's end if both fall at the same time (its timeout was on the heap first), a later one at that time
after it (its timeout would have come later); arrivals due at the same time go together, as a process sends
them without a wait.
"""

from __future__ import annotations

import math
from heapq import heappush
from typing import Any, Callable, Iterable, Iterator

import simpy
from simpy.events import NORMAL


def _time_of(entry: tuple) -> float:
    """A SimPy heap entry's time, unboxed (an int 0 at the start reads as 0.0: the same comparisons)."""
    return entry[0]


def now_of(env: simpy.Environment) -> Any:
    """``env.now``, read as the attribute it returns: from compiled code the property is a call into interpreted
    SimPy (about 385 instructions against 206), and a fleet's engines and hosts read the clock 780,000 times a run.
    The value as SimPy holds it (an int 0 at the start, which records and samples keep)."""
    return env._now


def due_at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event due at time ``t`` itself, where a timeout would be due at now plus the gap (which may differ from
    ``t`` in the last bit): scheduled as ``Environment.schedule`` schedules a timeout, with ``t`` as its time."""
    wait = simpy.Event(env)
    wait._ok, wait._value = True, None
    heappush(env._queue, (t, NORMAL, next(env._eid), wait))
    return wait


class Ticker:
    """One engine's clock: :meth:`elapse` lets an iteration's time pass; fed the run's arrivals (:meth:`feed`), it
    sends them as it passes them."""

    __slots__ = ("env", "_heap", "_wait", "_times", "_send", "_next", "_due", "fed")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        # SimPy's own (time, priority, serial, event) heap, made once with the environment: Environment.peek without
        # its call (entries untyped: typed as SimPy has them, each of an entry's four would be unboxed to read one)
        self._heap: list[tuple] = env._queue
        self._wait = simpy.Event(env)
        self._wait._ok, self._wait._value = True, None  # a timeout's outcome
        self._times: Iterator[float] = iter(())
        self._send: Callable[[int], None] | None = None
        self._next = 0
        self._due = math.inf  # when the next arrival is sent (inf: none left, or none fed)
        self.fed = False  # whether it sends the arrivals (feed)

    def feed(self, times: Iterable[float], send: Callable[[int], None]) -> None:
        """From now on this clock sends the run's arrivals: ``send(i)`` at the i-th of ``times`` (not decreasing;
        read as it goes). Only for an engine that is the run's only process (module docstring): no other process's
        event may fall among them."""
        self._times, self._send, self._next, self.fed = iter(times), send, 0, True
        self._due = next(self._times, math.inf)

    def elapse(self, delay: float) -> simpy.Event | None:
        """Let ``delay`` seconds pass for the running process: None when the clock has moved on at once (no other
        event is due by then), else the event to yield, due at the end."""
        env = self.env
        now: float = env._now  # unboxed (SimPy types its clock int or float)
        end = now + delay
        heap = self._heap
        if heap and _time_of(heap[0]) <= end:
            if self._due <= end:
                raise RuntimeError("an engine fed its arrivals is not the run's only process")
            wait: Any = self._wait  # SimPy sets its callbacks to None once processed (typed as a list)
            if wait.callbacks:  # still waited on: its last use is on the heap (an interrupt would leave it there)
                raise RuntimeError("an engine's wait was scheduled again before SimPy processed it")
            wait.callbacks = []  # SimPy emptied them (None) when it processed the last wait
            heappush(heap, (end, NORMAL, next(env._eid), wait))  # Environment.schedule, as a Timeout does
            return wait
        if self._due <= end:
            if self._due == end:  # the first pending arrival goes first at a tie; a later one at `end` after
                self._send_due()
            while self._due < end:
                self._send_due()
        env._now = end  # what Environment.step sets on popping the timeout (simpy/core.py)
        return None

    def next_arrival(self) -> simpy.Event:
        """For an idle engine whose clock is fed: the event to wait on, due when the next arrival is sent (then call
        :meth:`arrived`), or never if none is left. A new event, as the engine's wake-up is where it is not fed."""
        return due_at(self.env, self._due) if self._due < math.inf else simpy.Event(self.env)

    def arrived(self) -> None:
        """The idle engine woke at the next arrival's time: send what is due now."""
        self._send_due()

    def _send_due(self) -> None:
        """Send the arrivals due at the next one's time, the clock set to it (a process sends them without a wait)."""
        times, send, i, t = self._times, self._send, self._next, self._due
        assert send is not None, "a fed clock has its send"
        self.env._now = t
        while True:
            send(i)
            i += 1
            due = next(times, math.inf)
            if due != t:
                break
        self._next, self._due = i, due
