"""QAS as an admission front end: one QAS round per window, in front of an unmodified engine.

An operator who cannot change the server's scheduler can still put QAS in front of it: arrivals are held
for a window Δt_win, then ordered (and their prompts front-aligned) by one QAS round and released to the
engine in that order. The engine keeps its own scheduler (FCFS, as a stock server would: it serves requests
in the order they reach it) and budgets; QAS's published priorities still reach the engine's eviction policy
(DART) through the shared hints. The window trades a bounded extra delay (at most Δt_win) for larger, better
grouped batches.
"""

from __future__ import annotations

from collections import Counter

import simpy

from prism.policies.base import SchedContext, Scheduler
from prism.policies.bookkeeping import release_window

from prism.sim.engine import Engine, Seq


class FrontEnd:
    def __init__(self, env: simpy.Environment, engine: Engine, scheduler: Scheduler, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("a front end needs a window > 0")
        self.env = env
        self.engine = engine
        self.scheduler = scheduler
        self.window = window_s
        self.buffer: list[Seq] = []
        self.counters: Counter = Counter()
        self._wake: simpy.Event | None = None
        self.process = env.process(self._loop())

    def submit(self, seq: Seq) -> None:
        self.buffer.append(seq)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self):
        env = self.env
        while True:
            if not self.buffer:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            yield env.timeout(self.window)  # the window opens with its first arrival
            self._release()

    def _release(self) -> None:
        eng = self.engine
        held, self.buffer = self.buffer, []
        ctx = SchedContext(self.env.now, eng.cache, tuple(eng.active.values()), eng.hints, batch_hint=len(held))
        release_window(self.scheduler, held, ctx, eng.submit, self.counters)
