"""Where a method's gain comes from: the method, its base engine and the method with each of its parts switched
off in turn, over QPS and seeds, and each part's share of the hit-rate and P99 TTFT gain over the base.

The parts are knob settings that each policy class declares (``Policy.parts``, ``Policy.base``; collected by
:func:`prism.policies.registry.ablation`): PRISM's front alignment, buckets and lanes, cold lane, DART's
protection set and DART altogether; ContextPilot's reordering and engine order; k-LPM's FIFO share. The runs are
a sweep (:class:`~prism.sim.sweep.Sweep`: one folder per series, ``summary.csv`` as runs finish, reruns skip
finished runs, one sweep at a time in a folder); a series is the method (``prism``), its base engine (``fcfs``,
``sglang``: run once when methods share it) or a variant (``prism-no-cold_lane``).

Shares, per method and QPS, over the seeds (every run of a seed replays the same trace, so the comparisons are
paired): the method's gain over its base, g = hit(method) − hit(base) and g = P99(base) − P99(method); a part's
contribution d = hit(method) − hit(method without it), or P99(method without it) − P99(method); its share
ΣΔ / Σg. A share's 95% confidence interval is the ratio estimator's (the delta method: the t quantile times the
standard deviation of d_s − share·g_s over the seeds, over √n·|mean g|), a contribution's and a gain's the
paired t interval. Parts interact and the base differs from the method in more than its parts (the front end's
window, for one), so shares need not add to 1: the table's ``sum of parts`` row says how far they do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

from prism.metrics import csv_float, write_json
from prism.output import write_csv
from prism.policies.base import Part
from prism.policies.registry import ablation, knob_sections
from prism.traces.spec import is_materialized, resolve

from prism.sim.sweep import ABLATION_FILES, SWEEP_FILES, RunTask, Sweep, task_config

#: the table's rows besides the parts
GAIN, BASE, SUM = "gain", "base", "sum of parts"
COLUMNS = ["method", "qps", "seeds", "row", "series", "what", "hit_rate", "hit_rate_ci95", "hit_delta",
           "hit_delta_ci95", "hit_share", "hit_share_ci95", "ttft_p99_s", "ttft_p99_s_ci95", "p99_delta",
           "p99_delta_ci95", "p99_share", "p99_share_ci95"]


@dataclass(frozen=True)
class Variant:
    """One series of an ablation: the run's method and the knob settings it adds to the sweep's."""

    series: str
    method: str
    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def variant_name(method: str, part: Part) -> str:
    return f"{method}-no-{part.name}"


def variants(methods: list[str], config: Mapping[str, Any]) -> dict[str, Variant]:
    """Every series the ablation of ``methods`` runs, by name: each method, its base, its variants."""
    knobs = {k: config[k] for k in knob_sections() if k in config}
    out: dict[str, Variant] = {}
    for m in methods:
        a = ablation(m, knobs, "settings: ")
        out.setdefault(a.method, Variant(a.method, a.method))
        out.setdefault(a.base, Variant(a.base, a.base))
        for part, method in a.parts:
            out[variant_name(a.method, part)] = Variant(variant_name(a.method, part), method, part.knobs)
    return out


@dataclass
class AblationSweep(Sweep):
    """A sweep of every series of the methods' ablations (``methods``: the methods ablated)."""

    series: dict[str, Variant] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.series = variants(self.methods, self.config)

    files: ClassVar[tuple[str, ...]] = (*SWEEP_FILES, *ABLATION_FILES)

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "ablate": list(self.methods)}

    def tasks(self) -> list[RunTask]:
        return [self._task(name, q, s) for q in self.qps for name in self.series for s in self.seeds]

    def _task(self, series: str, qps: float, seed: int, instances: int = 1, router: str = "") -> RunTask:
        v = self.series[series]
        fixed = is_materialized(resolve(self.trace))
        cfg = task_config(self.config, v.method, qps, None if fixed else seed)
        for section, values in v.knobs.items():
            cfg[section] = {**(cfg.get(section) or {}), **values}
        return RunTask(self.trace, series, qps, seed, cfg, str(self.out), self.belady)

    def configs(self, qps: float) -> list[dict[str, Any]]:
        """Each series' settings at ``qps`` and the sweep's first seed (to validate before anything runs)."""
        return [self._task(name, qps, self.seeds[0]).config for name in self.series]


# ------------------------------------------------------------------ the table
def _t(n: int) -> float:
    from scipy.special import stdtrit  # Student t quantiles without importing scipy.stats (as sim/sweep.py)

    return float(stdtrit(n - 1, 0.975)) if n > 1 else math.nan


def mean_ci(x: np.ndarray) -> tuple[float, float]:
    """Mean and 95% t half-width (nan for one value)."""
    n = len(x)
    return float(x.mean()), (_t(n) * float(x.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan)


def share_ci(d: np.ndarray, g: np.ndarray) -> tuple[float, float]:
    """Σd / Σg over paired seeds and its 95% half-width by the delta method (nan when the gain is 0)."""
    n, gm = len(g), float(g.mean())
    if gm == 0:
        return math.nan, math.nan
    share = float(d.sum() / g.sum())
    if n < 2:
        return share, math.nan
    return share, _t(n) * float((d - share * g).std(ddof=1)) / (math.sqrt(n) * abs(gm))


def ablation_table(rows: list[dict[str, Any]], methods: list[str], config: Mapping[str, Any]) -> list[dict]:
    """The table (module docstring) from a sweep's rows: per method and QPS, the gain, the base, each part and
    the sum of parts, over the seeds every series of the method ran."""
    knobs = {k: config[k] for k in knob_sections() if k in config}
    runs: dict[tuple[str, float], dict[int, dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault((r["series"], float(r["qps"])), {})[int(r["seed"])] = r
    out = []
    for m in methods:
        a = ablation(m, knobs)
        names = [variant_name(a.method, p) for p, _ in a.parts]
        for qps in sorted({q for s, q in runs if s == a.method}):
            series = [a.method, a.base, *names]
            seeds = sorted(set.intersection(*(set(runs.get((s, qps), {})) for s in series)))
            if not seeds:
                continue

            def col(s: str, metric: str) -> np.ndarray:
                return np.array([float(runs[(s, qps)][k][metric]) for k in seeds])

            hit, p99 = col(a.method, "hit_rate"), col(a.method, "ttft_p99_s")
            g_hit, g_p99 = hit - col(a.base, "hit_rate"), col(a.base, "ttft_p99_s") - p99
            head = {"method": a.method, "qps": qps, "seeds": len(seeds)}

            def row(name: str, s: str, what: str, d_hit=None, d_p99=None) -> dict[str, Any]:
                h, p = (hit, p99) if s == a.method else (col(s, "hit_rate"), col(s, "ttft_p99_s"))
                r = {**head, "row": name, "series": s, "what": what}
                r["hit_rate"], r["hit_rate_ci95"] = mean_ci(h)
                r["ttft_p99_s"], r["ttft_p99_s_ci95"] = mean_ci(p)
                for key, d, g in (("hit", d_hit, g_hit), ("p99", d_p99, g_p99)):
                    if d is not None:
                        r[f"{key}_delta"], r[f"{key}_delta_ci95"] = mean_ci(d)
                        r[f"{key}_share"], r[f"{key}_share_ci95"] = share_ci(d, g)
                return r

            gain = row(GAIN, a.method, f"{a.method} against its base engine {a.base}", g_hit, g_p99)
            gain["hit_share"] = gain["hit_share_ci95"] = gain["p99_share"] = gain["p99_share_ci95"] = math.nan
            out.append(gain)
            out.append(row(BASE, a.base, "the base engine"))
            d_hits, d_p99s = [], []
            for (part, _), s in zip(a.parts, names):
                d_hit, d_p99 = hit - col(s, "hit_rate"), col(s, "ttft_p99_s") - p99
                d_hits.append(d_hit)
                d_p99s.append(d_p99)
                out.append(row(part.name, s, part.doc, d_hit, d_p99))
            total = row(SUM, a.method, "every part's contribution, added", sum(d_hits), sum(d_p99s))
            for k in ("hit_rate", "hit_rate_ci95", "ttft_p99_s", "ttft_p99_s_ci95"):
                total[k] = math.nan
            out.append(total)
    return out


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else csv_float(v)
    return v


def write_ablation(out: Path, table: list[dict[str, Any]], methods: list[str], config: Mapping[str, Any],
                   trace: str) -> list[Path]:
    """``ablation.csv`` and ``ablation.json`` in ``out`` (each written atomically)."""
    knobs = {k: config[k] for k in knob_sections() if k in config}
    write_csv(out / "ablation.csv", COLUMNS, ({k: _cell(r.get(k, math.nan)) for k in COLUMNS} for r in table))
    parts = {}
    for m in methods:
        a = ablation(m, knobs)
        parts[a.method] = {"base": a.base, "parts": [
            {"name": p.name, "what": p.doc, "series": variant_name(a.method, p), "method": method,
             "knobs": json.loads(json.dumps(p.knobs))} for p, method in a.parts]}
    rows = [{k: (None if isinstance(r.get(k), float) and math.isnan(r[k]) else r.get(k)) for k in COLUMNS}
            for r in table]
    write_json({"trace": trace, "methods": parts, "rows": rows}, out / "ablation.json")
    return [out / name for name in ABLATION_FILES]


__all__ = ["AblationSweep", "Variant", "variants", "ablation_table", "write_ablation", "share_ci", "mean_ci"]
