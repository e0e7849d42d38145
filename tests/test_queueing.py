"""The queueing model against closed forms, Theorem 1 on random grids, and prism-theory end to end."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from scipy import integrate
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PRIV, make_trace
from prism.calibration.cost_model import CostModel, load_profile
from prism.cli.theory import main as theory_main
from prism.models_queueing.model import (EngineQueue, brownian_max_mean, brownian_max_sf, fluid_wait,
                                         fluid_wait_quantile, mg1_wait, mg1_wait_quantile, rate_ratio, replay_wait,
                                         service_rate, theorem1, theorem1_grid)
from prism.settings import EngineConfig, RunSpec
from prism.sim.run import simulate


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
    # the theorem's statement itself, not the function's verdict: the service rate orders as the hit rate does
    assert (mu1 >= mu0) == (h1 >= h0) and (mu1 == mu0) == (h1 == h0)
    if ov == 0:
        assert mu1 / mu0 == pytest.approx(rate_ratio(h0, h1), rel=1e-12)


def test_theorem1_equality_case_is_exact():
    for h in (0.0, 0.3, 0.9):
        mu0, mu1, holds = theorem1(h, h, 32, 768, 21000, 0.5)
        assert mu0 == mu1 and holds
        lower = theorem1(h, h + 0.05, 32, 768, 21000, 0.5)  # a higher hit rate: a strictly higher service rate
        assert lower[1] > lower[0] and lower[2]
    grid = theorem1_grid([0, 0.25, 0.5, 0.75], [1, 16, 64], [128, 768], [1e3, 2e4], [0.0, 0.2])
    assert grid["holds"] == grid["cases"] == 4 * 4 * 3 * 2 * 2 * 2
    assert grid["ratio_matches"] == grid["cases"] // 2


def test_engine_queue_consistency():
    cost = CostModel(a_p=0.003, b_p=5e-5, d_p=4e-6, c_p=5e-9, a_d=0.001, w_d=0.005, b_d=5e-5, c_d=9e-8,
                     first_token_s=0.0005)
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
    # a decode step of the wave is the larger of its memory and compute bounds
    step = 0.001 + max(0.005 + 9e-8 * 40 * (768 + 16), 5e-5 * 40)
    assert q0.wave_overhead() == pytest.approx(0.003 * max(1, 40 * 768 * 0.8 / 8192) + 4e-6 * 40 + 31 * step)
    # without a replay size the wait past the knee is infinite; with one it is the replay's transient
    lam = 1.5 * q0.service_rate()
    assert math.isinf(q0.ttft(lam))
    q0.requests = 1000
    assert q0.transient(lam) and not q0.transient(0.9 * q0.service_rate())
    es, es2 = q0.moments()
    assert q0.wait(lam) == replay_wait(lam, es, es2, 1000)
    assert q0.ttft(lam, 0.99) == pytest.approx(replay_wait(lam, es, es2, 1000, 0.99) + q0.own_prefill() + 0.0005)
    assert q0.wait(lam) == pytest.approx(fluid_wait(lam, q0.service_rate(), 1000), rel=0.01)  # well past the knee
    low = 0.3 * q0.service_rate()  # at low load: the P-K mean (the replay, started empty, just below it) and atom
    assert q0.wait(low) == pytest.approx(mg1_wait(low, es, es2), rel=0.01) and q0.wait(low, 0.5) == 0.0


def test_brownian_replay_closed_forms():
    """The diffusion's limits: at the knee the mean running maximum of σ·B over [0, t] is σ√(2t/π), so the
    mean over arrivals spread evenly on [0, T] is (2/3)·σ·√(2T/π); well past it, the fluid plus σ²/(2(ρ−1));
    below it over a long replay, the P-K mean λE[S²]/(2(1−ρ)). The tail probability integrates to the mean."""
    d, n = 0.02, 4000
    lam = 1 / d
    sigma = math.sqrt(lam * d * d)
    assert replay_wait(lam, d, d * d, n) == pytest.approx(2 / 3 * sigma * math.sqrt(2 * n / lam / math.pi), rel=0.01)
    lam = 2 / d
    assert replay_wait(lam, d, d * d, n) == pytest.approx(fluid_wait(lam, 1 / d, n) + lam * d * d / 2, rel=0.002)
    lam = 0.5 / d
    assert replay_wait(lam, d, d * d, 100_000) == pytest.approx(mg1_wait(lam, d, d * d), rel=0.01)
    for drift in (-0.4, 0.0, 0.7):
        mean = brownian_max_mean(drift, 1.3, np.array([2.5]))[0]
        area, _ = integrate.quad(lambda x: brownian_max_sf(x, drift, 1.3, np.array([2.5]))[0], 0, np.inf)
        assert area == pytest.approx(mean, rel=1e-6)


# ---------------------------------------------------------------- past the knee: the fluid transient
L_MD1 = 512  # every request: 512 fresh tokens, one output token (its first, from the prefill), no reuse


def _md1(arrivals):
    """One request at a time (max_running_requests = 1), FIFO: a single server whose service time is one
    prefill of L_MD1 new tokens, the same for every request. Returns the admission waits and μ."""
    profile = load_profile()
    trace = make_trace([(float(t), [(PRIV, f"p{i}", L_MD1)], 1) for i, t in enumerate(arrivals)])
    res = simulate(RunSpec.build(trace, "fcfs", "lru", engine=EngineConfig(max_running_requests=1),
                                 profile=profile))
    waits = np.array([r.prefill_start - r.arrival for r in sorted(res.records, key=lambda r: r.id)])
    q = EngineQueue(profile.cost, np.full(len(arrivals), float(L_MD1)), 1, 0.0, 1, requests=len(arrivals))
    return waits, q


def _lindley(arrivals: np.ndarray, d: float) -> np.ndarray:
    """FIFO single-server waits with service d (rows: independent replays): W_i = max(0, W_(i−1) + d − gap)."""
    waits = np.zeros(arrivals.shape)
    for i in range(1, arrivals.shape[-1]):
        waits[..., i] = np.maximum(0.0, waits[..., i - 1] + d - (arrivals[..., i] - arrivals[..., i - 1]))
    return waits


def test_fluid_closed_form_on_evenly_spaced_arrivals():
    """D/D/1 past the knee: request i arrives at i/λ and starts at i·D, so it waits exactly i·(D − 1/λ); the
    mean of N is (N−1)·(D − 1/λ)/2 and the fluid's N·(1/μ − 1/λ)/2 differs only by N/(N−1)."""
    n = 500
    _, q = _md1([0.0])
    mu = q.service_rate()
    assert 1 / mu == pytest.approx(load_profile().cost.prefill_time([L_MD1], [0]), rel=1e-12)  # μ from the cost model
    for rho in (1.25, 2.0):
        lam = rho * mu
        waits, q = _md1(np.arange(n) / lam)
        exact = np.arange(n) * (1 / mu - 1 / lam)
        assert waits == pytest.approx(exact, abs=1e-9)
        assert fluid_wait(lam, mu, n) == pytest.approx(waits.mean() * n / (n - 1), rel=1e-9)
        for p in (0.5, 0.99):
            assert fluid_wait_quantile(lam, mu, n, p) == pytest.approx(np.quantile(waits, p) * n / (n - 1), rel=1e-9)


@pytest.mark.parametrize("rho", [1.5, 2.0])
def test_fluid_model_against_simulation_md1(rho):
    """M/D/1 past the knee: Poisson arrivals at λ = ρμ, N = 2,000 identical requests. Request i waits about
    i·D − t_i (the queue, once formed, never empties), so the mean wait's error from the fluid's is the mean of
    i/λ − t_i, whose standard deviation is √(N/3)/λ: relative to the fluid's mean, 2/(√(3N)·(ρ − 1)) = 5.2% at
    ρ = 1.5 and 2.6% at ρ = 2. The test allows three of those, plus 2% for the early spells in which the queue
    can still empty (they only lengthen waits). P99 comes from the last arrivals and is tighter."""
    n = 2000
    _, q = _md1([0.0])
    lam = rho * q.service_rate()
    rng = np.random.default_rng(11)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / lam, n - 1))])
    waits, q = _md1(arrivals)
    assert waits == pytest.approx(_lindley(arrivals, 1 / q.service_rate()), abs=1e-9)  # the simulator is that queue
    sd = 2 / (math.sqrt(3 * n) * (rho - 1))
    for model in (fluid_wait(lam, q.service_rate(), n), q.wait(lam)):  # the fluid and its diffusion refinement
        assert waits.mean() == pytest.approx(model, rel=3 * sd + 0.02)
    for model in (fluid_wait_quantile(lam, q.service_rate(), n, 0.99), q.wait(lam, 0.99)):
        assert np.quantile(waits, 0.99) == pytest.approx(model, rel=3 * sd + 0.02)


@pytest.mark.parametrize("rho", [0.95, 1.0, 1.1])
def test_replay_wait_near_the_knee(rho):
    """Near the knee a single replay's mean wait scatters widely (coefficient of variation about 0.6), so the
    reference is the same M/D/1 queue as the simulator (Lindley's recursion, which the test above shows it is)
    over 2,000 replays of 1,000 requests: the diffusion must match their mean within 3 standard errors plus 4%
    (the Brownian limit ignores the queue's whole D-sized jumps, an error of order D on waits of about 17·D).
    The fluid alone predicts no wait at all at ρ ≤ 1."""
    n, d = 1000, 1.0
    rng = np.random.default_rng(5)
    gaps = rng.exponential(d / rho, (2000, n - 1))
    per_replay = _lindley(np.concatenate([np.zeros((2000, 1)), np.cumsum(gaps, axis=1)], axis=1), d).mean(axis=1)
    se = per_replay.std(ddof=1) / math.sqrt(len(per_replay))
    model = replay_wait(rho / d, d, d * d, n)
    assert model == pytest.approx(per_replay.mean(), abs=3 * se + 0.04 * per_replay.mean())
    if rho <= 1:
        assert fluid_wait(rho / d, 1 / d, n) == 0.0


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
    # at 60 QPS both see overload: past the knee the model predicts the replay's transient (finite), and its
    # mean TTFT is within 20% of the simulation's
    assert float(high["rho_model"]) > 1 and high["regime"] == "past knee" and low["regime"] == "below knee"
    assert math.isfinite(float(high["ttft_p99_model"]))
    assert float(high["ttft_mean_model"]) == pytest.approx(float(high["ttft_mean_sim"]), rel=0.2)
    # every row names exactly the figures whose relative error exceeds 20%
    for r in rows:
        names = ("throughput", "ttft_mean", "ttft_p50", "ttft_p99")
        assert r["departs"] == ",".join(n for n in names if float(r[f"{n}_rel_err"]) > 0.2)
    assert (out / "theory.png").stat().st_size > 1000
    assert "model knee" in capsys.readouterr().out


def test_theory_outputs_of_earlier_runs_go_before_new_runs_start(tmp_path, capsys, monkeypatch):
    """theory.csv/json/png compare the runs of the folder; a rerun of other settings (--force) that stops
    before its own comparison must not leave the earlier one beside its runs."""
    from prism.sim.sweep import Sweep

    out = tmp_path / "th"
    argv = ["--trace", "zipf", "--method", "sglang", "--qps", "10", "--out", str(out), "--workers", "1"]
    assert theory_main([*argv, "--set", "trace.num_requests=50"]) == 0
    assert {p.name for p in out.glob("theory.*")} == {"theory.csv", "theory.json", "theory.png"}

    def interrupted(self, on_done=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Sweep, "run", interrupted)
    assert theory_main([*argv, "--set", "trace.num_requests=60", "--force"]) == 130
    assert not list(out.glob("theory.*"))
