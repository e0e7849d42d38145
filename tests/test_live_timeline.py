"""The live timeline without a server: a recorded live run (tests/data/live_timeline: the requests.csv,
summary.json and plugin event log of a paced CPU twin run on SGLang 0.5.23, 16 requests, prompts in 256-token
chunks, a 3,072-token pool where SGLang retracted) converted by live/timeline.py, checked as the simulator's
timeline is (tests/trace_events.py), against the run's own files."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from prism.errors import UserError
from prism.live.instance import EventLog
from prism.live.timeline import write_live_timeline

from trace_events import check_ttft_parts, counters, load, request_tracks, tracks

RUN = Path(__file__).parent / "data" / "live_timeline"


@pytest.fixture
def run(tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(RUN, out)
    return out


def _batches(folder: Path) -> list[dict]:
    s = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("ev") == "batch" and r["start"] >= s["clock_zero_monotonic"]]


def test_a_recorded_live_run_converts_to_tracks_that_tile_its_ttft(run):
    meta = write_live_timeline(run, run / "timeline.json")
    obj = load(run / "timeline.json")
    s = json.loads((run / "summary.json").read_text())
    with (run / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert meta["engine_kind"] == "sglang" and meta["request_tracks"] == len(rows) == 16
    assert check_ttft_parts(obj, rows) == 16
    # the engine track: one span per batch the plugin logged after the replay's start, times undilated
    spans = [e for name, ev in tracks(obj).items() if name.endswith("/iterations") for e in ev]
    batches = _batches(run)
    assert len(spans) == len(batches)
    d, t0 = s["dilation"], s["clock_zero_monotonic"]
    for e, b in zip(sorted(spans, key=lambda e: e["ts"]), batches):
        assert e["name"] == b["kind"] and abs(e["ts"] - (b["start"] - t0) / d * 1e6) < 1e-3
    # KV counters: SGLang's own accounting, within the pool
    for _, v in counters(obj, "KV tokens")[1]:
        assert min(v.values()) >= 0 and v["in use"] + v["cached"] + v["free"] == s["kv_capacity_tokens"], v
    by_id = request_tracks(obj)
    for ev in by_id.values():  # a span moved past its predecessor's end only after a retraction (the edge case)
        moved = [i for i, e in enumerate(ev) if "from_s" in e.get("args", {})]
        assert all(any(e["name"] == "retracted" for e in ev[:i]) for i in moved), ev
    retracted = [e for ev in by_id.values() for e in ev if e["name"] == "retracted"]
    assert len(retracted) == s["counters"]["retractions"] >= 1
    for ev in by_id.values():  # every retraction is followed by a new admission and a prefill again
        names = [e["name"] for e in ev]
        for i, n in enumerate(names):
            if n == "retracted":
                assert "queued again" in names[i:] and "prefill again" in names[i:], names
    # prompts of ~770 tokens in 256-token chunks: several chunks each, their tokens the prompt's uncached part
    first = {rid: [e for e in ev if e["name"] == "prefill"] for rid, ev in by_id.items()}
    assert max(len(c) for c in first.values()) >= 3
    assert all(e["args"]["new"] <= 256 for c in first.values() for e in c)
    for row in rows:
        c = first[int(row["id"])]
        assert sum(e["args"]["new"] for e in c) == int(row["prompt_tokens"]) - c[0]["args"]["cached"]


def test_the_request_log_reader_skips_the_timeline_lines(run):
    log = EventLog(run / "events.jsonl")
    with (run / "requests.csv").open() as f:
        ids = [int(r["id"]) for r in csv.DictReader(f)]
    for rid in ids:
        ev = log.get(rid)
        assert ev is not None and ev["id"] == rid and "prefill_start" in ev


def test_a_log_cut_mid_line_converts_what_it_holds(run):
    text = (run / "events.jsonl").read_text()
    (run / "events.jsonl").write_text(text[: len(text) - 40])  # the server died while writing its last line
    write_live_timeline(run, run / "timeline.json")
    assert check_ttft_parts(load(run / "timeline.json"), list(csv.DictReader((run / "requests.csv").open()))) == 16


def test_a_run_without_event_log_or_clock_is_a_clear_error(run):
    (run / "events.jsonl").unlink()
    with pytest.raises(UserError, match="no event log"):
        write_live_timeline(run, run / "timeline.json")
    s = json.loads((run / "summary.json").read_text())
    del s["clock_zero_monotonic"]
    (run / "summary.json").write_text(json.dumps(s))
    with pytest.raises(UserError, match="clock_zero_monotonic"):
        write_live_timeline(run, run / "timeline.json")
    assert not (run / "timeline.json").exists()


def test_the_plugin_logs_a_chunked_prefill_once_and_forgets_one_aborted_midway(tmp_path):
    """The plugin notes a request's prefill start at its first chunk and logs start and end at its last; a
    request aborted between chunks (SGLang releases it finished) leaves nothing behind: a server would otherwise
    keep an entry for every such request."""
    from types import SimpleNamespace

    from prism.live import hooks

    state = hooks.LiveState(hooks.PluginConfig("fcfs", "lru", events=str(tmp_path / "events.jsonl")))
    done = {"flag": False}

    def request(rid):
        seq = SimpleNamespace(id=rid, lane="hot", realigned=False, admitted=False)
        return SimpleNamespace(_prism=seq, output_ids=[], origin_input_ids=[0] * 512,
                               finished=lambda: done["flag"] and rid == 2)

    def chunk(reqs, done_tokens, start):
        batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: True), reqs=reqs,
                                prefix_lens=[done_tokens] * len(reqs), extend_lens=[256] * len(reqs))
        state.log_batch(batch, start, start + 0.1)

    whole, aborted = request(1), request(2)
    chunk([whole, aborted], 0, 1.0)
    done["flag"] = True  # the client gave up on request 2 between its chunks
    state.release(aborted)
    chunk([whole], 256, 2.0)
    state.release(whole)  # not finished: a retraction, say (its prefill was logged already)
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert lines == [{"id": 1, "prefill_start": 1.0, "prefill_end": 2.1, "lane": "hot", "realigned": False}]
    assert state._starts == {}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (a device whose writes find no space)")
def test_a_full_disk_stops_the_plugins_logs_not_the_server(tmp_path, capsys, monkeypatch):
    """The plugin writes its event log and counters from inside SGLang's scheduler: a write that finds no space
    (the event log on ``/dev/full``; the counters' atomic write made to fail so) once raised there and killed
    the server. Each file stops with one line on the server's stderr, and the scheduler's calls go on."""
    import errno
    from types import SimpleNamespace

    from prism.live import hooks

    def no_space(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hooks, "write_atomic_text", no_space)
    state = hooks.LiveState(hooks.PluginConfig("fcfs", "lru", events="/dev/full",
                                               counters=str(tmp_path / "counters.json"), iterations=True))
    seq = SimpleNamespace(id=1, lane="hot", realigned=False, admitted=False)
    req = SimpleNamespace(_prism=seq, output_ids=[], origin_input_ids=[0] * 8, full_untruncated_fill_ids=[0] * 8)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: True), reqs=[req], prefix_lens=[0],
                            extend_lens=[8])
    for start in (1.0, 2.0, 3.0):
        state.log_batch(batch, start, start + 0.6)
    state.log_retractions([req])
    err = capsys.readouterr().err
    assert "cannot write /dev/full (No space left on device): the events file stops here" in err
    assert f"cannot write {tmp_path / 'counters.json'} (No space left on device): the counters file stops" in err
    assert state._events is None and state.counters_path is None
    assert err.count("stops here") == 2  # once each, not at every batch
