"""``prism-live validate``: the same runs through prism-sim and a live (paced) SGLang server, side by side.

For each method and QPS the run is described once (one RunSpec), simulated, and served live; the table puts
hit rate, P50/P90/P99 TTFT and throughput of both engines next to each other with their ratios (live / sim)
and flags where they depart from the fidelity target (hit rate within 2 points, P50 and P99 TTFT within 15%),
with the retractions each engine made.
The difference is the simulator's engine-model error: the live side runs SGLang's real scheduler, cache,
admission and retraction, with only the step times modelled (when paced).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from prism.cli.common import (add_no_progress_flag, add_set_flag, add_trace_flag, comma_list, entry_point, parse_rates,
                              Parser, table)
from prism.cli.live import add_live_flags, apply_pace_profile, check_server, options, partial_results
from prism.errors import UserError
from prism.interrupts import InterruptsHeld, exit_status, received
from prism.metrics import read_requests_csv, write_json
from prism.output import check_out_dir, check_out_file, prepare_out_dir, save_figure, write_csv
from prism.settings import check_knobs_used, for_method, merge_flags, read_config, settings_from

HIT_POINTS, TTFT_REL = 0.02, 0.15
COLUMNS = ["method", "qps", "hit_sim", "hit_live", "hit_diff_pts", "p50_sim_s", "p50_live_s", "p50_ratio",
           "p90_sim_s", "p90_live_s", "p90_ratio", "p99_sim_s", "p99_live_s", "p99_ratio", "thr_sim", "thr_live",
           "thr_ratio", "retractions_sim", "retractions_live", "within_target"]


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-live validate", description=__doc__.split("\n\n")[0].split(":", 1)[1].strip())
    add_trace_flag(p)
    p.add_argument("--methods", default="sglang,prism", help="comma-separated methods (default sglang,prism)")
    p.add_argument("--qps", default="15,25", help="comma-separated arrival rates (default 15,25)")
    p.add_argument("--config", help="YAML file with run settings")
    add_set_flag(p)
    p.add_argument("--seed", type=int, help="trace seed")
    p.add_argument("--profile", help="GPU:MODEL or a profile YAML (the twin paces to it; default "
                                     "a800-80g-pcie:qwen3-4b-instruct-2507)")
    p.add_argument("--out", default="runs/validate", help="output folder (default runs/validate)")
    add_no_progress_flag(p)
    add_live_flags(p)
    p.add_argument("--timeline", action="store_true",
                   help="also write both sides' timelines (Chrome Trace Event JSON for ui.perfetto.dev): "
                        "METHOD/qpsQPS/sim/timeline.json and .../live/timeline.json")
    return p


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def compare(method: str, qps: float, sim: dict, live: dict) -> list:
    ts, tl = sim["ttft_s"], live["ttft_s"]
    dh = live["hit_rate"] - sim["hit_rate"]
    r50, r90, r99 = _ratio(tl["p50"], ts["p50"]), _ratio(tl["p90"], ts["p90"]), _ratio(tl["p99"], ts["p99"])
    ok = abs(dh) <= HIT_POINTS and abs(r50 - 1) <= TTFT_REL and abs(r99 - 1) <= TTFT_REL
    return [method, qps, sim["hit_rate"], live["hit_rate"], dh * 100, ts["p50"], tl["p50"], r50, ts["p90"],
            tl["p90"], r90, ts["p99"], tl["p99"], r99, sim["throughput_rps"], live["throughput_rps"],
            _ratio(live["throughput_rps"], sim["throughput_rps"]), _retractions(sim), _retractions(live), ok]


def _retractions(summary: dict) -> int:
    """Requests the engine retracted (``engine.admission: sglang``; SGLang's own, counted by the plugin)."""
    return int(summary.get("counters", {}).get("retractions", 0))


def plot(rows: list[list], ttfts: dict[tuple[str, float], tuple], path: Path) -> None:
    """One picture that answers "does the simulator match?": per method and QPS the per-request TTFT CDFs of
    both engines overlaid (``ttfts``: (method, qps) -> (sim TTFTs, live TTFTs)); below, parity plots of hit
    rate and P50/P99 TTFT (sim on x, live on y) with the diagonal and the fidelity target's band (hit within
    2 points, TTFT within 15%), on axes that start at zero so that a small difference looks small."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    methods = list(dict.fromkeys(r[0] for r in rows))
    rates = sorted({r[1] for r in rows})
    cols = max(len(rates), 3)
    fig, axes = plt.subplots(len(methods) + 1, cols, figsize=(3.6 * cols, 3.0 * (len(methods) + 1)), squeeze=False)
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for i, m in enumerate(methods):
        for j in range(cols):
            ax = axes[i][j]
            if j >= len(rates) or (m, rates[j]) not in ttfts:
                ax.axis("off")
                continue
            for values, style, side in zip(ttfts[(m, rates[j])], ("-", "--"), ("sim", "live")):
                v = np.sort(np.asarray(values, dtype=float))
                ax.step(v, np.arange(1, len(v) + 1) / max(len(v), 1), style, where="post", color=colors[m],
                        label=f"{side} ({len(v)})")
            ax.set_title(f"{m} at {rates[j]:g} QPS", fontsize=9)
            ax.set_xlabel("TTFT (s)", fontsize=8)
            ax.set_ylabel("fraction of requests", fontsize=8)
            ax.set_ylim(0, 1.02)
            ax.set_xlim(left=0)
            ax.legend(fontsize=7, loc="lower right")
    parity = [("hit rate", 2, 3, lambda x: (x - HIT_POINTS, x + HIT_POINTS)),
              ("TTFT p50 (s)", 5, 6, lambda x: (x * (1 - TTFT_REL), x * (1 + TTFT_REL))),
              ("TTFT p99 (s)", 11, 12, lambda x: (x * (1 - TTFT_REL), x * (1 + TTFT_REL)))]
    for ax, (name, i_sim, i_live, band) in zip(axes[-1], parity):
        top = max([r[i_sim] for r in rows] + [r[i_live] for r in rows] + [1e-9]) * 1.15
        if name == "hit rate":
            top = min(max(top, 0.1), 1.0)
        x = np.linspace(0, top, 50)
        lo, hi = band(x)
        ax.fill_between(x, lo, hi, color="0.85", label="target")
        ax.plot(x, x, color="0.4", lw=0.8)
        for r in rows:
            ax.plot(r[i_sim], r[i_live], "o", color=colors[r[0]], ms=5)
            ax.annotate(f"{r[1]:g}", (r[i_sim], r[i_live]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_aspect("equal")
        ax.set_title(f"{name}: live vs sim", fontsize=9)
        ax.set_xlabel("sim", fontsize=8)
        ax.set_ylabel("live", fontsize=8)
    for ax in axes[-1][len(parity):]:
        ax.axis("off")
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[m], label=m) for m in methods]
    axes[-1][0].legend(handles=handles + [plt.Rectangle((0, 0), 1, 1, color="0.85", label="target")], fontsize=7,
                       loc="upper left")
    fig.suptitle("prism-live validate: the simulator (solid, x) against the live twin (dashed, y); "
                 "labels: QPS", fontsize=10)
    save_figure(fig, path, dpi=110)


@entry_point("prism-live validate")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    apply_pace_profile(args)
    opts = options(args)
    methods = comma_list(args.methods, "--methods", "methods")
    rates = parse_rates(args.qps)
    where = args.config or "settings"
    base = merge_flags(read_config(args.config), args.overrides, profile=args.profile, seed=args.seed)
    check_knobs_used(base, methods, where)
    specs = []
    for m in methods:  # every run is checked before the first server starts
        for q in rates:
            data = merge_flags(copy.deepcopy(for_method(base, m)), [], method=m, qps=q)
            specs.append(settings_from(data, where).resolve(args.trace))
    from prism.live.run import check_method

    for spec in specs:
        if spec.cluster.instances > 1 and opts.url:  # (check_cluster's line names prism-live's --instances)
            raise UserError(f"--url attaches to one server; cluster.instances {spec.cluster.instances} starts its "
                            "own servers (drop --url, or the setting)", where)
        check_method(spec, opts)
    if args.timeline and opts.url:
        raise UserError("--timeline needs the servers prism starts: an attached --url server keeps no event log")
    for name in ("validate.csv", "validate.json", "validate.png"):
        check_out_file(check_out_dir(args.out, "--out") / name, "--out")
    check_server(opts)  # before the simulator's results are written
    out = prepare_out_dir(args.out, "--out")
    clear_earlier(out)
    from prism.live.run import ReplayError, live_run
    from prism.sim.run import simulate
    from prism.sim.timeline import SimTimeline
    from prism.timeline import TIMELINE_FILE

    rows, ttfts = [], {}

    def keep() -> str:
        """The finished runs' comparison, written; what a line that stops the validation says of it."""
        if not rows:
            return f"none of the {len(specs)} runs had finished"
        with InterruptsHeld():
            written = write_rows(out, rows, ttfts)
        return f"the {len(rows)} of {len(specs)} runs that finished are in {written}"

    for spec in specs:
        run = f"run {spec.label} at {spec.qps:g} QPS"
        where = out / spec.label / f"qps{spec.qps:g}"
        try:
            events = SimTimeline(_mk(where / "sim") / TIMELINE_FILE, spec) if args.timeline else None
            result = simulate(spec, events=events)
            sim = result.summary
            write_json(sim, _mk(where / "sim") / "summary.json")
            if events is not None:
                events.close(sim)
            live = live_run(spec, opts, where / "live", timeline=where / "live" / TIMELINE_FILE if args.timeline
                            else None)
        except ReplayError as e:
            print(f"prism-live validate: {run} broke off ({e}); {partial_results(where / 'live')}; {keep()}",
                  file=sys.stderr)
            return exit_status() if received() else 1
        except KeyboardInterrupt:
            print(f"prism-live validate: {run} was interrupted; {partial_results(where / 'live')}; {keep()}",
                  file=sys.stderr)
            return exit_status()
        except UserError as e:  # a server that died starting, say: its line, and the finished runs kept
            raise UserError(f"{run}: {e}; {keep()}") from None
        rows.append(compare(spec.label, spec.qps, sim, live))
        ttfts[(spec.label, spec.qps)] = ([r.ttft for r in result.records],
                                         [r.ttft for r in read_requests_csv(where / "live" / "requests.csv")])
        print(table([rows[-1]], COLUMNS), flush=True)
        if received():  # held while this run's servers stopped: it finished whole, and the validation stops here
            print(f"prism-live validate: interrupted after {run}; {keep()}", file=sys.stderr)
            return exit_status()
    with InterruptsHeld():
        write_rows(out, rows, ttfts)
    if received():  # held while the table was written: it is whole
        print(f"prism-live validate: interrupted after its last run; every run's results are in "
              f"{out / 'validate.csv'} (complete)", file=sys.stderr)
        return exit_status()
    print(table(rows, COLUMNS))
    print(f"target: hit within {HIT_POINTS * 100:.0f} points, P50 and P99 TTFT within {TTFT_REL:.0%}; "
          f"wrote {out / 'validate.csv'}, validate.json and validate.png"
          + ("; each run's sim/ and live/ folders hold its timeline.json" if args.timeline else ""))
    return 0


#: the files of a validation's folder, beside a folder per method and QPS
VALIDATE_FILES = ("validate.csv", "validate.json", "validate.png")


def write_rows(out: Path, rows: list[list], ttfts: dict) -> Path:
    """The comparison of the runs that finished: table, JSON and picture."""
    write_csv(out / "validate.csv", COLUMNS, rows)
    write_json([dict(zip(COLUMNS, r)) for r in rows], out / "validate.json")
    plot(rows, ttfts, out / "validate.png")
    return out / "validate.csv"


def clear_earlier(out: Path) -> None:
    """An earlier validation's files in ``out`` go before this one writes: its table, and each of its method
    and QPS folders (METHOD/qpsQ holding sim/ or live/), so that no run of another set is left beside this one's
    table. Nothing else in the folder is touched."""
    import shutil

    for name in VALIDATE_FILES:
        (out / name).unlink(missing_ok=True)
    for method in [d for d in out.iterdir() if d.is_dir() and not d.is_symlink()]:
        runs = [q for q in method.glob("qps*") if q.is_dir() and ((q / "sim").is_dir() or (q / "live").is_dir())]
        for q in runs:
            shutil.rmtree(q)
        if runs and not any(method.iterdir()):
            method.rmdir()


def _mk(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
