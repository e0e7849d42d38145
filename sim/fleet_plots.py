"""Pictures of fleets: each GPU's memory over time, and a fleet sweep's SLO attainment against the rate scale
and the number of GPUs, one curve per sharing scheme."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from prism.output import save_figure  # noqa: E402

#: the parts of a GPU's memory, bottom to top, as sim/fleet.py samples them (bytes)
PARTS = (("weights", "#6c757d"), ("KV of running requests", "#d62728"), ("cached prefixes", "#1f77b4"),
         ("mapped, unused", "#aec7e8"), ("free", "#e9ecef"))


def plot_memory(samples: Sequence[tuple], path: Path, title: str = "") -> Path:
    """One panel per GPU: its memory (GiB) over time, stacked by part."""
    gpus = sorted({g for _, g, *_ in samples})
    fig, axes = plt.subplots(len(gpus), 1, figsize=(9, 1.9 * len(gpus) + 0.8), sharex=True, squeeze=False)
    for ax, g in zip(axes[:, 0], gpus):
        rows = np.array([s for s in samples if s[1] == g], dtype=float)
        t, parts = rows[:, 0], rows[:, 2:7].T / 2**30
        ax.stackplot(t, parts, colors=[c for _, c in PARTS], labels=[n for n, _ in PARTS], step="post")
        ax.set_ylabel(f"GPU {g}\nGiB")
        ax.set_xlim(t[0], t[-1] if len(t) > 1 else t[0] + 1)
        ax.set_ylim(0, parts.sum(axis=0).max() * 1.02 or 1)
    axes[-1, 0].set_xlabel("time (s)")
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        axes[0, 0].set_title(title, fontsize=9)
    return save_figure(fig, path)  # laid out tight there


def plot_attainment(agg: list[dict[str, Any]], out: Path, target: float | None = None) -> list[Path]:
    """``attainment_vs_rate_scale.png`` (a panel per GPU count, a curve per scheme) and, with several GPU
    counts, ``attainment_vs_gpus.png`` (a panel per rate scale); 95% CIs over seeds as bars."""
    paths = []
    sharings = list(dict.fromkeys(a["sharing"] for a in agg))
    gpus = sorted({int(a["gpus"]) for a in agg})
    scales = sorted({float(a["rate_scale"]) for a in agg})
    colors = {s: f"C{i % 10}" for i, s in enumerate(sharings)}
    for name, panels, key, x_key, xlabel in (
            ("attainment_vs_rate_scale.png", gpus, "gpus", "rate_scale", "rate scale"),
            ("attainment_vs_gpus.png", scales, "rate_scale", "gpus", "GPUs")):
        if name == "attainment_vs_gpus.png" and len(gpus) < 2:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 1.6, 3.2), squeeze=False,
                                 sharey=True)
        for ax, v in zip(axes[0], panels):
            for s in sharings:
                rows = sorted((a for a in agg if a["sharing"] == s and float(a[key]) == v), key=lambda a: a[x_key])
                if not rows:
                    continue
                x = [float(a[x_key]) for a in rows]
                ax.errorbar(x, [a["attainment"] for a in rows], yerr=[a.get("attainment_ci95", 0.0) for a in rows],
                            marker="o", ms=3, capsize=2, color=colors[s], label=s)
            if target is not None:
                ax.axhline(target, color="k", lw=0.6, ls=":")
            ax.set_title(f"{v:g} {'GPUs' if key == 'gpus' else 'x rate'}", fontsize=9)
            ax.set_xlabel(xlabel)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
        axes[0, 0].set_ylabel("SLO attainment (TTFT and TPOT)")
        axes[0, -1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        paths.append(save_figure(fig, out / name))
    return paths
