"""``prism-sim sweep``: compare methods over QPS and seeds, in parallel, with a table, CSV files and plots."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from tqdm import tqdm

from prism.cli.common import (add_no_progress_flag, add_set_flag, add_trace_flag, add_workers_flag, check_workers,
                              comma_list, parse_rates, Parser, table)
from prism.errors import UserError
from prism.interrupts import exit_status
from prism.policies.registry import METHODS, check_router
from prism.settings import (check_cluster_used, check_knobs_used, check_router_knobs_used, cluster_config, merge_flags,
                            read_config, settings_from)
from prism.sim.sweep import Sweep, task_config
from prism.traces import Trace, load_trace
from prism.traces.spec import check_source, is_materialized, resolve

EPILOG = """\
examples:
  prism-sim sweep --trace traces/zipf.yaml --methods sglang,klpm,contextpilot,prism --qps 40,50,60,70,80 --seeds 3
  prism-sim sweep --trace traces/mooncake.yaml --set engine.max_total_tokens=null --methods sglang \
      --qps 2,3.4 --instances 4,8 --routers rr,least_load,cache_aware,lmetric --ray auto

Methods are presets (%s) or SCHEDULER+EVICTION pairs such as qas+lru. Seeds are the trace seed plus
0..N-1 (prompts and arrivals change with the seed). Writes DIR/summary.csv (a row per run, as runs finish),
DIR/aggregate.csv (mean and 95%% CI per method and QPS), DIR/runs/<method>/qps<Q>-seed<S>/ and the plots
ttft_p99_vs_qps.png, ttft_p50_vs_qps.png, hit_rate_vs_qps.png and ttft_cdf_qps<Q>.png.

--instances N1,N2 with --routers R1,R2 runs every method also on clusters of N instances behind each router:
one curve (series) per METHOD@ROUTERxN in the tables and plots (runs/<series>/...), plus
imbalance_vs_qps.png; an instance count of 1 is the method on one engine. --ray ADDRESS runs the sweep on a
Ray cluster (auto: the cluster this machine joined with `ray start`; ray://HOST:10001; local: a private Ray
on this machine) with results identical to the process pool's; needs pip install -e ".[ray]".

--ablate runs each method of --methods with each of its parts switched off in turn, and its base engine (PRISM:
front alignment, buckets and lanes, the cold lane, DART's protection set, DART altogether, over FCFS;
ContextPilot: its reordering, its engine order, over SGLang; k-LPM: its FIFO share, over SGLang), and writes
each part's share of the method's hit-rate and P99 TTFT gain over its base, with 95%% CIs over the seeds:
DIR/ablation.csv, DIR/ablation.json and ablation_qps<Q>.png (runs/<method>-no-<part>/...; no Belady runs).

One sweep at a time writes in a folder (DIR/.sweep.lock). A sweep into a folder that holds an earlier sweep
of the same trace and settings merges with it (its runs are kept, the tables and plots cover both); one of
other settings is refused unless --force, which removes the earlier sweep's files first.

With --sharing, --gpus or --rate-scale it is a fleet sweep of a multi-model trace instead: sharing schemes x
GPUs x rate scales (prism-sim sweep --sharing prism --help lists its flags), e.g.
  prism-sim sweep --trace traces/multimodel.yaml --sharing static,muxserve,timeshare,prism --gpus 2,4 --rate-scale 1,2
""" % ", ".join(METHODS)

MAX_SEEDS = 1000


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-sim sweep", description=__doc__.split(":", 1)[1].strip(), epilog=EPILOG)
    add_trace_flag(p)
    p.add_argument("--methods", help="comma-separated methods (default: sglang,klpm,contextpilot,prism; with "
                                      "--ablate: prism,contextpilot,klpm)")
    p.add_argument("--qps", default="40,50,60,70,80", help="comma-separated arrival rates")
    p.add_argument("--seeds", type=int, default=1, help="seeds per point (default 1)")
    p.add_argument("--config", help="YAML file with simulation settings (as for prism-sim)")
    add_set_flag(p)
    p.add_argument("--profile", help="GPU:MODEL or a profile YAML (default the settings', else "
                                     "a800-80g-pcie:qwen3-4b-instruct-2507)")
    p.add_argument("--instances", help="comma-separated cluster sizes, e.g. 1,4,8 (default: the settings' "
                                       "cluster.instances, else 1)")
    p.add_argument("--routers", help="comma-separated routers of the clusters (default: the settings' "
                                     "cluster.router, else cache_aware)")
    add_workers_flag(p)
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster: auto, ray://HOST:10001, HOST:PORT, or "
                                                    "local (a private Ray on this machine)")
    p.add_argument("--no-belady", action="store_true", help="skip the Belady reference runs (halves the cost)")
    p.add_argument("--ablate", action="store_true", help="run each method with each of its parts switched off in "
                                                         "turn and its base engine; report each part's share of "
                                                         "the gain (see below)")
    p.add_argument("--cdf-qps", type=float, help="QPS of the TTFT CDF plot (default: the middle QPS)")
    p.add_argument("--out", help="output folder (default runs/sweep-<trace>, with --ablate runs/ablate-<trace>)")
    p.add_argument("--force", action="store_true", help="replace an earlier sweep of other settings in --out "
                                                        "(default: refused; one of the same settings is merged)")
    add_no_progress_flag(p)
    return p


def _ints(text: str, flag: str) -> list[int]:
    items = comma_list(text, flag, "whole numbers")
    try:
        vals = [int(x) for x in items]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise UserError(f"{flag}: expected instance counts >= 1, got {text!r}")
    return list(dict.fromkeys(vals))


def _clusters(base: dict, args: argparse.Namespace, where: str) -> tuple[list[int], list[str]]:
    """The sweep's cluster sizes and routers: --instances and --routers over the settings' cluster section,
    which is checked as prism-sim checks it (for every size above 1 it applies to); router settings where
    every run is a single engine are an error, as for one run."""
    counts = (_ints(args.instances, "--instances") if args.instances is not None
              else [cluster_config(base, where).instances])
    check_cluster_used(base, counts, where, "--routers" if args.routers is not None else "")
    sections = [cluster_config(base, where, n) for n in counts if n > 1] or [cluster_config(base, where, 1)]
    routers = ([check_router(r) for r in comma_list(args.routers, "--routers", "routers")]
               if args.routers is not None else [sections[0].router])
    check_router_knobs_used(base, routers, where)
    return counts, routers


def _check_runs(base: dict, methods: list[str], instances: list[int], routers: list[str], qps: float, trace: str,
                where: str, materialized: bool) -> int:
    """Resolve every (method, cluster) combination as its first run will be (profile, trace, KV capacity,
    warm-up, the trace seed) before the sweep touches its folder, the trace generated once; the sweep's first
    seed (0 for a materialized trace). The trace goes when this returns: no worker needs the parent's."""
    loaded: dict[str, Trace] = {}

    def load_once(source: str, overrides: dict) -> Trace:
        key = json.dumps(overrides, sort_keys=True)
        if key not in loaded:
            loaded[key] = load_trace(source, overrides)
        return loaded[key]

    for m in methods:
        for n in instances:
            for r in routers if n > 1 else [""]:
                cfg = task_config(base, m, qps, None, n, r)  # the settings' own seed, checked here
                spec = settings_from(cfg, where).resolve(trace, load_once)
    check_source(trace, cfg["trace"])
    return 0 if materialized else spec.seed


def _pm(mean, ci, fmt: str = ".3f") -> str:
    if mean is None or mean != mean:
        return "-"
    return f"{mean:{fmt}}" + (f" ± {ci:{fmt}}" if ci is not None and ci == ci else "")


def _report_ablation(sweep, out: Path, methods: list[str], base: dict, trace: str) -> int:
    """The ablation's table, files and plots (the sweep's runs are done)."""
    from prism.sim.ablation import ablation_table, write_ablation
    from prism.sim.plots import plot_ablation  # matplotlib: only once the runs are done

    tab = ablation_table(sweep.rows, methods, base)
    files = write_ablation(out, tab, methods, base, trace) + plot_ablation(out, tab)
    rows = [[r["method"], f"{r['qps']:g}", r["row"], r["series"], _pm(r["hit_rate"], r["hit_rate_ci95"]),
             _pm(r.get("hit_delta"), r.get("hit_delta_ci95")), _pm(r.get("hit_share"), r.get("hit_share_ci95"), ".2f"),
             _pm(r["ttft_p99_s"], r["ttft_p99_s_ci95"], ".3g"), _pm(r.get("p99_delta"), r.get("p99_delta_ci95"), ".3g"),
             _pm(r.get("p99_share"), r.get("p99_share_ci95"), ".2f")] for r in tab]
    print(table(rows, ["method", "qps", "row", "series", "hit_rate", "hit_delta", "hit_share", "ttft_p99_s",
                       "p99_delta", "p99_share"]))
    print(f"{len(sweep.merged)} runs ({len(sweep.series)} series); wrote {', '.join(p.name for p in files)}, "
          f"summary.csv and aggregate.csv in {out}")
    return 0


def main(argv: list[str]) -> int:
    from prism.cli.fleet import FLEET_SWEEP_FLAGS, sweep_main

    if any(a.split("=", 1)[0] in FLEET_SWEEP_FLAGS for a in argv):  # schemes x GPUs x rates of several models
        return sweep_main(argv)
    args = parser().parse_args(argv)
    qps = parse_rates(args.qps)
    methods = comma_list(args.methods if args.methods is not None else
                         ("prism,contextpilot,klpm" if args.ablate else "sglang,klpm,contextpilot,prism"),
                         "--methods", "methods")
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise UserError(f"--seeds must be in 1..{MAX_SEEDS}, got {args.seeds}")
    check_workers(args.workers)
    if args.cdf_qps is not None and args.cdf_qps not in qps:
        raise UserError(f"--cdf-qps {args.cdf_qps:g} is not one of --qps {args.qps}")
    base = merge_flags(read_config(args.config), args.overrides, profile=args.profile)
    where = args.config or "settings"
    materialized = is_materialized(resolve(args.trace))
    check_knobs_used(base, methods, where)
    instances, routers = _clusters(base, args, where)
    if materialized and args.seeds > 1:
        raise UserError("--seeds > 1 needs a trace spec (a materialized trace has fixed prompts)", args.trace)
    if args.ablate and instances != [1]:
        raise UserError("--ablate runs one engine per run; drop --instances (or give 1)")
    seed0 = _check_runs(base, methods, instances, routers, qps[0], args.trace, where, materialized)
    seeds = [seed0 + i for i in range(args.seeds)]
    kind = "ablate" if args.ablate else "sweep"
    out = Path(args.out) if args.out else Path("runs") / f"{kind}-{Path(args.trace).stem}"
    if args.ablate:
        from prism.sim.ablation import AblationSweep

        sweep = AblationSweep(str(args.trace), methods, qps, seeds, base, out, belady=False, workers=args.workers,
                              force=args.force, ray_address=args.ray)
        for cfg in sweep.configs(qps[0]):  # every variant's settings valid before the sweep touches its folder
            settings_from(cfg, where)
    else:
        sweep = Sweep(str(args.trace), methods, qps, seeds, base, out, belady=not args.no_belady,
                      workers=args.workers, force=args.force, instances=instances, routers=routers,
                      ray_address=args.ray)
    cdf = args.cdf_qps if args.cdf_qps is not None else sorted(qps)[len(qps) // 2]
    if args.ray is not None:  # Ray imported and its cluster reached before anything is written
        from prism.sim.ray_sweep import ray_session

        session = ray_session(args.ray)
    else:
        session = contextlib.nullcontext()
    with session, sweep.lock():  # one sweep at a time in a folder, plots included
        bar = tqdm(unit="run", desc="sweep", disable=args.no_progress or not sys.stderr.isatty())
        try:
            agg = sweep.run(on_done=lambda row: bar.update(1))
        except KeyboardInterrupt:  # every finished run is in its folder and in summary.csv: a rerun goes on
            bar.close()
            print(f"prism-sim: interrupted with {len(sweep.rows)} of {len(sweep.merged)} runs done in {out}; the "
                  "same command runs the rest", file=sys.stderr)
            return exit_status()
        bar.close()
        if args.ablate:
            return _report_ablation(sweep, out, methods, base, str(args.trace))
        first_seed = {}
        for t in sweep.merged:
            first_seed.setdefault((t.series, t.qps), t.folder)
        from prism.sim.plots import plot_sweep  # matplotlib: only once the runs are done

        plots = plot_sweep(out, agg, cdf, first_seed, workers=args.workers)
    total, merged = len(sweep.merged), len(sweep.merged) - len(sweep.tasks())
    order = list(dict.fromkeys(t.series for t in sweep.merged))
    rows = []
    for a in sorted(agg, key=lambda a: (order.index(a["series"]), a["qps"])):
        rows.append([a["series"], a["qps"], f"{a['ttft_p50_s']:.3g} ± {a['ttft_p50_s_ci95']:.2g}",
                     f"{a['ttft_p99_s']:.3g} ± {a['ttft_p99_s_ci95']:.2g}", f"{a['hit_rate']:.3f}",
                     f"{a['belady_hit_rate']:.3f}" if "belady_hit_rate" in a else "-",
                     f"{a['served_infinite_cache_hit_rate']:.3f}" if "served_infinite_cache_hit_rate" in a else "-",
                     f"{a['infinite_cache_hit_rate']:.3f}", f"{a['throughput_rps']:.1f}",
                     f"{a['imbalance']:.3f}" if "imbalance" in a else "-"])
    print(table(rows, ["series", "qps", "ttft_p50_s", "ttft_p99_s", "hit_rate", "belady_hit", "inf_served",
                       "inf_trace", "throughput_rps", "imbalance"]))
    if merged:
        print(f"merged with an earlier sweep of the same settings in {out}: {merged} of the {total} runs are its")
    print(f"{total} runs; wrote {out / 'summary.csv'}, {out / 'aggregate.csv'} and "
          f"{', '.join(p.name for p in plots)} in {out}")
    return 0
