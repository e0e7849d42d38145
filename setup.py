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


def qas_extension() -> list:
    here = Path(__file__).resolve().parent / "policies"
    try:
        aot = _from_file("_prism_qas_aot", here / "qas_aot.py")
        cc = aot.compiler(_from_file("_prism_qas_round", here / "qas_round.py"))
    except ImportError as e:  # no numba in the build environment
        print(f"prism-serve: QAS's kernels are not compiled ahead of time ({e})", file=sys.stderr)
        return []
    ext = cc.distutils_extension()
    ext.name = f"prism.policies.{cc.name}"
    ext.optional = True  # a failed build (no C compiler) leaves the rounds to numba's JIT
    return [ext]


setup(ext_modules=qas_extension())
