"""The simulator's modules compiled by the install (``prism/native.py``, mypyc) run exactly as their source: the
same files, byte for byte, on every run of ``benchmarks/output_digests.py`` and on a cluster with its timeline;
and the guard runs the source where the build is stale or switched off."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prism import native

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
compiled = pytest.mark.skipif(native.status() != "compiled",
                              reason=f"the compiled modules are {native.status()} (pip install -e . builds them)")


def _python(switch: str, *argv: str) -> str:
    """The standard output of ``python ARGV`` with the compiled modules on (``1``) or off (``0``)."""
    env = {**os.environ, native.SWITCH: switch}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_build_is_never_stale_in_the_tests():
    """Where the install compiled the modules, the tests run them (an edit since: ``pip install -e .``)."""
    assert native.status() in ("compiled", "absent"), "the compiled modules are stale: pip install -e . rebuilds them"


@compiled
def test_the_switch_picks_the_compiled_modules_or_their_source():
    code = "import prism, importlib; print(prism.native.status(), *(importlib.import_module(m).__file__ " \
           "for m in prism.native.MODULES))"
    on, off = _python("1", "-c", code).split(), _python("0", "-c", code).split()
    assert on[0] == "compiled" and all(f.endswith(SUFFIX) for f in on[1:])
    assert off[0] == "off" and all(f.endswith(".py") for f in off[1:])


@compiled
def test_compiled_runs_write_the_sources_bytes():
    """All 35 digests (every scheduler, eviction key, pool, workload and sharing scheme) equal."""
    on, off = _python("1", "benchmarks/output_digests.py"), _python("0", "benchmarks/output_digests.py")
    assert len(on.splitlines()) == 35 and on == off


@compiled
def test_a_compiled_cluster_and_its_timeline_are_the_sources(tmp_path):
    code = ("import sys; from prism.cli.sim import main; sys.exit(main(['--trace', 'zipf', '--set', "
            "'trace.num_requests=300', '--instances', '3', '--router', 'cache_aware', '--method', 'prism', "
            "'--no-progress', '--timeline', '--out', sys.argv[1]]))")
    for switch in ("1", "0"):
        _python(switch, "-c", code, str(tmp_path / switch))
    files = sorted(p.name for p in (tmp_path / "1").iterdir())
    assert "requests.csv" in files and any("timeline" in f for f in files)
    for name in files:
        on, off = (tmp_path / "1" / name).read_bytes(), (tmp_path / "0" / name).read_bytes()
        if name == "summary.json":  # its wall time is the process's own
            on, off = (re.sub(rb'"wall_s": [0-9.e-]+', b"", text) for text in (on, off))
        assert on == off, name


def _install(tmp_path: Path, sources: dict[str, bytes], shims: bool = True, library: bool = True) -> dict[str, str]:
    """A fake install: each module's source, its compiled shim and the group's library where asked."""
    paths = {}
    for name, data in sources.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_bytes(data)
        if shims:
            path.with_name(path.stem + SUFFIX).write_bytes(b"")
        paths[name] = str(path)
    if library:
        (tmp_path / (native.group_name(sources).rpartition(".")[2] + "__mypyc" + SUFFIX)).write_bytes(b"")
    return paths


def test_the_guard_runs_the_source_of_a_stale_build(tmp_path):
    sources = {name: f"# {name}\n".encode() for name in native.MODULES}
    paths = _install(tmp_path, sources)
    assert native.decide(paths, str(tmp_path), "1") == "compiled"
    assert native.decide(paths, str(tmp_path), "0") == "off"
    Path(paths["prism.sim.clock"]).write_bytes(b"# edited since the build\n")
    assert native.decide(paths, str(tmp_path), "1") == "stale"


def test_a_build_without_its_library_is_stale_and_one_never_built_is_absent(tmp_path):
    sources = {name: b"pass\n" for name in native.MODULES}
    built, never = tmp_path / "built", tmp_path / "never"
    built.mkdir()
    never.mkdir()
    assert native.decide(_install(built, sources, library=False), str(built), "1") == "stale"
    assert native.decide(_install(never, sources, shims=False, library=False), str(never), "1") == "absent"


def test_the_finder_loads_a_module_from_its_source(tmp_path):
    source = tmp_path / "anything.py"
    source.write_text("VALUE = 42\n")
    finder = native._FromSource({"prism_test_only.anything": str(source)})
    spec = finder.find_spec("prism_test_only.anything")
    assert spec.origin == str(source) and finder.find_spec("prism.other") is None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.VALUE == 42


def _untyped_functions(source: str) -> list[str]:
    """The functions mypy reads as untyped: no annotation on any parameter (``self``/``cls`` aside) nor on the return."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is None:
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            if params and params[0].arg in ("self", "cls"):
                params = params[1:]
            if all(p.annotation is None for p in params):
                out.append(f"{node.name} (line {node.lineno})")
    return out


def test_every_function_of_a_compiled_module_is_typed():
    """mypyc compiles a function without annotations as untyped code: each attribute a generic lookup, each call a
    generic call, each global a dict lookup (an unannotated ``SegmentedPrompt.shared_ids`` and engine loop, with the
    segment kinds as plain globals, cost an FCFS run 2.4% of its instructions)."""
    untyped = {path: found for path in native.MODULES.values()
               if (found := _untyped_functions((ROOT / path).read_text()))}
    assert not untyped, f"annotate these (a return type is enough): {untyped}"


def test_the_untyped_check_sees_what_mypy_calls_untyped():
    src = ("def a(x): pass\ndef b(x: int): pass\ndef c() -> None: pass\nclass K:\n    def d(self): pass\n"
           "    def e(self, y) -> int: return 0\n    def f(self, *, z: int): pass\n")
    assert _untyped_functions(src) == ["a (line 1)", "d (line 5)"]
