"""LMetric routing (OSDI'26): send a request to ``argmin_i P_i × (BS_i + 1)``.

``P_i`` = this request's uncached prompt tokens on instance i (prompt length − ``match_len`` on that
instance's cache) + the prefill tokens already queued there; ``BS_i`` = running + queued requests. The product
trades prefill work (what a cache hit saves) against batch size (what a busy instance costs every request on
it). Ties rotate (the first tied instance after the previous choice).

**The hot-instance guard** (the paper's detection rule is not public; this one is ours). A request whose
prefix only one instance caches has ``P ≈ 0`` there, so that instance wins whatever its batch size: on a trace
where every request hits one instance's cache, that instance takes all the traffic. The guard:

* a win by instance i is *hot* when ``P_i ≤ hot_p_fraction × prompt length`` (near-zero P) while i is
  *overloaded*: ``BS_i ≥ min_batch`` and ``BS_i > overload_factor × mean BS of the other instances``;
* ``hot_streak`` consecutive hot wins of an instance (a win that is not hot resets its streak) are allowed;
  the next hot win is refused: the instance is excluded for ``exclude_s`` seconds and the request goes to
  the best of the others by the same metric. Its streak is kept, so once back, its first hot win while still
  overloaded excludes it again at once;
* if every instance is excluded, the request goes to the least loaded one (the queue-length fallback).

Hence, with an exact view, an instance takes a request while it is overloaded at most ``hot_streak`` times in
a row with near-zero P: its load stays below ``max(min_batch, overload_factor × mean BS of the others) +
hot_streak`` whenever the guard acts (checked in tests/test_routing.py). ``hot_streak = 0`` refuses every hot
win; ``guard: false`` turns the guard off (pure LMetric).

Cost per request: one cache peek per instance (N memcmp descents) and O(N) arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from prism.config import fraction, nonneg, positive
from prism.policies.base import WaitingRequest
from prism.policies.routing import InstanceView, Router, argmin_from, outstanding


@dataclass
class LMetricConfig:
    guard: bool = True
    hot_p_fraction: float = fraction(0.05, "P at most this fraction of the prompt counts as near zero")
    overload_factor: float = positive(2.0, "overloaded: BS above this times the other instances' mean BS ...")
    min_batch: int = positive(8, "... and at least this many requests")
    hot_streak: int = nonneg(4, "hot wins in a row an instance may take before it is excluded")
    exclude_s: float = nonneg(1.0, "seconds an instance stays excluded")


class LMetric(Router):
    name = "lmetric"
    Knobs = LMetricConfig
    reads_queued_prefill = True

    def __init__(self, cfg: LMetricConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or LMetricConfig()
        self.last = -1
        self.streak: list[int] = []
        self.excluded_until: list[float] = []

    def _overloaded(self, bs: Sequence[int], i: int) -> bool:
        cfg, n = self.cfg, len(bs)
        others = (sum(bs) - bs[i]) / (n - 1) if n > 1 else 0.0
        return bs[i] >= cfg.min_batch and bs[i] > cfg.overload_factor * others

    def route(self, request: WaitingRequest, views: Sequence[InstanceView], now: float) -> int:
        cfg, n = self.cfg, len(views)
        if not self.streak:
            self.streak, self.excluded_until = [0] * n, [float("-inf")] * n
        key, length = request.key, request.prompt_len
        bs = [outstanding(v) for v in views]
        p = [length - v.match_len(key) + v.queued_prefill_tokens for v in views]
        score = [p[i] * (bs[i] + 1) for i in range(n)]
        start = self.last + 1
        if not cfg.guard:
            self.last = argmin_from(score, start)
            return self.last
        inf = float("inf")
        while True:
            live = [score[i] if now >= self.excluded_until[i] else inf for i in range(n)]
            i = argmin_from(live, start)
            if live[i] == inf:  # every instance excluded: fall back to the queue length
                self.count("route_fallback_queue")
                self.last = argmin_from(bs, start)
                return self.last
            hot = p[i] <= cfg.hot_p_fraction * length and self._overloaded(bs, i)
            if not hot:
                self.streak[i] = 0
                break
            if self.streak[i] < cfg.hot_streak:
                self.streak[i] += 1
                break
            self.excluded_until[i] = now + cfg.exclude_s
            score[i] = inf
            self.count("route_hot_exclusions")
            if all(s == inf for s in score):
                self.count("route_fallback_queue")
                self.last = argmin_from(bs, start)
                return self.last
        self.last = i
        return i
