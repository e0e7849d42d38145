"""``prism-live serve`` on a real SGLang server (CPU, the ``tiny`` geometry, dummy weights, the demo tokenizer
with its ChatML template): OpenAI chat requests, nothing prism-specific in them, get their segments in the
server (the chat rule of ``prism.traces.chat``), and QAS and DART work on them. One server for the module, with
prism's default deployment: the QAS front end holding the backlog, bounded by SGLang's running slots.

* chat requests are served; the plugin's counters show the segments the rule gives (checked against the rule
  run here on the same messages), QAS rounds and hits by DART tier; ``/metrics`` (``--enable-metrics``) carries
  them as ``prism:*`` gauges;
* six requests at once on three slots: some pass straight on, the rest are held and released, all served;
* a request whose documents are marked movable (``custom_params.prism_segments``, ``prism_movable``) is
  realigned behind requests holding its second document, and SGLang computes on the realigned prompt: its cached
  prefix runs through that document, which the prompt as sent does not start with;
* the server stops with the command (SIGTERM: status 143), no process left;
* bad input (a model folder without a tokenizer, an unknown method, a port in use): one line, exit 2, nothing
  started.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt.managers.scheduler")

from prism.cli.live import main as live_main  # noqa: E402
from test_live_server import _processes_with  # noqa: E402

PORT = 30161
URL = f"http://127.0.0.1:{PORT}"
SLOTS = 3  # SGLang's running slots: the bound of prism's default front end, which holds the backlog
SYSTEM = "You are a careful assistant. Answer from the documents only, and say which document you used."
DOCS = [f"Document {i}: " + " ".join(f"the {i}-th archive notes item {j} of its ledger." for j in range(12))
        for i in range(6)]


def _post(path: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _counters() -> dict:
    with urllib.request.urlopen(URL + "/server_info", timeout=10) as r:
        return json.loads(r.read())["internal_states"][0]["prism"]


def _chat(docs: list[str], question: str, max_tokens: int = 4, custom: dict | None = None) -> dict:
    body = {"model": "m", "max_tokens": max_tokens, "temperature": 0, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [*({"type": "text", "text": d} for d in docs),
                                     {"type": "text", "text": question}]}]}
    if custom:
        body["custom_params"] = custom
    return _post("/v1/chat/completions", body)


@pytest.fixture(scope="module")
def served(tmp_path_factory, chat_tokenizer_dir):
    out = tmp_path_factory.mktemp("serve")
    proc = subprocess.Popen([sys.executable, "-m", "prism.cli.live", "serve", "--model", "tiny", "--device", "cpu",
                             "--method", "prism", "--set", "engine.max_total_tokens=16384",
                             "--port", str(PORT), "--out", str(out), "--", "--tokenizer-path", str(chat_tokenizer_dir),
                             "--enable-metrics", "--enable-cache-report", "--max-running-requests", str(SLOTS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = proc.stdout.readline()  # one line once the server is healthy and its plugin answers
    assert "prism-live serve: prism at" in ready, (ready, proc.stderr.read() if proc.poll() is not None else "")
    yield out, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def _layout(tokenizer_dir: Path, docs: list[str], question: str):
    from prism.traces.chat import ChatSegmenter
    from prism.traces.chat_template import ChatTokenizer

    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [*({"type": "text", "text": d} for d in docs),
                                             {"type": "text", "text": question}]}]
    return ChatSegmenter(ChatTokenizer(tokenizer_dir)).layout(messages)


def test_chat_requests_get_their_segments_and_run_qas_and_dart(served, chat_tokenizer_dir):
    before = _counters()
    asked = [(DOCS[0:2], "Which item comes first?"), (DOCS[0:3], "What does the ledger hold?"),
             (DOCS[1:3], "Name one item.")]
    for docs, question in asked:
        answer = _chat(docs, question)
        assert answer["usage"]["completion_tokens"] == 4 and answer["choices"][0]["finish_reason"] == "length"
    c = _counters()
    delta = {k: v - before.get(k, 0) for k, v in c.items() if isinstance(v, (int, float))}
    kinds = {"sys": 0, "reuse": 0, "priv": 0}
    for docs, question in asked:  # the rule, run here on the same messages: what the server must have read
        for kind, _, _ in _layout(chat_tokenizer_dir, docs, question).segments:
            kinds[kind] += 1
    assert kinds == {"sys": 3, "reuse": 7, "priv": 3}
    assert delta["chat_segmented"] == 3 and delta.get("chat_unmatched", 0) == 0
    assert {k: delta[f"segments_{k}"] for k in kinds} == kinds
    assert delta["qas_rounds"] > 0 and delta["scheduling_rounds"] > 0
    # DART's tiers: the second and third requests hit the system prompt and documents the first cached
    assert sum(v for k, v in delta.items() if k.startswith("hit_tokens_")) > 0, delta
    assert c["chat_overhead"] > 0 and c["plugin_cpu_ms_arrive"] > 0
    # the overhead budget's two sides: prism's hooks by part add up, and they ran inside SGLang's spans
    # (intake, batch selection, results), whose time is the larger
    parts = [v for k, v in c.items() if k.startswith("plugin_cpu_ms_")]
    assert sum(parts) == pytest.approx(c["plugin_cpu_ms"], abs=0.01 * len(parts))
    assert c["scheduler_cpu_ms"] > c["scheduler_busy_cpu_ms"] > c["plugin_cpu_ms"] > 0
    assert c["plugin_overhead"] == pytest.approx(c["plugin_cpu_ms"] / (c["scheduler_cpu_ms"] - c["plugin_cpu_ms"]),
                                                 abs=1e-5)  # rounded to 5 places
    time.sleep(0.6)
    _chat(DOCS[2:3], "One more.")  # its batches save the counters (twice a second): the gauges follow them
    with urllib.request.urlopen(URL + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    lines = [ln for ln in metrics.splitlines() if ln.startswith("prism:segments_sys")]
    assert lines and float(lines[0].rsplit(" ", 1)[1]) >= 3, metrics[-2000:]


def test_a_movable_request_is_realigned_and_computed_on_the_realigned_prompt(served, chat_tokenizer_dir):
    """A primer caches [system][user tag][b][...]; three holders [X][b] decode for seconds, so that b is active
    demand in QAS's rounds (a(b) = 3, the same segment id: b's text to the question's); the movable request
    [a][b] arrives then. Realigned to [b][a] inside the scheduler, its cached prefix runs through b, which the
    prompt as sent (a first) cannot share with anything cached."""
    out, _ = served
    a, b = DOCS[4], DOCS[5]
    _chat([b, DOCS[3]], "Prime.")
    holders = [threading.Thread(target=_chat, args=([DOCS[i], b], f"Hold {i}.", 160)) for i in range(3)]
    for t in holders:
        t.start()
    time.sleep(2.0)
    declared = [SYSTEM, a, b, "Which document is longer?"]
    kinds = ["sys", "reuse", "reuse", "priv"]
    answer = _chat([a, b], declared[-1], custom={"prism_segments": declared, "prism_segment_kinds": kinds,
                                                 "prism_movable": True})
    for t in holders:
        t.join()
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    moved = [e for e in events if e.get("realigned")]
    assert len(moved) == 1, events[-6:]
    from prism.traces.chat import ChatSegmenter, Declared
    from prism.traces.chat_template import ChatTokenizer

    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "text", "text": a}, {"type": "text", "text": b},
                                             {"type": "text", "text": declared[-1]}]}]
    layout = ChatSegmenter(ChatTokenizer(chat_tokenizer_dir)).layout(
        messages, declared=Declared(tuple(zip(kinds, declared)), True))
    (_, _, sys_end), (_, _, a_end), (_, _, b_end), _ = layout.segments  # [system + user tag][a][b][question]
    assert answer["usage"]["prompt_tokens"] == len(layout.tokens)
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    # realigned to [sys][b][a][q], SGLang matched it through b against the primer: the prompt it computes on
    assert cached >= sys_end + (b_end - a_end) - 1, (cached, layout.segments)


def test_the_default_front_end_holds_the_backlog_bounded_by_sglangs_slots(served):
    """prism's default deployment, the QAS front end that holds the backlog, bounded by SGLang's running slots
    (given after ``--``: the plugin's bound is the same number). Six chat requests at once: the first pass
    straight on while there is room, the rest are held and released as slots free; all are served."""
    out, _ = served
    assert json.loads((out / "plugin.json").read_text())["backlog_limit"] == SLOTS
    before = _counters()
    answers = []
    threads = [threading.Thread(target=lambda i=i: answers.append(_chat([DOCS[i]], "Go.", 48))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 6 and all(a["usage"]["completion_tokens"] == 48 for a in answers)
    c = _counters()
    delta = {k: c.get(k, 0) - before.get(k, 0) for k in ("frontend_passed", "frontend_held", "chat_segmented")}
    assert delta["frontend_passed"] >= 1 and delta["frontend_held"] >= 1, delta
    assert delta["frontend_passed"] + delta["frontend_held"] == 6 and delta["chat_segmented"] == 6, delta


def test_serve_stops_with_the_command_and_leaves_no_process(served):
    out, proc = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143
    assert "interrupted" in proc.stderr.read()
    time.sleep(1.0)
    assert not _processes_with(str(out / "plugin.json"))


def test_bad_input_on_serve_is_one_line_and_starts_nothing(tmp_path, capsys):
    from prism.live.model import resolve_model

    bare = tmp_path / "model"
    bare.mkdir()
    shutil.copy(resolve_model("tiny").path / "config.json", bare / "config.json")
    common = ["--device", "cpu", "--set", "engine.max_total_tokens=8192", "--out", str(tmp_path / "o")]
    cases = [  # (prism-live serve's own arguments, those after --, the message)
        (["--model", str(bare), "--method", "prism", "--port", "30165"], [], "no tokenizer.json"),
        (["--model", "tiny", "--method", "nosuch", "--port", "30165"], [], "unknown method 'nosuch'"),
    ]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cases.append((["--model", "tiny", "--method", "prism", "--port", str(port)], ["--skip-tokenizer-init"],
                      f"port {port} on 127.0.0.1 is in use"))
        for own, after, message in cases:
            assert live_main(["serve", *common, *own, *(["--", *after] if after else [])]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o" / "server.log").exists()
    assert not _processes_with(str(tmp_path / "o"))
