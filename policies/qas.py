"""QAS, the query-aware scheduler (DESIGN §3).

Every round it ranks segments by demand, aligns each waiting prompt so that its most demanded reusable
segments come first (so that requests which share them also share a *prefix*), buckets requests by their
leading segment, and orders the queue: a short FIFO cold lane (the oldest requests, so nobody starves), then
the hot lane, bucket by bucket in descending score, FIFO inside a bucket. QAS only orders; the engine's own
budgets decide how many requests are admitted.

Priority of segment r with respect to a reference batch B::

    P(r; B) = w_a·a(r) + w_n·n(r; B) + w_g·g(r)

a(r): admitted, unfinished requests that contain r; g(r): waiting requests that contain r; n(r; B): requests
of B that contain r. The weights (1e6, 1e5, 1) make it a strict ordering: active demand, then next-batch
reuse, then queued prevalence. Counters cover a request's shared segments, its system prompt included; only
reusable segments are moved, and only they form signatures and bucket utilities.

Choices the design leaves open, made here:

* front alignment uses the *next counter*: n(r) over the batch predicted in the previous round (the requests
  that would head the round after a dispatch). In the first round, and whenever nothing was predicted, that
  batch is empty, i.e. P(r; ∅). Ties between equal priorities go to the segment QAS saw first, one global
  order, so requests with the same segments align to the same order;
* a bucket's reusable segments are the union of its requests' segments; its provisional hot-lane batch is
  its first ``batch_hint`` requests (the engine's free running slots; all of them when unknown);
* requests marked ``fixed_order`` (conversation history, document blocks) are bucketed but never realigned;
* ``window_s``: 0 (default) runs a round per scheduler iteration, inside the engine; a positive window runs
  QAS as an admission front end before an unmodified FCFS engine (``prism.sim.frontend``), one round per
  window over the requests that arrived in it. 20-50 ms keeps the added delay below a prefill iteration;
* the published priorities P̂(r) = P(r; B_dispatch) cover every segment with demand (P̂ > 0), for DART;
  the others are absent (zero).

Cost per round: O(S) in queued segment occurrences S, in three compiled passes over the queue
(``policies.qas_round``): counters and priorities; signatures; buckets, scores and lanes. Buckets and the FIFO
order come from counting sorts (rows are numbered in FIFO order), bucket ranking from a sort of the buckets;
no all-pairs work. Front alignment (a sort of one request's few segments) runs only for the requests the
engine admits. Per request, QAS keeps its segment indices in a matrix row registered once, on the request's
first round; an engine's queue is matched to rows by looking up only the requests that arrived since the last
round.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Mapping, Sequence

import numpy as np

from prism.config import nonneg, positive
from prism.core import PRIV, REUSE

from prism.policies.base import DemandHints, Plan, SchedContext, Scheduler, WaitingRequest
from prism.policies.qas_round import aligned_row, changes, order_queue, priorities, segment_counts, signatures


_ID = attrgetter("id")


@dataclass
class QASConfig:
    w_a: float = nonneg(1e6, "weight of active demand a(r)")
    w_n: float = nonneg(1e5, "weight of next-batch reuse n(r; B)")
    w_g: float = nonneg(1.0, "weight of queued prevalence g(r)")
    f_front: int = nonneg(3, "segments moved to the front of each prompt (0: no alignment)")
    kappa: int = positive(1, "segments in a bucket signature")
    alpha_size: float = nonneg(1.0, "bucket score weight of the bucket's size")
    beta_util: float = nonneg(0.5, "bucket score weight of the bucket's utility U(b)")
    q_cold: int = nonneg(2, "oldest waiting requests in the FIFO cold lane")
    window_s: float = nonneg(0.0, "0: a round per scheduler iteration (inside the engine); > 0: QAS runs as an "
                                  "admission front end, one round per window of this many seconds")


class _Rows:
    """Each request's segment indices in a growing matrix, registered on first sight.

    Column 0 holds the request's system segment (-1 without one), the rest its reusable segments in prompt
    order (-1 padded): the counters read the whole row, signatures and utilities only the reusable part.
    Rows are numbered in registration order; while requests are first seen in FIFO (arrival, id) order, as
    an engine's queue shows them, the row number *is* the FIFO position and no round sorts by age.
    """

    def __init__(self) -> None:
        self.index: dict[str, int] = {}  # segment id -> index, in first-seen order
        self.names: list[str] = []
        self.row: dict[int, int] = {}  # request id -> row
        self.count = 0  # rows registered
        self.mat = np.full((64, 9), -1, dtype=np.int64)
        self.length = np.zeros(64, dtype=np.int64)  # reusable segments per row
        self.arrival = np.zeros(64)
        self.rid = np.zeros(64, dtype=np.int64)
        self.fixed = np.zeros(64, dtype=bool)
        self.width = 1  # columns in use: 1 + the most reusable segments of a row
        self.fifo_rows = True  # rows were registered in (arrival, id) order
        self._last_age = (-np.inf, -1)

    def _seg(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
        return i

    def _grow(self, rows: int, cols: int) -> None:
        n = self.count
        mat = np.full((rows, cols), -1, dtype=np.int64)
        mat[:n, :self.mat.shape[1]] = self.mat[:n]
        self.mat = mat
        for name in ("length", "arrival", "rid", "fixed"):
            old = getattr(self, name)
            new = np.zeros(rows, dtype=old.dtype)
            new[:n] = old[:n]
            setattr(self, name, new)

    def add(self, requests: Sequence[WaitingRequest]) -> None:
        """Register requests not seen before, in the given order (one block write for all of them)."""
        seg, block = self._seg, []
        for r in requests:  # segments numbered as seen: a request's reusable ones, then its system segment
            row, system = [-1], None
            for s in r.segments:
                kind = s.kind
                if kind == REUSE:
                    row.append(seg(s.id))
                elif kind != PRIV and system is None:
                    system = s.id
            if system is not None:
                row[0] = seg(system)
            block.append(row)
            age = (r.arrival, r.id)
            if age < self._last_age:
                self.fifo_rows = False
            self._last_age = age
        n0, n1 = self.count, self.count + len(block)
        width = max([self.width, *map(len, block)])
        capacity, cols = self.mat.shape
        if n1 > capacity or width > cols:
            self._grow(max(n1, 2 * capacity), max(cols, width))
        self.mat[n0:n1, :width] = [row + [-1] * (width - len(row)) for row in block]
        self.length[n0:n1] = [len(row) - 1 for row in block]
        self.arrival[n0:n1] = [r.arrival for r in requests]
        ids = [r.id for r in requests]
        self.rid[n0:n1] = ids
        self.fixed[n0:n1] = [r.fixed_order for r in requests]
        self.row.update(zip(ids, range(n0, n1)))
        self.count, self.width = n1, width

    def rows_of(self, waiting: Sequence[WaitingRequest]) -> np.ndarray:
        rows = list(map(self.row.get, map(_ID, waiting)))
        if None in rows:
            self.add([r for r, i in zip(waiting, rows) if i is None])
            rows = list(map(self.row.__getitem__, map(_ID, waiting)))
        return np.array(rows, dtype=np.int64)

    def counts(self, rows: np.ndarray, size: int) -> np.ndarray:
        """Per segment: how many of these requests contain it (reusable and system segments)."""
        return segment_counts(self.mat, rows, self.width, size)

    def fifo(self, rows: np.ndarray) -> np.ndarray:
        """A key that sorts these rows in FIFO (arrival, id) order: the row itself when rows were registered
        in that order, else each row's position in the sorted queue."""
        if self.fifo_rows:
            return rows
        pos = np.empty(len(rows), dtype=np.int64)
        pos[np.lexsort((self.rid[rows], self.arrival[rows]))] = np.arange(len(rows))
        return pos


class QAS(Scheduler):
    def __init__(self, config: QASConfig | None = None) -> None:
        self.config = config or QASConfig()
        self.rows = _Rows()
        self._next = np.zeros(0)  # n(r) over the predicted next batch, by segment index
        self._base: np.ndarray | None = None  # the last plan's w_a·a + w_g·g, until its dispatch publishes P̂
        self._last: tuple | None = None
        self._queue: tuple[list, np.ndarray] | None = None  # the last order (minus any admitted head), its rows
        self._published = np.zeros(0)  # the last published P̂, by segment index, and as the dict DART reads
        self._published_dict: dict[str, float] = {}
        self.counters: Counter = Counter()

    @property
    def last(self) -> dict | None:
        """The last round's priorities (segment -> P) and buckets ((request ids...), score), built on demand
        for inspection and tests, so that rounds pay nothing for it."""
        if self._last is None:
            return None
        waiting, prio, grouped, starts, size, score = self._last
        names = self.rows.names
        return {"priority": {names[i]: float(prio[i]) for i in np.flatnonzero(prio)},
                "buckets": [(tuple(waiting[i].id for i in grouped[s:s + k]), float(score[b]))
                            for b, (s, k) in enumerate(zip(starts.tolist(), size.tolist()))]}

    @property
    def next_counter(self) -> Counter:
        names = self.rows.names
        return Counter({names[i]: int(c) for i, c in enumerate(self._next) if c})

    def _active(self, ctx: SchedContext, size: int) -> np.ndarray:
        """a(r) by segment index, from the engine's active counter."""
        a = np.zeros(size)
        active = ctx.hints.active if ctx.hints is not None else None
        if active:
            idx = np.fromiter(map(self.rows.index.get, active, repeat(-1)), np.int64, len(active))
            known = idx >= 0
            a[idx[known]] = np.fromiter(active.values(), float, len(active))[known]
        return a

    # ------------------------------------------------------------------ a round
    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        cfg, rows_ = self.config, self.rows
        n = len(waiting)
        if n == 0:
            return Plan([])
        rows = self._rows_of(waiting)
        V, width = len(rows_.names), rows_.width
        fifo = rows_.fifo(rows)
        nxt = np.zeros(V)
        nxt[:len(self._next)] = self._next[:V]
        # 1. counters and priorities
        base, prio = priorities(rows_.mat, rows, width, self._active(ctx, V), nxt, cfg.w_a, cfg.w_n, cfg.w_g)
        # 2. signatures: the top-kappa reusable segments (in aligned order)
        sig = signatures(rows_.mat, rows, rows_.length, rows_.fixed, prio, cfg.f_front, cfg.kappa)
        sig = sig[:, 0] if cfg.kappa == 1 else np.unique(sig, axis=0, return_inverse=True)[1].ravel()
        # 3.-4. buckets, scores, cold and hot lanes
        order_pos, cold, grouped, starts, size, score = order_queue(
            rows_.mat, rows, width, fifo, rows_.length, sig, base, cfg.w_n, cfg.alpha_size, cfg.beta_util,
            ctx.batch_hint or n, cfg.q_cold)
        order = list(_pick(waiting, order_pos))

        self._base = base
        self._queue = (order, rows[order_pos])
        self._last = (waiting, prio, grouped, starts, size, score)  # references only: `last` builds views
        self.counters["qas_rounds"] += 1
        self.counters["qas_buckets"] += len(starts)
        return Plan(order, _Alignment(rows_, rows, prio, cfg.f_front),
                    lanes=dict.fromkeys(rows_.rid[rows[cold]].tolist(), "cold"))

    def _rows_of(self, waiting: Sequence[WaitingRequest]) -> np.ndarray:
        """Rows of the waiting requests. An engine's queue is what the last round left (its order minus the
        admitted head) followed by new arrivals: then only the arrivals are looked up."""
        if self._queue is not None:
            known, rows = self._queue
            m = len(known)
            if len(waiting) >= m and waiting[:m] == known:  # a C-level pass: the same objects, in order
                return np.concatenate([rows, self.rows.rows_of(waiting[m:])]) if len(waiting) > m else rows
        return self.rows.rows_of(waiting)

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        """5. predict the next batch (the requests that now head the order); 6. publish P̂ to eviction."""
        cfg, rows_ = self.config, self.rows
        if self._base is None or self._queue is None:
            return
        V, k = len(rows_.names), len(admitted)
        order, order_rows = self._queue
        if admitted == order[:k]:  # the engine admitted the head of the order, as it does (a C-level pass)
            taken, rest = order_rows[:k], order_rows[k:2 * k]
            self._queue = (order[k:], order_rows[k:])
        else:
            taken = rows_.rows_of(admitted)
            rest = order_rows[~np.isin(order_rows, taken)][:k]
            self._queue = None
        self._next = rows_.counts(rest, V)
        if ctx.hints is not None:
            self._publish(ctx.hints, self._base + cfg.w_n * rows_.counts(taken, V))
        self._base = None

    def _publish(self, hints: DemandHints, published: np.ndarray) -> None:
        """Publish P̂ (segments with P̂ > 0). One dict is kept up to date: only the segments whose P̂ changed
        since the last publication are written, a small part of the hundreds with demand."""
        up, gone = changes(published, self._published)
        out, names = self._published_dict, self.rows.names
        out.update(zip(_pick(names, up), published[up].tolist()))
        for name in _pick(names, gone):
            del out[name]
        self._published = published
        hints.publish(out)

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


def _pick(items: Sequence, index: np.ndarray) -> Sequence:
    """``items`` at these indices, in one C-level pass."""
    return itemgetter(*index.tolist())(items) if len(index) > 1 else [items[i] for i in index.tolist()]


class _Alignment(Mapping):
    """Plan.align for QAS: request id -> aligned reusable order, for the queued requests whose order changes.
    Aligned on demand with the round's priorities: the engine asks only for the requests it admits."""

    def __init__(self, rows: _Rows, queued: np.ndarray, prio: np.ndarray, f_front: int) -> None:
        self._rows, self._queued, self._prio, self._f = rows, queued, prio, f_front
        self._pos = np.full(rows.count, -1, dtype=np.int64)  # row -> queue position (-1: not queued)
        self._pos[queued] = np.arange(len(queued))

    def get(self, rid: int, default=None):
        """The engine's call, once per admitted request (no exception for the many that keep their order)."""
        rows = self._rows
        row = rows.row.get(rid, len(self._pos))  # a request registered after this round: not queued
        if row >= len(self._pos) or self._pos[row] < 0:
            return default
        out, moved = aligned_row(rows.mat, row, rows.length, rows.fixed, self._prio, self._f)
        if not moved:
            return default
        return tuple(_pick(rows.names, out))

    def __getitem__(self, rid: int) -> tuple[str, ...]:
        out = self.get(rid)
        if out is None:
            raise KeyError(rid)
        return out

    def __iter__(self):
        return (rid for rid in self._rows.rid[self._queued].tolist() if rid in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)
