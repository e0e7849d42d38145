"""``prism-sim sweep --sharing ...`` and ``prism-sim plan``: sharing schemes x GPUs x rate scales on a
multi-model trace, and the fewest GPUs per scheme that meet an SLO-attainment target."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from prism.cli.common import (add_no_progress_flag, add_set_flag, add_trace_flag, add_workers_flag, check_workers,
                              comma_list, Parser, table)
from prism.errors import UserError
from prism.interrupts import exit_status
from prism.output import write_csv
from prism.policies.registry import SHARING, check_sharing
from prism.settings import merge_flags, read_config, settings_from
from prism.traces.spec import is_materialized, resolve

MAX_SEEDS = 1000


def add_fleet_sweep_flags(p: argparse.ArgumentParser) -> None:
    add_trace_flag(p)
    p.add_argument("--sharing", default="static,muxserve,timeshare,prism",
                   help=f"comma-separated sharing schemes ({', '.join(SHARING)})")
    p.add_argument("--method", help="each model's scheduling method (default sglang)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per point (default 1)")
    p.add_argument("--config", help="YAML file with simulation settings (as for prism-sim)")
    add_set_flag(p)
    p.add_argument("--profile", help="GPU:MODEL: its GPU is the fleet's (or --set fleet.gpu=NAME; default "
                                     "a800-80g-pcie:qwen3-4b-instruct-2507)")
    p.add_argument("--slo-scale", type=float, help="SLO = a model's dedicated-GPU P95 x this (default 5)")
    add_workers_flag(p)
    p.add_argument("--out", help="output folder (default runs/fleet-<trace>, for a plan runs/plan-<trace>)")
    p.add_argument("--force", action="store_true", help="replace an earlier sweep of other settings in --out")
    add_no_progress_flag(p)


def _numbers(text: str, flag: str, kind=float, low: float = 0.0) -> list:
    items = comma_list(text, flag, "numbers")
    try:
        vals = [kind(x) for x in items]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated {'whole ' if kind is int else ''}numbers, got "
                        f"{text!r}") from None
    if any(not v > low or v != v or v == float("inf") for v in vals):
        raise UserError(f"{flag}: expected numbers > {low:g}, got {text!r}")
    return list(dict.fromkeys(vals))


def _base(args: argparse.Namespace) -> dict:
    return merge_flags(read_config(args.config), args.overrides, profile=args.profile, method=args.method,
                       slo_scale=args.slo_scale)


def _sweep(args, sharings, gpus, scales, out):
    from prism.sim.fleet_sweep import FleetSweep

    if not 1 <= args.seeds <= MAX_SEEDS:
        raise UserError(f"--seeds must be in 1..{MAX_SEEDS}, got {args.seeds}")
    check_workers(args.workers)
    base = _base(args)
    materialized = is_materialized(resolve(args.trace))
    if materialized and args.seeds > 1:
        raise UserError("--seeds > 1 needs a trace spec (a materialized trace has fixed prompts)", args.trace)
    sweep = FleetSweep(str(args.trace), sharings, gpus, scales, [None], base, out, args.workers, args.force)
    # every scheme's first run resolved here (its trace, its models' profiles, the fleet's size): bad input
    # stops the sweep before its folder is touched
    for s in sharings:
        for g in gpus:
            first = settings_from(sweep.task(s, g, scales[0], None).config, args.config or "settings")
            spec = first.resolve(args.trace)
    seed0 = 0 if materialized else (spec.seed or 0)
    sweep.seeds = [None] if materialized else [seed0 + i for i in range(args.seeds)]
    return sweep


SWEEP_EPILOG = """\
examples:
  prism-sim sweep --trace traces/multimodel.yaml --sharing static,muxserve,timeshare,prism --gpus 2,4,8 \\
      --rate-scale 0.5,1,2

Runs every scheme x GPUs x rate scale x seed of a multi-model trace in parallel; writes DIR/fleet.csv (a row
per run), DIR/fleet_aggregate.csv (mean and 95%% CI over seeds), DIR/runs/<scheme>-g<GPUs>/x<SCALE>-seed<S>/
(requests.csv, summary.json, memory.csv) and attainment_vs_rate_scale.png, attainment_vs_gpus.png. A fleet too
small for a scheme is a run of 0%% attainment (fits: no). A rerun skips finished runs; a folder of other
settings is refused unless --force.
"""


def sweep_parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-sim sweep", description="A fleet sweep: sharing schemes x GPUs x rate "
               "scales x seeds on a multi-model trace.", epilog=SWEEP_EPILOG)
    add_fleet_sweep_flags(p)
    p.add_argument("--gpus", help="comma-separated fleet sizes (default 2)")
    p.add_argument("--rate-scale", help="comma-separated multipliers of the trace's rate (default 1)")
    return p


#: the flags that make ``prism-sim sweep`` a fleet sweep
FLEET_SWEEP_FLAGS = ("--sharing", "--gpus", "--rate-scale")


def sweep_main(argv: list[str]) -> int:
    """``prism-sim sweep`` with --sharing/--gpus/--rate-scale: a fleet sweep."""
    from prism.sim.fleet_plots import plot_attainment

    args = sweep_parser().parse_args(argv)
    sharings = [check_sharing(s, "--sharing") for s in comma_list(args.sharing, "--sharing", "schemes")]
    gpus = _numbers(args.gpus, "--gpus", int) if args.gpus else [2]
    scales = _numbers(args.rate_scale, "--rate-scale") if args.rate_scale else [1.0]
    out = Path(args.out) if args.out else Path("runs") / f"fleet-{Path(args.trace).stem}"
    sweep = _sweep(args, sharings, gpus, scales, out)
    with sweep.lock():
        sweep.check_folder()
        bar = tqdm(unit="run", desc="fleet sweep", total=len(sweep.tasks()),
                   disable=args.no_progress or not sys.stderr.isatty())
        try:
            rows = sweep.run(on_done=lambda row: bar.update(1))
        except KeyboardInterrupt:
            bar.close()
            print(f"prism-sim: interrupted with {len(sweep.rows)} runs done in {out}; the same command runs the rest",
                  file=sys.stderr)
            return exit_status()
        bar.close()
        agg = sweep.write_aggregate(rows)
        plots = plot_attainment(agg, out)
    print(table([[a["sharing"], a["gpus"], a["rate_scale"], f"{a['attainment']:.3f} ± {a['attainment_ci95']:.2g}",
                  f"{a['attainment_ttft']:.3f}", f"{a['attainment_tpot']:.3f}", f"{a['goodput_rps']:.2f}",
                  f"{a['ttft_p99_s']:.3g}", f"{a['tpot_p99_s']:.3g}", f"{a['migrations']:.3g}",
                  "yes" if a["feasible"] else "no"] for a in agg],
                ["sharing", "gpus", "rate_scale", "attainment", "att_ttft", "att_tpot", "goodput_rps", "ttft_p99_s",
                 "tpot_p99_s", "migrations", "fits"]))
    print(f"{len(rows)} runs; wrote {out / 'fleet.csv'}, {out / 'fleet_aggregate.csv'} and "
          f"{', '.join(p.name for p in plots)} in {out}")
    return 0


EPILOG = """\
examples:
  prism-sim plan --trace traces/multimodel-18.yaml --sharing prism,static --attainment 0.99
  prism-sim plan --trace traces/multimodel.yaml --sharing static,muxserve,timeshare,prism --rate-scale 2 --seeds 2

For each scheme, the fleet runs at the fewest GPUs that hold its models, then one more at a time (as many
sizes at once as there are workers; those past the answer are dropped, so the files do not depend on the
worker count) until the mean SLO attainment over the seeds meets --attainment or --max-gpus is passed; each
size is a full simulation. Writes DIR/plan.csv and plan.json (the cost table), the runs it took (DIR/runs/...,
DIR/fleet.csv: a rerun reuses them) and attainment_vs_gpus.png.
"""


def plan_parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-sim plan", description="The fewest GPUs per sharing scheme that meet "
               "an SLO-attainment target on a multi-model trace.", epilog=EPILOG)
    add_fleet_sweep_flags(p)
    p.add_argument("--attainment", type=float, default=0.99, help="the target: share of requests within both "
                                                                 "their TTFT and TPOT SLO (default 0.99)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiplies the trace's rate (default 1)")
    p.add_argument("--max-gpus", type=int, default=16, help="the largest fleet tried (default 16)")
    return p


def plan_main(argv: list[str]) -> int:
    from prism.sim.fleet_plots import plot_attainment
    from prism.metrics import write_json
    from prism.sim.fleet_sweep import plan

    args = plan_parser().parse_args(argv)
    if not 0 < args.attainment <= 1:
        raise UserError(f"--attainment must be in (0, 1], got {args.attainment}")
    if not 0 < args.rate_scale <= 1000:
        raise UserError(f"--rate-scale must be in (0, 1000], got {args.rate_scale}")
    if not 1 <= args.max_gpus <= 4096:
        raise UserError(f"--max-gpus must be in 1..4096, got {args.max_gpus}")
    sharings = [check_sharing(s, "--sharing") for s in comma_list(args.sharing, "--sharing", "schemes")]
    out = Path(args.out) if args.out else Path("runs") / f"plan-{Path(args.trace).stem}"
    sweep = _sweep(args, sharings, [1], [args.rate_scale], out)
    with sweep.lock():
        sweep.check_folder()
        bar = tqdm(unit="run", desc="plan", disable=args.no_progress or not sys.stderr.isatty())
        try:
            rows = plan(sweep, args.attainment, args.rate_scale, args.max_gpus, on_done=lambda row: bar.update(1))
        except KeyboardInterrupt:
            bar.close()
            print(f"prism-sim: interrupted; the runs done are kept in {out}, the same command goes on", file=sys.stderr)
            return exit_status()
        bar.close()
        fields = ["sharing", "fewest_gpus", "attainment", "attainment_one_fewer", "target", "rate_scale"]
        write_csv(out / "plan.csv", fields, ({k: ("" if r[k] is None else r[k]) for k in fields} for r in rows))
        write_json(rows, out / "plan.json")
        agg = sweep.write_aggregate(sweep.rows)
        plot_attainment(agg, out, target=args.attainment)
    print(table([[r["sharing"], r["fewest_gpus"] if r["fewest_gpus"] is not None else f"> {args.max_gpus}",
                  f"{r['attainment']:.3f}", "-" if r["attainment_one_fewer"] is None else
                  f"{r['attainment_one_fewer']:.3f}", " ".join(f"{k}:{v:.3f}" for k, v in
                                                               r["attainment_by_gpus"].items())] for r in rows],
                ["sharing", "fewest_gpus", "attainment", "one_fewer", "attainment_by_gpus"]))
    print(f"target {args.attainment:g} at rate scale {args.rate_scale:g}; wrote {out / 'plan.csv'}, plan.json and "
          f"the runs in {out}")
    return 0

