"""Fleet sweeps and plans: sharing schemes x fleet sizes x rate scales x seeds, and "how many GPUs do I need".

A fleet sweep runs every (scheme, GPUs, rate scale, seed) of a multi-model trace, in parallel worker processes,
each run into ``DIR/runs/<scheme>-g<GPUs>/x<SCALE>-seed<S>/`` (``requests.csv``, ``summary.json``,
``memory.csv``), and writes ``DIR/fleet.csv`` (a row per run, rewritten atomically as runs finish),
``DIR/fleet_aggregate.csv`` (mean and 95% CI over seeds) and the plots of SLO attainment against the rate scale
and against the GPUs (``sim/fleet_plots.py``). A fleet too small for a scheme (``static`` with more weights than
memory, a KV share below a model's largest request) is a run of 0% attainment, marked ``feasible: 0``.

A rerun skips runs whose summary is whole and of the same settings; one sweep at a time writes in a folder
(``.sweep.lock``, shared with the method sweeps); a folder holding a sweep of other settings is refused unless
``force`` (then its files go first).

A plan (:func:`plan`) finds, per scheme, the fewest GPUs at which the fleet meets an attainment target: it runs
the scheme at the fewest GPUs that can hold its models and upwards (a batch of as many sizes as there are
workers at a time) until a size meets the target or ``max_gpus`` is passed. Attainment need not grow with
every GPU added (placement changes), so the answer is the first size that meets it, and the runs it took are
kept in the plan's folder as a sweep's are (a rerun reuses them). Sizes past the answer that a batch ran are
dropped: the plan's files are those of a plan on one worker, whatever the worker count.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from prism.errors import UserError
from prism.metrics import RUN_FILES, csv_float, read_summary, write_json, write_requests_csv
from prism.output import clear_leftovers, prepare_run_dir, write_csv
from prism.settings import settings_from

from prism.sim.sweep import (FLEET_FILES, MANIFEST, _canonical, check_no_single_run, clear_sweep_folder, folder_lock,
                             pool_size, worker_pool)

ROW_FIELDS = ["series", "sharing", "gpus", "rate_scale", "seed", "qps", "requests", "feasible", "attainment",
              "attainment_ttft", "attainment_tpot", "goodput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
              "tpot_p99_s", "activations", "evictions", "migrations", "bytes_moved", "loading_s", "wall_s"]
AGG_METRICS = ["attainment", "attainment_ttft", "attainment_tpot", "goodput_rps", "ttft_p99_s", "tpot_p99_s",
               "migrations", "activations"]


@dataclass
class FleetTask:
    trace: str
    sharing: str
    gpus: int
    rate_scale: float
    seed: int | None  # None: the trace's own (a materialized trace)
    config: dict[str, Any]  # the run's settings mapping, validated in the worker
    out: str

    @property
    def series(self) -> str:
        return f"{self.sharing}-g{self.gpus}"

    @property
    def key(self) -> tuple[str, int, float, int | None]:
        return self.sharing, self.gpus, self.rate_scale, self.seed

    @property
    def folder(self) -> Path:
        return Path(self.out) / "runs" / self.series / f"x{self.rate_scale:g}-seed{self.seed}"

    def digest(self) -> str:
        blob = json.dumps([self.trace, self.sharing, self.gpus, self.rate_scale, self.seed, self.config],
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def task_config(base: dict[str, Any], sharing: str, gpus: int, rate_scale: float, seed: int | None) -> dict:
    """One run's settings: ``base`` with its fleet section set (the other schemes' knob sections dropped)."""
    from prism.policies.registry import SHARING

    cfg = {k: copy.deepcopy(v) for k, v in base.items() if k not in SHARING or k == sharing}
    cfg["fleet"] = {**(cfg.get("fleet") or {}), "sharing": sharing, "gpus": gpus, "rate_scale": rate_scale}
    if seed is not None:
        cfg["trace"] = {**(cfg.get("trace") or {}), "seed": seed}
    return cfg


def row_of(summary: dict[str, Any], task: FleetTask) -> dict[str, Any]:
    f = summary.get("fleet") or {}
    row = {"series": task.series, "sharing": task.sharing, "gpus": task.gpus, "rate_scale": task.rate_scale,
           "seed": task.seed if task.seed is not None else summary.get("seed"), "qps": summary.get("qps", ""),
           "requests": f.get("requests", 0), "feasible": int(summary.get("feasible", True)),
           "wall_s": summary.get("wall_s", 0.0)}
    for k in ROW_FIELDS:
        if k not in row:
            row[k] = f.get(k, 0.0)
    return row


def run_task(task: FleetTask) -> dict[str, Any]:
    """Simulate one run and write its folder; its summary (a run the fleet is too small for: a summary of 0%
    attainment that says why)."""
    from prism.output import write_csv as write
    from prism.policies.sharing_static import FleetTooSmall
    from prism.sim.fleet import memory_rows
    from prism.sim.run import simulate

    folder = task.folder
    folder.mkdir(parents=True, exist_ok=True)
    try:
        spec = settings_from(task.config, "sweep").resolve(task.trace)
        res = simulate(spec)
        summary = res.summary
        write_requests_csv(res.records, folder / "requests.csv", fleet=bool(spec.trace.meta.get("models")))
        write(folder / "memory.csv", *memory_rows(res.memory))
    except FleetTooSmall as e:
        summary = {"complete": True, "feasible": False, "why": str(e), "fleet": {"attainment": 0.0}, "wall_s": 0.0}
    summary["sweep_digest"] = task.digest()
    write_json(summary, folder / "summary.json")
    return summary


def finished_summary(task: FleetTask) -> dict[str, Any] | None:
    s = read_summary(task.folder / "summary.json")
    if s is None or s.get("sweep_digest") != task.digest() or s.get("complete") is not True:
        return None
    if not isinstance(s.get("fleet"), dict) or not isinstance(s["fleet"].get("attainment"), (int, float)):
        return None
    return s


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and 95% CI half-width (Student t) per (scheme, GPUs, rate scale) over seeds, in that order."""
    from scipy.special import stdtrit

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["sharing"], int(r["gpus"]), float(r["rate_scale"])), []).append(r)
    schemes = list(dict.fromkeys(k[0] for k in groups))  # in the sweep's order, then by GPUs and rate scale
    out = []
    for sharing, gpus, scale in sorted(groups, key=lambda k: (schemes.index(k[0]), k[1], k[2])):
        rs = groups[(sharing, gpus, scale)]
        agg: dict[str, Any] = {"series": f"{sharing}-g{gpus}", "sharing": sharing, "gpus": gpus, "rate_scale": scale,
                               "seeds": len(rs), "feasible": min(int(r["feasible"]) for r in rs)}
        for m in AGG_METRICS:
            vals = np.array([float(r[m]) for r in rs])
            agg[m] = float(vals.mean())
            n = len(vals)
            agg[m + "_ci95"] = float(stdtrit(n - 1, 0.975) * vals.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        out.append(agg)
    return out


def _fmt(v: Any) -> Any:
    return csv_float(v) if isinstance(v, float) else v


@dataclass
class FleetSweep:
    trace: str
    sharings: list[str]
    gpus: list[int]
    rate_scales: list[float]
    seeds: list[int | None]
    config: dict[str, Any]
    out: Path
    workers: int = 0
    force: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)

    def task(self, sharing: str, gpus: int, scale: float, seed: int | None) -> FleetTask:
        return FleetTask(self.trace, sharing, gpus, scale, seed, task_config(self.config, sharing, gpus, scale, seed),
                         str(self.out))

    def tasks(self) -> list[FleetTask]:
        return [self.task(s, g, x, seed) for x in self.rate_scales for s in self.sharings for g in self.gpus
                for seed in self.seeds]

    def lock(self):
        if not self.force:  # before the lock file: a refused sweep leaves the run's folder as it was
            check_no_single_run(self.out)
        return folder_lock(self.out, FLEET_FILES)

    def check_folder(self) -> None:
        """A folder of another sweep's settings, or of a single run, is refused (or, with ``force``, emptied)."""
        mine = {"kind": "fleet", "trace": self.trace, "config": _canonical(self.config)}
        old = read_summary(self.out / MANIFEST) if (self.out / MANIFEST).exists() else None
        other = (self.out / MANIFEST).exists() and (old is None or {k: old.get(k) for k in mine} != mine)
        if not self.force:
            if other:
                raise UserError("holds a sweep of other settings; use another --out, or --force to replace it",
                                f"--out {self.out}")
        elif other or any((self.out / name).exists() for name in RUN_FILES):  # a single run's (see lock)
            clear_sweep_folder(self.out)

    def run(self, tasks: list[FleetTask] | None = None,
            on_done: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Run ``tasks`` (default: the sweep's), skipping finished ones; the rows of fleet.csv (every run of the
        folder's manifest that has one)."""
        tasks = tasks if tasks is not None else self.tasks()
        for name in (*FLEET_FILES, MANIFEST):
            clear_leftovers(self.out / name)
        manifest = read_summary(self.out / MANIFEST) or {}
        known = [tuple(k) for k in manifest.get("runs", [])]
        keys = list(dict.fromkeys(known + [t.key for t in tasks]))
        write_json({"kind": "fleet", "trace": self.trace, "config": self.config, "runs": [list(k) for k in keys]},
                   self.out / MANIFEST)
        every = [self.task(*k) for k in keys]
        done = {t.key: s for t in every if (s := finished_summary(t)) is not None}
        todo = [t for t in tasks if t.key not in done]
        for t in todo:
            prepare_run_dir(t.folder, (*RUN_FILES,), "")
        rows = {t.key: row_of(s, t) for t in every if (s := done.get(t.key)) is not None}
        order = {k: i for i, k in enumerate(keys)}

        def save() -> None:
            self.rows = [rows[k] for k in sorted(rows, key=order.__getitem__)]
            write_csv(self.out / "fleet.csv", ROW_FIELDS, ({k: _fmt(r.get(k, "")) for k in ROW_FIELDS}
                                                           for r in self.rows))

        for t, summary in _execute(todo, pool_size(self.workers, len(todo))):
            rows[t.key] = row_of(summary, t)
            save()
            if on_done:
                on_done(rows[t.key])
        save()
        return self.rows

    def discard(self, tasks: list[FleetTask]) -> None:
        """Forget runs made ahead of need (a plan's sizes past the fewest that meets its target, run beside the
        others on spare workers): their folders and manifest entries go and fleet.csv is written without them,
        so the folder holds what a plan on one worker leaves, whatever the machine's core count."""
        if not tasks:
            return
        gone = {t.key for t in tasks}
        manifest = read_summary(self.out / MANIFEST) or {}
        write_json({**manifest, "runs": [k for k in manifest.get("runs", []) if tuple(k) not in gone]},
                   self.out / MANIFEST)
        for t in tasks:
            shutil.rmtree(t.folder, ignore_errors=True)
            if t.folder.parent.is_dir() and not any(t.folder.parent.iterdir()):
                t.folder.parent.rmdir()
        self.run([])

    def write_aggregate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        agg = aggregate(rows)
        fields = ["series", "sharing", "gpus", "rate_scale", "seeds", "feasible"] + [
            x for m in AGG_METRICS for x in (m, m + "_ci95")]
        write_csv(self.out / "fleet_aggregate.csv", fields, ({k: _fmt(a.get(k, "")) for k in fields} for a in agg))
        return agg


def _execute(todo: list[FleetTask], workers: int) -> Iterable[tuple[FleetTask, dict[str, Any]]]:
    if workers <= 1:
        for t in todo:
            yield t, run_task(t)
        return
    from concurrent.futures import as_completed

    with worker_pool(workers) as pool:
        futures = {pool.submit(run_task, t): t for t in todo}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


# ---------------------------------------------------------------------------------------------- plans
def fewest_gpus(sweep: FleetSweep, sharing: str, scale: float) -> int:
    """The fewest GPUs a scheme can hold the trace's models on (where a plan starts)."""
    cfg = task_config(sweep.config, sharing, 1, scale, sweep.seeds[0])
    del cfg["fleet"]["gpus"]  # the fleet's default: as few as hold every model
    return settings_from(cfg, "plan").resolve(sweep.trace).fleet.gpus


def plan(sweep: FleetSweep, target: float, scale: float, max_gpus: int,
         on_done: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Per scheme of ``sweep``: the fewest GPUs whose mean attainment over the seeds reaches ``target`` at rate
    ``scale`` (module docstring). One row per scheme: ``fewest_gpus`` (None: not reached by ``max_gpus``), the
    attainment there and at one GPU fewer, the sizes tried."""
    batch = max(1, pool_size(sweep.workers, 64))
    out = []
    for sharing in sweep.sharings:
        start = fewest_gpus(sweep, sharing, scale)
        tried: dict[int, float] = {}
        found = None
        g = start
        while found is None and g <= max_gpus:
            sizes = list(range(g, min(g + batch, max_gpus + 1)))
            if sharing == "dedicated":
                sizes = [start]  # its size is fixed: one per model
            tasks = [sweep.task(sharing, n, scale, s) for n in sizes for s in sweep.seeds]
            had = {t.key for t in tasks if finished_summary(t) is not None}  # runs the folder held already
            rows = sweep.run(tasks, on_done)
            for n in sizes:
                mine = [float(r["attainment"]) for r in rows if r["sharing"] == sharing and int(r["gpus"]) == n
                        and float(r["rate_scale"]) == scale]
                tried[n] = sum(mine) / len(mine)
            found = next((n for n in sizes if tried[n] >= target), None)
            if found is not None:  # sizes past it, run at once on spare workers, are not the plan's: one at a
                sweep.discard([t for t in tasks if t.gpus > found and t.key not in had])  # time stops at it
                tried = {n: a for n, a in tried.items() if n <= found}
            if sharing == "dedicated":
                break
            g = sizes[-1] + 1
        out.append({"sharing": sharing, "fewest_gpus": found, "attainment": tried.get(found) if found else
                    max(tried.values(), default=0.0), "attainment_one_fewer": tried.get(found - 1) if found else None,
                    "target": target, "rate_scale": scale, "sizes_tried": sorted(tried),
                    "attainment_by_gpus": {str(k): v for k, v in sorted(tried.items())}})
    return out
