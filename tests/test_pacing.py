"""The paced twin's clock: budgets from the cost model, anchoring, overruns (no SGLang needed)."""

from __future__ import annotations

import time

import pytest

from prism.calibration.cost_model import CostModel
from prism.live.pacing import Pacer

COST = CostModel(a_p=0.003, b_p=2e-5, c_p=1e-9, a_d=0.006, w_d=0.002, b_d=1e-5, c_d=2e-8, name="t")


def test_budget_is_the_cost_model_times_the_dilation():
    p = Pacer(COST, dilation=4.0)
    assert p.budget(True, [100, 50], [0, 200], 0, 2) == pytest.approx(
        4 * (0.003 + 2e-5 * 150 + 1e-9 * (100 * 50 + 50 * (200 + 25))))
    # decode: the overhead plus the larger of reading weights and KV (2.06 ms) and computing 8 tokens (0.08 ms)
    assert p.budget(False, (), (), 3000, 8) == pytest.approx(4 * (0.006 + max(0.002 + 2e-8 * 3000, 1e-5 * 8)))


def test_back_to_back_batches_anchor_on_the_previous_target_end_and_idle_ones_on_their_iteration():
    p = Pacer(COST, dilation=1.0)
    t0 = time.monotonic()
    end = p.finish(p.start(t0, after_idle=True, iteration_start=t0), 0.01)
    assert end == pytest.approx(t0 + 0.01) and time.monotonic() >= end
    # the scheduler's own CPU time between batches (here 3 ms) is absorbed by the next budget
    time.sleep(0.003)
    assert p.start(time.monotonic(), after_idle=False, iteration_start=time.monotonic()) == end
    # after an idle spell the budget runs from the iteration that picked the work up
    later = time.monotonic() + 5.0
    assert p.start(later, after_idle=True, iteration_start=later - 0.001) == later - 0.001


def test_an_overrun_is_counted_and_the_batch_ends_when_it_ends():
    p = Pacer(COST, dilation=1.0)
    t0 = time.monotonic() - 0.05  # the budget ran out 40 ms ago
    end = p.finish(t0, 0.01)
    assert p.counters["paced_over_budget"] == 1 and p.overrun_s >= 0.04
    assert end >= t0 + 0.05
    p.finish(time.monotonic(), 0.002)
    assert p.counters["paced_over_budget"] == 1 and p.overrun_s == 0.0 and p.counters["paced_batches"] == 2
    p.reset()
    assert p.max_overrun_s == 0.0


def test_a_non_positive_dilation_is_refused():
    with pytest.raises(ValueError):
        Pacer(COST, dilation=0.0)
