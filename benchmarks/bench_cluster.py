"""Routers on a cluster: hit rate, P50/P99 TTFT, imbalance and simulator speed, side by side in one run.

    python benchmarks/bench_cluster.py [--trace mooncake] [--instances 4,8] [--routers rr,least_load,...]
                                       [--method sglang] [--requests N] [--repeat 1] [--json FILE]

Every router runs on N instances (the method's policies on each) of the trace at its own timestamps, with the
GPU-sized KV pool (``engine.max_total_tokens: null``, the default, set here so that a settings change cannot
shrink it: Mooncake prompts average 12k tokens, up to 126k). Speed: simulated requests per wall second, and the cluster's wall time per request
against the single-engine reference: one engine serving every N-th request of the trace at its own time (the
very workload one instance of a round-robin cluster sees; target: ratio <= 1.3; ``--instances 1`` runs each
router on a cluster of one against the single engine: the same work, so the ratio is the cluster machinery's
own cost). Other routers give their
instances other workloads, so their ratio also moves with the dynamics (an LPM instance whose queue stays
under 128 requests matches every waiting prompt each round, a more loaded one falls back to FCFS): the
router's own share of the wall time (decisions and hand-overs, timed around ``RouterProcess._dispatch``) is
shown beside it. One engine on the whole trace is shown too (it is overloaded about 7x). The
process pins itself to one core; runs are interleaved per repeat and the best wall time is kept (these
machines are noisy: compare ratios from one run).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import time

from prism.cli.common import table
from prism.core import Request
from prism.settings import settings_from
from prism.sim import cluster
from prism.sim.run import simulate
from prism.sim.run import simulate_cluster


class RouterClock:
    """Wall time spent routing (the policy's decision and the hand-over to the instance, which peeks its cache
    once to record the request's queued prefill tokens): the cluster's own cost per request."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._dispatch = cluster.RouterProcess._dispatch
        clock = self

        def timed(router, seq):
            t0 = time.perf_counter()
            clock._dispatch(router, seq)
            clock.seconds += time.perf_counter() - t0

        cluster.RouterProcess._dispatch = timed


def _spec(args, instances: int, router: str, every: int = 1):
    """The run: on ``instances`` behind ``router``; ``every`` > 1: one engine on every ``every``-th request."""
    data = {"method": args.method, "engine": {"max_total_tokens": None},
            "trace": {"num_requests": args.requests} if args.requests else {}}
    if router:
        data["cluster"] = {"instances": instances, "router": router}
    spec = settings_from(data, "bench").resolve(args.trace)
    if every > 1:
        sub = [Request(i, r.arrival, r.segments, r.output_len, r.session, r.fixed_order)
               for i, r in enumerate(spec.trace.requests[::every])]
        spec = dataclasses.replace(spec, trace=dataclasses.replace(spec.trace, requests=sub, _infinite_hit_rate=None))
    return spec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="mooncake", help="trace spec or built-in name (default mooncake)")
    p.add_argument("--instances", default="4,8", help="comma-separated cluster sizes (default 4,8)")
    p.add_argument("--routers", default="rr,least_load,cache_aware,lmetric", help="comma-separated routers")
    p.add_argument("--method", default="sglang", help="method on every instance (default sglang)")
    p.add_argument("--requests", type=int, default=0, help="first N requests (0: all)")
    p.add_argument("--repeat", type=int, default=1, help="interleaved repeats; the best wall time is kept")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    sizes = [int(x) for x in args.instances.split(",")]
    routers = args.routers.split(",")
    runs = [("single", 1, "", 1)]
    for n in sizes:
        if n > 1:
            runs.append((f"single, every {n}th", 1, "", n))
        runs += [(f"{r} x{n}", n, r, 1) for r in routers]
    specs = {name: _spec(args, n, r, ts) for name, n, r, ts in runs}
    on_cluster = {name for name, _, r, _ in runs if r}  # a router, even on one instance
    for s in specs.values():
        s.trace.infinite_cache_hit_rate()  # a property of the trace, not of a run
    best = {name: float("inf") for name in specs}
    routing = {name: 0.0 for name in specs}
    summary = {}
    clock = RouterClock()
    for _ in range(args.repeat):
        for name, spec in specs.items():
            gc.collect()
            clock.seconds = 0.0
            t0 = time.perf_counter()
            res = simulate_cluster(spec) if name in on_cluster else simulate(spec)
            wall = time.perf_counter() - t0
            if wall < best[name]:
                best[name], routing[name] = wall, clock.seconds
            summary[name] = res.summary
    rows = []
    for name, n, router, _ in runs:
        s, reqs = summary[name], summary[name]["num_requests"]
        base = "single" if n == 1 else f"single, every {n}th"
        ref = best[base] / summary[base]["num_requests"] if router else None
        rows.append({"run": name, "instances": n, "router": router, "hit_rate": s["hit_rate"],
                     "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"],
                     "imbalance": s.get("cluster", {}).get("imbalance", 1.0),
                     "imbalance_prefill_tokens": s.get("cluster", {}).get("imbalance_prefill_tokens", 1.0),
                     "throughput_rps": s["throughput_rps"], "wall_s": best[name], "sim_req_per_s": reqs / best[name],
                     "cost_vs_single": best[name] / reqs / ref if ref else None,
                     "router_share": routing[name] / best[name],
                     "hot_exclusions": s["counters"].get("route_hot_exclusions", 0)})
    print(table([[r["run"], r["hit_rate"], r["ttft_p50_s"], r["ttft_p99_s"], r["imbalance"],
                  r["imbalance_prefill_tokens"], r["throughput_rps"], r["sim_req_per_s"],
                  "-" if r["cost_vs_single"] is None else f"{r['cost_vs_single']:.2f}", r["router_share"]]
                 for r in rows],
                ["run", "hit_rate", "ttft_p50_s", "ttft_p99_s", "imbalance", "imb_prefill", "throughput_rps",
                 "sim_req/s", "cost/req vs single", "router share of wall"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
