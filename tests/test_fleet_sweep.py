"""Fleet sweeps and plans (``prism-sim sweep --sharing ...``, ``prism-sim plan``): each point is the standalone
fleet run of its settings byte for byte, the aggregate is the rows' mean and Student-t interval, a rerun
simulates nothing it has, and a plan's answer is the brute-force answer over every fleet size."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from prism.cli.sim import main as sim_main

TRACE = """kind: multi_model
seed: 5
duration_s: 90
qps: 3
models:
  - {name: big, profile: llama-3.1-8b}
  - {name: mid, profile: qwen2.5-3b}
  - {name: small, profile: llama-3.2-1b}
"""
SCHEMES, GPUS, SCALES, SEEDS = ("static", "prism"), (1, 2), (1.0, 2.0), 2


def _csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _standalone(tmp: Path, trace: Path, sharing: str, gpus: int, scale: float, seed: int) -> Path:
    out = tmp / f"alone-{sharing}-{gpus}-{scale}-{seed}"
    if not out.exists():
        assert sim_main(["--trace", str(trace), "--gpus", str(gpus), "--sharing", sharing, "--set",
                         f"fleet.rate_scale={scale}", "--set", f"trace.seed={seed}", "--out", str(out),
                         "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet_sweep")
    trace = tmp / "mm.yaml"
    trace.write_text(TRACE)
    argv = ["sweep", "--trace", str(trace), "--sharing", ",".join(SCHEMES), "--gpus", ",".join(map(str, GPUS)),
            "--rate-scale", ",".join(map(str, SCALES)), "--seeds", str(SEEDS), "--workers", "1",
            "--out", str(tmp / "sweep"), "--no-progress"]
    assert sim_main(argv) == 0
    return tmp, trace, argv


def test_every_point_is_its_standalone_run(swept):
    tmp, trace, _ = swept
    rows = _csv(tmp / "sweep" / "fleet.csv")
    assert len(rows) == len(SCHEMES) * len(GPUS) * len(SCALES) * SEEDS
    assert {(r["sharing"], int(r["gpus"]), float(r["rate_scale"]), int(r["seed"])) for r in rows} == {
        (s, g, x, 5 + i) for s in SCHEMES for g in GPUS for x in SCALES for i in range(SEEDS)}
    for r in rows:
        run = f"{r['sharing']}-g{r['gpus']}", f"x{float(r['rate_scale']):g}-seed{r['seed']}"
        folder = tmp / "sweep" / "runs" / run[0] / run[1]
        alone = _standalone(tmp, trace, r["sharing"], int(r["gpus"]), float(r["rate_scale"]), int(r["seed"]))
        assert (folder / "requests.csv").read_bytes() == (alone / "requests.csv").read_bytes()
        fleet = json.loads((alone / "summary.json").read_text())["fleet"]
        assert float(r["attainment"]) == pytest.approx(fleet["attainment"], abs=1e-8)
        assert int(r["requests"]) == fleet["requests"]


def test_the_aggregate_is_the_mean_and_student_interval_of_the_seeds(swept):
    tmp, _, _ = swept
    rows = _csv(tmp / "sweep" / "fleet.csv")
    agg = _csv(tmp / "sweep" / "fleet_aggregate.csv")
    assert [(a["sharing"], int(a["gpus"]), float(a["rate_scale"])) for a in agg] == [
        (s, g, x) for s in SCHEMES for g in GPUS for x in SCALES]  # in the sweep's order
    for a in agg:
        vals = np.array([float(r["attainment"]) for r in rows if (r["sharing"], r["gpus"], r["rate_scale"]) ==
                         (a["sharing"], a["gpus"], a["rate_scale"])])
        assert len(vals) == SEEDS == int(a["seeds"])
        assert float(a["attainment"]) == pytest.approx(vals.mean(), abs=1e-8)
        half = stats.t.ppf(0.975, SEEDS - 1) * vals.std(ddof=1) / math.sqrt(SEEDS)
        assert float(a["attainment_ci95"]) == pytest.approx(half, abs=1e-8)


def test_a_rerun_simulates_nothing_it_has(swept, monkeypatch):
    import prism.sim.fleet_sweep as fs

    tmp, _, argv = swept
    before = (tmp / "sweep" / "fleet.csv").read_bytes()

    def never(task):
        raise AssertionError(f"{task.key} was simulated again")

    monkeypatch.setattr(fs, "run_task", never)
    assert sim_main(argv) == 0
    assert (tmp / "sweep" / "fleet.csv").read_bytes() == before


def test_a_plan_is_the_brute_force_answer(swept):
    """The fewest GPUs per scheme reaching the target (the mean over the seeds), against every fleet size run
    on its own; one GPU fewer is reported as measured."""
    tmp, trace, _ = swept
    out = tmp / "plan"
    target, max_gpus = 0.9, 3
    assert sim_main(["plan", "--trace", str(trace), "--sharing", ",".join(SCHEMES), "--attainment", str(target),
                     "--max-gpus", str(max_gpus), "--seeds", str(SEEDS), "--workers", "1", "--out", str(out),
                     "--no-progress"]) == 0
    plan = {p["sharing"]: p for p in json.loads((out / "plan.json").read_text())}
    for sharing in SCHEMES:
        by_size = {}
        for g in range(1, max_gpus + 1):
            runs = [_standalone(tmp, trace, sharing, g, 1.0, 5 + i) for i in range(SEEDS)]
            by_size[g] = np.mean([json.loads((r / "summary.json").read_text())["fleet"]["attainment"] for r in runs])
        fewest = next((g for g in sorted(by_size) if by_size[g] >= target), None)
        p = plan[sharing]
        assert p["fewest_gpus"] == fewest, (sharing, by_size, p)
        for g, a in p["attainment_by_gpus"].items():
            assert a == pytest.approx(by_size[int(g)], abs=1e-8)
        if fewest is not None and fewest - 1 in by_size and str(fewest - 1) in p["attainment_by_gpus"]:
            assert p["attainment_one_fewer"] == pytest.approx(by_size[fewest - 1], abs=1e-8)
    assert any(p["fewest_gpus"] not in (None, 1) for p in plan.values()), plan  # the search went past one size
    rows = _csv(out / "plan.csv")
    assert [r["sharing"] for r in rows] == list(SCHEMES)


def test_a_plans_files_do_not_depend_on_its_worker_count(swept):
    """Three workers run three sizes at once; those past the answer are dropped, so the folder is byte for byte
    the one a worker alone leaves (but each run's wall time)."""
    tmp, trace, _ = swept
    folders = []
    for workers in (1, 3):
        out = tmp / f"plan-w{workers}"
        assert sim_main(["plan", "--trace", str(trace), "--sharing", "static", "--attainment", "0.9", "--max-gpus",
                         "3", "--workers", str(workers), "--out", str(out), "--no-progress"]) == 0
        folders.append(out)

    def files(out: Path) -> dict[str, bytes]:
        got = {}
        for p in sorted(out.rglob("*")):
            if p.is_file() and p.name != ".sweep.lock":
                data = p.read_bytes()
                if p.name == "summary.json":
                    data = json.dumps({k: v for k, v in json.loads(data).items() if k != "wall_s"}).encode()
                elif p.name == "fleet.csv":
                    rows = _csv(p)
                    data = json.dumps([{k: v for k, v in r.items() if k != "wall_s"} for r in rows]).encode()
                got[str(p.relative_to(out))] = data
        return got
    one, two = map(files, folders)
    assert sorted(one) == sorted(two)
    assert [k for k in one if one[k] != two[k]] == []
    assert json.loads(one["plan.json"])[0]["fewest_gpus"] < 3  # a size past the answer was run and dropped
