"""A QAS round as the SGLang plugin pays for it: between an engine's iterations, with the engine's work in the
CPU's caches (#29's overhead budget).

A live server runs a round every scheduler iteration, after SGLang's and torch's own work has evicted prism's
code and data from the caches: there, a round of two or three waiting requests costs several times what the
same round costs in a hot loop (measured in the plugin: about 300 us against 30-40 us). This benchmark runs
rounds of a small queue that the engine takes whole, as it does below the knee (the plan, each request's
alignment, the dispatch), with and without a stretch of other work between them (a matrix product and a pass
over 16 MB), and the kernel call alone boxed as the named tuple it once returned and as the plain tuple it
returns now (``policies/qas_round.py``'s *Cost*).

    python benchmarks/bench_plugin_round.py [--rounds 3000] [--queue 2] [--out FILE.json]

Prints per-round medians in microseconds of thread CPU time (the quartiles in the JSON). Compare commits by
running it on each in turn: the machine's noise is large, take the medians of several runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prism.core import PRIV, REUSE, SYS, SegmentTable  # noqa: E402
from prism.live.hooks import _EmptyIndex, _SyntheticRequest, prime  # noqa: E402
from prism.output import write_atomic_text  # noqa: E402
from prism.policies.base import Deployment, SchedContext  # noqa: E402
from prism.policies.qas_round import Round, compiled  # noqa: E402
from prism.policies.registry import make_policies, policy_configs  # noqa: E402


def _engine_work():
    """Something like an engine iteration's footprint in the caches (torch's matmul when torch is there)."""
    big = np.random.default_rng(0).random(2_000_000)
    try:
        import torch

        torch.set_num_threads(1)  # no spinning worker threads beside the measured one
        x = torch.randn(384, 384)
        return lambda: ((x @ x).sum(), big.sum())
    except ImportError:
        a = np.random.default_rng(1).random((384, 384))
        return lambda: ((a @ a).sum(), big.sum())


def _quartiles(samples: list[float]) -> dict[str, float]:
    q = np.percentile(np.array(samples) * 1e6, [25, 50, 75])
    return {"p25_us": round(float(q[0]), 1), "median_us": round(float(q[1]), 1), "p75_us": round(float(q[2]), 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3000, help="rounds per measurement (default 3000)")
    ap.add_argument("--queue", type=int, default=2, help="requests a round plans (default 2)")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)

    configs = policy_configs("qas", "dart", {"qas": {"window_s": 0}})
    prime(make_policies("qas", "dart", configs, Deployment()).scheduler)  # the compiled kernels, loaded
    policies = make_policies("qas", "dart", configs, Deployment())
    qas, hints = policies.scheduler, policies.hints
    table = SegmentTable()
    passages = [table.segment(f"p{i}", REUSE, 8) for i in range(60)]
    system = table.segment("sys", SYS, 4)
    made = iter(range(1, 10**9))

    def arrival():
        rid = next(made)
        return _SyntheticRequest(rid, [system, *passages[rid % 50:rid % 50 + 3], table.segment(f"q{rid}", PRIV, 4)])

    work = _engine_work()
    results = {}
    for label, between in (("round_cold", work), ("round_hot", None)):
        samples = []
        for k in range(args.rounds):
            waiting = [arrival() for _ in range(args.queue)]
            ctx = SchedContext(float(k), _EmptyIndex(), (), hints, batch_hint=args.queue)
            if between is not None:
                between()
            t0 = time.thread_time()
            plan = qas.plan(waiting, ctx)
            for r in plan.order:
                plan.align.get(r.id)
            qas.on_dispatch(list(plan.order), ctx)
            samples.append(time.thread_time() - t0)
        results[label] = _quartiles(samples)

    from numba import njit

    kernel, t = compiled().plan_round, qas.table
    n = len(t.segment_names)
    call = (t.prompts, qas._kernel_params, np.arange(3), np.arange(3), np.zeros(n), 3, t.arrival, 0.0,
            np.inf, 1)
    named = njit(lambda *a: Round(*kernel(*a)))  # what numba boxes through Python
    named(*call)
    for label, fn in (("kernel_plain_tuple", kernel), ("kernel_named_tuple", named)):
        for mode, between in (("cold", work), ("hot", None)):
            samples = []
            for _ in range(args.rounds // 3):
                if between is not None:
                    between()
                t0 = time.thread_time()
                fn(*call)
                samples.append(time.thread_time() - t0)
            results[f"{label}_{mode}"] = _quartiles(samples)
    for name, q in results.items():
        print(f"{name:26s} median {q['median_us']:7.1f} us  (p25 {q['p25_us']:.1f}, p75 {q['p75_us']:.1f})")
    if args.out is not None:
        write_atomic_text(args.out, json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
