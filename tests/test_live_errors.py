"""The live commands' error contract where no SGLang server is needed (an audit of the live side found each of
these): a --url that answers something other than an SGLang server, a port in use or a host that is not this
machine's, the line a dead server leaves, a signal held back while a run ends, prism-live validate's reruns
and interruptions, and prism-calibrate measure's points when it stops early. The runs with a real server are
in tests/live/."""

from __future__ import annotations

import signal
import socket
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from prism.errors import UserError
from prism.interrupts import InterruptsHeld
from prism.live.server import Server, check_port, wait_healthy


@contextmanager
def listener(answer: bytes | None):
    """A TCP server on a free port that reads a request and sends ``answer`` (None: never answers)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    conn.recv(65536)
                    if answer is not None:
                        conn.sendall(answer)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        sock.close()


NOT_HTTP = b"\x00\xffgarbage, not http\r\n\r\n"
NOT_FOUND = b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize("answer, says", [(NOT_HTTP, "does not answer HTTP"),
                                          (NOT_FOUND, "answers HTTP 404 to /health: not an SGLang server?")])
def test_a_url_that_is_no_sglang_server_is_one_line_at_once(answer, says):
    """A listener that answers bytes that are not HTTP once raised http.client's BadStatusLine (a traceback),
    and one that answers 404 was polled for the whole start-up timeout (5 minutes by default)."""
    import time

    with listener(answer) as url:
        t0 = time.monotonic()
        with pytest.raises(UserError, match=says) as e:
            wait_healthy(url, timeout=60.0)
        assert time.monotonic() - t0 < 10 and e.value.where == "--url"


def test_calibrate_measure_refuses_a_url_that_does_not_answer_http():
    from prism.calibration.measure import Client

    with listener(NOT_HTTP) as url:
        with pytest.raises(UserError, match="does not answer HTTP"):
            Client(url, 5.0).check()


def test_a_port_in_use_and_a_host_that_is_not_this_machines_name_their_flag():
    """The port check (prism-live serve's, and now a run's) said "port N is in use" for any bind failure: a host
    that does not resolve, or an address of another machine, blamed the port."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"port {port} on 127.0.0.1 is in use") as e:
            check_port("127.0.0.1", port)
        assert e.value.where == "--port"
    with pytest.raises(UserError, match="cannot resolve '999.1.1.1'") as e:
        check_port("999.1.1.1", 30000)
    assert e.value.where == "--host"
    with pytest.raises(UserError, match="cannot listen on 192.0.2.1 .*not an address of this machine") as e:
        check_port("192.0.2.1", 30000)  # TEST-NET-1: never a local address
    assert e.value.where == "--host"


def test_a_port_this_user_may_not_take_names_the_port(monkeypatch):
    """Any bind failure but "in use" blamed --host ("not an address of this machine"), which prism-live lacks:
    a port below 1024 for a user who is not root is the port's problem."""
    import errno

    def refuse(self, address):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(UserError, match=r"cannot listen on 127.0.0.1 port 80 \(Permission denied\)") as e:
        check_port("127.0.0.1", 80)
    assert e.value.where == "--port"


def test_a_run_refuses_a_port_in_use_before_anything_starts(tmp_path, capsys):
    """prism-live (a run) did not check its ports: it talked to whatever held one (a wrong "plugin not active"
    line, or 135 s and an HTML fragment)."""
    from prism.cli.live import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code = main(["--trace", "zipf", "--set", "trace.num_requests=5", "--method", "sglang", "--port", str(port),
                     "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"--port: port {port} on 127.0.0.1 is in use" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_dead_servers_line_gives_its_exception_or_its_signal_not_a_warning(tmp_path):
    """The line quoted the last log line that mentioned an error: a harmless start-up warning, for a server
    killed by SIGKILL."""
    server = object.__new__(Server)
    server.log_path = tmp_path / "server.log"
    server.log_path.write_text("[t] OpenAI Responses API disabled: init failed (ModuleNotFoundError: No module "
                               "named 'openai_harmony')\n[t] The server is fired up and ready to roll!\n")
    assert server.last_error() == ""
    server.log_path.write_text("[t] ready\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                               "    g()\nRuntimeError: CUDA out of memory\n[t] shutting down\n")
    assert server.last_error() == "RuntimeError: CUDA out of memory"
    # SGLang's own: a crashed process logs its traceback inside one of its lines (scheduler.py's logger.error)
    server.log_path.write_text("[2026-12-05 18:52:01 TP0] Scheduler hit an exception: Traceback (most recent call "
                               "last):\n  File \"scheduler.py\", line 9, in run\n    self.step()\n"
                               "torch.OutOfMemoryError: CUDA out of memory\n[2026-12-05 18:52:01] Received sigquit "
                               "from a child process. It usually means the child failed.\n")
    assert server.last_error() == "torch.OutOfMemoryError: CUDA out of memory"


@pytest.fixture
def fake_live(monkeypatch):
    """prism-live's runs without a server: each "live" run is the simulator's run of the same spec, written where
    a live run writes; ``stop_at``: the run (by order) that raises KeyboardInterrupt instead; ``held``: a
    signal arrives, held back, as the run ends."""
    from prism import metrics
    from prism.sim.run import simulate

    calls = {"n": 0, "stop_at": None, "held": False, "raise": KeyboardInterrupt}

    def live_run(spec, opts, out, progress=None, timeline=None):
        calls["n"] += 1
        if calls["n"] == calls["stop_at"]:
            raise calls["raise"]
        res = simulate(spec)
        out = metrics.prepare_run_folder(out)
        metrics.write_requests_csv(res.records, out / "requests.csv")
        metrics.write_json(res.summary, out / "summary.json")
        if calls["held"] is True or calls["held"] == calls["n"]:
            with InterruptsHeld():
                signal.raise_signal(signal.SIGINT)
        return res.summary

    monkeypatch.setattr("prism.live.run.live_run", live_run)
    # validate first: importing it takes prism.cli.live's check_server by name, which would be the stand-in if
    # patched already, and then stay the stand-in after the test (a later test's validate checked no server)
    monkeypatch.setattr("prism.cli.validate.check_server", lambda opts: None)
    monkeypatch.setattr("prism.cli.live.check_server", lambda opts: None)
    return calls


URL = ["--url", "http://127.0.0.1:9"]  # attached: no server started, no port checked


def test_a_signal_held_while_a_live_run_ends_still_stops_it(tmp_path, capsys, fake_live):
    """A signal that came while the servers stopped or the files were written was swallowed: exit 0."""
    from prism.cli.live import main

    fake_live["held"] = True
    code = main(["--trace", "zipf", "--set", "trace.num_requests=20", "--method", "sglang", *URL,
                 "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 130 and "interrupted after the run finished" in err and "(complete: true)" in err, err
    assert len(err.splitlines()) == 1


def validate(tmp_path, methods: str) -> int:
    from prism.cli.live import main

    return main(["validate", "--trace", "zipf", "--set", "trace.num_requests=20", "--methods", methods, "--qps",
                 "20", *URL, "--out", str(tmp_path / "v"), "--no-progress"])


def test_a_validation_rerun_leaves_no_run_of_the_earlier_one(tmp_path, capsys, fake_live):
    """Its folder kept the earlier validation's METHOD/qpsQ runs beside a table that no longer listed them."""
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "notes.txt").write_text("mine")
    assert validate(tmp_path, "fcfs,sglang") == 0
    assert (tmp_path / "v" / "fcfs" / "qps20" / "live").is_dir()
    assert validate(tmp_path, "sglang") == 0
    capsys.readouterr()
    v = tmp_path / "v"
    assert not (v / "fcfs").exists() and (v / "sglang" / "qps20" / "live" / "summary.json").is_file()
    assert (v / "validate.csv").read_text().count("\n") == 2  # header and sglang's row
    assert (v / "notes.txt").read_text() == "mine"  # not a validation's: left alone


def test_an_interrupted_validation_keeps_the_runs_that_finished_and_says_where(tmp_path, capsys, fake_live):
    """It said only "interrupted", and left the earlier validation's table as if it were this one's."""
    assert validate(tmp_path, "klpm") == 0
    fake_live["stop_at"] = fake_live["n"] + 2
    code = validate(tmp_path, "fcfs,sglang")
    err = capsys.readouterr().err.strip().splitlines()
    v = tmp_path / "v"
    assert code == 130 and len(err) == 1, err
    assert "run sglang at 20 QPS was interrupted" in err[0] and f"are in {v / 'validate.csv'}" in err[0]
    assert (v / "validate.csv").read_text().splitlines()[1].startswith("fcfs,")
    assert len((v / "validate.csv").read_text().splitlines()) == 2 and not (v / "klpm").exists()


def test_a_signal_held_as_a_validation_run_ends_stops_the_validation_there(tmp_path, capsys, fake_live):
    """It was checked once, after every remaining run (hours, on a GPU), and then said "after its last run"."""
    fake_live["held"] = 1
    code = validate(tmp_path, "fcfs,sglang")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and fake_live["n"] == 1 and len(err) == 1, err
    assert "interrupted after run fcfs at 20 QPS; the 1 of 2 runs that finished are in" in err[0]
    assert len((tmp_path / "v" / "validate.csv").read_text().splitlines()) == 2


def test_a_server_that_dies_starting_keeps_the_validations_finished_runs(tmp_path, capsys, fake_live):
    """A server that died at start-up (a UserError from the run) lost the rows of the runs before it, after
    the earlier table had been removed."""
    fake_live["stop_at"], fake_live["raise"] = 2, UserError("the SGLang server exited with status 1: OOM")
    code = validate(tmp_path, "fcfs,sglang")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "run sglang at 20 QPS: the SGLang server exited with status 1: OOM; the 1 of 2 runs that" in err[0]
    assert (tmp_path / "v" / "validate.csv").read_text().splitlines()[1].startswith("fcfs,")


def test_a_server_lost_during_a_decode_point_stays_lost():
    """A decode point's streams run in threads; a lost server there was turned into bad input (exit 2, nothing
    written) on its way back."""
    from prism.calibration import measure as measuring

    class Gone:
        def flush(self):
            pass

        def stream(self, *a, **k):
            raise measuring.ServerLost("the server at http://x stopped answering (ConnectionResetError: reset)")

    m = measuring.Measurer(Gone(), measuring.Plan(decode_steps=4), vocab=measuring.FIRST_ID + 1000)
    with pytest.raises(measuring.ServerLost):
        m.decode_once(2, 8)


@pytest.mark.parametrize("stop", ["lost", "interrupted"])
def test_calibrate_measure_keeps_the_points_measured_when_it_stops_early(tmp_path, capsys, monkeypatch, stop):
    """Every point measured was lost to a Ctrl-C or to the server's death, which also exited 2 (bad input)."""
    from prism.calibration import measure as measuring
    from prism.cli.calibrate import main

    def measure(url, plan, vocab, seed, log, rows):
        rows.append(measuring.Row("prefill", 1, 128, 0, None, 0.01, [0.01]))
        rows.append(measuring.Row("prefill", 1, 512, 0, None, 0.03, [0.03]))
        if stop == "lost":
            raise measuring.ServerLost("the server at http://x stopped answering (ConnectionRefusedError: ...)")
        raise KeyboardInterrupt

    monkeypatch.setattr(measuring, "measure", measure)
    out = tmp_path / "m.csv"
    code = main(["measure", "--url", "http://127.0.0.1:9", "-o", str(out), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == (1 if stop == "lost" else 130) and len(err) == 1, err
    assert f"the 2 points measured are in {out}" in err[0]
    assert len(out.read_text().splitlines()) == 3
