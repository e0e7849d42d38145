"""End to end on a real SGLang server (CPU, the 2-layer ``tiny`` geometry, dummy weights).

* prism-live with ``--method prism`` (SGLang's admission) and ``--method sglang`` (``engine.admission: full``,
  which never retracts) on a 100-request trace that queues and evicts:
  results in prism-sim's schema, hit tokens, and the plugin's counters from the scheduler process (QAS
  rounds, realignments, DART evictions by tier);
* a server killed mid-run, and Ctrl-C: partial results, ``complete: false``, one line (exit status 1 and
  130), no process left behind;
* a small paced validate run at low load: hit rates within 2 points of the simulator's, TTFT within the
  tolerance documented in README (Live mode);
* a paced validate run on a small KV pool where SGLang retracts (``engine.admission: sglang``): the live
  server retracted, re-prefilled, and agrees with the simulator on retractions and hit rate;
* a paced validate run of QAS as a front end (``qas.window_s`` 0.05), whose windows the plugin holds and
  releases in the scheduler (``live/frontend.py``).

Each server start costs 20-45 s on two cores; the module keeps to eight starts.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt.managers.scheduler")

from prism.cli.live import main as live_main  # noqa: E402

LIVE = [sys.executable, "-m", "prism.cli.live"]
SMALL = ["--trace", "zipf", "--set", "trace.num_requests=100", "--set", "engine.max_total_tokens=8192",
         "--model", "tiny", "--no-progress"]


def _processes_with(text: str) -> list[int]:
    """Pids whose environment mentions ``text`` (a run's plugin config path): the run's server processes."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if text.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                out.append(int(pid))
        except OSError:
            continue
    return out


def _admitted(counters: dict) -> int:
    """Admissions over every lane a scheduler counts (``admitted_<lane>_lane``: hot, cold, aged...)."""
    return sum(v for k, v in counters.items() if k.startswith("admitted_") and k.endswith("_lane"))


@pytest.mark.parametrize("method,admission", [("prism", "sglang"), ("sglang", "full")])
def test_live_run_writes_the_simulators_schema_and_the_plugin_counts(tmp_path, method, admission, capsys):
    out = tmp_path / method
    pin = ["--set", "qas.window_s=0"] if method == "prism" else []  # QAS inside SGLang's scheduling round
    assert live_main([*SMALL, "--method", method, *pin, "--qps", "200", "--out", str(out), "--port", "30131",
                      "--set", f"engine.admission={admission}"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] and s["engine_kind"] == "sglang" and s["num_requests"] == 100
    assert s["engine"]["admission"] == admission and s["server_admission_env"]["SGLANG_INIT_NEW_TOKEN_RATIO"] == "0.7"
    # every request generated exactly its output length (the client checks it too), EOS banned or ignored
    with (out / "requests.csv").open() as f:
        assert [int(r["output_tokens"]) for r in csv.DictReader(f)] == [32] * 100  # zipf: output_len 32
    if admission == "full":  # ignore_eos: SGLang reserves the whole remaining decode and never retracts
        assert "retractions" not in s["counters"], s["counters"]
    assert s["hit_tokens"] > 0 and 0 < s["hit_rate"] < 1
    header = (out / "requests.csv").read_text().splitlines()[0].split(",")
    from prism.metrics import CSV_COLUMNS

    assert header == CSV_COLUMNS
    rows = (out / "requests.csv").read_text().splitlines()[1:]
    assert len(rows) == 100
    c = s["counters"]
    assert "paced_batches" not in c  # not paced: the run_batch hook only logs
    evicted = sum(v for k, v in c.items() if k.startswith("evicted_tokens_"))
    assert evicted > 0, c  # 100 prompts of ~770 tokens through an 8,192-token pool
    if method == "prism":
        assert c["qas_rounds"] > 0 and c["front_alignment_moves"] > 0, c  # QAS ran and realigned in SGLang
        assert c["evicted_tokens_private"] > 0, c  # DART's tiers
        # every admission is counted in one lane (hot, cold, or aged past qas.max_wait_s); a retracted request
        # is admitted again (counted again, as in the simulator)
        assert c["admitted_hot_lane"] > 0 and _admitted(c) == 100 + c.get("retractions", 0), c
    else:
        assert c["scheduling_rounds"] > 0 and "qas_rounds" not in c, c  # SGLang's own LPM ordered the queue
    assert not _processes_with(str(out / "plugin.json"))


BREAK_OFF_REQUESTS = 400  # arrivals over 320 s (5 QPS, dilation 4): the run is never over when it is broken off


def _break_off(out: Path, method: str, port: int, interrupt) -> tuple[int, str]:
    """Start a paced prism-live run, let it finish a few requests, ``interrupt(proc)``; (exit status, stderr).

    The run starts with SIGINT's default action, as from a terminal: a test process started in the background
    by a non-interactive shell (``cmd &``, as some CI harnesses do) ignores SIGINT, and an ignored signal is
    inherited across exec, so the run would ignore its Ctrl-C as a background job rightly does."""
    proc = subprocess.Popen([*LIVE, *SMALL, "--set", f"trace.num_requests={BREAK_OFF_REQUESTS}", "--method", method,
                             "--qps", "5", "--out", str(out), "--port", str(port),
                             "--pace", "a800-80g:qwen3-4b-instruct-2507", "--dilation", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()  # still running when a sixth row is seen
            csv = out / "requests.csv"
            if csv.exists() and len(csv.read_text().splitlines()) > 5:
                break
            time.sleep(0.5)
        interrupt(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def _assert_partial(out: Path, err: str, first_words: str) -> None:
    """One line (after SGLang's import warnings), partial results marked incomplete, no server process left."""
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
    assert lines[-1].startswith(first_words) and "Traceback" not in err, err[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] is False and 0 < s["num_requests"] < BREAK_OFF_REQUESTS
    assert len((out / "requests.csv").read_text().splitlines()) - 1 == s["num_requests"]
    assert not _processes_with(str(out / "plugin.json"))


def test_a_server_killed_mid_run_leaves_partial_results_and_no_process(tmp_path):
    out = tmp_path / "killed"

    def kill_server(proc):
        servers = _processes_with(str(out / "plugin.json"))
        assert servers
        for pid in servers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    rc, err = _break_off(out, "prism", 30132, kill_server)
    assert rc == 1, err[-3000:]
    _assert_partial(out, err, "prism-live: run broke off:")


def test_ctrl_c_leaves_partial_results_one_line_and_no_process(tmp_path):
    out = tmp_path / "interrupted"
    rc, err = _break_off(out, "sglang", 30134, lambda proc: proc.send_signal(signal.SIGINT))
    assert rc == 130, err[-3000:]
    _assert_partial(out, err, "prism-live: interrupted; partial results in")


def test_paced_validate_matches_the_simulator_at_low_load(tmp_path):
    out = tmp_path / "validate"
    rc = live_main(["validate", "--trace", "zipf", "--methods", "sglang,prism,contextpilot", "--qps", "12",
                    "--set", "trace.num_requests=40", "--set", "qas.window_s=0",  # prism: QAS in the engine
                    "--pace", "a800-80g:qwen3-4b-instruct-2507", "--out", str(out), "--no-progress", "--port", "30133"])
    assert rc == 0
    rows = json.loads((out / "validate.json").read_text())
    assert {r["method"] for r in rows} == {"sglang", "prism", "contextpilot"}
    for r in rows:
        assert abs(r["hit_diff_pts"]) <= 2.0, r
        assert abs(r["p50_ratio"] - 1) <= 0.25, r  # README: paced on CPU at low load, P50 within 25%
    assert (out / "validate.csv").exists() and (out / "validate.png").exists()


# the paced twin's retraction check runs with the timeline check: tests/live/test_live_timeline.py


def test_paced_validate_of_the_window_front_end_matches_the_simulator(tmp_path):
    out = tmp_path / "validate-window"
    rc = live_main(["validate", "--trace", "zipf", "--methods", "prism", "--qps", "10",
                    "--set", "trace.num_requests=30", "--set", "qas.window_s=0.05",
                    "--set", "qas.front_end=arrivals",
                    "--pace", "a800-80g:qwen3-4b-instruct-2507", "--out", str(out), "--no-progress",
                    "--port", "30136"])
    assert rc == 0
    [row] = json.loads((out / "validate.json").read_text())
    assert abs(row["hit_diff_pts"]) <= 2.0, row
    assert abs(row["p50_ratio"] - 1) <= 0.25, row  # README: paced on CPU at low load, P50 within 25%
    sim = json.loads((out / "prism" / "qps10" / "sim" / "summary.json").read_text())["counters"]
    live = json.loads((out / "prism" / "qps10" / "live" / "summary.json").read_text())["counters"]
    assert live["scheduling_rounds"] > 0, live  # SGLang's FCFS ordered the queue behind the front end
    assert live["qas_rounds"] == live["frontend_windows"] > 0, live  # one QAS round per window, as simulated
    # the same windows up to arrivals that land on a window's boundary (the live path jitters by about 1 ms)
    assert abs(live["frontend_windows"] - sim["frontend_windows"]) <= 0.1 * sim["frontend_windows"], (sim, live)
    assert live["front_alignment_moves"] > 0 and _admitted(live) == 30
