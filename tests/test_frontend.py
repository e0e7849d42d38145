"""QAS as an admission front end (qas.window_s > 0) before an FCFS engine."""

from __future__ import annotations

import pytest

from prism.calibration.cost_model import load_profile
from prism.settings import EngineConfig, RunSpec
from prism.sim.run import simulate
from prism.traces.spec import generate
from prism.traces.zipf import ZipfHotspotSpec


@pytest.fixture(scope="module")
def runs():
    trace = generate(ZipfHotspotSpec(num_requests=400, qps=20.0, seed=9))
    profile = load_profile()
    cfg = EngineConfig()
    front = simulate(RunSpec.build(trace, "qas", "dart", engine=cfg, profile=profile,
                                   knobs={"qas": {"window_s": 0.05}}))
    fcfs = simulate(RunSpec.build(trace, "fcfs", "dart", engine=cfg, profile=profile))
    return trace, front, fcfs


def test_window_bounds_the_hold_and_every_request_finishes(runs):
    trace, front, _ = runs
    assert sorted(r.id for r in front.records) == [r.id for r in trace.requests]
    holds = [r.sent - r.arrival for r in front.records]
    assert min(holds) >= 0 and max(holds) <= 0.05 + 1e-9
    assert any(abs(h - 0.05) < 1e-9 for h in holds), "a window's first request waits the whole window"
    # requests of one window reach the engine together
    assert len({round(r.sent, 9) for r in front.records}) == front.counters["frontend_windows"]
    for r in front.records:
        assert r.ttft == pytest.approx(r.w_admit + r.t_prefill + r.t_1tok)


def test_front_end_aligns_prompts_and_raises_the_hit_rate(runs):
    _, front, fcfs = runs
    assert front.counters["front_alignment_moves"] > 100
    assert front.summary["hit_rate"] > fcfs.summary["hit_rate"] + 0.05
    assert front.counters["qas_rounds"] == front.counters["frontend_windows"]
