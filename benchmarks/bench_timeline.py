"""What ``prism-sim --timeline`` costs: CPU time of a simulation without and with the timeline observer, side by
side in one process, and the timeline's size.

    python benchmarks/bench_timeline.py [--quick] [--repeat 3]

Each case runs ``simulate`` alone and ``simulate`` with :class:`~prism.sim.timeline.SimTimeline` writing its
file (closed, renamed), alternately (off, on, off, on, ...) so that a shared machine's load drifts over both
alike; the figure of each side is the median of its ``--repeat`` runs of CPU time (``time.process_time``: this
process's user + system time, which other sessions' load does not inflate as it inflates wall time). Printed
per case: requests, iterations, CPU seconds off and on, the ratio on/off (the target: under 1.20), the file's
size in MB and its request tracks. Off is the engine without an observer (``events=None``: one comparison per
event), so "off" costs nothing by construction; the digests of benchmarks/output_digests.py hold it unchanged.

The cases: zipf at 60 QPS under prism (front end, 2,048 requests), SGLang's retraction on a small pool, a
cluster of four instances, and the size bound: 20,480 requests with a GPU-sized pool (the README's figure;
``--quick`` drops it).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "zipf-prism-qps60": ("zipf", "prism", 60, []),
    "zipf-sglang-pool32k": ("zipf", "sglang", 60, ["engine.max_total_tokens=32768"]),
    "zipf-sglang-4x-rr": ("zipf", "sglang", 200, ["cluster.instances=4", "cluster.router=rr"]),
    "zipf-sglang-20480": ("zipf", "sglang", 40, ["trace.num_requests=20480", "engine.max_total_tokens=null"]),
}


def _spec(trace: str, method: str, qps: float, sets: list[str]):
    from prism.settings import merge_flags, settings_from

    return settings_from(merge_flags({}, sets, method=method, qps=qps), "bench_timeline").resolve(trace)


def _once(spec, timeline: Path | None) -> tuple[float, dict, dict]:
    from prism.sim.run import simulate
    from prism.sim.timeline import SimTimeline

    gc.collect()
    t0 = time.process_time()
    tl = SimTimeline(timeline, spec) if timeline is not None else None
    res = simulate(spec, events=tl)
    meta = tl.close(res.summary) and tl.w.meta if tl is not None else {}
    return time.process_time() - t0, res.summary, meta


def run_case(name: str, repeat: int, folder: Path) -> dict:
    trace, method, qps, sets = CASES[name]
    spec = _spec(trace, method, qps, sets)
    from dataclasses import replace

    from prism.sim.run import simulate

    simulate(replace(spec, trace=spec.trace.head(64)))  # first-use costs (numba's cache) are neither side's
    path = folder / f"{name}.json"
    off, on = [], []
    for _ in range(repeat):
        off.append(_once(spec, None)[0])
        cpu, summary, meta = _once(spec, path)
        on.append(cpu)
    c = summary["counters"]
    a, b = statistics.median(off), statistics.median(on)
    return {"case": name, "requests": summary["num_requests"],
            "iterations": c.get("prefill_iterations", 0) + c.get("decode_iterations", 0), "cpu_off_s": a,
            "cpu_on_s": b, "ratio": b / a, "size_mb": os.path.getsize(path) / 2**20,
            "request_tracks": meta["request_tracks"], "events": meta["trace_events"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="skip the 20,480-request case")
    p.add_argument("--repeat", type=int, default=3, help="runs per side and case (default 3; the median counts)")
    p.add_argument("--cases", help=f"comma-separated cases (default all: {', '.join(CASES)})")
    args = p.parse_args(argv)
    names = args.cases.split(",") if args.cases else [n for n in CASES if not (args.quick and "20480" in n)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows.append(run_case(name, args.repeat, Path(tmp)))
            r = rows[-1]
            print(f"{r['case']:24s} {r['requests']:6d} req {r['iterations']:7d} it  cpu off {r['cpu_off_s']:7.2f} s"
                  f"  on {r['cpu_on_s']:7.2f} s  ratio {r['ratio']:.3f}  {r['size_mb']:6.1f} MB  "
                  f"{r['request_tracks']} request tracks, {r['events']} events", flush=True)
    worst = max(r["ratio"] for r in rows)
    print(f"worst ratio on/off {worst:.3f} (target < 1.20)")
    return 0 if worst < 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
