"""The load generator: replays a trace's arrival times against an engine under a concurrency limit."""

from __future__ import annotations

from collections import deque
from typing import Sequence

import simpy

from prism.core import Request

from prism.sim.engine import Engine, Seq


class Client:
    """Sends each request at its arrival time; past ``max_concurrency`` requests in flight, later ones
    wait client-side (that wait counts in their admission delay, as in a real benchmark client).

    ``engine`` is anything with ``submit(seq)``: the engine itself, or an admission front end before it."""

    def __init__(self, env: simpy.Environment, engine: Engine, requests: Sequence[Request],
                 max_concurrency: int | None = None) -> None:
        self.env = env
        self.engine = engine
        self.requests = requests
        self.limit = max_concurrency
        self.in_flight = 0
        self.backlog: deque[Seq] = deque()
        self.process = env.process(self._replay())

    def _replay(self):
        env = self.env
        for req in self.requests:
            delay = req.arrival - env.now
            if delay > 0:
                yield env.timeout(delay)
            seq = Seq(req)
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
