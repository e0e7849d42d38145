"""QAS as an admission front end inside SGLang's scheduler process: the live counterpart of ``sim/frontend.py``.

The model is the simulator's :class:`~prism.sim.frontend.FrontEnd`: a request that reaches the scheduler for the
first time is held out of SGLang's waiting queue; the first held request opens a window of ``window_s``
(times the pacing dilation: real seconds); when the window closes, one front-end round orders the window's
requests (the policy's ``plan``), realigns their prompts, labels their lanes, hands them to SGLang's own
``Scheduler._add_request_to_queue`` in plan order and calls ``on_dispatch`` with the whole window (QAS publishes
P̂ to DART through the shared hints). SGLang's scheduler is the stock one behind a front end (FCFS,
``--schedule-policy fcfs``): it admits the released requests as it admits any arrival.

Choices:

* Only first arrivals are held. A retracted request (SGLang re-queues it with ``is_retracted``), any request
  the front end has seen before, an aborted one and one without prism's metadata go straight to the waiting
  queue: a front end sees arrivals only.
* A request's arrival is its send time, which the client stamps (``prism_sent``, on the machine's monotonic
  clock; the scheduler's receipt time without it): the scheduler receives requests only between batches, so
  its own receipt would stretch a window by up to a batch and move requests into later windows.
* A window closes at its deadline even when the scheduler notices later: the scheduler checks at the top of
  each loop iteration (``get_next_batch_to_run``), so a running batch delays the release but never changes which
  requests a window holds; an arrival after the deadline opens the next window, and windows that closed during
  one batch are released oldest first, one round each. The engine admits only between batches, so a release
  at the next iteration is admitted as early as the simulator's release during that batch.
* The scheduler's loop does not block while idle (SGLang's default: ``--sleep-on-idle`` off), so an idle
  scheduler notices a deadline within one loop iteration. The delay this adds over the model is the lag (real
  milliseconds from a window's deadline to its release) of the windows released by an idle scheduler:
  ``frontend_idle_release_lag_ms_max`` and ``_mean`` (a busy scheduler releases after its batch, as the
  simulator's engine admits after its batch).
* An abort that reaches a held request finds it in no SGLang queue; it is served when its window closes.

**Holding the backlog** (``qas.front_end: backlog``, the simulator's model in ``sim/frontend.py``): the held
requests form one pending set (:class:`~prism.policies.bookkeeping.Backlog`, the simulator's too). An arrival
that finds nothing held and room in SGLang goes at once (one round aligns it, then SGLang's enqueue); else it
is held, and the first held request opens a window. When a window closes, one round over the pending requests
sent before its deadline releases as many as SGLang has room for, in plan order; if requests stay held, the
next window closes one window later (the simulator's cadence). Room is ``limit`` (the run's concurrency limit,
or the server's running slots: :meth:`~prism.settings.RunSpec.backlog_limit`) less the requests SGLang holds:
its waiting queue and the unfinished requests of its running batch, of the last prefill batch not yet merged
into it and its chunked request (SGLang's own census of what a pause retracts, ``scheduler.py`` 5848-5869 in
0.5.23). The scheduler notices a deadline only at the top of a loop iteration, after the batch that delayed
it has finished requests: each window is released as at its deadline, the simulator's model, with the room
SGLang had then (the requests that finished since, noted by :meth:`LiveFrontEnd.left`, still held a slot) and
QAS's clock at the deadline; a window that closed before a new arrival's send time is released before the
arrival is considered.

Cost: one plan per window, O(S) in the window's segment occurrences (QAS's bound), and one comparison per loop
iteration; holding the backlog, also one plan per arrival that goes at once.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Callable

from prism.policies.base import DemandHints, PrefixIndex, SchedContext, Scheduler
from prism.policies.bookkeeping import Backlog, release_window

from prism.live.requests import SENT_KEY
from prism.live.seq import LiveSeq


def in_sglang(sched) -> int:
    """Requests SGLang's scheduler holds: its waiting queue, and the unfinished requests of its running batch,
    of the last prefill batch (merged into the running batch only by the next ``get_next_batch_to_run``) and
    its chunked request, each once (``scheduler.py`` 5848-5869 in 0.5.23 counts them so)."""
    held = {id(r) for r in sched.running_batch.reqs if not r.finished()}
    last = sched.last_batch
    if last is not None and last is not sched.running_batch and last.forward_mode.is_extend():
        held.update(id(r) for r in last.reqs if not r.finished())
    chunked = sched.chunked_req
    if chunked is not None and not chunked.finished():
        held.add(id(chunked))
    return len(sched.waiting_queue) + len(held)


class LiveFrontEnd:
    """Windows of held arrivals, released by one ``scheduler`` round each; ``limit`` (holding the backlog):
    the bound on the requests in SGLang, None to hold each window's arrivals."""

    def __init__(self, scheduler: Scheduler, window_s: float, hints: DemandHints, counters: Counter,
                 limit: int | None = None) -> None:
        if window_s <= 0:
            raise ValueError("a front end needs a window > 0")
        self.scheduler = scheduler
        self.window = window_s  # real seconds
        self.hints = hints
        self.counters = counters
        self.limit = limit
        self.windows: deque[tuple[float, list[LiveSeq]]] = deque()  # (deadline, held requests), oldest first
        self.backlog = Backlog(scheduler, counters) if limit is not None else None
        self.deadline = 0.0  # holding the backlog: when the open window closes (while requests are held)
        self.left_at: list[float] = []  # holding the backlog: when requests finished, since the last event
        self.events_until = float("-inf")  # holding the backlog: the latest arrival or deadline dealt with
        self.lag_max_s = 0.0  # windows released by an idle scheduler
        self.lag_sum_s = 0.0
        self.idle_releases = 0

    def held(self) -> int:
        if self.backlog is not None:
            return len(self.backlog.pending)
        return sum(len(w) for _, w in self.windows)

    def hold(self, req, retracted: bool, now: float, cache: PrefixIndex | None = None,
             submit: Callable[[object], None] | None = None, in_backend: int = 0) -> bool:
        """Whether ``req``, about to join SGLang's waiting queue at ``now``, is held in a window instead (the
        window of its send time). Holding the backlog, a request that finds nothing held and room (the
        backend holds ``in_backend`` requests) is handed to ``submit`` at once, after a round over ``cache``:
        True too (the caller enqueues nothing)."""
        if (retracted or getattr(req, "_prism", None) is not None or req.finished()
                or req.to_finish is not None):  # to_finish: aborted on arrival (its prompt is gone)
            return False
        sent = (req.sampling_params.custom_params or {}).get(SENT_KEY)
        arrival = sent if isinstance(sent, (int, float)) and sent <= now else now
        seq = LiveSeq.of(req, arrival)
        if seq is None:
            return False
        if self.backlog is not None:
            in_backend += self._release_due(arrival, cache, submit, in_backend)  # windows that closed before it
            opens = not self.backlog.pending
            if not self.backlog.arrive(seq, self._room(arrival, in_backend), self._context(arrival, cache),
                                       lambda s: submit(s.req)) and opens:
                self.deadline = arrival + self.window
            self._dealt_with(arrival)
            return True
        if not self.windows or arrival >= self.windows[-1][0]:  # a window opens with its first arrival
            self.windows.append((arrival + self.window, []))
        self.windows[-1][1].append(seq)
        return True

    def due(self, now: float) -> bool:
        if self.backlog is not None:
            return bool(self.backlog.pending) and now >= self.deadline
        return bool(self.windows) and now >= self.windows[0][0]

    def _context(self, now: float, cache: PrefixIndex | None):
        return lambda batch_hint: SchedContext(now, cache, (), self.hints, batch_hint=batch_hint)

    def left(self, now: float) -> None:
        """A request finished in SGLang at ``now`` (holding the backlog: an arrival or a deadline before it, dealt
        with later, did not see its slot free)."""
        if self.backlog is not None:
            self.left_at.append(now)

    def _dealt_with(self, t: float) -> None:
        """Events up to ``t`` are dealt with: finishes before it concern none still to come."""
        self.events_until = max(self.events_until, t)
        self.left_at = [x for x in self.left_at if x > self.events_until]

    def _room(self, at: float, in_backend: int) -> int:
        """Free slots at ``at``: SGLang holds ``in_backend`` requests now, and held those that finished since."""
        return self.limit - in_backend - sum(t > at for t in self.left_at)

    def _release_due(self, upto: float, cache: PrefixIndex | None, submit: Callable[[object], None] | None,
                     in_backend: int, idle: bool = False, now: float | None = None) -> int:
        """Release the windows that closed by ``upto``, each as the simulator does at its deadline: a round at
        that time over what had arrived by then, with the room SGLang had then. Returns the requests
        released."""
        n = 0
        while self.backlog.pending and self.deadline <= upto:
            deadline = self.deadline
            n += self.backlog.release(self._room(deadline, in_backend + n), self._context(deadline, cache),
                                      lambda s: submit(s.req), by=deadline)
            self.deadline = deadline + self.window
            self._dealt_with(deadline)
            if now is not None:
                self._lag(idle, now, deadline)
        return n

    def release(self, now: float, cache: PrefixIndex, submit: Callable[[object], None], idle: bool = False,
                in_backend: int = 0) -> int:
        """Release every window whose deadline has passed, oldest first: one round each, requests handed to
        ``submit`` (SGLang's enqueue) in plan order; ``idle``: the scheduler ran no batch since the deadline
        (the lag is then measured). Returns the number of windows released; holding the backlog (SGLang
        holds ``in_backend`` requests), the number of requests released."""
        if self.backlog is not None:
            return self._release_due(now, cache, submit, in_backend, idle, now)
        n = 0
        while self.due(now):
            deadline, held = self.windows.popleft()
            ctx = SchedContext(now, cache, (), self.hints, batch_hint=len(held))
            release_window(self.scheduler, held, ctx, lambda seq: submit(seq.req), self.counters)
            self._lag(idle, now, deadline)
            n += 1
        return n

    def _lag(self, idle: bool, now: float, deadline: float) -> None:
        if idle:
            lag = now - deadline
            self.lag_max_s = max(self.lag_max_s, lag)
            self.lag_sum_s += lag
            self.idle_releases += 1

    def stats(self) -> dict[str, float]:
        n = self.idle_releases
        return {"frontend_idle_releases": n, "frontend_idle_release_lag_ms_max": round(self.lag_max_s * 1e3, 3),
                "frontend_idle_release_lag_ms_mean": round(self.lag_sum_s / n * 1e3, 3) if n else 0.0}

    def reset(self) -> None:
        """A new run starts (the cache was flushed): forget the lag figures (held requests stay held)."""
        self.lag_max_s = self.lag_sum_s = 0.0
        self.idle_releases = 0
