"""``prism-sim``: simulate a trace on a calibrated SGLang-like engine under a scheduling/eviction method."""

from __future__ import annotations

import argparse
import atexit
import gc
import sys

from prism.cli.common import entry_point, Parser, table
from prism.cli.run_flags import add_fleet_flags, add_run_flags, add_timeline_flag, out_dir, spec_from_args
from prism.metrics import RecordStream, prepare_run_folder, write_json
from prism.interrupts import InterruptsHeld, exit_status
from prism.policies.registry import ROUTERS
from prism.sim.run import SimInterrupted, simulate

EPILOG = """\
subcommands:
  prism-sim sweep ...   methods x QPS x seeds in parallel, with CSV files and plots (prism-sim sweep --help);
                        with --sharing/--gpus/--rate-scale: sharing schemes x GPUs x rates of several models
  prism-sim plan ...    the fewest GPUs per sharing scheme that meet an SLO target (prism-sim plan --help)

examples:
  prism-sim --trace traces/zipf.yaml
  prism-sim --trace traces/zipf.yaml --method fcfs --qps 40 --out runs/fcfs40
  prism-sim --trace traces/zipf.yaml --scheduler lpm --eviction lfu --set engine.max_total_tokens=65536
  prism-sim --trace my_trace.jsonl --config engine.yaml --set trace.num_requests=200
  prism-sim --trace traces/mooncake.yaml --set engine.max_total_tokens=null --instances 8 --router lmetric
  prism-sim --trace traces/multimodel.yaml --gpus 2 --sharing prism        # several models sharing 2 GPUs

Settings come from --config (YAML sections: method, scheduler, eviction, profile, engine, trace and one
section per policy with knobs), then --set KEY=VALUE, then the flags, over the engine settings the trace
spec's own engine: section gives. The KV pool is GPU-sized by default (engine.max_total_tokens: null, as
SGLang sizes it from the profile's memory); a smaller pool is a sensitivity knob.

--instances N runs N engines (each with the method's own policies and cache) behind a router (--router:
rr, least_load, cache_aware (default: sglang-router's) or lmetric). Cluster settings: --set
cluster.router_delay_s=0.001 (serial router), cluster.view_interval_s=0.05 (a stale load view),
cluster.profiles=[h200-141g:MODEL,...] (one per instance), and the router's own section (--set
lmetric.hot_streak=8, --set cache_aware.cache_threshold=0.5). The summary adds per-instance load, hit rate and
TTFT and the imbalance (max/mean requests); requests.csv adds an instance column.

A run folder holds one run: a run removes an earlier summary.json before it streams requests.csv, so a
requests.csv without summary.json is a run that was killed; Ctrl-C (and SIGTERM, SIGHUP) writes a partial
summary.json (complete: false) beside the requests that finished, and exits with 128 + the signal.
"""


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-sim", description=__doc__.split(":", 1)[1].strip()
               + "\nMany runs at once: prism-sim sweep (prism-sim sweep --help).", epilog=EPILOG)
    add_run_flags(p)
    p.add_argument("--instances", type=int, help="engine instances behind a router (default 1: one engine)")
    p.add_argument("--router", help=f"routing policy of a cluster: {', '.join(ROUTERS)} (default cache_aware)")
    add_fleet_flags(p)
    add_timeline_flag(p)
    return p


def _summary_rows(s: dict) -> list[list]:
    t = s["ttft_s"]
    return [[s["method"], s["qps"], s["num_requests"], t["mean"], t["p50"], t["p90"], t["p99"],
             s["hit_rate"], s.get("served_infinite_cache_hit_rate", "-"), s["infinite_cache_hit_rate"],
             s["throughput_rps"]]]


SUMMARY_HEADER = ["method", "qps", "requests", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                  "hit_rate", "inf_served", "inf_trace", "throughput_rps"]


def fleet_table(f: dict) -> str:
    """Per model and overall SLO attainment, TTFT and TPOT of a fleet run, and what the fleet did."""
    rows = [[m, p["requests"], p["ttft_p50_s"], p["ttft_p99_s"], p["ttft_slo_s"], p["tpot_p50_s"], p["tpot_p99_s"],
             p["tpot_slo_s"], p["attainment"]] for m, p in f["per_model"].items()]
    rows.append(["(all)", f["requests"], f["ttft_p50_s"], f["ttft_p99_s"], "", f["tpot_p50_s"], f["tpot_p99_s"], "",
                 f["attainment"]])
    return (table(rows, ["model", "requests", "ttft_p50_s", "ttft_p99_s", "ttft_slo_s", "tpot_p50_s", "tpot_p99_s",
                         "tpot_slo_s", "attainment"])
            + f"\n{f['sharing']} on {f['gpus']} x {f['gpu']} ({f['compute']} compute): attainment "
              f"{f['attainment']:.3f} (TTFT {f['attainment_ttft']:.3f}, TPOT {f['attainment_tpot']:.3f}), goodput "
              f"{f['goodput_rps']:.2f} req/s; {f['activations']} activations, {f['evictions']} evictions, "
              f"{f['migrations']} migrations, {f['bytes_moved'] / 1e9:.1f} GB loaded in {f['loading_s']:.1f} s")


def cluster_table(c: dict) -> str:
    """Per-instance load, hit rate and TTFT of a cluster run, and its imbalance."""
    rows = [[p["instance"], p["profile"], p["requests"], p["share"], p["prefill_tokens"], p["hit_rate"],
             p["ttft_p50_s"], p["ttft_p99_s"]] for p in c["per_instance"]]
    return (table(rows, ["instance", "profile", "requests", "share", "prefill_tokens", "hit_rate", "ttft_p50_s",
                         "ttft_p99_s"])
            + f"\n{c['instances']} instances, router {c['router']}: imbalance (max/mean requests) "
              f"{c['imbalance']:.3f}, of prefill tokens {c['imbalance_prefill_tokens']:.3f}")


def _collector_off_until_exit() -> None:
    """The process of one run needs no cyclic garbage collector: the simulation pauses it anyway (see
    ``sim/run.py``), and re-enabling it, or the interpreter's last collection at exit, walks every object the
    run made (0.12 s after a 20,480-request run) to free memory the process gives back a moment later. So it
    stays off, and what is left is frozen out of the exit's collection."""
    gc.disable()
    atexit.register(gc.freeze)


@entry_point("prism-sim")
def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list and args_list[0] == "sweep":
        from prism.cli.sweep import main as sweep_main

        return sweep_main(args_list[1:])
    if args_list and args_list[0] == "plan":
        from prism.cli.fleet import plan_main

        return plan_main(args_list[1:])
    args = parser().parse_args(args_list)
    if argv is None:  # the command itself: the process ends with this run
        _collector_off_until_exit()
    spec = spec_from_args(args)
    timeline = None
    if args.timeline is not None:  # its modules only for a run that draws one
        from prism.sim.timeline import SimTimeline
        from prism.timeline import timeline_note, timeline_path

        timeline = timeline_path(args.timeline, out_dir(args, spec))  # a bad PATH: before anything is written
    out = prepare_run_folder(out_dir(args, spec))
    events = SimTimeline(timeline, spec) if timeline is not None else None
    cluster = spec.cluster.instances > 1
    fleet = bool(spec.trace.meta.get("models"))  # requests.csv says each request's model and GPU
    stream = RecordStream(out / "requests.csv", cluster=cluster, fleet=fleet)  # an interrupted run keeps what finished
    interrupted: SimInterrupted | None = None
    try:
        result = simulate(spec, progress=not args.no_progress and sys.stderr.isatty(), on_record=stream,
                          served_reference=True, events=events)
    except SimInterrupted as e:
        result, interrupted = e.result, e
    except BaseException:
        if events is not None:
            events.abort()
        raise
    finally:
        stream.close()
    with InterruptsHeld() as held:  # a result reaches the folder whole, Ctrl-C or not
        stream.finish(result.records)  # in request order, from the rows streamed
        write_json(result.summary, out / "summary.json")
        if result.memory:
            from prism.output import write_csv
            from prism.sim.fleet import memory_rows

            write_csv(out / "memory.csv", *memory_rows(result.memory))
            if "fleet" in result.summary:  # the plot too: a summary that says complete comes with all its files
                from prism.sim.fleet_plots import plot_memory

                f = result.summary["fleet"]
                plot_memory(result.memory, out / "memory.png", f"{f['sharing']}, {f['gpus']} GPUs")
        if events is not None:
            events.close(result.summary)
    if interrupted is not None or held.caught:
        complete = result.summary["complete"]
        also = f", the timeline in {timeline}" if timeline is not None else ""
        print(f"prism-sim: {'interrupted after the run finished' if complete else interrupted}; results in "
              f"{out / 'requests.csv'} and {out / 'summary.json'}{also} (complete: {str(complete).lower()})",
              file=sys.stderr)
        return exit_status()
    s = result.summary
    print(table(_summary_rows(s), SUMMARY_HEADER))
    if "cluster" in s:
        print(cluster_table(s["cluster"]))
    if "fleet" in s:
        print(fleet_table(s["fleet"]))
        print(f"wrote {out / 'memory.csv'} and {out / 'memory.png'} (each GPU's memory over time)")
    c = s["counters"]
    if "fleet" in s:
        print(f"wrote {out / 'summary.json'} and {out / 'requests.csv'}; simulated in {s['wall_s']:.2f} s")
        return 0
    print(f"admission wait p50/p99 {s['w_admit_s']['p50']:.3f}/{s['w_admit_s']['p99']:.3f} s, "
          f"prefill p50 {s['t_prefill_s']['p50']:.3f} s; {c.get('prefill_iterations', 0)} prefill and "
          f"{c.get('decode_iterations', 0)} decode iterations; KV capacity {s['kv_capacity_tokens']} tokens "
          f"({s['profile']}); simulated in {s['wall_s']:.2f} s")
    if c.get("retractions"):
        print(f"KV ran out mid-decode: {c['retractions']} retractions, {c.get('reprefilled_tokens', 0)} tokens "
              f"prefilled again ({c.get('reprefill_hit_tokens', 0)} found cached)")
    if s["throughput_rps"] < 0.9 * s["qps"]:
        print(f"note: the engine serves {s['throughput_rps']:.1f} requests/s of the {s['qps']:g} offered: it is "
              "overloaded, and TTFT grows with the length of the trace (see prism-theory for the knee)")
    mean_len = s["prompt_tokens"] / max(s["measured_requests"], 1)
    if s["kv_capacity_tokens"] < 4 * mean_len:
        print(f"note: the KV cache ({s['kv_capacity_tokens']} tokens) holds fewer than 4 mean prompts "
              f"({mean_len:.0f} tokens); consider --set engine.max_total_tokens=null (the GPU's capacity)")
    print(f"wrote {out / 'summary.json'} and {out / 'requests.csv'}")
    if events is not None:
        print(timeline_note(timeline, events.w.meta))
    return 0


if __name__ == "__main__":
    main()
