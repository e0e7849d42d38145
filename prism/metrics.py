"""Per-request records, the run summary (TTFT percentiles, hit rate, throughput) and their files.

Engine-agnostic: the simulator and a live server record the same :class:`RequestRecord` per request and
build ``summary.json`` with the same :func:`run_summary`, so their ``requests.csv`` and ``summary.json`` compare
column for column and key for key.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
from array import array
from dataclasses import asdict, dataclass, fields
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from prism.errors import UserError
from prism.output import atomic_path, prepare_run_dir, write_atomic_text
from prism.settings import RunSpec


@dataclass(slots=True)
class RequestRecord:
    """One served request, as requests.csv has it. Not frozen: a frozen dataclass sets each of its fields through
    ``object.__setattr__``, 1.5 us a record against 0.2 (``benchmarks/bench_vs_base.py``: 2% of a run)."""

    id: int
    arrival: float
    sent: float  # handed to the engine (after any client-side concurrency wait)
    prefill_start: float  # admission
    prefill_end: float
    first_token: float
    finish: float
    prompt_tokens: int
    hit_tokens: int
    output_tokens: int
    lane: str
    realigned: bool
    instance: int | None = None  # the instance of a cluster that served it (None: a single engine)
    model: str | None = None  # the model that served it, in a fleet of several models
    gpu: str | None = None  # the GPU(s) it ran on, in a fleet ("0", or "2+3" for a model over two GPUs)

    @property
    def w_admit(self) -> float:
        return self.prefill_start - self.arrival

    @property
    def t_prefill(self) -> float:
        return self.prefill_end - self.prefill_start

    @property
    def t_1tok(self) -> float:
        return self.first_token - self.prefill_end

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        """Time per output token after the first (0 for a request of one output token)."""
        return (self.finish - self.first_token) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


#: what a run writes into its folder; an earlier run's are removed (summary.json first) before a run starts
RUN_FILES = ("summary.json", "requests.csv", "timeline.json", "memory.csv", "memory.png")
#: what a live run adds for each server, in its folder (a cluster: in instance-<i>/ folders): its log, the plugin's
#: settings, counters and event logs
SERVER_FILES = ("events.jsonl", "counters.json", "overruns.jsonl", "plugin.json", "server.log", "segments.json",
                "router.log")  # the last two: a run behind sglang-router


#: a sweep's manifest (``sim/sweep.py``): a folder that holds one is a sweep's
SWEEP_MANIFEST = "sweep.json"


def prepare_run_folder(path: str | Path, flag: str = "--out") -> Path:
    """A run's folder, checked and created, with every file an earlier run of either engine left there removed
    (summary.json first; a live cluster's instance folders too), so that a simulated run never lands beside a
    live run's server log and plugin files, nor a live run beside an older one's. A sweep's folder is refused:
    the run's summary.json would sit among the sweep's tables, read as one of its results."""
    if (Path(path) / SWEEP_MANIFEST).exists():
        raise UserError(f"holds a sweep ({SWEEP_MANIFEST}); a run goes in a folder of its own: use another {flag}",
                        f"{flag} {path}")
    out = prepare_run_dir(path, (*RUN_FILES, *SERVER_FILES), flag)
    for d in sorted(out.glob("instance-*")):
        if d.is_dir():
            prepare_run_dir(d, SERVER_FILES, flag)
            with contextlib.suppress(OSError):  # empty now (a cluster's run makes its own again); else kept
                d.rmdir()
    return out


CSV_COLUMNS = [f.name for f in fields(RequestRecord) if f.name not in ("instance", "model", "gpu")] + [
    "w_admit", "t_prefill", "t_1tok", "ttft"]
#: a cluster's requests.csv (more than one instance) adds the instance that served each request
CLUSTER_CSV_COLUMNS = CSV_COLUMNS + ["instance"]
#: a fleet's (several models sharing GPUs) adds each request's time per output token, its model and GPU
FLEET_CSV_COLUMNS = CSV_COLUMNS + ["tpot", "model", "gpu"]


def csv_columns(cluster: bool, fleet: bool = False) -> list[str]:
    return FLEET_CSV_COLUMNS if fleet else CLUSTER_CSV_COLUMNS if cluster else CSV_COLUMNS


def csv_float(v: float) -> str:
    """A float as every CSV here writes it: ``repr(round(v, 9))``, the shortest text of v rounded to 9 decimals.

    Where ``1e-4 <= |v| < 1e6`` that text is ``%.9f`` with its trailing zeros dropped: ``round`` keeps the
    correctly rounded 9-decimal value that ``%.9f`` prints, and a decimal of at most 15 significant digits
    is the shortest text of the float nearest it; ``repr`` writes exponents only outside that range. One
    conversion instead of three: a requests.csv row is written in 56% of the time. The tests hold it to
    ``repr(round(v, 9))``."""
    if 1e-4 <= abs(v) < 1e6:
        text = ("%.9f" % v).rstrip("0")
        return text + "0" if text[-1] == "." else text
    return repr(round(float(v), 9))  # float(): numpy's scalars have a repr of their own


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return csv_float(v)
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


#: characters that make the csv module quote a cell (QUOTE_MINIMAL, the excel dialect)
_NEEDS_QUOTES = re.compile(r'[,"\r\n]')


def _column_cells(values: tuple) -> Sequence[str]:
    """One column of a block of rows as :func:`_fmt` writes each value, quoted where the csv module quotes.

    Formatting a row value by value and through ``csv.writer`` cost a fifth of a 20,480-request FCFS run; a
    column of one type is formatted in bulk (C-level ``map``). Floats (most of a row): ``%.9f`` with its trailing
    zeros dropped is :func:`csv_float` where 1e-4 <= |v| < 1e6 or v is 0; the text shows the values beyond that
    where the two differ (over 16 characters, an ``n`` of nan or inf, a nonzero ``0.0000``; below 5e-10, or just
    under 1e-4, they agree), and those are written one by one."""
    kinds = set(map(type, values))
    if kinds == {float}:
        fixed = list(map("%.9f".__mod__, values))
        text = "\n" + "\n".join(map(str.rstrip, fixed, repeat("0"))) + "\n"
        cells = text.replace(".\n", ".0\n").split("\n")[1:-1]
        if max(map(len, fixed)) > 16 or "n" in text or "\n0.0000" in text or "\n-0.0000" in text:
            return [csv_float(v) if "." not in c[:7] or c.startswith(("0.0000", "-0.0000")) else c
                    for c, v in zip(cells, values)]
        return cells
    if kinds == {int}:
        return list(map(str, values))
    cells = values if kinds == {str} else [_fmt(v) for v in values]
    if any(map(_NEEDS_QUOTES.search, cells)):
        return ['"' + c.replace('"', '""') + '"' if _NEEDS_QUOTES.search(c) else c for c in cells]
    return cells


def csv_lines(records: Sequence[Any], values: Callable[[Any], tuple]) -> list[str]:
    """The CSV lines (``\\r\\n`` ended, as ``csv.writer`` writes them) of ``records``, a row each of
    ``values(record)``: every value as :func:`_fmt` writes it."""
    if not records:
        return []
    columns = [_column_cells(col) for col in zip(*map(values, records))]
    if len(columns) == 1:  # a row of one empty cell is written quoted, else it would be an empty line
        columns = [[c or '""' for c in columns[0]]]
    return [line + "\r\n" for line in map(",".join, zip(*columns))]


def write_requests_csv(records: Iterable[RequestRecord], path: Path, cluster: bool = False, fleet: bool = False,
                       columns: list[str] | None = None) -> None:
    """The whole ``requests.csv`` in request order, written atomically (a stream's file is replaced whole);
    ``cluster``: with the instance column (a run on more than one instance); ``columns``: these instead."""
    columns = columns or csv_columns(cluster, fleet)
    values, rows = attrgetter(*columns), sorted(records, key=lambda r: r.id)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        f.writelines(csv_lines([columns], tuple))
        for i in range(0, len(rows), 4096):
            f.writelines(csv_lines(rows[i:i + 4096], values))


def read_requests_csv(path: Path) -> list[RequestRecord]:
    """A ``requests.csv`` back as records (the columns :func:`write_requests_csv` writes; ``instance`` where
    a cluster's file has it)."""
    out = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            inst = row.get("instance")
            out.append(RequestRecord(int(row["id"]), float(row["arrival"]), float(row["sent"]),
                                     float(row["prefill_start"]), float(row["prefill_end"]), float(row["first_token"]),
                                     float(row["finish"]), int(row["prompt_tokens"]), int(row["hit_tokens"]),
                                     int(row["output_tokens"]), row["lane"], row["realigned"] == "1",
                                     int(inst) if inst not in (None, "") else None))
    return out


class RecordStream:
    """Appends each finished request to a CSV as it completes, so that an interrupted (even a killed) run keeps
    what it simulated; :meth:`finish` then puts the file in request order. ``flush_every``: rows between flushes
    to the file (a live run passes 1: its rows come at most hundreds a second and each cost real serving time; a
    simulation finishes thousands a second and flushes in blocks, formatted together: :func:`csv_lines`).

    Each row is formatted once: :meth:`finish` reorders the text already written (the stream notes each row's
    id and length) instead of formatting every record again, which cost a sixth of a 20,480-request run."""

    def __init__(self, path: Path, flush_every: int = 256, cluster: bool = False, fleet: bool = False) -> None:
        self.path = path
        self._f = path.open("w", newline="")
        self._columns = csv_columns(cluster, fleet)
        self._values = attrgetter(*self._columns)
        self._block: list[RequestRecord] = []  # records not yet in the file
        header = csv_lines([self._columns], tuple)[0]
        self._f.write(header)
        self._ids = array("q")  # machine integers: 8 bytes a row, not an int object's 36
        self._lengths = array("q", [len(header)])  # bytes of each row in the file (the header's first)
        self._every = flush_every

    def __call__(self, r: RequestRecord) -> None:
        self._block.append(r)
        self._ids.append(r.id)
        if len(self._block) >= self._every:
            self._flush()

    def _flush(self) -> None:
        lines = csv_lines(self._block, self._values)
        text = "".join(lines)
        try:
            self._f.write(text)
            self._f.flush()
        except OSError as e:  # a disk that fills up mid-run
            raise UserError(f"cannot write: {e.strerror or e}", str(self.path)) from None
        if text.isascii():  # bytes in the file: characters, unless a name has others
            self._lengths.extend(map(len, lines))
        else:
            self._lengths.extend(len(line.encode(self._f.encoding)) for line in lines)
        self._block.clear()

    def close(self) -> None:
        if not self._f.closed:
            self._flush()
            self._f.close()

    def finish(self, records: Sequence[RequestRecord]) -> None:
        """The file rewritten whole in request order (atomically), as :func:`write_requests_csv` writes
        ``records``, from the rows already written where they are those records, else from ``records``."""
        self.close()
        streamed = len(self._lengths) == len(self._ids) + 1 and self._ids == array("q", [r.id for r in records])
        ends = np.cumsum(self._lengths)
        if not streamed or self.path.stat().st_size != ends[-1]:  # a row lost between finishing and streaming
            write_requests_csv(records, self.path, columns=self._columns)  # (Ctrl-C at that instant): format again
            return
        order = np.argsort(np.frombuffer(self._ids, dtype=np.int64), kind="stable") + 1  # row i is line i + 1
        starts = ends - np.frombuffer(self._lengths, dtype=np.int64)
        with self.path.open("rb") as src, atomic_path(self.path) as tmp, tmp.open("wb") as f:
            f.write(_read_at(src, 0, int(ends[0])))
            for i in range(0, len(order), self.REORDER_BLOCK):
                block = order[i:i + self.REORDER_BLOCK]
                f.writelines(_rows(src, starts[block].tolist(), ends[block].tolist()))

    #: rows reordered at a time (:meth:`finish`): the whole file in memory cost 31 MB of a 204,800-request run's
    #: 327 MB peak; rows finish nearly in request order, so a block's rows lie together in the file
    REORDER_BLOCK = 8192


def _read_at(f, start: int, end: int) -> bytes:
    f.seek(start)
    return f.read(end - start)


def _rows(f, starts: list[int], ends: list[int]) -> list[bytes]:
    """The rows of a file at these offsets: one read of the stretch they lie in, unless it is more than twice
    their bytes (rows finished far out of request order), then a read per row."""
    lo, hi = min(starts), max(ends)
    if hi - lo > 2 * (sum(ends) - sum(starts)):
        return [_read_at(f, a, b) for a, b in zip(starts, ends)]
    text = _read_at(f, lo, hi)
    return [text[a - lo:b - lo] for a, b in zip(starts, ends)]


#: the percentiles a summary reports, as ``np.percentile`` makes them its quantiles
_QUANTILES = np.true_divide([50, 90, 95, 99], 100)


def linear_percentiles(a: np.ndarray) -> np.ndarray:
    """``np.percentile(a, [50, 90, 95, 99])`` of a non-empty 1-d float array, to the last bit (numpy's default
    ``linear`` method, ``numpy/lib/_function_base_impl.py``: ``_quantile``, ``_get_indexes``, ``_lerp``), from a
    sort. Why: numpy's partitions the array at ``np.unique`` of its indexes, and ``np.unique`` imports numpy.ma,
    7-8 ms of every process that writes a summary (3% of a 2,048-request run). ``tests/test_results_on_disk.py``
    holds it to numpy's."""
    s = np.sort(a)
    if np.isnan(s[-1]):  # numpy's answer for a slice with a NaN (sorted last)
        return np.full(len(_QUANTILES), s[-1])
    virtual = (len(s) - 1) * _QUANTILES
    below = np.floor(virtual)
    above = below + 1
    last = virtual >= len(s) - 1
    below[last] = above[last] = -1
    below, above = below.astype(np.intp), above.astype(np.intp)
    gamma = virtual - below
    lower, upper = s[below], s[above]
    diff = upper - lower
    out = lower + diff * gamma
    np.subtract(upper, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


def percentiles(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    if not len(a):
        return {k: float("nan") for k in ("mean", "p50", "p90", "p95", "p99", "max")}
    p = linear_percentiles(a)
    return {"mean": float(a.mean()), "p50": float(p[0]), "p90": float(p[1]), "p95": float(p[2]),
            "p99": float(p[3]), "max": float(a.max())}


def summarize(records: Sequence[RequestRecord], warmup: int = 0) -> dict[str, Any]:
    """Latency statistics over the records after the first ``warmup`` arrivals; throughput over all."""
    ordered = sorted(records, key=lambda r: (r.arrival, r.id))
    measured = ordered[warmup:] if warmup < len(ordered) else ordered
    prompt = sum(r.prompt_tokens for r in measured)
    hit = sum(r.hit_tokens for r in measured)
    span = max(r.finish for r in ordered) - min(r.arrival for r in ordered) if ordered else 0.0
    return {
        "num_requests": len(records),
        "measured_requests": len(measured),
        "ttft_s": percentiles([r.ttft for r in measured]),
        "w_admit_s": percentiles([r.w_admit for r in measured]),
        "t_prefill_s": percentiles([r.t_prefill for r in measured]),
        "e2e_s": percentiles([r.finish - r.arrival for r in measured]),
        "hit_rate": hit / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "throughput_rps": len(ordered) / span if span > 0 else 0.0,
        "makespan_s": span,
    }


def instance_summary(spec: RunSpec, records: Sequence[RequestRecord],
                     instances: Sequence[tuple[str, int]]) -> dict[str, Any] | None:
    """A cluster's part of ``summary.json`` (None for one instance): the router's settings, per instance
    (profile and KV capacity as given in ``instances``) its load (requests served and their share, prefill
    tokens computed), hit rate and TTFT, and the imbalance: max / mean over the instances of requests served
    (``imbalance``) and of prefill tokens computed (``imbalance_prefill_tokens``)."""
    if len(instances) <= 1:
        return None
    ordered = sorted(records, key=lambda r: (r.arrival, r.id))
    measured = ordered[spec.engine.warmup_requests:] if spec.engine.warmup_requests < len(ordered) else ordered
    groups: list[list[RequestRecord]] = [[] for _ in instances]
    for r in measured:
        groups[r.instance].append(r)
    per = []
    for i, ((profile, capacity), rs) in enumerate(zip(instances, groups)):
        prompt, hit = sum(r.prompt_tokens for r in rs), sum(r.hit_tokens for r in rs)
        t = percentiles([r.ttft for r in rs])
        per.append({"instance": i, "profile": profile, "kv_capacity_tokens": capacity, "requests": len(rs),
                    "share": len(rs) / len(measured) if measured else 0.0, "prompt_tokens": prompt,
                    "hit_tokens": hit, "prefill_tokens": prompt - hit, "hit_rate": hit / prompt if prompt else 0.0,
                    "ttft_mean_s": t["mean"], "ttft_p50_s": t["p50"], "ttft_p99_s": t["p99"]})

    def imbalance(values: list[int]) -> float:
        mean = sum(values) / len(values)
        return max(values) / mean if mean else 0.0

    c = spec.cluster
    return {"instances": c.instances, "router": c.router, "router_delay_s": c.router_delay_s,
            "view_interval_s": c.view_interval_s, "imbalance": imbalance([p["requests"] for p in per]),
            "imbalance_prefill_tokens": imbalance([p["prefill_tokens"] for p in per]), "per_instance": per}


def slo_stats(records: Sequence[RequestRecord], ttft_slo: float | None, tpot_slo: float | None,
              span: float) -> dict[str, Any]:
    """TTFT and TPOT percentiles of ``records`` and their SLO attainment: the share within the TTFT SLO, within
    the TPOT SLO, within both (``attainment``), and goodput (requests within both per second of ``span``). A
    missing SLO is met by every request."""
    ttft = np.array([r.ttft for r in records])
    tpot = np.array([r.tpot for r in records])
    ok_ttft = ttft <= ttft_slo if ttft_slo is not None else np.ones(len(records), bool)
    ok_tpot = tpot <= tpot_slo if tpot_slo is not None else np.ones(len(records), bool)
    both = ok_ttft & ok_tpot
    n = len(records)
    t, p = percentiles(ttft), percentiles(tpot)
    return {"requests": n, "ttft_p50_s": t["p50"], "ttft_p99_s": t["p99"], "tpot_p50_s": p["p50"],
            "tpot_p99_s": p["p99"], "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo,
            "attainment_ttft": float(ok_ttft.mean()) if n else 0.0,
            "attainment_tpot": float(ok_tpot.mean()) if n else 0.0,
            "attainment": float(both.mean()) if n else 0.0,
            "goodput_rps": float(both.sum()) / span if span > 0 else 0.0}


def fleet_summary(records: Sequence[RequestRecord], model_of: Mapping[int, str],
                  slos: Mapping[str, tuple[float | None, float | None]], warmup: int = 0,
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A fleet's part of ``summary.json``: SLO attainment and goodput overall and per model (``model_of``: each
    request id's model; ``slos``: each model's TTFT and TPOT SLO), after the first ``warmup`` arrivals, and what
    the fleet reports (``extra``). Overall, each request is judged by its own model's SLOs."""
    ordered = sorted(records, key=lambda r: (r.arrival, r.id))
    measured = ordered[warmup:] if warmup < len(ordered) else ordered
    span = max(r.finish for r in ordered) - min(r.arrival for r in ordered) if ordered else 0.0
    per: dict[str, list[RequestRecord]] = {m: [] for m in slos}
    for r in measured:
        per[model_of[r.id]].append(r)
    models = {m: slo_stats(rs, *slos[m], span) for m, rs in per.items()}
    met = sum(round(s["attainment"] * s["requests"]) for s in models.values())
    met_ttft = sum(round(s["attainment_ttft"] * s["requests"]) for s in models.values())
    met_tpot = sum(round(s["attainment_tpot"] * s["requests"]) for s in models.values())
    n = len(measured)
    t, p = percentiles([r.ttft for r in measured]), percentiles([r.tpot for r in measured])
    overall = {"requests": n, "ttft_p50_s": t["p50"], "ttft_p99_s": t["p99"], "tpot_p50_s": p["p50"],
               "tpot_p99_s": p["p99"], "attainment_ttft": met_ttft / n if n else 0.0,
               "attainment_tpot": met_tpot / n if n else 0.0, "attainment": met / n if n else 0.0,
               "goodput_rps": met / span if span > 0 else 0.0}
    return {**dict(extra or {}), **overall, "per_model": models}


def run_summary(spec: RunSpec, records: Sequence[RequestRecord], *, engine_kind: str, kv_capacity_tokens: int,
                counters: Mapping[str, int], wall_s: float,
                served_infinite_cache_hit_rate: float | None = None, complete: bool = True,
                cluster: Mapping[str, Any] | None = None, fleet: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``summary.json`` of a run: the run description, :func:`summarize` over ``records`` and what the engine
    reports (its KV capacity, its counters and the policies' own, the wall time). ``engine_kind`` says which
    engine served the run ("sim": the simulator); ``complete`` is false for an interrupted run (``records``
    are then the requests that finished). ``cluster``: :func:`instance_summary` of a run on several instances
    (``kv_capacity_tokens`` is then the instances' total)."""
    return {
        "complete": complete,
        "method": spec.label,
        "scheduler": spec.scheduler,
        "eviction": spec.eviction,
        "qps": spec.qps,
        "seed": spec.seed,
        "trace": spec.trace_source,
        "trace_kind": spec.trace.kind,
        **summarize(records, spec.engine.warmup_requests),
        "infinite_cache_hit_rate": spec.trace.infinite_cache_hit_rate(),
        **({"served_infinite_cache_hit_rate": served_infinite_cache_hit_rate}
           if served_infinite_cache_hit_rate is not None else {}),
        "kv_capacity_tokens": kv_capacity_tokens,
        "profile": spec.profile.name,
        "engine_kind": engine_kind,
        "engine": asdict(spec.engine),
        "counters": dict(sorted(counters.items())),
        **({"cluster": dict(cluster)} if cluster is not None else {}),
        **({"fleet": dict(fleet)} if fleet is not None else {}),
        "wall_s": wall_s,
    }


def write_json(obj: Any, path: Path) -> None:
    """``obj`` as indented JSON, written atomically."""
    write_atomic_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_summary(path: Path) -> dict[str, Any] | None:
    """A run's ``summary.json``, or None where it is missing or unreadable (a run that never finished)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
