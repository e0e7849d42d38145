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
* the published priorities P̂(r) = P(r; B_dispatch) cover every segment QAS knows (zero for those without
  demand), for DART.

Cost per round: O(S) in queued segment occurrences S plus a sort of the known segments and of the buckets,
all in vectorised numpy; no all-pairs work. Per request, QAS keeps its segment indices in a matrix row
registered once, on the request's first round.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Iterator, Mapping, Sequence

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


class PriorityView(Mapping):
    """P̂ as a read-only mapping segment id -> priority over a numpy vector; zero entries are absent."""

    def __init__(self, index: dict[str, int], names: list[str], values: np.ndarray) -> None:
        self._index, self._names, self._values = index, names, values
        self._list = values.tolist()  # eviction asks one segment at a time: plain floats answer fastest

    def get(self, key, default=None):
        i = self._index.get(key)
        if i is None or i >= len(self._list):
            return default
        v = self._list[i]
        return v if v > 0 else default

    def __getitem__(self, key: str) -> float:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def __iter__(self) -> Iterator[str]:
        return (self._names[i] for i in np.flatnonzero(self._values > 0))

    def __len__(self) -> int:
        return int(np.count_nonzero(self._values > 0))


class _Rows:
    """Each request's segment indices in a growing matrix, registered on first sight."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}  # segment id -> index, in first-seen order
        self.names: list[str] = []
        self.row: dict[int, int] = {}  # request id -> row
        self.mat = np.full((64, 8), -1, dtype=np.int64)  # reusable segment indices, -1 padded
        self.sys = np.full(64, -1, dtype=np.int64)  # index of the request's other shared segment (sys)
        self.length = np.zeros(64, dtype=np.int64)
        self.arrival = np.zeros(64)
        self.rid = np.zeros(64, dtype=np.int64)
        self.fixed = np.zeros(64, dtype=bool)
        self.skeleton: list[tuple[str, ...]] = []
        self.width = 0  # widest row so far

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
        for name in ("sys", "length", "arrival", "rid", "fixed"):
            old = getattr(self, name)
            new = np.full(rows, -1, dtype=old.dtype) if name == "sys" else np.zeros(rows, dtype=old.dtype)
            new[:n] = old[:n]
            setattr(self, name, new)

    def add(self, r: WaitingRequest) -> int:
        n = len(self.skeleton)
        sk = tuple(s.id for s in r.segments if s.kind == REUSE)
        capacity, cols = self.mat.shape
        if n == capacity or len(sk) > cols:
            self._grow(2 * capacity if n == capacity else capacity, max(cols, len(sk)))
        self.mat[n, :len(sk)] = [self._seg(s) for s in sk]
        others = [s.id for s in r.segments if s.kind not in (REUSE, PRIV)]
        self.sys[n] = self._seg(others[0]) if others else -1
        self.length[n] = len(sk)
        self.arrival[n] = r.arrival
        self.rid[n] = r.id
        self.fixed[n] = bool(getattr(r, "fixed_order", False))
        self.skeleton.append(sk)
        self.width = max(self.width, len(sk))
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
        out = np.bincount(seg[seg >= 0], minlength=size)
        sys = self.sys[rows]
        return out + np.bincount(sys[sys >= 0], minlength=size)


class QAS(Scheduler):
    def __init__(self, config: QASConfig | None = None) -> None:
        self.config = config or QASConfig()
        self.rows = _Rows()
        self._next = np.zeros(0)  # n(r) over the predicted next batch, by segment index
        self._round: dict | None = None  # what on_dispatch needs from the last plan
        self._last: tuple | None = None
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

    # ------------------------------------------------------------------ a round
    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        cfg, rows_ = self.config, self.rows
        n = len(waiting)
        rows = rows_.rows_of(waiting)
        V = len(rows_.names)
        seg = rows_.mat[rows, :rows_.width]
        valid = seg >= 0
        lengths = rows_.length[rows]
        arrival, rid = rows_.arrival[rows], rows_.rid[rows]

        # counters and priorities over every known segment
        g = rows_.counts(rows, V)
        a = np.zeros(V)
        if ctx.hints is not None:
            for name, c in ctx.hints.active.items():
                i = rows_.index.get(name)
                if i is not None:
                    a[i] = c
        nxt = np.zeros(V)
        nxt[:len(self._next)] = self._next[:V]
        base = cfg.w_a * a + cfg.w_g * g
        prio = base + cfg.w_n * nxt
        # rank the segments the queue holds (the only ones a signature or an alignment compares): by
        # priority, ties to the segment seen first
        present = np.flatnonzero(g)
        ranked = present[np.argsort(-prio[present], kind="stable")]
        rank = np.full(V, V, dtype=np.int64)
        rank[ranked] = np.arange(len(ranked))

        # 2. signatures: the top-kappa reusable segments (kappa = 1: the best one)
        if cfg.kappa == 1 or rows_.width == 0:
            big = np.iinfo(np.int64).max
            r = np.where(valid, rank[np.maximum(seg, 0)], big)
            top = seg[np.arange(n), np.argmin(r, axis=1)] if rows_.width else np.full(n, -1)
            sig = np.where(lengths > 0, top, -1)
        else:
            sig = self._signatures(rows, rank)

        # 4a. cold lane: the q_cold oldest waiting requests
        by_age = np.lexsort((rid, arrival))
        cold = by_age[:cfg.q_cold]

        # buckets, each FIFO
        grouped = np.lexsort((rid, arrival, sig))
        sig_sorted = sig[grouped]
        new_bucket = np.empty(n, dtype=bool)
        new_bucket[:1] = True
        new_bucket[1:] = sig_sorted[1:] != sig_sorted[:-1]
        bucket_sorted = np.cumsum(new_bucket) - 1
        starts = np.flatnonzero(new_bucket)
        nb = len(starts)
        bucket = np.empty(n, dtype=np.int64)
        bucket[grouped] = bucket_sorted
        size = np.diff(np.append(starts, n))

        # 3. scores: U(b) = mean over the bucket's reusable segments of P(r; B_hot_b), B_hot_b its first
        # `hint` requests; Score(b) = alpha·|T[b]| + beta·U(b)
        hint = ctx.batch_hint or n
        in_batch = (np.arange(n) - starts[bucket_sorted]) < hint
        n_prov = np.bincount(bucket_sorted, weights=lengths[grouped] * in_batch, minlength=nb)
        pairs = np.sort((bucket[:, None] * V + seg)[valid])
        pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if len(pairs) else pairs  # distinct (bucket, segment)
        pb, ps = pairs // max(V, 1), pairs % max(V, 1)
        sum_base = np.bincount(pb, weights=base[ps], minlength=nb)
        n_segs = np.bincount(pb, minlength=nb)
        util = np.divide(sum_base + cfg.w_n * n_prov, n_segs, out=np.zeros(nb), where=n_segs > 0)
        score = cfg.alpha_size * size + cfg.beta_util * util

        # 4b. hot lane: buckets by descending score (ties: older head), FIFO inside, the cold ones left out
        head = grouped[starts]
        bucket_rank = np.empty(nb, dtype=np.int64)
        bucket_rank[np.lexsort((rid[head], arrival[head], -score))] = np.arange(nb)
        is_cold = np.zeros(n, dtype=bool)
        is_cold[cold] = True
        hot = np.flatnonzero(~is_cold)
        hot = hot[np.lexsort((rid[hot], arrival[hot], bucket_rank[bucket[hot]]))]
        order_pos = np.concatenate([cold, hot])
        order = list(itemgetter(*order_pos.tolist())(waiting)) if n > 1 else list(waiting)

        aligner = _Aligner(rows_, rank, cfg.f_front)
        self._round = {"order_rows": rows[order_pos], "base": base}
        self._last = (waiting, prio, grouped, starts, size, score)  # references only: `last` builds views
        self.counters["qas_rounds"] += 1
        self.counters["qas_buckets"] += nb
        return Plan(order, _LazyAlign(aligner, rid), frozenset(int(rid[i]) for i in cold))

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
        rnd, cfg, rows_ = self._round, self.config, self.rows
        if rnd is None:
            return
        V = len(rows_.names)
        taken = rows_.rows_of(admitted)
        dispatched = rows_.counts(taken, V)
        order_rows = rnd["order_rows"]
        rest = order_rows[~np.isin(order_rows, taken)]
        self._next = rows_.counts(rest[:len(admitted)], V).astype(float)
        if ctx.hints is not None:
            ctx.hints.publish(PriorityView(rows_.index, rows_.names, rnd["base"] + cfg.w_n * dispatched))
        self._round = None

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


def _align(skeleton: list[int], rank: np.ndarray, f: int) -> list[int]:
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

    def aligned(self, row: int) -> tuple[str, ...]:
        sk = self.rows.skeleton[row]
        if self.rows.fixed[row]:
            return sk
        idx = self.rows.index
        return tuple(self.rows.names[s] for s in _align([idx[s] for s in sk], self.rank, self.f))


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
