"""The simulator's hot modules compiled to C by the install (mypyc), and the guard that runs their source instead
when the compiled ones are stale or switched off.

Why. A simulation spends most of its time in a few modules of small methods over plain objects: the engine's
loop, its radix cache, admission, its clock and the prompts, and the client, front end and bookkeeping around
them (issue 31: whole-process time against BLIS). mypyc
compiles that same source, typed as it is, into C extensions: native classes (fixed attribute slots), direct
calls between them, unboxed arithmetic. The source stays the definition; nothing is written twice, and a
process runs the source alone with ``PRISM_NATIVE=0`` (a debugger, cProfile, a test that holds the two equal:
``tests/test_native.py``); ``py-spy record --native`` samples the compiled functions by name.

How. ``setup.py`` compiles :data:`MODULES` as one mypyc group named by a digest of their source
(``prism/native_<digest>__mypyc``, the group's shared library, beside a small extension per module next to its
source, which Python's import prefers to the ``.py``). Where mypy or a C compiler is missing the install goes on
without them. Editing a compiled module makes the build stale: :func:`guard`, run by ``prism/__init__.py`` before
any of them is imported, then loads all of them from source (``pip install -e .`` compiles them again; one
module compiled and another not would mix two versions of a class). :func:`status` says which it is.

This module is also read by ``setup.py`` from its file: it imports nothing of prism's.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys

#: the compiled modules and their source files in the repository (pyproject's package-dir)
MODULES = {
    "prism.calibration.cost_model": "calibration/cost_model.py",
    "prism.core": "prism/core.py",
    "prism.policies.anchors": "policies/anchors.py",
    "prism.policies.bookkeeping": "policies/bookkeeping.py",
    "prism.policies.context_tree": "policies/context_tree.py",
    "prism.policies.dart": "policies/dart.py",
    "prism.policies.demand": "policies/demand.py",
    "prism.policies.moore_hodgson": "policies/moore_hodgson.py",
    "prism.policies.placement": "policies/placement.py",
    "prism.policies.prefix_tree": "policies/prefix_tree.py",
    "prism.policies.qas_compiled": "policies/qas_compiled.py",
    "prism.sim.admission": "sim/admission.py",
    "prism.sim.client": "sim/client.py",
    "prism.sim.clock": "sim/clock.py",
    "prism.sim.engine": "sim/engine.py",
    "prism.sim.fleet_gpu": "sim/fleet_gpu.py",
    "prism.sim.frontend": "sim/frontend.py",
    "prism.sim.memory": "sim/memory.py",
    "prism.sim.radix_cache": "sim/radix_cache.py",
    "prism.traces.stats": "traces/stats.py",
}

#: the environment variable that switches the compiled modules off (``0``)
SWITCH = "PRISM_NATIVE"

_status = "absent"


def digest(sources: dict[str, bytes]) -> str:
    """The build's name for these sources (module -> source bytes, as :data:`MODULES` orders them)."""
    h = hashlib.blake2b(digest_size=6)
    for name in MODULES:
        h.update(name.encode() + b"\0" + sources[name] + b"\0")
    return h.hexdigest()


def group_name(sources: dict[str, bytes]) -> str:
    """The mypyc group of these sources: its shared library is ``<group>__mypyc``, in the ``prism`` package."""
    return f"prism.native_{digest(sources)}"


def status() -> str:
    """``compiled`` (this process runs the compiled modules), ``stale`` (built from other sources: it runs
    their source), ``off`` (``PRISM_NATIVE=0``) or ``absent`` (never built: the source)."""
    return _status


def _source_paths() -> dict[str, str]:
    """Each compiled module's source file in this install (a checkout's, in an editable one)."""
    paths, dirs = {}, {"prism": os.path.dirname(os.path.abspath(__file__))}
    for name in MODULES:
        package, _, leaf = name.rpartition(".")
        if package not in dirs:
            spec = importlib.util.find_spec(package)  # a package: found, not run
            dirs[package] = spec.submodule_search_locations[0]
        paths[name] = os.path.join(dirs[package], leaf + ".py")
    return paths


class _FromSource:
    """A meta path finder that loads the compiled modules from their source files."""

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths

    def find_spec(self, name, path=None, target=None):
        source = self.paths.get(name)
        return importlib.util.spec_from_file_location(name, source) if source else None


def decide(paths: dict[str, str], package_dir: str, switch: str) -> str:
    """The :func:`status` of an install whose compiled modules' sources are ``paths`` (module -> ``.py``), with
    the ``prism`` package in ``package_dir``, under ``PRISM_NATIVE=switch``."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if not any(os.path.exists(p[:-3] + suffix) for p in paths.values()):
        return "absent"
    if switch == "0":
        return "off"
    sources = {}
    for name, p in paths.items():
        with open(p, "rb") as f:
            sources[name] = f.read()
    library = group_name(sources).rpartition(".")[2] + "__mypyc" + suffix
    return "compiled" if os.path.exists(os.path.join(package_dir, library)) else "stale"


def guard() -> str:
    """Decide, before any compiled module is imported, whether this process runs them (module docstring); where
    it does not, their imports load the source."""
    global _status
    paths = _source_paths()
    _status = decide(paths, os.path.dirname(os.path.abspath(__file__)), os.environ.get(SWITCH, "1"))
    if _status in ("off", "stale"):
        sys.meta_path.insert(0, _FromSource(paths))
    return _status
