"""The load generator: replays a trace's arrival times against an engine under a concurrency limit."""

from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator, Protocol, Sequence

import simpy

from prism.core import Request

from prism.sim.clock import Ticker, due_at, now_of
from prism.sim.engine import Seq


def send_times(requests: Iterable[Request], start: float = 0.0) -> Iterator[float]:
    """When the replay sends each request, from a clock at ``start``: at its arrival as a SimPy timeout reaches it
    (the clock plus the gap, which may differ from the arrival in the last bit), or at once if it is due already.
    What :class:`Client` sends by, with its own process or its engine's fed clock (``tests/test_clock.py`` holds
    the two alike)."""
    now = start
    for req in requests:
        delay = req.arrival - now
        if delay > 0:
            now = now + delay  # Environment.schedule's time
        yield now


def part_times(sent: Sequence[float], positions: Iterable[int], start: float = 0.0) -> list[tuple[float, float]]:
    """For the requests at ``positions`` of a replay whose send times are ``sent``: (when its clock turns to the
    request, when it sends it); it turns to a request as it sends the one before (at ``start`` for the first)."""
    return [(sent[i - 1] if i else start, sent[i]) for i in positions]


class Receiver(Protocol):
    """What a client sends its requests to: an engine, an admission front end before one, a router."""

    def submit(self, seq: Seq) -> None: ...


class Client:
    """Sends each request at its arrival time; past ``max_concurrency`` requests in flight, later ones
    wait client-side (that wait counts in their admission delay, as in a real benchmark client).

    ``engine`` is anything with ``submit(seq)``: the engine itself, or an admission front end before it.
    ``clock``: the engine's own clock where the engine is the run's only process; the clock then sends the
    arrivals as it passes them (``sim/clock.py``), not a process of the client's, at the same times.
    ``times``: where ``requests`` are part of a larger replay (one model's requests, ``sim/fleet.py``), per request
    when that replay's clock turns to it and when it sends it (:func:`part_times`), so that each is sent as it
    would be there: at the same time, and scheduled at the same time (which settles a tie with an iteration that
    ends just then)."""

    def __init__(self, env: simpy.Environment, engine: Receiver, requests: Sequence[Request],
                 max_concurrency: int | None = None, clock: Ticker | None = None,
                 times: Iterable[tuple[float, float]] | None = None) -> None:
        self.env = env
        self.engine = engine
        self.requests = requests
        self.limit = max_concurrency
        self.in_flight = 0
        self.backlog: deque[Seq] = deque()
        self.process: simpy.Process | None = None
        if clock is not None:
            assert times is None, "a fed clock sends a whole replay"
            clock.feed(send_times(requests, now_of(env)), self._arrive)
        else:
            self.process = env.process(self._replay(times))

    def _replay(self, times: Iterable[tuple[float, float]] | None):
        env = self.env
        if times is None:  # the whole replay: it turns to each request as it sends the one before
            start = now_of(env)
            times = ((start, t) for t in send_times(self.requests, start))
        for i, (turn, t) in enumerate(times):
            if turn > now_of(env):
                yield due_at(env, turn)
            if t > now_of(env):
                yield due_at(env, t)  # where a timeout of the gap would be due: at t itself
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
