"""k-LPM's limits (k=1 is FCFS, large k is LPM) and SGLang's LPM details (ContextPilot: test_contextpilot.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.core import PRIV, REUSE, SYS, SegmentTable, serialize
from prism.policies.base import SchedContext
from prism.policies.klpm import KLPM, KLPMConfig
from prism.policies.lpm import LPM
from prism.sim.radix_cache import RadixCache

TABLE = SegmentTable()


class W:
    fixed_order = False

    def __init__(self, rid, t, skeleton, priv_len=3):
        self.id, self.arrival = rid, t
        self.segments = (TABLE.segment("sys", SYS, 4), *(TABLE.segment(s, REUSE, 8) for s in skeleton),
                         TABLE.segment(f"q{rid}", PRIV, priv_len))
        self.key = serialize(self.segments).tobytes()
        self.prompt_len = len(self.key) // 4


def queue_and_cache(data, cached):
    cache = RadixCache(None)
    for sk in cached:
        cache.insert(W(-1, 0.0, sk).key, 0.0)
    waiting = [W(i, float(t), sk) for i, (t, sk) in enumerate(data)]
    return waiting, SchedContext(0.0, cache)


queues = st.lists(st.tuples(st.integers(0, 20), st.lists(st.sampled_from("abcdef"), max_size=3, unique=True)),
                  min_size=1, max_size=30)
cached_sets = st.lists(st.lists(st.sampled_from("abcdef"), max_size=3, unique=True), max_size=5)


@settings(max_examples=80, deadline=None)
@given(data=queues, cached=cached_sets)
def test_klpm_with_k1_is_fcfs(data, cached):
    waiting, ctx = queue_and_cache(data, cached)
    # k=1: every admission is the oldest request's (FCFS by arrival; the engine's FCFS keeps its queue's order,
    # which is arrival order but for retracted requests)
    assert [r.id for r in KLPM(KLPMConfig(k=1)).plan(waiting, ctx).order] == \
           [r.id for r in sorted(waiting, key=lambda r: (r.arrival, r.id))]


@settings(max_examples=80, deadline=None)
@given(data=queues, cached=cached_sets)
def test_klpm_with_large_k_is_lpm(data, cached):
    waiting, ctx = queue_and_cache(data, cached)
    order = [r.id for r in KLPM(KLPMConfig(k=10**6)).plan(waiting, ctx).order]
    by_age = sorted(waiting, key=lambda r: (r.arrival, r.id))
    expected = [r.id for r in sorted(by_age, key=lambda r: -ctx.cache.match_len(r.key))]
    assert order == expected


def test_klpm_k2_alternates_and_carries_the_count():
    waiting, ctx = queue_and_cache([(0, ["x"]), (1, ["a"]), (2, ["a"]), (3, ["y"])], [["a"]])
    k = KLPM(KLPMConfig(k=2))
    # slot 0: best hit (request 1, shares sys+a), slot 1: oldest left (0), slot 2: best hit (2), slot 3: 3
    assert [r.id for r in k.plan(waiting, ctx).order] == [1, 0, 2, 3]
    k.on_dispatch(waiting[:1], ctx)  # one admission: the next slot is the FCFS one
    assert [r.id for r in k.plan(waiting, ctx).order][0] == 0


def test_lpm_in_batch_check_and_fcfs_fallback():
    # nothing cached: requests 0 and 2 share their first 32+ tokens; 2 is deferred behind 1 although it
    # stands before 1 in the queue
    t = SegmentTable()
    long = t.segment("long", REUSE, 64)

    class R:
        def __init__(self, rid, segs):
            self.id, self.arrival, self.segments = rid, float(rid), segs
            self.key = serialize(segs).tobytes()
            self.prompt_len = len(self.key) // 4

    s = t.segment("sys", SYS, 4)
    reqs = [R(0, (s, long, t.segment("q0", PRIV, 4))), R(1, (t.segment("other", SYS, 40), t.segment("q1", PRIV, 4))),
            R(2, (s, long, t.segment("q2", PRIV, 4)))]
    ctx = SchedContext(0.0, RadixCache(None))
    queue = [reqs[0], reqs[2], reqs[1]]
    assert [r.id for r in LPM().plan(queue, ctx).order] == [0, 1, 2]
    # once request 0's prompt is cached, request 2 matches sys + long (68 tokens): no longer deferred
    ctx.cache.insert(reqs[0].key, 0.0)
    assert [r.id for r in LPM().plan(queue, ctx).order] == [0, 2, 1]
    # past 128 waiting, the queue keeps its order
    many = [W(i, float(200 - i), ["a"]) for i in range(129)]
    assert [r.id for r in LPM().plan(many, ctx).order] == list(range(129))


def test_fcfs_hands_back_the_queue_itself():
    """FCFS does not sort (as SGLang's): it hands the engine's queue back as it is, for the engine to drop
    the admitted head in place."""
    from prism.policies.fcfs import FCFS

    queue = [W(i, float(5 - i), ["a"]) for i in range(5)]
    plan = FCFS().plan(queue, SchedContext(0.0, RadixCache(None)))
    assert plan.order is queue and [r.id for r in plan.order] == list(range(5))


@pytest.mark.parametrize("policy", ["lpm", "dfs_weight"])
def test_lpm_hands_back_a_queue_it_need_not_sort_itself_unread(policy):
    """A queue of one (any order leaves it as it is) and one past the threshold keep their order: the plan is the
    queue itself, and no prompt is read (no walk of the cache); two requests are matched and sorted."""
    from prism.policies.lpm import DFSWeight

    def unread(queue):  # requests without a prompt key: reading one raises
        for r in queue:
            del r.key
        return queue

    make = {"lpm": LPM, "dfs_weight": DFSWeight}[policy]
    cache = RadixCache(None)
    cache.insert(W(-1, 0.0, ["b"]).key, 0.0)
    ctx = SchedContext(0.0, cache)
    for queue in (unread([W(0, 0.0, ["a"])]), unread([W(i, float(i), ["a"]) for i in range(129)])):
        plan = make().plan(queue, ctx)
        assert plan.order is queue and [r.id for r in plan.order] == list(range(len(queue)))
    two = [W(0, 0.0, ["a"]), W(1, 1.0, ["b"])]  # 1 matches sys + b: it goes first
    assert [r.id for r in make().plan(two, ctx).order] == [1, 0]


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 4), capacity=st.sampled_from([None, 6000, 20000]), qps=st.sampled_from([40, 120, 400]),
       seed=st.integers(0, 50), admission=st.sampled_from(["sglang", "full"]))
def test_klpm_kept_queue_serves_as_the_definition(k, capacity, qps, seed, admission):
    """k-LPM's rounds from the queue it keeps (matches kept current from the cache's changes) give the
    definition's orders, which match every waiting request afresh: whole runs serve alike (records and
    counters), past the knee and under eviction and retraction (a small pool with SGLang's admission)."""
    from prism.calibration.cost_model import load_profile
    from prism.settings import EngineConfig, RunSpec
    from prism.sim.run import simulate
    from prism.traces.spec import load_trace

    trace = load_trace("zipf", {"num_requests": 150, "qps": qps, "seed": seed})
    engine = EngineConfig(max_total_tokens=capacity, admission=admission)
    spec = RunSpec.build(trace, "klpm", "lru", engine=engine, knobs={"klpm": {"k": k}}, profile=load_profile())
    rounds = []
    plan = KLPM.plan
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KLPM, "plan", lambda self, w, ctx: (rounds.append(len(w)), plan(self, w, ctx))[1])
        kept = simulate(spec)
        mp.setattr(KLPM, "plan", KLPM.plan_reference)
        reference = simulate(spec)
    assert kept.records == reference.records and kept.counters == reference.counters
    assert max(rounds) > 1


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 4), capacity=st.sampled_from([None, 6000]), qps=st.sampled_from([120, 400]),
       seed=st.integers(0, 50))
def test_klpm_plan_that_leaves_the_queue_to_the_engine_is_the_definitions_whole_order(k, capacity, qps, seed):
    """Handed to the simulated engine, k-LPM's plan is an iterator the engine reads only as far as it admits
    (``Plan.keep_queue``): read to its end at every round of a whole run, it is the definition's whole order, its
    FIFO rest included, which admission rarely reaches; and lanes alike."""
    from dataclasses import replace

    from prism.calibration.cost_model import load_profile
    from prism.settings import EngineConfig, RunSpec
    from prism.sim.run import simulate
    from prism.traces.spec import load_trace

    trace = load_trace("zipf", {"num_requests": 150, "qps": qps, "seed": seed})
    spec = RunSpec.build(trace, "klpm", "lru", engine=EngineConfig(max_total_tokens=capacity),
                         knobs={"klpm": {"k": k}}, profile=load_profile())
    plan, compared = KLPM.plan, []

    def checked(self, waiting, ctx):
        got = plan(self, waiting, ctx)
        if not got.keep_queue:
            return got
        whole = list(got.order)
        ref = self.plan_reference(waiting, ctx)
        assert [r.id for r in whole] == [r.id for r in ref.order]
        assert dict(got.lanes) == dict(ref.lanes)
        compared.append(len(whole))
        return replace(got, order=iter(whole))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KLPM, "plan", checked)
        simulate(spec)
    assert compared and max(compared) > 1, "no round left the queue to the engine: the case tests nothing"


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 4), capacity=st.sampled_from([None, 6000, 20000]), qps=st.sampled_from([40, 120, 400]),
       seed=st.integers(0, 50), admission=st.sampled_from(["sglang", "full"]), chunk=st.sampled_from([512, 8192]))
def test_klpm_picks_no_further_than_the_prefill_budget_changes_no_run(k, capacity, qps, seed, admission, chunk):
    """Picks stop once their uncached tokens cover the engine's prefill budget (``SchedContext.token_budget``): the
    engine admits no further, so whole runs serve as with picks for all its free running slots (records and
    counters), past the knee, under eviction and retraction, with chunked prefills; and the budget does stop them."""
    from prism.calibration.cost_model import load_profile
    from prism.settings import EngineConfig, RunSpec
    from prism.sim.run import simulate
    from prism.traces.spec import load_trace

    trace = load_trace("zipf", {"num_requests": 150, "qps": qps, "seed": seed})
    engine = EngineConfig(max_total_tokens=capacity, admission=admission, chunked_prefill_size=chunk)
    spec = RunSpec.build(trace, "klpm", "lru", engine=engine, knobs={"klpm": {"k": k}}, profile=load_profile())
    stops = []
    enough = KLPM._enough
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KLPM, "_enough", staticmethod(lambda need, ctx: stops.append(enough(need, ctx)) or stops[-1]))
        capped = simulate(spec)
        mp.setattr(KLPM, "_enough", staticmethod(lambda need, ctx: False))
        uncapped = simulate(spec)
    assert capped.records == uncapped.records and capped.counters == uncapped.counters
    assert any(stops) or qps == 40  # below the knee a round may never have the budget's worth of picks


def test_klpm_rebuilds_its_queue_when_it_is_not_the_expected_one():
    """A queue that is not the last order minus the admitted head (requests taken out of order, or gone) is
    ranked afresh: the same order as the definition's."""
    waiting, ctx = queue_and_cache([(0, ["x"]), (1, ["a"]), (2, ["a"]), (3, ["y"]), (4, ["a", "b"])], [["a"]])
    kept, ref = KLPM(KLPMConfig(k=2)), KLPM(KLPMConfig(k=2))
    for queue, admitted in ((waiting, waiting[3:4]), (waiting[1:], waiting[1:2]), (waiting[2:], [])):
        got = kept.plan(queue, ctx)
        assert [r.id for r in got.order] == [r.id for r in ref.plan_reference(queue, ctx).order]
        assert dict(got.lanes) == dict(ref.plan_reference(queue, ctx).lanes)
        kept.on_dispatch(admitted, ctx)
        ref.on_dispatch(admitted, ctx)
        ctx.cache.insert(W(-2, 0.0, ["b"]).key, 1.0)
