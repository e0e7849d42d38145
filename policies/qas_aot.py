"""QAS's kernels compiled ahead of time: a C extension built by the install (``setup.py``) from the same kernels
that numba compiles at run time (``policies.qas_round``), so that a process runs compiled rounds without
loading numba.

Why. Loading numba's compiled kernels costs a process 0.3-0.4 s even from its cache, and a short simulation's
rounds were interpreted (about 0.2 ms a round of a few requests) rather than pay it. The extension imports in
milliseconds; a call costs about 6 us more than numba's own dispatch (12 against 6 us a plan_round call of one
request, hot), so a long run still switches to numba's kernels (``policies.qas_compiled``).

What. numba's ahead-of-time compiler (``numba.pycc``) compiles the three entry points that
:class:`~prism.policies.qas_compiled.CompiledQAS` calls, each for the one signature it is called with (the
types of :class:`~prism.policies.qas_round.Prompts`, ``Params``, ``Round`` and ``Dispatch``); the kernels they
call are compiled into them. The module's name carries a digest of ``qas_round.py``'s source, so an
extension built from other kernels is never loaded (edit the kernels, reinstall to rebuild; until then the
rounds run interpreted or JIT-compiled, alike). Where the build fails (no C compiler) the install goes on
without it.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from types import ModuleType, SimpleNamespace

#: the source the extension is built from
KERNELS_SOURCE = Path(__file__).with_name("qas_round.py")
#: what CompiledQAS calls (``k.<name>``)
ENTRY_POINTS = ("plan_round", "dispatch", "aligned_row")


def module_name(source: Path | None = None) -> str:
    """The extension's module name for this kernel source (default :data:`KERNELS_SOURCE`): ``_qas_kernels_``
    and a digest of it."""
    data = (source or KERNELS_SOURCE).read_bytes()
    return "_qas_kernels_" + hashlib.blake2b(data, digest_size=6).hexdigest()


def signatures() -> dict[str, object]:
    """Each entry point's numba signature: arrays are C-contiguous, as the request table and the rounds make
    them; plain tuples stand for the named ones (``qas_round``'s *Cost*), field by field: a field added there
    is added here, or the build fails (and ``tests/test_qas.py`` says the extension is missing)."""
    from numba import types as t

    i64, f64, b1 = t.int64, t.float64, t.boolean
    ints, floats, bools, matrix = i64[::1], f64[::1], b1[::1], i64[:, ::1]
    prompts = t.Tuple((matrix, ints, bools, i64))  # Prompts
    params = t.Tuple((f64, f64, f64, i64, i64, f64, f64, i64, b1))  # Params
    round_ = t.Tuple((ints, floats, ints, ints, ints, ints, ints, floats, i64, ints, matrix, bools))  # Round
    dispatch = t.Tuple((ints, ints, ints, ints, ints, ints, ints))  # Dispatch
    return {"plan_round": round_(prompts, params, ints, ints, floats, i64, floats, f64, f64, i64, floats, ints),
            "dispatch": dispatch(prompts, ints, ints, ints, floats, floats, f64, f64, f64, ints, ints, floats, ints, b1),
            "aligned_row": t.Tuple((ints, b1))(prompts, i64, floats, i64)}


def compiler(kernels: ModuleType, package: str = "prism.policies"):
    """numba's ahead-of-time compiler for ``kernels`` (the ``qas_round`` module, imported from its file by
    ``setup.py``), with its entry points exported."""
    import warnings

    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        from numba.pycc import CC

    kernels.compiled(cache=False)  # its kernel names become numba functions: the entry points' calls resolve to them
    cc = CC(module_name(Path(kernels.__file__)))
    cc.verbose = False
    for name, signature in signatures().items():
        cc.export(name, signature)(kernels._KERNELS[name])
    return cc


def load() -> SimpleNamespace | None:
    """The extension's entry points, or None where it was not built (or was built from other kernels)."""
    try:
        module = importlib.import_module(f"{__package__}.{module_name()}")
    except ImportError:
        return None
    return SimpleNamespace(**{name: getattr(module, name) for name in ENTRY_POINTS})
