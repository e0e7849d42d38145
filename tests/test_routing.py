"""Routing policies against hand-computed cases and brute-force references, through fake instance views (the
policies never see an engine)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from prism.core import TOKEN_DTYPE
from prism.policies.approx_tree import ApproxTree
from prism.policies.cache_aware import CacheAware, CacheAwareConfig
from prism.policies.least_load import LeastLoad
from prism.policies.lmetric import LMetric, LMetricConfig
from prism.policies.round_robin import RoundRobin
from prism.policies.routing import InstanceView


def key(tokens) -> bytes:
    return np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes()


@dataclass
class Req:
    id: int
    key: bytes
    prompt_len: int


def req(tokens, i=0) -> Req:
    return Req(i, key(tokens), len(tokens))


@dataclass
class View:
    index: int
    running: int = 0
    queued: int = 0
    queued_prefill_tokens: int = 0
    cached: int = 0  # match_len answers min(cached, prompt)

    def match_len(self, k: bytes) -> int:
        return min(self.cached, len(k) // 4)


def test_fake_view_is_an_instance_view():
    assert isinstance(View(0), InstanceView)


P1 = list(range(1, 11))  # 10 tokens
P2 = list(range(200, 220))  # 20 tokens


def new(n, base=1000):
    return list(range(base, base + n))


# (trees: per worker the prompts the router sent there, loads, request, knobs, expected worker, counter)
CACHE_AWARE_CASES = [
    ("match 0.5 > 0.3: longest match", [[P1], []], (0, 0), P1[:5] + new(5), {}, 0, "route_cache_hit"),
    ("match 0.4 > 0.3", [[P1], []], (0, 0), P1[:4] + new(6), {}, 0, "route_cache_hit"),
    ("match 0.3 is not > 0.3: least loaded", [[P1], []], (1, 0), P1[:3] + new(7), {}, 1, "route_cache_miss"),
    # sglang-router 0.3.2: below the threshold the least loaded worker, not the one with the smallest tree
    ("no match: least loaded, not the smallest tree", [[P1, P2], []], (0, 3), new(10), {}, 0, "route_cache_miss"),
    ("no match, equal loads: the first", [[P1], []], (2, 2), new(10), {}, 0, "route_cache_miss"),
    ("imbalanced (65 > 64 and 70 > 1.5*5): least load", [[P1], []], (70, 5), P1, {}, 1, "route_balance"),
    ("diff 64 is not > 64: balanced", [[P1], []], (70, 6), P1, {}, 0, "route_cache_hit"),
    ("330 - 210 > 64 and 330 > 315: imbalanced", [[P1], []], (330, 210), P1, {}, 1, "route_balance"),
    ("300 - 210 > 64 but 300 <= 315: balanced", [[P1], []], (300, 210), P1, {}, 0, "route_cache_hit"),
    ("equal matches: the less loaded", [[P1], [P1]], (3, 1), P1, {}, 1, "route_cache_hit"),
    ("cache_threshold 0.5: match 0.5 is a miss", [[P1], []], (2, 0), P1[:5] + new(5),
     {"cache_threshold": 0.5}, 1, "route_cache_miss"),
    ("balance_abs_threshold 0: any gap with the ratio", [[P1], []], (2, 1), P1,
     {"balance_abs_threshold": 0}, 1, "route_balance"),
    ("3 workers, imbalanced: least load, ties from the first", [[P1], [], []], (0, 100, 0), P1, {}, 0,
     "route_balance"),
]


@pytest.mark.parametrize("name,trees,loads,prompt,knobs,expect,counter", CACHE_AWARE_CASES,
                         ids=[c[0] for c in CACHE_AWARE_CASES])
def test_cache_aware_thresholds(name, trees, loads, prompt, knobs, expect, counter):
    router = CacheAware(CacheAwareConfig(**knobs))
    router.trees = [ApproxTree() for _ in trees]
    for tree, prompts in zip(router.trees, trees):
        for p in prompts:
            tree.insert(key(p), 0.0)
    views = [View(i, running=load) for i, load in enumerate(loads)]
    r = req(prompt)
    assert router.route(r, views, 1.0) == expect
    assert router.stats() == {counter: 1}
    assert router.trees[expect].match_len(r.key) == r.prompt_len  # the prompt is recorded where it went


def test_cache_aware_defaults_are_sglang_router_0_3_2s():
    """The launcher's defaults of sglang-router 0.3.2 (``router_args.py``), as its start-up log prints them."""
    assert CacheAwareConfig() == CacheAwareConfig(cache_threshold=0.3, balance_abs_threshold=64,
                                                  balance_rel_threshold=1.5, eviction_interval_s=60.0,
                                                  max_tree_size=2 ** 26)


def test_cache_aware_evicts_its_trees_on_schedule():
    router = CacheAware(CacheAwareConfig(eviction_interval_s=10.0, max_tree_size=15))
    views = [View(0)]
    router.route(req(P1), views, 0.0)
    router.route(req(P2), views, 5.0)  # 30 tokens in the tree, no eviction yet
    assert router.trees[0].size == 30
    router.route(req(new(3)), views, 10.0)  # the eviction first cuts to 15: P1 (oldest) goes, then P2
    assert router.trees[0].match_len(key(P1)) == 0 and router.trees[0].size == 3


def test_approx_tree_lru_eviction_keeps_shared_prefixes():
    t = ApproxTree()
    t.insert(key(P1), 1.0)
    t.insert(key(P1[:5] + new(5)), 2.0)
    assert t.size == 15
    assert t.evict_to(10) == 5  # P1's own tail (touched at 1.0) goes; the shared 5 stay
    assert t.match_len(key(P1)) == 5 and t.match_len(key(P1[:5] + new(5))) == 10


def test_approx_tree_split_leaves_the_lower_parts_access_time():
    """tree.rs: a split gives the new upper part the time and leaves the lower part's (SGLang's cache stamps
    both: PrefixTree.stamps_split_child, which a compiled walk must read from the subclass)."""
    t = ApproxTree()
    t.insert(key(P1), 1.0)
    t.insert(key(P1[:5] + new(5)), 2.0)
    upper = t.root.children[key(P1)[:4]]
    lower = upper.children[key(P1)[20:24]]
    assert upper.last_access_time == 2.0 and lower.last_access_time == 1.0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=12), min_size=1, max_size=12),
       st.lists(st.integers(1, 4), min_size=1, max_size=12))
def test_approx_tree_match_is_the_longest_common_prefix(prompts, query):
    """Brute force: the tree's match is the longest common prefix with any inserted prompt."""
    t = ApproxTree()
    for i, p in enumerate(prompts):
        t.insert(key(p), float(i))

    def lcp(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    assert t.match_len(key(query)) == max(lcp(p, query) for p in prompts)
    assert t.size == len({tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)})


def test_round_robin_and_least_load():
    views = [View(i) for i in range(3)]
    rr = RoundRobin()
    assert [rr.route(req(P1), views, 0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    ll = LeastLoad()
    views = [View(0, running=2), View(1, queued=1), View(2, running=1)]
    assert ll.route(req(P1), views, 0.0) == 1  # ties aside, the fewest outstanding
    views = [View(i) for i in range(3)]
    assert [ll.route(req(P1), views, 0.0) for _ in range(4)] == [2, 0, 1, 2]  # ties rotate after the last


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 5000), st.integers(0, 3000)),
                min_size=1, max_size=8))
def test_lmetric_is_the_argmin_of_p_times_bs_plus_one(rows):
    """Brute force over the formula: P = uncached + queued prefill tokens, BS = running + queued."""
    views = [View(i, running=r, queued=q, queued_prefill_tokens=qp, cached=c) for i, (r, q, qp, c) in enumerate(rows)]
    r = req(new(2000))
    scores = [(2000 - min(v.cached, 2000) + v.queued_prefill_tokens) * (v.running + v.queued + 1) for v in views]
    choice = LMetric(LMetricConfig(guard=False)).route(r, views, 0.0)
    assert scores[choice] == min(scores)


@pytest.mark.parametrize("knobs", [{}, {"hot_streak": 0}, {"hot_streak": 10, "min_batch": 4, "overload_factor": 1.5}])
def test_lmetric_guard_bounds_a_hot_instance(knobs):
    """Instance 0 caches every prompt (P = 0 for every request); all instances finish one request every 4
    steps. Pure LMetric sends everything to instance 0, whose load then grows without bound; with the guard,
    its load stays within max(min_batch, overload_factor x the others' mean) + hot_streak."""
    cfg = LMetricConfig(**knobs)

    def run(router):
        views = [View(0, cached=10 ** 6)] + [View(i) for i in range(1, 4)]
        peak, bound = 0, 0.0
        for t in range(600):
            others = sum(v.running for v in views[1:]) / 3
            bound = max(bound, max(cfg.min_batch, cfg.overload_factor * others) + cfg.hot_streak)
            i = router.route(req(new(1000), t), views, t * 0.01)
            views[i].running += 1
            peak = max(peak, views[0].running)
            if t % 4 == 0:
                for v in views:
                    v.running = max(0, v.running - 1)
        return peak, bound

    pure_peak, _ = run(LMetric(LMetricConfig(**knobs, guard=False)))
    guarded = LMetric(cfg)
    peak, bound = run(guarded)
    assert pure_peak > 400
    assert peak <= bound
    assert guarded.stats()["route_hot_exclusions"] > 0


def test_lmetric_falls_back_to_queue_length_when_all_are_excluded():
    cfg = LMetricConfig(hot_streak=0, min_batch=1, overload_factor=1.0, exclude_s=100.0)
    router = LMetric(cfg)
    views = [View(0, running=5, cached=10 ** 6), View(1, running=1, cached=10 ** 6)]
    # instance 0 is overloaded with P = 0: refused; instance 1 (P = 0, BS 1 > 1 x 5? no) takes it
    assert router.route(req(new(100)), views, 0.0) == 1
    views = [View(0, running=5, cached=10 ** 6), View(1, running=9, cached=10 ** 6)]
    # now instance 1 is the hot one: refused; instance 0 is excluded: the least loaded one (0) is the fallback
    assert router.route(req(new(100)), views, 1.0) == 0
    assert router.stats()["route_fallback_queue"] == 1
