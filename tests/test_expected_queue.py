"""The queue a scheduler expects at its next round (``policies/expected_queue.py``), and the schedulers that read
only what joined it since: whole runs serve as when every round takes the whole queue afresh."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.policies.expected_queue import ExpectedQueue


def test_what_joined_after_the_expected_queue():
    q = ExpectedQueue()
    a, b, c, d, e = (object() for _ in range(5))
    assert q.joined([a, b]) == [a, b]  # nothing expected yet: all of it joined
    q.expect([b, a, c])
    assert q.dispatched([b])
    assert q.joined([a, c, d, e]) == [d, e]
    assert q.joined([a, c]) == []
    assert q.joined([c, a, d]) is None  # another order
    assert q.joined([a]) is None  # one gone that was not admitted
    assert q.joined((a, c, d)) is None  # not a list: taken afresh


def test_an_admission_that_is_not_the_expected_head_expects_nothing():
    q = ExpectedQueue()
    a, b, c = (object() for _ in range(3))
    q.expect([a, b, c])
    assert not q.dispatched([b])
    assert q.joined([a, c]) is None
    q.expect([a, c])  # the next round's order starts it again
    assert q.dispatched([])
    assert q.joined([a, c, b]) == [b]


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
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ExpectedQueue, "joined", lambda self, w: (j := joined(self, w), read.append(j is not None))[0])
        incremental = simulate(spec)
        mp.setattr(ExpectedQueue, "joined", lambda self, w: None)
        afresh = simulate(spec)
    assert incremental.records == afresh.records and incremental.counters == afresh.counters
    assert any(read), "no round read only what joined: the case tests nothing"
