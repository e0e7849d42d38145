"""Simulator cost at scale: wall time of the simulation (not of the trace generation) at 2,048, 20,480 and
204,800 requests, per method, below the knee and at 2x overload, with a GPU-sized KV pool.

    python benchmarks/bench_scale.py [--quick] [--sizes 2048,20480,204800] [--methods fcfs,sglang,prism]
                                     [--traces traces/zipf.yaml,traces/prefix20.yaml]

The engine runs with ``engine.max_total_tokens=null`` (the profile's GPU memory: 443,521 tokens for the default
profile). The knee of each trace is measured first: FCFS on its 2,048 requests all arriving within a few
seconds (``--qps 1000``) serves at the engine's capacity, and that throughput is the knee; the loads
are then 0.5x and 2x the knee (round numbers). Each (trace, load, size, method) runs in a fresh process that
generates the trace, computes the trace's infinite-cache hit rate (a property of the trace, as in bench_sim),
then times ``simulate`` alone; the process reports that wall time and its peak RSS (trace included).

Printed: wall seconds, simulated requests per wall second, the growth ratios 20,480/2,048 and
204,800/20,480 (linear cost is 10x; issue 14's target is <= 11x), peak RSS, and the radix nodes evicted per
request at each size: a run whose pool fills late (2,048 requests in a GPU-sized pool) evicts less per request
than a long one, and eviction is a share of a request's cost, so its growth ratio says how far from the
steady state the small run is, not only how the code scales. A point that runs past
``--limit-s`` shows as >LIMIT (its ratios as nan) and the larger sizes of its series are skipped.
``--quick`` runs 512 and 5,120 requests (one ratio) to try the harness. A point's wall time is the median of
its runs: the simulation repeats in its process while the runs total under 2 s (at most 5), so a 2,048-request
point (40-200 ms, where a shared machine's jitter is several percent of one run) is the median of 5 and a large
one a single run (a median, not the best, so that a short point is not favoured over a long one).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

DEFAULT_TRACES = "traces/zipf.yaml,traces/prefix20.yaml"
REPEAT_UNDER_S, REPEAT_MAX = 2.0, 5  # a point repeats while its runs total under 2 s, at most 5 times


def child(args: dict) -> dict:
    """One point, in this (fresh) process."""
    import resource

    from dataclasses import replace

    from prism.settings import merge_flags, settings_from
    from prism.sim.run import simulate

    data = merge_flags({}, ["engine.max_total_tokens=null", f"trace.num_requests={args['size']}"],
                       method=args["method"], qps=args["qps"])
    t0 = time.perf_counter()
    spec = settings_from(data, "bench_scale").resolve(args["trace"])
    spec.trace.infinite_cache_hit_rate()
    gen = time.perf_counter() - t0
    simulate(replace(spec, trace=spec.trace.head(64)))  # warm-up: first-use costs (numba's cache) are no size's
    walls: list[float] = []
    while not walls or (len(walls) < REPEAT_MAX and sum(walls) < REPEAT_UNDER_S):  # short runs: a few, median
        gc.collect()
        t0 = time.perf_counter()
        res = simulate(spec)
        walls.append(time.perf_counter() - t0)
    return {"wall_s": statistics.median(walls), "runs": len(walls), "gen_s": gen,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "throughput_rps": res.summary["throughput_rps"], "hit_rate": res.summary["hit_rate"],
            "evicted_per_request": res.summary["counters"].get("evicted_nodes", 0) / args["size"]}


def point(trace: str, size: int, method: str, qps: float, limit_s: float | None = None) -> dict | None:
    """One point in a fresh process; None if it ran past ``limit_s`` (trace generation included)."""
    arg = json.dumps({"trace": trace, "size": size, "method": method, "qps": qps})
    try:
        out = subprocess.run([sys.executable, __file__, "--child", arg], capture_output=True, text=True,
                             timeout=limit_s)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        raise SystemExit(f"{trace} {method} {size} at {qps:g} QPS failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="512 and 5,120 requests")
    p.add_argument("--sizes", help="comma-separated request counts (default 2048,20480,204800)")
    p.add_argument("--methods", default="fcfs,sglang,prism", help="comma-separated methods")
    p.add_argument("--traces", default=DEFAULT_TRACES, help="comma-separated trace specs")
    p.add_argument("--loads", default="0.5,2", help="arrival rates as multiples of the measured knee")
    p.add_argument("--limit-s", type=float, default=900.0,
                   help="give up a point after this many seconds (shown as >LIMIT; larger sizes are then skipped)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    sizes = [int(s) for s in (args.sizes or ("512,5120" if args.quick else "2048,20480,204800")).split(",")]
    methods = args.methods.split(",")
    loads = [float(x) for x in args.loads.split(",")]
    print(f"simulation wall time (trace generation excluded), engine.max_total_tokens=null; sizes {sizes}")
    header = (f"{'trace':22s} {'load':>10s} {'method':8s} " + " ".join(f"{'wall@' + str(n):>12s}" for n in sizes)
              + " " + " ".join(f"{'x' + str(b) + '/' + str(a):>14s}" for a, b in zip(sizes, sizes[1:]))
              + f" {'req/s@' + str(sizes[-1]):>14s} {'peak_rss_MiB':>12s} "
              + " ".join(f"{'evict/req@' + str(n):>16s}" for n in sizes))
    rows = []
    for trace in args.traces.split(","):
        knee = point(trace, 2048, "fcfs", 1000.0)["throughput_rps"]
        print(f"{trace}: knee {knee:.1f} requests/s (FCFS at capacity, 2,048 requests)", flush=True)
        for load in loads:
            qps = float(max(1, round(load * knee)))
            for method in methods:
                res: list[dict | None] = []
                for n in sizes:  # past a point that ran out of time, larger sizes would too
                    res.append(point(trace, n, method, qps, args.limit_s) if not res or res[-1] else None)
                walls = [r["wall_s"] if r else float("nan") for r in res]
                row = (f"{trace.rsplit('/', 1)[-1]:22s} {f'{load:g}x={qps:g}':>10s} {method:8s} "
                       + " ".join(f"{w:12.2f}" if r else f"{'>' + format(args.limit_s, 'g'):>12s}"
                                  for w, r in zip(walls, res)) + " "
                       + " ".join(f"{b / a:14.1f}" for a, b in zip(walls, walls[1:]))
                       + f" {sizes[-1] / walls[-1]:14.0f} {max(r['rss_mib'] for r in res if r):12.0f} "
                       + " ".join(f"{r['evicted_per_request']:16.2f}" if r else f"{'-':>16s}" for r in res))
                rows.append(row)
                print(row, flush=True)
    print()
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
