"""``prism-sim sweep --ablate``: each method with each of its parts switched off, its base engine, and each part's
share of the gain, against standalone runs of the same settings and hand-computed shares."""

from __future__ import annotations

import csv
import hashlib
import json
import math

import numpy as np
import pytest
from scipy import stats

from prism.cli.sim import main as sim_main
from prism.errors import UserError
from prism.policies.registry import ablation
from prism.sim.ablation import mean_ci, share_ci


def test_each_method_names_its_parts_and_base_engine():
    prism = ablation("prism")
    assert prism.base == "fcfs"
    assert [(p.name, m) for p, m in prism.parts] == [
        ("front_alignment", "prism"), ("buckets_and_lanes", "prism"), ("cold_lane", "prism"),
        ("dart_protection", "prism"), ("dart", "qas+lru")]
    assert dict(prism.parts[0][0].knobs) == {"qas": {"f_front": 0}}
    assert [p.name for p, _ in ablation("qas+lru").parts] == ["front_alignment", "buckets_and_lanes", "cold_lane"]
    cp = ablation("contextpilot")
    assert cp.base == "sglang" and [p.name for p, _ in cp.parts] == ["reorder", "engine_order"]
    # ContextPilot's base engine is its engine order's: behind FCFS it is measured against FCFS
    assert ablation("contextpilot", {"contextpilot": {"engine_order": "fcfs"}}).base == "fcfs"
    klpm = ablation("klpm")
    assert klpm.base == "sglang" and [p.name for p, _ in klpm.parts] == ["fifo_share"]
    with pytest.raises(UserError, match="no parts"):
        ablation("sglang")


def test_share_and_its_interval_are_the_ratio_estimators():
    g = np.array([0.10, 0.12, 0.08])
    d = np.array([0.05, 0.07, 0.03])
    share, half = share_ci(d, g)
    assert share == pytest.approx(0.15 / 0.30)
    # the delta method by hand: residuals d - R g, their sd over sqrt(n) |mean g|, times t(2, 0.975)
    e = d - 0.5 * g
    assert half == pytest.approx(stats.t.ppf(0.975, 2) * e.std(ddof=1) / (np.sqrt(3) * g.mean()))
    assert share_ci(0.25 * g, g) == pytest.approx((0.25, 0.0))  # a part worth a fixed fraction: no spread
    assert all(math.isnan(x) for x in share_ci(d, np.zeros(3)))
    mean, half = mean_ci(d)
    lo, hi = stats.t.interval(0.95, 2, loc=d.mean(), scale=stats.sem(d))
    assert (mean, half) == pytest.approx((d.mean(), (hi - lo) / 2))


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def ablated(tmp_path_factory):
    out = tmp_path_factory.mktemp("abl") / "ablate"
    argv = ["sweep", "--ablate", "--trace", "zipf", "--methods", "prism,klpm", "--qps", "70", "--seeds", "2",
            "--set", "trace.num_requests=150", "--set", "engine.max_running_requests=16", "--workers", "2",
            "--out", str(out), "--no-progress"]
    assert sim_main(argv) == 0
    return out, argv


def test_the_ablation_writes_its_table_and_plot(ablated):
    out, _ = ablated
    series = {p.name for p in (out / "runs").iterdir()}
    assert series == {"prism", "fcfs", "klpm", "sglang", "prism-no-front_alignment", "prism-no-buckets_and_lanes",
                      "prism-no-cold_lane", "prism-no-dart_protection", "prism-no-dart", "klpm-no-fifo_share"}
    assert (out / "ablation_qps70.png").stat().st_size > 5000
    table = json.loads((out / "ablation.json").read_text())
    assert table["methods"]["prism"]["base"] == "fcfs"
    assert [r["row"] for r in table["rows"] if r["method"] == "klpm"] == ["gain", "base", "fifo_share", "sum of parts"]
    rows = list(csv.DictReader((out / "ablation.csv").open()))
    assert len(rows) == len(table["rows"]) == 8 + 4


def test_a_variant_is_the_standalone_run_of_its_settings(ablated, tmp_path):
    """The ablation's runs are the settings they name: prism without DART is qas+lru, without the cold lane it
    is prism with q_cold=0, the base engine is the fcfs method, each on the same trace and seed."""
    out, _ = ablated
    common = ["--trace", "zipf", "--qps", "70", "--seed", "1", "--set", "trace.num_requests=150",
              "--set", "engine.max_running_requests=16", "--no-progress"]
    for series, extra in (("prism-no-dart", ["--method", "qas+lru"]),
                          ("prism-no-cold_lane", ["--method", "prism", "--set", "qas.q_cold=0"]),
                          ("fcfs", ["--method", "fcfs"]),
                          ("klpm-no-fifo_share", ["--method", "klpm", "--set", "klpm.k=1000000000000"])):
        alone = tmp_path / series
        assert sim_main([*common, *extra, "--out", str(alone)]) == 0
        assert _digest(alone / "requests.csv") == _digest(out / "runs" / series / "qps70-seed1" / "requests.csv")


def test_shares_are_computed_from_the_runs(ablated):
    out, _ = ablated
    runs = {(r["series"], int(r["seed"])): r for r in csv.DictReader((out / "summary.csv").open())}
    rows = {(r["method"], r["row"]): r for r in json.loads((out / "ablation.json").read_text())["rows"]}

    def col(series, metric):
        return np.array([float(runs[(series, s)][metric]) for s in (0, 1)])

    g = col("prism", "hit_rate") - col("fcfs", "hit_rate")
    d = col("prism", "hit_rate") - col("prism-no-front_alignment", "hit_rate")
    assert rows[("prism", "gain")]["hit_delta"] == pytest.approx(g.mean())
    assert rows[("prism", "front_alignment")]["hit_share"] == pytest.approx(d.sum() / g.sum())
    g99 = col("fcfs", "ttft_p99_s") - col("prism", "ttft_p99_s")
    d99 = col("prism-no-cold_lane", "ttft_p99_s") - col("prism", "ttft_p99_s")
    assert rows[("prism", "cold_lane")]["p99_share"] == pytest.approx(d99.sum() / g99.sum())
    parts = [r for (m, name), r in rows.items() if m == "prism" and name not in ("gain", "base", "sum of parts")]
    assert rows[("prism", "sum of parts")]["hit_share"] == pytest.approx(sum(r["hit_share"] for r in parts))
    assert rows[("prism", "front_alignment")]["hit_share"] > 0.5  # the part that carries PRISM's hit rate


def test_a_rerun_skips_finished_runs_and_other_methods_are_refused(ablated, capsys):
    out, argv = ablated
    run = out / "runs" / "prism-no-dart" / "qps70-seed0" / "summary.json"
    wall = json.loads(run.read_text())["wall_s"]
    assert sim_main(argv) == 0
    assert json.loads(run.read_text())["wall_s"] == wall
    capsys.readouterr()
    other = [a if a != "prism,klpm" else "prism" for a in argv]
    assert sim_main(other) == 2
    assert "ablate differ" in capsys.readouterr().err


def test_bad_ablations_are_refused(tmp_path, capsys):
    base = ["sweep", "--ablate", "--trace", "zipf", "--qps", "60", "--set", "trace.num_requests=50",
            "--out", str(tmp_path / "x"), "--no-progress"]
    assert sim_main([*base, "--methods", "sglang"]) == 2
    assert "no parts to switch off" in capsys.readouterr().err
    assert sim_main([*base, "--methods", "prism", "--instances", "2"]) == 2
    assert "--ablate runs one engine" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
