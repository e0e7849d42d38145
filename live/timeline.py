"""A live run's timeline: its folder (``requests.csv``, ``summary.json`` and each server's ``events.jsonl``) as
the same Trace Event tracks as ``prism-sim --timeline`` (:mod:`prism.timeline`), so that a simulated and a live
timeline of one run open side by side.

    write_live_timeline(run_folder, run_folder / "timeline.json")

The plugin's event log (``live/hooks.py``, with ``PluginConfig.iterations``) holds, besides each request's
prefill start and end, one line per batch (``ev: batch``: kind, requests, new and cached or context tokens,
each prefill chunk, SGLang's KV accounting, the queue, evicted tokens by tier) and one per retraction (``ev:
retract``), on the scheduler's monotonic clock as the run dilates it. Converted here: ``(t - t0) / D``, with
``t0`` the replay's time zero on that clock (``summary.json``'s ``clock_zero_monotonic``) and ``D`` its dilation,
the time axis of ``requests.csv``. Batches before ``t0`` (the warm-up) are left out. Request tracks take their
times from ``requests.csv`` (the client's arrival, send, first token and finish; the plugin's prefill start and
end) and their chunks and retractions from the log; a real engine's time between two chunks of one prompt is
drawn as ``between chunks`` (part of T_prefill).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from prism.counters import TIERS
from prism.errors import UserError
from prism.metrics import read_requests_csv
from prism.timeline import (CHUNK, ENGINE_TID, EVICTED, KV, MAX_REQUEST_TRACKS, QUEUE, READMITTED, RETRACTED,
                            TimelineWriter, draw_request, stride_for)


def _event_logs(folder: Path, instances: int) -> list[Path]:
    return [folder / "events.jsonl"] if instances <= 1 else [folder / f"instance-{i}" / "events.jsonl"
                                                              for i in range(instances)]


class _Log:
    """One server's event log, read once: its batches and each request's chunks and retractions, in time order
    on the run's clock."""

    def __init__(self, path: Path, t0: float, dilation: float) -> None:
        self.batches: list[dict[str, Any]] = []
        self.steps: dict[int, list[tuple]] = defaultdict(list)
        self.first_chunk: dict[int, tuple[int, int]] = {}  # request id -> its first prefill chunk's (new, cached)
        if not path.exists():
            raise UserError("no event log of the plugin (was the run started with --timeline?)", str(path))
        with path.open() as f:
            for n, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # a line the server was writing when it stopped
                ev = json.loads(line)
                kind = ev.get("ev")
                if kind == "batch" and ev["start"] >= t0:
                    ev["start"], ev["end"] = (ev["start"] - t0) / dilation, (ev["end"] - t0) / dilation
                    self.batches.append(ev)
                    for rid, new, cached, last in ev.get("chunks", ()):
                        self.steps[rid].append((CHUNK, ev["start"], ev["end"], new, cached, bool(last)))
                        self.first_chunk.setdefault(rid, (new, cached))
                elif kind == "retract" and ev["t"] >= t0:
                    t = (ev["t"] - t0) / dilation
                    for rid, generated in zip(ev["ids"], ev["generated"]):
                        self.steps[rid].append((RETRACTED, t, generated))
        for steps in self.steps.values():
            _mark_readmissions(steps)


def _mark_readmissions(steps: list[tuple]) -> None:
    """After each retraction, the request's next chunk begins its admission again (``READMITTED`` there)."""
    i = 0
    while i < len(steps):
        if steps[i][0] == RETRACTED and i + 1 < len(steps) and steps[i + 1][0] == CHUNK:
            steps.insert(i + 1, (READMITTED, steps[i + 1][1]))
            i += 1
        i += 1


def _snapped(steps: list[tuple], r) -> list[tuple]:
    """The first prefill's chunks with its start and end as ``requests.csv`` has them (the same log values,
    rounded to the nanosecond there), so that its spans meet the record's times exactly."""
    out = list(steps)
    if out and out[0][0] == CHUNK and abs(out[0][1] - r.prefill_start) < 2e-9:
        out[0] = (CHUNK, r.prefill_start, *out[0][2:])
        for i, step in enumerate(out):
            if step[0] == CHUNK and step[5]:  # the chunk that completed the first prefill
                if abs(step[2] - r.prefill_end) < 2e-9:
                    out[i] = (CHUNK, step[1], r.prefill_end, *step[3:])
                break
    return out


def write_live_timeline(folder: str | Path, path: str | Path, max_request_tracks: int = MAX_REQUEST_TRACKS
                        ) -> dict[str, Any]:
    """Convert the live run in ``folder`` into a timeline at ``path`` (written atomically); its metadata."""
    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text())
    t0, dilation = summary.get("clock_zero_monotonic"), float(summary.get("dilation") or 1.0)
    if t0 is None:
        raise UserError("summary.json has no clock_zero_monotonic: not a live run prism started", str(folder))
    instances = int(summary.get("cluster", {}).get("instances", 1)) if summary.get("cluster") else 1
    logs = [_Log(p, t0, dilation) for p in _event_logs(folder, instances)]
    records = sorted(read_requests_csv(folder / "requests.csv"), key=lambda r: r.id)
    stride = stride_for(len(records), max_request_tracks)
    w = TimelineWriter(path)
    try:
        for i, log in enumerate(logs):
            pid = i + 1
            name = f"instance {i}" if instances > 1 else "engine"
            w.process(pid, f"{name} ({summary.get('method', '?')}, live)", pid)
            w.thread(pid, ENGINE_TID, "iterations", 0)
            _draw_batches(w, pid, log.batches)
        for r in records[::stride]:
            log = logs[r.instance or 0]
            new, cached = log.first_chunk.get(r.id, (r.prompt_tokens - r.hit_tokens, r.hit_tokens))
            draw_request(w, (r.instance or 0) + 1, r.id, "client", r.arrival, r.sent, r.prefill_start, r.prefill_end,
                         r.first_token, r.finish, new, cached, r.output_tokens, _snapped(log.steps.get(r.id, []), r))
    except BaseException:
        w.abort()
        raise
    drawn = len(records[::stride])
    meta = {"generator": "prism-live --timeline", "engine_kind": "sglang", "method": summary.get("method"),
            "qps": summary.get("qps"), "seed": summary.get("seed"), "instances": instances,
            "complete": bool(summary.get("complete", True)), "dilation": dilation, "clock_zero_monotonic": t0,
            "time_unit": "ts and dur in microseconds of the run's clock (requests.csv's seconds x 1e6, undilated)",
            "requests": len(records), "request_tracks": drawn, "request_stride": stride,
            "requests_sampled": stride > 1}
    w.close(meta)
    return w.meta


def _draw_batches(w: TimelineWriter, pid: int, batches: list[dict[str, Any]]) -> None:
    """Each batch's span on the engine track and the counters at its start (SGLang's KV accounting: in use is
    the pool less its free and evictable tokens, as its own ``_get_token_info`` reports usage)."""
    evicted: dict[str, int] | None = None
    for b in batches:
        args = {"requests": b["requests"]}
        if b["kind"] == "prefill":
            args.update(new=b.get("new", 0), cached=b.get("cached", 0))
        elif "context" in b:
            args["context"] = b["context"]
        w.span(pid, ENGINE_TID, b["kind"], b["start"], b["end"], args)
        samples = []
        if "total" in b:
            free, cached = b["free"], b["cached_kv"]
            samples.append((KV, json.dumps({"in use": b["total"] - free - cached, "cached": cached, "free": free})))
            samples.append((QUEUE, json.dumps({"waiting": b["waiting"], "running": b["running"]})))
        now = {t: b.get("evicted", {}).get(t, 0) for t in TIERS}
        if now != evicted:
            samples.append((EVICTED, json.dumps(now)))
            evicted = now
        if samples:
            w.counters(pid, b["start"], samples)


__all__ = ["write_live_timeline"]
