"""Control-plane cost: one scheduling round of QAS, LPM and k-LPM on the same waiting queue, and SGLang's own
``SchedulePolicy.calc_priority`` beside them when SGLang imports (the ``live`` extra).

    python benchmarks/bench_control_plane.py [--sizes 128,1000,10000] [--repeat 5]

Queues are zipf_hotspot requests (k=5 retrieved passages each); the cache holds the prompts of 1,000 earlier
requests, as a warm engine would (a realistic mix of hits and misses). Each policy plans the same queue. The
table shows the best-of-repeat time of a steady round (the policy has met the queue before, as in a running
engine), its ratio to SGLang's calc_priority (the LPM the targets refer to) and to prism's LPM, the
per-request cost (flat per-request cost means linear growth), and the first round (QAS registers each
request's segments once, on first sight). LPM is SGLang's: past 128 waiting requests it skips matching and
keeps the queue order, so the "(no-fallback)" rows match every request as LPM does at 128.

prism's LPM matches prompts with one memcmp per radix edge; SGLang's tree compares token arrays by slices in
Python and builds request keys and match results per request, so its round costs more per request.
"""

from __future__ import annotations

import argparse
import gc
import time

from prism.errors import UserError
from prism.policies.base import DemandHints, SchedContext
from prism.policies.klpm import KLPM
from prism.policies.lpm import LPM, LPMConfig
from prism.policies.qas_compiled import CompiledQAS as QAS
from prism.sim.engine import Seq
from prism.sim.radix_cache import RadixCache
from prism.traces.spec import generate
from prism.traces.zipf import ZipfHotspotSpec


def time_round(policy_factory, waiting, ctx, repeat: int) -> tuple[float, float]:
    """(first round, steady round): a policy meets each request once (QAS registers its segments then);
    later rounds over the same queue are what a running engine pays per scheduling iteration."""
    first = steady = float("inf")
    for _ in range(repeat):
        policy = policy_factory()
        gc.collect()
        gc.disable()  # as timeit does: SGLang's tree keeps many objects alive, and a collection would bill them
        try:
            t0 = time.perf_counter()
            policy.plan(waiting, ctx)
            t1 = time.perf_counter()
            policy.plan(waiting, ctx)
            t2 = time.perf_counter()
        finally:
            gc.enable()
        first, steady = min(first, t1 - t0), min(steady, t2 - t1)
    return first, steady


def sglang_lpm(cached):
    """A factory of rounds of SGLang's own ``calc_priority`` (LPM) over a simulated SGLang radix tree holding
    ``cached``; None when SGLang does not import. Past 128 waiting SGLang keeps the queue order, and its
    bookkeeping there needs a running server's context, so these rounds always match, as SGLang does at 128."""
    try:
        import sglang.srt.managers.schedule_policy as sp
        from prism.live.sglang_objects import SGLangQueue
        queue = SGLangQueue(cached, "lpm")
    except (ImportError, UserError) as e:
        print(f"(SGLang not timed: {str(e).splitlines()[0][:120]})")
        return None

    class Round:  # calc_priority sorts SGLang Req objects in place; they are made once, as SGLang keeps them
        reqs = None

        def plan(self, waiting, ctx) -> None:
            if self.reqs is None:
                self.reqs = queue.requests(waiting)
            limit = sp.WAITING_QUEUE_PREFIX_MATCH_MAX
            sp.WAITING_QUEUE_PREFIX_MATCH_MAX = max(limit, len(self.reqs))
            try:
                queue.sort(self.reqs)
            finally:
                sp.WAITING_QUEUE_PREFIX_MATCH_MAX = limit

    return Round


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="128,1000,10000", help="comma-separated queue sizes")
    p.add_argument("--repeat", type=int, default=5, help="repeats per point (the best is kept)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    trace = generate(ZipfHotspotSpec(num_requests=1000 + max(sizes), seed=42))
    cached = [r.tokens() for r in trace.requests[:1000]]
    cache = RadixCache(None)
    for tokens in cached:
        cache.insert(tokens.tobytes(), 0.0)
    sglang = sglang_lpm(cached)
    print(f"one scheduling round, best of {args.repeat}; cache holds {cache.size} tokens of 1,000 prompts")
    print(f"{'waiting':>8s} {'policy':24s} {'ms/round':>9s} {'x_sglang':>8s} {'x_lpm':>7s} {'us/request':>10s} "
          f"{'first_round_ms':>15s}")
    for n in sizes:
        waiting = [Seq(r) for r in trace.requests[1000:1000 + n]]
        ctx = SchedContext(0.0, cache, (), DemandHints(), batch_hint=64)
        sglang_name = "sglang-lpm" if n <= 128 else "sglang-lpm(no-fallback)"
        policies = {
            **({sglang_name: sglang} if sglang else {}),
            "lpm": lambda: LPM(),
            "lpm(no-fallback)": lambda: LPM(LPMConfig(fcfs_threshold=10**9)),
            "klpm(k=2)": lambda: KLPM(),
            "qas": lambda: QAS(),
        }
        times = {name: time_round(f, waiting, ctx, args.repeat) for name, f in policies.items()}
        lpm = times["lpm"][1] if n <= 128 else times["lpm(no-fallback)"][1]
        sgl = times.get(sglang_name, (0, float("nan")))[1]
        for name, (first, t) in times.items():
            print(f"{n:8d} {name:24s} {t * 1e3:9.3f} {t / sgl:8.3f} {t / lpm:7.3f} {t / n * 1e6:10.2f} "
                  f"{first * 1e3:15.3f}")


if __name__ == "__main__":
    main()
