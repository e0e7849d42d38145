"""The engine's invariants, property-tested end to end (issue #13).

Hypothesis draws small traces (built in code from a small segment pool, with simultaneous arrivals, shared
and truncated segments, fixed-order prompts) and engine settings (a KV capacity small enough to evict, but at
least the largest request; page size 1/4/16; chunked-prefill, prefill, running and concurrency limits), and
runs every scheduler (QAS inside the engine and as a windowed front end) with every eviction policy through
:func:`prism.sim.run.simulate`. An :class:`Observer` wraps the engine's and the cache's methods for the
run (the production code is not touched) and checks, at every event:

* KV in use (resident tree tokens + generated tokens + the prefill batch being computed, each counted by the
  observer, not read from the engine's counters) never exceeds the capacity: at every iteration start, after
  every prefill end, finish, allocation, eviction pass and insertion;
* the lock references are exactly those of the admitted, unfinished requests' paths, and an eviction pass
  removes only unlocked leaves and leaves every locked node in the tree;
* a scheduler's plan, where it peeks at the tree (``match_len``, ``match_path``), changes nothing in it;
* under SGLang's admission (drawn with small, fast-decaying new-token ratios so that decode runs out of KV):
  a decode step retracts exactly when its tokens do not fit after evicting every unlocked leaf, retracts in
  SGLang's order (fewest generated tokens, then longest prompt) and keeps at least one request, after which
  the step fits; a retracted request is prefilled again (prompt and generated tokens) and finishes once;

and, per run: every request finishes exactly once, with timestamps equal to the events the observer saw, so
that W_admit + T_prefill + T_1tok is TTFT event by event; hit tokens stay below the prompt and never exceed the
infinite-cache hit of the prompts as served (final segment order, admission order); a repeated run in the
same process (without the observer) gives identical records and summary (wall time aside).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from prism.calibration.cost_model import CostModel, load_profile
from prism.core import PRIV, REUSE, SYS, Request, SegmentTable
from prism.policies import registry
from prism.settings import EngineConfig, RunSpec
from prism.sim import radix_cache as cache_mod
from prism.sim.admission import SGLangRule
from prism.sim.events import EngineEvents
from prism.sim.run import simulate
from prism.traces.stats import infinite_cache_hits
from prism.traces.trace import Trace
from prism.traces.spec import generate
from prism.traces.zipf import ZipfHotspotSpec

PROFILE = load_profile()
FIRST_TOKEN_S = PROFILE.cost.first_token_s

#: every scheduler the registry has, QAS in both deployments ("qas_window": a front end, window_s > 0)
SCHEDULERS = [*registry.SCHEDULERS, "qas_window"]
EVICTIONS = list(registry.EVICTIONS)

EXAMPLES = int(os.environ.get("PRISM_INVARIANT_EXAMPLES", 200))  # per scheduler deployment; all properties each


# ---------------------------------------------------------------------------------------------- strategies
@st.composite
def small_traces(draw) -> Trace:
    """5-30 requests over a small segment pool: most share a system prompt and some reusable segments (in
    random order, sometimes truncated), each has a private suffix; arrivals often coincide."""
    table = SegmentTable()
    n = draw(st.integers(5, 30))
    sys_lens = draw(st.lists(st.integers(1, 40), min_size=1, max_size=2))
    pool = draw(st.lists(st.integers(1, 48), min_size=1, max_size=8))  # reusable segment lengths by index
    t, reqs = 0.0, []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.004, 0.02, 0.1]))
        segs = []
        s = draw(st.integers(-1, len(sys_lens) - 1))
        if s >= 0:
            segs.append(table.segment(f"sys{s}", SYS, sys_lens[s]))
        picks = draw(st.lists(st.integers(0, len(pool) - 1), unique=True, max_size=min(4, len(pool))))
        for p in picks:
            cut = draw(st.integers(0, 5))  # a truncated passage now and then: a prefix of the full one
            length = pool[p] if cut else max(1, pool[p] // 2)
            segs.append(table.segment(f"p{p}", REUSE, length))
        if not segs or draw(st.integers(0, 7)):
            segs.append(table.segment(f"q{i}", PRIV, draw(st.integers(1, 40))))
        fixed = draw(st.integers(0, 9)) == 0
        output = draw(st.integers(1, 12) | st.integers(13, 80))  # long decodes outrun SGLang's estimate
        reqs.append(Request(i, t, tuple(segs), output, fixed_order=fixed))
    return Trace(reqs, table, "custom", {"qps": None, "seed": 0})


def zipf_traces():
    """The zipf generator at small sizes and random seeds (its prompts are long: few requests)."""
    return st.builds(lambda seed, n, qps, k, hot: generate(ZipfHotspotSpec(
        seed=seed, num_requests=n, qps=qps, k=k, hot_set=hot, num_passages=40, chunk_tokens=16, sys_tokens=24,
        suffix_min=4, suffix_max=12, output_len=4)),
        st.integers(0, 2**31 - 1), st.integers(5, 20), st.sampled_from([20.0, 200.0, 2000.0]),
        st.integers(1, 4), st.integers(1, 8))


@st.composite
def engines(draw, trace: Trace) -> EngineConfig:
    total = sum(r.prompt_len + r.output_len for r in trace.requests)
    page = draw(st.sampled_from([1, 4, 16]))
    admission = draw(st.sampled_from(["sglang", "full"]))
    # the largest request must fit (checked at load): its KV, and under SGLang's check its decode and a page spare
    need = max(r.prompt_len + r.output_len - 1 + (page + 2 if admission == "sglang" else 0) for r in trace.requests)
    return EngineConfig(
        max_total_tokens=max(need, page) + draw(st.integers(0, max(1, total // 2))  # at least a page (checked at load)
                                                | st.integers(0, max(1, total // 10))),
        admission=admission,  # sglang: small ratios and fast decay make retraction frequent
        init_new_token_ratio=draw(st.sampled_from([0.05, 0.3, 0.7])),
        min_new_token_ratio_factor=draw(st.sampled_from([0.14, 1.0])),
        new_token_ratio_decay_steps=draw(st.sampled_from([1, 10, 600])),
        retract_decode_steps=draw(st.sampled_from([1, 20])),
        clip_max_new_tokens=draw(st.sampled_from([4096, 10, 40])),  # below some outputs: estimates get clipped
        page_size=page,
        chunked_prefill_size=draw(st.integers(page, 160)),
        max_prefill_tokens=draw(st.integers(page, 200)),  # below a page nothing could run (rejected at load)
        max_running_requests=draw(st.integers(1, 8)),
        max_concurrency=draw(st.none() | st.integers(1, 8)))


def knobs(draw, scheduler: str, eviction: str) -> dict:
    out: dict = {}
    if scheduler in ("lpm", "dfs_weight"):
        out["lpm"] = {"fcfs_threshold": draw(st.integers(0, 40)), "check_threshold": draw(st.integers(0, 40)),
                      "deprioritize_threshold": draw(st.integers(0, 40))}
    elif scheduler == "klpm":
        out["klpm"] = {"k": draw(st.integers(1, 4))}
    elif scheduler == "contextpilot":
        out["contextpilot"] = {"position_weight": draw(st.sampled_from([0.0, 0.001, 0.5])),
                               "engine_order": draw(st.sampled_from(["lpm", "fcfs"])),
                               "reorder": draw(st.booleans())}
    elif scheduler.startswith("qas"):
        out["qas"] = {"f_front": draw(st.integers(0, 3)), "kappa": draw(st.integers(1, 2)),
                      "q_cold": draw(st.integers(0, 3)),
                      "window_s": draw(st.sampled_from([0.001, 0.01, 0.05])) if scheduler == "qas_window" else 0.0}
    if eviction == "dart":
        out["dart"] = {"f": draw(st.integers(0, 4))}
    return out


@st.composite
def runs(draw, scheduler: str) -> RunSpec:
    """A random trace and engine under ``scheduler`` (any registered name) and a random eviction policy."""
    trace = draw(st.one_of(small_traces(), small_traces(), small_traces(), zipf_traces()))
    eviction = draw(st.sampled_from(EVICTIONS))
    sched = "qas" if scheduler == "qas_window" else scheduler
    return RunSpec.build(trace, sched, eviction, engine=draw(engines(trace)), profile=PROFILE,
                         knobs=knobs(draw, scheduler, eviction))


# ---------------------------------------------------------------------------------------------- the observer
def tree_snapshot(cache: cache_mod.RadixCache) -> tuple:
    """Everything about the tree a peek could change: every node's fields and links, and the totals."""
    nodes = []
    stack = [cache.root]
    while stack:
        n = stack.pop()
        nodes.append((id(n), n.position, n.created, id(n.parent), n.key, n.length, n.depth, n.lock_ref,
                      n.last_access_time, n.hit_count, n.kind, n.seg_id,
                      tuple((k, id(c)) for k, c in n.children.items())))
        stack.extend(n.children.values())
    return (tuple(nodes), cache.size, cache.evictable_size, frozenset(map(id, cache._leaves)),
            tuple(sorted(cache.resident.items())), cache._next_id)


def tree_tokens(cache: cache_mod.RadixCache) -> int:
    return sum(n.length for n in cache.nodes())


def attached(cache: cache_mod.RadixCache, node) -> bool:
    """``node`` still hangs from the root."""
    while node is not cache.root:
        parent = node.parent
        if parent is None or parent.children.get(node.key[:cache._pb]) is not node:
            return False
        node = parent
    return True


class Observer(EngineEvents):
    """Checks the invariants at every event the engine emits (:mod:`prism.sim.events`), from counts of its
    own; it wraps the scheduler's plan of the one engine it observes to check that its peeks change nothing."""

    def __init__(self) -> None:
        self.engine = None
        self.finished_ids: Counter = Counter()
        self.admitted_hit: dict[int, int] = {}  # request id -> cached tokens at its (first) admission
        self.start: dict[int, float] = {}  # request id -> start of the first prefill iteration it was in
        self.end: dict[int, float] = {}  # request id -> end of its last prefill chunk
        self.finish: dict[int, float] = {}
        self.served: list[Request] = []  # final segment order, at admission time
        self.batch_tokens = 0  # the prefill batch being computed (observer's count)
        self.decode_starts = 0  # decode iterations started so far
        self.decode_since: dict[int, int] = {}  # decoding request id -> decode_starts when its prefill ended
        self.retracted_ids: list[int] = []  # request ids, in order of retraction
        self.before_check: tuple | None = None  # (running requests' keys, whether the step fitted)
        self.in_prefill_end = False
        self.events = Counter()

    # ------------------------------------------------------------------ checks
    def audit(self, where: str) -> None:
        eng = self.engine
        cache = eng.cache
        cache.check()
        decoding = sum(self.decode_starts - self.decode_since[s.id] for _, s in eng.decoding)
        tails = sum(s.kv_len - s.node.depth for s in eng.active.values())  # prompt KV outside the tree (pages)
        used = tree_tokens(cache) + decoding + tails + self.batch_tokens
        assert used <= eng.capacity, f"{where}: KV in use {used} > capacity {eng.capacity}"
        assert (cache.size, eng.decode_alloc, eng.tails, eng.inflight) == (
            tree_tokens(cache), decoding, tails, self.batch_tokens), \
            f"{where}: engine's KV accounting differs from the observer's"
        assert eng.owed >= 0, f"{where}: negative reservation"
        if isinstance(eng.rule, SGLangRule):  # SGLang's running estimate, summed afresh
            clip, step = eng.cfg.clip_max_new_tokens, eng.step
            assert eng.rule.running_offset(eng) == sum(min(s.finish_step - step, clip) for _, s in eng.decoding) \
                * eng.rule.ratio.current, f"{where}: the running requests' decode estimate differs from its sum"
        # lock references are exactly the running requests' paths (the root's own lock aside), which hang
        # from the root (an eviction pass never takes a locked node)
        expected: Counter = Counter()
        for seq in eng.active.values():
            assert attached(cache, seq.node), f"{where}: a locked node left the tree"
            n = seq.node
            while n is not cache.root:
                expected[id(n)] += 1
                n = n.parent
        actual = {id(n): n.lock_ref for n in cache.nodes() if n.lock_ref}
        assert actual == dict(expected), f"{where}: lock references differ from the running requests' paths"
        assert cache.root.lock_ref == 1
        self.events[where] += 1

    # ------------------------------------------------------------------ events
    def attached(self, eng) -> None:
        assert self.engine is None, "one engine per run"
        self.engine = eng
        # the plan is where a scheduler peeks (match_len, match_path); the policy object is wrapped, as the cache's
        # class is compiled (prism/native.py) and its methods cannot be
        plan, cache = eng.scheduler.plan, eng.cache

        def checked_plan(waiting, ctx):
            self.events["plan"] += 1
            before = tree_snapshot(cache)
            out = plan(waiting, ctx)
            assert tree_snapshot(cache) == before, "a scheduler's plan changed the tree"
            cache.check()
            return out
        eng.scheduler.plan = checked_plan

    def admitted(self, eng, seq, hit) -> None:
        assert seq.kv_len == hit and seq.node.depth == hit and hit % eng.cfg.page_size == 0
        assert hit < seq.fill_len, "at least one token of a fill is computed"

    def prefill_started(self, eng, batch) -> None:
        assert self.batch_tokens == 0, "a prefill batch while another one runs"
        for seq, take, cached in batch:
            assert take > 0, "a prefill chunk of no tokens"
            self.batch_tokens += take
            if seq.id not in self.start:
                self.start[seq.id] = eng.env.now
                self.admitted_hit[seq.id] = cached
                self.served.append(Request(seq.id, eng.env.now, seq.segments, seq.output_len))
        self.audit("iteration")
        self.events["full"] += eng.batch_is_full
        self.in_prefill_end = True  # finishes during this batch's end are audited when it ends

    def prefill_ended(self, eng, batch) -> None:
        self.in_prefill_end = False
        self.batch_tokens = 0
        for seq, _, _ in batch:
            if seq.kv_len == seq.fill_len:
                self.end.setdefault(seq.id, eng.env.now)  # the first prefill's end (TTFT)
                if seq.id in eng.active:  # decoding from here (from its generated tokens if retracted earlier)
                    self.decode_since[seq.id] = self.decode_starts
        self.audit("prefill end")

    def decode_checking(self, eng) -> None:
        running = {s.id: (s.generated(eng.step), s.prompt_len) for s in eng.active.values()}
        self.before_check = (running, len(eng.decoding) <= eng.free() + eng.cache.evictable_size,
                             len(self.retracted_ids))

    def retracted(self, eng, seq) -> None:
        assert seq.id not in eng.active and seq.kv_len == 0 and seq.id in self.decode_since
        self.events["retract"] += 1
        self.retracted_ids.append(seq.id)
        del self.decode_since[seq.id]

    def decode_checked(self, eng) -> None:
        running, fits, before = self.before_check
        gone = self.retracted_ids[before:]
        if not isinstance(eng.rule, SGLangRule):
            assert not gone, "the full rule never retracts"
        else:
            assert fits == (not gone), "retracted although the step fitted, or not although it did not"
        if gone:  # SGLang's order: the fewest generated tokens first, then the longest prompt; one kept
            kept = [key for i, key in running.items() if i not in gone]
            assert kept, "every running request was retracted"
            worst_kept = min((g, -p) for g, p in kept)
            assert all((running[i][0], -running[i][1]) <= worst_kept for i in gone)
            assert len(eng.decoding) <= eng.free() + eng.cache.evictable_size or len(kept) == 1
            assert all(eng.waiting[-len(gone):][k].id == i for k, i in enumerate(gone)), "requeued in order"
        self.audit("retraction" if gone else "decode check")

    def decode_started(self, eng, n) -> None:
        assert n == len(eng.decoding)
        self.decode_starts += 1
        self.audit("iteration")
        self.events["full"] += eng.batch_is_full

    def evicting(self, eng, node) -> None:
        assert node.lock_ref == 0, f"evicted a locked node {node}"
        assert not node.children and node is not eng.cache.root, f"evicted a non-leaf {node}"
        # the candidates kept between passes give what a full sort of them would
        key = eng.eviction.key
        assert node is min(eng.cache.evictable_leaves(), key=lambda n: (key(n), n.created)), "not the smallest key"
        self.events["evict"] += 1

    def finished(self, eng, seq) -> None:
        assert seq.id not in eng.active and seq.kv_len == seq.fill_len and seq.node is None
        self.finished_ids[seq.id] += 1
        self.finish[seq.id] = eng.env.now
        self.decode_since.pop(seq.id, None)
        if not self.in_prefill_end:  # its prefill made its last token: prefill_ended audits
            self.audit("finish")

    def idle(self, eng) -> None:
        self.audit("iteration")


# ---------------------------------------------------------------------------------------------- the checks
def check_run(spec: RunSpec) -> Observer:
    """Simulate ``spec`` under the observer, check the per-run invariants, run it again plainly and compare."""
    obs = Observer()
    res = simulate(spec, served_reference=True, events=obs)
    trace, eng = spec.trace, obs.engine
    ids = sorted(r.id for r in trace.requests)

    # every request completes exactly once; nothing is left running, locked or reserved
    assert sorted(obs.finished_ids) == ids and set(obs.finished_ids.values()) == {1}
    assert sorted(r.id for r in res.records) == ids
    assert not eng.active and not eng.waiting and not eng.decoding and eng.chunked is None
    assert eng.owed == eng.decode_alloc == eng.tails == eng.inflight == 0 and not eng.hints.active
    assert eng.cache.evictable_size == eng.cache.size

    # timestamps are the events the observer saw; TTFT's parts add up to TTFT
    arrival = {r.id: r.arrival for r in trace.requests}
    for r in res.records:
        assert r.arrival == arrival[r.id]
        assert r.arrival <= r.sent <= r.prefill_start
        assert r.prefill_start == obs.start[r.id], "prefill start is not the first prefill iteration's start"
        assert r.prefill_end == obs.end[r.id], "prefill end is not the last chunk's end"
        assert r.first_token == obs.end[r.id] + FIRST_TOKEN_S
        assert r.finish == max(obs.finish[r.id], r.first_token)
        assert r.w_admit >= 0 and r.t_prefill >= 0 and r.t_1tok >= 0
        assert r.w_admit + r.t_prefill + r.t_1tok == pytest.approx(r.ttft, rel=1e-12, abs=1e-12)
        assert (obs.start[r.id] - arrival[r.id]) + (obs.end[r.id] - obs.start[r.id]) + FIRST_TOKEN_S \
            == pytest.approx(r.ttft, rel=1e-12, abs=1e-12)

    # hits: below the prompt, whole pages, and within an unbounded cache's hit on the prompts as served
    bound = dict(zip((q.id for q in sorted(obs.served, key=lambda q: (q.arrival, q.id))),
                     infinite_cache_hits(sorted(obs.served, key=lambda q: (q.arrival, q.id)))))
    for r in res.records:
        assert r.hit_tokens == obs.admitted_hit[r.id]
        assert 0 <= r.hit_tokens < r.prompt_tokens
        assert r.hit_tokens % spec.engine.page_size == 0
        assert r.hit_tokens <= bound[r.id], (r.id, r.hit_tokens, bound[r.id])
    s = res.summary
    assert s["hit_rate"] <= s["served_infinite_cache_hit_rate"] + 1e-12

    # the same run again, in the same process and without the observer: identical results
    again = simulate(spec, served_reference=True)
    assert again.records == res.records
    strip = lambda d: {k: v for k, v in d.items() if k != "wall_s"}  # noqa: E731
    assert strip(again.summary) == strip(s)
    return obs


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])
@given(data=st.data())
def test_engine_invariants(scheduler, data):
    spec = data.draw(runs(scheduler))
    obs = check_run(spec)
    assert obs.events["iteration"] > 0 and obs.events["plan"] > 0  # the wrapped plan ran: its peeks were checked
    eng = obs.engine  # what the example exercised (--hypothesis-show-statistics)
    event(f"eviction={spec.eviction}")
    event("evicted" if eng.counters["evicted_nodes"] else "no eviction")
    event("chunked" if eng.counters["prefill_iterations"] > len({s.id for s in obs.served}) else "unchunked")
    event("realigned" if any(q.segments != r.segments for q, r in
                             zip(sorted(obs.served, key=lambda q: q.id), spec.trace.requests)) else "not realigned")
    event("admission full" if obs.events["full"] else "never full")
    event("retracted" if obs.events["retract"] else "no retraction")


# ---------------------------------------------------------------------------------------------- the cache alone
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_peeks_change_nothing(data):
    """Random inserts, admissions, locks and evictions on a bare cache; every peek leaves it as it was."""
    table = SegmentTable()
    page = data.draw(st.sampled_from([1, 4, 16]))
    cache = cache_mod.RadixCache(None, page, anchors=data.draw(st.booleans()))
    pool = [table.segment(f"p{i}", REUSE, data.draw(st.integers(1, 30))) for i in range(5)]
    locked = []
    for step in range(data.draw(st.integers(1, 25))):
        segs = tuple(data.draw(st.lists(st.sampled_from(pool), unique_by=lambda s: s.id, max_size=4))) + (
            table.segment(f"q{step}", PRIV, data.draw(st.integers(1, 20))),)
        key = Request(step, 0.0, segs, 1).tokens().tobytes()
        cut = data.draw(st.integers(0, len(key) // 4)) * 4
        for name in ("match_len", "match_path"):
            before = tree_snapshot(cache)
            getattr(cache, name)(key[:cut])
            assert tree_snapshot(cache) == before, name
        action = data.draw(st.sampled_from(["insert", "admit", "evict", "unlock"]))
        if action == "insert":
            cache.insert(key, float(step))
        elif action == "admit":
            _, node = cache.match(key[:cut], float(step))
            cache.lock(node)
            locked.append(node)
        elif action == "evict":
            cache.evict(data.draw(st.integers(1, 50)), lambda n: (n.last_access_time,))
        elif locked:
            cache.unlock(locked.pop(data.draw(st.integers(0, len(locked) - 1))))
        cache.check()

