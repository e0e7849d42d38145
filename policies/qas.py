"""QAS, the query-aware scheduler (DESIGN §3).

Every round it ranks reusable segments by demand, aligns each waiting prompt so that its most demanded
segments come first (so that requests which share them also share a *prefix*), buckets requests by their
leading segment, and orders the queue: a short FIFO cold lane (the oldest requests, so nobody starves), then
the hot lane, bucket by bucket in descending score, FIFO inside a bucket. QAS only orders; the engine's own
budgets decide how many requests are admitted.

Priority of segment r with respect to a reference batch B::

    P(r; B) = w_a·a(r) + w_n·n(r; B) + w_g·g(r)

a(r): admitted, unfinished requests that contain r; g(r): waiting requests that contain r; n(r; B): requests
of B that contain r. The weights (1e6, 1e5, 1) make it a strict ordering: active demand, then next-batch
reuse, then queued prevalence.

Choices the design leaves open, made here:

* front alignment uses the *next counter*: n(r) over the batch predicted in the previous round (the requests
  that would head the round after a dispatch). In the first round, and whenever nothing was predicted, that
  batch is empty, i.e. P(r; ∅). Ties between equal priorities are broken by segment id, so that requests with
  the same segments align to the same order;
* a bucket's reusable segments are the union of its requests' segments; its provisional hot-lane batch is
  its first ``batch_hint`` requests (the engine's free running slots; all of them when unknown);
* the published priorities P̂(r) = P(r; B_dispatch) cover every segment seen in the round (``sys`` included,
  as every request contains it), for DART.

Cost per round: O(S) in queued segment occurrences S, plus O(S log f_front) for the alignment and a sort of
the buckets; no all-pairs work.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import chain
from dataclasses import dataclass
from typing import Mapping, Sequence

from prism.config import nonneg, positive
from prism.core import REUSE

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


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
    window_s: float = nonneg(0.0, "front-end mode only: seconds per QAS round (0: every scheduler iteration)")


class QAS(Scheduler):
    name = "qas"

    def __init__(self, config: QASConfig | None = None) -> None:
        self.config = config or QASConfig()
        self._skeletons: dict[int, tuple[str, ...]] = {}  # request id -> the trace's own reusable order
        self.next_counter: Counter = Counter()  # n(r) over the predicted next batch
        self._round: dict | None = None  # what on_dispatch needs from the last plan
        self.counters: Counter = Counter()

    # ------------------------------------------------------------------ helpers
    def _skeleton(self, r: WaitingRequest) -> tuple[str, ...]:
        sk = self._skeletons.get(r.id)
        if sk is None:
            sk = tuple(s.id for s in r.segments if s.kind == REUSE)
            self._skeletons[r.id] = sk
        return sk

    # ------------------------------------------------------------------ a round
    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        cfg = self.config
        active = ctx.hints.active if ctx.hints is not None else Counter()
        known = self._skeletons
        skeletons = [known.get(r.id) or self._skeleton(r) for r in waiting]
        fixed = [getattr(r, "fixed_order", False) for r in waiting]

        # counters: g(r) over the queue, a(r) from the engine, n(r) from last round's prediction
        g = Counter(chain.from_iterable(skeletons))
        w_a, w_g, w_n = cfg.w_a, cfg.w_g, cfg.w_n
        base = {r: w_g * c for r, c in g.items()}
        for r, c in active.items():
            base[r] = base.get(r, 0.0) + w_a * c
        nxt = self.next_counter
        prio = base.copy()
        for r, c in nxt.items():
            if r in prio:
                prio[r] += w_n * c
        # one global ranking per round makes every per-request choice a small sort: by priority, ties by id
        # (sorting by id first, then stably by priority, keeps the tie order)
        ranked = sorted(prio)
        ranked.sort(key=prio.__getitem__, reverse=True)
        rank = dict(zip(ranked, range(len(ranked))))
        aligner = _Aligner(skeletons, rank, cfg.f_front, fixed)

        # 2. signatures: the first kappa segments of the aligned prompt; buckets filled oldest first
        age = [(r.arrival, r.id) for r in waiting]
        by_age = sorted(range(len(waiting)), key=age.__getitem__)
        kappa, by_rank = cfg.kappa, rank.__getitem__
        fast = 0 < kappa <= cfg.f_front  # then the signature is the top kappa by rank
        buckets: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i in by_age:
            sk = skeletons[i]
            if len(sk) <= 1:
                sig = sk
            elif kappa == 1:
                sig = (min(sk, key=by_rank),)
            elif fast and not fixed[i]:  # aligned order starts with the top kappa, best first
                sig = tuple(sorted(sk, key=by_rank)[:kappa])
            else:  # the top kappa, in their order in the (possibly unaligned) prompt
                top = set(sorted(sk, key=by_rank)[:kappa])
                sig = tuple(s for s in aligner.aligned(i) if s in top)
            buckets[sig].append(i)

        # 4a. cold lane: the q_cold oldest waiting requests, FIFO
        cold_idx = by_age[:cfg.q_cold]
        cold = set(cold_idx)

        # 3. bucket scores: U(b) = mean over the bucket's segments of P(r; B_hot_b), where the provisional
        # hot-lane batch B_hot_b is the bucket's first `hint` requests; 4b. hot lane by descending score
        hint = ctx.batch_hint or len(waiting)
        base_of = base.__getitem__
        scored = []
        for members in buckets.values():
            if len(members) == 1:
                segs = set(skeletons[members[0]])
                n_prov = len(segs)
            else:
                segs = set().union(*(skeletons[i] for i in members))
                n_prov = sum(map(len, map(skeletons.__getitem__, members[:hint])))
            util = (sum(map(base_of, segs)) + w_n * n_prov) / len(segs) if segs else 0.0
            score = cfg.alpha_size * len(members) + cfg.beta_util * util
            scored.append((-score, age[members[0]], members, score))
        scored.sort(key=lambda t: t[:2])
        order_idx = cold_idx + [i for _, _, members, _ in scored for i in members if i not in cold]

        order = [waiting[i] for i in order_idx]
        index = {r.id: i for i, r in enumerate(waiting)}
        self._round = {"order": order, "index": index, "aligner": aligner, "base": base, "active": active}
        self.last = {"priority": prio, "waiting": waiting, "aligner": aligner,
                     "buckets": [(tuple(waiting[i].id for i in m), sc) for _, _, m, sc in scored]}
        self.counters["qas_rounds"] += 1
        self.counters["qas_buckets"] += len(buckets)
        return Plan(order, _LazyAlign(aligner, index), frozenset(waiting[i].id for i in cold))

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        """5. predict the next batch (the requests that now head the order); 6. publish P̂ to eviction."""
        rnd, cfg = self._round, self.config
        if rnd is None:
            return
        index, aligner = rnd["index"], rnd["aligner"]
        dispatched = Counter()
        for r in admitted:
            dispatched.update(aligner.skeletons[index[r.id]])
            dispatched["sys"] += 1
            self._skeletons.pop(r.id, None)
        gone = {r.id for r in admitted}
        rest = [r for r in rnd["order"] if r.id not in gone]
        nxt = Counter()
        for r in rest[:len(admitted)]:
            nxt.update(aligner.skeletons[index[r.id]])
        self.next_counter = nxt
        published = rnd["base"].copy()
        for r, c in dispatched.items():
            published[r] = published.get(r, 0.0) + cfg.w_n * c
        published["sys"] = (cfg.w_a * rnd["active"].get("sys", 0) + cfg.w_n * dispatched.get("sys", 0)
                            + cfg.w_g * len(rnd["order"]))
        if ctx.hints is not None:
            ctx.hints.publish(published)
        self._round = None

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


class _Aligner:
    """Front alignment on demand: the engine only needs it for the requests it admits."""

    def __init__(self, skeletons: list[tuple[str, ...]], rank: dict[str, int], f_front: int,
                 fixed: list[bool]) -> None:
        self.skeletons = skeletons
        self.rank = rank
        self.f = f_front
        self.fixed = fixed
        self._done: dict[int, tuple[str, ...]] = {}

    def aligned(self, i: int) -> tuple[str, ...]:
        """Move the top-f_front segments (by this round's rank) to the front, best first."""
        got = self._done.get(i)
        if got is None:
            sk = self.skeletons[i]
            if self.f <= 0 or len(sk) < 2 or self.fixed[i]:
                got = sk
            else:
                ranked = sorted(sk, key=self.rank.__getitem__)
                if len(sk) > self.f:
                    top = ranked[:self.f]
                    ranked = top + [s for s in sk if s not in top]
                got = tuple(ranked)
            self._done[i] = got
        return got


class _LazyAlign(Mapping):
    """Plan.align for QAS: request id -> aligned reusable order, for the requests whose order changes."""

    def __init__(self, aligner: _Aligner, index: dict[int, int]) -> None:
        self._aligner = aligner
        self._index = index

    def __getitem__(self, rid: int) -> tuple[str, ...]:
        i = self._index[rid]
        al = self._aligner.aligned(i)
        if al == self._aligner.skeletons[i]:
            raise KeyError(rid)
        return al

    def __iter__(self):
        return (rid for rid in self._index if rid in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)
