"""``prism-theory``: the queueing model's predictions beside the simulator's measurements.

At each QPS the simulator runs the method; the model (models_queueing) takes the run's measured hit rate,
the trace's prompt lengths and the calibrated step costs, and predicts utilisation, throughput, TTFT P50/P99
and the knee (the largest stable arrival rate). Rows where the model departs from the simulation by more
than 20% are flagged.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from prism.cli.common import check_workers, entry_point, parse_rates, table
from prism.errors import UserError
from prism.models_queueing.model import EngineQueue, wave_size
from prism.metrics import write_json
from prism.output import atomic_path, check_out_file, write_csv
from prism.settings import RunSpec, check_knobs_used, merge_flags, read_config, settings_from
from prism.sim.sweep import Sweep, task_config
from prism.traces.spec import is_materialized, resolve

THRESHOLD = 0.20
OUTPUTS = ("theory.json", "theory.csv", "theory.png")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prism-theory", description=__doc__.split(":", 1)[1].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example:\n  prism-theory --trace traces/zipf.yaml --method prism "
                                       "--qps 20,40,60,80 --out runs/theory")
    p.add_argument("--trace", required=True)
    p.add_argument("--method", default="prism", help="method preset or SCHEDULER+EVICTION")
    p.add_argument("--qps", default="10,20,30,40", help="comma-separated arrival rates")
    p.add_argument("--config", help="YAML settings (as for prism-sim)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--profile", help="GPU:MODEL or a profile YAML")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--out", help="output folder (default runs/theory-<trace>-<method>)")
    p.add_argument("--force", action="store_true", help="replace earlier runs of other settings in --out")
    return p


def _rel(model: float, sim: float) -> float:
    if math.isinf(model):
        return math.inf
    return abs(model - sim) / max(abs(sim), 1e-12)


def compare(summaries: list[dict], spec: RunSpec) -> list[dict]:
    """One row per QPS: the model's predictions from the run's hit rate, and the simulation's figures."""
    profile, trace, eng = spec.profile, spec.trace, spec.engine
    lengths = np.array([r.prompt_len for r in trace.requests])
    out_len = float(np.mean([r.output_len for r in trace.requests]))
    cap = eng.max_total_tokens if eng.max_total_tokens is not None else profile.kv_capacity_tokens
    m = wave_size(eng.max_running_requests, cap, float(lengths.mean()), out_len)
    rows = []
    for s in sorted(summaries, key=lambda s: s["qps"]):
        lam = float(s["qps"])
        q = EngineQueue(profile.cost, lengths, out_len, min(s["hit_rate"], 0.999), m, eng.chunked_prefill_size)
        row = {"qps": lam, "hit_rate": s["hit_rate"], "wave": m, "mu_model": q.service_rate(),
               "rho_model": q.utilisation(lam), "throughput_model": q.throughput(lam),
               "throughput_sim": s["throughput_rps"], "ttft_p50_model": q.ttft(lam, 0.5),
               "ttft_p50_sim": s["ttft_s"]["p50"], "ttft_p99_model": q.ttft(lam, 0.99),
               "ttft_p99_sim": s["ttft_s"]["p99"], "ttft_mean_model": q.ttft(lam), "ttft_mean_sim": s["ttft_s"]["mean"]}
        flags = [name for name in ("throughput", "ttft_p50", "ttft_p99")
                 if _rel(row[f"{name}_model"], row[f"{name}_sim"]) > THRESHOLD]
        row["departs"] = ",".join(flags)
        rows.append(row)
    return rows


def plot(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["qps"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    for key, color in (("ttft_p50", "tab:blue"), ("ttft_p99", "tab:red")):
        model = [r[f"{key}_model"] if math.isfinite(r[f"{key}_model"]) else np.nan for r in rows]
        ax.plot(x, model, "-", color=color, label=f"{key} model")
        ax.plot(x, [r[f"{key}_sim"] for r in rows], "o", color=color, label=f"{key} simulation")
    knee = float(np.mean([r["mu_model"] for r in rows]))
    for a in axes:
        a.axvline(knee, color="gray", ls="--", lw=1, label=f"model knee ≈ {knee:.1f} QPS")
        a.set_xlabel("offered load (QPS)")
        a.grid(alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s)")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(x, [r["throughput_model"] for r in rows], "-", label="model min(λ, μ)")
    ax.plot(x, [r["throughput_sim"] for r in rows], "o", label="simulation")
    ax.set_ylabel("throughput (requests/s)")
    ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


@entry_point("prism-theory")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    qps = parse_rates(args.qps)
    check_workers(args.workers)
    base = merge_flags(read_config(args.config), args.overrides, profile=args.profile)
    where = args.config or "settings"
    check_knobs_used(base, [args.method], where)
    if base.get("cluster"):
        raise UserError("section 'cluster': prism-theory models one engine (run a cluster with prism-sim "
                        "--instances)", where)
    fixed = is_materialized(resolve(args.trace))  # a materialized trace has no seed to set
    spec = settings_from(task_config(base, args.method, qps[0], None if fixed else 0), where).resolve(args.trace)
    seed = int(spec.seed or 0)
    out = Path(args.out) if args.out else Path("runs") / f"theory-{Path(args.trace).stem}-{args.method}"
    sweep = Sweep(str(args.trace), [args.method], qps, [seed], base, out, belady=False, workers=args.workers,
                  force=args.force)
    with sweep.lock():  # checks --out before any simulation
        for name in OUTPUTS:
            check_out_file(out / name, "--out")
        sweep.run()
        summaries = [json.loads((t.folder / "summary.json").read_text()) for t in sweep.tasks()]
        rows = compare(summaries, spec)
        write_json(rows, out / "theory.json")
        write_csv(out / "theory.csv", list(rows[0]), rows)
        png = plot(rows, out / "theory.png", f"{args.method} on {Path(args.trace).name}: model vs simulation")
    fmt = lambda v: "inf" if isinstance(v, float) and math.isinf(v) else v  # noqa: E731
    print(table([[r["qps"], r["hit_rate"], r["rho_model"], fmt(r["throughput_model"]), r["throughput_sim"],
                  fmt(r["ttft_p50_model"]), r["ttft_p50_sim"], fmt(r["ttft_p99_model"]), r["ttft_p99_sim"],
                  r["departs"] or "-"] for r in rows],
                ["qps", "hit_rate", "rho", "thr_model", "thr_sim", "p50_model", "p50_sim", "p99_model", "p99_sim",
                 ">20% off"]))
    print(f"model knee (service rate μ) ≈ {rows[0]['mu_model']:.1f}-{rows[-1]['mu_model']:.1f} QPS "
          f"(wave M̄ = {rows[0]['wave']:g} requests); wrote {out / 'theory.csv'}, {out / 'theory.json'}, {png}")
    return 0
