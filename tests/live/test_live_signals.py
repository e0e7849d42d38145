"""prism-live stopped by a signal, on a real SGLang server (CPU, the 2-layer ``tiny`` geometry): SIGTERM and
SIGHUP behave as Ctrl-C does, during the server's start-up and mid-run, and the server never outlives
prism-live, not even a prism-live killed by SIGKILL.

* during start-up (the server launched, not yet healthy): exit 128 + the signal, one line that says no request
  had finished (there is no summary.json to point at), no requests.csv, no server process left;
* mid-run: the finished requests in requests.csv, summary.json with ``complete: false``, one line, exit
  128 + the signal, no server process left;
* SIGKILL to prism-live while its server starts: the kernel kills the server's launcher, and SGLang's
  scheduler and detokenizer die with it.

Each server start costs 20-45 s on two cores; the start-up cases stop it within seconds.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt.managers.scheduler")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the helpers beside the default suite
from processes import alive, as_from_a_terminal, descendants  # noqa: E402
from test_live_server import BREAK_OFF_REQUESTS, LIVE, SMALL, _assert_partial, _processes_with  # noqa: E402


def _start(out: Path, port: int) -> subprocess.Popen:
    """A paced prism-live run that takes minutes (400 arrivals at 5 QPS, dilation 4)."""
    return subprocess.Popen([*LIVE, *SMALL, "--set", f"trace.num_requests={BREAK_OFF_REQUESTS}", "--method",
                             "sglang", "--qps", "5", "--out", str(out), "--port", str(port),
                             "--pace", "a800-80g:qwen3-4b-instruct-2507", "--dilation", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.2)


def _signal_when(proc: subprocess.Popen, ready, what: str, sig: int) -> tuple[str, list[int]]:
    """Send ``sig`` once ``ready()``; prism-live's stderr and the processes it had then."""
    try:
        _wait_for(proc, ready, what)
        children = descendants(proc.pid)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return err, children


def _last_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
    assert "Traceback" not in err, err[-3000:]
    return lines[-1]


@pytest.mark.parametrize("sig,port", [(signal.SIGTERM, 30171), (signal.SIGHUP, 30172), (signal.SIGINT, 30176)])
def test_a_signal_during_server_start_up_stops_the_server(tmp_path, sig, port):
    out = tmp_path / "starting"
    proc = _start(out, port)
    err, server = _signal_when(proc, lambda: _processes_with(str(out / "plugin.json")), "server process", sig)
    assert proc.returncode == 128 + sig, err[-3000:]
    line = _last_line(err)
    assert line.startswith("prism-live: interrupted; no request had finished") and "summary.json says" not in line
    assert not (out / "summary.json").exists() and not (out / "requests.csv").exists()
    assert alive(server) == [] and not _processes_with(str(out / "plugin.json"))


@pytest.mark.parametrize("sig,port", [(signal.SIGTERM, 30173), (signal.SIGHUP, 30174)])
def test_a_signal_mid_run_keeps_the_finished_requests(tmp_path, sig, port):
    out = tmp_path / "running"
    proc, csv = _start(out, port), out / "requests.csv"
    err, server = _signal_when(proc, lambda: csv.exists() and len(csv.read_text().splitlines()) > 5, "sixth row",
                               sig)
    assert proc.returncode == 128 + sig, err[-3000:]
    _assert_partial(out, err, "prism-live: interrupted; partial results in")
    assert "complete: false" in _last_line(err)
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    assert alive(server) == []


def test_the_server_dies_with_a_killed_prism_live(tmp_path):
    """SIGKILL runs no code of prism-live's: the kernel's parent-death signal stops the server."""
    out = tmp_path / "killed"
    proc = _start(out, 30175)  # killed once the launcher has started its first processes (still importing)
    _, server = _signal_when(proc, lambda: len(_processes_with(str(out / "plugin.json"))) >= 3,
                             "the launcher's processes", signal.SIGKILL)
    assert alive(server, wait_s=30) == [] and not _processes_with(str(out / "plugin.json"))
