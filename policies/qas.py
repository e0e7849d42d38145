"""QAS, the query-aware scheduler (DESIGN §3), as plain named steps: the definition to read and to change.

Every round QAS ranks segments by demand, aligns each waiting prompt so that its most demanded reusable
segments come first (so that requests which share them also share a *prefix*), buckets requests by their
leading segments, and orders the queue: a short FIFO cold lane (the oldest requests, so nobody starves),
then the hot lane, bucket by bucket in descending score, FIFO inside a bucket. QAS only orders; the engine's
own budgets decide how many requests are admitted. After the engine admits, QAS predicts the next batch and
publishes its segment priorities to the eviction policy (DART).

Priority of segment r with respect to a reference batch B::

    P(r; B) = w_a·a(r) + w_n·n(r; B) + w_g·g(r)

a(r): admitted, unfinished requests that contain r; g(r): waiting requests that contain r; n(r; B): requests
of B that contain r. The weights (1e6, 1e5, 1) make it a strict ordering: active demand, then next-batch
reuse, then queued prevalence. Counters cover a request's shared segments, its system prompt included; only
reusable segments are moved, and only they form signatures and bucket utilities.

Choices the design leaves open, made here:

* front alignment and signatures rank segments by P(r; ∅), as the paper and DESIGN §3 say. (An earlier
  reading ranked them by P(r; B̂), B̂ the batch predicted in the previous round: measured on zipf and
  zipf-shuffled at 40-80 QPS, 3 seeds, in-engine, it was never better and lost up to 0.4 hit points, so it
  is gone; the predicted batch is still computed and shown as ``next_counter``.) Ties between equal
  priorities go to the segment QAS saw first, one global order (a request's reusable segments in prompt
  order, then its system prompt, as requests are first seen), so requests with the same segments align to
  the same order;
* a bucket's reusable segments are the union of its requests' segments; its provisional hot-lane batch is
  its first ``batch_hint`` requests (the engine's free running slots; all of them when unknown);
* requests marked ``fixed_order`` (conversation history, document blocks) are bucketed but never realigned;
* ``window_s``: the paper's deployment, and the default (0.05 s): QAS runs as an admission front end before
  an unmodified FCFS engine (``prism.sim.frontend``), one round per window; 20-50 ms keeps the added delay
  below a prefill iteration. What a round plans is ``front_end``: ``backlog`` (the default, DESIGN §3's
  reading of the paper: requests wait in the front end while the engine is full, each window releases what
  the engine has room for from the whole pending set, an arrival that finds room goes at once) or
  ``arrivals`` (the requests that arrived in the window, all released). 0 runs a round per scheduler
  iteration, inside the engine. In the engine and holding the backlog, a round re-plans requests it left
  waiting, which past the knee starves requests without hot segments; so a request that has waited
  ``max_wait_s`` is served ahead of the lanes (FIFO among such requests, lane ``aged``). Default 2 s, measured
  in-engine on zipf and zipf-shuffled at 60-80 QPS (1.2-1.8x the knee), 2 seeds: without a bound P99 TTFT was
  13-34 s (P50 under 2 s); 2 s brings P99 to the window-of-arrivals front end's level (5-20 s) at the same hit
  rate; 5 s lies between. Holding the backlog (zipf, 60-80 QPS, 3 seeds): without a bound P99 12-27 s against
  6-13 s with it; 1 s and 2 s are alike, 5 s gives P99 8.5 s at 60 QPS. A window of arrivals bounds the wait a
  round adds by itself and needs no such limit. The deployments side by side: the README's *Deployments*;
* the published priorities P̂(r) = P(r; B_dispatch) cover every segment with demand (P̂ > 0), for DART;
  the others are absent (zero).

This class is written for reading: each step is a short method over dicts and lists, O(S log S) in queued
segment occurrences S. The registry runs :class:`~prism.policies.qas_compiled.CompiledQAS`, the same rounds
as compiled passes over a request matrix (49-69x faster); ``tests/test_qas.py`` holds the two equal, round
after round, on random queues. A change to QAS's definition is made here first, then in the compiled passes.
"""

from __future__ import annotations

from collections import Counter
import dataclasses
from dataclasses import dataclass
from typing import Sequence

from prism.config import choice, nonneg, positive
from prism.core import PRIV, REUSE
from prism.counters import QAS_AGED, QAS_BUCKETS, QAS_ROUNDS

from prism.policies.base import (BACKLOG, FRONT_END, FRONT_END_HOLDS, Deployment, DemandHints, Part, Plan,
                                 SchedContext, Scheduler, WaitingRequest)


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
    buckets: bool = dataclasses.field(default=True, metadata={
        "doc": "order the hot lane by bucket (false: one bucket, the hot lane in FIFO order; the ablation of "
               "buckets and lanes)"})
    window_s: float = nonneg(0.05, "> 0: QAS runs as an admission front end, one round per window of this many "
                                   "seconds (the paper's deployment); 0: a round per scheduler iteration, inside "
                                   "the engine")
    front_end: str = choice(BACKLOG, FRONT_END_HOLDS, "what the front end holds (window_s > 0): backlog (requests "
                            "wait in its pending set while the backend is full; each window releases what the "
                            "backend has room for) or arrivals (each window's arrivals, all released when it "
                            "closes)")
    max_wait_s: float = positive(2.0, "in-engine mode and a front end that holds the backlog: a request waiting "
                                      "longer is served first, FIFO (the starvation bound)")

    @property
    def replans_backlog(self) -> bool:
        """Whether a round plans requests that earlier rounds left waiting (in the engine, or as a front end
        that holds the backlog), which is where the starvation bound applies."""
        return self.window_s == 0 or self.front_end == BACKLOG


def shared(r: WaitingRequest) -> list[str]:
    """The segments the demand counters cover: the system prompt and the reusable ones."""
    return [s.id for s in r.segments if s.kind != PRIV]


def reusable(r: WaitingRequest) -> list[str]:
    """The segments QAS may move, in prompt order."""
    return [s.id for s in r.segments if s.kind == REUSE]


def age(r: WaitingRequest) -> tuple[float, int]:
    """FIFO order: arrival, then id."""
    return r.arrival, r.id


class QAS(Scheduler):
    name = "qas"
    Knobs = QASConfig
    clock_knobs = ("max_wait_s",)  # window_s reaches the front end through the deployment, dilated there
    parts = (
        Part("front_alignment", "front alignment: each prompt's most demanded segments moved first",
             {"qas": {"f_front": 0}}),
        Part("buckets_and_lanes", "buckets and lanes: the hot lane ordered by bucket score (off: FIFO)",
             {"qas": {"buckets": False}}),
        Part("cold_lane", "the cold lane: the q_cold oldest first in every round", {"qas": {"q_cold": 0}}),
    )

    @classmethod
    def base(cls, knobs: QASConfig) -> str:
        """FCFS: the stock server QAS runs in front of (inside the engine, the order it replaces)."""
        return "fcfs"

    def __init__(self, config: QASConfig | None = None) -> None:
        self.config = config or QASConfig()
        self.seen: dict[str, int] = {}  # segment -> when QAS first saw it (ties between equal priorities)
        self.next_counter: Counter = Counter()  # n(r) over the predicted next batch (step 5)
        self.counters: Counter = Counter()
        self._round: tuple[list, dict[str, float]] | None = None  # the last plan's order and base, until dispatch
        self._published: dict[str, float] = {}
        self.last: dict | None = None  # the last round's priorities and buckets, for inspection

    @classmethod
    def deployment(cls, knobs: QASConfig) -> Deployment:
        """``window_s`` > 0: an admission front end (the paper's deployment) that holds ``front_end``; 0:
        inside the engine."""
        return Deployment(FRONT_END, knobs.window_s, knobs.front_end) if knobs.window_s > 0 else Deployment()

    # ------------------------------------------------------------------ a round
    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if not waiting:
            return Plan([])
        self.see(waiting)
        base = self.priorities(waiting, ctx.hints.active if ctx.hints is not None else {})
        aligned = {r.id: self.front_alignment(r, base) for r in waiting}  # step 1
        buckets = self.buckets(waiting, aligned, base)  # step 2
        scores = [self.score(members, base, ctx.batch_hint or len(waiting)) for members in buckets]  # step 3
        order, lanes = self.lanes(waiting, buckets, scores)  # step 4
        if self.config.replans_backlog:
            order, lanes = self.aged_first(order, lanes, ctx.now)
        self._round = (order, base)
        self.counters[QAS_ROUNDS] += 1
        self.counters[QAS_BUCKETS] += len(buckets)
        self.last = {"priority": {s: p for s, p in base.items() if p},
                     "buckets": [(tuple(r.id for r in m), sc) for m, sc in zip(buckets, scores)]}
        moved = {r.id: aligned[r.id] for r in waiting if aligned[r.id] != tuple(reusable(r))}
        return Plan(order, moved, lanes)

    def see(self, waiting: Sequence[WaitingRequest]) -> None:
        """Number the segments not seen before: each request's reusable segments, then its system prompt."""
        for r in waiting:
            for s in reusable(r) + [s for s in shared(r) if s not in reusable(r)]:
                self.seen.setdefault(s, len(self.seen))

    def priorities(self, waiting: Sequence[WaitingRequest], active) -> dict[str, float]:
        """P(r; ∅) = w_a·a(r) + w_g·g(r) of every segment QAS has seen (the part no batch changes)."""
        g = Counter(s for r in waiting for s in shared(r))
        cfg = self.config
        return {s: cfg.w_a * active.get(s, 0) + cfg.w_g * g.get(s, 0) for s in self.seen}

    def rank(self, segments: list[str], priority: dict[str, float]) -> list[str]:
        """Highest priority first; ties go to the segment seen first."""
        return sorted(segments, key=lambda s: (-priority[s], self.seen[s]))

    def front_alignment(self, r: WaitingRequest, priority: dict[str, float]) -> tuple[str, ...]:
        """Step 1: the prompt's top-``f_front`` reusable segments to the front, highest first; the rest keep
        their order (a ``fixed_order`` prompt, or one of fewer than two segments, keeps its own)."""
        mine = reusable(r)
        if r.fixed_order or self.config.f_front == 0 or len(mine) < 2:
            return tuple(mine)
        top = self.rank(mine, priority)[:self.config.f_front]
        return tuple(top + [s for s in mine if s not in top])

    def buckets(self, waiting: Sequence[WaitingRequest], aligned: dict[int, tuple[str, ...]],
                priority: dict[str, float]) -> list[list[WaitingRequest]]:
        """Step 2: requests with equal signatures — their top-``kappa`` segments, in aligned order — share a
        bucket; buckets in the age order of their oldest requests, FIFO inside (``buckets`` off: one bucket of
        all, FIFO)."""
        if not self.config.buckets:
            return [sorted(waiting, key=age)]
        out: dict[tuple[str, ...], list[WaitingRequest]] = {}
        for r in sorted(waiting, key=age):
            top = set(self.rank(reusable(r), priority)[:self.config.kappa])
            out.setdefault(tuple(s for s in aligned[r.id] if s in top), []).append(r)
        return list(out.values())

    def score(self, members: list[WaitingRequest], base: dict[str, float], hint: int) -> float:
        """Step 3: Score(b) = α_size·|b| + β_util·U(b); U(b) is the mean of P(r; B_hot_b) over the bucket's
        reusable segments, B_hot_b its first ``hint`` requests (the batch it would give the hot lane)."""
        segments = {s for r in members for s in reusable(r)}
        in_batch = Counter(s for r in members[:hint] for s in reusable(r))
        w_n = self.config.w_n
        util = sum(base[s] + w_n * in_batch[s] for s in segments) / len(segments) if segments else 0.0
        return self.config.alpha_size * len(members) + self.config.beta_util * util

    def lanes(self, waiting: Sequence[WaitingRequest], buckets: list[list[WaitingRequest]],
              scores: list[float]) -> tuple[list, dict[int, str]]:
        """Step 4: the cold lane (the ``q_cold`` oldest, FIFO), then the hot lane: buckets by descending score
        (older bucket first among equals), FIFO inside."""
        cold = sorted(waiting, key=age)[:self.config.q_cold]
        cold_ids = {r.id for r in cold}
        ranked = sorted(range(len(buckets)), key=lambda b: -scores[b])  # stable: buckets are in age order
        order = cold + [r for b in ranked for r in buckets[b] if r.id not in cold_ids]
        return order, dict.fromkeys(cold_ids, "cold")

    def aged_first(self, order: list, lanes: dict[int, str], now: float) -> tuple[list, dict[int, str]]:
        """Re-planning a backlog: requests waiting longer than ``max_wait_s`` go first, oldest first (lane
        ``aged``)."""
        aged = sorted((r for r in order if now - r.arrival > self.config.max_wait_s), key=age)
        if not aged:
            return order, lanes
        self.counters[QAS_AGED] += len(aged)
        ids = {r.id for r in aged}
        return aged + [r for r in order if r.id not in ids], {**lanes, **dict.fromkeys(ids, "aged")}

    # ------------------------------------------------------------------ after the engine admitted
    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        """Step 5: the requests that now head the order form the predicted next batch; step 6: publish
        P̂(r) = P(r; B_dispatch) to the eviction policy."""
        if self._round is None:
            return
        order, base = self._round
        self._round = None
        gone = {r.id for r in admitted}
        rest = [r for r in order if r.id not in gone]
        self.next_counter = Counter(s for r in rest[:len(admitted)] for s in shared(r))
        self.see(admitted)  # a request taken that the round never ordered may bring segments (no base)
        if ctx.hints is not None:
            self.publish(ctx.hints, base, Counter(s for r in admitted for s in shared(r)))

    def publish(self, hints: DemandHints, base: dict[str, float], dispatched: Counter) -> None:
        """P̂ of every segment seen (those seen since the round have no base), the positive ones published,
        with the segments whose P̂ fell (for DART's re-keying)."""
        w_n = self.config.w_n
        new = {s: p for s in self.seen if (p := base.get(s, 0.0) + w_n * dispatched[s]) > 0}
        fell = [s for s, p in self._published.items() if new.get(s, 0.0) < p]
        self._published = new
        hints.publish(new, fell)

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


__all__ = ["QASConfig", "QAS"]
