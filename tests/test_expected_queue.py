"""The queue a scheduler expects at its next round (``policies/expected_queue.py``), and the schedulers that read
only what joined it since: whole runs serve as when every round takes the whole queue afresh."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.policies.contextpilot import ContextPilot
from prism.policies.expected_queue import ExpectedQueue
from prism.policies.klpm import KLPM


def test_what_joined_after_the_expected_queue():
    """An engine that does not say what it kept (``kept`` None): the queue is compared with the expected one."""
    q = ExpectedQueue()
    a, b, c, d, e = (object() for _ in range(5))
    assert q.joined([a, b], None) == [a, b]  # nothing expected yet: all of it joined
    q.expect([b, a, c])
    assert q.dispatched([b], None)
    assert q.joined([a, c, d, e], None) == [d, e]
    assert q.joined([a, c], None) == []
    assert q.joined([c, a, d], None) is None  # another order
    assert q.joined([a], None) is None  # one gone that was not admitted
    assert q.joined((a, c, d), None) is None  # not a list: taken afresh


def test_an_admission_that_is_not_the_expected_head_expects_nothing():
    q = ExpectedQueue()
    a, b, c = (object() for _ in range(3))
    q.expect([a, b, c])
    assert not q.dispatched([b], None)
    assert q.joined([a, c], None) is None
    q.expect([a, c])  # the next round's order starts it again
    assert q.dispatched([], None)
    assert q.joined([a, c, b], None) == [b]


def test_an_engine_that_says_what_it_kept_is_taken_at_its_word():
    """With ``kept`` the queue is not compared: the order handed may have lost its admitted head in place (the
    simulated engine does that to a plan whose order is its queue), and a count other than the expected one
    expects nothing."""
    q = ExpectedQueue()
    a, b, c, d = (object() for _ in range(4))
    assert q.joined([a, b], 0) == [a, b]
    order = [a, b, c]
    q.expect(order)
    del order[:1]  # the engine drops the admitted head of its own queue, then appends an arrival
    order.append(d)
    assert q.dispatched([a], 2)
    assert q.joined(order, 2) == [d]
    assert q.joined(order, 3) is None  # not the queue expected: taken afresh
    q.expect([b, c, d])
    assert q.joined([b, c, d], 3) == []  # no admission this round: the whole order is kept


@settings(max_examples=25, deadline=None)
@given(method=st.sampled_from(["contextpilot", "contextpilot-fcfs", "klpm"]), qps=st.sampled_from([40, 120, 400]),
       capacity=st.sampled_from([None, 6000, 20000]), seed=st.integers(0, 50),
       admission=st.sampled_from(["sglang", "full"]))
def test_a_round_that_reads_only_what_joined_serves_as_one_that_reads_the_whole_queue(method, qps, capacity, seed,
                                                                                    admission):
    """ContextPilot indexes, and k-LPM ranks, only the requests after the expected queue; with ``joined`` made to
    answer None every round (the whole queue taken afresh), whole runs serve alike (records and counters), past the
    knee and under eviction and retraction (a small pool with SGLang's admission)."""
    from prism.calibration.cost_model import load_profile
    from prism.settings import EngineConfig, RunSpec
    from prism.sim.run import simulate
    from prism.traces.spec import load_trace

    trace = load_trace("zipf", {"num_requests": 150, "qps": qps, "seed": seed})
    knobs = {"contextpilot": {"engine_order": "fcfs"}} if method == "contextpilot-fcfs" else None
    spec = RunSpec.build(trace, method.split("-")[0], "lru", engine=EngineConfig(max_total_tokens=capacity,
                         admission=admission), knobs=knobs, profile=load_profile())
    joined, read = ExpectedQueue.joined, []

    def reading(self, w, kept):
        out = joined(self, w, kept)
        read.append(out is not None)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ExpectedQueue, "joined", reading)
        incremental = simulate(spec)
        assert any(read), "no round read only what joined: the case tests nothing"
        read.clear()
        with pytest.MonkeyPatch.context() as unsaid:  # an engine that does not say what it kept (the live plugin):
            for cls in (KLPM, ContextPilot):  # each round compares its queue with the one expected
                for name in ("plan", "on_dispatch"):
                    unsaid.setattr(cls, name, lambda self, q, ctx, f=getattr(cls, name):
                                   f(self, q, replace(ctx, kept=None)))
            compared = simulate(spec)
        mp.setattr(ExpectedQueue, "joined", lambda self, w, kept: None)
        afresh = simulate(spec)
    assert incremental.records == afresh.records and incremental.counters == afresh.counters
    assert compared.records == afresh.records and compared.counters == afresh.counters
    assert method == "contextpilot-fcfs" or any(read), "no round compared its queue: the case tests nothing"
