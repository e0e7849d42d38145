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

Cost per round: O(S) in queued segment occurrences S, plus sorts of the queued segments (ranking), of the
(bucket, segment) pairs, of the buckets and of the queue (one int64 key each: rows are numbered in FIFO order),
all in vectorised numpy; no all-pairs work. Per request, QAS keeps its segment indices in a matrix row
registered once, on the request's first round; an engine's queue is matched to rows by looking up only the
requests that arrived since the last round.
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

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


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
        self.mat = np.full((64, 9), -1, dtype=np.int64)
        self.length = np.zeros(64, dtype=np.int64)  # reusable segments per row
        self.arrival = np.zeros(64)
        self.rid = np.zeros(64, dtype=np.int64)
        self.fixed = np.zeros(64, dtype=bool)
        self.skeleton: list[tuple[str, ...]] = []
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
        n = len(self.skeleton)
        mat = np.full((rows, cols), -1, dtype=np.int64)
        mat[:n, :self.mat.shape[1]] = self.mat[:n]
        self.mat = mat
        for name in ("length", "arrival", "rid", "fixed"):
            old = getattr(self, name)
            new = np.zeros(rows, dtype=old.dtype)
            new[:n] = old[:n]
            setattr(self, name, new)

    def add(self, r: WaitingRequest) -> int:
        n = len(self.skeleton)
        reusable, system = [], None
        for s in r.segments:
            if s.kind == REUSE:
                reusable.append(s.id)
            elif s.kind != PRIV and system is None:
                system = s.id
        sk = tuple(reusable)
        capacity, cols = self.mat.shape
        if n == capacity or len(sk) >= cols:
            self._grow(2 * capacity if n == capacity else capacity, max(cols, len(sk) + 1))
        # reusable first, then the system segment: the first-seen order of the design
        self.mat[n, 1:1 + len(sk)] = [self._seg(s) for s in sk]
        if system is not None:
            self.mat[n, 0] = self._seg(system)
        self.length[n] = len(sk)
        self.arrival[n] = r.arrival
        self.rid[n] = r.id
        self.fixed[n] = bool(getattr(r, "fixed_order", False))
        self.skeleton.append(sk)
        if len(sk) >= self.width:
            self.width = len(sk) + 1
        age = (r.arrival, r.id)
        if age < self._last_age:
            self.fifo_rows = False
        self._last_age = age
        self.row[r.id] = n
        return n

    def rows_of(self, waiting: Sequence[WaitingRequest]) -> np.ndarray:
        rows = list(map(self.row.get, map(_ID, waiting)))
        if None in rows:
            rows = [self.add(r) if i is None else i for r, i in zip(waiting, rows)]
        return np.array(rows, dtype=np.int64)

    def counts(self, rows: np.ndarray, size: int) -> np.ndarray:
        """Per segment: how many of these requests contain it (reusable and system segments)."""
        seg = self.mat[rows, :self.width]
        return np.bincount(seg[seg >= 0], minlength=size)

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
        V = len(rows_.names)
        shared = rows_.mat[rows, :rows_.width]  # column 0: system segment; then the reusable ones
        seg = shared[:, 1:]
        valid = seg >= 0
        fifo = rows_.fifo(rows)
        span = int(fifo.max()) + 1  # FIFO keys lie in [0, span): a composite key is primary * span + fifo

        # counters and priorities over every known segment
        g = np.bincount(shared[shared >= 0], minlength=V)
        base = cfg.w_a * self._active(ctx, V) + cfg.w_g * g
        nxt = np.zeros(V)
        nxt[:len(self._next)] = self._next[:V]
        prio = base + cfg.w_n * nxt
        # rank the segments the queue holds (the only ones a signature or an alignment compares): by
        # priority, ties to the segment seen first
        present = np.flatnonzero(g)
        rank = np.full(V + 1, V, dtype=np.int64)  # rank[-1] (padding) = V: never the best
        rank[present[np.argsort(-prio[present], kind="stable")]] = np.arange(len(present))

        # 2. signatures: the top-kappa reusable segments (kappa = 1: the best one; -1 without any)
        if cfg.kappa == 1 or seg.shape[1] == 0:
            if seg.shape[1]:
                best = np.argmin(rank[seg], axis=1)
                sig = np.where(valid[:, 0], seg[np.arange(n), best], -1)
            else:
                sig = np.full(n, -1, dtype=np.int64)
        else:
            sig = self._signatures(rows, rank)

        # buckets, each FIFO
        grouped = np.argsort((sig + 1) * span + fifo)
        sig_sorted = sig[grouped]
        new_bucket = np.empty(n, dtype=bool)
        new_bucket[:1] = True
        np.not_equal(sig_sorted[1:], sig_sorted[:-1], out=new_bucket[1:])
        bucket_sorted = np.cumsum(new_bucket) - 1
        starts = np.flatnonzero(new_bucket)
        nb = len(starts)
        bucket = np.empty(n, dtype=np.int64)
        bucket[grouped] = bucket_sorted
        size = np.empty(nb, dtype=np.int64)
        np.subtract(starts[1:], starts[:-1], out=size[:-1])
        size[-1] = n - starts[-1]

        # 3. scores: U(b) = mean over the bucket's reusable segments of P(r; B_hot_b), B_hot_b its first
        # `hint` requests; Score(b) = alpha·|T[b]| + beta·U(b)
        hint = ctx.batch_hint or n
        in_batch = (np.arange(n) - starts[bucket_sorted]) < hint
        n_prov = np.bincount(bucket_sorted[in_batch], weights=rows_.length[rows[grouped[in_batch]]], minlength=nb)
        pairs = np.sort((bucket[:, None] * V + seg)[valid])
        pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if len(pairs) else pairs  # distinct (bucket, segment)
        pb, ps = np.divmod(pairs, max(V, 1))
        n_segs = np.bincount(pb, minlength=nb)
        util = np.bincount(pb, weights=base[ps], minlength=nb) + cfg.w_n * n_prov
        np.divide(util, n_segs, out=util, where=n_segs > 0)
        score = cfg.alpha_size * size + cfg.beta_util * util

        # 4. lanes: the q_cold oldest requests first (FIFO), then the hot lane: buckets by descending score
        # (ties: older head), FIFO inside
        bucket_rank = np.empty(nb, dtype=np.int64)
        bucket_rank[np.lexsort((fifo[grouped[starts]], -score))] = np.arange(nb)
        q = min(cfg.q_cold, n)
        cold = np.argpartition(fifo, q - 1)[:q] if 0 < q < n else np.arange(q)
        key = bucket_rank[bucket] * span + fifo
        key[cold] = fifo[cold] - span  # the cold lane heads the order, in FIFO order
        order_pos = np.argsort(key)
        order = list(itemgetter(*order_pos.tolist())(waiting)) if n > 1 else list(waiting)

        rid = rows_.rid[rows]
        aligner = _Aligner(rows_, rank, cfg.f_front)
        self._base = base
        self._queue = (order, rows[order_pos])
        self._last = (waiting, prio, grouped, starts, size, score)  # references only: `last` builds views
        self.counters["qas_rounds"] += 1
        self.counters["qas_buckets"] += nb
        return Plan(order, _LazyAlign(aligner, rid), frozenset(rid[cold].tolist()))

    def _rows_of(self, waiting: Sequence[WaitingRequest]) -> np.ndarray:
        """Rows of the waiting requests. An engine's queue is what the last round left (its order minus the
        admitted head) followed by new arrivals: then only the arrivals are looked up."""
        if self._queue is not None:
            known, rows = self._queue
            m = len(known)
            if len(waiting) >= m and waiting[:m] == known:  # a C-level pass: the same objects, in order
                return np.concatenate([rows, self.rows.rows_of(waiting[m:])]) if len(waiting) > m else rows
        return self.rows.rows_of(waiting)

    def _signatures(self, rows: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """kappa > 1: the top-kappa reusable segments, in their aligned order, as bucket keys."""
        kappa, f, keys, out = self.config.kappa, self.config.f_front, {}, np.empty(len(rows), dtype=np.int64)
        for j, row in enumerate(rows):
            sk = [self.rows.index[s] for s in self.rows.skeleton[row]]
            top = sorted(sk, key=rank.__getitem__)[:kappa]
            if self.rows.fixed[row] or kappa > f:
                aligned = _align(sk, rank, 0 if self.rows.fixed[row] else f)
                top_set = set(top)
                top = [s for s in aligned if s in top_set]
            out[j] = keys.setdefault(tuple(top), len(keys))
        return out

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        """5. predict the next batch (the requests that now head the order); 6. publish P̂ to eviction."""
        cfg, rows_ = self.config, self.rows
        if self._base is None or self._queue is None:
            return
        V, k = len(rows_.names), len(admitted)
        taken = rows_.rows_of(admitted)
        order, order_rows = self._queue
        if np.array_equal(order_rows[:k], taken):  # the engine admitted the head of the order, as it does
            rest = order_rows[k:2 * k]
            self._queue = (order[k:], order_rows[k:])
        else:
            rest = order_rows[~np.isin(order_rows, taken)][:k]
            self._queue = None
        self._next = rows_.counts(rest, V).astype(float)
        if ctx.hints is not None:
            published = self._base + cfg.w_n * rows_.counts(taken, V)
            nz = np.flatnonzero(published > 0)
            names = itemgetter(*nz.tolist())(rows_.names) if len(nz) > 1 else [rows_.names[i] for i in nz]
            ctx.hints.publish(dict(zip(names, published[nz].tolist())))
        self._base = None

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


def _align(skeleton: list[int], rank: Sequence[int], f: int) -> list[int]:
    """Move the top-f segments (by rank) to the front, best first; the rest keep their order."""
    if f <= 0 or len(skeleton) < 2:
        return skeleton
    ranked = sorted(skeleton, key=rank.__getitem__)
    if len(skeleton) <= f:
        return ranked
    top = ranked[:f]
    return top + [s for s in skeleton if s not in top]


class _Aligner:
    """Front alignment on demand: the engine only needs it for the requests it admits."""

    def __init__(self, rows: _Rows, rank: np.ndarray, f_front: int) -> None:
        self.rows, self.rank, self.f = rows, rank, f_front
        self._ranks: list[int] | None = None  # rank as plain ints, made on the first alignment

    def aligned(self, row: int) -> tuple[str, ...]:
        sk = self.rows.skeleton[row]
        if self.rows.fixed[row] or self.f <= 0 or len(sk) < 2:
            return sk
        if self._ranks is None:
            self._ranks = self.rank.tolist()
        names = self.rows.names
        return tuple(names[s] for s in _align(self.rows.mat[row, 1:1 + len(sk)].tolist(), self._ranks, self.f))


class _LazyAlign(Mapping):
    """Plan.align for QAS: request id -> aligned reusable order, for the requests whose order changes."""

    def __init__(self, aligner: _Aligner, ids: np.ndarray) -> None:
        self._aligner = aligner
        self._ids = ids  # this round's waiting requests

    def __getitem__(self, rid: int) -> tuple[str, ...]:
        row = self._aligner.rows.row[rid]
        al = self._aligner.aligned(row)
        if al == self._aligner.rows.skeleton[row]:
            raise KeyError(rid)
        return al

    def __iter__(self):
        return (rid for rid in self._ids.tolist() if rid in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)
