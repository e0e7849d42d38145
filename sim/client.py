"""The load generator: replays a trace's arrival times against an engine under a concurrency limit."""

from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator, Protocol, Sequence

import simpy

from prism.core import Request

from prism.sim.clock import Ticker
from prism.sim.engine import Seq


def send_times(requests: Iterable[Request], start: float = 0.0) -> Iterator[float]:
    """When the replay sends each request, from a clock at ``start``: at its arrival as a SimPy timeout reaches it
    (the clock plus the gap, which may differ from the arrival in the last bit), or at once if it is due already.
    :meth:`Client._replay`'s clock, which ``tests/test_clock.py`` holds equal to it."""
    now = start
    for req in requests:
        delay = req.arrival - now
        if delay > 0:
            now = now + delay  # Environment.schedule's time
        yield now


class Receiver(Protocol):
    """What a client sends its requests to: an engine, an admission front end before one, a router."""

    def submit(self, seq: Seq) -> None: ...


class Client:
    """Sends each request at its arrival time; past ``max_concurrency`` requests in flight, later ones
    wait client-side (that wait counts in their admission delay, as in a real benchmark client).

    ``engine`` is anything with ``submit(seq)``: the engine itself, or an admission front end before it.
    ``clock``: the engine's own clock where the engine is the run's only process; the clock then sends the
    arrivals as it passes them (``sim/clock.py``), not a process of the client's, at the same times."""

    def __init__(self, env: simpy.Environment, engine: Receiver, requests: Sequence[Request],
                 max_concurrency: int | None = None, clock: Ticker | None = None) -> None:
        self.env = env
        self.engine = engine
        self.requests = requests
        self.limit = max_concurrency
        self.in_flight = 0
        self.backlog: deque[Seq] = deque()
        self.process: simpy.Process | None = None
        if clock is None:
            self.process = env.process(self._replay())
        else:
            clock.feed(send_times(requests, env.now), self._arrive)

    def _replay(self):
        env = self.env
        for i, req in enumerate(self.requests):
            delay = req.arrival - env.now
            if delay > 0:
                yield env.timeout(delay)
            self._arrive(i)

    def _arrive(self, i: int) -> None:
        """Request ``i`` arrives (the clock reads its send time): sent, or held while the limit is reached."""
        seq = Seq(self.requests[i])
        if self.limit is not None and self.in_flight >= self.limit:
            self.backlog.append(seq)
        else:
            self._send(seq)

    def _send(self, seq: Seq) -> None:
        self.in_flight += 1
        self.engine.submit(seq)

    def finished(self, seq: Seq) -> None:
        self.in_flight -= 1
        if self.backlog:
            self._send(self.backlog.popleft())
