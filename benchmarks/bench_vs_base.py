"""Whole-process wall time and peak RSS of ``prism-sim`` on two checkouts, side by side: this one and an older
commit's (issue 31's targets are ratios to 508aed3 on the shared prefix workload).

    python benchmarks/bench_vs_base.py --base-python /work/venv-base/bin/python [--repeat 3]
        [--cases 20480:gpu:fcfs,20480:gpu:prism,...] [--trace traces/prefix20.yaml]
        [--profile h100-sxm-80g:llama-3.1-8b] [--qps 50] [--new-set qas.front_end=arrivals]

A case is ``REQUESTS:POOL:METHOD`` (POOL ``gpu``: the profile's GPU-sized pool, ``engine.max_total_tokens=null``;
a number: that many tokens), or ``fleet:SHARING:GPUS``: several models sharing GPUs as ``bench_fleet.py`` runs
them (``multimodel-18`` at rate scale 2, the scheme SHARING on GPUS GPUs, 0: the scheme's own count; issue 31:
the fleet's cost per request). Each process runs the interpreter's ``prism.cli.sim`` as the console script does,
from an empty temporary folder (no checkout's folder shadows its installed package) with ``--no-progress``; the
time is the parent's, launch to exit, interpreter start and imports included; the peak RSS is the child's own
(``wait4``). Both sides read the same trace spec file (this checkout's). Every repeat runs each case on both
sides in turn (at once under ``--instructions``, below), the side that goes first alternating, so that a slow
spell on a shared machine hits both alike.
Printed per case: the median and the fastest of each side, the ratio new/old of the medians (and of the fastest),
the target where the issue sets one (its targets are ratios to 508aed3 of the default deployment: shown only for a
base that is an unmodified checkout of it, on prefix20 with H100/Llama-3.1-8B and no ``--qps`` or ``--new-set``),
the peak RSS of each side, and each side's median over its own fcfs median of the same size and pool where the
cases include it (issue 31: every method within 1.5x fcfs on zipf: ``--trace zipf --profile ''``). ``--json``
writes the figures.

Both sides run with compiled bytecode, as ``bench_start.py``'s ``cached`` condition: each side's checkout is
compiled (``compileall``) into a temporary ``PYTHONPYCACHEPREFIX`` of its own, which its processes then read, so
the checkouts are left as they were. Python caches a module's bytecode when it first imports it, unless
``PYTHONDONTWRITEBYTECODE`` is set (as on these machines): then a checkout made for a benchmark, which has no
caches, compiles every module it imports in every process (about 0.04 s, a seventh of a 2,048-request run),
while a working checkout reads the caches an earlier run left.

``--instructions`` counts each process's instructions instead of timing it (valgrind's callgrind, the hash seed
fixed; one repeat is enough, a second gives the same count): a figure these shared machines cannot disturb, where
wall and CPU times of the same code swing by a third between back-to-back runs. It needs valgrind, and each
``--*-python`` a real interpreter or a venv's (not a shell shim such as pyenv's); a process takes about 50 times as
long, and the peak RSS is not measured. The two sides' processes of a case run at once (a count does not depend on
what else the machine runs), with one OpenBLAS thread and, where ``setarch`` is found, no address randomization
(numpy starts a thread per core at import, and randomized addresses move hash tables' collisions: two counts of
the same 200-request zipf FCFS process differed by 3 million without them, by 3 thousand with them).

Each case runs once on each side first, neither timed nor counted, as the measured runs will run (under valgrind
with ``--instructions``), so that what a first process leaves on disk falls on no measured one: the modules
outside the checkout (the standard library's, numpy's) compiled into the temporary cache, about two billion
instructions; and the functions numba compiled (508aed3's QAS kernels, before they were built at install time).
Numba keys those by the CPU, and valgrind presents another: a warm-up outside valgrind left 508aed3's first
counted prism run of 2,048 requests to compile them, 65.4 billion instructions against 4.5 with the cache.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from prism.cli.common import entry_point
from prism.output import check_out_file, write_atomic_text

HERE = Path(__file__).resolve().parent.parent

#: the commit issue 31's targets are ratios to, and the targets (new/old of whole-process time) on prefix20,
#: H100/Llama-3.1-8B: printed only where the base checkout is that commit, unmodified, and the trace and
#: profile are those
TARGETS_BASE = "508aed3"
TARGETS = {**{(20480, pool, m): 0.75 for pool in ("gpu", "32768") for m in ("fcfs", "sglang", "dfs_weight")},
           **{(20480, pool, "prism"): 0.58 for pool in ("gpu", "32768")},
           (204800, "gpu", "fcfs"): 0.85, (204800, "gpu", "sglang"): 0.85, (204800, "gpu", "prism"): 0.78,
           (2048, "gpu", "fcfs"): 0.68, (2048, "gpu", "prism"): 0.30}
DEFAULT_CASES = ",".join(f"{n}:{pool}:{m}" for n, pool, m in TARGETS if n != 204800)


class Running:
    """The processes of one case, stopped together: at once under --instructions, where the first side to fail
    stops the other, and a side whose process starts only after that (its thread slower than the failure) is
    stopped as it starts, not counted on for minutes while the error waits; and on Ctrl-C. Each runs in a session
    of its own, killed whole (a child it started would hold the stderr pipe open); it stays here from its start
    until it has exited and before it is reaped (``exited``), so that a kill never reaches a process group id
    the system has given to others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self._stopped = False

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.add(proc)
            if self._stopped:
                os.killpg(proc.pid, signal.SIGKILL)

    def exited(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for proc in self._procs:
                os.killpg(proc.pid, signal.SIGKILL)  # not Popen.kill: it may reap the process first (poll)


def run_once(python: str, argv: list[str], env: dict[str, str], instructions: bool = False,
             running: Running | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one fresh ``prism-sim`` process; with ``instructions``, the billions of
    instructions it ran (callgrind) and no RSS (nan). ``running``: the case's processes, this one among them (to
    stop them together); Ctrl-C here stops it before its folder is removed."""
    cmd = [python, "-c", "import sys; from prism.cli.sim import main; sys.exit(main())", *argv]
    if instructions:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
        cmd = ["setarch", "-R", *cmd] if shutil.which("setarch") else cmd  # the same addresses run after run
        env = {**env, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    running = running if running is not None else Running()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*cmd, "--out", f"{tmp}/run"], cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        running.add(proc)
        try:
            err = proc.stderr.read().decode()  # to the end first: a child blocked on a full pipe never exits
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        except BaseException:
            running.stop()
            proc.wait()
            raise
        finally:
            proc.stderr.close()
        running.exited(proc)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{python} {' '.join(argv)}: exit {proc.returncode}: {err.strip()[-800:]}")
        if instructions:
            counted = re.search(r"Collected : (\d+)", err)
            if counted is None:
                raise SystemExit(f"{python}: valgrind counted nothing (a shell shim instead of an interpreter?): "
                                 f"{err.strip()[-300:]}")
            return int(counted.group(1)) / 1e9, float("nan")
        return wall, usage.ru_maxrss / 1024


def compiled_env(python: str, cache: str) -> tuple[dict[str, str], str, str]:
    """The environment in which ``python``'s processes read the bytecode of its checkout (the one whose ``prism``
    it imports), compiled into ``cache`` (module docstring); the checkout's root; and whether it runs the modules
    its install compiled (``prism/native.py``'s status; ``none`` before there were any)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    with tempfile.TemporaryDirectory() as tmp:
        where = ("import pathlib, prism; print(pathlib.Path(prism.__file__).parent.parent); "
                 "print(prism.native.status() if hasattr(prism, 'native') else 'none')")
        root, native = subprocess.run([python, "-c", where], cwd=tmp, env=env, capture_output=True, text=True,
                                      check=True).stdout.splitlines()  # a root may hold spaces
        skip = r"/(\.venv[^/]*|\.git|tests|notebooks)(/|$)"
        subprocess.run([python, "-m", "compileall", "-q", "-j", "0", "-x", skip, root], cwd=tmp, env=env,
                       stdout=subprocess.DEVNULL, check=True)
    return env, root, native


def checkout_commit(root: str) -> str | None:
    """The commit of the git checkout at ``root``, or None where it is not one, or has changes to tracked files."""
    def git(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", root, *argv], capture_output=True, text=True)

    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except OSError:  # no git
        return None
    return head.stdout.strip() if head.returncode == 0 and status.returncode == 0 and not status.stdout else None


def _target_key(case: str) -> tuple | None:
    n, pool, method = case.split(":")
    return (int(n), pool, method) if n.isdigit() else None


def case_argv(case: str, trace: str, profile: str, qps: float | None) -> list[str]:
    n, pool, method = case.split(":")
    if n == "fleet":  # fleet:SHARING:GPUS
        return ["--trace", "multimodel-18", "--sharing", pool, "--set", "fleet.rate_scale=2", "--no-progress",
                *(["--gpus", method] if int(method) else [])]
    argv = ["--trace", trace, *(["--profile", profile] if profile else []), "--method", method, "--no-progress",
            "--set", f"trace.num_requests={int(n)}",
            "--set", f"engine.max_total_tokens={'null' if pool == 'gpu' else int(pool)}"]
    return argv + (["--qps", str(qps)] if qps is not None else [])


def _mib(rss: float) -> str:
    return "-" if math.isnan(rss) else f"{rss:.0f}M"  # not measured under --instructions


# Ctrl-C, SIGTERM and SIGHUP end it with one line and status 128 + the signal, as a prism command (run_once stops
# the case's processes on the way out)
@entry_point("bench_vs_base")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-python", required=True, help="the older checkout's interpreter (its venv's python)")
    p.add_argument("--new-python", default=sys.executable, help="this checkout's interpreter (default: this one)")
    p.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated REQUESTS:POOL:METHOD (see above)")
    p.add_argument("--repeat", type=int, help="processes per case and side (median and fastest; default 3, "
                                               "with --instructions 1)")
    p.add_argument("--trace", default=str(HERE / "traces" / "prefix20.yaml"),
                   help="trace spec both sides run (a path, or a built-in spec's name)")
    p.add_argument("--profile", default="h100-sxm-80g:llama-3.1-8b", help="GPU:MODEL profile ('': the default)")
    p.add_argument("--qps", type=float, help="arrival rate (default: the spec's)")
    p.add_argument("--new-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting only this checkout's side takes (repeatable): a knob the older commit lacks, "
                        "e.g. qas.front_end=arrivals for prism's deployment before the backlog became its default")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions (valgrind's callgrind) instead of timing: steady on a noisy machine")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.instructions and shutil.which("valgrind") is None:
        p.error("--instructions needs valgrind on PATH")
    if args.json:  # an unusable path: one line now, not after minutes of runs
        check_out_file(args.json, "--json")
    args.repeat = args.repeat or (1 if args.instructions else 3)
    new_only = [a for kv in args.new_set for a in ("--set", kv)]
    sides = {"old": args.base_python, "new": args.new_python}
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    caches = tempfile.TemporaryDirectory()
    envs, roots = {}, {}
    for side, python in sides.items():
        envs[side], roots[side], native = compiled_env(python, f"{caches.name}/{side}")
        print(f"# {side}: {roots[side]}, compiled to bytecode; compiled modules: {native}", file=sys.stderr,
              flush=True)
    base = checkout_commit(roots["old"])
    unlike = [why for why, off in (
        (f"the base is {base[:7] if base else 'not an unmodified git checkout'}",
         not (base or "").startswith(TARGETS_BASE)),
        ("the trace is not prefix20", Path(args.trace).name not in ("prefix20.yaml", "prefix20")),
        ("the profile is not H100/Llama-3.1-8B", args.profile != p.get_default("profile")),
        ("--qps changes the rate", args.qps is not None),
        ("--new-set changes the deployment", bool(args.new_set))) if off]
    targeted = not unlike
    if unlike and any(_target_key(c) in TARGETS for c in cases):
        print(f"# no target column: issue 31's targets are ratios to {TARGETS_BASE}'s default deployment on prefix20 "
              f"with H100/Llama-3.1-8B, and here {'; '.join(unlike)}", file=sys.stderr, flush=True)
    walls: dict[tuple[str, str], list[float]] = {(c, s): [] for c in cases for s in sides}  # or instructions
    unit = "G" if args.instructions else "s"
    rss: dict[tuple[str, str], float] = {}
    trace = str(Path(args.trace).resolve()) if Path(args.trace).exists() else args.trace

    def run_case(case: str, order: list[str], valgrind: bool) -> dict[str, tuple[float, float]]:
        """Each side's (wall or instructions, peak RSS) for ``case``, under valgrind where ``valgrind``: in turn,
        or at once under --instructions, where the first side to fail (or Ctrl-C) stops the other's process, which
        could count on for minutes."""
        running = Running()

        def one(side: str) -> tuple[float, float]:
            argv = case_argv(case, trace, args.profile, args.qps) + (new_only if side == "new" else [])
            return run_once(sides[side], argv, envs[side], valgrind, running)
        if not args.instructions:
            return {side: one(side) for side in order}
        with ThreadPoolExecutor(len(order)) as pool:
            futures = {side: pool.submit(one, side) for side in order}
            try:
                for f in wait(futures.values(), return_when=FIRST_EXCEPTION)[0]:
                    if f.exception() is not None:
                        raise f.exception()
            except BaseException:
                running.stop()
                raise
            return {side: f.result() for side, f in futures.items()}

    for case in cases:  # a run first, neither timed nor counted (module docstring)
        run_case(case, list(sides), args.instructions)
    for rep in range(args.repeat):
        for i, case in enumerate(cases):
            order = list(sides) if (rep + i) % 2 == 0 else list(sides)[::-1]
            for side, (wall, peak) in run_case(case, order, args.instructions).items():
                walls[case, side].append(wall)
                rss[case, side] = max(rss[case, side], peak) if (case, side) in rss else peak  # nan: not measured
            print(f"# repeat {rep + 1}/{args.repeat} {case}: old {walls[case, 'old'][-1]:.2f} {unit}, "
                  f"new {walls[case, 'new'][-1]:.2f} {unit}", file=sys.stderr, flush=True)
    print(f"whole process, {'billions of instructions' if args.instructions else 'wall seconds'}, "
          f"{args.repeat} interleaved repeats; {Path(args.trace).name}, {args.profile}"
          + (f"; the new side also --set {' '.join(args.new_set)}" if args.new_set else "")
          + ("; fleet cases: multimodel-18 at rate scale 2" if any(c.startswith("fleet:") for c in cases) else ""))
    print(f"{'case':24s} {'old_med':>8s} {'new_med':>8s} {'ratio':>6s} {'old_min':>8s} {'new_min':>8s} "
          f"{'r_min':>6s} {'target':>6s} {'old_rss':>8s} {'new_rss':>8s} {'old/fcfs':>8s} {'new/fcfs':>8s}")
    rows = []
    for case in cases:
        o, n = walls[case, "old"], walls[case, "new"]
        size, pool, method = case.split(":")
        target = TARGETS.get(_target_key(case)) if targeted else None
        row = {"case": case, "old_median_s": statistics.median(o), "new_median_s": statistics.median(n),
               "old_min_s": min(o), "new_min_s": min(n), "old_rss_mib": rss[case, "old"],
               "new_rss_mib": rss[case, "new"], "target": target, "base_commit": base, "old_s": o, "new_s": n,
               "unit": "billions of instructions" if args.instructions else "wall seconds"}
        row["ratio"] = row["new_median_s"] / row["old_median_s"]
        row["ratio_min"] = row["new_min_s"] / row["old_min_s"]
        rows.append(row)
        fcfs = f"{size}:{pool}:fcfs"  # each side against its own fcfs run of the same size and pool (medians)
        vs = {side: statistics.median(walls[case, side]) / statistics.median(walls[fcfs, side])
              for side in sides} if fcfs in cases else {}
        row.update({f"{side}_vs_fcfs": v for side, v in vs.items()})
        print(f"{case:24s} {row['old_median_s']:8.2f} {row['new_median_s']:8.2f} {row['ratio']:6.2f} "
              f"{row['old_min_s']:8.2f} {row['new_min_s']:8.2f} {row['ratio_min']:6.2f} "
              f"{'' if target is None else f'{target:.2f}':>6s} "
              f"{_mib(row['old_rss_mib']):>8s} {_mib(row['new_rss_mib']):>8s} "
              f"{vs.get('old', float('nan')):8.2f} {vs.get('new', float('nan')):8.2f}")
    if args.json:
        rows = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows]
        write_atomic_text(args.json, json.dumps(rows, indent=2) + "\n")  # an RSS not measured: null
    caches.cleanup()
    return 0


if __name__ == "__main__":
    main()
