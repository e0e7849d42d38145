"""Moore-Hodgson on TTFT deadlines (policies/moore_hodgson.py): optimal against every order, and the queue."""

from __future__ import annotations

import itertools
from math import inf
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.policies.base import SchedContext
from prism.policies.moore_hodgson import DeadlineOrder, DeadlineQueue, moore_hodgson, prefill_seconds


def on_time(order, deadlines, prefill, now=0.0):
    """Jobs served one after another from ``now`` in ``order`` that finish by their deadlines."""
    t, n = now, 0
    for i in order:
        t += prefill[i]
        n += t <= deadlines[i]
    return n


jobs = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), min_size=0, max_size=7)


@settings(max_examples=400, deadline=None)
@given(jobs=jobs, now=st.integers(0, 5))
def test_meets_as_many_deadlines_as_the_best_order(jobs, now):
    deadlines = [float(d) for d, _ in jobs]
    prefill = [float(e) for _, e in jobs]
    kept = moore_hodgson(deadlines, prefill, now)
    assert on_time(kept, deadlines, prefill, now) == len(kept)  # every request of S meets its deadline
    best = max((on_time(p, deadlines, prefill, now) for p in itertools.permutations(range(len(jobs)))), default=0)
    assert len(kept) == best
    assert kept == sorted(kept, key=lambda i: (deadlines[i], i))  # dispatched in deadline order


def test_algorithm_2_by_hand():
    """Deadlines 3, 4, 5, 6 with prefills 2, 2, 2, 1 from t = 0: a (0-2), b (2-4), c would end at 6 > 5 -> drop
    the longest in S (c, the later of equal 2 s), back to t = 4; d ends at 5 <= 6. S = a, b, d."""
    assert moore_hodgson([3, 4, 5, 6], [2, 2, 2, 1]) == [0, 1, 3]
    # earliest-deadline-first alone would miss two: a, b on time, c at 6 > 5, d at 7 > 6
    assert on_time([0, 1, 2, 3], [3, 4, 5, 6], [2, 2, 2, 1]) == 2


def test_queue_orders_on_time_requests_first_and_late_ones_after():
    q = DeadlineQueue()
    q.add("long", deadline_s=1.0, prefill_s=0.9)   # an 0.9 s prefill, due at 1.0
    q.add("s1", deadline_s=0.5, prefill_s=0.2)
    q.add("s2", deadline_s=0.6, prefill_s=0.2)
    on, late = q.schedule(now=0.0)
    assert on == ["s1", "s2"] and late == ["long"]  # long would push itself past 1.0 after s1, s2
    assert q.order(0.0) == ["s1", "s2", "long"]
    q.remove("s1")
    assert q.order(0.0) == ["s2", "long"] and len(q) == 2 and "s1" not in q
    q.remove("s2")  # alone, long now makes it
    assert q.schedule(0.0) == (["long"], [])
    # equal deadlines keep the order they came in
    q2 = DeadlineQueue()
    for k in ("x", "y", "z"):
        q2.add(k, 2.0, 0.1)
    assert q2.order(0.0) == ["x", "y", "z"]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.integers(0, 30), st.integers(0, 9)),
                    max_size=40))
def test_queue_holds_each_request_once(ops):
    q, live = DeadlineQueue(), {}
    for add, key, d, e in ops:
        if add and key not in q:
            q.add(key, float(d), float(e))
            live[key] = (d, e)
        elif not add and key in q:
            q.remove(key)
            del live[key]
    order = q.order(0.0)
    assert sorted(order) == sorted(live)
    keys = sorted(live)
    kept = moore_hodgson([live[k][0] for k in keys], [live[k][1] for k in keys])
    assert len(q.schedule(0.0)[0]) == len(kept)


def test_bad_entries():
    q = DeadlineQueue()
    q.add(1, 1.0, 0.1)
    with pytest.raises(ValueError, match="already queued"):
        q.add(1, 1.0, 0.1)
    with pytest.raises(ValueError, match="finite"):
        q.add(2, float("inf"), 0.1)
    with pytest.raises(ValueError, match="finite"):
        q.add(3, 1.0, -1.0)
    assert prefill_seconds(4096, 8192.0) == 0.5
    with pytest.raises(ValueError):
        prefill_seconds(10, 0.0)


def algorithm_2(deadlines, prefill, now=0.0):
    """The paper's Algorithm 2 word for word (module docstring): every job appended, the longest dropped on a miss;
    S in deadline order. The module's version passes over jobs that miss even alone."""
    order = sorted(range(len(deadlines)), key=lambda i: (deadlines[i], i))
    kept, t = [], now
    for i in order:
        kept.append(i)
        t += prefill[i]
        if t > deadlines[i]:
            longest = max(prefill[j] for j in kept)
            j = [j for j in kept if prefill[j] == longest][-1]  # the later of equal longest prefills
            kept.remove(j)
            t -= prefill[j]
    return kept


@settings(max_examples=500, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), max_size=12), now=st.integers(0, 20))
def test_passing_over_hopeless_jobs_is_algorithm_2(jobs, now):
    """A job that misses its deadline even alone is dropped by Algorithm 2 at once: passing over it gives the
    same S (integers: exact sums, so a counterexample could not hide in rounding)."""
    deadlines = [float(d) for d, _ in jobs]
    prefill = [float(e) for _, e in jobs]
    assert moore_hodgson(deadlines, prefill, float(now)) == algorithm_2(deadlines, prefill, float(now))


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 15), st.floats(0, 60), st.floats(0, 8)),
    st.tuples(st.just("remove"), st.integers(0, 15)),
    st.tuples(st.just("wait"), st.floats(0, 10))), max_size=60))
def test_queue_sets_aside_only_what_cannot_return(ops):
    """The queue, which sets aside for good the requests whose latest start has passed, orders as Algorithm 2 run
    afresh over every queued request at every instant; an engine's plan follows that order (the requests the
    queue does not hold last, oldest first)."""
    q, live, now = DeadlineQueue(), {}, 0.0
    for op in ops:
        if op[0] == "add" and op[1] not in q:
            q.add(op[1], now + op[2], op[3])
            live[op[1]] = (now + op[2], op[3])
        elif op[0] == "remove" and op[1] in q:
            q.remove(op[1])
            del live[op[1]]
        elif op[0] == "wait":
            now += op[1]
        keys = list(live)  # insertion order: the queue's tie-break among equal deadlines
        kept = [keys[i] for i in moore_hodgson([live[k][0] for k in keys], [live[k][1] for k in keys], now)]
        by_deadline = sorted(keys, key=lambda k: (live[k][0], keys.index(k)))
        assert q.schedule(now) == (kept, [k for k in by_deadline if k not in kept])
        assert q.first_deadline(keys[::2], now) == min([live[k][0] for k in keys[::2] if k in kept], default=inf)
    waiting = [SimpleNamespace(id=k, arrival=0.0) for k in reversed(list(live))]
    waiting += [SimpleNamespace(id=100 + i, arrival=float(-i)) for i in range(3)]  # not in the queue
    plan = DeadlineOrder(q).plan(waiting, SchedContext(now, None))
    assert [r.id for r in plan.order] == q.order(now) + [102, 101, 100]
