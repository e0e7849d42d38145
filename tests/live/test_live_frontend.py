"""QAS as an admission front end inside SGLang's scheduler process, against the simulator's front end.

* Differential: random arrivals of SGLang ``Req`` objects pass through :class:`LiveFrontEnd` over a
  ``PrismRadixCache``, released at random later checks (the scheduler's loop notices a deadline late); the same
  trace requests pass through the simulator's :class:`~prism.sim.frontend.FrontEnd` (SimPy, the simulator's
  radix cache with the same content, an engine that records what reaches it). Both must form the same windows,
  release them in the same order with the same realigned prompts (token for token), lanes and published P̂.
* The hooks on SGLang's real ``Scheduler._add_request_to_queue`` (a scheduler object holding only what that
  method reads): a new arrival is held, a retracted request, a request without prism metadata and an aborted
  one go straight to the waiting queue; the window is released by the ``get_next_batch_to_run`` hook once its
  deadline (window × dilation) has passed, in plan order, and counted.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("sglang.srt.managers.scheduler")

import simpy  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from test_live_schedule import _key, _tokens, sglang_cache, sglang_req, trace  # noqa: E402

from prism.core import layout, serialize  # noqa: E402
from prism.live import hooks  # noqa: E402
from prism.live.frontend import LiveFrontEnd  # noqa: E402
from prism.live.requests import SENT_KEY  # noqa: E402
from prism.policies.base import Deployment  # noqa: E402
from prism.policies.registry import make_policies, policy_configs  # noqa: E402
from prism.sim.engine import Seq  # noqa: E402
from prism.sim.frontend import FrontEnd  # noqa: E402
from prism.sim.radix_cache import RadixCache  # noqa: E402

WINDOW = 0.05
FRONT = Deployment("front_end", WINDOW)


def _policies():
    policies = make_policies("qas", "dart", policy_configs("qas", "dart"), FRONT)
    assert policies.front_end is not None and policies.scheduler.__class__.__name__ == "FCFS"
    return policies


class _Recorder:
    """The simulator's engine as the front end sees it: cache, active requests, hints; records submissions."""

    def __init__(self, env, cache, hints) -> None:
        self.env, self.cache, self.hints, self.active = env, cache, hints, {}
        self.got: list[tuple[float, Seq]] = []

    def submit(self, seq: Seq) -> None:
        self.got.append((self.env.now, seq))


def _fill(rng: random.Random, reqs, live_cache, sim_cache) -> None:
    """The same prefixes of whole segments (some in another passage order) in both caches."""
    for r in rng.sample(reqs, rng.randint(0, len(reqs))):
        segs = list(r.segments)
        if not r.fixed_order and rng.random() < 0.5:
            mid = segs[1:-1]
            rng.shuffle(mid)
            segs = [segs[0], *mid, segs[-1]]
        segs = segs[:rng.randint(1, len(segs))]
        tokens, lay = serialize(segs), layout(segs)
        sim_cache.insert(tokens.tobytes(), 0.0, lay)
        with live_cache.with_layout(lay):
            live_cache.insert(InsertParams(key=_key(tokens)))


def _replay(env, front: FrontEnd, reqs, until: float) -> None:
    """The simulator's front end receives each request at its arrival time, until ``until``."""

    def feed():
        for r in reqs:
            yield env.timeout(r.arrival - env.now)
            front.submit(Seq(r))

    env.process(feed())
    env.run(until=until)


def _windows(seed: int):
    """(sim windows, live windows), each a list of [(id, prompt bytes, lane, realigned)], and both hints."""
    rng = random.Random(seed)
    reqs = trace(rng, rng.randint(2, 14))
    t = 0.0
    for r in reqs:  # arrivals a few per window, some windows empty
        t += rng.expovariate(1 / 0.02)
        r.arrival = t
    sim_pol, live_pol = _policies(), _policies()
    sim_cache = RadixCache(None, 1, anchors=True)
    live_cache = sglang_cache(live_pol.eviction)
    _fill(rng, reqs, live_cache, sim_cache)

    env = simpy.Environment()
    engine = _Recorder(env, sim_cache, sim_pol.hints)
    front = FrontEnd(env, engine, sim_pol.front_end, WINDOW)
    _replay(env, front, reqs, t + 10 * WINDOW)
    sim: dict[float, list] = {}
    for when, seq in engine.got:
        sim.setdefault(when, []).append((seq.id, seq.key, seq.lane, seq.realigned))

    counters: Counter = Counter()
    live_front = LiveFrontEnd(live_pol.front_end, WINDOW, live_pol.hints, counters)
    live: dict[int, list] = {}

    def submit(req) -> None:
        seq = req._prism
        live.setdefault(counters["frontend_windows"], []).append((seq.id, bytes(np.frombuffer(
            req.origin_input_ids, dtype=np.int64).astype(np.int32)), seq.lane, seq.realigned))

    checks = sorted(rng.uniform(0, t + 2 * WINDOW) for _ in range(rng.randint(1, 12)))
    events = sorted([(r.arrival, 0, r) for r in reqs] + [(c, 1, None) for c in checks], key=lambda e: e[:2])
    for when, kind, r in events:
        if kind == 0:
            assert live_front.hold(sglang_req(r), False, when)
        else:
            live_front.release(when, live_cache, submit)
    live_front.release(t + 10 * WINDOW, live_cache, submit)
    assert live_front.held() == 0
    assert counters["frontend_windows"] == len(live)
    return (list(sim.values()), list(live.values()), dict(sim_pol.hints.priority),
            dict(live_pol.hints.priority), front.counters["frontend_windows"])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_live_front_end_forms_and_releases_the_simulators_windows(seed):
    sim, live, p_sim, p_live, sim_windows = _windows(seed)
    assert live == sim
    assert len(live) == sim_windows
    assert p_live == pytest.approx(p_sim)


def test_the_differential_windows_are_not_trivial():
    """The runs above hold several windows of several requests, reordered and realigned (a front end that
    released each arrival alone, or in arrival order, or unaligned, fails the differential test)."""
    runs = [_windows(seed) for seed in range(25)]
    assert sum(len(sim) >= 3 for sim, *_ in runs) >= 10
    multi = [w for sim, *_ in runs for w in sim if len(w) >= 2]
    assert len(multi) >= 20
    assert sum([i for i, *_ in w] != sorted(i for i, *_ in w) for w in multi) >= 5
    assert sum(any(realigned for *_, realigned in w) for w in multi) >= 5


# ------------------------------------------------------------------ the hooks on SGLang's real enqueue
def _bare_scheduler() -> Scheduler:
    """A Scheduler holding only what ``_add_request_to_queue`` reads on a plain (not disaggregated) server."""
    sched = Scheduler.__new__(Scheduler)
    sched.enable_priority_scheduling = False
    sched.abort_on_priority_when_disabled = False
    sched.disaggregation_mode = DisaggregationMode.NULL
    sched.max_queued_requests = None
    sched.enable_hicache_storage = sched.enable_lmcache = False
    sched.processed_tokens_counter = 0
    sched.waiting_queue = []
    return sched


@pytest.fixture
def front_state(monkeypatch):
    saved = hooks._state
    state = hooks.LiveState(hooks.PluginConfig("qas", "dart", dilation=10.0,
                                               deployment={"mode": "front_end", "window_s": WINDOW}))
    state.cache = sglang_cache(state.eviction)
    hooks._state = state
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(hooks, "time", SimpleNamespace(monotonic=lambda: clock.now,
                                                       perf_counter=hooks.time.perf_counter))
    yield state, clock
    hooks._state = saved


def test_hooks_hold_arrivals_release_windows_and_pass_retracted_requests(front_state):
    state, clock = front_state
    assert state.native and state.front is not None and state.front.window == pytest.approx(WINDOW * 10)
    sched = _bare_scheduler()
    add = Scheduler._add_request_to_queue
    reqs = trace(random.Random(3), 6)
    live = [sglang_req(r) for r in reqs]
    plain = Req("plain", "", _tokens(serialize(reqs[0].segments)), SamplingParams(max_new_tokens=1))

    def next_batch(sched_, **kwargs):
        return list(sched_.waiting_queue)

    for i, req in enumerate(live[:4]):  # one window: opened at t = 100.0, closes at 100.5 (real seconds)
        clock.now = 100.0 + 0.1 * i
        hooks.around_add_to_queue(add, sched, req)
    assert sched.waiting_queue == [] and state.front.held() == 4
    hooks.around_add_to_queue(add, sched, plain)  # no prism metadata: straight through
    assert sched.waiting_queue == [plain]
    clock.now = 100.45
    assert hooks.around_next_batch(next_batch, sched) == [plain]  # the window is still open
    clock.now = 100.6  # after the deadline: a new arrival opens the next window ...
    hooks.around_add_to_queue(add, sched, live[4])
    assert state.front.held() == 5
    queue = hooks.around_next_batch(next_batch, sched)  # ... and the first window is released, alone
    assert queue[0] is plain and sorted(queue[1:], key=lambda r: r.rid) == live[:4]
    assert state.counters["frontend_windows"] == 1 and state.front.held() == 1
    assert all(req.time_stats.wait_queue_entry_time > 0 for req in queue)  # SGLang's own enqueue ran
    # a fresh QAS round over the same four requests (arrival order, empty cache) gives the released order
    qas = make_policies("qas", "dart", policy_configs("qas", "dart"), FRONT).front_end
    seqs = [Seq(r) for r in reqs[:4]]
    plan = qas.plan(seqs, hooks.SchedContext(0.0, state.cache, (), _policies().hints, batch_hint=4))
    assert [int(r.rid) for r in queue[1:]] == [s.id for s in plan.order]
    for s in plan.order:
        s.realign(plan.align.get(s.id))
        assert np.array_equal(np.frombuffer(live[s.id].origin_input_ids, dtype=np.int64), serialize(s.segments))
        assert live[s.id]._prism.lane == plan.lane(s.id)
    # a retracted request (SGLang re-queues it) and an aborted new one never wait for a window
    sched.waiting_queue.clear()
    hooks.around_add_to_queue(add, sched, queue[1], is_retracted=True)
    aborted = sglang_req(reqs[5])
    with get_parallel().override(tp_rank=0):  # SGLang's abort (it empties the prompt) reads the rank
        aborted.set_finish_with_abort("test")
    hooks.around_add_to_queue(add, sched, aborted)
    assert sched.waiting_queue == [queue[1], aborted] and state.front.held() == 1
    clock.now = 101.2
    sched._sched_idled = True  # the loop ran no batch since the deadline: the lag is the front end's own
    assert hooks.around_next_batch(next_batch, sched)[-1] is live[4]
    assert state.counters["frontend_windows"] == 2 and state.front.held() == 0
    snap = state.snapshot()
    assert snap["frontend_windows"] == 2 and snap["frontend_idle_releases"] == 1
    assert snap["frontend_idle_release_lag_ms_max"] == pytest.approx(100.0)  # deadline 101.1, released 101.2
    assert snap["qas_rounds"] == 2


def test_a_request_joins_the_window_of_its_send_time_not_of_its_receipt():
    """The scheduler receives requests only between batches: one sent before a window's deadline but received
    after it (``prism_sent``, the client's stamp) still belongs to that window; one sent after it opens the next."""
    policies = _policies()
    counters: Counter = Counter()
    front = LiveFrontEnd(policies.front_end, 0.5, policies.hints, counters)
    reqs = [sglang_req(r) for r in trace(random.Random(5), 4)]
    for req, sent in zip(reqs, (None, 10.4, 10.6, 11.0)):
        if sent is not None:
            req.sampling_params.custom_params["prism_sent"] = sent
    assert front.hold(reqs[0], False, 10.0)  # no stamp: received = sent
    assert front.hold(reqs[1], False, 10.7) and front.hold(reqs[2], False, 10.7)  # received after a batch
    assert front.hold(reqs[3], False, 10.65)  # a stamp later than its receipt is not trusted: sent at 10.65
    assert reqs[1]._prism.arrival == 10.4 and reqs[3]._prism.arrival == 10.65
    got: list = []
    front.release(10.7, sglang_cache(policies.eviction), got.append)
    assert sorted(r.rid for r in got) == sorted([reqs[0].rid, reqs[1].rid]) and front.held() == 2
    front.release(11.1, sglang_cache(policies.eviction), got.append)  # 10.6 + 0.5: the second window
    assert len(got) == 4 and counters["frontend_windows"] == 2


# ------------------------------------------------------------------ holding the backlog
BACKLOG = Deployment("front_end", WINDOW, "backlog")


class _Backend(_Recorder):
    """An engine whose loop ends a batch at each time of ``grid``: a request it receives is admitted at the
    next batch end and leaves at the first batch end after its scripted service time (``service[id]``). What a
    backlog front end counts against its bound: ``active`` and ``waiting``, as the simulator's engine."""

    def __init__(self, env, cache, hints, service, grid) -> None:
        super().__init__(env, cache, hints)
        self.waiting: list[Seq] = []
        self.service, self.grid = service, grid

    def submit(self, seq: Seq) -> None:
        super().submit(seq)
        self.waiting.append(seq)
        self.env.process(self._leave(seq))

    def _leave(self, seq: Seq):
        yield self.env.timeout(_leaves(self.grid, self.env.now, self.service[seq.id]) - self.env.now)
        self.waiting.remove(seq)


def _next(grid: list[float], t: float) -> float:
    return grid[bisect.bisect_left(grid, t)]


def _leaves(grid: list[float], sent: float, service: float) -> float:
    """When a request sent at ``sent`` leaves: admitted at the next batch end, done at the first after that
    plus its service."""
    return _next(grid, _next(grid, sent) + service)


def _backlog_runs(seed: int):
    """The simulator's and the live backlog front end over the same arrivals, cache and backend (a scripted
    engine whose batches end on a random grid): [(batch end that admits it, id, prompt bytes, lane,
    realigned)] each, both published P̂, and the counters. As in SGLang, the live front end sees arrivals
    (with their send stamps) and the batch's finished requests only at the top of the loop iteration after a
    batch, then releases the windows that closed meanwhile."""
    rng = random.Random(seed)
    reqs = trace(rng, rng.randint(6, 24))
    t = 0.0
    for r in reqs:  # bursts: the backend fills up and requests are held for a few windows
        t += rng.expovariate(1 / 0.003)
        r.arrival = t
    limit = rng.randint(1, 10)
    service = {r.id: rng.uniform(0.005, 0.08) for r in reqs}
    grid, g = [], 0.0
    while g < t + 200 * WINDOW:  # batch ends: mostly short batches, some longer than a window
        g += rng.expovariate(1 / 0.01) if rng.random() < 0.85 else rng.uniform(0.05, 0.15)
        grid.append(g)
    sim_pol = make_policies("qas", "dart", policy_configs("qas", "dart"), BACKLOG)
    live_pol = make_policies("qas", "dart", policy_configs("qas", "dart"), BACKLOG)
    sim_cache = RadixCache(None, 1, anchors=True)
    live_cache = sglang_cache(live_pol.eviction)
    _fill(rng, reqs, live_cache, sim_cache)

    env = simpy.Environment()
    engine = _Backend(env, sim_cache, sim_pol.hints, service, grid)
    front = FrontEnd(env, engine, sim_pol.front_end, WINDOW, limit)
    _replay(env, front, reqs, grid[-1])
    assert front.held == 0
    sim = [(_next(grid, when), seq.id, seq.key, seq.lane, seq.realigned) for when, seq in engine.got]

    counters: Counter = Counter()
    live_front = LiveFrontEnd(live_pol.front_end, WINDOW, live_pol.hints, counters, limit)
    sent: list[tuple[float, float, object]] = []  # (batch end that admits it, when it leaves, request)
    clock = [0.0]

    def in_backend() -> int:
        return sum(leaves > clock[0] for _, leaves, _ in sent)

    def submit(req) -> None:
        sent.append((clock[0], _leaves(grid, clock[0], service[req._prism.id]), req))

    pending = list(reqs)
    for c in grid[:-1]:  # the top of each loop iteration: finishes, then arrivals, then the closed windows
        clock[0] = c
        for _, leaves, _ in sent:
            if leaves == c:
                live_front.left(c)
        while pending and pending[0].arrival <= c:
            r = pending.pop(0)
            req = sglang_req(r)
            req.sampling_params.custom_params[SENT_KEY] = r.arrival
            assert live_front.hold(req, False, c, live_cache, submit, in_backend())
        live_front.release(c, live_cache, submit, in_backend=in_backend())
    assert live_front.held() == 0
    live = [(when, req._prism.id, bytes(np.frombuffer(req.origin_input_ids, dtype=np.int64).astype(np.int32)),
             req._prism.lane, req._prism.realigned) for when, _, req in sent]
    return sim, live, dict(sim_pol.hints.priority), dict(live_pol.hints.priority), front.counters, counters


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_live_backlog_front_end_releases_as_the_simulators(seed):
    sim, live, p_sim, p_live, c_sim, c_live = _backlog_runs(seed)
    assert live == sim
    assert p_live == pytest.approx(p_sim)
    assert c_live == c_sim


def test_the_backlog_differential_is_not_trivial():
    """The runs above hold requests for several windows, release several at once, some ahead of older held
    requests (QAS's order, not the arrival order), and send others at once."""
    runs = [_backlog_runs(seed) for seed in range(25)]
    assert sum(c["frontend_held"] >= 3 and c["frontend_passed"] >= 1 for *_, c in runs) >= 10
    multi = overtaking = 0
    for sim, *_ in runs:
        when_of = {rid: when for when, rid, *_ in sim}  # ids grow with arrival times
        by_time: dict[float, list[int]] = {}
        for when, rid, *_ in sim:
            by_time.setdefault(when, []).append(rid)
        multi += sum(len(ids) >= 2 for ids in by_time.values())
        overtaking += sum(any(when_of[o] > when for o in range(max(ids))) for when, ids in by_time.items())
    assert multi >= 20 and overtaking >= 10


class _Batch:
    def __init__(self, reqs, extend: bool) -> None:
        self.reqs = reqs
        self.forward_mode = SimpleNamespace(is_extend=lambda: extend)


class _Finished:
    def __init__(self, done: bool) -> None:
        self.done = done

    def finished(self) -> bool:
        return self.done


def test_in_sglang_counts_every_unfinished_request_once():
    from prism.live.frontend import in_sglang

    a, b, c, d, e = (_Finished(x) for x in (False, True, False, False, False))
    running = _Batch([a, b], extend=False)
    last = _Batch([c, d], extend=True)  # not merged into the running batch yet; d is the chunked request
    sched = SimpleNamespace(running_batch=running, last_batch=last, chunked_req=d, waiting_queue=[e, object()])
    assert in_sglang(sched) == 1 + 2 + 2  # a; c, d (once); the queue
    sched.last_batch = running  # a decode batch that is the running batch: counted once
    assert in_sglang(sched) == 1 + 1 + 2  # a; d (chunked); the queue
    sched.last_batch, sched.chunked_req = _Batch([c], extend=False), None  # a decode batch: merged already
    assert in_sglang(sched) == 1 + 2


def test_hooks_pass_arrivals_while_sglang_has_room_then_hold_the_backlog(monkeypatch):
    saved = hooks._state
    state = hooks.LiveState(hooks.PluginConfig("qas", "dart", dilation=10.0, backlog_limit=2,
                                               deployment={"mode": "front_end", "window_s": WINDOW,
                                                           "holds": "backlog"}))
    state.cache = sglang_cache(state.eviction)
    hooks._state = state
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(hooks, "time", SimpleNamespace(monotonic=lambda: clock.now,
                                                       perf_counter=hooks.time.perf_counter))
    try:
        sched = _bare_scheduler()
        sched.running_batch, sched.last_batch, sched.chunked_req = _Batch([], extend=False), None, None
        add = Scheduler._add_request_to_queue
        live = [sglang_req(r) for r in trace(random.Random(8), 5)]
        hooks.around_add_to_queue(add, sched, live[0])  # room for two: straight to SGLang's queue
        clock.now = 100.1
        hooks.around_add_to_queue(add, sched, live[1])
        assert sched.waiting_queue == live[:2] and state.front.held() == 0
        for i, req in enumerate(live[2:]):  # SGLang holds two: the rest wait, the first opens a window
            clock.now = 100.2 + 0.1 * i
            hooks.around_add_to_queue(add, sched, req)
        assert sched.waiting_queue == live[:2] and state.front.held() == 3

        def next_batch(sched_, **kwargs):
            return list(sched_.waiting_queue)

        clock.now = 100.65  # the window (0.5 s real) closes at 100.7: nothing yet
        assert len(hooks.around_next_batch(next_batch, sched)) == 2
        sched.running_batch = _Batch([sched.waiting_queue.pop(0), sched.waiting_queue.pop(0)], extend=False)
        clock.now = 100.75  # closed, but SGLang still holds two (running): nothing goes
        assert hooks.around_next_batch(next_batch, sched) == [] and state.front.held() == 3
        clock.now = 101.22  # one finishes after the next window closed (101.2), noticed at the batch's end
        sched.running_batch.reqs[0].finished_reason = "done"
        state.release(sched.running_batch.reqs[0])
        clock.now = 101.25  # the window that closed at 101.2 had no room: still nothing goes
        assert hooks.around_next_batch(next_batch, sched) == [] and state.front.held() == 3
        clock.now = 101.75  # the one that closed at 101.7 has room for one
        queue = hooks.around_next_batch(next_batch, sched)
        assert len(queue) == 1 and state.front.held() == 2
        c = state.counters
        assert c["frontend_passed"] == 2 and c["frontend_held"] == 3 and c["frontend_windows"] == 1
        assert state.snapshot()["qas_rounds"] == 3  # two passed at once, one window released
        assert queue[0]._prism.lane == "cold" and queue[0] is live[2]  # the oldest held: the cold lane
    finally:
        hooks._state = saved


def test_the_starvation_bound_runs_on_the_twins_dilated_clock(monkeypatch):
    """``qas.max_wait_s`` is a duration of the served engine's clock: the plugin of a twin dilated D times
    waits D times as long in real seconds (as it does for the window), so a request is served first after the
    same simulated wait."""
    saved = hooks._state
    try:
        state = hooks.LiveState(hooks.PluginConfig("qas", "dart", dilation=10.0, backlog_limit=4,
                                                   knobs={"qas": {"max_wait_s": 2.0}},
                                                   deployment={"mode": "front_end", "window_s": WINDOW,
                                                               "holds": "backlog"}))
        qas = state.policies.front_end
        assert qas.config.max_wait_s == pytest.approx(20.0) and state.front.window == pytest.approx(0.5)
        reqs = [Seq(r) for r in trace(random.Random(2), 6)]
        for i, s in enumerate(reqs):
            s.arrival = float(i)  # sent a real second apart
        ctx = hooks.SchedContext(5.0 + 19.0, state.cache, (), state.hints, batch_hint=2)  # 19-24 real seconds
        plan = qas.plan(reqs, ctx)
        aged = [r.id for r in plan.order if plan.lane(r.id) == "aged"]
        assert aged == [reqs[0].id, reqs[1].id, reqs[2].id, reqs[3].id]  # over 20 real seconds: 2 undilated
        undilated = hooks.LiveState(hooks.PluginConfig("qas", "dart", backlog_limit=4,
                                                       knobs={"qas": {"max_wait_s": 2.0}},
                                                       deployment={"mode": "front_end", "window_s": WINDOW,
                                                                   "holds": "backlog"}))
        assert undilated.policies.front_end.config.max_wait_s == 2.0
    finally:
        hooks._state = saved
