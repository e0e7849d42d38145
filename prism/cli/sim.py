"""``prism-sim``: simulate a trace on a calibrated SGLang-like engine under a scheduling/eviction method."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prism.cli.common import entry_point, table
from prism.policies.registry import EVICTIONS, METHODS, SCHEDULERS
from prism.sim.metrics import RecordStream, write_json, write_requests_csv
from prism.sim.run import simulate
from prism.sim.settings import merge_flags, read_config, settings_from

EPILOG = """\
examples:
  prism-sim --trace traces/zipf.yaml
  prism-sim --trace traces/zipf.yaml --method fcfs --qps 40 --out runs/fcfs40
  prism-sim --trace traces/zipf.yaml --scheduler lpm --eviction lfu --set engine.max_total_tokens=65536
  prism-sim --trace my_trace.jsonl --config engine.yaml --set trace.num_requests=200

Settings come from --config (YAML sections: method, scheduler, eviction, profile, engine, trace and one
section per policy with knobs), then --set KEY=VALUE, then the flags. The default engine keeps
max_total_tokens=32768 KV tokens, so that eviction matters on the default trace.
"""


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="trace spec (YAML), materialized trace (JSONL), or a built-in spec: "
                                                      "zipf, multihop, agent, mooncake")
    p.add_argument("--config", help="YAML file with simulation settings")
    p.add_argument("--scheduler", help=f"scheduler: {', '.join(SCHEDULERS)}")
    p.add_argument("--eviction", help=f"eviction policy: {', '.join(EVICTIONS)}")
    p.add_argument("--profile", help="GPU:MODEL (default a800-80g:qwen3-4b-instruct-2507) or a profile YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. engine.max_total_tokens=65536, lpm.fcfs_threshold=64, "
                        "trace.num_requests=200 (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prism-sim", description=__doc__.split(":", 1)[1].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    add_common(p)
    p.add_argument("--method", help=f"method preset: {', '.join(METHODS)} (default sglang)")
    p.add_argument("--qps", type=float, help="arrival rate (overrides the trace's; rescales a JSONL trace)")
    p.add_argument("--seed", type=int, help="trace seed (overrides the spec's)")
    p.add_argument("--out", help="output folder (default runs/<trace>/<method>-qps<QPS>-seed<SEED>)")
    return p


def _summary_rows(s: dict) -> list[list]:
    t = s["ttft_s"]
    return [[s["method"], s["qps"], s["num_requests"], t["mean"], t["p50"], t["p90"], t["p99"],
             s["hit_rate"], s["served_infinite_cache_hit_rate"], s["infinite_cache_hit_rate"], s["throughput_rps"]]]


SUMMARY_HEADER = ["method", "qps", "requests", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                  "hit_rate", "inf_served", "inf_trace", "throughput_rps"]


@entry_point("prism-sim")
def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list and args_list[0] == "sweep":
        from prism.cli.sweep import main as sweep_main

        return sweep_main(args_list[1:])
    args = parser().parse_args(args_list)
    data = merge_flags(read_config(args.config), args.overrides, method=args.method, scheduler=args.scheduler,
                       eviction=args.eviction, profile=args.profile, qps=args.qps, seed=args.seed)
    settings = settings_from(data, args.config or "settings")
    profile = settings.load_profile()
    trace = settings.load_trace(args.trace)
    qps = settings.qps(trace)
    seed = trace.spec.get("seed")
    out = Path(args.out) if args.out else (
        Path("runs") / Path(args.trace).stem / f"{settings.label}-qps{'trace' if qps is None else f'{qps:g}'}"
                                               f"-seed{seed}")
    out.mkdir(parents=True, exist_ok=True)
    stream = RecordStream(out / "requests.csv")  # an interrupted run keeps the requests it finished
    try:
        result = simulate(trace, settings.scheduler, settings.eviction, settings.engine, profile, settings.knobs,
                          label=settings.label, progress=not args.no_progress and sys.stderr.isatty(), qps=qps,
                          on_record=stream, served_reference=True)
    finally:
        stream.close()
    s = result.summary
    s["trace"] = args.trace
    write_requests_csv(result.records, out / "requests.csv")
    write_json(s, out / "summary.json")
    print(table(_summary_rows(s), SUMMARY_HEADER))
    c = s["counters"]
    print(f"admission wait p50/p99 {s['w_admit_s']['p50']:.3f}/{s['w_admit_s']['p99']:.3f} s, "
          f"prefill p50 {s['t_prefill_s']['p50']:.3f} s; {c.get('prefill_iterations', 0)} prefill and "
          f"{c.get('decode_iterations', 0)} decode iterations; KV capacity {s['kv_capacity_tokens']} tokens "
          f"({s['profile']}); simulated in {s['wall_s']:.2f} s")
    if s["throughput_rps"] < 0.9 * s["qps"]:
        print(f"note: the engine serves {s['throughput_rps']:.1f} requests/s of the {s['qps']:g} offered: it is "
              "overloaded, and TTFT grows with the length of the trace (see prism-theory for the knee)")
    mean_len = s["prompt_tokens"] / max(s["measured_requests"], 1)
    if s["kv_capacity_tokens"] < 4 * mean_len:
        print(f"note: the KV cache ({s['kv_capacity_tokens']} tokens) holds fewer than 4 mean prompts "
              f"({mean_len:.0f} tokens); consider --set engine.max_total_tokens=null (the GPU's capacity)")
    print(f"wrote {out / 'summary.json'} and {out / 'requests.csv'}")
    return 0


if __name__ == "__main__":
    main()
