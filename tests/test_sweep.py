"""Sweeps: parallel runs, incremental CSV, confidence intervals, plots, resume; determinism across processes."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from prism.cli.sim import main as sim_main
from prism.settings import settings_from
from prism.sim.run import simulate
from prism.sim.sweep import aggregate, belady_hit_rate


def test_sweep_end_to_end(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", "--trace", "zipf", "--methods", "sglang,prism,qas+lru", "--qps", "20,40", "--seeds", "2",
            "--set", "trace.num_requests=120", "--workers", "2", "--out", str(out), "--no-progress"]
    assert sim_main(argv) == 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert len(rows) == 3 * 2 * 2
    assert {r["method"] for r in rows} == {"sglang", "prism", "qas+lru"}
    assert all(float(r["belady_hit_rate"]) >= 0 for r in rows)
    agg = list(csv.DictReader((out / "aggregate.csv").open()))
    assert len(agg) == 6 and all(r["seeds"] == "2" for r in agg)
    for name in ("ttft_p99_vs_qps.png", "ttft_p50_vs_qps.png", "hit_rate_vs_qps.png", "ttft_cdf_qps40.png"):
        assert (out / name).stat().st_size > 1000
    run = out / "runs" / "prism" / "qps40-seed1" / "summary.json"
    first = json.loads(run.read_text())
    assert first["seed"] == 1 and first["scheduler"] == "qas" and first["eviction"] == "dart"
    # a rerun reuses finished runs (same digest) instead of simulating them again
    assert sim_main(argv) == 0
    assert json.loads(run.read_text())["wall_s"] == first["wall_s"]
    assert "prism" in capsys.readouterr().out


def test_plots_drawn_in_parallel_are_the_serial_ones(tmp_path):
    """A sweep on several workers draws its plots in several processes: the same files, byte for byte."""
    pngs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        assert sim_main(["sweep", "--trace", "zipf", "--methods", "sglang,prism", "--qps", "20,40",
                         "--set", "trace.num_requests=60", "--workers", str(workers), "--out", str(out),
                         "--no-progress"]) == 0
        pngs[workers] = {p.name: p.read_bytes() for p in out.glob("*.png")}
    assert sorted(pngs[1]) == ["hit_rate_vs_qps.png", "ttft_cdf_qps40.png", "ttft_p50_vs_qps.png",
                               "ttft_p99_vs_qps.png"]
    assert pngs[1] == pngs[2]


@pytest.mark.parametrize("method,knobs", [
    ("fcfs", {}), ("sglang", {}), ("klpm", {}), ("contextpilot", {}), ("dfs_weight", {}), ("prism", {}),
    ("prism", {"qas": {"window_s": 0}}), ("qas+lfu", {}),
])
@pytest.mark.parametrize("pool", [None, 6000])
def test_the_sweeps_belady_reference_is_the_belady_simulation(method, knobs, pool):
    # a run that evicted nothing takes its own hit rate as Belady's (no second simulation): the eviction policy
    # only chooses victims, so the Belady run is the same run; with eviction the reference is simulated
    data = {"method": method, "engine": {"max_total_tokens": pool}, "trace": {"num_requests": 300, "qps": 70},
            **knobs}
    spec = settings_from(data).resolve("zipf")
    run = simulate(spec).summary
    full = simulate(dataclasses.replace(spec, eviction="belady", label="belady"))
    assert (run["counters"].get("evicted_nodes", 0) == 0) == (pool is None)
    assert full.summary["hit_rate"] == belady_hit_rate(spec, run)
    if pool is None:  # not only the hit rate: every request is served at the same times with the same hits
        assert [dataclasses.astuple(r) for r in full.records] == [dataclasses.astuple(r) for r in simulate(spec).records]


def test_aggregate_confidence_interval():
    rows = [{"method": "m", "qps": 10, "ttft_p50_s": v, "ttft_mean_s": v, "ttft_p99_s": v, "hit_rate": v,
             "belady_hit_rate": v, "infinite_cache_hit_rate": v, "throughput_rps": v} for v in (1.0, 2.0, 3.0)]
    (a,) = aggregate(rows)
    assert a["hit_rate"] == pytest.approx(2.0)
    # t(0.975, 2) = 4.3027; s = 1; half width = 4.3027 / sqrt(3)
    assert a["hit_rate_ci95"] == pytest.approx(4.302652729 / 3 ** 0.5, rel=1e-6)


def test_bad_sweep_arguments(capsys):
    assert sim_main(["sweep", "--trace", "zipf", "--qps", "10,-1"]) == 2
    assert "--qps" in capsys.readouterr().err
    assert sim_main(["sweep", "--trace", "zipf", "--methods", "sglang,nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["prism", "contextpilot"])
def test_byte_identical_across_hash_seeds(tmp_path, method):
    """Set and dict orders must not leak into results: two processes with different hash seeds agree."""
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-m", "prism.cli.sim", "--trace", "zipf", "--method", method,
                        "--set", "trace.num_requests=300", "--qps", "40", "--out", str(out), "--no-progress"],
                       check=True, env=env, capture_output=True)
        s = json.loads((out / "summary.json").read_text())
        s.pop("wall_s")
        outs.append(((out / "requests.csv").read_bytes(), s))
    assert outs[0] == outs[1]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_sweeps_runs_are_the_standalone_runs(tmp_path, capsys, workers):
    # one process (or a pool's workers, which write their own run folders) runs every method at two rates in a
    # row (and each run's Belady reference): each run's requests.csv is the bytes prism-sim writes for it alone
    out = tmp_path / "sw"
    methods = ["prism", "contextpilot", "sglang", "klpm"]
    assert sim_main(["sweep", "--trace", "zipf", "--methods", ",".join(methods), "--qps", "30,60", "--seeds", "2",
                     "--set", "trace.num_requests=200", "--workers", workers, "--out", str(out),
                     "--no-progress"]) == 0
    assert {p.name for p in (out / "runs").glob("*/*/*")} == {"requests.csv", "summary.json"}  # nothing stale
    for method in methods:
        for qps in (30, 60):
            alone = tmp_path / f"{method}-{qps}"
            assert sim_main(["--trace", "zipf", "--method", method, "--qps", str(qps), "--seed", "1",
                             "--set", "trace.num_requests=200", "--out", str(alone), "--no-progress"]) == 0
            swept = out / "runs" / method / f"qps{qps}-seed1"
            assert (swept / "requests.csv").read_bytes() == (alone / "requests.csv").read_bytes(), (method, qps)
            assert (json.loads((swept / "summary.json").read_text())["infinite_cache_hit_rate"]
                    == json.loads((alone / "summary.json").read_text())["infinite_cache_hit_rate"])
    capsys.readouterr()


def test_plots_of_many_series_keep_them_apart_and_lay_out(tmp_path):
    """A cluster sweep's 32 series (4 methods x 4 routers x 2 sizes, the README's tour) get 32 different
    looks, and every plot lays out without matplotlib's warning (its one-column legend had not fit)."""
    import warnings

    from prism.sim.plots import _styles, plot_sweep

    series = [f"{m}@{r}x{n}" for m in ("sglang", "klpm", "contextpilot", "prism")
              for n in (4, 8) for r in ("rr", "least_load", "cache_aware", "lmetric")]
    agg = [{"series": s, "method": s.split("@")[0], "qps": q, "ttft_p99_s": 0.1 + i / 100, "ttft_p50_s": 0.05,
            "hit_rate": 0.3, "belady_hit_rate": 0.31, "served_infinite_cache_hit_rate": 0.35,
            "infinite_cache_hit_rate": 0.3, "imbalance": 1.1}
           for i, s in enumerate(series) for q in (40.0, 60.0)]
    looks = _styles(agg)
    assert len(set(looks.values())) == len(series) == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = plot_sweep(tmp_path, agg, None)
    assert sorted(p.name for p in paths) == ["hit_rate_vs_qps.png", "imbalance_vs_qps.png", "ttft_p50_vs_qps.png",
                                              "ttft_p99_vs_qps.png"]
