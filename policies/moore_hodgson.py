"""One request queue per GPU, shared by its models, ordered to meet the most TTFT deadlines (Prism §6.2).

Each request r has a deadline d_r = a_r + s_r (arrival plus its model's TTFT SLO) and an estimated prefill time
e_r = p_r / c_r (prompt tokens over its model's chunked-prefill speed). **Algorithm 2** as the paper states it::

    1: sort R by deadline: d_1 <= d_2 <= ... <= d_n
    2: S <- {}, current_time <- now
    3: for k = 1..n:
    4:   r <- r_k, e_r <- p_r / c_r
    5:   append r to S;  6: current_time += e_r
    7:   if current_time > a_r + s_r:
    9:     r_max <- argmax_{r' in S} e_r'      (the longest prefill in S)
    10:    remove r_max from S;  11: current_time -= e_rmax
    12: return S

This is Moore-Hodgson's algorithm (Moore 1968), optimal for the number of jobs that meet their deadlines on one
machine (proof: Cheriyan, Ravi and Skutella 2021): served one at a time from ``now`` in the returned order, no
other order meets more deadlines. The paper argues prefill under chunked prefill is such a machine. The
accepted requests are dispatched in deadline order; a request removed from S "then waits": :meth:`DeadlineQueue.order`
puts the removed ones after S, in deadline order (where they go is not said; after S they delay no request that
can still make its deadline). Ties: equal deadlines keep arrival (insertion) order; among equal longest
prefills the later one in deadline order is removed. O(n log n) per order, n the requests that can still
meet their deadlines (:class:`DeadlineQueue`).

The authors' prototype (a public copy: ``YAMY1234/prism-research``, ``python/prism/multi_model/scheduling/gpu/
request_queue.py``) orders a heap by ``arrival + slo − clamp(prompt_len × 0.5 / 1024, 0.2, 2)`` (least slack
first) and drops nothing; this module follows the paper.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from typing import Callable, Hashable, Sequence

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


def moore_hodgson(deadlines: Sequence[float], prefill_s: Sequence[float], now: float = 0.0) -> list[int]:
    """Algorithm 2 on jobs given by index: the indices of S (the jobs that meet their deadlines), in deadline
    order (ties by index).

    A job that misses its deadline even served alone from ``now`` (now + e > d) is passed over: Algorithm 2
    would append it and drop it again at once. (It drops the longest prefill in S, which is then the job's:
    were a longer one j dropped instead, S would end at t0 + e − e_j < t0, t0 the end of S before the job,
    which met S's deadlines and so the job's, the latest; yet S then holds the job and ends at or after
    now + e > d. Among equal prefills the later, the job, goes.) Passing over it lets :class:`DeadlineQueue`
    set such jobs aside for good, and keeps the running end free of an addition and its subtraction."""
    order = sorted(range(len(deadlines)), key=lambda i: (deadlines[i], i))
    pos = {i: k for k, i in enumerate(order)}
    longest: list[tuple[float, int, int]] = []  # max-heap of (−e, −position, index) over S
    kept: set[int] = set()
    t = now
    for i in order:
        if now + prefill_s[i] > deadlines[i]:
            continue  # hopeless (docstring)
        heapq.heappush(longest, (-prefill_s[i], -pos[i], i))
        kept.add(i)
        t += prefill_s[i]
        if t > deadlines[i]:
            e, _, j = heapq.heappop(longest)
            kept.discard(j)
            t += e  # e is −e_j
    return [i for i in order if i in kept]


class DeadlineQueue:
    """The GPU's shared queue: requests of any of its models, keyed by any hashable (a request id).

    S depends on the clock, which moves at every engine iteration, so it is computed afresh for each new
    ``now`` (and after each change of the queue). Past a GPU's capacity the queue holds thousands of requests
    of which few can still meet their deadlines: a request whose latest start (deadline − prefill) has passed
    never can again, and :func:`moore_hodgson` passes over it, so the queue sets it aside for good and runs the
    algorithm over the others only (an overloaded 18-model fleet on 2 GPUs: 24,822 orders of 2,071 requests on
    average, three quarters of its run, when every order walked them all)."""

    #: a request is set aside once its latest start is this far behind the clock (seconds, plus a relative part):
    #: past any rounding of now + e > d, which the algorithm checks itself for the rest
    SLACK_S = 1e-6

    def __init__(self) -> None:
        self._items: dict[Hashable, tuple[float, int, float]] = {}  # key -> (deadline, arrival sequence, prefill)
        self._sorted: list[tuple[float, int, Hashable]] = []  # by (deadline, sequence)
        self._live: list[tuple[float, int, Hashable]] = []  # the same, less those set aside as hopeless
        self._starts: list[tuple[float, int, Hashable]] = []  # heap of (latest start, sequence, key) of the live
        self._seq = itertools.count()
        self._on_time: set[Hashable] | None = None  # S at _at (None: compute it at the next ask)
        self._at = -math.inf

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def add(self, key: Hashable, deadline_s: float, prefill_s: float) -> None:
        """Queue a request with its TTFT deadline (arrival + SLO, seconds) and estimated prefill time (seconds)."""
        if key in self._items:
            raise ValueError(f"request {key!r} is already queued")
        if not (math.isfinite(deadline_s) and math.isfinite(prefill_s) and prefill_s >= 0):
            raise ValueError(f"request {key!r}: deadline {deadline_s!r} and prefill time {prefill_s!r} must be "
                             "finite, the prefill time >= 0")
        seq = next(self._seq)
        self._items[key] = (deadline_s, seq, prefill_s)
        bisect.insort(self._sorted, (deadline_s, seq, key))
        bisect.insort(self._live, (deadline_s, seq, key))
        heapq.heappush(self._starts, (deadline_s - prefill_s, seq, key))
        self._on_time = None

    def remove(self, key: Hashable) -> None:
        """Take a request out (dispatched, or gone)."""
        deadline, seq, _ = self._items.pop(key)
        for entries in (self._sorted, self._live):
            i = bisect.bisect_left(entries, (deadline, seq))
            if i < len(entries) and entries[i][1] == seq:  # (set aside: not among the live)
                del entries[i]
        self._on_time = None  # its entry in _starts goes when it surfaces

    def _set_aside(self, now: float) -> None:
        """Drop from the live requests those whose latest start is behind ``now`` by more than the slack."""
        starts, items = self._starts, self._items
        limit = now - self.SLACK_S * (1.0 + abs(now))
        while starts and starts[0][0] < limit:
            _, seq, key = heapq.heappop(starts)
            item = items.get(key)
            if item is not None and item[1] == seq:
                del self._live[bisect.bisect_left(self._live, (item[0], seq))]

    def on_time(self, now: float) -> set[Hashable]:
        """S: the requests that can all meet their deadlines, served from ``now`` (remembered until the queue or
        ``now`` changes)."""
        if self._on_time is None or self._at != now:
            self._set_aside(now)
            live, items = self._live, self._items
            kept = moore_hodgson([d for d, _, _ in live], [items[k][2] for _, _, k in live], now)
            self._on_time, self._at = {live[i][2] for i in kept}, now
        return self._on_time

    def schedule(self, now: float) -> tuple[list[Hashable], list[Hashable]]:
        """(S: the requests that can all meet their deadlines, in dispatch order; the others, in deadline order)."""
        kept = self.on_time(now)
        keys = [k for _, _, k in self._sorted]
        return [k for k in keys if k in kept], [k for k in keys if k not in kept]

    def order(self, now: float) -> list[Hashable]:
        """Every queued request: S in deadline order, then the requests removed from it."""
        on_time, late = self.schedule(now)
        return on_time + late

    def place(self, now: float) -> Callable[[WaitingRequest], tuple]:
        """A sort key of waiting requests that puts them in :meth:`order` (S, then the others, each by deadline),
        and the requests the queue does not hold after all of them, oldest first (one call a request: an engine's
        queue past the knee is thousands)."""
        kept, items = self.on_time(now), self._items

        def key(r: WaitingRequest) -> tuple:
            item = items.get(r.id)
            if item is None:
                return (2, r.arrival, r.id)
            return (r.id not in kept, item[0], item[1])
        return key

    def first_deadline(self, keys, now: float) -> float:
        """The earliest deadline among ``keys`` in the on-time set S (inf if none is): the urgency of the engine
        whose waiting requests they are."""
        kept, items = self.on_time(now), self._items
        best = math.inf
        for k in keys:
            if k in kept:
                best = min(best, items[k][0])
        return best


def prefill_seconds(prompt_tokens: int, tokens_per_s: float) -> float:
    """e = p / c: a request's prefill time at its model's chunked-prefill speed (Algorithm 2, line 4)."""
    if not tokens_per_s > 0:
        raise ValueError(f"prefill speed must be > 0 tokens/s, got {tokens_per_s!r}")
    return prompt_tokens / tokens_per_s


class DeadlineOrder(Scheduler):
    """An engine's scheduler behind its GPU's shared queue: the engine's waiting requests in the queue's order
    (:meth:`DeadlineQueue.order`, the Moore-Hodgson set by deadline, then the rest); a request the queue does not
    hold (one put back by a retraction) goes last, FIFO. The order is computed once per instant and GPU."""

    def __init__(self, queue: "DeadlineQueue") -> None:
        self.queue = queue

    name = "deadline_order"  # built by the fleet for an engine behind a GPU's queue, not from the registry

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        return Plan(sorted(waiting, key=self.queue.place(ctx.now)))
