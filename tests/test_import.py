"""prism-trace import/export: round trips through the log formats, each importer on hand-made logs, and the
statistics of an imported trace against brute force."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import PRIV, REUSE, SYS, brute_force_hits
from prism.cli.sim import main as sim_main
from prism.cli.trace import main as trace_main
from prism.errors import UserError
from prism.traces import trace as fmt
from prism.traces.importing import OutputLengths
from prism.traces.stats import infinite_cache_hits, segment_stats
from prism.traces.trace import Trace


def run(*argv) -> None:
    assert trace_main([str(a) for a in argv]) == 0


def structure(trace: Trace):
    """The sharing pattern with ids renamed by first appearance: kinds, lengths, order, sessions, fixed order."""
    names: dict[str, int] = {}
    return [(r.output_len, r.session, r.fixed_order,
             tuple((s.kind, names.setdefault(s.id, len(names)), s.length) for s in r.segments)) for r in trace.requests]


def from_zero(trace: Trace) -> Trace:
    t0 = trace.requests[0].arrival
    return trace.with_arrivals(np.array([r.arrival - t0 for r in trace.requests]))


@pytest.fixture(scope="module")
def zipf(tmp_path_factory):
    path = tmp_path_factory.mktemp("zipf") / "z.jsonl"
    run("gen", "zipf", "-o", path, "--set", "num_requests=200")
    return path


def simulate(trace_path, method, out) -> bytes:
    code = sim_main(["--trace", str(trace_path), "--method", method, "--no-progress", "--out", str(out),
                     "--set", "engine.max_total_tokens=32768"])
    assert code == 0
    return (out / "requests.csv").read_bytes()


def test_openai_round_trip_keeps_the_structure_and_every_simulated_request(zipf, chat_tokenizer_dir, tmp_path):
    """zipf -> OpenAI messages (with the prism field: kinds, movable) -> import: the same sharing pattern and
    lengths, so prism-sim gives the same requests.csv byte for byte, QAS realignment included. Exact, because the
    exporter takes the template's own tokens (role tags) off the text of the segments they fall into."""
    log, back = tmp_path / "log.jsonl", tmp_path / "back.jsonl"
    run("export", zipf, "--format", "openai", "--tokenizer", chat_tokenizer_dir, "-o", log)
    run("import", log, "--format", "openai", "--tokenizer", chat_tokenizer_dir, "-o", back, "--no-progress")
    original, again = from_zero(fmt.load(zipf)), fmt.load(back)
    assert structure(again) == structure(original)
    assert [r.arrival for r in again.requests] == [round(r.arrival, 9) for r in original.requests]  # as saved
    assert again.infinite_cache_hit_rate() == pytest.approx(original.infinite_cache_hit_rate(), abs=0)
    fmt.save(original, tmp_path / "orig.jsonl")
    for method in ("prism", "sglang"):
        assert simulate(back, method, tmp_path / f"b-{method}") == simulate(tmp_path / "orig.jsonl", method,
                                                                             tmp_path / f"o-{method}")
    line = json.loads(log.read_text().splitlines()[0])
    assert line["prism"]["movable"] is True and [s["kind"] for s in line["prism"]["segments"]][0] == SYS


def test_autobench_round_trip_keeps_every_prompt_token_for_token(zipf, tmp_path):
    log, back = tmp_path / "ab.jsonl", tmp_path / "back.jsonl"
    run("export", zipf, "--format", "autobench", "-o", log)
    run("import", log, "--format", "autobench", "-o", back, "--block-tokens", "64", "--no-progress")
    original, again = fmt.load(zipf), fmt.load(back)
    assert len(again) == len(original)
    for a, b in zip(original.requests, again.requests):
        assert b.tokens().tolist() == a.tokens().tolist()
        assert b.output_len == a.output_len and b.fixed_order
        assert all(s.kind == REUSE and s.length <= 64 for s in b.segments)
    t0 = original.requests[0].arrival
    assert [r.arrival for r in again.requests] == pytest.approx([r.arrival - t0 for r in original.requests], abs=1e-9)
    assert again.infinite_cache_hit_rate() == pytest.approx(original.infinite_cache_hit_rate(), abs=1e-12)


def chat_line(docs, question, t=None, out=None, **extra):
    body = {"model": "m", "messages": [{"role": "system", "content": "Answer briefly."},
                                       {"role": "user", "content": [{"type": "text", "text": d}
                                                                    for d in [*docs, question]]}], **extra}
    if t is not None:
        body["timestamp"] = t
    if out is not None:
        body["usage"] = {"prompt_tokens": 1, "completion_tokens": out}
    return json.dumps(body)


def test_openai_log_timestamps_outputs_and_sessions(chat_tokenizer_dir, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join([chat_line(["A.\n", "B.\n"], "q1", 1700000000.5, 12),
                              chat_line(["A.\n", "C.\n"], "q2", 1700000001.0, 0, prism={"session": "s1"}),
                              chat_line(["A.\n"], "q3", 1700000003.25, None, output_tokens=7)]) + "\n")
    run("import", log, "--format", "openai", "--tokenizer", chat_tokenizer_dir, "-o", tmp_path / "t.jsonl")
    t = fmt.load(tmp_path / "t.jsonl")
    assert [r.arrival for r in t.requests] == [0.0, 0.5, 2.75]
    assert [r.output_len for r in t.requests] == [12, 1, 7]  # a logged 0 decodes one token
    assert [r.session for r in t.requests] == [None, "s1", None]
    assert t.requests[0].segments[1].id == t.requests[1].segments[1].id == t.requests[2].segments[1].id
    assert t.kind == "imported" and t.spec["format"] == "openai"


def test_poisson_arrivals_and_drawn_lengths_are_seeded(chat_tokenizer_dir, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(chat_line(["Doc.\n"], f"question {i}") + "\n" for i in range(400)))
    outs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        run("import", log, "--format", "openai", "--tokenizer", chat_tokenizer_dir, "--qps", "20", "--seed", seed,
            "--output-len", "uniform:10,20", "-o", tmp_path / f"{name}.jsonl", "--no-progress")
        outs[name] = (tmp_path / f"{name}.jsonl").read_bytes()
    assert outs["a"] == outs["b"] != outs["c"]
    t = fmt.load(tmp_path / "a.jsonl")
    gaps = np.diff([0.0] + [r.arrival for r in t.requests])
    assert abs(gaps.mean() - 1 / 20) < 4 * (1 / 20) / np.sqrt(len(gaps))  # exponential gaps: sd = mean
    lens = [r.output_len for r in t.requests]
    assert min(lens) == 10 and max(lens) == 20


@pytest.mark.parametrize("text,values", [("7", {7}), ("uniform:3,5", {3, 4, 5})])
def test_output_length_distributions(text, values):
    spec = OutputLengths.parse(text)
    rng = np.random.default_rng(0)
    assert {spec.value(None, rng, "x") for _ in range(300)} == values
    assert spec.value(99, rng, "x") in values  # a distribution replaces the log's value
    assert OutputLengths.parse(f"log:{text}").value(99, rng, "x") == 99


def test_output_length_draws_follow_their_distribution():
    rng = np.random.default_rng(1)
    exp = [OutputLengths.parse("exponential:200").value(None, rng, "x") for _ in range(4000)]
    logn = [OutputLengths.parse("lognormal:100,0.5").value(None, rng, "x") for _ in range(4000)]
    assert abs(np.mean(exp) - 200) < 4 * 200 / np.sqrt(4000)
    assert abs(np.median(logn) - 100) < 4
    with pytest.raises(UserError, match="no output length in the log"):
        OutputLengths.parse("log").value(None, rng, "f.jsonl:3")


SHAREGPT = [
    {"id": "c1", "conversations": [{"from": "human", "value": "What is a radix tree?"},
                                   {"from": "gpt", "value": "A compressed trie of prefixes."},
                                   {"from": "human", "value": "And KV caching?"},
                                   {"from": "gpt", "value": "Keeping attention keys and values."}]},
    {"id": "c2", "conversations": [{"from": "system", "value": "Be terse."},
                                   {"from": "human", "value": "Hello"},
                                   {"from": "gpt", "value": "Hi."},
                                   {"from": "human", "value": "Bye"}]},
]


def test_sharegpt_one_request_per_turn_with_growing_history(chat_tokenizer_dir, tmp_path):
    from prism.traces.chat_template import ChatTokenizer

    log = tmp_path / "sg.json"
    log.write_text(json.dumps(SHAREGPT, indent=1))
    run("import", log, "--format", "sharegpt", "--tokenizer", chat_tokenizer_dir, "--qps", "5", "-o",
        tmp_path / "t.jsonl", "--no-progress")
    t = fmt.load(tmp_path / "t.jsonl")
    tok = ChatTokenizer(chat_tokenizer_dir)
    by = {}
    for r in t.requests:
        by.setdefault(r.session, []).append(r)
    assert sorted(by) == ["c1", "c2"] and len(by["c1"]) == 2 and len(by["c2"]) == 1  # c2's last turn has no reply
    first, second = by["c1"]
    assert second.tokens()[:first.prompt_len].tolist() == first.tokens().tolist()
    assert first.output_len == len(tok.encode("A compressed trie of prefixes."))
    assert [s.kind for s in second.segments] == [PRIV, PRIV, PRIV]
    assert t.meta["turns_without_reply"] == 1
    run("import", log, "--format", "sharegpt", "--tokenizer", chat_tokenizer_dir, "--qps", "5", "--output-len",
        "log:64", "-o", tmp_path / "u.jsonl", "--no-progress")
    u = fmt.load(tmp_path / "u.jsonl")
    assert len(u) == 4 and sorted(r.output_len for r in u.requests)[-1] == 64
    assert u.requests[[r.session for r in u.requests].index("c2")].segments[0].kind == SYS


def test_csv_gives_lengths_and_arrivals_without_sharing(tmp_path):
    log = tmp_path / "a.csv"
    log.write_text("timestamp,prompt_tokens,output_tokens,extra\n10.5,100,20,x\n11.0,50,0,y\n11.0,3000,7,z\n")
    run("import", log, "--format", "csv", "-o", tmp_path / "new" / "t.jsonl")  # its folder made on success
    t = fmt.load(tmp_path / "new" / "t.jsonl")
    assert [r.arrival for r in t.requests] == [0.0, 0.5, 0.5]
    assert [r.prompt_len for r in t.requests] == [100, 50, 3000]
    assert [r.output_len for r in t.requests] == [20, 1, 7]
    assert t.infinite_cache_hit_rate() == 0.0


def test_an_import_is_the_same_bytes_every_time(chat_tokenizer_dir, tmp_path):
    log = tmp_path / "sg.json"
    log.write_text(json.dumps(SHAREGPT * 3))
    for name in ("a", "b"):
        run("import", log, "--format", "sharegpt", "--tokenizer", chat_tokenizer_dir, "--qps", "5", "--seed", "9",
            "--sessions", "2", "-o", tmp_path / f"{name}.jsonl", "--no-progress")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_the_hit_ceiling_of_a_chat_trace_is_exact(chat_tokenizer_dir, tmp_path):
    """Chat turns share the first tokens of every message (<|im_start|>) and continue the generation prompt of
    the turn before: the ceiling counts those tokens, as an infinite radix cache would."""
    log = tmp_path / "sg.json"
    log.write_text(json.dumps(SHAREGPT * 4))
    run("import", log, "--format", "sharegpt", "--tokenizer", chat_tokenizer_dir, "--qps", "5", "--output-len",
        "log:9", "-o", tmp_path / "t.jsonl", "--no-progress")
    t = fmt.load(tmp_path / "t.jsonl")
    assert infinite_cache_hits(t.requests) == brute_force_hits(t.requests)


def test_segment_statistics_count_kinds_labels_and_sharing(chat_tokenizer_dir, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(chat_line(docs, q, i, 5) + "\n" for i, (docs, q) in enumerate(
        [(["A.\n", "B.\n"], "q1"), (["A.\n", "B.\n"], "q2"), (["A.\n", "C.\n"], "q3"), (["D.\n"], "q4")])))
    run("import", log, "--format", "openai", "--tokenizer", chat_tokenizer_dir, "-o", tmp_path / "t.jsonl")
    t = fmt.load(tmp_path / "t.jsonl")
    st_ = segment_stats(t.requests)
    kinds = {}
    for r in t.requests:
        for s in r.segments:
            kinds.setdefault(s.kind, set()).add(s.id)
    assert {k: v["segments"] for k, v in st_["segments_by_kind"].items()} == {k: len(v) for k, v in kinds.items()}
    assert st_["segments_by_kind"][SYS]["segments"] == 1
    assert st_["segments_by_label"] == {"doc": 4, "sys": 1, "user": 4}  # A (first), B, C, D (first, other context)
    counts = {sid: sum(any(s.id == sid for s in r.segments) for r in t.requests) for sid in kinds[REUSE]}
    assert st_["most_shared"][0][:2] == [max(counts, key=counts.get), 3]
    assert st_["reusable_shared"] == {"segments": 2, "of": 4, "requests_with_one": 3}


def test_a_log_read_in_parts_by_two_processes_gives_the_same_trace(chat_tokenizer_dir, tmp_path, monkeypatch, capsys):
    """The parts meet at a line boundary; segment ids, first appearances, timestamps and drawn lengths come out as
    one reader's. A bad line in the second part is reported as one reader reports it."""
    import prism.traces.openai_log as openai_log

    monkeypatch.setattr(openai_log, "PARALLEL_BYTES", 0)
    log = tmp_path / "log.jsonl"
    lines = [chat_line(["Shared doc.\n", f"Doc {i % 7}.\n"], f"q{i}", 100 + i, None if i % 3 else 4)
             for i in range(300)]
    log.write_text("\n".join(lines) + "\n")
    for workers in (1, 2):
        run("import", log, "--format", "openai", "--tokenizer", chat_tokenizer_dir, "--workers", workers,
            "--output-len", "log:uniform:5,50", "-o", tmp_path / f"w{workers}.jsonl", "--no-progress")
    assert (tmp_path / "w1.jsonl").read_bytes() == (tmp_path / "w2.jsonl").read_bytes()
    lines[250] = lines[250].replace('"timestamp": 350', '"timestamp": 10')
    log.write_text("\n".join(lines) + "\n")
    code = trace_main(["import", str(log), "--format", "openai", "--tokenizer", str(chat_tokenizer_dir),
                       "--workers", "2", "--output-len", "9", "-o", str(tmp_path / "bad.jsonl"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"{log}:251: field 'timestamp': earlier than the line before" in err
    assert not (tmp_path / "bad.jsonl").exists()
    from prism.config import jsonl_parts

    lines[250] = chat_line(["Shared doc.\n"], "q250", 350, 4)
    log.write_text("\n".join(lines) + "\n")
    first = jsonl_parts(log, 2)[1][2]  # the second part's first line: only the merge sees it go back
    lines[first - 1] = chat_line(["Shared doc.\n"], "q", 1, 4)
    log.write_text("\n".join(lines) + "\n")
    code = trace_main(["import", str(log), "--format", "openai", "--tokenizer", str(chat_tokenizer_dir),
                       "--workers", "2", "--output-len", "9", "-o", str(tmp_path / "bad.jsonl"), "--no-progress"])
    assert code == 2 and f"{log}:{first}: field 'timestamp': earlier" in capsys.readouterr().err
