"""Bad input to prism-trace import, export and make-tokenizer: exit status 2, one line on stderr naming the file
and line (or the flag), no traceback, and nothing written (the style of tests/test_bad_inputs.py)."""

from __future__ import annotations

import json

import pytest

from prism.cli.trace import main as trace_main

GARBAGE = b"\x89PNG\r\n\x1a\n\x00\xff\xfe\xfa garbage \x80\x81"
OUT = "{d}/out.jsonl"


def jl(*objs) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs)


def body(t=None, out=5, messages=None, **extra):
    b = {"messages": messages or [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
         "output_tokens": out, **extra}
    if t is not None:
        b["timestamp"] = t
    return b


def conv(*turns):
    return {"id": "c", "conversations": [{"from": w, "value": v} for w, v in turns]}


def oai(*lines, flags=()):
    return {"log.jsonl": jl(*lines)}, ["import", "{d}/log.jsonl", "--format", "openai", "--tokenizer", "{tok}",
                                       *flags, "-o", OUT]


def ab(*lines, flags=()):
    return {"ab.jsonl": jl(*lines)}, ["import", "{d}/ab.jsonl", "--format", "autobench", *flags, "-o", OUT]


def sg(content, flags=("--qps", "5")):
    return {"sg.json": content}, ["import", "{d}/sg.json", "--format", "sharegpt", "--tokenizer", "{tok}", *flags,
                                  "-o", OUT]


def csv_(content, flags=()):
    return {"a.csv": content}, ["import", "{d}/a.csv", "--format", "csv", *flags, "-o", OUT]


RAISING = "{{ raise_exception('this template serves no one') }}"
USER = {"role": "user", "content": "Hi?"}

# (id, (files, argv), fragment of the one line); {d}: the case's folder, {tok}: the test tokenizer folder;
# a file content "@tokenizer.json" is a copy of the test tokenizer's
CASES = [
    # --- OpenAI request logs ---
    ("openai-line-not-json", oai(body(1), "{oops"), "log.jsonl:2: invalid JSON"),
    ("openai-garbage-bytes", ({"log.jsonl": GARBAGE}, oai()[1]), "log.jsonl:1: not UTF-8"),
    ("openai-garbage-after-a-line", ({"log.jsonl": jl(body(1)).encode() + GARBAGE}, oai()[1]), "log.jsonl:2"),
    ("openai-bare-number", oai(body(1), "42"), "log.jsonl:2: expected a JSON object"),
    ("openai-message-without-content", oai(body(1, messages=[{"role": "system", "content": "x"}, {"role": "user"}])),
     "log.jsonl:1: field 'messages': message 2 (user) has no content"),
    ("openai-content-null", oai(body(1), body(2, messages=[{"role": "user", "content": None}])),
     "log.jsonl:2: field 'messages': message 1 (user) has no content"),
    ("openai-content-number", oai(body(1, messages=[{"role": "user", "content": 5}])), "must be a string or a list"),
    ("openai-image-part",
     oai(body(1, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])),
     "log.jsonl:1: field 'messages': message 1 (user), part 1: only text parts"),
    ("openai-unknown-role", oai(body(1, messages=[{"role": "wizard", "content": "x"}])), "has role 'wizard'"),
    ("openai-no-messages", oai({"model": "m", "output_tokens": 3, "timestamp": 0}), "log.jsonl:1: field 'messages'"),
    ("openai-message-not-object", oai(body(1, messages=["hi"])), "message 1 is not a JSON object"),
    ("openai-timestamp-backwards", oai(body(5.0), body(4.0)),
     "log.jsonl:2: field 'timestamp': earlier than the line before"),
    ("openai-timestamp-negative", oai(body(-1)), "log.jsonl:1: field 'timestamp': must be a finite number >= 0"),
    ("openai-timestamp-string", oai(body("noon")), "log.jsonl:1: field 'timestamp'"),
    ("openai-timestamp-nan", oai(json.dumps(body(1)).replace('"timestamp": 1', '"timestamp": NaN')),
     "log.jsonl:1: invalid JSON"),
    ("openai-timestamps-for-some", oai(body(1), body(None)), "log.jsonl:2: no 'timestamp', where the lines before"),
    ("openai-no-timestamps-no-qps", oai(body(None), body(None)), "the log has no timestamps: give --qps"),
    ("openai-no-output-length", oai(body(1, out=None)), "log.jsonl:1: no output length in the log"),
    ("openai-output-negative", oai(body(1, out=-3)), "log.jsonl:1: field 'output_tokens'"),
    ("openai-usage-not-object", oai(body(1, out=None, usage=[1])), "log.jsonl:1: field 'usage'"),
    ("openai-tools-not-list", oai(body(1, tools={"a": 1})), "log.jsonl:1: field 'tools'"),
    ("openai-tool-call-bad", oai(body(1, messages=[USER, {"role": "assistant", "tool_calls": [{"x": 1}]}, USER])),
     "'tool_calls' must be a list"),
    ("openai-tool-arguments-not-json", oai(body(1, messages=[
        USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}, USER])),
     "log.jsonl:1: message 2: tool call arguments must be a JSON object"),
    ("openai-prism-not-object", oai(body(1, prism=[1])), "log.jsonl:1: field 'prism': must be a JSON object"),
    ("openai-prism-unknown-key", oai(body(1, prism={"order": 1})), "unknown key 'order'"),
    ("openai-prism-movable-string", oai(body(1, prism={"segments": ["Hi?"], "movable": "yes"})), "'prism.movable'"),
    ("openai-prism-sys-not-first", oai(body(1, prism={"segments": ["Be", {"kind": "sys", "text": "Hi"}]})),
     "item 2 is 'sys'"),
    ("openai-prism-text-absent", oai(body(1), body(2, prism={"segments": [{"kind": "sys", "text": "Be brief."},
                                                                          "not in the prompt"]})),
     "log.jsonl:2: field 'prism.segments': segment 2's text is not in the rendered prompt"),
    ("openai-empty-log", ({"log.jsonl": "\n\n"}, oai()[1]), "log.jsonl: the log has no requests"),
    ("openai-log-missing", ({}, oai()[1]), "log.jsonl: no such file"),
    ("openai-log-is-a-folder", ({"log.jsonl/x": ""}, oai()[1]), "log.jsonl: is a directory"),
    # --- tokenizer folders ---
    ("tokenizer-flag-missing",
     ({"log.jsonl": jl(body(1))}, ["import", "{d}/log.jsonl", "--format", "openai", "-o", OUT]),
     "--tokenizer: --format openai needs the model's tokenizer folder"),
    ("tokenizer-folder-missing", ({"log.jsonl": jl(body(1))}, oai()[1][:5] + ["{d}/nope", "-o", OUT]),
     "nope: tokenizer folder not found"),
    ("tokenizer-folder-empty", ({"log.jsonl": jl(body(1)), "tk/readme": "x"}, oai()[1][:5] + ["{d}/tk", "-o", OUT]),
     "tk: no tokenizer.json in the tokenizer folder"),
    ("tokenizer-json-garbage", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": GARBAGE},
                                oai()[1][:5] + ["{d}/tk", "-o", OUT]), "tokenizer.json: cannot load tokenizer"),
    ("tokenizer-without-template", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": "@tokenizer.json"},
                                    oai()[1][:5] + ["{d}/tk", "-o", OUT]),
     "tk: the tokenizer has no chat template"),
    ("tokenizer-config-garbage", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": "@tokenizer.json",
                                   "tk/tokenizer_config.json": GARBAGE}, oai()[1][:5] + ["{d}/tk", "-o", OUT]),
     "tokenizer_config.json:1: not UTF-8"),
    ("tokenizer-template-syntax", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": "@tokenizer.json",
                                    "tk/tokenizer_config.json": json.dumps({"chat_template": "{% if %}"})},
                                   oai()[1][:5] + ["{d}/tk", "-o", OUT]), "chat template 'default' does not compile"),
    ("tokenizer-template-refuses", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": "@tokenizer.json",
                                     "tk/tokenizer_config.json": json.dumps({"chat_template": RAISING})},
                                    oai()[1][:5] + ["{d}/tk", "-o", OUT]),
     "log.jsonl:1: the chat template refuses the request: this template serves no one"),
    ("tokenizer-template-divides-by-zero", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": "@tokenizer.json",
                                             "tk/tokenizer_config.json": json.dumps({"chat_template": "{{ 1/0 }}"})},
                                            oai()[1][:5] + ["{d}/tk", "-o", OUT]),
     "log.jsonl:1: the chat template refuses the request: division by zero"),
    ("tokenizer-template-recursion", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": "@tokenizer.json",
                                       "tk/tokenizer_config.json": json.dumps(
                                           {"chat_template": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"})},
                                      oai()[1][:5] + ["{d}/tk", "-o", OUT]),
     "the chat template refuses the request: maximum recursion depth exceeded"),
    ("tokenizer-template-not-string", ({"log.jsonl": jl(body(1)), "tk/tokenizer.json": "@tokenizer.json",
                                        "tk/tokenizer_config.json": json.dumps({"chat_template": 5})},
                                       oai()[1][:5] + ["{d}/tk", "-o", OUT]), "field 'chat_template'"),
    # --- autobench (token ids) ---
    ("autobench-ids-outside-vocab", ab({"prompt": [1, 99999], "output_len": 2, "timestamp": 0},
                                       flags=("--tokenizer", "{tok}")),
     "ab.jsonl:1: field 'prompt': token id 99999 at position 1 is outside the tokenizer's vocabulary (0..8191)"),
    ("autobench-id-negative", ab({"prompt": [5], "output_len": 1, "timestamp": 0},
                                 {"prompt": [1, -2], "output_len": 1, "timestamp": 1}),
     "ab.jsonl:2: field 'prompt': token id -2 at position 1 is not in 0..2147483647"),
    ("autobench-id-over-int32", ab({"prompt": [2**40], "output_len": 1, "timestamp": 0}), "token id 1099511627776"),
    ("autobench-ids-floats", ab({"prompt": [1.5, 2], "output_len": 1, "timestamp": 0}), "must be a list of 1.."),
    ("autobench-prompt-empty", ab({"prompt": [], "output_len": 1, "timestamp": 0}), "ab.jsonl:1: field 'prompt'"),
    ("autobench-prompt-number", ab({"prompt": 7, "output_len": 1, "timestamp": 0}), "must be a list of token ids"),
    ("autobench-prompt-len-mismatch", ab({"prompt": [1, 2, 3], "prompt_len": 4, "output_len": 1, "timestamp": 0}),
     "ab.jsonl:1: field 'prompt_len': 4, but 'prompt' holds 3 tokens"),
    ("autobench-timestamp-backwards", ab({"prompt": [1], "output_len": 1, "timestamp": 900},
                                         {"prompt": [2], "output_len": 1, "timestamp": 100}),
     "ab.jsonl:2: field 'timestamp': earlier than the line before"),
    ("autobench-no-output", ab({"prompt": [1], "timestamp": 0}), "ab.jsonl:1: no output length"),
    ("autobench-text-without-tokenizer", ab({"prompt": "hello", "output_len": 1, "timestamp": 0}),
     "ab.jsonl:1: --tokenizer: a text prompt needs"),
    ("autobench-messages-without-tokenizer", ab({"messages": [USER], "output_len": 1, "timestamp": 0}),
     "ab.jsonl:1: --tokenizer: chat messages need"),
    ("autobench-garbage", ({"ab.jsonl": GARBAGE}, ab()[1]), "ab.jsonl:1: not UTF-8"),
    ("autobench-not-json", ab({"prompt": [1], "output_len": 1, "timestamp": 0}, "[1, 2"), "ab.jsonl:2: invalid JSON"),
    # --- ShareGPT ---
    ("sharegpt-no-qps", sg(json.dumps([conv(("human", "a"), ("gpt", "b"))]), flags=()), "--qps: ShareGPT"),
    ("sharegpt-not-json", sg("[\n" + json.dumps(conv(("human", "a"), ("gpt", "b"))) + ",\n{oops\n]"),
     "sg.json:3: invalid JSON"),
    ("sharegpt-turn-without-value",
     sg(json.dumps([conv(("human", "a"), ("gpt", "b"))]).replace('"value": "b"', '"x": 1')),
     "sg.json:1: field 'conversations': turn 2 (gpt) has no content"),
    ("sharegpt-unknown-speaker", sg("[\n" + json.dumps(conv(("human", "a"))) + ",\n" + json.dumps(conv(("alien", "a")))
                                    + "\n]"), "sg.json:3: field 'conversations': turn 1 is from 'alien'"),
    ("sharegpt-not-conversation", sg("[5]"), "sg.json:1: expected a conversation"),
    ("sharegpt-no-turns", sg(json.dumps([{"id": 1}])), "expected 'conversations'"),
    ("sharegpt-garbage", sg(GARBAGE), "sg.json:1: not UTF-8"),
    ("sharegpt-trailing-data", sg(json.dumps([conv(("human", "a"), ("gpt", "b"))]) + "\n[]"), "extra data"),
    # --- CSV ---
    ("csv-missing-column", csv_("timestamp,prompt_tokens\n0,5\n"), "a.csv:1: missing column 'output_tokens'"),
    ("csv-column-twice", csv_("timestamp,prompt_tokens,output_tokens,prompt_tokens\n0,5,10,7\n"),
     "a.csv:1: column 'prompt_tokens' named twice in the header"),
    ("csv-bad-number", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n1,many,2\n"),
     "a.csv:3: field 'prompt_tokens': expected an integer"),
    ("csv-timestamp-backwards", csv_("timestamp,prompt_tokens,output_tokens\n5,5,2\n1,5,2\n"),
     "a.csv:3: field 'timestamp': earlier than the line before"),
    ("csv-timestamp-inf", csv_("timestamp,prompt_tokens,output_tokens\ninf,5,2\n"), "a.csv:2: field 'timestamp'"),
    ("csv-prompt-zero", csv_("timestamp,prompt_tokens,output_tokens\n0,0,2\n"), "a.csv:2: field 'prompt_tokens'"),
    ("csv-ragged-row", csv_("timestamp,prompt_tokens,output_tokens\n0,5\n"), "a.csv:2: expected 3 fields"),
    ("csv-garbage", csv_(GARBAGE), "a.csv:1: not UTF-8"),
    ("csv-no-rows", csv_("timestamp,prompt_tokens,output_tokens\n"), "a.csv: the log has no requests"),
    # --- flags and the output path ---
    ("import-output-len-words", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n", ("--output-len", "lots")),
     "--output-len: expected log"),
    ("import-output-len-uniform-arity", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n",
                                             ("--output-len", "uniform:5")), "--output-len"),
    ("import-output-len-reversed", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n",
                                        ("--output-len", "uniform:9,3")), "needs A <= B"),
    ("import-output-len-zero", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n", ("--output-len", "0")),
     "--output-len: token counts must be integers"),
    ("import-qps-nan", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n", ("--qps", "nan")), "--qps"),
    ("import-qps-zero", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n", ("--qps", "0")), "--qps"),
    ("import-seed-negative", csv_("timestamp,prompt_tokens,output_tokens\n0,5,2\n", ("--seed", "-1")), "--seed"),
    ("import-block-tokens-zero", ab({"prompt": [1], "output_len": 1, "timestamp": 0}, flags=("--block-tokens", "0")),
     "--block-tokens"),
    ("import-sessions-zero", sg("[]", flags=("--qps", "5", "--sessions", "0")), "--sessions"),
    ("import-format-unknown", ({"a.csv": "x"}, ["import", "{d}/a.csv", "--format", "parquet", "-o", OUT]),
     "--format: invalid choice"),
    ("import-out-under-a-file", ({"a.csv": "timestamp,prompt_tokens,output_tokens\n0,5,2\n", "f": "x"},
                                 ["import", "{d}/a.csv", "--format", "csv", "-o", "{d}/f/out.jsonl"]),
     "-o {d}/f/out.jsonl: {d}/f is a file, not a folder"),
    ("import-out-in-a-new-folder", ({"a.csv": "timestamp,prompt_tokens\n0,5\n"},
                                    ["import", "{d}/a.csv", "--format", "csv", "-o", "{d}/new/out.jsonl"]),
     "missing column"),
    ("import-out-is-a-folder", ({"a.csv": "timestamp,prompt_tokens,output_tokens\n0,5,2\n", "o/x": ""},
                                ["import", "{d}/a.csv", "--format", "csv", "-o", "{d}/o"]), "is a folder"),
    ("import-out-in-proc", ({"a.csv": "timestamp,prompt_tokens,output_tokens\n0,5,2\n"},
                            ["import", "{d}/a.csv", "--format", "csv", "-o", "/proc/prism-out.jsonl"]),
     "-o /proc/prism-out.jsonl"),
    ("export-openai-without-tokenizer", ({}, ["export", "zipf", "--format", "openai", "-o", OUT]),
     "--tokenizer: --format openai writes text"),
    ("export-trace-missing", ({}, ["export", "{d}/none.jsonl", "--format", "autobench", "-o", OUT]),
     "none.jsonl: no such trace file"),
    ("export-out-under-a-file", ({"f": "x"}, ["export", "zipf", "--format", "autobench", "-o", "{d}/f/o.jsonl"]),
     "is a file, not a folder"),
    ("make-tokenizer-no-data", ({}, ["make-tokenizer", "-o", "{d}/tk", "--data", "{d}/nodata"]),
     "nodata: public data not found"),
]


@pytest.mark.parametrize("files,argv,fragment", [c[1] + (c[2],) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_import_input(tmp_path, capsys, chat_tokenizer_dir, files, argv, fragment):
    for name, content in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if content == "@tokenizer.json":
            content = (chat_tokenizer_dir / "tokenizer.json").read_bytes()
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    args = [a.replace("{d}", str(tmp_path)).replace("{tok}", str(chat_tokenizer_dir)) for a in argv]
    try:
        code = trace_main(args)
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prism-trace") and ": error: " in lines[0], err
    assert fragment.replace("{d}", str(tmp_path)) in lines[-1], err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written, no temp file


def test_enough_distinct_cases():
    ids = [c[0] for c in CASES]
    assert len(set(ids)) == len(ids) and len(ids) >= 80
