"""The queueing model against closed forms, Theorem 1 on random grids, and prism-theory end to end."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.calibration.cost_model import CostModel
from prism.cli.theory import main as theory_main
from prism.models_queueing.model import (EngineQueue, mg1_wait, mg1_wait_quantile, rate_ratio, service_rate,
                                         theorem1, theorem1_grid)


@pytest.mark.parametrize("lam,mu", [(0.5, 1.0), (3.0, 4.0), (9.0, 10.0)])
def test_mg1_reduces_to_mm1(lam, mu):
    es, es2 = 1 / mu, 2 / mu**2  # exponential service
    rho = lam / mu
    assert mg1_wait(lam, es, es2) == pytest.approx(rho / (mu - lam))  # M/M/1: Wq = ρ/(μ−λ)
    # M/M/1 waiting time: P(W > t) = ρ e^{−(μ−λ)t}, exactly the atom-plus-exponential form
    for q in (0.5, 0.9, 0.99):
        expected = 0.0 if q <= 1 - rho else -math.log((1 - q) / rho) / (mu - lam)
        assert mg1_wait_quantile(lam, es, es2, q) == pytest.approx(expected)


@pytest.mark.parametrize("lam,d", [(0.5, 1.0), (0.2, 4.0)])
def test_mg1_reduces_to_md1(lam, d):
    rho = lam * d
    assert mg1_wait(lam, d, d * d) == pytest.approx(rho * d / (2 * (1 - rho)))  # M/D/1


def test_unstable_queue_waits_forever():
    assert math.isinf(mg1_wait(2.0, 0.5, 0.5))
    assert math.isinf(mg1_wait_quantile(3.0, 0.5, 0.5, 0.5))


# hit rates on a 1e-4 grid: in floating point, 1 - h cannot resolve differences of 1e-17 (the theorem is
# about real numbers; a measured hit rate has finite precision anyway)
unit = st.integers(0, 9500).map(lambda x: x / 10_000)
pos = st.floats(0.1, 1e4, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(h0=unit, h1=unit, m=st.floats(1, 256), length=pos, r=pos, ov=st.floats(0, 10))
def test_theorem1_on_random_points(h0, h1, m, length, r, ov):
    mu0, mu1, holds = theorem1(h0, h1, m, length, r, ov)
    assert holds
    if ov == 0:
        assert mu1 / mu0 == pytest.approx(rate_ratio(h0, h1), rel=1e-12)


def test_theorem1_equality_case_is_exact():
    for h in (0.0, 0.3, 0.9):
        mu0, mu1, holds = theorem1(h, h, 32, 768, 21000, 0.5)
        assert mu0 == mu1 and holds
    grid = theorem1_grid([0, 0.25, 0.5, 0.75], [1, 16, 64], [128, 768], [1e3, 2e4], [0.0, 0.2])
    assert grid["holds"] == grid["cases"] == 4 * 4 * 3 * 2 * 2 * 2
    assert grid["ratio_matches"] == grid["cases"] // 2


def test_engine_queue_consistency():
    cost = CostModel(a_p=0.003, b_p=5e-5, c_p=5e-9, a_d=0.006, b_d=9e-5, c_d=9e-8, first_token_s=0.0005)
    lengths = np.full(1000, 768.0)
    q0 = EngineQueue(cost, lengths, 32, 0.2, 40)
    q1 = EngineQueue(cost, lengths, 32, 0.5, 40)
    assert q1.service_rate() > q0.service_rate()  # Theorem 1 through the engine model
    es, _ = q0.moments()
    assert q0.service_rate() == pytest.approx(1 / es)
    # the service rate equals M̄ / S_wave with the wave model's pieces
    s_wave = 40 * 768 * 0.8 / q0.prefill_rate() + q0.wave_overhead()
    assert q0.service_rate() == pytest.approx(service_rate(40, 768, 0.2, q0.prefill_rate(), q0.wave_overhead()))
    assert q0.service_rate() == pytest.approx(40 / s_wave)
    assert q0.ttft(0.0) == pytest.approx(q0.own_prefill() + 0.0005)
    assert q0.ttft(0.9 * q0.service_rate(), 0.99) > q0.ttft(0.5 * q0.service_rate(), 0.99)


def test_prism_theory_end_to_end(tmp_path, capsys):
    out = tmp_path / "th"
    assert theory_main(["--trace", "zipf", "--method", "sglang", "--qps", "5,10,60",
                        "--set", "trace.num_requests=300", "--out", str(out), "--workers", "1"]) == 0
    rows = list(csv.DictReader((out / "theory.csv").open()))
    assert [float(r["qps"]) for r in rows] == [5, 10, 60]
    low, high = rows[0], rows[-1]
    # at low load the model's throughput is the offered load, and the simulation agrees within 20%
    assert float(low["throughput_model"]) == pytest.approx(5.0)
    assert float(low["throughput_sim"]) == pytest.approx(5.0, rel=0.2)
    # at 60 QPS both see overload: the model's utilisation exceeds 1 and it flags the TTFT departure
    assert float(high["rho_model"]) > 1 and "ttft_p99" in high["departs"]
    assert (out / "theory.png").stat().st_size > 1000
    assert "model knee" in capsys.readouterr().out
