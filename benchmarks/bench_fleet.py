"""Several models sharing GPUs: how fast the fleet simulates, and what a request costs in it against the single
engine, side by side in one run.

    python benchmarks/bench_fleet.py [--trace multimodel-18] [--rate-scale 2] [--gpus 4] [--sharing prism]
                                     [--repeat 3] [--json FILE]

1. **The large case** (#27: the 18-model trace at 2x its reference rate, about 10 minutes of traffic, in under
   a minute on 2 cores): wall time of ``simulate`` and of the whole ``prism-sim`` process, and simulated
   requests per wall second.
2. **Per-request cost against the single engine** (#31: within 1.3x). Each model's requests, alone, run on the
   single engine (``sim/run.py``, the reference; SLOs set, as the fleet does, so that both sides do the same
   work); then all of them together in one fleet: ``dedicated`` (one GPU per model: the same engines, each on a
   clock of its own, ``Fleet.parts``, so the ratio is the fleet machinery's own cost: its memory samples, its
   client's events, building the parts) and the scheme
   asked for (the same requests on fewer GPUs: other dynamics, so its ratio also moves with them). Wall time per
   request, and the ratio to the single engines' sum; and the engine iterations (prefill and decode) each side
   simulated, with the wall time per iteration and its ratio. A shared fleet's engines batch differently, so
   its requests need not take as many iterations as the single engines'; the ratio per iteration is the
   simulator's own cost, the ratio per request also carries that difference in simulated work. A single engine's
   iterations mostly pass without a SimPy event (``sim/clock.py``: nothing else is due before they end); a
   shared fleet's engines mostly cannot (another GPU's iteration ends first, another model holds the GPU).

The process pins itself to one core; sides are interleaved per repeat and the fastest wall time is kept
(these machines are noisy: compare ratios from one run).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

from prism.cli.common import table
from prism.settings import settings_from
from prism.sim.fleet import model_spec, with_slos
from prism.sim.run import simulate


def fleet_spec(trace: str, sharing: str, gpus: int | None, rate_scale: float):
    fleet = {"sharing": sharing, "rate_scale": rate_scale, **({"gpus": gpus} if gpus else {})}
    return with_slos(settings_from({"fleet": fleet}, "bench").resolve(trace))


def single_specs(spec):
    """Each model's requests on its own engine, as the dedicated scheme sets it up (its TP-scaled profile)."""
    from prism.calibration import profiles
    from prism.calibration.cost_model import served_profile

    gpu = profiles.gpu(spec.fleet.gpu)
    out = []
    for served in spec.served_models:
        mine = [r for r in spec.trace.requests if r.model == served.name]
        if mine:
            out.append(model_spec(spec, served, served_profile(gpu, profiles.model(served.profile), served.tp), mine))
    return out


def timed(fn) -> tuple[float, int]:
    """Wall seconds of ``fn`` and the engine iterations its results count."""
    gc.collect()
    t0 = time.perf_counter()
    results = fn()
    wall = time.perf_counter() - t0
    return wall, sum(r.counters.get("prefill_iterations", 0) + r.counters.get("decode_iterations", 0)
                     for r in results)


def whole_process(args) -> float:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "prism.cli.sim", "--trace", args.trace, "--sharing", args.sharing,
               "--set", f"fleet.rate_scale={args.rate_scale}", "--out", d, "--no-progress"]
        if args.gpus:
            cmd += ["--gpus", str(args.gpus)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="multimodel-18", help="multi-model trace (default multimodel-18)")
    p.add_argument("--rate-scale", type=float, default=2.0, help="multiplies the trace's rate (default 2)")
    p.add_argument("--gpus", type=int, default=4, help="GPUs of the shared fleet (default 4; 0: the fewest that "
                                                       "hold the models)")
    p.add_argument("--sharing", default="prism", help="the shared fleet's scheme (default prism)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved repeats; the fastest wall time is kept")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    shared = fleet_spec(args.trace, args.sharing, args.gpus or None, args.rate_scale)
    dedicated = fleet_spec(args.trace, "dedicated", None, args.rate_scale)
    singles = single_specs(dedicated)
    n = len(shared.trace.requests)
    best: dict[str, float] = {}
    iterations: dict[str, int] = {}
    for _ in range(args.repeat):
        sides = {"single engines": lambda: [simulate(s) for s in singles],
                 "dedicated fleet": lambda: [simulate(dedicated)],
                 f"{args.sharing} fleet": lambda: [simulate(shared)],
                 "whole process": None}
        for name, fn in sides.items():
            wall, iterations[name] = (whole_process(args), 0) if fn is None else timed(fn)
            best[name] = min(best.get(name, float("inf")), wall)
    ref, ref_it = best["single engines"], iterations["single engines"]
    rows = []
    for name, wall in best.items():
        it = iterations[name]
        per_it = [f"{it:,}", f"{wall / it * 1e6:.1f}", f"{wall / it / (ref / ref_it):.2f}x"] if it else ["-"] * 3
        rows.append([name, f"{wall:.2f}", f"{n / wall:,.0f}", f"{wall / n * 1e3:.3f}",
                     f"{wall / ref:.2f}x" if it else "-", *per_it])
    gpus = shared.fleet.gpus
    print(f"{args.trace} at rate scale {args.rate_scale:g}: {n} requests of {len(shared.served_models)} models; "
          f"{args.sharing} on {gpus} x {shared.fleet.gpu}, dedicated on {dedicated.fleet.gpus}")
    print(table(rows, ["side", "wall_s", "requests_per_s", "ms_per_request", "vs_single", "iterations",
                       "us_per_iteration", "vs_single_per_iteration"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "rate_scale": args.rate_scale, "requests": n, "gpus": gpus,
                       "sharing": args.sharing, "best_wall_s": best,
                       "iterations": iterations}, f, indent=2)


if __name__ == "__main__":
    main()
