"""prism-live validate --timeline on a real SGLang server (CPU, the ``tiny`` geometry, paced): both sides'
timelines are valid Trace Event files with the same tracks, each request's spans tile its TTFT parts in that
side's requests.csv, KV stays within the pool, and the retractions drawn are the ones each engine counted.
One server start (20-45 s on two cores)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt.managers.scheduler")

from prism.cli.live import main as live_main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from trace_events import check_ttft_parts, counters, load, process_names, request_tracks  # noqa: E402


def test_validate_writes_both_timelines_and_they_match_their_runs(tmp_path):
    out = tmp_path / "v"
    rc = live_main(["validate", "--trace", "zipf", "--methods", "prism", "--qps", "12",
                    "--set", "trace.num_requests=16", "--set", "trace.output_len=192",
                    "--set", "engine.max_total_tokens=3072", "--set", "engine.new_token_ratio_decay_steps=20",
                    "--set", "engine.chunked_prefill_size=256",
                    "--pace", "a800-80g:qwen3-4b-instruct-2507", "--dilation", "4", "--timeline",
                    "--out", str(out), "--no-progress", "--port", "30141"])
    assert rc == 0
    run = out / "prism" / "qps12"
    names = {}
    for side in ("sim", "live"):
        obj = load(run / side / "timeline.json")
        s = json.loads((run / side / "summary.json").read_text())
        assert obj["otherData"]["engine_kind"] == ("sim" if side == "sim" else "sglang")
        names[side] = ({e["name"] for e in obj["traceEvents"] if e["ph"] in ("X", "C")},
                       [n.split(" (")[0] for n in process_names(obj).values()])
        for _, v in counters(obj, "KV tokens")[1]:
            assert min(v.values()) >= 0 and v["in use"] + v["cached"] + v["free"] == s["kv_capacity_tokens"], v
        retracted = sum(e["name"] == "retracted" for ev in request_tracks(obj).values() for e in ev)
        assert retracted == s["counters"].get("retractions", 0)
        if side == "live":
            with (run / side / "requests.csv").open() as f:
                assert check_ttft_parts(obj, list(csv.DictReader(f))) == 16
            assert retracted >= 1  # SGLang retracted on this pool (tests/live/test_live_server.py)
    # the same tracks on both sides: an engine, its iterations, counters and request phases
    assert names["sim"][1] == names["live"][1] == ["engine"]
    assert {"prefill", "decode", "KV tokens", "requests", "queued", "first token"} <= names["sim"][0] & names["live"][0]
    assert (out / "validate.png").exists()
