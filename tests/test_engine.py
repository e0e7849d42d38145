"""The simulated engine: completion, TTFT decomposition, KV capacity, determinism, exact timestamps."""

from __future__ import annotations

import json

import pytest

from conftest import PRIV, REUSE, SYS, cyclic_garbage_during, make_trace
from prism.calibration.cost_model import CostModel, Profile, load_profile
from prism.sim.events import EngineEvents
from prism.metrics import write_requests_csv
from prism.settings import EngineConfig, RunSpec
from prism.sim.run import simulate
from prism.traces.spec import generate
from prism.traces.zipf import ZipfHotspotSpec

METHODS = [("fcfs", "lru"), ("lpm", "lru"), ("dfs_weight", "lru"), ("lpm", "lfu"), ("fcfs", "lru_active"),
           ("klpm", "lru"), ("contextpilot", "lru"), ("qas", "dart"), ("qas", "belady")]


@pytest.fixture(scope="module")
def trace():
    return generate(ZipfHotspotSpec(num_requests=300, qps=40.0, seed=3))


@pytest.fixture(scope="module")
def profile():
    return load_profile()


class Audit(EngineEvents):
    """Checks the cache's bookkeeping and the KV capacity after every prefill and every finish."""

    def __init__(self) -> None:
        self.checks = 0

    def check(self, eng) -> None:
        eng.cache.check()
        used = eng.cache.size + eng.decode_alloc + eng.tails + eng.inflight
        assert eng.capacity is None or used <= eng.capacity, (used, eng.capacity)
        assert eng.owed >= 0 and eng.decode_alloc >= 0 and eng.inflight >= 0
        self.checks += 1

    def prefill_ended(self, eng, batch) -> None:
        self.check(eng)

    def finished(self, eng, seq) -> None:
        self.check(eng)


@pytest.mark.parametrize("sched,evict", METHODS)
def test_every_request_completes_once_and_ttft_decomposes(trace, profile, sched, evict):
    cfg = EngineConfig(max_total_tokens=6000, chunked_prefill_size=1024, max_running_requests=16)
    audit = Audit()
    res = simulate(RunSpec.build(trace, sched, evict, engine=cfg, profile=profile), events=audit)
    ids = [r.id for r in res.records]
    assert sorted(ids) == [r.id for r in trace.requests]  # each exactly once
    assert audit.checks > len(trace)
    for r in res.records:
        assert r.ttft == pytest.approx(r.w_admit + r.t_prefill + r.t_1tok, abs=1e-12)
        assert 0 <= r.hit_tokens < r.prompt_tokens
        assert r.arrival <= r.sent <= r.prefill_start <= r.prefill_end <= r.first_token <= r.finish
    s = res.summary
    assert s["hit_rate"] == pytest.approx(sum(r.hit_tokens for r in res.records) /
                                          sum(r.prompt_tokens for r in res.records))
    if sched not in ("qas", "contextpilot"):  # without realignment, no cache beats the infinite one
        assert s["hit_rate"] <= s["infinite_cache_hit_rate"] + 1e-12
    assert res.counters["evicted_nodes"] > 0, "the test capacity should force eviction"


def test_concurrency_limit_and_chunking(trace, profile):
    cfg = EngineConfig(max_total_tokens=20000, chunked_prefill_size=256, max_concurrency=4)
    res = simulate(RunSpec.build(trace.head(60), "fcfs", "lru", engine=cfg, profile=profile), events=Audit())
    events = sorted([(r.sent, 1) for r in res.records] + [(r.finish, -1) for r in res.records],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= 4
    assert any(r.sent > r.arrival for r in res.records), "some requests waited client-side"
    # 256-token chunks: a ~770-token prompt needs several prefill iterations
    assert res.counters["prefill_iterations"] >= 60 * 2


def test_a_prompts_partial_page_is_in_use_until_it_finishes(profile):
    """Found by tests/test_invariants.py: the tree holds whole pages, so a 30-token prompt on pages of 16 left
    14 computed tokens outside the tree that nobody counted; its finish inserted them with its output (a
    whole page more than its decode had allocated) and the tree grew to 48 tokens in a 40-token cache."""
    trace = make_trace([(0.0, [(PRIV, "q0", 30)], 3), (0.004, [(PRIV, "q1", 22)], 1)])  # 1 comes while 0 decodes
    audit = Audit()
    res = simulate(RunSpec.build(trace, "fcfs", "lru", profile=profile,
                                 engine=EngineConfig(max_total_tokens=40, page_size=16, admission="full")),
                   events=audit)
    first, second = sorted(res.records, key=lambda r: r.id)
    assert second.prefill_start >= first.finish  # request 1 waits until request 0's partial page is freed
    assert audit.checks >= 3


def test_same_seed_same_bytes(tmp_path, profile):
    outs = []
    for i in range(2):
        tr = generate(ZipfHotspotSpec(num_requests=200, qps=50.0, seed=7))
        res = simulate(RunSpec.build(tr, "lpm", "lru", engine=EngineConfig(max_total_tokens=8000), profile=profile))
        d = tmp_path / str(i)
        d.mkdir()
        write_requests_csv(res.records, d / "requests.csv")
        s = dict(res.summary)
        s.pop("wall_s")
        outs.append(((d / "requests.csv").read_bytes(), json.dumps(s, sort_keys=True)))
    assert outs[0] == outs[1]


def test_two_requests_exact_timestamps():
    """Hand-computed from the cost model's formulas (see the numbers in the comments)."""
    cost = CostModel(a_p=0.1, b_p=0.01, c_p=0.001, a_d=0.05, w_d=0.001, b_d=0.001, c_d=0.0001, first_token_s=0.002)
    base = load_profile()
    profile = Profile(cost, base.gpu, base.model, 10_000)
    tr = make_trace([
        (0.0, [(SYS, "s", 4), (REUSE, "r1", 8), (PRIV, "a", 4)], 3),
        (1.0, [(SYS, "s", 4), (REUSE, "r1", 8), (PRIV, "b", 4)], 2),
    ])
    res = simulate(RunSpec.build(tr, "fcfs", "lru", engine=EngineConfig(max_total_tokens=1000), profile=profile))
    a, b = sorted(res.records, key=lambda r: r.id)
    # A: 16 new tokens, none cached: 0.1 + 0.01*16 + 0.001*16*(0 + 8) = 0.388
    assert a.prefill_start == 0.0 and a.hit_tokens == 0
    assert a.prefill_end == pytest.approx(0.388)
    assert a.first_token == pytest.approx(0.390)
    # two decode steps (3 output tokens, the first from prefill): contexts 17 then 18, memory-bound
    # 0.05 + max(0.001 + 0.0001*17, 0.001*1) = 0.0527; 0.05 + max(0.001 + 0.0001*18, 0.001) = 0.0528
    assert a.finish == pytest.approx(0.388 + 0.0527 + 0.0528)
    # B at t=1: sys + r1 = 12 tokens cached; 4 new: 0.1 + 0.04 + 0.001*4*(12 + 2) = 0.196
    assert b.hit_tokens == 12
    assert b.prefill_start == 1.0
    assert b.prefill_end == pytest.approx(1.196)
    assert b.first_token == pytest.approx(1.198)
    # one decode step, context 17: 0.0527
    assert b.finish == pytest.approx(1.196 + 0.0527)
    assert res.summary["hit_rate"] == pytest.approx(12 / 32)


def test_fully_cached_prompt_still_computes_one_token():
    base = load_profile()
    tr = make_trace([
        (0.0, [(SYS, "s", 8), (PRIV, "same", 8)], 1),
        (5.0, [(SYS, "s", 8), (PRIV, "same", 8)], 1),
    ])
    res = simulate(RunSpec.build(tr, "fcfs", "lru", engine=EngineConfig(max_total_tokens=100), profile=base))
    assert [r.hit_tokens for r in sorted(res.records, key=lambda r: r.id)] == [0, 15]


def test_lpm_prefers_cached_prefix():
    """With one request holding the engine, LPM admits the waiting request that shares its prefix first."""
    base = load_profile()
    tr = make_trace([
        (0.0, [(SYS, "s", 64), (REUSE, "hot", 256), (PRIV, "a", 8)], 1),
        (0.001, [(SYS, "t", 64), (REUSE, "cold", 256), (PRIV, "b", 8)], 1),
        (0.002, [(SYS, "s", 64), (REUSE, "hot", 256), (PRIV, "c", 8)], 1),
    ])
    cfg = EngineConfig(max_total_tokens=10_000, max_running_requests=1)
    lpm = {r.id: r for r in simulate(RunSpec.build(tr, "lpm", "lru", engine=cfg, profile=base)).records}
    fcfs = {r.id: r for r in simulate(RunSpec.build(tr, "fcfs", "lru", engine=cfg, profile=base)).records}
    assert lpm[2].prefill_start < lpm[1].prefill_start
    assert fcfs[1].prefill_start < fcfs[2].prefill_start
    assert lpm[2].hit_tokens == 320


@pytest.mark.parametrize("sched,evict", [("lpm", "lru"), ("klpm", "lru"), ("contextpilot", "lru"), ("qas", "dart")])
def test_served_infinite_cache_is_a_ceiling(trace, profile, sched, evict):
    """An unbounded cache over the prompts as a run served them bounds that run's hit rate, at any capacity.
    For a scheduler that keeps each prompt's segment order it equals the trace's own infinite-cache rate (an
    unbounded cache's total does not depend on the order the same prompts come in); schedulers that move
    segments (ContextPilot, QAS) create sharing the trace order does not have."""
    for capacity in (None, 10**9):
        spec = RunSpec.build(trace, sched, evict, engine=EngineConfig(max_total_tokens=capacity or 32768),
                             profile=profile)
        s = simulate(spec, served_reference=True).summary
        assert s["hit_rate"] <= s["served_infinite_cache_hit_rate"] + 1e-12
        if sched in ("lpm", "klpm"):
            assert s["served_infinite_cache_hit_rate"] == pytest.approx(s["infinite_cache_hit_rate"], abs=1e-12)
        else:
            assert s["served_infinite_cache_hit_rate"] > s["infinite_cache_hit_rate"]
    assert s["hit_rate"] > 0.95 * s["served_infinite_cache_hit_rate"]  # unbounded: only same-batch misses


@pytest.mark.parametrize("capacity", [None, 32768])
def test_a_run_in_trace_order_reuses_the_traces_reference(trace, profile, monkeypatch, capacity):
    """FCFS admits the trace's prompts in the trace's order, unmoved: its served-order reference is the trace's,
    taken from it rather than computed again, exactly as a computation over the served prompts gives it (an
    interrupted run, and an order that differs, compute it)."""
    from prism.sim import run as run_mod

    spec = RunSpec.build(trace, "fcfs", "lru", engine=EngineConfig(max_total_tokens=capacity), profile=profile)
    computed = []
    real = run_mod.infinite_cache_hit_rate
    monkeypatch.setattr(run_mod, "infinite_cache_hit_rate", lambda rs: (computed.append(len(rs)), real(rs))[1])
    shortcut = simulate(spec, served_reference=True).summary["served_infinite_cache_hit_rate"]
    assert computed == []
    served = []
    monkeypatch.setattr(run_mod.Replay, "_served_rate",
                        lambda self: served.append(self.served_requests()) or 0.0)
    simulate(spec, served_reference=True)
    assert shortcut == real(served[0])
    monkeypatch.undo()
    lpm = RunSpec.build(trace, "lpm", "lru", engine=EngineConfig(max_total_tokens=capacity), profile=profile)
    monkeypatch.setattr(run_mod, "infinite_cache_hit_rate", lambda rs: (computed.append(len(rs)), real(rs))[1])
    simulate(lpm, served_reference=True)
    assert computed == [len(trace.requests)]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_during_a_run_and_restored_after_it_even_on_ctrl_c(profile, enabled):
    import gc

    from prism.sim.run import SimInterrupted

    tr = generate(ZipfHotspotSpec(num_requests=40, qps=50.0, seed=1))
    spec = RunSpec.build(tr, "qas", "belady", engine=EngineConfig(max_total_tokens=4000), profile=profile)
    during = []

    def on_record(rec):
        during.append(gc.isenabled())
        if len(during) == 10:
            raise KeyboardInterrupt

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        assert len(simulate(spec).records) == 40
        assert gc.isenabled() is enabled
        with pytest.raises(SimInterrupted):
            simulate(spec, on_record=on_record)
        assert gc.isenabled() is enabled and during == [False] * 10
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("sched,evict", METHODS)
def test_a_run_makes_no_cyclic_garbage(trace, profile, sched, evict):
    """The collector is paused for a run because a run frees what it drops by reference counting alone; a cycle
    made per round (a closure that calls itself, say) would stay until the run ends, its memory growing with the
    run and collected all at once after it."""
    spec = RunSpec.build(trace, sched, evict, engine=EngineConfig(max_total_tokens=6000), profile=profile)
    assert cyclic_garbage_during(spec) == []
