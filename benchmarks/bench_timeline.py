"""What ``prism-sim --timeline`` costs: CPU time of a simulation without and with the timeline observer, side by
side in one process, and the timeline's size.

    python benchmarks/bench_timeline.py [--quick] [--repeat 3]

Each case is timed two ways, each alternately off and on (off, on, off, on, ...) so that a shared machine's
load drifts over both alike:

* ``run``: the whole of ``prism-sim`` in this process (``prism.cli.sim.main`` with ``--out``, without and with
  ``--timeline``): the trace, the simulation with its served-order reference, ``requests.csv``,
  ``summary.json`` and the timeline: what a user waits for, less the interpreter's start and imports;
* ``simulate``: ``simulate`` alone against ``simulate`` with :class:`~prism.sim.timeline.SimTimeline` writing
  its file (closed, renamed): the strictest ratio, the timeline against the engine's own work.

A side's figure is the minimum of its ``--repeat`` runs of CPU time (``time.process_time``: this process's user
+ system time; on a shared machine other sessions still slow it through the caches they share, and the minimum
is the run they disturbed least). Printed per case: requests, iterations, CPU seconds off and on and their
ratio on/off for both ways (the target: under 1.20 for a run), the file's size in MB and its request tracks.
Off is the engine without an observer (``events=None``: one comparison per event), so off costs nothing by
construction; the digests of benchmarks/output_digests.py hold its output unchanged.

The cases: zipf at 60 QPS under prism (front end, 2,048 requests), SGLang's retraction on a small pool, a
cluster of four instances, and the size bound: 20,480 requests with a GPU-sized pool (the README's figure;
``--quick`` drops it).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "zipf-prism-qps60": ("zipf", "prism", 60, []),
    "zipf-sglang-pool32k": ("zipf", "sglang", 60, ["engine.max_total_tokens=32768"]),
    "zipf-sglang-4x-rr": ("zipf", "sglang", 200, ["cluster.instances=4", "cluster.router=rr"]),
    "zipf-sglang-20480": ("zipf", "sglang", 40, ["trace.num_requests=20480", "engine.max_total_tokens=null"]),
}


def _spec(trace: str, method: str, qps: float, sets: list[str]):
    from prism.settings import merge_flags, settings_from

    return settings_from(merge_flags({}, sets, method=method, qps=qps), "bench_timeline").resolve(trace)


def _once(spec, timeline: Path | None) -> tuple[float, dict, dict]:
    from prism.sim.run import simulate
    from prism.sim.timeline import SimTimeline

    gc.collect()
    t0 = time.process_time()
    tl = SimTimeline(timeline, spec) if timeline is not None else None
    res = simulate(spec, events=tl)
    meta = tl.close(res.summary) and tl.w.meta if tl is not None else {}
    return time.process_time() - t0, res.summary, meta


def _command(name: str, folder: Path, timeline: bool) -> float:
    """CPU seconds of one prism-sim run in this process (its output silenced)."""
    import contextlib
    import io

    from prism.cli.sim import main as sim_main

    trace, method, qps, sets = CASES[name]
    argv = ["--trace", trace, "--method", method, "--qps", str(qps), "--no-progress", "--out", str(folder / name),
            *[a for kv in sets for a in ("--set", kv)], *(["--timeline"] if timeline else [])]
    gc.collect()
    t0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        assert sim_main(argv) == 0
    return time.process_time() - t0


def run_case(name: str, repeat: int, folder: Path) -> dict:
    trace, method, qps, sets = CASES[name]
    spec = _spec(trace, method, qps, sets)
    from dataclasses import replace

    from prism.sim.run import simulate

    simulate(replace(spec, trace=spec.trace.head(64)))  # first-use costs (numba's cache) are neither side's
    path = folder / f"{name}.json"
    off, on, run_off, run_on = [], [], [], []
    for _ in range(repeat):
        off.append(_once(spec, None)[0])
        cpu, summary, meta = _once(spec, path)
        on.append(cpu)
        run_off.append(_command(name, folder, False))
        run_on.append(_command(name, folder, True))
    c = summary["counters"]
    a, b = min(off), min(on)
    return {"case": name, "requests": summary["num_requests"],
            "iterations": c.get("prefill_iterations", 0) + c.get("decode_iterations", 0), "cpu_off_s": a,
            "cpu_on_s": b, "ratio": b / a, "run_off_s": min(run_off), "run_on_s": min(run_on),
            "run_ratio": min(run_on) / min(run_off), "size_mb": os.path.getsize(path) / 2**20,
            "request_tracks": meta["request_tracks"], "events": meta["trace_events"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="skip the 20,480-request case")
    p.add_argument("--repeat", type=int, default=3, help="runs per side and case (default 3; the fastest counts)")
    p.add_argument("--cases", help=f"comma-separated cases (default all: {', '.join(CASES)})")
    args = p.parse_args(argv)
    names = args.cases.split(",") if args.cases else [n for n in CASES if not (args.quick and "20480" in n)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows.append(run_case(name, args.repeat, Path(tmp)))
            r = rows[-1]
            print(f"{r['case']:22s} {r['requests']:6d} req {r['iterations']:6d} it | run: off {r['run_off_s']:6.2f} s "
                  f"on {r['run_on_s']:6.2f} s ratio {r['run_ratio']:.3f} | simulate: off {r['cpu_off_s']:6.2f} s "
                  f"on {r['cpu_on_s']:6.2f} s ratio {r['ratio']:.3f} | {r['size_mb']:5.1f} MB, "
                  f"{r['request_tracks']} request tracks, {r['events']} events", flush=True)
    worst = max(r["run_ratio"] for r in rows)
    print(f"worst ratio on/off of a run {worst:.3f} (target < 1.20); of simulate alone "
          f"{max(r['ratio'] for r in rows):.3f}")
    return 0 if worst < 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
