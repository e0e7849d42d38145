"""QAS as an admission front end (qas.window_s > 0) before an FCFS engine: holding each window's arrivals, or
holding the backlog (DESIGN §3), checked on the records of whole runs."""

from __future__ import annotations

import pytest

from prism.calibration.cost_model import load_profile
from prism.settings import EngineConfig, RunSpec
from prism.sim.run import simulate
from prism.traces.spec import generate
from prism.traces.zipf import ZipfHotspotSpec

WINDOW = 0.05


def _run(trace, scheduler, eviction="dart", engine=None, **qas):
    knobs = {"qas": {"window_s": WINDOW, **qas}} if scheduler == "qas" else None
    return simulate(RunSpec.build(trace, scheduler, eviction, engine=engine or EngineConfig(),
                                  profile=load_profile(), knobs=knobs))


@pytest.fixture(scope="module")
def runs():
    trace = generate(ZipfHotspotSpec(num_requests=400, qps=20.0, seed=9))
    return (trace, _run(trace, "qas", front_end="arrivals"), _run(trace, "fcfs"),
            _run(trace, "qas", front_end="backlog"))


def test_window_bounds_the_hold_and_every_request_finishes(runs):
    trace, front, _, _ = runs
    assert sorted(r.id for r in front.records) == [r.id for r in trace.requests]
    holds = [r.sent - r.arrival for r in front.records]
    assert min(holds) >= 0 and max(holds) <= WINDOW + 1e-9
    assert any(abs(h - WINDOW) < 1e-9 for h in holds), "a window's first request waits the whole window"
    # requests of one window reach the engine together
    assert len({round(r.sent, 9) for r in front.records}) == front.counters["frontend_windows"]
    for r in front.records:
        assert r.ttft == pytest.approx(r.w_admit + r.t_prefill + r.t_1tok)


def test_front_end_aligns_prompts_and_raises_the_hit_rate(runs):
    _, front, fcfs, backlog = runs
    for run in (front, backlog):
        assert run.counters["front_alignment_moves"] > 100
        assert run.summary["hit_rate"] > fcfs.summary["hit_rate"] + 0.05
    assert front.counters["qas_rounds"] == front.counters["frontend_windows"]


def test_below_the_knee_the_backlog_front_end_adds_no_wait(runs):
    """At 20 QPS the engine always has room: every arrival goes at once, after a round of its own."""
    trace, _, _, backlog = runs
    assert all(r.sent == r.arrival for r in backlog.records)
    c = backlog.counters
    assert c["frontend_passed"] == len(trace.requests) == c["qas_rounds"]
    assert c.get("frontend_held", 0) == 0 and c.get("frontend_windows", 0) == 0


LIMIT, Q_COLD = 12, 2


@pytest.fixture(scope="module")
def limited():
    """Past the knee under a concurrency limit: the front end holds a backlog, released window by window."""
    trace = generate(ZipfHotspotSpec(num_requests=300, qps=90.0, seed=4))
    engine = EngineConfig(max_concurrency=LIMIT)
    return (trace, _run(trace, "qas", engine=engine, front_end="backlog", q_cold=Q_COLD),
            _run(trace, "fcfs", "lru", engine=engine))


def _in_engine(records, t: float) -> int:
    """Requests sent to the engine by ``t`` and not finished by then (a finish at t frees its slot first)."""
    return sum(r.sent <= t < r.finish for r in records)


def test_the_engine_never_holds_more_than_the_limit(limited):
    trace, backlog, fcfs = limited
    assert sorted(r.id for r in backlog.records) == [r.id for r in trace.requests]
    for run in (backlog, fcfs):  # the front end enforces the limit the client enforces for a plain engine
        assert max(_in_engine(run.records, r.sent) for r in run.records) == LIMIT
    held = [r for r in backlog.records if r.sent > r.arrival]
    assert len(held) > 100 and backlog.counters["frontend_held"] == len(held)
    assert backlog.counters["frontend_passed"] == len(trace.requests) - len(held)


def _others_held(recs, r) -> bool:
    """Whether another request was held in the front end when ``r`` arrived."""
    return any(o.sent > o.arrival and (o.arrival < r.arrival < o.sent or (o.arrival == r.arrival and o.id < r.id))
               for o in recs)


def test_an_arrival_is_held_only_when_the_engine_is_full_or_others_wait(limited):
    _, backlog, _ = limited
    recs = backlog.records
    for r in recs:
        full = sum(o.sent < r.arrival < o.finish or (o.sent == r.arrival and o.id < r.id) for o in recs) >= LIMIT
        assert (r.sent > r.arrival) == (_others_held(recs, r) or full), r.id


def test_each_release_happens_at_a_window_and_takes_the_cold_lane_first(limited):
    """Held requests leave only when a window closes (a whole number of windows after the arrival that opened
    the backlog), and every release of at least q_cold requests takes the q_cold oldest of those waiting."""
    _, backlog, _ = limited
    recs = backlog.records
    held = [r for r in recs if r.sent > r.arrival]
    openers = [r.arrival for r in held if not _others_held(recs, r)]
    releases = sorted({r.sent for r in held})
    assert len(releases) == backlog.counters["frontend_windows"] and len(openers) < len(releases)
    for t in releases:
        opened = max(a for a in openers if a < t)
        assert (t - opened) / WINDOW == pytest.approx(round((t - opened) / WINDOW), abs=1e-6)
        group = {r.id for r in held if r.sent == t}
        waiting = sorted((r for r in held if r.arrival <= t <= r.sent), key=lambda r: (r.arrival, r.id))
        if len(group) >= Q_COLD:
            assert {r.id for r in waiting[:Q_COLD]} <= group
    lanes = {r.lane for r in held}
    assert {"cold", "hot"} <= lanes


def test_holding_the_backlog_reorders_it(limited):
    """The release order is QAS's, not the arrival order: some request is released before an older one."""
    _, backlog, _ = limited
    held = sorted((r for r in backlog.records if r.sent > r.arrival), key=lambda r: (r.arrival, r.id))
    assert any(b.sent < a.sent for a, b in zip(held, held[1:]))
