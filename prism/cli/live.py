"""``prism-live``: replay a trace against a real SGLang server running prism's policies (or a paced CPU twin)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from prism.calibration import profiles
from prism.calibration.cost_model import load_profile
from prism.calibration.measure import check_url
from prism.cli.common import entry_point, Parser, table
from prism.cli.run_flags import add_run_flags, add_timeline_flag, out_dir, spec_from_args
from prism.errors import UserError
from prism.interrupts import exit_status, received
from prism.output import check_out_dir
from prism.policies.registry import ROUTERS
from prism.timeline import read_meta, timeline_note, timeline_path

REAL_ROUTER = "sglang_router"  # --router: the real sglang-router (prism.live.router)

EPILOG = """\
subcommands:
  prism-live validate ...   the digital twin beside the simulator, method by method (prism-live validate --help)
  prism-live serve ...      a long-running SGLang server with the plugin, for any client (prism-live serve --help)

examples:
  prism-live --model llama2-13b --trace traces/zipf.yaml --method prism --qps 12          # GPU machine
  prism-live --model tiny --pace a800-80g-pcie:qwen3-4b-instruct-2507 --trace traces/zipf.yaml --method prism --qps 20
  prism-live --url http://127.0.0.1:30000 --trace traces/zipf.yaml --method sglang      # a running server
  prism-live validate --trace traces/zipf.yaml --methods sglang,prism --qps 15,25 --pace a800-80g-pcie:qwen3-4b-instruct-2507
  prism-live --model tiny --instances 2 --router lmetric --trace traces/zipf.yaml --method sglang --qps 20

The run is described exactly as for prism-sim (--config, --set, --method, --scheduler, --eviction, --qps,
--seed) and writes the same requests.csv and summary.json (engine_kind: sglang). --model takes a profile
model name (served with SGLang's dummy weights on a generated config.json: the real geometry, no hub) or a
local model folder. --pace makes every forward pass last the profile's cost-model time x --dilation, so a
tiny CPU model stands in for the profile's GPU; arrivals are dilated alike and results reported undilated.
--instances N starts N servers (ports --port .. --port + N - 1) and routes each request with the simulator's
routing policy (--router: rr, least_load, cache_aware, lmetric) from the client's own view of each server;
requests.csv gains an instance column, summary.json the cluster block, instance-I/ each server's files.
--router sglang_router puts the real sglang-router 0.3.2 (pip install sglang-router==0.3.2) in front instead,
its cache-aware policy on the run's cache_aware knobs (the simulator's model of it: prism-sim --router
cache_aware); the replay goes through it, and each request's instance is read from the servers' event logs.
"""


def add_live_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="a profile model name (dummy weights, real geometry) or a local "
                                                   "model folder (default tiny: a 2-layer test geometry)")
    p.add_argument("--url", help="attach to a running SGLang server instead of starting one")
    p.add_argument("--pace", nargs="?", const="", metavar="PROFILE",
                   help="pace each forward pass to this profile's cost model (GPU:MODEL or YAML; without a value: "
                        "the run's --profile)")
    p.add_argument("--dilation", type=float, help="with --pace: real seconds per modelled second (default 10)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the server runs (auto: cuda when nvidia-smi exists)")
    p.add_argument("--port", type=int, default=30123, help="server port on 127.0.0.1 (default 30123)")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for the server's health")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds one request may take")


def options(args: argparse.Namespace):
    from prism.live.run import LiveOptions

    if args.dilation is not None and args.pace is None:
        raise UserError("--dilation stretches a paced run's time: give --pace too")
    if args.dilation is None:
        args.dilation = 10.0
    if not args.dilation > 0 or args.dilation == float("inf"):
        raise UserError(f"--dilation must be a positive number, got {args.dilation}")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be in 1..65535, got {args.port}")
    for flag, value in (("--startup-timeout", args.startup_timeout), ("--request-timeout", args.request_timeout)):
        if not 0 < value < float("inf"):
            raise UserError(f"{flag} must be a positive number of seconds, got {value}")
    if args.url is not None:
        check_url(args.url, "--url")
    elif os.sep not in args.model and not Path(args.model).expanduser().exists():
        profiles.model(args.model)  # a model name: known (a folder is checked when the run starts)
    elif not Path(args.model).expanduser().is_dir():
        raise UserError("expected a model folder holding config.json", args.model)
    real = getattr(args, "router", None) == REAL_ROUTER  # validate has no --router
    if real:  # the run's router is the simulator's model of it; the real one routes
        args.router = "cache_aware"
    return LiveOptions(model=args.model, url=args.url, pace=args.pace is not None, dilation=args.dilation,
                       device=args.device, port=args.port, startup_timeout_s=args.startup_timeout,
                       request_timeout_s=args.request_timeout, real_router=real)


def partial_results(out: Path) -> str:
    """Where a run that broke off left its results: the requests that finished, or none (then no summary)."""
    if (out / "summary.json").is_file():
        return f"partial results in {out} (summary.json says complete: false)"
    return f"no request had finished: no requests.csv or summary.json in {out}"


def check_server(opts) -> None:
    """A server given by --url answers (or is still starting) before anything is written: a refused
    connection is one line at once, not the whole start-up timeout."""
    if opts.url:
        from prism.live.server import wait_healthy

        wait_healthy(opts.url.rstrip("/"), opts.startup_timeout_s)


def apply_pace_profile(args: argparse.Namespace) -> None:
    """--pace PROFILE is the run's profile: the twin stands in for it, and prism-sim models the same."""
    if args.pace:
        if args.profile and args.profile != args.pace:
            raise UserError(f"--pace {args.pace} and --profile {args.profile} disagree: the twin paces to the "
                            "run's profile (give one of them)")
        try:
            load_profile(args.pace)
        except UserError as e:  # the profile's own line, named after the flag that gave it
            raise UserError(str(e), "--pace") from None
        args.profile = args.pace


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-live", description=__doc__.split(":", 1)[1].strip()
               + "\nAgainst the simulator: prism-live validate (prism-live validate --help).", epilog=EPILOG)
    add_run_flags(p)
    add_live_flags(p)
    p.add_argument("--instances", type=int, help="SGLang servers behind the project's router (default 1)")
    p.add_argument("--router", help=f"routing policy of several servers: {', '.join(ROUTERS)} (default cache_aware), "
                                    "or sglang_router: the real sglang-router in front")
    add_timeline_flag(p)
    return p


ROW = ["method", "qps", "requests", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "hit_rate", "throughput_rps"]


def summary_row(s: dict) -> list:
    t = s["ttft_s"]
    return [s["method"], s["qps"], s["num_requests"], t["p50"], t["p90"], t["p99"], s["hit_rate"],
            s["throughput_rps"]]


@entry_point("prism-live")
def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list and args_list[0] == "validate":
        from prism.cli.validate import main as validate_main

        return validate_main(args_list[1:])
    if args_list and args_list[0] == "serve":
        from prism.cli.serve import main as serve_main

        return serve_main(args_list[1:])
    args = parser().parse_args(args_list)
    apply_pace_profile(args)
    opts = options(args)
    spec = spec_from_args(args)
    from prism.live.run import check_method

    check_method(spec, opts)
    out = check_out_dir(out_dir(args, spec), "--out")  # before a server starts
    check_server(opts)
    timeline = timeline_path(args.timeline, out)
    from tqdm import tqdm

    from prism.live.run import ReplayError, live_run

    bar = tqdm(total=len(spec.trace.requests), unit="req", desc=f"{spec.label} live", leave=False,
               disable=args.no_progress or not sys.stderr.isatty())
    try:
        s = live_run(spec, opts, out, progress=bar.update, timeline=timeline)
    except ReplayError as e:
        bar.close()
        print(f"prism-live: run broke off: {e}; {partial_results(out)}", file=sys.stderr)
        return exit_status() if received() else 1  # a signal held while it stopped: the user's stop wins
    except KeyboardInterrupt:
        bar.close()
        print(f"prism-live: interrupted; {partial_results(out)}", file=sys.stderr)
        return exit_status()
    bar.close()
    if received():  # held while the servers stopped or the files were written: they are whole, and it still stops
        print(f"prism-live: interrupted after the run finished; results in {out / 'requests.csv'} and "
              f"{out / 'summary.json'} (complete: true)", file=sys.stderr)
        return exit_status()
    print(table([summary_row(s)], ROW))
    if "cluster" in s:
        from prism.cli.sim import cluster_table

        print(cluster_table(s["cluster"]))
    c = s["counters"]
    rounds = (f"{c.get('frontend_windows', 0)} front-end windows" if spec.deployment.front_end
              else f"{c.get('scheduling_rounds', 0)} scheduling rounds")
    print(f"plugin in the scheduler: {rounds}, {c.get('front_alignment_moves', 0)} "
          f"realigned, {c.get('evicted_tokens_private', 0)}/{c.get('evicted_tokens_reusable', 0)}/"
          f"{c.get('evicted_tokens_protected', 0)} tokens evicted (private/reusable/protected), "
          f"{c.get('retractions', 0)} retractions" + (f", {c.get('paced_over_budget', 0)} of "
                                                      f"{c.get('paced_batches', 0)} paced batches over budget"
                                                      if s["paced"] else ""))
    print(f"wrote {out / 'summary.json'} and {out / 'requests.csv'}")
    if timeline is not None:
        print(timeline_note(timeline, read_meta(timeline)))
    return 0


if __name__ == "__main__":
    main()
