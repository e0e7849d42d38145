"""prism-sim --timeline: the Trace Event file against the format's rules (tests/trace_events.py), each request's
spans against its TTFT parts in requests.csv, the counters against the KV capacity and the run's own counters,
and the observer against the run it watches (it changes nothing)."""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.cli.sim import main as sim_main
from prism.settings import merge_flags, settings_from
from prism.sim.run import simulate
from prism.sim.timeline import SimTimeline
from prism.timeline import TimelineWriter, _draw_simple, _draw_track

from trace_events import check_ttft_parts, counters, load, request_tracks, tracks

SMALL = ["--trace", "zipf", "--set", "trace.num_requests=300", "--no-progress"]


def _run(tmp_path: Path, name: str, *args: str) -> tuple[dict, list[dict], dict]:
    out = tmp_path / name
    assert sim_main([*SMALL, *args, "--out", str(out), "--timeline"]) == 0
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    return load(out / "timeline.json"), rows, json.loads((out / "summary.json").read_text())


def _check_counters(obj: dict, summary: dict, capacities: list[int]) -> None:
    kv = counters(obj, "KV tokens")
    assert sorted(kv) == list(range(1, len(capacities) + 1))
    for pid, samples in kv.items():
        cap = capacities[pid - 1]
        for _, v in samples:
            assert min(v.values()) >= 0 and v["in use"] + v["cached"] <= cap, v
            assert v["in use"] + v["cached"] + v["free"] == cap, v
        assert max(v["in use"] for _, v in samples) > 0
    c = summary["counters"]
    last = {}
    for samples in counters(obj, "evicted tokens").values():
        for tier, n in samples[-1][1].items():
            last[tier] = last.get(tier, 0) + n
    evicted = {k.removeprefix("evicted_tokens_"): v for k, v in c.items() if k.startswith("evicted_tokens_")}
    assert {k: v for k, v in last.items() if v} == {k: v for k, v in evicted.items() if v}


def _engine_spans(obj: dict) -> list[dict]:
    return [e for name, events in tracks(obj).items() if name.endswith("/iterations") for e in events]


@pytest.mark.parametrize("method,sets", [
    ("prism", []),  # QAS's front end: the window shows as the requests' "front end" span
    ("sglang", ["engine.chunked_prefill_size=512", "engine.max_prefill_tokens=512"]),  # prompts in chunks
    ("sglang", ["engine.max_total_tokens=32768"]),  # SGLang's retraction
])
def test_spans_tile_ttft_and_counters_stay_within_capacity(tmp_path, method, sets):
    obj, rows, s = _run(tmp_path, method, "--method", method, "--qps", "60",
                        *[a for kv in sets for a in ("--set", kv)])
    meta = obj["otherData"]
    assert meta["trace_events"] == len(obj["traceEvents"])
    assert meta["requests"] == meta["request_tracks"] == 300 and not meta["requests_sampled"] and meta["complete"]
    assert check_ttft_parts(obj, rows) == 300
    _check_counters(obj, s, [s["kv_capacity_tokens"]])
    spans = _engine_spans(obj)
    c = s["counters"]
    assert sum(e["name"] == "prefill" for e in spans) == c["prefill_iterations"]
    assert sum(e["name"] == "decode" for e in spans) == c["decode_iterations"]
    tracks_by_id = request_tracks(obj)
    # each request's prefill chunks computed its prompt's uncached tokens (first prefill) and its retracted
    # output again (re-prefills): the engine's prefill tokens, counted from the requests' side
    new = sum(e["args"]["new"] for ev in tracks_by_id.values() for e in ev if e["name"].startswith("prefill"))
    assert new == sum(e["args"]["new"] for e in spans if e["name"] == "prefill")
    assert new == s["prompt_tokens"] - s["hit_tokens"] + c.get("reprefilled_tokens", 0)
    retracted = [e for ev in tracks_by_id.values() for e in ev if e["name"] == "retracted"]
    assert len(retracted) == c.get("retractions", 0)
    assert sum(e["args"].get("retracted", 0) for e in spans) == c.get("retractions", 0)
    if "engine.chunked_prefill_size=512" in sets:
        assert max(sum(e["name"] == "prefill" for e in ev) for ev in tracks_by_id.values()) > 1
    if "engine.max_total_tokens=32768" in sets:
        assert retracted, "the small pool should make SGLang retract"
        again = {rid for rid, ev in tracks_by_id.items() if any(e["name"] == "prefill again" for e in ev)}
        assert {rid for rid, ev in tracks_by_id.items() if any(e["name"] == "retracted" for e in ev)} == again
    for ev in tracks_by_id.values():  # a request ends decoding (or with its prefill) when it finishes
        spans_r = [e for e in ev if e["ph"] == "X"]
        assert spans_r[-1]["name"] in ("decode", "first token")
    if method == "prism":
        assert any(e["name"] == "front end" for ev in tracks_by_id.values() for e in ev)


def test_a_cluster_draws_one_process_per_instance(tmp_path):
    obj, rows, s = _run(tmp_path, "cluster", "--method", "sglang", "--instances", "3", "--router", "rr")
    assert check_ttft_parts(obj, rows) == 300
    _check_counters(obj, s, [p["kv_capacity_tokens"] for p in s["cluster"]["per_instance"]])
    procs = {e["pid"]: e["args"]["name"] for e in obj["traceEvents"] if e["name"] == "process_name"}
    assert sorted(procs) == [1, 2, 3] and all(procs[p].startswith(f"instance {p - 1} ") for p in procs)
    served = {int(r["id"]): int(r["instance"]) for r in rows}
    for e in obj["traceEvents"]:  # each request is drawn under the instance that served it
        if e["name"] == "thread_name" and e["args"]["name"].startswith("request "):
            assert e["pid"] - 1 == served[int(e["args"]["name"].split()[1])]


def test_a_fleet_draws_one_process_per_copy_of_a_model(tmp_path):
    """Several models time-sharing one GPU: each copy (a model's engine between its load and its eviction) is a
    process named after its model and GPU, each request drawn under the copy that served it; spans still tile
    TTFT, and the run serves as it does without a timeline."""
    trace = tmp_path / "mm.yaml"
    trace.write_text("kind: multi_model\nseed: 3\nduration_s: 120\nqps: 1.5\nmodels:\n"
                     "  - {name: a, profile: llama-3.2-1b}\n  - {name: b, profile: qwen2.5-1.5b}\n"
                     "  - {name: c, profile: llama-3.2-3b}\n")
    fleet = ["--trace", str(trace), "--gpus", "1", "--sharing", "timeshare", "--no-progress"]
    assert sim_main([*fleet, "--out", str(tmp_path / "plain")]) == 0
    assert sim_main([*fleet, "--out", str(tmp_path / "tl"), "--timeline"]) == 0
    out = tmp_path / "tl"
    assert (out / "requests.csv").read_bytes() == (tmp_path / "plain" / "requests.csv").read_bytes()
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    obj = load(out / "timeline.json")
    assert check_ttft_parts(obj, rows) == len(rows) > 0
    procs = {e["pid"]: e["args"]["name"] for e in obj["traceEvents"] if e["name"] == "process_name"}
    swaps = json.loads((out / "summary.json").read_text())["fleet"]["activations"]
    assert len(procs) == 1 + swaps > 3  # one process per copy: the model active at start, one per swap-in
    served = {int(r["id"]): f"{r['model']} on GPU {r['gpu']} " for r in rows}
    drawn = 0
    for e in obj["traceEvents"]:
        if e["name"] == "thread_name" and e["args"]["name"].startswith("request "):
            assert procs[e["pid"]].startswith(served[int(e["args"]["name"].split()[1])])
            drawn += 1
    assert drawn == len(rows)


def test_the_observer_changes_nothing_and_its_file_is_deterministic(tmp_path):
    base = tmp_path / "plain"
    assert sim_main([*SMALL, "--method", "sglang", "--set", "engine.max_total_tokens=32768", "--out", str(base)]) == 0
    _run(tmp_path, "a", "--method", "sglang", "--set", "engine.max_total_tokens=32768")
    _run(tmp_path, "b", "--method", "sglang", "--set", "engine.max_total_tokens=32768")
    assert (base / "requests.csv").read_bytes() == (tmp_path / "a" / "requests.csv").read_bytes()
    assert (tmp_path / "a" / "timeline.json").read_bytes() == (tmp_path / "b" / "timeline.json").read_bytes()
    assert not (base / "timeline.json").exists()


def test_a_large_run_samples_its_request_tracks_and_says_so(tmp_path):
    spec = settings_from(merge_flags({}, ["trace.num_requests=300"], method="sglang"), "test").resolve("zipf")
    tl = SimTimeline(tmp_path / "t.json", spec, max_request_tracks=64)
    res = simulate(spec, events=tl)
    tl.close(res.summary)
    obj = load(tmp_path / "t.json")
    meta = obj["otherData"]
    assert meta["requests_sampled"] and meta["request_stride"] == 5 and meta["request_tracks"] == 60
    drawn = request_tracks(obj)
    assert sorted(drawn) == [r.id for r in spec.trace.requests[::5]]
    rows = [{"id": r.id, "arrival": r.arrival, "prefill_start": r.prefill_start, "first_token": r.first_token,
             "w_admit": r.w_admit, "t_prefill": r.t_prefill, "t_1tok": r.t_1tok} for r in res.records]
    assert check_ttft_parts(obj, rows) == 60


def test_a_rerun_without_timeline_removes_the_old_one(tmp_path):
    _run(tmp_path, "r", "--method", "fcfs")
    assert (tmp_path / "r" / "timeline.json").exists()
    assert sim_main([*SMALL, "--method", "fcfs", "--out", str(tmp_path / "r")]) == 0
    assert not (tmp_path / "r" / "timeline.json").exists()


@pytest.mark.parametrize("where,why", [("/proc/prism-timeline.json", "cannot write in /proc"),
                                       ("{tmp}/a_file/timeline.json", "is a file"),
                                       ("{tmp}/", "is a folder, expected a file")])
def test_an_unusable_timeline_path_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, where, why):
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "run"
    assert sim_main([*SMALL, "--out", str(out), "--timeline", where.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--timeline" in err[0] and why in err[0], err
    assert not out.exists()


def test_a_timeline_path_of_ones_own(tmp_path, capsys):
    path = tmp_path / "elsewhere" / "my.json"
    assert sim_main([*SMALL, "--method", "fcfs", "--out", str(tmp_path / "r"), "--timeline", str(path)]) == 0
    assert "all 300 requests drawn" in capsys.readouterr().out
    assert load(path)["otherData"]["method"] == "fcfs"
    assert not (tmp_path / "r" / "timeline.json").exists()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=5, max_size=5), st.integers(0, 10**6), st.booleans())
def test_the_fast_drawing_of_a_plain_request_writes_what_the_step_by_step_one_does(gaps, t0, front):
    """The common case (one prefill chunk, no retraction) is written in one string: byte for byte the track
    that RequestTrack draws step by step, zero-length phases (equal times) left out alike."""
    times = [t0 * 1e-6]
    for g in gaps:
        times.append(times[-1] + g * 1e-3)
    before = "front end" if front else "client"
    texts = []
    for draw in (_draw_simple, None):
        with tempfile.TemporaryDirectory() as d:  # not left behind: 200 examples, two folders each
            w = TimelineWriter(Path(d) / "t.json")
            if draw is None:
                _draw_track(w, 1, 7, before, *times, 100, 28, 32, [])
            else:
                draw(w, 1, 7, before, *times, 100, 28)
            texts.append(w._buf)
            w.abort()
    assert ",\n".join(texts[0]) == ",\n".join(texts[1])
