"""Results on disk: written whole or not at all, a run folder never mixes runs, Ctrl-C leaves a partial
summary, sweeps lock their folder, merge compatible earlier sweeps and re-run a truncated run."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.cli.sim import main as sim_main
from prism.errors import UserError
from prism.metrics import RecordStream, RequestRecord, csv_float, csv_lines, linear_percentiles, write_requests_csv
from prism.output import atomic_path, prepare_run_dir, write_atomic_text
from processes import alive, as_from_a_terminal, descendants

SMALL = ["--set", "trace.num_requests=30"]

# Runs prism-sim in a child process that stops at a chosen point (after N finished requests, or in the
# middle of writing a file whose name contains HANG_IN), touches MARK and waits: the test then signals it and
# touches GO (a signal that is not held ends the wait at once; a held one lets it go on at GO).
DRIVER = textwrap.dedent("""
    import os, sys, time, pathlib
    mark, after, hang_in = os.environ["MARK"], int(os.environ.get("AFTER", "0")), os.environ.get("HANG_IN", "")

    def stop():
        pathlib.Path(mark).touch()
        go, deadline = pathlib.Path(mark + ".go"), time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    if after:  # the engine's own hook (it is compiled: prism/native.py), told of each request it finishes
        from prism.sim import instance
        init, n = instance.Instance.__init__, [0]
        def __init__(self, index, env, spec, on_finish, *a, **k):
            def finished(seq):
                on_finish(seq)
                n[0] += 1
                if n[0] == after:
                    stop()
            init(self, index, env, spec, finished, *a, **k)
        instance.Instance.__init__ = __init__
    if hang_in:
        write_text = pathlib.Path.write_text
        def _write_text(self, data, *a, **k):
            if hang_in in self.name:
                with open(self, "w") as f:
                    f.write(data[: len(data) // 2])
                stop()
            return write_text(self, data, *a, **k)
        pathlib.Path.write_text = _write_text
    from prism.cli.sim import main
    sys.exit(main(sys.argv[1:]))
""")


def _stopped_run(tmp_path, argv, sig, group=False, **env):
    """Start the driver, wait until it stops where asked, send ``sig`` (to its whole process group: ``group``);
    return (exit code, stderr)."""
    code, err, _ = _signalled(tmp_path, argv, sig, group, **env)
    return code, err


def _signalled(tmp_path, argv, sig, group=False, **env):
    """As :func:`_stopped_run`, also returning the pids of the driver's descendants when the signal went."""
    mark, go = tmp_path / "mark", tmp_path / "mark.go"
    mark.unlink(missing_ok=True)
    go.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, *argv], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "MARK": str(mark), **{k: str(v) for k, v in env.items()}},
                            start_new_session=group, preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    children = descendants(proc.pid)
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    time.sleep(0.2)  # delivered before the wait may end
    go.touch()
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, children


def _sim(out, *extra):
    return ["--trace", "zipf", "--method", "fcfs", *SMALL, "--no-progress", "--out", str(out), *extra]


def test_complete_run_says_so(tmp_path, capsys):
    assert sim_main(_sim(tmp_path / "run")) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["complete"] is True
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]  # no temporary files left


def test_sigkill_mid_run_leaves_no_stale_summary(tmp_path, capsys):
    out = tmp_path / "run"
    assert sim_main(_sim(out)) == 0  # an earlier, complete run in the folder
    code, _ = _stopped_run(tmp_path, _sim(out, "--qps", "30"), signal.SIGKILL, AFTER=10)
    assert code == -signal.SIGKILL
    # the new run's requests.csv is there (streamed), the old run's summary is not beside it
    assert (out / "requests.csv").exists() and not (out / "summary.json").exists()


STOPPING = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]  # Ctrl-C, kill, a closed terminal: all alike


def test_sigint_names_the_partial_timeline_it_keeps(tmp_path):
    """A --timeline run stopped mid-way keeps its timeline (of what it simulated) and its one line says where."""
    out = tmp_path / "run"
    code, err, _ = _signalled(tmp_path, _sim(out, "--timeline"), signal.SIGINT, AFTER=12)
    assert code == 128 + signal.SIGINT, err
    err = err.strip()
    assert len(err.splitlines()) == 1 and f"the timeline in {out / 'timeline.json'}" in err, err
    assert json.loads((out / "timeline.json").read_text())["otherData"]["complete"] is False


@pytest.mark.parametrize("sig", STOPPING)
def test_sigint_writes_partial_summary(tmp_path, sig):
    """Ctrl-C, SIGTERM or SIGHUP keeps the finished requests and writes the partial summary; the exit status is
    the shell's for that signal (128 + its number: 130, 143, 129)."""
    out = tmp_path / "run"
    code, err, children = _signalled(tmp_path, _sim(out), sig, AFTER=12)
    assert code == 128 + sig, err
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "interrupted after 12 of 30 requests" in err and str(out / "summary.json") in err
    assert "complete: false" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["num_requests"] == 12
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == 12 and [int(r["id"]) for r in rows] == sorted(int(r["id"]) for r in rows)
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "summary.json"]
    assert alive(children) == []


@pytest.mark.parametrize("sig", STOPPING)
def test_sigint_after_the_run_finished_writes_it_whole(tmp_path, sig):
    """Ctrl-C (or SIGTERM, SIGHUP) while a finished run's files are being written waits for them: both whole,
    the summary complete, and the exit says it was interrupted (a requests.csv without its summary would read
    as a killed run)."""
    out = tmp_path / "run"
    code, err = _stopped_run(tmp_path, _sim(out), sig, HANG_IN="summary")
    assert code == 128 + sig
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "interrupted after the run finished" in err and "complete: true" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["num_requests"] == 30
    assert len(list(csv.DictReader((out / "requests.csv").open()))) == 30
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "summary.json"]


def test_sigint_while_summarizing_a_finished_run_keeps_it_whole(monkeypatch):
    """Ctrl-C while a finished simulation's summary is computed (the served-order reference can take a
    while on a long trace) waits for it: the interruption carries the whole result."""
    from prism.settings import merge_flags, settings_from
    from prism.sim import run as sim_run

    reference = sim_run.Replay._served_rate

    def interrupted_reference(self):
        signal.raise_signal(signal.SIGINT)
        return reference(self)

    monkeypatch.setattr(sim_run.Replay, "_served_rate", interrupted_reference)
    spec = settings_from(merge_flags({}, ["trace.num_requests=30"], method="fcfs"), "test").resolve("zipf")
    with pytest.raises(KeyboardInterrupt) as e:  # caught as such: a bare one would end the test session
        sim_run.simulate(spec, served_reference=True)
    assert isinstance(e.value, sim_run.SimInterrupted), "Ctrl-C cut the summary of a finished run short"
    assert e.value.result.summary["complete"] is True and len(e.value.result.records) == 30
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the usual Ctrl-C again


def test_sigkill_while_writing_summary_leaves_no_truncated_summary(tmp_path, capsys):
    out = tmp_path / "run"
    code, _ = _stopped_run(tmp_path, _sim(out), signal.SIGKILL, HANG_IN="summary")
    assert code == -signal.SIGKILL
    assert not (out / "summary.json").exists()  # half of it is in a temporary file, never under this name
    assert len(list(csv.DictReader((out / "requests.csv").open()))) == 30
    assert [p.name for p in out.glob(".summary.*.tmp.json")]
    assert sim_main(_sim(out)) == 0  # the next run into the folder clears the leftover
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "summary.json"]


def _sweep(out, methods="fcfs", qps="20", *extra):
    return ["sweep", "--trace", "zipf", "--methods", methods, "--qps", qps, *SMALL, "--workers", "1",
            "--no-belady", "--no-progress", "--out", str(out), *extra]


def _rows(out, name="summary.csv"):
    return [(r["method"], float(r["qps"])) for r in csv.DictReader((out / name).open())]


def test_sigint_mid_sweep_says_what_is_done_and_a_rerun_finishes(tmp_path, capsys):
    out = tmp_path / "sw"
    code, err = _stopped_run(tmp_path, _sweep(out, "fcfs", "20,30"), signal.SIGINT, AFTER=40)  # in the 2nd run
    assert code == 130
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"interrupted with 1 of 2 runs done in {out}" in err
    assert _rows(out) == [("fcfs", 20.0)]
    assert sim_main(_sweep(out, "fcfs", "20,30")) == 0
    assert sorted(_rows(out)) == [("fcfs", 20.0), ("fcfs", 30.0)]


def _files(folder):
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("sig,group", [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGHUP, False),
                                       (signal.SIGHUP, True), (signal.SIGINT, True)])
def test_a_signal_stops_a_pooled_sweep_with_its_workers(tmp_path, capsys, sig, group):
    """SIGTERM or SIGHUP to a sweep's parent alone, or any of them to its whole process group: the sweep says
    what is done (one line, 128 + the signal), its pool workers end with it (none runs on, none writes after
    the lock is gone), and the same command then runs the rest, leaving no temporary file behind."""
    out = tmp_path / "sw"
    argv = [*_sweep(out, "fcfs", "20,30,40"), "--workers", "2"]  # a worker stops in its first run
    code, err, children = _signalled(tmp_path, argv, sig, group, AFTER=12)
    assert len(children) >= 2  # the pool's workers, all stopped in or before their first run
    assert code == 128 + sig, err
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "interrupted with 0 of 3 runs done" in err and "the same command runs the rest" in err
    assert alive(children) == []
    with open(out / ".sweep.lock") as f:  # nobody holds the lock any more
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    before = _files(out)
    time.sleep(0.5)
    assert _files(out) == before  # nothing written once the sweep ended
    assert not list(out.glob("runs/*/*/summary.json"))
    assert sim_main(argv) == 0
    assert sorted(_rows(out)) == [("fcfs", 20.0), ("fcfs", 30.0), ("fcfs", 40.0)]
    assert not [p for p in out.rglob(".*") if p.name != ".sweep.lock"]


def test_sigterm_mid_sweep_in_one_process_keeps_the_finished_runs(tmp_path, capsys):
    out = tmp_path / "sw"
    code, err = _stopped_run(tmp_path, _sweep(out, "fcfs", "20,30"), signal.SIGTERM, AFTER=40)  # in the 2nd run
    assert code == 143 and f"interrupted with 1 of 2 runs done in {out}" in err, err
    assert _rows(out) == [("fcfs", 20.0)]
    assert sim_main(_sweep(out, "fcfs", "20,30")) == 0
    assert sorted(_rows(out)) == [("fcfs", 20.0), ("fcfs", 30.0)]


def test_truncated_run_summary_is_run_again(tmp_path, capsys):
    out = tmp_path / "sw"
    assert sim_main(_sweep(out, "fcfs", "20,30")) == 0
    run = out / "runs" / "fcfs" / "qps20-seed0" / "summary.json"
    kept = out / "runs" / "fcfs" / "qps30-seed0" / "summary.json"
    first_kept = kept.read_text()
    run.write_text(run.read_text()[:100])  # what a kill during a non-atomic write used to leave
    assert sim_main(_sweep(out, "fcfs", "20,30")) == 0
    assert json.loads(run.read_text())["complete"] is True
    assert kept.read_text() == first_kept  # a finished run is not simulated again
    assert sorted(_rows(out)) == [("fcfs", 20.0), ("fcfs", 30.0)]


@pytest.fixture(scope="module")
def _finished_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "sw"
    assert sim_main(_sweep(out, "fcfs", "20,30")) == 0
    return out


@pytest.fixture
def finished_sweep(_finished_sweep, tmp_path):
    """A copy of a finished sweep of fcfs at 20 and 30 QPS (made once: the tests damage their own copy)."""
    return shutil.copytree(_finished_sweep, tmp_path / "sw")


def _damage_missing_field(run):
    s = json.loads((run / "summary.json").read_text())
    del s["ttft_s"]
    (run / "summary.json").write_text(json.dumps(s))


def _damage_field_type(run):
    s = json.loads((run / "summary.json").read_text())
    s["hit_rate"] = "high"
    (run / "summary.json").write_text(json.dumps(s))


def _damage_not_an_object(run):
    (run / "summary.json").write_text("[1, 2]")


def _damage_csv_cut(run):
    data = (run / "requests.csv").read_bytes()
    (run / "requests.csv").write_bytes(data[: len(data) // 2])


def _damage_csv_gone(run):
    (run / "requests.csv").unlink()


def _damage_leftover(run):  # a killed sweep: its worker's temporary file, and no requests.csv or summary
    (run / "summary.json").unlink()
    (run / "requests.csv").rename(run / ".requests.4242.tmp.csv")
    (run.parent.parent.parent / ".summary.4242.tmp.csv").write_text("half")


@pytest.mark.parametrize("damage", [_damage_missing_field, _damage_field_type, _damage_not_an_object,
                                    _damage_csv_cut, _damage_csv_gone, _damage_leftover])
def test_a_damaged_run_is_run_again(finished_sweep, capsys, damage):
    """A run the sweep cannot read whole (its summary of the right settings but missing a field or holding
    one of the wrong type, not a JSON object; its requests.csv cut short or gone; a killed writer's leftovers)
    is not done: the rerun simulates it again and leaves the finished one alone."""
    out = finished_sweep
    run, kept = out / "runs" / "fcfs" / "qps20-seed0", out / "runs" / "fcfs" / "qps30-seed0"
    first_kept = (kept / "summary.json").read_text()
    damage(run)
    assert sim_main(_sweep(out, "fcfs", "20,30")) == 0, capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["complete"] is True
    assert len(list(csv.DictReader((run / "requests.csv").open()))) == 30
    assert (kept / "summary.json").read_text() == first_kept
    assert sorted(_rows(out)) == [("fcfs", 20.0), ("fcfs", 30.0)]
    assert not [p for p in out.rglob(".*") if p.name != ".sweep.lock"]


@pytest.mark.parametrize("where,make", [
    ("runs/fcfs/qps20-seed0/summary.json", lambda p: p.mkdir()),
    ("runs/fcfs/qps20-seed0/requests.csv", lambda p: p.mkdir()),
    ("runs", lambda p: p.write_text("not a folder")),
    ("runs/fcfs", lambda p: p.write_text("not a folder")),
])
def test_a_run_folder_the_sweep_cannot_write_is_refused_in_one_line(finished_sweep, capsys, where, make):
    """A folder where a run's file goes, or a file where its folder goes: one line naming the path, before any
    run (a run of the sweep, done or not, is not simulated)."""
    out = finished_sweep
    shutil.rmtree(out / "runs")
    target = out / where
    target.parent.mkdir(parents=True, exist_ok=True)
    make(target)
    summary_csv = (out / "summary.csv").read_text()
    code = sim_main(_sweep(out, "fcfs", "20,30"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(target) in err
    assert (out / "summary.csv").read_text() == summary_csv


@pytest.fixture
def immutable():
    """``immutable(folder)``: a folder nobody may write in, root included (chattr +i; undone after the test)."""
    made = []

    def make(folder):
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not allowed here (needs CAP_LINUX_IMMUTABLE on ext4 or the like)")
        made.append(folder)

    yield make
    for folder in made:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_run_folder_is_refused_or_left_alone(finished_sweep, capsys, immutable):
    """A run folder the sweep may not write in: a finished run in it is read and kept; one to run again is
    refused with one line naming the folder, before any run."""
    out = finished_sweep
    done, todo = out / "runs" / "fcfs" / "qps20-seed0", out / "runs" / "fcfs" / "qps30-seed0"
    immutable(done)
    assert sim_main(_sweep(out, "fcfs", "20,30")) == 0  # nothing to write there
    (todo / "summary.json").unlink()
    immutable(todo)
    summary_csv = (out / "summary.csv").read_text()
    code = sim_main(_sweep(out, "fcfs", "20,30"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{todo}: cannot write in {todo}" in err, err
    assert (out / "summary.csv").read_text() == summary_csv


def test_sigkill_while_writing_summary_csv_keeps_the_old_one(tmp_path, capsys):
    out = tmp_path / "sw"
    assert sim_main(_sweep(out, "fcfs", "20")) == 0
    before = (out / "summary.csv").read_text()
    code, _ = _stopped_run(tmp_path, _sweep(out, "fcfs", "30"), signal.SIGKILL, HANG_IN="summary.")
    assert code == -signal.SIGKILL
    assert (out / "summary.csv").read_text() == before  # whole, and not shorter than before
    # the lock died with the process: the next sweep runs and finishes both
    assert sim_main(_sweep(out, "fcfs", "30")) == 0
    assert sorted(_rows(out)) == [("fcfs", 20.0), ("fcfs", 30.0)]


def test_two_sweeps_of_other_methods_merge(tmp_path, capsys):
    out = tmp_path / "sw"
    assert sim_main(_sweep(out, "fcfs", "20")) == 0
    assert sim_main(_sweep(out, "sglang", "20,30", "--cdf-qps", "30")) == 0
    assert "merged with an earlier sweep" in capsys.readouterr().out
    want = [("fcfs", 20.0), ("sglang", 20.0), ("sglang", 30.0)]
    assert _rows(out) == want and _rows(out, "aggregate.csv") == want
    assert not (out / "ttft_cdf_qps20.png").exists() and (out / "ttft_cdf_qps30.png").exists()
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["runs"] == [["fcfs", 20.0, 0], ["sglang", 20.0, 0], ["sglang", 30.0, 0]]


def test_sweep_of_other_settings_is_refused_unless_forced(tmp_path, capsys):
    out = tmp_path / "sw"
    assert sim_main(_sweep(out, "fcfs", "20")) == 0
    capsys.readouterr()
    other = [*_sweep(out, "sglang", "30"), "--set", "engine.max_running_requests=8"]
    before = (out / "summary.csv").read_text()
    assert sim_main(other) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config differ" in err and "--force" in err and str(out) in err
    assert (out / "summary.csv").read_text() == before
    assert sim_main([*other, "--force"]) == 0
    assert _rows(out) == [("sglang", 30.0)] and _rows(out, "aggregate.csv") == [("sglang", 30.0)]
    assert not (out / "runs" / "fcfs").exists() and not (out / "ttft_cdf_qps20.png").exists()


def test_a_refused_theory_keeps_the_folders_theory(tmp_path, capsys):
    """prism-theory of other settings into a folder is refused before the folder's theory.* files go."""
    from prism.cli.theory import main as theory_main

    out = tmp_path / "th"
    argv = ["--trace", "zipf", "--set", "trace.num_requests=30", "--workers", "1", "--out", str(out)]
    assert theory_main([*argv, "--qps", "10,20"]) == 0
    before = {n: (out / n).read_bytes() for n in ("theory.csv", "theory.json", "theory.png")}
    assert theory_main([*argv, "--qps", "10", "--set", "engine.max_running_requests=8"]) == 2
    assert "config differ" in capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in before} == before


def test_a_forced_sweep_leaves_no_file_of_another_kind(tmp_path, capsys):
    """--force replaces whatever sweep the folder held: an ablation's or a theory's tables and plots go too
    (they would describe runs that are gone)."""
    from prism.cli.theory import main as theory_main

    out = tmp_path / "sw"
    assert sim_main(["sweep", "--trace", "zipf", "--methods", "klpm", "--qps", "20", *SMALL, "--workers", "1",
                     "--no-progress", "--out", str(out), "--ablate"]) == 0
    assert (out / "ablation.csv").exists() and list(out.glob("ablation_qps*.png"))
    assert sim_main(_sweep(out, "klpm", "20", "--force")) == 0
    assert not (out / "ablation.csv").exists() and not (out / "ablation.json").exists()
    assert not list(out.glob("ablation_qps*.png"))
    th = tmp_path / "th"
    assert theory_main(["--trace", "zipf", *SMALL, "--set", "engine.max_running_requests=8", "--qps", "10",
                        "--workers", "1", "--out", str(th)]) == 0
    assert sim_main(_sweep(th, "fcfs", "20", "--force")) == 0
    assert not any((th / n).exists() for n in ("theory.csv", "theory.json", "theory.png"))
    capsys.readouterr()


def test_a_single_run_and_a_sweep_never_share_a_folder(tmp_path, capsys):
    """A sweep into a run's folder is refused (its summary.json would read as a result of the sweep), unless
    --force, which removes the run; a run into a sweep's folder is refused."""
    out = tmp_path / "both"
    run = ["--trace", "zipf", *SMALL, "--no-progress", "--out", str(out)]
    assert sim_main(run) == 0
    assert sim_main(_sweep(out)) == 2
    assert "holds a single run (summary.json)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "summary.json"]
    assert sim_main(_sweep(out, "fcfs", "20", "--force")) == 0
    assert not (out / "requests.csv").exists() and (out / "summary.csv").exists()
    capsys.readouterr()
    assert sim_main(run) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds a sweep (sweep.json)" in err, err
    assert not (out / "summary.json").exists()


def test_sigint_while_a_fleet_draws_its_memory_plot_keeps_the_plot(tmp_path, capsys, monkeypatch):
    """The memory plot is written with the summary, interruptions held: a folder whose summary says complete
    holds every file the run writes."""
    from prism.sim import fleet_plots

    draw = fleet_plots.plot_memory

    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        return draw(*args, **kwargs)
    monkeypatch.setattr(fleet_plots, "plot_memory", interrupted)
    out = tmp_path / "fleet"
    assert sim_main(["--trace", "multimodel", "--set", "trace.num_requests=60", "--sharing", "dedicated",
                     "--no-progress", "--out", str(out)]) == 128 + signal.SIGINT
    assert "interrupted after the run finished" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["complete"] is True
    assert (out / "memory.png").stat().st_size > 0


def test_second_concurrent_sweep_is_refused(tmp_path, capsys):
    out = tmp_path / "sw"
    out.mkdir()
    with open(out / ".sweep.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        assert sim_main(_sweep(out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another sweep (pid 4242)" in err
    assert not (out / "summary.csv").exists()
    assert sim_main(_sweep(out)) == 0  # released
    assert (out / ".sweep.lock").read_bytes() == b""  # the pid went with the sweep: two alike leave alike folders


def test_sweep_without_manifest_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "sw"
    out.mkdir()
    (out / "summary.csv").write_text("method,qps\nold,1\n")
    assert sim_main(_sweep(out)) == 2
    assert "without sweep.json" in capsys.readouterr().err
    assert (out / "summary.csv").read_text() == "method,qps\nold,1\n"


def test_atomic_helpers(tmp_path):
    target = tmp_path / "a.json"
    write_atomic_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("summary.json", "requests.csv", "keep.txt"):
        (folder / name).write_text("x")
    prepare_run_dir(folder, ("summary.json", "requests.csv"))
    assert [p.name for p in folder.iterdir()] == ["keep.txt"]
    with pytest.raises(UserError, match="file.txt is a file"):
        (tmp_path / "file.txt").write_text("")
        prepare_run_dir(tmp_path / "file.txt" / "x", ())


def test_a_disk_that_fills_up_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    """ENOSPC while writing: the atomic writer and the streamed requests.csv name the file they were writing
    (the old file stays whole, no temporary file is left); an OSError about another file (an input read in the
    block) keeps its own name; whatever else escapes a command is one line, exit status 2."""
    import errno

    from prism.cli.common import entry_point

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    target = tmp_path / "a.csv"
    write_atomic_text(target, "old")
    with pytest.raises(UserError, match=r"a\.csv: cannot write: No space left on device"), atomic_path(target):
        raise full
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.csv"]
    with pytest.raises(FileNotFoundError), atomic_path(target):
        open(tmp_path / "input.yaml")
    stream = RecordStream(tmp_path / "requests.csv", flush_every=1)

    def no_room(text):
        raise full
    monkeypatch.setattr(stream._f, "write", no_room)
    with pytest.raises(UserError, match=r"requests\.csv: cannot write: No space left on device"):
        stream(RequestRecord(0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.2, 5, 0, 2, "default", False))

    @entry_point("prism-x")
    def gone(argv):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/tmp/out/x.csv")
    assert gone([]) == 2
    assert capsys.readouterr().err == "prism-x: error: /tmp/out/x.csv: No such file or directory\n"


def test_ctrl_c_while_a_command_imports_is_one_line(capsys, monkeypatch):
    """A console script imports its command's module (numpy and the rest) before the command's own handler
    runs: a Ctrl-C then ends as one during the run does."""
    import importlib

    from prism.cli import launch

    def interrupted(name):
        raise KeyboardInterrupt
    monkeypatch.setattr(importlib, "import_module", interrupted)
    with pytest.raises(SystemExit) as stop:
        launch.sim()
    assert stop.value.code == 128 + signal.SIGINT
    assert capsys.readouterr().err == "prism-sim: interrupted\n"


@pytest.mark.parametrize("user", [None, "4"])
def test_the_simulator_starts_numpy_with_one_blas_thread_unless_told(monkeypatch, user):
    """prism-sim and prism-trace import their command with OPENBLAS_NUM_THREADS=1 (no spinning BLAS threads at
    numpy's import); a value the user set stays, and the other commands leave it alone."""
    import importlib
    from types import SimpleNamespace

    from prism.cli import launch

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", user or "")  # noted, so that the launcher's value goes after the test
    if user is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    seen = {}

    def command(name):
        seen[name] = os.environ.get("OPENBLAS_NUM_THREADS")
        return SimpleNamespace(main=lambda: None)
    monkeypatch.setattr(importlib, "import_module", command)
    launch.calibrate()
    launch.sim()
    launch.trace()
    assert seen == {"prism.cli.calibrate": user, "prism.cli.sim": user or "1", "prism.cli.trace": user or "1"}


def test_every_console_script_goes_through_the_launcher():
    import tomllib

    root = Path(__file__).resolve().parent.parent
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    from prism.cli import launch
    for name, target in scripts.items():
        module, func = target.split(":")
        assert module == "prism.cli.launch" and callable(getattr(launch, func)), name


def test_a_run_folder_holds_one_run_of_either_engine(tmp_path, capsys):
    """A simulated run into a folder that held a live cluster run (its server logs and plugin files, in
    instance folders too) leaves none of them beside its own files; other files stay."""
    from prism.metrics import SERVER_FILES

    out = tmp_path / "run"
    for folder in (out, out / "instance-0", out / "instance-1"):
        folder.mkdir(parents=True)
        for name in (*SERVER_FILES, "keep.txt"):
            (folder / name).write_text("an earlier live run's")
    assert sim_main(_sim(out)) == 0
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == ["instance-0/keep.txt", "instance-1/keep.txt", "keep.txt", "requests.csv", "summary.json"]
    (out / "instance-1" / "keep.txt").unlink()  # a cluster's folder with nothing of the user's goes whole
    assert sim_main(_sim(out)) == 0
    assert (out / "instance-0").is_dir() and not (out / "instance-1").exists()


@settings(max_examples=2000, deadline=None)
@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64).filter(lambda v: v != 0),
                                 st.sampled_from([0.0, 1.0, 1e-9, 0.1]), st.integers(0, 10**6).map(float)),
                       min_size=1, max_size=300))
def test_a_summarys_percentiles_are_numpys_to_the_last_bit(values):
    """The sort-based percentiles of a summary equal ``np.percentile``'s bit for bit (zero is +0.0 here: numpy
    partitions where this sorts, and the two may pick either zero of a tie)."""
    a = np.array(values)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, as numpy's own
        ours, numpys = linear_percentiles(a.copy()), np.percentile(a, [50, 90, 95, 99])
    assert ours.tobytes() == numpys.tobytes() or (np.isnan(ours).all() and np.isnan(numpys).all())


@settings(max_examples=3000, deadline=None)
@given(v=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(min_value=-2e6, max_value=2e6),
                   st.floats(min_value=-1e-3, max_value=1e-3),
                   st.decimals(min_value=-10**7, max_value=10**7, places=10, allow_nan=False).map(float)))
def test_csv_floats_are_the_rounded_shortest_text(v):
    """Every CSV writes a float as ``repr(round(v, 9))``; its faster form gives the same text for every float
    (times of runs, rates, and the ranges where ``repr`` turns to exponents)."""
    assert csv_float(v) == repr(round(v, 9))


@pytest.mark.parametrize("v", [1e-4, 9.99999999995e-05, 0.00009999999949, 999999.9999999995, 1e6, -1e-4, -0.0,
                               0.0, 5e-10, -5e-10, 123456.123456789, 0.1 + 0.2, 2.5e-9, 1e16, 3.0])
def test_csv_floats_at_the_edges_of_the_fast_form(v):
    assert csv_float(v) == repr(round(v, 9))


_any_float = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=-2e6, max_value=2e6),
                      st.floats(min_value=-1e-3, max_value=1e-3), st.sampled_from([0.0, -0.0, 3.0, 1e-4, 1e6]))
_cell = st.one_of(_any_float, st.integers(-10**12, 10**12), st.booleans(), st.none(),
                  st.text(alphabet=st.sampled_from(list('ab,"\r\n .0é')), max_size=5))


@settings(max_examples=1500, deadline=None)
@given(columns=st.lists(st.one_of(st.just(_any_float), st.just(st.floats(1e-4, 1e5)), st.just(_cell)),
                        min_size=1, max_size=6),
       data=st.data())
def test_a_block_of_rows_is_what_csv_writes_value_by_value(columns, data):
    """requests.csv's rows are formatted a block at a time, a column at once: the lines are what ``csv.writer``
    writes from each value's own text (a float's ``repr(round(v, 9))``, a bool's 1 or 0), for columns of one
    type or mixed, floats in the fast form's range or beyond it, and text the csv module quotes."""
    rows = data.draw(st.lists(st.tuples(*columns), max_size=30))

    def text(v):
        return repr(round(v, 9)) if type(v) is float else ("1" if v else "0") if type(v) is bool else str(v)

    expected: list[str] = []
    writer = csv.writer(type("Lines", (), {"write": staticmethod(expected.append)}))
    for row in rows:
        writer.writerow([text(v) for v in row])
    assert csv_lines(rows, lambda row: row) == expected


@pytest.mark.parametrize("bad", [["--set", "engine.max_total_tokens=10"], ["--set", "engine.warmup_requests=64"],
                                 ["--set", "trace.seed=-5"], ["--set", "trace.seed=abc"], ["--set", "trace.seed=1.5"],
                                 ["--qps", "20,,30"], ["--methods", "fcfs,"]])
def test_sweep_refuses_bad_settings_before_touching_its_folder(tmp_path, capsys, bad):
    """Every setting a sweep's runs would refuse is refused before the folder is made: a sweep.json left
    behind by a sweep that never ran refused the corrected sweep into the folder."""
    out = tmp_path / "sw"
    assert sim_main([*_sweep(out), *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_a_live_server_that_never_answers_leaves_nothing(tmp_path, capsys):
    """A server that accepts connections but never answers: one line once --startup-timeout is spent, and
    nothing written (the server is checked before the run folder is touched)."""
    import socket

    from prism.cli.live import main as live_main

    out = tmp_path / "lv"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        code = live_main(["--trace", "zipf", *SMALL, "--url", f"http://127.0.0.1:{port}", "--startup-timeout", "1",
                          "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "did not become healthy" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("command", [[], ["validate"]])
@pytest.mark.parametrize("url,why", [("http://127.0.0.1:{port}", "nothing listens at http://127.0.0.1:{port}: "
                                                                "connection refused"),
                                     ("http://127.0.0.1", "the URL names no port: http's 80"),
                                     ("http://nosuchhost.invalid:30000", "cannot resolve the host")])
def test_an_unreachable_live_server_is_one_line_at_once(tmp_path, capsys, command, url, why):
    """prism-live and validate on a closed port, a URL without a port (80, where nothing listens here) or a
    host that does not resolve: one line naming --url at once, not the start-up timeout's polling, and nothing
    written (validate has not simulated either)."""
    import socket

    from prism.cli.live import main as live_main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "lv"
    t0 = time.monotonic()
    code = live_main([*command, "--trace", "zipf", *SMALL, "--url", url.format(port=port), "--no-progress",
                      "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "error: --url: " in err and why.format(port=port) in err, err
    assert time.monotonic() - t0 < 60  # the start-up timeout is 300 s
    assert not out.exists()


_names = st.text(alphabet=st.sampled_from(list("ab,\"é\n 0+")), max_size=6)
_record = st.builds(RequestRecord, id=st.integers(0, 10**6), arrival=st.floats(-1, 1e7, allow_nan=False),
                    sent=st.floats(0, 1e3), prefill_start=st.floats(0, 1e-3), prefill_end=st.floats(0, 1e3),
                    first_token=st.floats(0, 1e3), finish=st.floats(0, 1e3), prompt_tokens=st.integers(0, 9999),
                    hit_tokens=st.integers(0, 9999), output_tokens=st.integers(1, 99),
                    lane=st.sampled_from(["", "hot", "cold"]), realigned=st.booleans(),
                    instance=st.none() | st.integers(0, 7), model=st.none() | _names, gpu=st.none() | _names)


@settings(max_examples=200, deadline=None)
@given(records=st.lists(_record, max_size=40), every=st.integers(1, 9), cluster=st.booleans(), fleet=st.booleans(),
       lose=st.booleans(), block=st.integers(1, 8) | st.just(RecordStream.REORDER_BLOCK))
def test_a_streamed_requests_csv_is_put_in_order_as_if_written_whole(tmp_path_factory, records, every, cluster,
                                                                     fleet, lose, block):
    """The stream formats each row once and reorders its own text at the end, ``block`` rows at a time (read
    from the stretch of the file they lie in, or row by row): the file is byte for byte what
    :func:`write_requests_csv` writes from the records (ids repeated or not, names with commas, quotes, line
    breaks and accents); a record the stream never saw (``lose``: Ctrl-C between finishing and streaming) is
    formatted again."""
    d = tmp_path_factory.mktemp("stream")
    stream = RecordStream(d / "requests.csv", flush_every=every, cluster=cluster, fleet=fleet)
    stream.REORDER_BLOCK = block
    for r in records[:-1] if lose and records else records:
        stream(r)
    stream.finish(records)
    write_requests_csv(records, d / "whole.csv", cluster=cluster, fleet=fleet)
    assert (d / "requests.csv").read_bytes() == (d / "whole.csv").read_bytes()
    assert sorted(p.name for p in d.iterdir()) == ["requests.csv", "whole.csv"]
