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
"""

from __future__ import annotations

import simpy


def elapse(env: simpy.Environment, delay: float) -> simpy.Timeout | None:
    """Let ``delay`` seconds pass for the running process: None when the clock has moved on at once (no other
    event is due by then), else the timeout to yield."""
    end = env._now + delay
    heap = env._queue  # SimPy's own (time, priority, serial, event) heap: Environment.peek without its call
    if heap and heap[0][0] <= end:
        return simpy.Timeout(env, delay)
    env._now = end  # what Environment.step sets on popping the timeout (simpy/core.py)
    return None
