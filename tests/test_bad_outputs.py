"""Unusable output locations, for every command that writes: one line naming the path, exit status 2, no
traceback, nothing written, and the check comes before any work (a simulation, a measurement, a server)."""

from __future__ import annotations

import os

import pytest

from prism.cli.calibrate import main as calibrate_main
from prism.cli.live import main as live_main
from prism.cli.sim import main as sim_main
from prism.cli.theory import main as theory_main
from prism.cli.trace import main as trace_main

SMALL = ["--set", "trace.num_requests=30"]

# a folder is expected: {tmp} is the test's folder, which holds a regular file "file.txt" and a folder "adir"
FOLDER_PLACES = {
    "proc": "/proc/prism-out",
    "proc-nested": "/proc/self/prism/out",
    "sys": "/sys/kernel/prism-out",
    "under-a-file": "{tmp}/file.txt/out",
    "a-file": "{tmp}/file.txt",
}
FOLDER_WRITERS = {
    "prism-sim": (sim_main, lambda o: ["--trace", "zipf", *SMALL, "--no-progress", "--out", o]),
    "prism-sim sweep": (sim_main, lambda o: ["sweep", "--trace", "zipf", "--methods", "sglang", "--qps", "20",
                                             *SMALL, "--workers", "1", "--no-progress", "--out", o]),
    "prism-theory": (theory_main, lambda o: ["--trace", "zipf", "--method", "fcfs", "--qps", "10", *SMALL,
                                             "--workers", "1", "--out", o]),
    "prism-live": (live_main, lambda o: ["--trace", "zipf", *SMALL, "--url", "http://127.0.0.1:9",
                                         "--no-progress", "--out", o]),
    "prism-live validate": (live_main, lambda o: ["validate", "--trace", "zipf", *SMALL, "--methods", "sglang", "--url",
                                                  "http://127.0.0.1:9", "--no-progress", "--out", o]),
}
# a file is expected
FILE_PLACES = {
    "proc": "/proc/prism-out.x",
    "sys": "/sys/kernel/prism-out.x",
    "under-a-file": "{tmp}/file.txt/out.x",
    "a-folder": "{tmp}/adir",
    "trailing-slash": "{tmp}/new/",
}
FILE_WRITERS = {
    "prism-trace gen": (trace_main, lambda o: ["gen", "zipf", "--set", "num_requests=30", "-o", o]),
    "prism-calibrate fit": (calibrate_main, lambda o: ["fit", "{tmp}/m.csv", "-o", o]),
    "prism-calibrate synth": (calibrate_main, lambda o: ["synth", "--rows", "10", "-o", o]),
    "prism-calibrate measure": (calibrate_main, lambda o: ["measure", "--url", "http://127.0.0.1:9", "-q",
                                                           "--timeout", "0.5", "-o", o]),
}

CASES = ([pytest.param(w, p, id=f"{w}:{p}") for w in FOLDER_WRITERS for p in FOLDER_PLACES]
         + [pytest.param(w, p, id=f"{w}:{p}") for w in FILE_WRITERS for p in FILE_PLACES])


def _listing(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files}


@pytest.mark.parametrize("writer,place", CASES)
def test_bad_output_location(tmp_path, capsys, writer, place):
    (tmp_path / "file.txt").write_text("not a folder\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "m.csv").write_text("kind,batch_size,new_tokens,cached_tokens,context_tokens,seconds\n"
                                    "prefill,1,128,0,,0.01\n")
    main, argv = {**FOLDER_WRITERS, **FILE_WRITERS}[writer]
    where = {**FOLDER_PLACES, **FILE_PLACES}[place].format(tmp=tmp_path)
    before = _listing(tmp_path)
    code = main([a.format(tmp=tmp_path) for a in argv(where)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert where.rstrip("/") in err, err
    if place == "under-a-file":  # the message names the file in the way, not the path asked for
        assert f"{tmp_path / 'file.txt'} is a file, not a folder" in err, err
    assert _listing(tmp_path) == before  # nothing written
    assert not os.path.lexists(where) or place in ("a-file", "a-folder")


def test_residual_plot_place_is_checked_too(tmp_path, capsys):
    (tmp_path / "m.csv").write_text("kind\n")
    (tmp_path / "p.residuals.png").mkdir()
    code = calibrate_main(["fit", str(tmp_path / "m.csv"), "-o", str(tmp_path / "p.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "p.residuals.png: is a folder" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("name", ["summary.json", "requests.csv"])
def test_a_folder_where_a_run_file_goes(tmp_path, capsys, name):
    (tmp_path / "run" / name).mkdir(parents=True)
    code = sim_main(["--trace", "zipf", *SMALL, "--no-progress", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"run/{name}: is a folder, expected a file" in err and len(err.splitlines()) == 1


def test_a_folder_where_a_sweep_file_goes(tmp_path, capsys):
    (tmp_path / "sw" / "summary.csv").mkdir(parents=True)
    code = sim_main(["sweep", "--trace", "zipf", "--methods", "sglang", "--qps", "20", *SMALL, "--workers", "1",
                     "--no-progress", "--out", str(tmp_path / "sw")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "summary.csv: is a folder" in err and len(err.splitlines()) == 1
