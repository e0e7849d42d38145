"""prism-live validate --timeline on a real SGLang server (CPU, the ``tiny`` geometry, paced): both sides'
timelines are valid Trace Event files with the same tracks, each request's spans tile its TTFT parts in that
side's requests.csv, KV stays within the pool, and the retractions drawn are the ones each engine counted.
The run is also the paced twin's retraction check: 16 requests of ~770 prompt + 192 output tokens at 12 QPS on a
3,072-token pool, with the new-token ratio decaying in 20 decode steps, so that admission soon reserves too
little decode and both engines retract; their counts must agree. One server start (20-45 s on two cores)."""

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
    _retraction_agrees(out, run)
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
            assert retracted >= 1  # SGLang retracted on this pool (_retraction_agrees)
    # the same tracks on both sides: an engine, its iterations, counters and request phases
    assert names["sim"][1] == names["live"][1] == ["engine"]
    assert {"prefill", "decode", "KV tokens", "requests", "queued", "first token"} <= names["sim"][0] & names["live"][0]
    assert (out / "validate.png").exists()


def _retraction_agrees(out: Path, run: Path) -> None:
    """SGLang itself retracted (the plugin counts in its retract_decode), the retracted requests came back, and
    the simulator retracted about as often."""
    (row,) = json.loads((out / "validate.json").read_text())
    live = json.loads((run / "live" / "summary.json").read_text())
    assert live["engine"]["admission"] == "sglang" and live["complete"]
    assert live["server_admission_env"]["SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"] == "20"
    c = live["counters"]
    assert c["retractions"] >= 1 and c["retracted_output_tokens"] >= c["retractions"], c
    assert c["reprefilled_tokens"] >= c["retracted_output_tokens"], c  # at least the dropped output again
    assert row["retractions_live"] == c["retractions"] and row["retractions_sim"] >= 1, row
    # Same rules on both sides, but the run is chaotic near ties (one batch boundary moves a retraction by a
    # decode step, which can add or save one): counts within one, plus a fifth for longer runs. Hit rate: each
    # retraction's re-prefill is not a hit in either engine, so the README's 2 points hold.
    assert abs(row["retractions_live"] - row["retractions_sim"]) <= 1 + row["retractions_sim"] // 5, row
    assert abs(row["hit_diff_pts"]) <= 2.0, row
