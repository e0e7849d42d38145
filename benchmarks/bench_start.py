"""Start-up cost of ``prism-sim``: time to the first simulated event and peak memory before the trace loads,
beside the bare interpreter that imports numpy, simpy and yaml.

    python benchmarks/bench_start.py [--repeat 7] [--method fcfs] [--trace zipf] [--python OTHER_PYTHON ...]

Each measurement is a fresh process (best of --repeat, the two kinds interleaved so that a slow spell hits
both alike): the reference runs ``python -c "import numpy, simpy, yaml"``; the prism-sim process runs
``prism.cli.sim.main`` as the console script does, with two hooks installed after its import: one notes the
peak RSS (``ru_maxrss``) when the trace starts to load, the other ends the process at the first simulated event
(``simpy.Environment.step``). Wall times are the parent's, from launch to exit, interpreter start included.
Targets (issue 14): time to first event <= 2x the reference, peak RSS before the trace loads <= 80 MiB.

``--python`` adds other interpreters (another checkout's virtual environment) side by side; every process
runs in an empty temporary folder, so that no checkout's folder shadows the installed package.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

REFERENCE = "import numpy, simpy, yaml"

#: the prism-sim process: import as the console script does, then hook the trace load and the first event
PROBE = r"""
import os, resource, sys, time, json
t0 = time.perf_counter()
import prism.cli.sim as cli
import simpy
out = {}
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
for name, mod in list(sys.modules.items()):  # every module that holds load_trace (by name) gets the hook
    fn = getattr(mod, "load_trace", None) if name.startswith("prism") else None
    if callable(fn) and getattr(fn, "__module__", "").startswith("prism"):
        def hooked(*a, _fn=fn, **k):
            out.setdefault("rss_before_trace_mib", rss())
            out.setdefault("t_trace_s", time.perf_counter() - t0)
            return _fn(*a, **k)
        setattr(mod, "load_trace", hooked)
step = simpy.Environment.step
def first_step(self):
    out["t_first_event_s"] = time.perf_counter() - t0
    out["rss_first_event_mib"] = rss()
    out["heavy"] = sorted(m for m in ("matplotlib", "scipy", "numba") if m in sys.modules)
    sys.stdout.write(json.dumps(out) + "\n"); sys.stdout.flush()
    os._exit(0)
simpy.Environment.step = first_step
cli.main(sys.argv[1:])
"""


def timed(cmd: list[str], cwd: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])}...: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return wall, proc.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--method", default="fcfs")
    p.add_argument("--trace", default="zipf", help="a built-in spec or an absolute path")
    p.add_argument("--python", action="append", default=[], help="another interpreter to compare (repeatable)")
    args = p.parse_args()
    pythons = [sys.executable, *args.python]
    best: dict[str, float] = {}
    info: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for py in pythons:
                ref, _ = timed([py, "-c", REFERENCE], tmp)
                best[f"ref {py}"] = min(best.get(f"ref {py}", ref), ref)
                sim, out = timed([py, "-c", PROBE, "--trace", args.trace, "--method", args.method, "--no-progress",
                                  "--out", f"{tmp}/run"], tmp)
                rec = json.loads(out.strip().splitlines()[-1])
                key = f"sim {py}"
                if sim < best.get(key, float("inf")):
                    best[key] = sim
                    info[py] = rec
    print(f"best of {args.repeat} fresh processes; prism-sim --trace {args.trace} --method {args.method} "
          f"until its first simulated event")
    print(f"{'python':40s} {'ref_s':>6s} {'sim_s':>6s} {'x_ref':>6s} {'to_trace_s':>10s} {'rss_pre_trace':>13s} "
          f"{'rss_1st_event':>13s}  heavy modules")
    for py in pythons:
        ref, sim, rec = best[f"ref {py}"], best[f"sim {py}"], info[py]
        print(f"{py[-40:]:40s} {ref:6.3f} {sim:6.3f} {sim / ref:6.2f} {rec.get('t_trace_s', float('nan')):10.3f} "
              f"{rec.get('rss_before_trace_mib', float('nan')):10.1f} MiB {rec['rss_first_event_mib']:9.1f} MiB  "
              f"{','.join(rec['heavy']) or '-'}")


if __name__ == "__main__":
    main()
