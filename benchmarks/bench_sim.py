"""Simulator speed: the default trace (2048 requests) per method, side by side in one run.

    python benchmarks/bench_sim.py [--repeat 7] [--methods sglang,fcfs] [--trace traces/zipf.yaml]

Prints wall seconds (best of --repeat), simulated requests per wall second, and each method's ratio to FCFS
(these machines are noisy: compare ratios from one run, not absolute numbers across runs). Methods are
interleaved within each repeat after a warm-up run, the process pins itself to one CPU core when the OS
allows, and garbage left by the previous run is collected before each timed run. Targets: >= 10,000
simulated requests/s for FCFS and LPM <= 3x FCFS (issue #2); PRISM <= 2x FCFS (issue #3).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

from prism.policies.registry import METHODS, resolve_method
from prism.settings import RunSpec
from prism.sim.run import simulate
from prism.traces.spec import load_trace
from prism.calibration.cost_model import load_profile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="traces/zipf.yaml", help="trace spec (default traces/zipf.yaml)")
    p.add_argument("--methods", default=",".join(["fcfs", *[m for m in METHODS if m != "fcfs"]]),
                   help="comma-separated methods, FCFS first (the ratios are to it)")
    p.add_argument("--repeat", type=int, default=7, help="interleaved repeats (the best is kept)")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    trace = load_trace(args.trace)
    trace.infinite_cache_hit_rate()  # a property of the trace, not of the simulation
    profile = load_profile()
    methods = [resolve_method(m, None, None) for m in args.methods.split(",")]
    simulate(RunSpec.build(trace, "fcfs", "lru", profile=profile))  # warm-up: first-use costs are no method's own
    best = {label: float("inf") for label, _, _ in methods}
    hit = {}
    for _ in range(args.repeat):  # methods interleaved in each repeat, so that a slow spell hits all alike
        for label, sched, evict in methods:
            spec = RunSpec.build(trace, sched, evict, profile=profile, label=label)
            gc.collect()  # the last run's tree (cyclic: parent links) is collected here, not in this run
            t0 = time.perf_counter()
            res = simulate(spec)
            best[label] = min(best[label], time.perf_counter() - t0)
            hit[label] = res.summary["hit_rate"]
    rows = [(label, best[label], len(trace) / best[label], hit[label]) for label, _, _ in methods]
    base = next((r[1] for r in rows if r[0] == "fcfs"), rows[0][1])
    print(f"trace {args.trace}: {len(trace)} requests, best of {args.repeat}, one core")
    print(f"{'method':14s} {'wall_s':>8s} {'sim_req/s':>10s} {'x_fcfs':>7s} {'hit_rate':>8s}")
    for label, wall, rps, hit in rows:
        print(f"{label:14s} {wall:8.3f} {rps:10.0f} {wall / base:7.2f} {hit:8.3f}")


if __name__ == "__main__":
    main()
