"""Sweep plots: TTFT percentiles and hit rate against QPS, and the TTFT distribution at one QPS; one curve per
series (a method on one engine, or ``METHOD@ROUTERxN`` on a cluster: one curve per router); a sweep of
clusters adds the imbalance (max/mean requests per instance) against QPS."""

from __future__ import annotations

import csv
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from prism.output import save_figure  # noqa: E402
from prism.sim.sweep import pool_size, worker_pool  # noqa: E402


def _name(a: dict[str, Any]) -> str:
    return a.get("series") or a["method"]


def _series(agg: list[dict[str, Any]], metric: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    out = {}
    for method in dict.fromkeys(map(_name, agg)):
        rows = sorted((a for a in agg if _name(a) == method and metric in a), key=lambda a: a["qps"])
        out[method] = (np.array([a["qps"] for a in rows]), np.array([a[metric] for a in rows]),
                       np.array([a.get(metric + "_ci95", 0.0) for a in rows]))
    return out


MARKERS = "os^Dv"  # a series past the palette's colors takes the next marker (and CDF line style)
LINES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)))
LEGEND_ROWS = 26  # legend entries a column holds beside a plot of the default height


def _styles(agg: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """(color, style index) per series, the same in every plot of a sweep: matplotlib's ten colors, or twenty
    (tab20) for a sweep of more series (a cluster sweep: methods x routers x sizes), and past those the
    next marker, so that no two series look alike up to 100."""
    names = list(dict.fromkeys(map(_name, agg)))
    if len(names) <= 10:
        return {m: (f"C{i}", 0) for i, m in enumerate(names)}
    tab20 = plt.get_cmap("tab20").colors
    return {m: (matplotlib.colors.to_hex(tab20[i % 20]), i // 20 % len(MARKERS)) for i, m in enumerate(names)}


def _legend(fig, ax, handles: list | None = None) -> None:
    """The legend in plotting order (``handles``: (handle, label) pairs; None: the axes' own): right of the
    plot in one column, or for more entries than that holds, below it in columns across the figure's width,
    the figure grown by the rows it takes."""
    handles = handles or list(zip(*ax.get_legend_handles_labels()))
    if len(handles) <= LEGEND_ROWS:
        ax.legend(*zip(*handles), fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        return
    ncol = max(1, int(fig.get_figwidth() // 2.6))  # columns of about 2.6 in (a long series name and its note)
    rows = -(-len(handles) // ncol)
    fig.set_figheight(fig.get_figheight() + 0.14 * rows + 0.3)
    # under the x axis's label: a pad in font sizes (7 pt each), so it holds whatever height the axes get
    ax.legend(*zip(*handles), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0), borderaxespad=5, ncol=ncol)


def _line_plot(agg, metric: str, ylabel: str, path: Path, log: bool = False, extra=None,
               infinite: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    styles, legend = _styles(agg), []
    for method, (x, y, ci) in _series(agg, metric).items():
        color, k = styles[method]
        # on a log axis a confidence interval wider than the mean would reach zero: clip its lower arm
        lower = np.minimum(ci, 0.9 * y) if log else ci
        legend.append((ax.errorbar(x, y, yerr=[lower, ci], marker=MARKERS[k], capsize=3, color=color), method))
        if extra:
            for ref_metric, style, name in extra:
                ref = _series(agg, ref_metric).get(method)
                if ref is not None and len(ref[0]):
                    legend.append((ax.plot(ref[0], ref[1], style, color=color, alpha=0.6)[0], f"{method} {name}"))
    if infinite:  # a property of the trace, the same for every method
        by_qps: dict[float, list[float]] = {}
        for a in agg:
            if "infinite_cache_hit_rate" in a:
                by_qps.setdefault(a["qps"], []).append(a["infinite_cache_hit_rate"])
        xs = sorted(by_qps)
        legend.append((ax.plot(xs, [np.mean(by_qps[x]) for x in xs], "k:")[0], "infinite cache (trace order)"))
    ax.set_xlabel("offered load (QPS)")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    _legend(fig, ax, legend)
    return save_figure(fig, path)


def plot_sweep(out: Path, agg: list[dict[str, Any]], cdf_qps: float | None,
               folders: dict[tuple[str, float], Path] | None = None, workers: int = 1) -> list[Path]:
    """The sweep's plots in ``out`` (each written atomically); a TTFT CDF plot of another QPS left by an
    earlier sweep is removed. ``folders`` maps (method, qps) to the run folder of the CDF's curve (default:
    the first ``runs/<method>/qps<Q>-seed*`` folder). ``workers`` as the sweep's (0: one per CPU): more than
    one draws the plots in that many processes at once, since drawing is the sweep's last step, with every
    other core idle (a plot takes about a tenth of a second of matplotlib's text layout and rasterizing)."""
    plots = [
        partial(_line_plot, agg, "ttft_p99_s", "P99 TTFT (s)", out / "ttft_p99_vs_qps.png", log=True),
        partial(_line_plot, agg, "ttft_p50_s", "P50 TTFT (s)", out / "ttft_p50_vs_qps.png", log=True),
        partial(_line_plot, agg, "hit_rate", "KV hit rate (Σ hit / Σ prompt tokens)", out / "hit_rate_vs_qps.png",
                extra=[("belady_hit_rate", "--", "Belady"),
                       ("served_infinite_cache_hit_rate", ":", "infinite cache (as served)")], infinite=True),
    ]
    if any("imbalance" in a for a in agg):
        plots.append(partial(_line_plot, [a for a in agg if "imbalance" in a], "imbalance",
                             "imbalance (max / mean requests per instance)", out / "imbalance_vs_qps.png"))
    if cdf_qps is not None:
        curves = {}
        for method, style in _styles(agg).items():
            if folders is None:
                runs = sorted((out / "runs" / method).glob(f"qps{cdf_qps:g}-seed*"))
            else:
                runs = [folders[(method, cdf_qps)]] if (method, cdf_qps) in folders else []
            if runs and (runs[0] / "requests.csv").is_file():
                curves[method] = (runs[0] / "requests.csv", style)
        if curves:
            plots.append(partial(_cdf_plot, curves, cdf_qps, out / f"ttft_cdf_qps{cdf_qps:g}.png"))
    workers = pool_size(workers, len(plots))
    if workers > 1:
        with worker_pool(workers) as pool:
            paths = [f.result() for f in [pool.submit(plot) for plot in plots]]
    else:
        paths = [plot() for plot in plots]
    for stale in set(out.glob("ttft_cdf_qps*.png")) - set(paths):
        stale.unlink()
    return paths


def _cdf_plot(curves: dict[str, tuple[Path, tuple[str, int]]], cdf_qps: float, path: Path) -> Path:
    """The TTFT CDF at one QPS: a curve per series (its requests.csv, its style)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, (csv_path, (color, k)) in curves.items():
        with csv_path.open() as f:
            ttft = np.sort([float(r["ttft"]) for r in csv.DictReader(f)])
        ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), linestyle=LINES[k], label=method, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF at {cdf_qps:g} QPS (first seed)")
    ax.grid(alpha=0.3)
    if len(curves) <= 10:
        ax.legend(fontsize=7)
    else:  # beside the plot, not over its curves
        _legend(fig, ax)
    return save_figure(fig, path)


ABLATION_SCALE = 1.6  # shares beyond this are written on their bars, not drawn to scale


def plot_ablation(out: Path, table: list[dict[str, Any]]) -> list[Path]:
    """``ablation_qps<Q>.png`` per QPS of an ablation table (``sim/ablation.py``): each part's share of its
    method's hit-rate gain and P99 TTFT gain over the base engine, with 95% confidence intervals, a group of
    bars per method (the sum of parts last); an earlier sweep's plot of another QPS is removed."""
    paths = []
    for qps in sorted({r["qps"] for r in table}):
        rows = [r for r in table if r["qps"] == qps and r["row"] not in ("gain", "base")]
        gains = {r["method"]: r for r in table if r["qps"] == qps and r["row"] == "gain"}
        labels = [f"{r['method']}: {r['row']}" for r in rows]
        fig, axes = plt.subplots(1, 2, figsize=(10, 0.32 * len(rows) + 1.6), sharey=True)
        y = np.arange(len(rows))[::-1]
        colors = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(r["method"] for r in rows))}
        for ax, key, title in ((axes[0], "hit", "share of the hit-rate gain"),
                               (axes[1], "p99", "share of the P99 TTFT gain")):
            share = np.array([np.nan if r.get(f"{key}_share") is None else r[f"{key}_share"] for r in rows],
                             dtype=float)
            ci = np.array([np.nan if r.get(f"{key}_share_ci95") is None else r[f"{key}_share_ci95"] for r in rows],
                          dtype=float)
            # a share of a gain near zero (or of a loss) can be far off scale: such bars end at the axis's edge
            # and say their value
            value, err = np.nan_to_num(share), np.where(np.isnan(ci), 0, ci)
            off = np.abs(value) > ABLATION_SCALE
            ax.barh(y, np.clip(value, -ABLATION_SCALE, ABLATION_SCALE), xerr=np.where(off, 0, err), capsize=3,
                    color=[matplotlib.colors.to_rgba(colors[r["method"]], 0.4 if r["row"] == "sum of parts" else 0.9)
                           for r in rows])
            for yi, v, e in zip(y[off], value[off], err[off]):
                ax.text(np.sign(v) * ABLATION_SCALE * 0.97, yi, f"{v:.2f} ± {e:.2f}", fontsize=7, va="center",
                        ha="right" if v > 0 else "left")
            ax.set_xlim(min(-0.2, value[~off].min(initial=0) - 0.2) if off.sum() == 0 else -ABLATION_SCALE,
                        max(1.2, value[~off].max(initial=0) + 0.2) if off.sum() == 0 else ABLATION_SCALE)
            ax.axvline(0, color="k", lw=0.8)
            ax.axvline(1, color="k", lw=0.8, ls=":")
            ax.set_title(title, fontsize=9)
            ax.grid(axis="x", alpha=0.3)
            gain = "; ".join(f"{m} {g[f'{key}_delta']:+.3g}" for m, g in gains.items()
                             if g.get(f"{key}_delta") is not None)
            ax.set_xlabel(f"gain over the base engine:\n{gain}" + (" (hit rate)" if key == "hit" else " s"),
                          fontsize=7)
        axes[0].set_yticks(y, labels, fontsize=7)
        fig.suptitle(f"where the gain comes from, {qps:g} QPS (95% CI over seeds)", fontsize=10)
        paths.append(save_figure(fig, out / f"ablation_qps{qps:g}.png"))
    for stale in set(out.glob("ablation_qps*.png")) - set(paths):
        stale.unlink()
    return paths
