"""Sweeps: methods × QPS × seeds in parallel worker processes, results written as they arrive.

Each run writes ``DIR/runs/<method>/qps<Q>-seed<S>/{summary.json,requests.csv}``; the sweep rewrites
``DIR/summary.csv`` (atomically) as each run finishes, so an interrupted sweep loses nothing and a rerun skips
runs whose summary and requests.csv exist whole with the same settings (a missing, truncated or unreadable
one is run again, and a folder it cannot write is refused before any run), then writes ``DIR/aggregate.csv``
(mean and 95% confidence interval per method and QPS) and the plots.

One folder holds one sweep: ``DIR/.sweep.lock`` (an ``flock``, released when the process dies, even killed)
keeps a second sweep out while one runs, and ``DIR/sweep.json`` records the trace, the settings and the runs.
A later sweep into the folder with the same trace and settings *merges*: its runs are added to the earlier
ones, and summary.csv, aggregate.csv and the plots cover them all (finished runs are not simulated again).
A sweep of other settings is refused unless ``force`` (then the earlier sweep's files are removed first).

Clusters: with ``instances`` and ``routers`` every method also runs on N instances behind each router (a
*series* ``METHOD@ROUTERxN``; one instance is the method's own series, run once); rows, aggregates and plots
are per series. A cluster run has no Belady reference (an offline oracle per instance is not defined).

Where runs execute: in this process (one worker), in a process pool, or on a Ray cluster (``ray_address``:
``auto``, ``local`` or ``HOST:PORT``). A pool's workers, on this machine, write their own run folders and
return the summary (shipping a run's records to this process cost more than writing them); Ray workers only
simulate and return the summary and the records, and this process writes the folder, so a multi-node Ray
cluster needs no shared file system. The results are the same bytes whichever executes them (the simulation
is deterministic).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import fcntl
import hashlib
import json
import os
import shutil
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator

import numpy as np

from prism.counters import SWEEP_COUNTERS
from prism.errors import UserError
from prism.interrupts import HELD, InterruptsHeld, die_with_parent
from prism.metrics import (RUN_FILES, SWEEP_MANIFEST, RequestRecord, csv_columns, csv_float, read_summary,
                           write_json, write_requests_csv)
from prism.output import check_out_file, clear_leftovers, prepare_out_dir, prepare_run_dir, write_csv
from prism.settings import RunSpec, for_method, for_router, settings_from
from prism.traces.spec import is_materialized, load_trace, resolve
from prism.traces.trace import Trace

from prism.sim.run import simulate

ROW_FIELDS = ["series", "method", "scheduler", "eviction", "router", "instances", "qps", "seed", "num_requests",
              "ttft_mean_s", "ttft_p50_s",
              "ttft_p90_s", "ttft_p95_s", "ttft_p99_s", "w_admit_p50_s", "w_admit_p99_s", "hit_rate",
              "belady_hit_rate", "infinite_cache_hit_rate", "served_infinite_cache_hit_rate", "throughput_rps",
              *SWEEP_COUNTERS, "imbalance", "wall_s"]
AGG_METRICS = ["ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "hit_rate", "belady_hit_rate",
               "infinite_cache_hit_rate", "served_infinite_cache_hit_rate", "throughput_rps", "retractions",
               "imbalance"]


def series_name(method: str, instances: int = 1, router: str = "") -> str:
    """A sweep's curve: the method on one engine, or ``METHOD@ROUTERxN`` on a cluster."""
    return method if instances <= 1 else f"{method}@{router}x{instances}"


@dataclass
class RunTask:
    trace: str
    method: str
    qps: float
    seed: int
    config: dict[str, Any]  # the settings mapping (validated in the worker)
    out: str
    belady: bool = True
    instances: int = 1
    router: str = ""  # a cluster's router ("" for one instance)

    @property
    def series(self) -> str:
        return series_name(self.method, self.instances, self.router)

    @property
    def key(self) -> tuple[str, float, int]:
        return self.series, self.qps, self.seed

    @property
    def folder(self) -> Path:
        return Path(self.out) / "runs" / self.series / f"qps{self.qps:g}-seed{self.seed}"

    def digest(self) -> str:
        blob = json.dumps([self.trace, self.method, self.qps, self.seed, self.config, self.belady], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def manifest_entry(self) -> list[Any]:
        return [self.method, self.qps, self.seed] + ([self.instances, self.router] if self.instances > 1 else [])


def task_config(base: dict[str, Any], method: str, qps: float, seed: int | None, instances: int = 1,
                router: str = "") -> dict[str, Any]:
    """The settings of one run of a sweep (``seed`` None: the trace's own, for a materialized trace); on a
    cluster of ``instances`` behind ``router`` (one instance: the cluster section and router knobs dropped)."""
    base = for_router(base, router) if instances > 1 else {k: v for k, v in for_router(base, "rr").items()
                                                           if k != "cluster"}
    cfg = copy.deepcopy(for_method(base, method))  # the CLI checked that some method reads each knob section
    for key in ("scheduler", "eviction"):
        cfg.pop(key, None)
    cfg["method"] = method
    trace = dict(cfg.get("trace") or {})
    trace["qps"] = qps
    if seed is not None:
        trace["seed"] = seed
    cfg["trace"] = trace
    if instances > 1:
        cfg["cluster"] = {**(cfg.get("cluster") or {}), "instances": instances, "router": router}
    return cfg


def finished_summary(task: RunTask) -> dict[str, Any] | None:
    """The summary of a run a sweep of the same settings already finished, else None (run it): a folder the
    sweep cannot read whole (no summary, a truncated or damaged one, one of other settings or interrupted, a
    requests.csv missing or cut short, a folder where a file goes) holds no finished run."""
    old = read_summary(task.folder / "summary.json")  # None for a missing, truncated or unreadable summary
    if (old is None or old.get("sweep_digest") != task.digest() or old.get("complete", True) is not True
            or _row_or_none(old) is None):
        return None
    return old if _whole_csv(task.folder / "requests.csv", old.get("num_requests"), task.instances > 1) else None


def _row_or_none(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The summary.csv row of a summary, or None where a field it needs is missing or not a number."""
    try:
        row = row_of(summary)
        float(row["qps"]), int(row["seed"])  # noqa: B018 (the row's key)
        for m in AGG_METRICS:
            if row.get(m) not in ("", None):
                float(row[m])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return row


def _whole_csv(path: Path, rows: Any, cluster: bool) -> bool:
    """Whether ``path`` is a requests.csv of ``rows`` requests: its header, and one line per request (lines
    counted, not parsed: a rerun reads every finished run's file)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    header = (",".join(csv_columns(cluster)) + "\r\n").encode()  # as csv.writer ends its lines
    return (isinstance(rows, int) and data.startswith(header) and data.count(b"\n") == rows + 1
            and data.endswith(b"\n"))


def belady_hit_rate(spec: RunSpec, summary: dict[str, Any]) -> float:
    """The hit rate of the run's scheduler with Belady's eviction (furthest next use first), the offline
    reference a sweep reports beside each run. A run that evicted nothing needs no second simulation: the
    eviction policy is consulted only to choose victims, so with no victim to choose the Belady run takes the
    same admissions, batches and hits step by step (a workload that fits its pool, e.g. prefix20 at the
    GPU-sized pool; the paper's zipf trace evicts even there). The test suite checks the equality for every
    method."""
    if summary["counters"].get("evicted_nodes", 0) == 0:
        return summary["hit_rate"]
    return simulate(replace(spec, eviction="belady", label=f"{spec.scheduler}+belady")).summary["hit_rate"]


_RECENT_TRACES: dict[str, Trace] = {}  # a worker's last traces (see _load_trace)
_RECENT_PROMPTS: dict[str, dict[str, Trace]] = {}  # by the same file stamps: a memo of load_trace's


def _load_trace(source: str, overrides: dict[str, Any]) -> Trace:
    """``load_trace``, remembering the worker's last two traces and, for other rates, their prompts: the runs
    of one (seed, QPS) share its trace whatever their method, those of one seed its prompts whatever their
    rate, and a sweep hands a worker its runs in that order (``_execute``). A run never changes its trace. The
    keys hold the file's size and modification time, so a worker that outlives a sweep (a Ray worker, or this
    process) never serves a trace file that changed since."""
    path = resolve(source)
    try:
        stat = path.stat()
        stamp = json.dumps([str(path.resolve()), stat.st_mtime_ns, stat.st_size])
    except OSError:  # load_trace says what is wrong with it
        return load_trace(source, overrides)
    key = json.dumps([stamp, overrides], sort_keys=True)
    trace = _RECENT_TRACES.pop(key, None)
    if trace is None:
        memo = _RECENT_PROMPTS[stamp] = _RECENT_PROMPTS.pop(stamp, {})
        trace = load_trace(source, overrides, memo)
        while len(memo) > 2:
            del memo[next(iter(memo))]
    _RECENT_TRACES[key] = trace
    while len(_RECENT_TRACES) > 2:
        del _RECENT_TRACES[next(iter(_RECENT_TRACES))]
    while len(_RECENT_PROMPTS) > 2:
        del _RECENT_PROMPTS[next(iter(_RECENT_PROMPTS))]
    return trace


def simulate_task(task: RunTask) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One run's simulation (in any worker: it writes nothing): its summary, with the Belady reference for
    a single engine, and its records."""
    spec = settings_from(task.config, "sweep").resolve(task.trace, _load_trace)
    if spec.label != task.method:  # a variant of a method under a name of its own (an ablation's)
        spec = replace(spec, label=task.method)
    res = simulate(spec, served_reference=True)
    summary = res.summary
    if summary.get("seed") is None:  # a materialized trace that names no seed: the run's folder seed
        summary["seed"] = task.seed
    if task.belady and spec.cluster.instances == 1:
        summary["belady_hit_rate"] = belady_hit_rate(spec, summary)
    summary["sweep_digest"] = task.digest()
    return summary, res.records


def write_task(task: RunTask, summary: dict[str, Any], records: list[RequestRecord]) -> dict[str, Any]:
    """Write a run's folder (requests.csv, then summary.json) and return its summary."""
    folder = task.folder  # cleared of an earlier attempt's files by the sweep (Sweep._run) before its runs began
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").unlink(missing_ok=True)  # never a new requests.csv beside an old summary
    write_requests_csv(records, folder / "requests.csv", cluster=task.instances > 1)
    write_json(summary, folder / "summary.json")
    return summary


def run_task(task: RunTask) -> dict[str, Any]:
    """Simulate a run and write its folder (a pool worker on this machine); its summary."""
    return write_task(task, *simulate_task(task))


def row_of(summary: dict[str, Any]) -> dict[str, Any]:
    t, w, c = summary["ttft_s"], summary["w_admit_s"], summary.get("counters", {})
    cl = summary.get("cluster") or {}
    router, instances = cl.get("router", ""), cl.get("instances", 1)
    return {
        "series": series_name(summary["method"], instances, router),
        "method": summary["method"], "scheduler": summary["scheduler"], "eviction": summary["eviction"],
        "router": router, "instances": instances,
        "qps": summary["qps"], "seed": summary["seed"], "num_requests": summary["num_requests"],
        "ttft_mean_s": t["mean"], "ttft_p50_s": t["p50"], "ttft_p90_s": t["p90"], "ttft_p95_s": t["p95"],
        "ttft_p99_s": t["p99"], "w_admit_p50_s": w["p50"], "w_admit_p99_s": w["p99"],
        "hit_rate": summary["hit_rate"], "belady_hit_rate": summary.get("belady_hit_rate", ""),
        "infinite_cache_hit_rate": summary["infinite_cache_hit_rate"],
        "served_infinite_cache_hit_rate": summary.get("served_infinite_cache_hit_rate", ""),
        "throughput_rps": summary["throughput_rps"],
        **{name: c.get(name, 0) for name in SWEEP_COUNTERS}, "imbalance": cl.get("imbalance", ""),
        "wall_s": summary["wall_s"],
    }


def _fmt(v: Any) -> Any:
    return csv_float(v) if isinstance(v, float) else v


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and 95% confidence half-width (Student t) per (series, qps)."""
    from scipy.special import stdtrit  # Student t quantiles (what scipy.stats.t.ppf computes), without the
    # second it takes to import scipy.stats; imported here: a worker never needs it

    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("series") or r["method"], float(r["qps"])), []).append(r)
    out = []
    for (series, qps), rs in groups.items():
        first = rs[0]
        agg: dict[str, Any] = {"series": series, "method": first["method"], "router": first.get("router", ""),
                               "instances": int(first.get("instances") or 1), "qps": qps, "seeds": len(rs)}
        for m in AGG_METRICS:
            vals = np.array([float(r[m]) for r in rs if r.get(m) not in ("", None)])
            if not len(vals):
                continue
            agg[m] = float(vals.mean())
            n = len(vals)
            half = float(stdtrit(n - 1, 0.975) * vals.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
            agg[m + "_ci95"] = half
        out.append(agg)
    return out


#: files a sweep writes at its folder's top (plots: these and ttft_cdf_qps<Q>.png)
SWEEP_FILES = ("summary.csv", "aggregate.csv", "ttft_p99_vs_qps.png", "ttft_p50_vs_qps.png", "hit_rate_vs_qps.png",
               "imbalance_vs_qps.png")
#: an ablation's beside them (``sim/ablation.py``; plots: ablation_qps<Q>.png)
ABLATION_FILES = ("ablation.csv", "ablation.json")
#: prism-theory's beside them
THEORY_FILES = ("theory.json", "theory.csv", "theory.png")
#: a fleet sweep's and a plan's (``sim/fleet_sweep.py``)
FLEET_FILES = ("fleet.csv", "fleet_aggregate.csv", "attainment_vs_rate_scale.png", "attainment_vs_gpus.png",
               "plan.csv", "plan.json")
MANIFEST, LOCK = SWEEP_MANIFEST, ".sweep.lock"
#: what replacing a sweep's folder (``--force``) removes: any kind of sweep's files, so that none describes runs
#: gone, and a single run's (prism-sim --out), whose summary.json would read as one of the sweep's results
SWEEP_FOLDER_FILES = (*SWEEP_FILES, *ABLATION_FILES, *THEORY_FILES, *FLEET_FILES, MANIFEST, *RUN_FILES)
SWEEP_FOLDER_PLOTS = ("ttft_cdf_qps*.png", "ablation_qps*.png")


def clear_sweep_folder(out: Path) -> None:
    """Empty a folder of what any sweep or run wrote there (files, per-rate plots, runs), for a sweep that
    replaces it; other files stay."""
    for name in SWEEP_FOLDER_FILES:
        (out / name).unlink(missing_ok=True)
    for pattern in SWEEP_FOLDER_PLOTS:
        for p in out.glob(pattern):
            p.unlink()
    runs = out / "runs"
    if runs.is_dir() and not runs.is_symlink():
        shutil.rmtree(runs, ignore_errors=True)
    else:
        runs.unlink(missing_ok=True)  # a file (or a link) where the runs' folder goes


def _canonical(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True))


def check_no_single_run(out: Path) -> None:
    """A sweep goes in a folder of its own, not one holding a single run (refused unless ``--force``)."""
    here = [name for name in RUN_FILES if (out / name).exists()]
    if here:
        raise UserError(f"holds a single run ({here[0]}); use another --out, or --force to replace it",
                        f"--out {out}")


@contextlib.contextmanager
def folder_lock(out: Path, files: Iterable[str]) -> Iterator[Path]:
    """Hold ``DIR/.sweep.lock`` for one sweep (a fleet sweep or a plan too), its folder and ``files`` checked
    first: an ``flock``, released when the process dies, even killed; a second sweep gets one line. The lock file
    holds the pid only while the sweep runs (for that line)."""
    out = prepare_out_dir(out, "--out")
    for name in (*files, MANIFEST, LOCK):
        check_out_file(out / name, "--out")
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UserError(f"another sweep (pid {holder}) is writing in this folder; wait for it or use "
                            "another --out", f"--out {out}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield out
        finally:
            os.ftruncate(fd, 0)  # the pid goes with the sweep: a finished folder holds no trace of the process
    finally:
        os.close(fd)  # releases the lock


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
    force: bool = False  # replace an earlier sweep of other settings in ``out`` (else refused)
    instances: list[int] = field(default_factory=lambda: [1])  # cluster sizes (1: the single engine)
    routers: list[str] = field(default_factory=lambda: ["cache_aware"])  # routers of the clusters
    ray_address: str | None = None  # run on a Ray cluster ("auto", "local" or HOST:PORT) instead of a pool
    rows: list[dict[str, Any]] = field(default_factory=list)
    merged: list[RunTask] = field(default_factory=list)  # every run in the folder: earlier sweeps' and these
    _locked: bool = False
    files: ClassVar[tuple[str, ...]] = SWEEP_FILES  # what it writes at its folder's top

    def _clusters(self) -> list[tuple[int, str]]:
        return [(n, r) for n in self.instances for r in (self.routers if n > 1 else [""])]

    def tasks(self) -> list[RunTask]:
        return [self._task(m, q, s, n, r) for q in self.qps for m in self.methods for n, r in self._clusters()
                for s in self.seeds]

    def _task(self, method: str, qps: float, seed: int, instances: int = 1, router: str = "") -> RunTask:
        fixed = is_materialized(resolve(self.trace))  # a materialized trace has no seed to set
        cfg = task_config(self.config, method, qps, None if fixed else seed, instances, router)
        return RunTask(self.trace, method, qps, seed, cfg, str(self.out), self.belady, instances, router)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold ``DIR/.sweep.lock`` (checks and creates the folder first); a second sweep gets a UserError."""
        if self._locked:
            yield
            return
        if not self.force:  # before the lock file: a refused sweep leaves the run's folder as it was
            check_no_single_run(self.out)
        with folder_lock(self.out, self.files):
            self._locked = True
            try:
                yield
            finally:
                self._locked = False

    def identity(self) -> dict[str, Any]:
        """What a later sweep into the folder must share with this one to merge with it (``sweep.json``)."""
        return {"trace": self.trace, "config": _canonical(self.config), "belady": self.belady}

    def check(self) -> None:
        """Refuse (one line) a folder of another sweep's settings before anything in it changes: what a caller
        that clears the folder's other files asks first (a single run's folder was refused by :meth:`lock`)."""
        self._earlier()

    def _earlier(self) -> list[RunTask]:
        """The runs of a compatible earlier sweep in the folder (refused otherwise, unless ``force``)."""
        where = f"--out {self.out}"
        mine = self.identity()
        manifest = self.out / MANIFEST
        earlier: list[RunTask] = []
        if manifest.exists():
            old = read_summary(manifest)  # a JSON object, or None
            differs = ([k for k in sorted(set(mine) | set(old) - {"runs"}) if old.get(k) != mine.get(k)]
                       if old is not None and "runs" in old else ["unreadable sweep.json"])
            if differs and not self.force:
                raise UserError(f"holds a sweep of other settings ({', '.join(differs)} differ); use another "
                                "--out, or --force to replace it", where)
            if not differs:
                earlier = [self._task(e[0], float(e[1]), int(e[2]), *(e[3:5] if len(e) >= 5 else ()))
                           for e in old["runs"]]
        elif any((self.out / n).exists() for n in ("summary.csv", "runs")) and not self.force:
            raise UserError("holds a sweep without sweep.json (an older prism's); use another --out, or --force "
                            "to replace it", where)
        return earlier

    def _merge_earlier(self) -> list[RunTask]:
        """This sweep's runs after those of a compatible earlier sweep in the folder (refused otherwise)."""
        earlier = self._earlier()
        if self.force and not earlier:
            clear_sweep_folder(self.out)
        keys = {t.key for t in earlier}
        return earlier + [t for t in self.tasks() if t.key not in keys]

    def run(self, on_done: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        with self.lock():
            return self._run(on_done)

    def _run(self, on_done: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
        tasks = self.merged = self._merge_earlier()
        for name in (*self.files, MANIFEST, "ttft_cdf_qps*.png"):  # a killed sweep's temporary files
            clear_leftovers(self.out / name)
        finished = {t.key: s for t in tasks if (s := finished_summary(t)) is not None}
        todo = [t for t in tasks if t.key not in finished]
        for t in todo:  # every folder a run will write: checked, and an earlier attempt's files gone, before any run
            prepare_run_dir(t.folder, RUN_FILES, "")
        write_json({**self.identity(), "runs": [t.manifest_entry() for t in tasks]}, self.out / MANIFEST)
        order = {t.key: i for i, t in enumerate(tasks)}
        key = lambda r: (r.get("series") or r["method"], float(r["qps"]), int(r["seed"]))  # noqa: E731
        path = self.out / "summary.csv"
        rows = {key(r): r for r in _read_rows(path) if key(r) in order}  # kept until their run reports again
        workers = pool_size(self.workers, len(tasks))

        def save() -> None:
            self.rows = sorted(rows.values(), key=lambda r: order[key(r)])
            write_csv(path, ROW_FIELDS, ({k: _fmt(r.get(k, "")) for k in ROW_FIELDS} for r in self.rows))

        # closed on any way out, Ctrl-C in save() included: the pool's workers are gone before the lock is
        runs = _execute(list(finished.values()), todo, workers, self.ray_address)
        with contextlib.closing(runs) as summaries:
            for summary in summaries:
                row = row_of(summary)
                rows[key(row)] = row
                save()  # the whole file, atomically: never shorter than before the sweep
                if on_done:
                    on_done(row)
        save()
        agg = aggregate(self.rows)
        agg_fields = (["series", "method", "router", "instances", "qps", "seeds"]
                      + [x for m in AGG_METRICS for x in (m, m + "_ci95")])
        write_csv(self.out / "aggregate.csv", agg_fields, ({k: _fmt(a.get(k, "")) for k in agg_fields} for a in agg))
        return agg


def _read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, ValueError, csv.Error):
        return []
    good = []
    for r in rows:
        try:
            float(r["qps"]), int(r["seed"])  # noqa: B018 (a row the key can read)
        except (KeyError, TypeError, ValueError):
            continue
        good.append(r)
    return good


def _worker_started(parent: int) -> None:
    """A pool worker's first step: it ends with the sweep (killed by the kernel should the sweep die, even by
    SIGKILL) and leaves Ctrl-C, SIGTERM and SIGHUP to it: sent to the whole process group, they stop the sweep,
    which stops its workers before it lets go of the folder's lock (:func:`worker_pool`)."""
    die_with_parent(parent)
    for sig in HELD:
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A process pool of ``workers`` whose workers never outlive the block: left by an exception (Ctrl-C,
    SIGTERM, an error), it kills them, drops the queued jobs and waits until they are gone, so that no worker
    writes a run folder once the sweep has stopped."""
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_started, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        with InterruptsHeld():  # a second Ctrl-C must not leave workers running
            # the pool's own table of its processes: the only handle on them before Python 3.14's kill_workers()
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.kill()
            pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def pool_size(workers: int, jobs: int) -> int:
    """Processes for ``jobs`` independent jobs: ``workers``, where 0 means one per CPU, and never more than the
    jobs (the sweep's runs, then its plots)."""
    return max(1, min(jobs, workers or os.cpu_count() or 1))


def _execute(finished: list[dict[str, Any]], todo: list[RunTask], workers: int, ray_address: str | None = None
             ) -> Iterable[dict[str, Any]]:
    """The summary of every run, as runs finish: the ``finished`` ones', then those of ``todo`` simulated and
    written here or in a process pool, or simulated on Ray and written here."""
    yield from finished
    todo = sorted(todo, key=lambda t: (t.seed, t.qps))  # (stable) a trace's runs in a row, a seed's traces
    if ray_address is not None:
        from prism.sim.ray_sweep import execute_on_ray  # ray is an optional extra

        for t, (summary, records) in execute_on_ray(todo, ray_address):
            yield write_task(t, summary, records)
        return
    if workers <= 1:
        try:
            for t in todo:
                yield run_task(t)
        finally:
            _RECENT_TRACES.clear()  # this process outlives the sweep: its traces go with it
            _RECENT_PROMPTS.clear()
        return
    with worker_pool(workers) as pool:
        for fut in as_completed([pool.submit(run_task, t) for t in todo]):
            yield fut.result()
