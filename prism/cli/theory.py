"""``prism-theory``: the queueing model's predictions beside the simulator's measurements.

At each QPS the simulator runs the method; the model (models_queueing) takes the run's measured hit rate,
the trace's prompt lengths and the calibrated step costs, and predicts utilisation, throughput, TTFT mean,
P50 and P99 and the knee (the largest stable arrival rate). Waits are the M/G/1 steady state's at low load and the
finite replay's transient near and past the knee (fluid: the backlog grows at λ − μ and the mean wait of N
requests is N·(1/μ − 1/λ)/2; refined by a diffusion, exact at the knee where the fluid predicts nothing; see
models_queueing). Each row says whether λ is below or past the model's knee, and names the figures where model
and simulation depart by more than 20% (``departs``; the relative errors are in the JSON and CSV).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from prism.cli.common import (add_set_flag, add_trace_flag, add_workers_flag, check_workers, entry_point, parse_rates,
                              Parser, table)
from prism.errors import UserError
from prism.models_queueing.model import EngineQueue, wave_size
from prism.metrics import write_json
from prism.output import check_out_file, save_figure, write_csv
from prism.settings import RunSpec, check_cluster_used, check_knobs_used, merge_flags, read_config, settings_from
from prism.sim.sweep import THEORY_FILES, Sweep, task_config
from prism.traces.spec import is_materialized, resolve

THRESHOLD = 0.20


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-theory", description=__doc__.split(":", 1)[1].strip(),
               epilog="example:\n  prism-theory --trace traces/zipf.yaml --method prism "
                      "--qps 20,40,60,80 --out runs/theory")
    add_trace_flag(p)
    p.add_argument("--method", default="prism", help="method preset or SCHEDULER+EVICTION")
    p.add_argument("--qps", default="10,20,30,40", help="comma-separated arrival rates")
    p.add_argument("--config", help="YAML settings (as for prism-sim)")
    add_set_flag(p)
    p.add_argument("--profile", help="GPU:MODEL or a profile YAML (default the settings', else "
                                     "a800-80g-pcie:qwen3-4b-instruct-2507)")
    add_workers_flag(p)
    p.add_argument("--out", help="output folder (default runs/theory-<trace>-<method>)")
    p.add_argument("--force", action="store_true", help="replace earlier runs of other settings in --out")
    return p


FIGURES = ("throughput", "ttft_mean", "ttft_p50", "ttft_p99")


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
        q = EngineQueue(profile.cost, lengths, out_len, min(s["hit_rate"], 0.999), m, eng.chunked_prefill_size,
                        requests=len(trace.requests))
        row = {"qps": lam, "hit_rate": s["hit_rate"], "wave": m, "mu_model": q.service_rate(),
               "rho_model": q.utilisation(lam), "regime": "past knee" if q.transient(lam) else "below knee",
               "throughput_model": q.throughput(lam), "throughput_sim": s["throughput_rps"],
               "ttft_mean_model": q.ttft(lam), "ttft_mean_sim": s["ttft_s"]["mean"],
               "ttft_p50_model": q.ttft(lam, 0.5), "ttft_p50_sim": s["ttft_s"]["p50"],
               "ttft_p99_model": q.ttft(lam, 0.99), "ttft_p99_sim": s["ttft_s"]["p99"]}
        for name in FIGURES:
            row[f"{name}_rel_err"] = _rel(row[f"{name}_model"], row[f"{name}_sim"])
        row["departs"] = ",".join(name for name in FIGURES if row[f"{name}_rel_err"] > THRESHOLD)
        rows.append(row)
    return rows


def plot(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["qps"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    for key, color in (("ttft_mean", "tab:green"), ("ttft_p50", "tab:blue"), ("ttft_p99", "tab:red")):
        model = [r[f"{key}_model"] if math.isfinite(r[f"{key}_model"]) else np.nan for r in rows]
        ax.plot(x, model, "-", color=color, label=f"{key} model")
        ax.plot(x, [r[f"{key}_sim"] for r in rows], "o", color=color, label=f"{key} simulation")
        off = [r for r in rows if r[f"{key}_rel_err"] > THRESHOLD]  # simulation points the model misses
        ax.plot([r["qps"] for r in off], [r[f"{key}_sim"] for r in off], "x", color="k", ms=9,
                label=f"model off by > {THRESHOLD:.0%}" if key == "ttft_p99" and off else None)
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
    return save_figure(fig, path)


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
    check_cluster_used(base, [1], where)  # a router's knobs, which one engine never reads
    fixed = is_materialized(resolve(args.trace))  # a materialized trace has no seed to set
    spec = settings_from(task_config(base, args.method, qps[0], None if fixed else 0), where).resolve(args.trace)
    seed = int(spec.seed or 0)
    out = Path(args.out) if args.out else Path("runs") / f"theory-{Path(args.trace).stem}-{args.method}"
    sweep = Sweep(str(args.trace), [args.method], qps, [seed], base, out, belady=False, workers=args.workers,
                  force=args.force)
    with sweep.lock():  # checks --out before any simulation
        sweep.check()  # a folder it may not write in is refused before its files go
        for name in THEORY_FILES:  # the comparison of the runs the folder held: gone until these runs' is written
            check_out_file(out / name, "--out").unlink(missing_ok=True)
        sweep.run()
        summaries = [json.loads((t.folder / "summary.json").read_text()) for t in sweep.tasks()]
        rows = compare(summaries, spec)
        write_json(rows, out / "theory.json")
        write_csv(out / "theory.csv", list(rows[0]), rows)
        png = plot(rows, out / "theory.png", f"{args.method} on {Path(args.trace).name}: model vs simulation")
    fmt = lambda v: "inf" if isinstance(v, float) and math.isinf(v) else v  # noqa: E731
    print(table([[r["qps"], r["hit_rate"], r["rho_model"], r["regime"], fmt(r["throughput_model"]),
                  r["throughput_sim"], fmt(r["ttft_mean_model"]), r["ttft_mean_sim"], fmt(r["ttft_p50_model"]),
                  r["ttft_p50_sim"], fmt(r["ttft_p99_model"]), r["ttft_p99_sim"], r["departs"] or "-"] for r in rows],
                ["qps", "hit_rate", "rho", "regime", "thr_model", "thr_sim", "mean_model", "mean_sim", "p50_model",
                 "p50_sim", "p99_model", "p99_sim", ">20% off"]))
    off = [f"{r['qps']:g} ({r['departs']})" for r in rows if r["departs"]]
    print(f"model knee (service rate μ) ≈ {rows[0]['mu_model']:.1f}-{rows[-1]['mu_model']:.1f} QPS "
          f"(wave M̄ = {rows[0]['wave']:g} requests); model and simulation depart by > {THRESHOLD:.0%} at "
          f"{', '.join(off) if off else 'no QPS'}")
    print(f"wrote {out / 'theory.csv'}, {out / 'theory.json'}, {png}")
    return 0
