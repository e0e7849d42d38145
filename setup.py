"""The one compiled part of the install: QAS's kernels as a C extension (``policies/qas_aot.py``). Everything else
is in pyproject.toml. Where numba or a C compiler is missing, the install goes on without the extension."""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup


def _from_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _skipped(e: Exception) -> None:
    print(f"prism-serve: QAS's kernels are not compiled ahead of time ({type(e).__name__}: {e})", file=sys.stderr)


def qas_extension() -> list:
    here = Path(__file__).resolve().parent / "policies"
    try:
        aot = _from_file("_prism_qas_aot", here / "qas_aot.py")
        cc = aot.compiler(_from_file("_prism_qas_round", here / "qas_round.py"))
    except Exception as e:  # noqa: BLE001  no numba (ImportError), no C compiler (numba's RuntimeError)
        _skipped(e)
        return []
    ext = cc.distutils_extension()  # also gives setuptools numba's build_ext, which compiles the kernels
    ext.name = f"prism.policies.{cc.name}"
    return [ext]


def optional_build():
    """numba's build_ext, made optional: a failed build (no C compiler, kernels this numba cannot compile)
    leaves the early rounds interpreted and the rest to numba's JIT, as without the extension."""
    from setuptools.command import build_ext

    class OptionalBuildExt(build_ext.build_ext):
        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001  any failure: the install goes on without it
                _skipped(e)

    return {"build_ext": OptionalBuildExt}


extensions = qas_extension()
setup(ext_modules=extensions, cmdclass=optional_build() if extensions else {})
