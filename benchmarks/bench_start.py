"""Start-up cost of ``prism-sim``: time to the first simulated event and peak memory before the trace loads,
beside the bare interpreter that imports numpy, simpy and yaml.

    python benchmarks/bench_start.py [--repeat 7] [--method fcfs] [--trace zipf] [--python OTHER_PYTHON ...]

Each measurement is a fresh process (best of --repeat, the two kinds interleaved so that a slow spell hits
both alike): the reference runs ``python -c "import numpy, simpy, yaml"``; the prism-sim process runs
``prism.cli.sim.main`` as the console script does, with two hooks installed after its import: one notes the
peak RSS (``ru_maxrss``) when the trace starts to load, the other ends the process at the first simulated event
(``simpy.Environment.step``). Wall times are the parent's, from launch to exit, interpreter start included.
Targets (issue 14): time to first event <= 2x the reference, peak RSS before the trace loads <= 80 MiB.

``--whole N`` times the whole command instead, to its exit, on N requests (issue 31: ``prism-sim --method prism``
on 10 requests within 2x the reference, as fcfs), for each ``--method`` given (comma-separated), run as the console
script runs it (``main()`` reading ``sys.argv``); its peak RSS is the process's at exit.

Two conditions, each process of both kinds alike:

* ``cached`` (the target's): compiled bytecode is read from a cache, as for any installed package (pip
  compiles it at install) and for a checkout after its first run. The caches go to a temporary
  ``PYTHONPYCACHEPREFIX``, written by one warm-up run of each kind, so the checkout is left as it was;
* ``as is``: the environment as given. Where it sets ``PYTHONDONTWRITEBYTECODE`` (some containers do, and
  the development machine does) an editable checkout has no cached bytecode, and every start compiles
  prism's modules from source (about 20 ms on the development machine), which the reference, installed
  with its bytecode, never does.

``--python`` adds other interpreters (another checkout's virtual environment) side by side; every process
runs in an empty temporary folder, so that no checkout's folder shadows the installed package.
"""

from __future__ import annotations

import argparse
import json
import os
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


#: the whole command, as its console script runs it, then what it imported and its peak RSS
WHOLE = r"""
import json, resource, sys
from prism.cli.sim import main
try:
    code = main()
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("matplotlib", "scipy", "numba") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy,
                  "rss_first_event_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def timed(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])}...: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return wall, proc.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=7, help="processes of each kind (the best is kept)")
    p.add_argument("--method", default="fcfs", help="method of the prism-sim process (default fcfs)")
    p.add_argument("--trace", default="zipf", help="a built-in spec or an absolute path")
    p.add_argument("--python", action="append", default=[], help="another interpreter to compare (repeatable)")
    p.add_argument("--whole", type=int, metavar="N",
                   help="time the whole command on N requests, to its exit (--method may list several)")
    args = p.parse_args()
    if args.whole is not None:
        return whole(args)
    pythons = [sys.executable, *args.python]
    best: dict[tuple[str, str, str], float] = {}
    info: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = f"{tmp}/pycache"
        conditions = {"cached": cached, "as is": dict(os.environ)}
        sim_cmd = ["-c", PROBE, "--trace", args.trace, "--method", args.method, "--no-progress",
                   "--out", f"{tmp}/run"]
        for py in pythons:  # the warm-up that writes the caches
            timed([py, "-c", REFERENCE], tmp, cached)
            timed([py, *sim_cmd], tmp, cached)
        for _ in range(args.repeat):
            for py in pythons:
                for cond, env in conditions.items():
                    ref, _ = timed([py, "-c", REFERENCE], tmp, env)
                    best[py, cond, "ref"] = min(best.get((py, cond, "ref"), ref), ref)
                    sim, out = timed([py, *sim_cmd], tmp, env)
                    if sim < best.get((py, cond, "sim"), float("inf")):
                        best[py, cond, "sim"] = sim
                        info[py, cond] = json.loads(out.strip().splitlines()[-1])
    print(f"best of {args.repeat} fresh processes; prism-sim --trace {args.trace} --method {args.method} "
          f"until its first simulated event")
    print(f"{'python':40s} {'bytecode':8s} {'ref_s':>6s} {'sim_s':>6s} {'x_ref':>6s} {'to_trace_s':>10s} "
          f"{'rss_pre_trace':>13s} {'rss_1st_event':>13s}  heavy modules")
    nan = float("nan")
    for py in pythons:
        for cond in conditions:
            ref, sim, rec = best[py, cond, "ref"], best[py, cond, "sim"], info[py, cond]
            print(f"{py[-40:]:40s} {cond:8s} {ref:6.3f} {sim:6.3f} {sim / ref:6.2f} "
                  f"{rec.get('t_trace_s', nan):10.3f} {rec.get('rss_before_trace_mib', nan):10.1f} MiB "
                  f"{rec['rss_first_event_mib']:9.1f} MiB  {','.join(rec['heavy']) or '-'}")


def whole(args: argparse.Namespace) -> None:
    """``--whole N``: each method's whole command against the reference, best of ``--repeat``, interleaved."""
    methods = args.method.split(",")
    pythons = [sys.executable, *args.python]
    best: dict[tuple[str, str], float] = {}
    info: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = f"{tmp}/pycache"

        def cmd(py: str, method: str) -> list[str]:
            return [py, "-c", WHOLE, "--trace", args.trace, "--method", method, "--no-progress",
                    "--set", f"trace.num_requests={args.whole}", "--out", f"{tmp}/run"]

        for py in pythons:  # the warm-up that writes the caches
            timed([py, "-c", REFERENCE], tmp, env)
            for m in methods:
                timed(cmd(py, m), tmp, env)
        for _ in range(args.repeat):
            for py in pythons:
                ref, _ = timed([py, "-c", REFERENCE], tmp, env)
                best[py, "ref"] = min(best.get((py, "ref"), ref), ref)
                for m in methods:
                    t, out = timed(cmd(py, m), tmp, env)
                    if t < best.get((py, m), float("inf")):
                        best[py, m] = t
                        info[py, m] = json.loads(out.strip().splitlines()[-1])
    print(f"best of {args.repeat} fresh processes (bytecode cached); prism-sim --trace {args.trace} on {args.whole} "
          "requests, the whole command")
    print(f"{'python':40s} {'method':14s} {'ref_s':>6s} {'sim_s':>6s} {'x_ref':>6s} {'peak_rss':>9s}  heavy modules")
    for py in pythons:
        for m in methods:
            ref, sim, rec = best[py, "ref"], best[py, m], info[py, m]
            print(f"{py[-40:]:40s} {m:14s} {ref:6.3f} {sim:6.3f} {sim / ref:6.2f} {rec['rss_first_event_mib']:6.1f} MiB  "
                  f"{','.join(rec['heavy']) or '-'}")


if __name__ == "__main__":
    main()
