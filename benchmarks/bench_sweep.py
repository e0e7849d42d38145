"""The README's sweep end to end: wall and CPU time of ``prism-sim sweep`` per interpreter, side by side.

    python benchmarks/bench_sweep.py [--repeat 3] [--workers 0] [--python OTHER_PYTHON ...]

Each measurement is a fresh sweep process (``prism.cli.sim.main``, as the console script runs it) in an empty
temporary folder, so that no checkout's folder shadows the installed package: the README's sweep
(``--trace zipf --methods sglang,klpm,contextpilot,prism --qps 40,50,60,70,80 --seeds 3``: 60 runs, their 60
Belady references, the CSV files and plots) into a fresh output folder. The interpreters take turns within
each repeat, so that a slow spell of a shared machine hits all alike. Reported per interpreter: the best and
median wall time, the CPU time of the sweep and its workers (user + system) of the best run, and the ratios of
both to the first interpreter's. ``--python`` adds other interpreters (another checkout's virtual
environment, such as the code before issue 14). Every interpreter must write the same results: each run's
``requests.csv``, and ``summary.csv`` and ``aggregate.csv`` but for their ``wall_s`` column, are compared
with the first interpreter's: a difference is reported, and is an error (exit status 1) unless
``--allow-differ`` says the versions compared model differently (f232b01, for one, predates the calibrated
cost model and the GPU-sized pool of ``zipf.yaml``, whose outputs differ by design).
Target (issue 14): the sweep in <= 1/3 of the time of the code before the issue (f232b01).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = ["sweep", "--trace", "zipf", "--methods", "sglang,klpm,contextpilot,prism", "--qps", "40,50,60,70,80",
         "--seeds", "3", "--no-progress"]
RUN = "import sys; from prism.cli.sim import main; sys.exit(main(sys.argv[1:]))"


def children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def sweep(py: str, out: Path, workers: int, cwd: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one sweep into ``out`` (the sweep's pool workers are its children: their CPU time
    reaches ours when it has waited for them)."""
    cmd = [py, "-c", RUN, *SWEEP, "--out", str(out), *(["--workers", str(workers)] if workers else [])]
    cpu0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{py}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return wall, cpu


def results(out: Path) -> dict[str, str]:
    """A digest per result file: every run's requests.csv; summary.csv and aggregate.csv without wall_s."""
    digests = {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted(out.glob("runs/*/*/requests.csv"))}
    for name in ("summary.csv", "aggregate.csv"):
        with (out / name).open(newline="") as f:
            rows = sorted(tuple(v for k, v in r.items() if k != "wall_s") for r in csv.DictReader(f))
        digests[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
    return digests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="sweeps per interpreter, taking turns")
    p.add_argument("--workers", type=int, default=0, help="the sweep's --workers (default: one per CPU)")
    p.add_argument("--python", action="append", default=[], help="another interpreter to compare (repeatable)")
    p.add_argument("--allow-differ", action="store_true", help="versions that model differently: report only")
    args = p.parse_args()
    pythons = [sys.executable, *args.python]
    times: dict[str, list[tuple[float, float]]] = {py: [] for py in pythons}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for py in pythons:
                out = Path(tmp) / f"out{pythons.index(py)}"
                shutil.rmtree(out, ignore_errors=True)  # a sweep would skip the runs an earlier one finished
                times[py].append(sweep(py, out, args.workers, tmp))
        outputs = {py: results(Path(tmp) / f"out{pythons.index(py)}") for py in pythons}
    base_wall, base_cpu = min(times[pythons[0]])
    print(f"the README's sweep ({' '.join(SWEEP[1:])}), {args.repeat} turns; ratios to the first interpreter")
    print(f"{'python':40s} {'best_s':>7s} {'median_s':>8s} {'cpu_s':>7s} {'x_wall':>6s} {'x_cpu':>6s}  results")
    differ = False
    for py in pythons:
        wall, cpu = min(times[py])
        same = outputs[py] == outputs[pythons[0]]
        differ |= not same
        print(f"{py[-40:]:40s} {wall:7.2f} {statistics.median(w for w, _ in times[py]):8.2f} {cpu:7.1f} "
              f"{wall / base_wall:6.3f} {cpu / base_cpu:6.3f}  {'same' if same else 'DIFFER'}")
    for py in pythons[1:]:
        diff = sorted(k for k in outputs[py].keys() | outputs[pythons[0]].keys()
                      if outputs[py].get(k) != outputs[pythons[0]].get(k))
        if diff:
            print(f"{py}: {len(diff)} result files differ from {pythons[0]}'s: {', '.join(diff[:5])}"
                  f"{' ...' if len(diff) > 5 else ''}")
    if differ and not args.allow_differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
