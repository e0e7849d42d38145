"""QAS inside SGLang's scheduler objects, against the simulator (differential).

A random small waiting queue runs through SGLang's real ``SchedulePolicy.calc_priority`` with prism's
``around_calc_priority`` hook around it, then through the ``before_init_next_round`` hook and SGLang's own
``Req.init_next_round_input`` (where the scheduler matches the prompt against the radix cache), over a
``PrismRadixCache``. The same trace requests run through a fresh QAS in the simulator's vocabulary
(``prism.sim.engine.Seq``, the simulator's radix cache). Both must give the same admission order, the same
realigned prompts (token for token) and the same realigned flags; SGLang's match of each realigned prompt must
hit what the simulator's cache holds of it. The ``LiveSeq`` round trip (custom params -> segments and key)
and ``realign``'s refusals are checked on their own.
"""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

pytest.importorskip("sglang.srt.managers.schedule_policy")

from hypothesis import given, settings, strategies as st  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from prism.core import PRIV, REUSE, SYS, Request, SegmentTable, layout, serialize  # noqa: E402
from prism.live import hooks  # noqa: E402
from prism.live.radix import PrismRadixCache  # noqa: E402
from prism.live.requests import segment_meta  # noqa: E402
from prism.live.seq import LiveSeq  # noqa: E402
from prism.policies.base import SchedContext  # noqa: E402
from prism.policies.registry import make_policies, policy_configs  # noqa: E402
from prism.sim.engine import Seq  # noqa: E402
from prism.sim.radix_cache import RadixCache  # noqa: E402

#: QAS inside the engine, as the simulator's side below runs it; the queue's arrival stamps are small numbers, not
#: the scheduler's monotonic clock, so the starvation bound (tested in test_qas.py) is kept out of the way
CONFIG = hooks.PluginConfig("qas", "dart", knobs={"qas": {"window_s": 0.0, "max_wait_s": 1e9}})


# ------------------------------------------------------------------ helpers (as in test_live_radix.py)
class _Allocator:
    device = "cpu"

    def free_segment(self, *args, **kwargs) -> None:
        pass


def sglang_cache(policy, page_size: int = 1) -> PrismRadixCache:
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=_Allocator(),
                             page_size=page_size)
    return PrismRadixCache(params, policy)


def _tokens(tokens: np.ndarray) -> array:
    return array("q", np.asarray(tokens, dtype=np.int64).tobytes())


def _key(tokens: np.ndarray) -> RadixKey:
    return RadixKey(token_ids=_tokens(tokens))


def sglang_req(r: Request) -> Req:
    return Req(str(r.id), "", _tokens(serialize(r.segments)),
               SamplingParams(max_new_tokens=1, custom_params=segment_meta(r)))


def trace(rng: random.Random, n: int) -> list[Request]:
    """A sys segment, a pool of reusable passages, a private suffix each; some requests fixed_order."""
    table = SegmentTable()
    sys_seg = table.segment("sys", SYS, rng.choice([4, 7, 12]))
    pool = [table.segment(f"p{i}", REUSE, rng.randint(2, 10)) for i in range(rng.randint(4, 9))]
    out = []
    for i in range(n):
        reuse = rng.sample(pool, rng.randint(1, min(4, len(pool))))
        segs = (sys_seg, *reuse, table.segment(f"q{i}", PRIV, rng.randint(1, 8)))
        out.append(Request(i, float(i), segs, 1, fixed_order=rng.random() < 0.25))
    return out


@pytest.fixture
def live_state():
    saved = hooks._state
    yield
    hooks._state = saved


# ------------------------------------------------------------------ QAS: SGLang's SchedulePolicy vs the simulator
def run_round(seed: int) -> tuple[bool, int]:
    """One QAS round on both sides; asserts they agree. Returns (queue reordered, requests realigned)."""
    rng = random.Random(seed)
    reqs = trace(rng, rng.randint(3, 12))

    # the same cache content on both sides (no eviction: DART/LRU keys are never evaluated)
    state = hooks.LiveState(CONFIG)
    state.cache = sglang_cache(state.eviction)
    sim_cache = RadixCache(None, 1, anchors=True)
    for r in rng.sample(reqs, rng.randint(0, len(reqs))):
        segs = list(r.segments)
        if not r.fixed_order and rng.random() < 0.5:  # cached in some other order of its passages
            mid = segs[1:-1]
            rng.shuffle(mid)
            segs = [segs[0], *mid, segs[-1]]
        cut = rng.randint(1, len(segs))  # a cached prefix of whole segments
        segs = segs[:cut]
        tokens, lay = serialize(segs), layout(segs)
        sim_cache.insert(tokens.tobytes(), 0.0, lay)
        with state.cache.with_layout(lay):
            state.cache.insert(InsertParams(key=_key(tokens)))
    for r in reqs:  # the two caches hold the same prefixes
        key = serialize(r.segments).tobytes()
        assert state.cache.match_len(key) == sim_cache.match_len(key)

    # SGLang: Req objects in a shuffled waiting queue (one without prism metadata stays last)
    queue_order = list(range(len(reqs)))
    rng.shuffle(queue_order)
    live = {r.id: sglang_req(r) for r in reqs}
    for r in reqs:
        live[r.id]._prism = LiveSeq(live[r.id], arrival=r.arrival)
    plain = Req("plain", "", _tokens(serialize(reqs[0].segments)), SamplingParams(max_new_tokens=1))
    waiting = [live[i] for i in queue_order] + [plain]
    for req in waiting:  # an earlier round that did not admit them: SGLang keeps a copy of each prompt
        req.init_next_round_input(state.cache)
    hooks._state = state
    policy = SchedulePolicy("fcfs", state.cache, enable_hierarchical_cache=False,
                            enable_priority_scheduling=False, schedule_low_priority_values_first=False)
    assert hooks.around_calc_priority(SchedulePolicy.calc_priority, policy, waiting) is None
    assert waiting[-1] is plain
    waiting.pop()
    for req in waiting:  # admission, in queue order: the hook realigns, then SGLang matches
        hooks.before_init_next_round(req, state.cache)
        req.init_next_round_input(state.cache)

    # the simulator: a fresh QAS on the same requests, in the same queue order
    policies = make_policies("qas", "dart", policy_configs("qas", "dart", CONFIG.knobs))
    seqs = [Seq(reqs[i]) for i in queue_order]
    plan = policies.scheduler.plan(seqs, SchedContext(0.0, sim_cache, (), policies.hints, batch_hint=0))
    for seq in plan.order:
        seq.realign(plan.align.get(seq.id))

    assert [int(req.rid) for req in waiting] == [seq.id for seq in plan.order]
    realigned = 0
    for seq in plan.order:
        req, r = live[seq.id], reqs[seq.id]
        want = serialize(seq.segments)
        got = np.frombuffer(req.origin_input_ids, dtype=np.int64)
        assert np.array_equal(got, want), seq.id
        assert req._prism.key == want.tobytes()
        assert req._prism.layout == seq.layout
        assert req._prism.realigned == seq.realigned, seq.id
        if r.fixed_order:
            assert not seq.realigned and np.array_equal(got, serialize(r.segments))
        # SGLang matched the realigned prompt (not a stale copy) against the cache the simulator mirrors
        assert list(req.full_untruncated_fill_ids) == list(req.origin_input_ids)
        assert req.prefix_len == min(sim_cache.match_len(want.tobytes()), len(want) - 1), seq.id
        realigned += seq.realigned
    return [int(req.rid) for req in waiting] != queue_order, realigned


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_qas_in_schedule_policy_matches_the_simulator(seed):
    saved = hooks._state
    try:
        run_round(seed)
    finally:
        hooks._state = saved


def test_the_differential_rounds_reorder_and_realign(live_state):
    """The rounds above are not trivial: in most, QAS moves requests and rewrites prompts (so a hook that
    neither reorders nor realigns fails the differential test)."""
    results = [run_round(seed) for seed in range(30)]
    assert sum(moved for moved, _ in results) >= 15
    assert sum(n > 0 for _, n in results) >= 15


# ------------------------------------------------------------------ LiveSeq
def test_liveseq_rebuilds_the_trace_segments_and_key():
    rng = random.Random(7)
    for r in trace(rng, 20):
        req = sglang_req(r)
        seq = LiveSeq(req, arrival=3.5)
        assert (seq.id, seq.arrival, seq.fixed_order, seq.prompt_len) == (r.id, 3.5, r.fixed_order, r.prompt_len)
        assert [(s.id, s.kind, s.length) for s in seq.segments] == [(s.id, s.kind, s.length) for s in r.segments]
        assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(seq.segments, r.segments))
        assert seq.key == serialize(r.segments).tobytes() == Seq(r).key
        assert seq.layout == layout(r.segments)
        assert sorted(seq.shared_ids()) == sorted(s.id for s in r.segments if s.kind != PRIV)
        view = LiveSeq.of(req, 0.0)  # the hook's view, made on first sight ...
        assert view is req._prism and LiveSeq.of(req, 1.0) is view  # ... and kept
        assert view.key == seq.key and view.segments == seq.segments
    plain = Req("x", "", _tokens([1, 2, 3]), SamplingParams(max_new_tokens=1))
    assert LiveSeq.of(plain, 0.0) is None


def test_liveseq_refuses_segment_ends_that_miss_the_prompt():
    table = SegmentTable()
    r = Request(1, 0.0, (table.segment("sys", SYS, 4), table.segment("p", REUSE, 3),
                         table.segment("q", PRIV, 2)), 1)
    meta = segment_meta(r)
    meta["prism_ends"] = [4, 7, 8]
    req = Req("1", "", _tokens(serialize(r.segments)), SamplingParams(max_new_tokens=1, custom_params=meta))
    with pytest.raises(ValueError):
        LiveSeq(req, 0.0)


def _movable_request() -> tuple[Request, Req, LiveSeq]:
    table = SegmentTable()
    r = Request(5, 0.0, (table.segment("sys", SYS, 4), table.segment("a", REUSE, 3), table.segment("b", REUSE, 5),
                         table.segment("c", REUSE, 2), table.segment("q", PRIV, 3)), 1)
    req = sglang_req(r)
    return r, req, LiveSeq(req, 0.0)


def test_realign_permutes_the_prompt_in_place():
    r, req, seq = _movable_request()
    ids = req.origin_input_ids
    assert not seq.realign(("a", "b", "c"))  # the current order
    assert not seq.realign(None)
    assert seq.realign(("c", "a", "b"))
    assert req.origin_input_ids is ids  # in place: origin_input_ids_unpadded is the same object
    sim = Seq(r)
    sim.realign(("c", "a", "b"))
    assert np.array_equal(np.frombuffer(ids, dtype=np.int64), serialize(sim.segments))
    assert seq.key == sim.key and seq.layout == sim.layout and seq.realigned
    with pytest.raises(ValueError):
        seq.realign(("a", "b"))
    with pytest.raises(ValueError):
        seq.realign(("a", "b", "x"))


@pytest.mark.parametrize("state", ["kv", "output", "chunked", "fixed"])
def test_realign_refuses_a_request_that_holds_kv_or_output(state):
    r, req, seq = _movable_request()
    before = bytes(req.origin_input_ids)
    if state == "kv":
        req.kv.req_pool_idx = 0
    elif state == "output":
        req.output_ids.append(11)
    elif state == "chunked":
        req.extend_end = 4
    else:
        seq.fixed_order = True
    assert not seq.movable()
    assert not seq.realign(("c", "b", "a"))
    assert bytes(req.origin_input_ids) == before and not seq.realigned
    assert seq.key == serialize(r.segments).tobytes()
