"""DART's order and protection set, DART without hints = LRU, and the Belady reference as a ceiling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PRIV, REUSE, SYS, make_trace
from prism.calibration.cost_model import load_profile
from prism.policies.base import DemandHints
from prism.policies.dart import DART, DARTConfig
from prism.policies.eviction import LRU
from prism.settings import EngineConfig, RunSpec
from prism.sim.radix_cache import RadixCache
from prism.sim.run import simulate


def insert(cache, segs, now):
    """segs: [(kind, id, tokens)] -> insert the concatenation with its layout."""
    key, layout, end = b"", [], 0
    for kind, sid, toks in segs:
        key += np.asarray(toks, dtype=np.int32).tobytes()
        end += len(toks)
        layout.append((end, kind, sid))
    return cache.insert(key, now, layout)


def hand_tree():
    cache = RadixCache(None, 1, anchors=True)
    s = (SYS, "sys", [1, 1])
    insert(cache, [s, (REUSE, "hot", [2, 2, 2]), (PRIV, "q1", [3])], 1.0)
    insert(cache, [s, (REUSE, "hot", [2, 2, 2]), (PRIV, "q2", [4, 4])], 2.0)
    insert(cache, [s, (REUSE, "warm", [5, 5]), (PRIV, "q3", [6])], 3.0)
    insert(cache, [s, (REUSE, "cold", [7, 7]), (REUSE, "warm2", [8]), (PRIV, "q4", [9])], 4.0)
    return cache


def test_dart_eviction_order_on_a_hand_built_tree():
    cache = hand_tree()
    hints = DemandHints()
    hints.publish({"sys": 50.0, "hot": 40.0, "warm": 30.0, "warm2": 20.0, "cold": 1.0})
    dart = DART(DARTConfig(f=2), hints)
    dart.prepare(cache)
    assert dart.protected == {"sys", "hot"}  # top-2 resident by P̂
    order = []
    dart.prepare(cache)
    cache.evict(10**6, dart.key, lambda n: order.append(n.seg_id))
    # private first (LRU: q1@1, q2@2, q3@3, q4@4), then reusable by P̂ (cold's leaf warm2=20 is the only
    # reusable leaf, then cold=1 and warm=30 become leaves: cold first), then protected by LRU (hot@2, sys@4)
    assert order == ["q1", "q2", "q3", "q4", "warm2", "cold", "warm", "hot", "sys"]
    cache.check()


def test_what_fell_is_recorded_only_for_an_eviction_that_takes_it():
    """QAS reports the segments whose P̂ fell at every publication; an eviction that never takes them (a live
    server's) must not make the hints keep every segment ever published. DART's first pass re-keys everything
    (the record is unknown), and from then on reads what fell since its last pass."""
    hints = DemandHints()
    for i in range(1, 1000):
        hints.publish({f"s{i}": 1.0}, [f"s{i - 1}"])
    assert hints.fell is None
    dart = DART(DARTConfig(f=1), hints)
    dart.prepare(hand_tree())
    assert dart.lowered_keys() is None  # the first pass: every key
    hints.publish({"hot": 2.0, "cold": 1.0}, ["s999"])
    hints.publish({"hot": 2.0}, ["cold"])
    dart.prepare(hand_tree())
    assert dart.lowered_keys() == {"s999", "cold"}
    assert hints.take_fell() == set()


def test_protected_set_is_the_top_f_resident():
    cache = hand_tree()
    hints = DemandHints()
    hints.publish({"gone": 100.0, "hot": 40.0, "warm": 30.0, "sys": 10.0, "cold": 5.0})
    for f in range(0, 6):
        dart = DART(DARTConfig(f=f), hints)
        dart.prepare(cache)
        expected = [s for s in ["hot", "warm", "sys", "cold"]][:f]  # 'gone' is not resident
        assert dart.protected == set(expected)
        for n in cache.nodes():
            tier = dart.tier(n)
            if n.kind == PRIV:
                assert tier == "private" and dart.key(n)[0] == 0
            elif n.seg_id in expected:
                assert tier == "protected" and dart.key(n) == (2, n.last_access_time)
            else:
                assert tier == "reusable" and dart.key(n) == (1, hints.priority.get(n.seg_id, 0.0), n.last_access_time)


def test_protection_ties_go_to_the_segment_resident_longest_whatever_its_name():
    """Equal P̂: the segment that became resident first is protected, so a run does not depend on how the
    trace names its segments (the same prompts under other names are served alike)."""
    for first, second in (("a", "z"), ("z", "a")):
        cache = RadixCache(None, 1, anchors=True)
        insert(cache, [(SYS, "sys", [1]), (REUSE, first, [2, 2]), (PRIV, "q1", [3])], 1.0)
        insert(cache, [(SYS, "sys", [1]), (REUSE, second, [4, 4]), (PRIV, "q2", [5])], 2.0)
        hints = DemandHints()
        hints.publish({"sys": 9.0, first: 3.0, second: 3.0})
        dart = DART(DARTConfig(f=2), hints)
        dart.prepare(cache)
        assert dart.protected == {"sys", first}


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(0, 6), min_size=1, max_size=3)),
    st.tuples(st.just("publish"), st.dictionaries(st.sampled_from(["sys"] + [f"p{i}" for i in range(7)]),
                                                  st.sampled_from([1.0, 2.0, 5.0, 9.0]), max_size=5)),
    st.tuples(st.just("evict"), st.integers(1, 12))), min_size=1, max_size=25), f=st.integers(1, 4))
def test_the_protection_set_is_always_the_top_f_resident_now(steps, f):
    """DART keeps F between passes; whatever came since (a publication, a segment made resident by a prefill
    with no publication after it, evictions), F is what a fresh ranking of the cache gives (DESIGN §3)."""
    cache = RadixCache(None, 1, anchors=True)
    hints = DemandHints()
    hints.publish({"sys": 1.0})
    kept = DART(DARTConfig(f=f), hints)
    for t, (op, arg) in enumerate(steps):
        if op == "insert":
            insert(cache, [(SYS, "sys", [1])] + [(REUSE, f"p{p}", [10 + p] * 2) for p in dict.fromkeys(arg)]
                   + [(PRIV, f"q{t}", [100 + t])], float(t))
        elif op == "publish":
            hints.publish(arg or {"sys": 1.0})
        else:
            kept.prepare(cache)
            cache.evict(arg, kept.key)
        kept.prepare(cache)
        fresh = DART(DARTConfig(f=f), hints)
        fresh.prepare(cache)
        assert kept.protected == fresh.protected, (op, arg)


seq_lists = st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=4), st.integers(1, 3)),
                     min_size=3, max_size=30)


@settings(max_examples=80, deadline=None)
@given(reqs=seq_lists, capacity=st.integers(10, 60))
def test_dart_without_hints_evicts_exactly_as_lru(reqs, capacity):
    caches = {"lru": RadixCache(capacity, 1, anchors=True), "dart": RadixCache(capacity, 1, anchors=True)}
    policies = {"lru": LRU(), "dart": DART()}
    evicted = {"lru": [], "dart": []}
    for t, (passages, priv_len) in enumerate(reqs):
        segs = [(SYS, "sys", [1, 1])] + [(REUSE, f"p{p}", [10 + p] * 3) for p in passages] + \
               [(PRIV, f"q{t}", [100 + t] * priv_len)]
        for name, cache in caches.items():
            key = b"".join(np.asarray(x[2], dtype=np.int32).tobytes() for x in segs)
            cache.match(key, float(t))
            insert(cache, segs, float(t))
            over = cache.size - capacity
            if over > 0:
                policies[name].prepare(cache)
                cache.evict(over, policies[name].key, lambda n, name=name: evicted[name].append(n.created))
    assert evicted["lru"] == evicted["dart"]


@settings(max_examples=40, deadline=None)
@given(reqs=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=4, max_size=30),
       slots=st.integers(4, 12))
def test_belady_is_a_ceiling_for_online_policies(reqs, slots):
    """Equal-size segments, one request at a time in FCFS order: no online policy beats furthest-in-future."""
    seg = 8
    specs = [(float(i), [(SYS, "sys", seg)] + [(REUSE, f"p{p}", seg) for p in dict.fromkeys(ps)]
              + [(PRIV, f"q{i}", seg)], 1) for i, ps in enumerate(reqs)]
    trace = make_trace(specs)
    cfg = EngineConfig(max_total_tokens=slots * seg, max_running_requests=1)
    profile = load_profile()
    need = max(r.prompt_len for r in trace.requests) + 2  # SGLang admits below the pool: + 1 output + 1 page
    if need >= slots * seg:
        return
    rates = {e: simulate(RunSpec.build(trace, "fcfs", e, engine=cfg, profile=profile)).summary["hit_rate"]
             for e in ("belady", "lru", "lfu", "lru_active", "dart")}
    for e, r in rates.items():
        assert rates["belady"] >= r - 1e-12, rates


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), capacity=st.integers(2000, 20000), page=st.sampled_from([1, 16]),
       method=st.sampled_from(["prism", "sglang", "fcfs+lfu", "fcfs+lru_active", "qas+lfu", "prism-f2",
                               "fcfs+belady", "qas+belady", "contextpilot+belady"]))
def test_incremental_eviction_matches_a_full_sort_every_pass(seed, capacity, page, method):
    """The cache keeps eviction candidates in a heap between passes and re-keys only what policies report as
    lowered (``lowered_keys``); the reference re-keys every candidate at every pass, as SGLang does. Both must
    evict the same nodes in the same order."""
    from prism.policies.base import EvictionPolicy
    from prism.policies.belady import Belady
    from prism.policies.eviction import LFU, LRUActive
    from prism.sim.events import EngineEvents
    from prism.traces.spec import load_trace

    trace = load_trace("zipf", {"num_requests": 150, "seed": seed, "qps": 40})
    knobs = {"dart": {"f": 2}} if method == "prism-f2" else None
    cfg = EngineConfig(max_total_tokens=capacity, page_size=page)
    scheduler, eviction = {"prism": ("qas", "dart"), "prism-f2": ("qas", "dart"), "sglang": ("lpm", "lru")}.get(
        method, method.split("+"))
    if capacity < max(r.prompt_len + r.output_len for r in trace.requests):
        return
    class Evictions(EngineEvents):
        def __init__(self) -> None:
            self.created: list[int] = []

        def evicting(self, eng, node) -> None:
            self.created.append(node.created)

    runs = []
    for full in (False, True):
        evicted = Evictions()
        with pytest.MonkeyPatch.context() as mp:
            if full:
                for cls in (LRU, LFU, LRUActive, DART, Belady):
                    mp.setattr(cls, "lowered_keys", EvictionPolicy.lowered_keys)
            res = simulate(RunSpec.build(trace, scheduler, eviction, engine=cfg, knobs=knobs,
                                         profile=load_profile()), events=evicted)
        runs.append((evicted.created, res.records))
    assert runs[0][0], "no eviction: the case tests nothing"
    assert runs[0] == runs[1]


@pytest.mark.parametrize("scheduler,eviction", [("fcfs", "lru"), ("fcfs", "lfu"), ("fcfs", "lru_active"),
                                                ("qas", "dart"), ("fcfs", "dart"), ("qas", "belady")])
def test_keys_of_one_policy_differ_before_the_shorter_ends(scheduler, eviction):
    """``EvictionPolicy.key``'s contract, on which the cache's flat heap entries (key items, created, tick, node)
    sort as (key, created) would: two keys a run compares either differ before the shorter one ends or have the
    same length. Every key each registered policy gives in a run under eviction, pairwise by distinct form."""
    from prism.policies.registry import EVICTIONS, policy_class
    from prism.traces.spec import load_trace

    cls = policy_class(EVICTIONS, eviction)
    keys: set[tuple] = set()
    key = cls.key
    trace = load_trace("zipf", {"num_requests": 200, "seed": 3, "qps": 40})
    spec = RunSpec.build(trace, scheduler, eviction, engine=EngineConfig(max_total_tokens=6000),
                         profile=load_profile())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cls, "key", lambda self, node: (k := key(self, node), keys.add(k))[0])
        res = simulate(spec)
    assert res.counters["evicted_nodes"] > 0 and len({len(k) for k in keys}) >= 1
    for a in keys:
        for b in keys:
            if len(a) < len(b):
                assert a != b[:len(a)], (a, b)
