"""What a scheduler keeps over a long-running server's life: its memory as requests stream through it the way the
live plugin runs it, at checkpoints, with tracemalloc.

    python benchmarks/bench_long_run.py [--method prism] [--requests 200000] [--queue 64] [--fresh] [--json FILE]

Each request has the system prompt, three of 200 passages and a private question (``--fresh``: also a passage
no request had before, as a chat's tool results are). Every round the engine takes an eighth of the waiting
requests in plan order, as SGLang admits, and each leaves the running batch eight rounds later (the demand
hints' ``admit`` and ``release``, as the plugin's hooks call them); the cache holds nothing (ContextPilot's
admitted requests count evicted at once). A method is the registry's (``prism``: QAS with DART, QAS inside the
engine, the plugin's deployment).
Prints at each checkpoint the traced memory and the median CPU time of a round since the last (the plan, the
engine's alignment and lane lookups, the dispatch; under tracemalloc, which slows it, unless ``--no-memory``),
and the memory's growth per request served over the second half of the run: a scheduler whose state is
bounded by its queue grows by about nothing, and its rounds cost the same at the end as at the start.

Run it with each commit's interpreter to compare them (it imports the installed ``prism``, not this folder's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from collections import deque

from prism.core import PRIV, REUSE, SYS, Segment, SegmentTable
from prism.live.hooks import _EmptyIndex, _SyntheticRequest, prime
from prism.output import write_atomic_text
from prism.policies.base import Deployment, SchedContext
from prism.policies.registry import METHODS, make_policies, policy_configs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="prism", choices=sorted(METHODS), help="the method (default prism)")
    ap.add_argument("--requests", type=int, default=200_000, help="requests served (default 200000)")
    ap.add_argument("--queue", type=int, default=64, help="waiting requests, about (default 64)")
    ap.add_argument("--fresh", action="store_true", help="each request also has a passage never seen before")
    ap.add_argument("--checkpoints", type=int, default=8, help="readings (default 8)")
    ap.add_argument("--no-memory", action="store_true", help="time the rounds without tracemalloc (no memory)")
    ap.add_argument("--json", help="also write the readings to this file")
    args = ap.parse_args(argv)
    if args.checkpoints < 2 or args.requests < args.checkpoints or args.queue < 1:
        ap.error("needs --checkpoints >= 2, --requests >= --checkpoints and --queue >= 1")

    scheduler_name, eviction = METHODS[args.method]
    configs = policy_configs(scheduler_name, eviction, {"qas": {"window_s": 0}})
    if scheduler_name == "qas":  # its compiled kernels loaded before the run, as the plugin does
        prime(make_policies(scheduler_name, eviction, configs, Deployment()).scheduler)
    policies = make_policies(scheduler_name, eviction, configs, Deployment())
    scheduler, hints, cache = policies.scheduler, policies.hints, _EmptyIndex()
    table = SegmentTable()
    system = table.segment("sys", SYS, 64)
    passages = [table.segment(f"p{i}", REUSE, 256) for i in range(200)]

    def request(rid: int) -> _SyntheticRequest:
        # the private (and fresh) segments are made directly, so that no table of the benchmark's keeps them
        mine = [passages[(rid * 7 + k * 13) % 200] for k in range(3)]
        if args.fresh:
            mine.append(Segment(REUSE, f"t{rid}", None, 128, 1_000_000 + rid, rid))
        return _SyntheticRequest(rid, [system, *mine, Segment(PRIV, f"q{rid}", None, 32, 2_000_000 + rid, rid)])

    def shared(r) -> list[str]:
        return [s.id for s in r.segments if s.kind != PRIV]

    take, stay = max(1, args.queue // 8), 8
    waiting: list = []
    running: deque = deque()
    made = served = 0
    every = args.requests // args.checkpoints
    readings, times = [], []
    if not args.no_memory:
        tracemalloc.start()
    rnd = 0
    while served < args.requests:
        while len(waiting) < args.queue and made < args.requests:
            waiting.append(request(made))
            made += 1
        ctx = SchedContext(float(rnd), cache, tuple(r for batch in running for r in batch), hints, batch_hint=take)
        t0 = time.thread_time()
        plan = scheduler.plan(waiting, ctx)
        admitted = list(plan.order[:take])
        for r in admitted:
            plan.align.get(r.id)
            plan.lane(r.id)
        scheduler.on_dispatch(admitted, ctx)
        times.append(time.thread_time() - t0)
        waiting = list(plan.order[take:])
        for r in admitted:
            hints.admit(shared(r))
        running.append(admitted)
        if len(running) > stay:
            for r in running.popleft():
                hints.release(shared(r))
                served += 1
                if served % every == 0:
                    traced = None if args.no_memory else tracemalloc.get_traced_memory()[0] / 2**20
                    median = statistics.median(times) * 1e6 if times else None  # None: no round since the last
                    readings.append({"served": served, "traced_mib": traced, "round_median_us": median})
                    times.clear()
                    memory = "" if traced is None else f"  traced {traced:8.2f} MiB"
                    rounds = "" if median is None else f"  round median {median:7.1f} us"
                    print(f"served {served:9,d}{memory}{rounds}", flush=True)
        rnd += 1
    half, last = readings[len(readings) // 2 - 1], readings[-1]
    growth = None if args.no_memory else (
        (last["traced_mib"] - half["traced_mib"]) * 2**20 / (last["served"] - half["served"]))
    print(f"{args.method}{' --fresh' if args.fresh else ''}: " + (
        "" if args.no_memory else f"{growth:.1f} bytes per request served over the second half "
        f"({half['served']:,d} to {last['served']:,d}); ")
        + f"median round {readings[0]['round_median_us']:.1f} us first, "
        + (f"{last['round_median_us']:.1f} us last" if last["round_median_us"] is not None else "none since"))
    if args.json:
        write_atomic_text(args.json, json.dumps({"method": args.method, "fresh": args.fresh, "readings": readings,
                                                 "bytes_per_request": growth}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
