"""The flags that describe one run, shared by every command that serves a trace under a method (``prism-sim``,
and a live replay alike): ``--trace``, ``--config``, ``--method``, ``--scheduler``, ``--eviction``,
``--profile``, ``--set``, ``--qps``, ``--seed``, ``--out``, ``--no-progress``.

    p = argparse.ArgumentParser(...)
    add_run_flags(p)
    args = p.parse_args(argv)
    spec = spec_from_args(args)          # a RunSpec; bad input raises UserError (one line, exit 2)
    out = out_dir(args, spec)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prism.cli.common import add_no_progress_flag, add_set_flag, add_trace_flag
from prism.policies.registry import EVICTIONS, METHODS, SCHEDULERS
from prism.settings import RunSpec, merge_flags, read_config, settings_from


def add_run_flags(p: argparse.ArgumentParser) -> None:
    add_trace_flag(p)
    p.add_argument("--config", help="YAML file with run settings")
    p.add_argument("--scheduler", help=f"scheduler: {', '.join(SCHEDULERS)}")
    p.add_argument("--eviction", help=f"eviction policy: {', '.join(EVICTIONS)}")
    p.add_argument("--profile", help="GPU:MODEL (default a800-80g-pcie:qwen3-4b-instruct-2507) or a profile YAML")
    add_set_flag(p)
    add_no_progress_flag(p)
    p.add_argument("--method", help=f"method preset: {', '.join(METHODS)} (default sglang)")
    p.add_argument("--qps", type=float, help="arrival rate (overrides the trace's; rescales a JSONL trace)")
    p.add_argument("--seed", type=int, help="trace seed (overrides the spec's)")
    p.add_argument("--out", help="output folder (default runs/<trace>/<method>-qps<QPS>-seed<SEED>)")


def add_fleet_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a fleet of GPUs shared by several models (a trace of several models runs on one)."""
    from prism.policies.registry import SHARING

    p.add_argument("--gpus", type=int, help="GPUs of the fleet (default: as few as hold every model; the "
                                            "dedicated scheme: one per model)")
    p.add_argument("--sharing", help=f"how the models share the GPUs: {', '.join(SHARING)} (default prism)")
    p.add_argument("--slo-scale", type=float, help="a model without SLOs gets its dedicated-GPU P95 TTFT and TPOT "
                                                   "x this (default 5)")
    p.add_argument("--rate-scale", type=float, help="multiplies the trace's arrival rate (default 1)")


def add_timeline_flag(p: argparse.ArgumentParser, where: str = "timeline.json in the run folder") -> None:
    p.add_argument("--timeline", nargs="?", const="", metavar="PATH",
                   help="also write the run's timeline as Chrome Trace Event JSON for ui.perfetto.dev or "
                        "chrome://tracing (iterations, requests, KV and queue counters): PATH, or without one "
                        f"{where}")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The run the flags describe: --config, then --set, then the other flags."""
    data = merge_flags(read_config(args.config), args.overrides, method=args.method, scheduler=args.scheduler,
                       eviction=args.eviction, profile=args.profile, qps=args.qps, seed=args.seed,
                       instances=getattr(args, "instances", None), router=getattr(args, "router", None),
                       gpus=getattr(args, "gpus", None), sharing=getattr(args, "sharing", None),
                       slo_scale=getattr(args, "slo_scale", None), rate_scale=getattr(args, "rate_scale", None))
    return settings_from(data, args.config or "settings").resolve(args.trace)


def out_dir(args: argparse.Namespace, spec: RunSpec) -> Path:
    """--out, else runs/<trace>/<method>-qps<QPS>-seed<SEED> (qpstrace: the trace's own timestamps), with
    -<ROUTER>x<N> for a cluster of N instances."""
    if args.out:
        return Path(args.out)
    if spec.fleet is not None:
        f = spec.fleet
        return Path("runs") / Path(args.trace).stem / f"{f.sharing}-g{f.gpus}-x{f.rate_scale:g}-{spec.label}-seed{spec.seed}"
    qps = "trace" if spec.qps_measured else f"{spec.qps:g}"
    cluster = f"-{spec.cluster.router}x{spec.cluster.instances}" if spec.cluster.instances > 1 else ""
    return Path("runs") / Path(args.trace).stem / f"{spec.label}-qps{qps}-seed{spec.seed}{cluster}"
