"""QAS on hand-built queues (worked example), the cold-lane bound, front alignment, and the compiled QAS the
registry runs against the readable definition (``policies/qas.py``), round after round."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.core import PRIV, REUSE, SYS, SegmentTable
from prism.policies.base import DemandHints, SchedContext
from prism.policies import qas_aot
from prism.policies.qas import QAS, QASConfig
from prism.policies.qas_compiled import CompiledQAS
from prism.policies.qas_round import Params, Prompts, order_queue

#: both production classes: the definition and the compiled rounds the registry runs
BOTH = pytest.mark.parametrize("impl", [QAS, CompiledQAS], ids=["readable", "compiled"])

TABLE = SegmentTable()


@dataclass
class Req:
    """A waiting request as a scheduler sees it."""

    id: int
    arrival: float
    segments: tuple
    key: bytes = b""
    prompt_len: int = 0
    fixed_order: bool = False


def req(rid: int, t: float, skeleton: tuple[str, ...]) -> Req:
    segs = (TABLE.segment("sys", SYS, 4), *(TABLE.segment(s, REUSE, 4) for s in skeleton),
            TABLE.segment(f"q{rid}", PRIV, 2))
    return Req(rid, t, segs)


def between_rounds(hint_sets, running: list, joining, finished) -> None:
    """An engine's bookkeeping between rounds: the ``joining`` requests enter a(r) of each of ``hint_sets``, and
    the running ones that have ``finished(r)`` leave it."""
    for r in joining:
        for h in hint_sets:
            h.admit([s.id for s in r.segments if s.kind != PRIV])
    running += joining
    for r in [r for r in running if finished(r)]:
        for h in hint_sets:
            h.release([s.id for s in r.segments if s.kind != PRIV])
        running.remove(r)


class NoCache:
    def match_len(self, key: bytes) -> int:
        return 0


def worked_example():
    waiting = [req(1, 1.0, ("A", "B", "C")), req(2, 2.0, ("B", "D")), req(3, 3.0, ("C", "B", "E")),
               req(4, 4.0, ("D", "B")), req(5, 5.0, ("E", "F"))]
    hints = DemandHints(active=Counter({"B": 1, "F": 1, "sys": 1}))  # one running request with B and F
    ctx = SchedContext(0.0, NoCache(), (), hints, batch_hint=2)
    return waiting, hints, ctx


@BOTH
def test_worked_example_counters_priorities_buckets_lanes(impl):
    waiting, hints, ctx = worked_example()
    qas = impl()
    plan = qas.plan(waiting, ctx)
    prio = qas.last["priority"]
    # P(r; ∅) = 1e6·a + g:  g = A1 B4 C2 D2 E2 F1 sys5;  a = B1 F1 sys1
    assert prio == {"A": 1, "B": 1_000_004, "C": 2, "D": 2, "E": 2, "F": 1_000_001, "sys": 1_000_005}
    # front alignment (top 3 by priority, ties to the segment seen first: C, D, E) and kappa=1 signatures
    assert plan.align.get(1) == ("B", "C", "A")
    assert plan.align.get(2) is None  # already (B, D)
    assert plan.align.get(3) == ("B", "C", "E")
    assert plan.align.get(4) == ("B", "D")
    assert plan.align.get(5) == ("F", "E")
    buckets = dict(qas.last["buckets"])
    # bucket (B): R1-R4, provisional hot batch R1, R2 -> n = A1 B2 C1 D1;
    #   U = (100001 + 1200004 + 100002 + 100002 + 2) / 5 = 300002.2; Score = 4 + 0.5 U = 150005.1
    # bucket (F): R5 -> n = E1 F1; U = (100002 + 1100001) / 2 = 600001.5; Score = 1 + 0.5 U = 300001.75
    assert buckets[(1, 2, 3, 4)] == pytest.approx(150005.1)
    assert buckets[(5,)] == pytest.approx(300001.75)
    # cold lane: the two oldest; hot lane: bucket (F) first, then (B) without the cold ones
    assert [r.id for r in plan.order] == [1, 2, 5, 3, 4]
    assert plan.lanes == {1: "cold", 2: "cold"}


@BOTH
def test_worked_example_next_batch_and_publication(impl):
    waiting, hints, ctx = worked_example()
    qas = impl()
    plan = qas.plan(waiting, ctx)
    admitted = plan.order[:3]  # the engine took R1, R2, R5
    qas.on_dispatch(admitted, ctx)
    # the requests that now head the order (R3, R4) form the next batch
    assert qas.next_counter == Counter({"B": 2, "C": 1, "E": 1, "D": 1, "sys": 2})
    # P̂(r) = P(r; B_dispatch): dispatched segments A B C (R1), B D (R2), E F (R5), sys x3
    assert dict(hints.priority) == pytest.approx({
        "A": 1 + 1e5, "B": 1_000_004 + 2e5, "C": 2 + 1e5, "D": 2 + 1e5, "E": 2 + 1e5, "F": 1_000_001 + 1e5,
        "sys": 1e6 + 3e5 + 5})
    assert hints.version == 1
    # the next round ranks by P(r; ∅): g(C) = 1 (R3) only
    plan2 = qas.plan([r for r in waiting if r.id in (3, 4)], ctx)
    assert qas.last["priority"]["C"] == 1
    assert plan2.align.get(3) == ("B", "C", "E")  # C before E: equal priorities, C seen first


@BOTH
def test_in_engine_starvation_bound_serves_aged_requests_first(impl):
    waiting, hints, ctx = worked_example()  # arrivals 1..5
    qas = impl(QASConfig(window_s=0.0, max_wait_s=2.5))
    late = SchedContext(5.0, NoCache(), (), hints, batch_hint=2)  # R1 (4 s) and R2 (3 s) waited > 2.5 s
    plan = qas.plan(waiting, late)
    assert [r.id for r in plan.order][:2] == [1, 2] and plan.lanes[1] == plan.lanes[2] == "aged"
    assert dict(plan.lanes) == {1: "aged", 2: "aged"} and plan.lane(5) == "hot"  # aged outranks cold (R1, R2 are)
    later = SchedContext(7.0, NoCache(), (), hints, batch_hint=2)  # now R1-R4 have: FIFO ahead of R5's bucket
    plan = impl(QASConfig(window_s=0.0, max_wait_s=2.5)).plan(waiting, later)
    assert [r.id for r in plan.order] == [1, 2, 3, 4, 5] and dict(plan.lanes) == dict.fromkeys([1, 2, 3, 4], "aged")
    # a front end that holds the backlog re-plans it too: the same bound
    backlog = impl(QASConfig(max_wait_s=2.5, front_end="backlog")).plan(waiting, later)
    assert [r.id for r in backlog.order] == [1, 2, 3, 4, 5] and backlog.lane(3) == "aged"
    # without the bound (a front end of arrivals, whose window bounds the wait) the worked example's order stands
    assert [r.id for r in impl(QASConfig(max_wait_s=2.5, front_end="arrivals")).plan(waiting, later).order] == [
        1, 2, 5, 3, 4]


skeletons = st.lists(st.lists(st.sampled_from("ABCDEFGH"), min_size=0, max_size=5, unique=True).map(tuple),
                     min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(rounds=st.lists(st.tuples(skeletons, st.integers(0, 6), st.lists(st.booleans(), min_size=25, max_size=25)),
                       min_size=1, max_size=4),
       f=st.integers(0, 4), kappa=st.integers(1, 3), q_cold=st.integers(0, 3), hint=st.integers(0, 5),
       active=st.dictionaries(st.sampled_from(list("ABCDEFGH") + ["sys"]), st.integers(1, 3)),
       engine_queue=st.booleans(), times=st.none() | st.lists(st.integers(0, 5), min_size=100, max_size=100),
       finish=st.lists(st.booleans(), min_size=100, max_size=100),
       mode=st.sampled_from(["in-engine", "arrivals", "backlog"]),
       clock=st.lists(st.floats(0, 8), min_size=4, max_size=4), buckets=st.booleans(), budget=st.floats(0, 6),
       early=st.sampled_from(["interpreted"] + (["aot"] if qas_aot.load() is not None else [])),
       compact=st.booleans())
def test_compiled_rounds_equal_the_definition(rounds, f, kappa, q_cold, hint, active, engine_queue, times, finish,
                                              mode, clock, buckets, budget, early, compact):
    """The compiled QAS the registry runs gives the readable definition's order, alignment, lanes (cold and,
    re-planning a backlog, aged past ``max_wait_s``), buckets and their scores, priorities, next counter,
    published priorities and the segments whose priority fell, round after round. The queue is kept either
    as an engine keeps it (the plan's order minus the admitted head, then new arrivals) or in arrival order;
    arrival times either grow with the id or come in any order. Admitted requests join a(r) as an engine's do
    (``hints.admit``) and some finish between rounds (``hints.release``): the compiled a(r), kept from the
    changes, must be what the definition reads afresh from ``hints.active`` each round. With ``buckets`` off
    both keep one bucket of the whole queue.

    The early kernels (interpreted, or compiled ahead of time where the install built them) run the first
    rounds (a ``budget`` of them; 0: numba's from the first), as a short simulation runs them, and numba's
    from then on: the definition holds whichever ran. With ``compact`` the compiled table drops the rows of
    requests no longer queued at every round that finds one (a live server's, past thousands)."""
    cfg = QASConfig(f_front=f, kappa=kappa, q_cold=q_cold, window_s=0.0 if mode == "in-engine" else 0.05,
                    max_wait_s=1.5, buckets=buckets, front_end="arrivals" if mode == "arrivals" else "backlog")
    fast, plain = CompiledQAS(cfg), QAS(cfg)
    if compact:
        fast.table.compact_factor, fast.table.compact_slack = 1, 0
    fast.early = early_kernels(early)
    fast.early_budget_s = budget * fast.early.round_s
    hints, plain_hints = DemandHints(active=Counter(active)), DemandHints(active=Counter(active))
    waiting: list[Req] = []
    running: list[Req] = []
    rid = 0
    for k, (new, admit, fixed) in enumerate(rounds):
        for j, s in enumerate(new):
            r = req(rid, float(rid // 2 if times is None else times[rid]), s)  # equal times: ties by id
            r.fixed_order = fixed[j]
            waiting.append(r)
            rid += 1
        if not waiting:
            continue
        now = clock[k]
        plan = fast.plan(waiting, SchedContext(now, NoCache(), (), hints, batch_hint=hint))
        ref = plain.plan(waiting, SchedContext(now, NoCache(), (), plain_hints, batch_hint=hint))
        assert [r.id for r in plan.order] == [r.id for r in ref.order]
        assert dict(plan.lanes) == dict(ref.lanes)
        assert all(plan.lane(r.id) == ref.lane(r.id) for r in waiting)
        for r in waiting:
            assert plan.align.get(r.id) == ref.align.get(r.id)
            mine = tuple(s.id for s in r.segments if s.kind == REUSE)
            assert Counter(plan.align.get(r.id) or mine) == Counter(mine)
        assert dict(fast.last["buckets"]) == pytest.approx(dict(plain.last["buckets"]))
        assert fast.last["priority"] == pytest.approx(plain.last["priority"])
        admitted = plan.order[:admit]
        fast.on_dispatch(admitted, SchedContext(now, NoCache(), (), hints, batch_hint=hint))
        plain.on_dispatch([next(x for x in ref.order if x.id == r.id) for r in admitted],
                          SchedContext(now, NoCache(), (), plain_hints, batch_hint=hint))
        if admitted:
            assert dict(hints.priority) == pytest.approx(dict(plain_hints.priority))
            assert hints.take_fell() == plain_hints.take_fell()
            assert fast.next_counter == +plain.next_counter
        assert fast.stats() == plain.stats()
        gone = {r.id for r in admitted}
        waiting = list(plan.order[admit:]) if engine_queue else [r for r in waiting if r.id not in gone]
        shared = lambda r: [s.id for s in r.segments if s.kind != PRIV]  # noqa: E731
        for r in admitted:
            hints.admit(shared(r))
            plain_hints.admit(shared(r))
        running += admitted
        for r in [r for r in running if finish[r.id]]:
            hints.release(shared(r))
            plain_hints.release(shared(r))
            running.remove(r)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from([0, 1, 1, 1, 1, 2, 3]),  # mostly one arrival, as below the knee
                                st.lists(st.sampled_from("ABCDEFGH"), max_size=5).map(tuple), st.booleans(),
                                st.sampled_from(["all"] * 4 + ["none", "head", "list", "backwards", "stranger"]),
                                st.integers(0, 7),
                                st.sampled_from([False] * 6 + [True])),
                      min_size=1, max_size=30),
       f=st.integers(0, 4), q_cold=st.integers(0, 2), hint=st.integers(0, 3), wait=st.sampled_from([0.5, 1.0, 1.7]),
       front_end=st.booleans(), finish=st.lists(st.booleans(), min_size=64, max_size=64),
       weights=st.sampled_from([(1e6, 1e5, 1.0), (0.1, 0.7, 1 / 3), (0.0, 0.3, 0.1), (2.5, 0.0, 0.0)]),
       compact=st.booleans())
def test_small_rounds_in_python_are_the_kernels_rounds(steps, f, q_cold, hint, wait, front_end, finish, weights,
                                                       compact):
    """A round of one request runs in Python (``CompiledQAS._plan_one``), and its dispatch, like that of a short
    round the engine took whole (in any order), publishes only what may have changed: exactly what the kernels'
    round and dispatch give, round after round, in a mix of rounds of one and of several requests, whole or
    partial dispatches, a(r) changing between rounds, rounds without hints, a request the round never ordered
    among those taken, a reusable segment repeated in a prompt (skeletons may repeat one), new segments each
    round, weights whose sums round (the same float operations in the same order): the same order, alignment,
    lanes, counters, next batch and inspection, and the same publication, byte for byte and in the same key
    order, with the same segments that fell. With ``compact`` the Python side's table also drops the rows of
    requests no longer queued at every round of several that finds one; the kernels' side keeps them all."""
    w_a, w_n, w_g = weights
    cfg = QASConfig(w_a=w_a, w_n=w_n, w_g=w_g, f_front=f, q_cold=q_cold, max_wait_s=wait,
                    window_s=0.05 if front_end else 0.0)
    fast, kern = CompiledQAS(cfg), CompiledQAS(cfg)
    kern.small_rounds_in_python = False
    if compact:
        fast.table.compact_factor, fast.table.compact_slack = 1, 0
    hints_f, hints_k = DemandHints(), DemandHints()
    waiting: list[Req] = []
    running: list[Req] = []
    late: list[Req] = []
    rid = 0
    for k, (n_new, skeleton, fixed, take, novel, no_hints) in enumerate(steps):
        for j in range(n_new):
            segs = (*skeleton[j:], f"n{k}.{novel}") if novel else skeleton[j:]
            r = req(rid, float(rid) / 2, segs)
            r.fixed_order = fixed
            waiting.append(r)
            rid += 1
        if not waiting:
            continue
        now = float(k) / 2
        ctx_f = SchedContext(now, NoCache(), (), None if no_hints else hints_f, batch_hint=hint)
        ctx_k = SchedContext(now, NoCache(), (), None if no_hints else hints_k, batch_hint=hint)
        plan, ref = fast.plan(waiting, ctx_f), kern.plan(waiting, ctx_k)
        assert [r.id for r in plan.order] == [r.id for r in ref.order]
        assert [(r.id, plan.lane(r.id)) for r in waiting] == [(r.id, ref.lane(r.id)) for r in waiting]
        assert dict(plan.lanes) == dict(ref.lanes)
        assert [plan.align.get(r.id) for r in waiting] == [ref.align.get(r.id) for r in waiting]
        assert fast.last == kern.last
        admitted = {"all": plan.order, "none": [], "head": plan.order[:1], "list": list(plan.order[:2]),
                    "backwards": plan.order[::-1]}.get(take)
        if take == "stranger":  # the engine also took a request this round never ordered, with a segment seen
            queued = {s.id for r in plan.order for s in r.segments}  # before but not in the queue (its term counts)
            known = [s for s in "ABCDEFGH" if s in fast.table.segment_index and s not in queued]
            seen = [known[novel % len(known)]] if known else []
            admitted = [*plan.order[:1], req(rid, now, (*seen, "Z", f"s{k}"))]
            rid += 1
        fast.on_dispatch(admitted, ctx_f)
        kern.on_dispatch(admitted if take != "all" else ref.order, ctx_k)
        assert list(hints_f.priority.items()) == list(hints_k.priority.items())  # exact floats, same key order
        assert hints_f.take_fell() == hints_k.take_fell() and hints_f.version == hints_k.version
        assert fast.next_counter == kern.next_counter and fast.stats() == kern.stats()
        gone = {r.id for r in admitted}
        waiting = [r for r in plan.order if r.id not in gone]
        # a front end's engine admits what it was handed at its next iteration, maybe after another arrival's round
        joining, late = (late, list(admitted)) if front_end else (list(admitted), [])
        between_rounds((hints_f, hints_k), running, joining, lambda r: finish[(r.id + k) % 64])
    assert fast.stats() == kern.stats()


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 30), st.booleans(), st.booleans(),
                                st.integers(0, 7), st.integers(0, 2**31)), min_size=1, max_size=12),
       hint=st.integers(0, 8), kappa=st.integers(1, 3), finish=st.lists(st.booleans(), min_size=64, max_size=64))
def test_a_round_reads_no_segment_outside_its_queue(steps, hint, kappa, finish):
    """A round and its dispatch cost their queue, not every segment QAS has numbered (DESIGN §3: O(S)): the
    kernels keep an entry per segment between rounds and read only those the round itself writes. So entries
    overwritten with garbage before every plan and every dispatch change nothing: the same order, lanes,
    alignment, buckets, priorities and publication as the readable definition, which recomputes everything from
    every segment seen, round after round, with queues longer than a dispatch reads in Python, many new
    segments a round, rounds without hints, and requests taken that the round never ordered."""
    cfg = QASConfig(kappa=kappa, window_s=0.0, q_cold=1)
    fast, plain = CompiledQAS(cfg), QAS(cfg)
    fast.small_rounds_in_python = False  # the kernels' own rounds and dispatches, whatever the queue
    hints, plain_hints = DemandHints(), DemandHints()
    waiting: list[Req] = []
    running: list[Req] = []
    rid = 0

    def poison(seed: int) -> None:
        rng = np.random.default_rng(seed)
        fast._prio[:] = rng.normal(size=len(fast._prio)) * 1e6
        fast._local_of[:] = rng.integers(-5, 50, size=len(fast._local_of))

    for k, (n_new, take, no_hints, stranger, fresh, seed) in enumerate(steps):
        for j in range(n_new):
            skeleton = ("ABCDEFGH"[j % 8], "ABCDEFGH"[(j * 3 + k) % 8], *(f"n{k}.{j}.{x}" for x in range(fresh % 3)))
            waiting.append(req(rid, float(rid), tuple(dict.fromkeys(skeleton))))
            rid += 1
        if not waiting:
            continue
        ctx_f = SchedContext(float(k), NoCache(), (), None if no_hints else hints, batch_hint=hint)
        ctx_p = SchedContext(float(k), NoCache(), (), None if no_hints else plain_hints, batch_hint=hint)
        poison(seed)
        plan, ref = fast.plan(waiting, ctx_f), plain.plan(waiting, ctx_p)
        assert [r.id for r in plan.order] == [r.id for r in ref.order]
        assert [plan.lane(r.id) for r in waiting] == [ref.lane(r.id) for r in waiting]
        poison(seed + 1)
        assert [plan.align.get(r.id) for r in waiting] == [ref.align.get(r.id) for r in waiting]
        assert dict(fast.last["buckets"]) == pytest.approx(dict(plain.last["buckets"]))
        assert fast.last["priority"] == pytest.approx(plain.last["priority"])
        admitted = list(plan.order[:take])
        if stranger:  # a request the round never ordered, with a segment seen before and one new
            admitted.append(req(rid, float(k), ("A", f"z{k}")))
            rid += 1
        poison(seed + 2)
        fast.on_dispatch(admitted, ctx_f)
        plain.on_dispatch([next((x for x in ref.order if x.id == r.id), r) for r in admitted], ctx_p)
        assert dict(hints.priority) == pytest.approx(dict(plain_hints.priority))
        assert hints.take_fell() == plain_hints.take_fell()
        assert fast.next_counter == +plain.next_counter
        gone = {r.id for r in admitted}
        waiting = [r for r in plan.order if r.id not in gone]
        between_rounds((hints, plain_hints), running, admitted, lambda r: finish[(r.id + k) % 64])


def test_a_request_taken_outside_the_round_loses_its_batch_term_next_round():
    """The engine took the head of a round and a request the round never ordered, whose segment C was seen
    before but is in no queue, and none of them has joined the running batch yet (a front end's engine admits
    them at its next iteration): C's published P̂ carries that request's batch term. The next round, of one
    request taken whole, must take the term back as the kernels' dispatch does, though neither a(C) moved nor
    is C in its queue."""
    cfg = QASConfig(w_a=0.1, w_n=0.7, w_g=1 / 3, f_front=2, q_cold=0, window_s=0.05)
    fast, kern = CompiledQAS(cfg), CompiledQAS(cfg)
    kern.small_rounds_in_python = False
    hints = {fast: DemandHints(), kern: DemandHints()}

    def round_of(qas, waiting, now, take):
        ctx = SchedContext(now, NoCache(), (), hints[qas], batch_hint=2)
        plan = qas.plan(waiting, ctx)
        qas.on_dispatch(take(plan.order), ctx)
        return plan.order

    stranger = req(9, 0.5, ("C", "Z"))
    for qas in (fast, kern):
        round_of(qas, [req(0, 0.0, ("C",))], 0.2, lambda order: order)
        order = round_of(qas, [req(1, 0.3, ("A", "B")), req(2, 0.4, ("A",))], 0.5,
                         lambda order: [order[0], stranger])
        round_of(qas, order[1:], 1.0, lambda order: order)
    assert list(hints[fast].priority.items()) == list(hints[kern].priority.items())
    assert "C" not in hints[kern].priority and "Z" not in hints[kern].priority  # the term went, and C has no a(r)


def test_a_long_running_queue_keeps_a_table_the_size_of_its_queue():
    """An engine's queue of about 14 requests, 3,608 arriving and one in six aborted by its client while waiting
    (a live server's days, shortened): the table keeps the rows of at most twice its queue plus the slack, not a
    row per request ever seen, and its rounds are those of a table that keeps every row (order, alignment, lanes,
    publication, and between a plan and its dispatch the last dispatch's predicted batch, some of it aborted
    since)."""
    cfg = QASConfig(window_s=0.0, max_wait_s=1.0)
    lean, full = CompiledQAS(cfg), CompiledQAS(cfg)
    lean.table.compact_slack, full.table.compact_slack = 64, 10**9
    hints = {lean: DemandHints(), full: DemandHints()}
    skeletons = [("A", "B"), ("C", "A", "D"), ("E",), ("B", "F", "G"), ()]
    waiting: list[Req] = []
    most_rows = 0
    take = lambda k: 6 if k % 2 else 4  # noqa: E731  (5 a round)
    rid = 0
    for k in range(600):
        arrive = 6 + (8 if k == 0 else 0)  # 5 admitted a round and one aborted: a queue of 13 or 14
        waiting += [req(rid + j, k * 0.1 + j * 0.01, skeletons[(k + j) % 5]) for j in range(arrive)]
        rid += arrive
        orders = []
        for qas in (lean, full):
            ctx = SchedContext(k * 0.1, NoCache(), (), hints[qas], batch_hint=4)
            plan = qas.plan(waiting, ctx)
            orders.append(([r.id for r in plan.order], [plan.align.get(r.id) for r in waiting],
                           [plan.lane(r.id) for r in waiting], qas.next_counter))  # the last dispatch's prediction
            qas.on_dispatch(plan.order[:take(k)], ctx)
        assert orders[0] == orders[1] and lean.next_counter == full.next_counter
        assert list(hints[lean].priority.items()) == list(hints[full].priority.items())
        most_rows = max(most_rows, lean.table.n_rows)
        assert lean.table.n_rows <= 2 * len(waiting) + 64 and len(lean.table.row_of) == lean.table.n_rows
        waiting = list(plan.order[take(k):])
        waiting.remove(plan.order[take(k)])  # its client gave up: a predicted next request leaves unadmitted
    assert full.table.n_rows == rid and most_rows <= 2 * 17 + 64
    assert len(lean.table.segments) <= 2 * most_rows + 64  # its arrays shrank with it


@settings(max_examples=60, deadline=None)
@given(arrivals=st.lists(st.tuples(st.integers(0, 4), skeletons), min_size=3, max_size=12),
       q_cold=st.integers(1, 3), extra=st.lists(st.integers(0, 3), min_size=12, max_size=12))
def test_cold_lane_bounds_the_wait(arrivals, q_cold, extra):
    """If each round admits at least q_cold requests in plan order, a request with j older requests waiting
    is admitted within floor(j / q_cold) + 1 rounds, whatever the hot lane prefers."""
    qas = CompiledQAS(QASConfig(q_cold=q_cold))
    waiting: list[Req] = []
    deadline: dict[int, int] = {}
    rid = 0
    for rnd, (n_new, sks) in enumerate(arrivals):
        for s in sks[:n_new]:
            waiting.append(req(rid, float(rid), s))
            rid += 1
        if not waiting:
            continue
        ages = sorted(waiting, key=lambda r: r.arrival)
        for j, r in enumerate(ages):
            deadline[r.id] = min(deadline.get(r.id, 10**9), rnd + j // q_cold)
        ctx = SchedContext(float(rnd), NoCache(), (), DemandHints())
        plan = qas.plan(waiting, ctx)
        take = plan.order[:q_cold + extra[rnd % len(extra)]]
        qas.on_dispatch(take, ctx)
        gone = {r.id for r in take}
        waiting = [r for r in waiting if r.id not in gone]
        for r in waiting:
            assert deadline[r.id] > rnd, f"request {r.id} waited past its cold-lane bound"


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(1, 30), q_cold=st.integers(0, 3), hint=st.integers(1, 6))
def test_lanes_depend_only_on_the_order_of_age_keys(data, n, q_cold, hint):
    """The round's ordering pass takes any unique age keys: dense ones (an engine's queue, sorted by counting)
    and sparse ones (sorted by comparison) that rank the requests alike give the same buckets and order."""
    V = 6
    segs = st.lists(st.integers(0, V - 1), max_size=4, unique=True)
    rows = [data.draw(segs) for _ in range(n)]
    mat = np.full((n, 5), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        mat[i, 1:1 + len(r)] = r
    prompts = Prompts(mat, np.array([len(r) for r in rows], dtype=np.int64), np.zeros(n, dtype=bool), 5)
    bucket_key = np.unique([r[0] if r else -1 for r in rows], return_inverse=True)[1].astype(np.int64)
    base = np.array(data.draw(st.lists(st.integers(0, 5), min_size=V, max_size=V)), dtype=float)
    age = np.array(data.draw(st.permutations(range(n))), dtype=np.int64)
    params = Params(1e6, 1e5, 1.0, 3, 1, 1.0, 0.5, q_cold, True)
    places = np.arange(V, dtype=np.int64)  # each segment's place among the round's: itself
    dense = order_queue(prompts, np.arange(n), age, bucket_key, base, places, V, params, hint)
    sparse = order_queue(prompts, np.arange(n), age * 1000 + 7, bucket_key, base, places, V, params, hint)
    for a, b in zip(dense, sparse):
        np.testing.assert_array_equal(a, b)
    assert sorted(dense[0].tolist()) == list(range(n))  # every request, once
    assert dense[1].tolist() == np.argsort(age)[:min(q_cold, n)].tolist()  # the oldest, oldest first


@pytest.mark.parametrize("window_s,front_end", [(0.0, "backlog"), (0.05, "arrivals"), (0.05, "backlog")],
                         ids=["in-engine", "front-end-arrivals", "front-end-backlog"])
def test_the_definition_run_as_the_scheduler_serves_as_the_compiled_one(monkeypatch, window_s, front_end):
    """Registered in place of the compiled class, the readable QAS serves a whole run exactly alike: the same
    records (admission order, alignments, lanes) and counters."""
    from prism.calibration.cost_model import load_profile
    from prism.policies import registry
    from prism.settings import EngineConfig, RunSpec
    from prism.sim.run import simulate
    from prism.traces.spec import load_trace

    trace = load_trace("zipf", {"num_requests": 300, "qps": 70})
    knobs = {"qas": {"window_s": window_s, "front_end": front_end}}
    engine = EngineConfig(max_total_tokens=32768, max_concurrency=24)  # holding the backlog, it holds some

    def run():
        return simulate(RunSpec.build(trace, "qas", "dart", engine=engine, knobs=knobs, profile=load_profile()))

    compiled = run()
    monkeypatch.setitem(registry.SCHEDULERS, "qas", "qas:QAS")
    plain = run()
    assert plain.records == compiled.records
    assert plain.counters == compiled.counters
    assert compiled.counters["front_alignment_moves"] > 50 and compiled.counters["evicted_nodes"] > 0
    if window_s and front_end == "backlog":
        assert compiled.counters["frontend_held"] > 50 and compiled.counters["frontend_windows"] > 5


def early_kernels(name: str):
    """The early kernels of that name (``aot``: where the install built them; skipped where it could not)."""
    from prism.policies import qas_aot, qas_compiled

    if name == "interpreted":
        return qas_compiled.INTERPRETED_ROUNDS
    aot = qas_aot.load()
    if aot is None:
        pytest.skip("QAS's ahead-of-time kernels are not built (test_the_ahead_of_time_kernels_are_built)")
    return qas_compiled.EarlyKernels(aot, qas_compiled.AOT_ROUND_S, 0.0)


def counted_kernels(monkeypatch, early) -> Counter:
    """Count the kernel calls of each kind from here on (``early``: the early kernels QAS is to start with):
    "early" and "numba", a plan and a dispatch each."""
    from types import SimpleNamespace

    from prism.policies import qas_compiled, qas_round

    calls = Counter()
    counting = lambda fn, kind: lambda *a: (calls.update([kind]), fn(*a))[1]  # noqa: E731
    entry = ("plan_round", "dispatch")
    kernels = SimpleNamespace(**{**vars(early.kernels), **{n: counting(getattr(early.kernels, n), "early")
                                                            for n in entry}})
    monkeypatch.setattr(qas_compiled, "_early", [early._replace(kernels=kernels)])
    for name in entry:
        monkeypatch.setattr(qas_round.compiled(), name, counting(getattr(qas_round.compiled(), name), "numba"))
    return calls


@pytest.mark.parametrize("early_name", ["interpreted", "aot"])
def test_a_short_run_starts_with_early_kernels_then_loads_numbas_and_serves_alike(monkeypatch, early_name):
    """The registry's QAS runs a short trace's rounds with the early kernels (interpreted, or compiled ahead
    of time) and loads numba's once they have cost their budget; a run that switches midway, one on the early
    kernels throughout and one on numba's from the first round serve alike (records and counters), in the
    engine and behind a front end."""
    from prism.calibration.cost_model import load_profile
    from prism.policies import qas_compiled
    from prism.settings import EngineConfig, RunSpec
    from prism.sim.run import simulate
    from prism.traces.spec import load_trace

    trace = load_trace("zipf", {"num_requests": 300, "qps": 70})
    # 16 running slots: the front end holds a backlog, so that rounds of several requests (the kernels'; a round of
    # one runs without them) come in both deployments: 18-26 of them
    engine = EngineConfig(max_total_tokens=32768, max_running_requests=16)
    early = early_kernels(early_name)
    calls = counted_kernels(monkeypatch, early)

    def run(window_s, budget_s):
        monkeypatch.setattr(qas_compiled, "EARLY_BUDGET_S", budget_s)
        calls.clear()
        res = simulate(RunSpec.build(trace, "qas", "dart", engine=engine, knobs={"qas": {"window_s": window_s}},
                                     profile=load_profile()))
        return res, dict(calls)

    for window_s in (0.0, 0.05):
        compiled, used = run(window_s, 0)
        assert used.get("early", 0) == 0 and used["numba"] > 0
        interpreted, used = run(window_s, 10**9)
        assert used.get("numba", 0) == 0 and used["early"] > 0
        switched, used = run(window_s, 10 * early.round_s)  # about 10 rounds: a run has more
        assert used["early"] > 0 and used["numba"] > 0, used
        for res in (interpreted, switched):
            assert res.records == compiled.records and res.counters == compiled.counters


def test_rounds_of_one_request_spend_almost_none_of_the_early_budget(monkeypatch):
    """Below the knee a backlog front end makes a QAS round of each arrival, one request each, and they call a
    kernel almost never (a dispatch that cannot publish in Python: the first), so how many requests a run has says
    little of its kernel rounds: a run of any length starts with the early kernels and loads numba's only once its
    kernel rounds have spent the budget; a live server (no requests) takes numba's at once."""
    from prism.calibration.cost_model import load_profile
    from prism.counters import FRONTEND_PASSED, QAS_ROUNDS
    from prism.policies import qas_compiled
    from prism.settings import RunSpec
    from prism.sim.run import simulate
    from prism.traces.spec import load_trace

    calls = counted_kernels(monkeypatch, qas_compiled.early_kernels())
    res = simulate(RunSpec.build(load_trace("prefix20", {"num_requests": 400}), "qas", "dart",
                                 profile=load_profile()))
    assert res.counters[FRONTEND_PASSED] == res.counters[QAS_ROUNDS] == 400  # each arrival its own round
    assert calls["numba"] == 0 and calls["early"] <= 1, calls

    for n in (1, 2_048, 1_000_000):
        qas = CompiledQAS.build(None, DemandHints(), range(n))
        assert qas.early is qas_compiled.early_kernels() and qas.early_budget_s == qas_compiled.EARLY_BUDGET_S
    assert CompiledQAS.build(None, DemandHints(), []).early_budget_s == 0


def test_the_ahead_of_time_kernels_are_built_where_there_is_a_c_compiler(monkeypatch, tmp_path):
    """The install compiles QAS's kernels ahead of time (setup.py) wherever it can: with a C compiler the
    extension for the current kernel source is there, and once the kernels change it is no longer loaded."""
    import shutil
    import sysconfig

    from prism.policies import qas_aot

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the install leaves the kernels to numba's JIT")
    assert qas_aot.load() is not None, f"reinstall (pip install -e .): {qas_aot.module_name()} is not built"
    assert set(vars(qas_aot.load())) == set(qas_aot.ENTRY_POINTS)
    edited = tmp_path / "qas_round.py"  # the kernels with one line more: a stale extension
    edited.write_bytes(qas_aot.KERNELS_SOURCE.read_bytes() + b"\n# edited\n")
    monkeypatch.setattr(qas_aot, "KERNELS_SOURCE", edited)
    assert qas_aot.load() is None
