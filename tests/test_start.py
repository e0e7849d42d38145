"""``prism-sim`` starts lean: a plain run imports none of the heavy libraries that only some commands need
(numba for QAS, scipy for sweep statistics, matplotlib for plots). Measured in a fresh
interpreter, since this test process has imported everything already. (The time it saves is measured by
benchmarks/bench_start.py, not here.)"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("matplotlib", "scipy", "numba")

PROBE = """
import json, sys
import prism.cli.sim as cli
heavy = lambda: sorted(m for m in {heavy!r} if m in sys.modules)
after_import = heavy()
code = cli.main(["--trace", "zipf", "--method", "{method}", "--set", "trace.num_requests=64", "--no-progress",
                 "--out", "run"])
after_run = heavy()
import prism.sim.plots  # the probe sees an import when one happens
print(json.dumps([code, after_import, after_run, heavy()]))
"""


def probe(method: str, cwd) -> list:
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, method=method)], cwd=cwd,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_plain_run_imports_no_heavy_module(tmp_path):
    for method in ("fcfs", "sglang", "prism"):  # prism: a short run interprets QAS's kernels
        code, after_import, after_run, after_plots = probe(method, tmp_path)
        assert code == 0
        assert after_import == [] and after_run == [], method
        assert "matplotlib" in after_plots
    assert (tmp_path / "run" / "requests.csv").stat().st_size > 0


def test_a_run_imports_only_its_own_trace_kinds_generator(tmp_path):
    probe_kinds = """
import json, sys
import prism.cli.sim as cli
code = cli.main(["--trace", "zipf", "--method", "fcfs", "--set", "trace.num_requests=16", "--no-progress",
                 "--out", "run"])
kinds = ("zipf", "agent", "mooncake", "prefix_groups")
print(json.dumps([code, [k for k in kinds if "prism.traces." + k in sys.modules]]))
"""
    out = subprocess.run([sys.executable, "-c", probe_kinds], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [0, ["zipf"]]


def test_compiled_qas_loads_without_scipy_linalg_and_leaves_blas_to_those_who_loaded_it(tmp_path):
    """The compiled QAS round runs without numba importing scipy.linalg (its BLAS probe, 0.2 s) and leaves
    no trace of the probe's answer in ``sys.modules``; where scipy.linalg is loaded first numba keeps BLAS."""
    probe_blas = """
import json, sys
{first}
from prism.policies.qas_compiled import CompiledQAS
from prism.live.hooks import prime
prime(CompiledQAS())  # compiled kernels: a live server's QAS
import numba.np.arraymath as arraymath
blocked = sys.modules.get("scipy.linalg.cython_blas", 0) is None
print(json.dumps(["scipy.linalg" in sys.modules, arraymath._HAVE_BLAS, blocked]))
"""
    for first, expect in (("", [False, False, False]), ("import scipy.linalg", [True, True, False])):
        out = subprocess.run([sys.executable, "-c", probe_blas.format(first=first)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout.strip().splitlines()[-1]) == expect, first
