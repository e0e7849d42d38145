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
prefills the later one in deadline order is removed. O(n log n) per order.

The authors' prototype (a public copy: ``YAMY1234/prism-research``, ``python/prism/multi_model/scheduling/gpu/
request_queue.py``) orders a heap by ``arrival + slo − clamp(prompt_len × 0.5 / 1024, 0.2, 2)`` (least slack
first) and drops nothing; this module follows the paper.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from typing import Hashable, Sequence

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


def moore_hodgson(deadlines: Sequence[float], prefill_s: Sequence[float], now: float = 0.0) -> list[int]:
    """Algorithm 2 on jobs given by index: the indices of S (the jobs that meet their deadlines), in deadline
    order (ties by index)."""
    order = sorted(range(len(deadlines)), key=lambda i: (deadlines[i], i))
    pos = {i: k for k, i in enumerate(order)}
    longest: list[tuple[float, int, int]] = []  # max-heap of (−e, −position, index) over S
    kept: set[int] = set()
    t = now
    for i in order:
        heapq.heappush(longest, (-prefill_s[i], -pos[i], i))
        kept.add(i)
        t += prefill_s[i]
        if t > deadlines[i]:
            e, _, j = heapq.heappop(longest)
            kept.discard(j)
            t += e  # e is −e_j
    return [i for i in order if i in kept]


class DeadlineQueue:
    """The GPU's shared queue: requests of any of its models, keyed by any hashable (a request id)."""

    def __init__(self) -> None:
        self._items: dict[Hashable, tuple[float, int, float]] = {}  # key -> (deadline, arrival sequence, prefill)
        self._sorted: list[tuple[float, int, Hashable]] = []  # by (deadline, sequence)
        self._seq = itertools.count()
        self._ranks: dict[Hashable, int] | None = None  # positions in order(), made at _ranks_at
        self._ranks_at = -math.inf
        self._on_time = 0  # how many of the order are in S

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
        self._ranks = None

    def remove(self, key: Hashable) -> None:
        """Take a request out (dispatched, or gone)."""
        deadline, seq, _ = self._items.pop(key)
        i = bisect.bisect_left(self._sorted, (deadline, seq))
        del self._sorted[i]
        self._ranks = None

    def schedule(self, now: float) -> tuple[list[Hashable], list[Hashable]]:
        """(S: the requests that can all meet their deadlines, in dispatch order; the others, in deadline order)."""
        keys = [k for _, _, k in self._sorted]
        items = [self._items[k] for k in keys]
        kept = set(moore_hodgson([d for d, _, _ in items], [e for _, _, e in items], now))
        self._on_time = len(kept)
        return [k for i, k in enumerate(keys) if i in kept], [k for i, k in enumerate(keys) if i not in kept]

    def order(self, now: float) -> list[Hashable]:
        """Every queued request: S in deadline order, then the requests removed from it."""
        on_time, late = self.schedule(now)
        return on_time + late

    def ranks(self, now: float) -> dict[Hashable, int]:
        """Each queued request's position in :meth:`order` (remembered until the queue or ``now`` changes)."""
        if self._ranks is None or self._ranks_at != now:
            self._ranks = {k: i for i, k in enumerate(self.order(now))}
            self._ranks_at = now
        return self._ranks

    def first_deadline(self, keys, now: float) -> float:
        """The earliest deadline among ``keys`` in the on-time set S (inf if none is): the urgency of the engine
        whose waiting requests they are."""
        rank, on_time = self.ranks(now), self._on_time
        best = math.inf
        for k in keys:
            if rank.get(k, on_time) < on_time:
                best = min(best, self._items[k][0])
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
        rank = self.queue.ranks(ctx.now)
        last = len(rank)
        return Plan(sorted(waiting, key=lambda r: (rank.get(r.id, last), r.arrival, r.id)))
