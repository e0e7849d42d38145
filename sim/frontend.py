"""QAS as an admission front end: one QAS round per window, in front of an unmodified engine.

An operator who cannot change the server's scheduler can still put QAS in front of it. The engine keeps its
own scheduler (FCFS, as a stock server would: it serves requests in the order they reach it) and budgets;
QAS's published priorities still reach the engine's eviction policy (DART) through the shared hints. What the
front end holds (``qas.front_end``, DESIGN §3):

* ``backlog`` (the paper's reading in DESIGN §3): requests wait in the front end's pending set, not in the
  engine's queue, while the engine is full; each window Δt_win releases, in plan order, as many as the engine
  has room for, from the whole pending set (QAS's cold lane first); an arrival that finds room and nothing
  held goes at once (a round of its own aligns it). Room is the free slots under the run's concurrency limit
  (``engine.max_concurrency``, which this front end enforces instead of the client, so the engine sees what a
  client with that limit would send it), or without a limit (and on several instances, whose client keeps the
  limit: it bounds them together) under ``engine.max_running_requests``, the engine's running slots: a request released beyond them
  could only wait in the engine's FIFO queue, where QAS can no longer order it. Requests in the engine's
  queue count against the room as running ones do (they hold a slot as soon as the engine admits them).
* ``arrivals``: arrivals are held for a window, then ordered (and their prompts front-aligned) by one round
  and all released to the engine; the window trades a bounded extra delay (at most Δt_win) for larger, better
  grouped batches.
"""

from __future__ import annotations

from typing import Any, Generator, Protocol

import simpy

from prism.counters import Counts
from prism.policies.base import DemandHints, PrefixIndex, SchedContext, Scheduler
from prism.policies.bookkeeping import Backlog, release_window

from prism.sim.clock import now_of
from prism.sim.engine import Seq


class Served(Protocol):
    """What a front end reads of the engine behind it (the engine, or a test's stand-in): its cache and demand
    hints for the rounds' context, its running and queued requests for the backlog's bound."""

    @property
    def cache(self) -> PrefixIndex: ...

    @property
    def hints(self) -> DemandHints: ...

    @property
    def active(self) -> dict[int, Seq]: ...

    @property
    def waiting(self) -> list[Seq]: ...

    def submit(self, seq: Seq) -> None: ...


class FrontEnd:
    """``limit``: the backlog front end's bound on requests in the engine (None: it holds arrivals)."""

    def __init__(self, env: simpy.Environment, engine: Served, scheduler: Scheduler, window_s: float,
                 limit: int | None = None) -> None:
        if window_s <= 0:
            raise ValueError("a front end needs a window > 0")
        self.env = env
        self.engine = engine
        self.scheduler = scheduler
        self.window = window_s
        self.limit = limit
        self.buffer: list[Seq] = []  # the window's arrivals (arrivals mode)
        self.counters = Counts()
        self.backlog = Backlog(scheduler, self.counters) if limit is not None else None
        self._wake: simpy.Event | None = None
        self.process = env.process(self._loop())

    @property
    def held(self) -> int:
        return len(self.backlog.pending) if self.backlog is not None else len(self.buffer)

    def room(self) -> int:
        """Free slots in the engine: the limit less its running and queued requests."""
        limit = self.limit
        assert limit is not None, "only a backlog front end has a limit"
        return limit - len(self.engine.active) - len(self.engine.waiting)

    def submit(self, seq: Seq) -> None:
        if self.backlog is not None:
            if self.backlog.arrive(seq, self.room(), self._context, self.engine.submit):
                return
        else:
            self.buffer.append(seq)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            if not self.held:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            yield env.timeout(self.window)  # the window opens with its first held request
            self._release()

    def _context(self, batch_hint: int) -> SchedContext:
        eng = self.engine
        return SchedContext(now_of(self.env), eng.cache, tuple(eng.active.values()), eng.hints, batch_hint=batch_hint)

    def _release(self) -> None:
        if self.backlog is not None:
            self.backlog.release(self.room(), self._context, self.engine.submit)
            return
        held, self.buffer = self.buffer, []
        release_window(self.scheduler, held, self._context(len(held)), self.engine.submit, self.counters)
