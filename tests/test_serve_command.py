"""``prism-live serve --print-command`` (no server starts, SGLang need not import): the command an operator runs
and the plugin settings it names. A QAS front end that holds the backlog bounds it by SGLang's running slots,
so the plugin's bound and SGLang's ``--max-running-requests`` must be one number."""

from __future__ import annotations

import json
import shlex

import pytest

from prism.cli.live import main as live_main


def _print_command(tmp_path, capsys, method: str, after: list[str]) -> tuple[int, list[str], dict | None, str]:
    out = tmp_path / method
    code = live_main(["serve", "--model", "tiny", "--method", method, "--device", "cpu",
                      "--set", "engine.max_total_tokens=8192", "--out", str(out), "--print-command",
                      *(["--", *after] if after else [])])
    captured = capsys.readouterr()
    plugin = out / "plugin.json"
    return (code, shlex.split(captured.out.strip()), json.loads(plugin.read_text()) if plugin.exists() else None,
            captured.err.strip())


def _value(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize("after, slots", [([], "256"), (["--max-running-requests", "8"], "8"),
                                          (["--max-running-requests=12"], None)])
def test_a_backlog_front_end_and_sglang_read_one_bound(tmp_path, capsys, after, slots):
    code, argv, plugin, err = _print_command(tmp_path, capsys, "prism", after)
    assert code == 0, err
    assert plugin["deployment"]["holds"] == "backlog"
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--max-running-requests=")]
    values = _value(argv, "--max-running-requests") + given
    assert len(values) == 1, argv  # passed once: by prism (the settings' default) or by the operator after --
    assert slots is None or values == [slots]
    assert plugin["backlog_limit"] == int(values[0])


def test_a_method_without_a_backlog_leaves_sglangs_running_slots_alone(tmp_path, capsys):
    code, argv, plugin, err = _print_command(tmp_path, capsys, "sglang", [])
    assert code == 0, err
    assert "--max-running-requests" not in argv and plugin["backlog_limit"] is None


@pytest.mark.parametrize("bad", ["x", "0", "-3"])
def test_a_bound_that_is_not_a_positive_number_is_one_line(tmp_path, capsys, bad):
    code, argv, plugin, err = _print_command(tmp_path, capsys, "prism", [f"--max-running-requests={bad}"])
    assert code == 2 and argv == [] and len(err.splitlines()) == 1
    assert "--max-running-requests" in err and repr(bad) in err, err
    assert not (tmp_path / "prism").exists()  # checked before anything is written


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_an_out_folder_it_cannot_write_is_one_line(tmp_path, capsys, where):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "sub"
    code = live_main(["serve", "--model", "tiny", "--device", "cpu", "--set", "engine.max_total_tokens=8192",
                      "--out", str(out), "--print-command"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("prism-live: error: --out "), err
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("argv, fragment", [
    (["--out", ""], "argument --out: expected a path, got an empty one"),
    (["--host", "bad host!"], "--host: expected a host name or an IP address, got 'bad host!'"),
    (["--", "--host"], "--host: expected a host name or an IP address, got ''"),
    (["--", "--radix-cache-backend", "radix"], "--radix-cache-backend is set by prism-live serve"),
    (["--", "--schedule-policy=lpm"], "--schedule-policy is set by prism-live serve"),
])
def test_what_would_print_a_wrong_command_is_one_line(tmp_path, capsys, argv, fragment):
    """Refused before anything is written, with --print-command too: an empty --out (the current folder), a host
    no server can listen on, an argument after -- that prism sets itself (printed twice, the last would win)."""
    out = [] if "--out" in argv else ["--out", str(tmp_path / "o")]
    try:
        code = live_main(["serve", "--model", "tiny", "--device", "cpu", "--set", "engine.max_total_tokens=8192",
                          "--print-command", *out, *argv])
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and fragment in err, err
    assert not (tmp_path / "o").exists()


def test_a_cpu_server_without_its_pool_size_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "o"
    code = live_main(["serve", "--model", "tiny", "--method", "prism", "--device", "cpu", "--out", str(out),
                      "--print-command"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "a CPU server needs its KV pool size" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_a_port_in_use_is_refused_before_anything_starts_or_is_written(tmp_path, capsys):
    """serve checks its port (and the tokenizer) itself before it writes the plugin's settings or starts SGLang."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = tmp_path / "o"
        code = live_main(["serve", "--model", "tiny", "--device", "cpu", "--set", "engine.max_total_tokens=8192",
                          "--port", str(port), "--out", str(out), "--", "--skip-tokenizer-init"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"port {port} on 127.0.0.1 is in use" in err and len(err.splitlines()) == 1, err
    assert not out.exists()
