"""Sweeps: methods × QPS × seeds in parallel worker processes, results written as they arrive.

Each run writes ``DIR/runs/<method>/qps<Q>-seed<S>/{summary.json,requests.csv}``; the sweep appends one row
per finished run to ``DIR/summary.csv`` at once (an interrupted sweep loses nothing, and a rerun skips runs
whose summary already exists with the same settings), then writes ``DIR/aggregate.csv`` (mean and 95%
confidence interval per method and QPS) and the plots.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
from scipy import stats as sps

from prism.metrics import write_json, write_requests_csv
from prism.settings import settings_from

from prism.sim.run import simulate

ROW_FIELDS = ["method", "scheduler", "eviction", "qps", "seed", "num_requests", "ttft_mean_s", "ttft_p50_s",
              "ttft_p90_s", "ttft_p95_s", "ttft_p99_s", "w_admit_p50_s", "w_admit_p99_s", "hit_rate",
              "belady_hit_rate", "infinite_cache_hit_rate", "served_infinite_cache_hit_rate", "throughput_rps",
              "evicted_tokens_private",
              "evicted_tokens_reusable", "evicted_tokens_protected", "admitted_hot_lane", "admitted_cold_lane",
              "front_alignment_moves", "wall_s"]
AGG_METRICS = ["ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "hit_rate", "belady_hit_rate",
               "infinite_cache_hit_rate", "served_infinite_cache_hit_rate", "throughput_rps"]


@dataclass
class RunTask:
    trace: str
    method: str
    qps: float
    seed: int
    config: dict[str, Any]  # the settings mapping (validated in the worker)
    out: str
    belady: bool = True

    @property
    def folder(self) -> Path:
        return Path(self.out) / "runs" / self.method / f"qps{self.qps:g}-seed{self.seed}"

    def digest(self) -> str:
        blob = json.dumps([self.trace, self.method, self.qps, self.seed, self.config, self.belady], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def task_config(base: dict[str, Any], method: str, qps: float, seed: int) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    for key in ("scheduler", "eviction"):
        cfg.pop(key, None)
    cfg["method"] = method
    trace = dict(cfg.get("trace") or {})
    trace["qps"], trace["seed"] = qps, seed
    cfg["trace"] = trace
    return cfg


def run_task(task: RunTask) -> dict[str, Any]:
    """One run (in a worker): simulate, add the Belady reference, write the run folder; return the row."""
    folder = task.folder
    done = folder / "summary.json"
    if done.is_file():
        old = json.loads(done.read_text())
        if old.get("sweep_digest") == task.digest():
            return old
    spec = settings_from(task.config, "sweep").resolve(task.trace)  # its label is task.method
    res = simulate(spec, served_reference=True)
    summary = res.summary
    if task.belady:
        ref = simulate(replace(spec, eviction="belady", label=f"{spec.scheduler}+belady"))
        summary["belady_hit_rate"] = ref.summary["hit_rate"]
    summary["sweep_digest"] = task.digest()
    folder.mkdir(parents=True, exist_ok=True)
    write_requests_csv(res.records, folder / "requests.csv")
    write_json(summary, done)
    return summary


def row_of(summary: dict[str, Any]) -> dict[str, Any]:
    t, w, c = summary["ttft_s"], summary["w_admit_s"], summary.get("counters", {})
    return {
        "method": summary["method"], "scheduler": summary["scheduler"], "eviction": summary["eviction"],
        "qps": summary["qps"], "seed": summary["seed"], "num_requests": summary["num_requests"],
        "ttft_mean_s": t["mean"], "ttft_p50_s": t["p50"], "ttft_p90_s": t["p90"], "ttft_p95_s": t["p95"],
        "ttft_p99_s": t["p99"], "w_admit_p50_s": w["p50"], "w_admit_p99_s": w["p99"],
        "hit_rate": summary["hit_rate"], "belady_hit_rate": summary.get("belady_hit_rate", ""),
        "infinite_cache_hit_rate": summary["infinite_cache_hit_rate"],
        "served_infinite_cache_hit_rate": summary.get("served_infinite_cache_hit_rate", ""),
        "throughput_rps": summary["throughput_rps"],
        "evicted_tokens_private": c.get("evicted_tokens_private", 0),
        "evicted_tokens_reusable": c.get("evicted_tokens_reusable", 0),
        "evicted_tokens_protected": c.get("evicted_tokens_protected", 0),
        "admitted_hot_lane": c.get("admitted_hot_lane", 0), "admitted_cold_lane": c.get("admitted_cold_lane", 0),
        "front_alignment_moves": c.get("front_alignment_moves", 0), "wall_s": summary["wall_s"],
    }


def _fmt(v: Any) -> Any:
    return repr(round(v, 9)) if isinstance(v, float) else v


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and 95% confidence half-width (Student t) per (method, qps)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], float(r["qps"])), []).append(r)
    out = []
    for (method, qps), rs in groups.items():
        agg: dict[str, Any] = {"method": method, "qps": qps, "seeds": len(rs)}
        for m in AGG_METRICS:
            vals = np.array([float(r[m]) for r in rs if r.get(m) not in ("", None)])
            if not len(vals):
                continue
            agg[m] = float(vals.mean())
            half = float(sps.t.ppf(0.975, len(vals) - 1) * vals.std(ddof=1) / np.sqrt(len(vals))) if len(vals) > 1 else 0.0
            agg[m + "_ci95"] = half
        out.append(agg)
    return out


@dataclass
class Sweep:
    trace: str
    methods: list[str]
    qps: list[float]
    seeds: list[int]
    config: dict[str, Any]
    out: Path
    belady: bool = True
    workers: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)

    def tasks(self) -> list[RunTask]:
        return [RunTask(self.trace, m, q, s, task_config(self.config, m, q, s), str(self.out), self.belady)
                for q in self.qps for m in self.methods for s in self.seeds]

    def run(self, on_done: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        self.out.mkdir(parents=True, exist_ok=True)
        tasks = self.tasks()
        path = self.out / "summary.csv"
        workers = self.workers or min(len(tasks), os.cpu_count() or 1)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=ROW_FIELDS)
            writer.writeheader()
            f.flush()
            for summary in _execute(tasks, workers):
                row = row_of(summary)
                self.rows.append(row)
                writer.writerow({k: _fmt(v) for k, v in row.items()})
                f.flush()
                if on_done:
                    on_done(row)
        order = {(m, q, s): i for i, (q, m, s) in enumerate((t.qps, t.method, t.seed) for t in tasks)}
        self.rows.sort(key=lambda r: order[(r["method"], float(r["qps"]), int(r["seed"]))])
        _write_rows(path, ROW_FIELDS, self.rows)  # final file in a stable order
        agg = aggregate(self.rows)
        agg_fields = ["method", "qps", "seeds"] + [x for m in AGG_METRICS for x in (m, m + "_ci95")]
        _write_rows(self.out / "aggregate.csv", agg_fields, agg)
        return agg


def _execute(tasks: list[RunTask], workers: int) -> Iterable[dict[str, Any]]:
    if workers <= 1:
        for t in tasks:
            yield run_task(t)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_task, t) for t in tasks]
        for fut in as_completed(futures):
            yield fut.result()


def _write_rows(path: Path, fields: list[str], rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k, "")) for k in fields})
