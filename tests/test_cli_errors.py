"""Every class of bad input ends with one line naming the problem, exit status 2, no traceback."""

from __future__ import annotations

import json

import pytest

from prism.cli.sim import main as sim_main
from prism.cli.trace import main as trace_main


def run(main, argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


CASES = [
    # (description, files, argv builder, fragment of the message)
    ("malformed YAML", {"bad.yaml": "kind: zipf_hotspot\nqps: [60\n"}, lambda f: ["--trace", f["bad.yaml"]],
     "bad.yaml:"),
    ("unknown spec key", {"s.yaml": "kind: zipf_hotspot\nqpss: 60\n"}, lambda f: ["--trace", f["s.yaml"]],
     "unknown field 'qpss'"),
    ("unknown trace kind", {"s.yaml": "kind: nope\n"}, lambda f: ["--trace", f["s.yaml"]], "unknown trace kind"),
    ("zero rate", {}, lambda f: ["--trace", "zipf", "--qps", "0"], "field 'qps': must be > 0"),
    ("negative rate", {"s.yaml": "kind: zipf_hotspot\nqps: -5\n"}, lambda f: ["--trace", f["s.yaml"]],
     "must be > 0"),
    ("k larger than corpus", {}, lambda f: ["--trace", "zipf", "--set", "trace.k=5000"], "field 'k'"),
    ("KV capacity below one request", {}, lambda f: ["--trace", "zipf", "--set", "engine.max_total_tokens=100"],
     "engine.max_total_tokens"),
    ("unknown method", {}, lambda f: ["--trace", "zipf", "--method", "magic"], "unknown method 'magic'"),
    ("unknown scheduler", {}, lambda f: ["--trace", "zipf", "--scheduler", "magic"], "unknown scheduler"),
    ("unknown eviction", {}, lambda f: ["--trace", "zipf", "--eviction", "magic"], "unknown eviction"),
    ("unknown engine key", {}, lambda f: ["--trace", "zipf", "--set", "engine.turbo=1"], "unknown field 'turbo'"),
    ("wrong type", {}, lambda f: ["--trace", "zipf", "--set", "engine.page_size=big"], "must be an integer"),
    ("unknown config section", {"c.yaml": "engines: {}\n"},
     lambda f: ["--trace", "zipf", "--config", f["c.yaml"]], "unknown section 'engines'"),
    ("unknown profile", {}, lambda f: ["--trace", "zipf", "--profile", "tpu:llama"], "unknown GPU"),
    ("missing trace file", {}, lambda f: ["--trace", "missing.jsonl"], "missing.jsonl"),
    ("malformed JSONL", {"t.jsonl": json.dumps({"prism_trace": 1}) + "\n{oops\n"},
     lambda f: ["--trace", f["t.jsonl"]], "t.jsonl:2"),
    ("JSONL bad field", {"t.jsonl": json.dumps({"prism_trace": 1}) + "\n"
                         + json.dumps({"seg": "s", "kind": "sys", "first": 1}) + "\n"
                         + json.dumps({"seg": "q", "kind": "priv", "first": 2}) + "\n"
                         + json.dumps({"id": 0, "t": 0.0, "segs": [["s", 4], ["q", 2]], "out": 0}) + "\n"},
     lambda f: ["--trace", f["t.jsonl"]], "t.jsonl:4: field 'out'"),
    ("JSONL undeclared segment", {"t.jsonl": json.dumps({"prism_trace": 1}) + "\n"
                                  + json.dumps({"id": 0, "t": 0.0, "segs": [["zz", 4]], "out": 1}) + "\n"},
     lambda f: ["--trace", f["t.jsonl"]], "used before its declaration"),
    ("not a PRISM trace", {"t.jsonl": json.dumps({"hello": 1}) + "\n"}, lambda f: ["--trace", f["t.jsonl"]],
     "not a PRISM trace"),
]


@pytest.mark.parametrize("desc,files,argv,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2(tmp_path, capsys, desc, files, argv, fragment):
    paths = {name: write(tmp_path, name, text) for name, text in files.items()}
    code, err = run(sim_main, argv(paths) + ["--out", str(tmp_path / "o"), "--no-progress"], capsys)
    assert code == 2, desc
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("prism-sim: error:")
    assert fragment in err, err


def test_trace_cli_errors(tmp_path, capsys):
    code, err = run(trace_main, ["stats", str(tmp_path / "none.jsonl")], capsys)
    assert code == 2 and "none.jsonl" in err and len(err.splitlines()) == 1
    code, err = run(trace_main, ["gen", "zipf", "-o", str(tmp_path / "x.jsonl"), "--set", "r_hot=1.5"], capsys)
    assert code == 2 and "r_hot" in err


def test_interrupted_run_keeps_finished_requests(tmp_path, capsys, monkeypatch):
    from prism.sim import instance

    original = instance.Instance.__init__
    count = {"n": 0}

    def init(self, index, env, spec, on_finish, *a, **k):  # the engine's hook for each request it finishes
        def finished(seq):
            on_finish(seq)
            count["n"] += 1
            if count["n"] == 40:
                raise KeyboardInterrupt
        original(self, index, env, spec, finished, *a, **k)

    monkeypatch.setattr(instance.Instance, "__init__", init)
    out = tmp_path / "run"
    code = sim_main(["--trace", "zipf", "--set", "trace.num_requests=150", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted after 40 of 150 requests" in err and str(out) in err
    assert len(err.strip().splitlines()) == 1
    rows = (out / "requests.csv").read_text().splitlines()
    assert len(rows) == 1 + 40 and rows[0].startswith("id,arrival")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["num_requests"] == 40


def test_example_config_loads_and_runs(tmp_path, capsys):
    from conftest import ROOT

    code = sim_main(["--trace", "zipf", "--config", str(ROOT / "examples" / "sim-config.yaml"),
                     "--set", "trace.num_requests=100", "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["method"] == "prism" and summary["qps"] == 25 and summary["num_requests"] == 100


def test_every_option_of_every_command_has_help():
    import argparse

    from prism.cli import calibrate, live, serve, sim, sweep, theory, trace, validate

    def parsers(p):
        yield p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    yield from parsers(sub)

    missing = [f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
               for m in (sim, sweep, theory, trace, calibrate, live, validate, serve) for p in parsers(m.parser())
               for a in p._actions if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert not missing


def test_example_config_shows_every_knob_at_its_default():
    """examples/sim-config.yaml names every knob of every section (the sections a method does not run
    commented out) at its default value, so that it cannot fall behind the knob dataclasses again."""
    import dataclasses
    import re

    import yaml
    from conftest import ROOT
    from prism.policies import registry
    from prism.settings import ClusterConfig, EngineConfig

    text = (ROOT / "examples" / "sim-config.yaml").read_text()
    # a commented section is YAML once its '# ' goes: lines '# key:' and '#   key:'
    lines = [ln[2:] if re.match(r"# (\w+|  \w+):", ln) else ln for ln in text.splitlines()]
    shown = yaml.safe_load("\n".join(lines))
    sections = {"engine": EngineConfig, "cluster": ClusterConfig}
    for table in (registry.SCHEDULERS, registry.EVICTIONS, registry.ROUTERS):
        for name in table:
            cls = registry.policy_class(table, name)
            if cls.knob_section():
                sections[cls.knob_section()] = cls.Knobs
    for name, cls in sections.items():
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(cls)}
        assert shown.get(name) == defaults, name
    assert shown["method"] in registry.METHODS and shown["scheduler"] in registry.SCHEDULERS
    assert shown["eviction"] in registry.EVICTIONS


def test_sim_cli_writes_results(tmp_path, capsys):
    out = tmp_path / "run"
    code = sim_main(["--trace", "zipf", "--set", "trace.num_requests=150", "--qps", "20", "--out", str(out),
                     "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("method", "qps", "num_requests", "hit_rate", "throughput_rps", "infinite_cache_hit_rate", "wall_s"):
        assert key in summary
    assert set(summary["ttft_s"]) >= {"mean", "p50", "p90", "p95", "p99"}
    assert summary["num_requests"] == 150 and summary["qps"] == 20
    lines = (out / "requests.csv").read_text().splitlines()
    assert len(lines) == 151 and lines[0].startswith("id,arrival,sent,prefill_start")
    assert "sglang" in capsys.readouterr().out


def test_a_closed_standard_output_ends_a_command_quietly():
    """``prism-... | head``: the reader is gone before the command prints; no traceback, status 1."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "from prism.cli.calibrate import main; main()", "show"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the interpreter has even started: every write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and err == ""
