"""The compiled parts of the install: QAS's kernels as a C extension (``policies/qas_aot.py``) and the
simulator's hot modules compiled by mypyc (``prism/native.py``). Everything else is in pyproject.toml. Where
numba, mypy or a C compiler is missing, the install goes on without them."""

import importlib.machinery
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup

HERE = Path(__file__).resolve().parent


def _from_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _skipped(e: Exception, what: str = "QAS's kernels are") -> None:
    print(f"prism-serve: {what} not compiled ahead of time ({type(e).__name__}: {e})", file=sys.stderr)


def qas_extension() -> list:
    here = HERE / "policies"
    try:
        aot = _from_file("_prism_qas_aot", here / "qas_aot.py")
        cc = aot.compiler(_from_file("_prism_qas_round", here / "qas_round.py"))
    except Exception as e:  # noqa: BLE001  no numba (ImportError), no C compiler (numba's RuntimeError)
        _skipped(e)
        return []
    ext = cc.distutils_extension()  # also gives setuptools numba's build_ext, which compiles the kernels
    ext.name = f"prism.policies.{cc.name}"
    return [ext]


def native_extensions(build_temp: str, package_dir: dict[str, str]) -> list:
    """mypyc's extensions for ``prism/native.py``'s modules, generated under ``build_temp`` (mypy type-checks them
    first: a type error fails the build of these, not the install). mypy names a module by its folder, so it reads
    the package as installed: a tree of links under ``build_temp``, made by ``package_dir`` (pyproject's)."""
    from mypyc.build import mypycify

    native = _from_file("_prism_native", HERE / "prism" / "native.py")
    stage = Path(build_temp, "native-src")
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "prism").mkdir(parents=True)
    for item in (HERE / package_dir["prism"]).iterdir():
        os.symlink(item, stage / "prism" / item.name)
    for package, folder in package_dir.items():
        if package != "prism":
            os.symlink(HERE / folder, stage / Path(*package.split(".")))
    sources = {name: (HERE / path).read_bytes() for name, path in native.MODULES.items()}
    files = [str(stage / "prism" / Path(*name.split(".")[1:]).with_suffix(".py")) for name in native.MODULES]
    return mypycify([*files, "--ignore-missing-imports", "--follow-imports=silent",
                     "--cache-dir", str(Path(build_temp, "mypy-cache"))],
                    group_name=native.group_name(sources), target_dir=str(Path(build_temp, "native-c")))


def optional_build():
    """build_ext, made optional: a failed build (no C compiler, kernels this numba cannot compile, no mypy) leaves
    that part interpreted: QAS's early rounds (the rest go to numba's JIT) or the simulator's modules. It adds
    mypyc's extensions when it is set up to run (not when setup.py is read: pip reads it three times an install)."""
    from setuptools.command import build_ext

    class OptionalBuildExt(build_ext.build_ext):
        def finalize_options(self):
            temp = os.path.abspath(self.build_temp or self.get_finalized_command("build").build_temp)
            try:
                native = native_extensions(temp, self.distribution.package_dir)
            except Exception as e:  # noqa: BLE001  no mypy (ImportError), a C compiler missing
                _skipped(e, "the simulator's modules are")
                native = []
            except SystemExit as e:  # mypy found a type error
                _skipped(RuntimeError(f"mypy exit {e.code}"), "the simulator's modules are")
                native = []
            self._native = {e.name for e in native}
            self.distribution.ext_modules = [*(self.distribution.ext_modules or []), *native]
            super().finalize_options()

        def run(self):
            super().run()
            if self._native and self.inplace:
                self._drop_old_builds()

        def _drop_old_builds(self):
            """An editable install builds into the checkout: what earlier builds left there and this one did not
            make goes: their libraries, and an extension beside a module's source (a module no longer compiled,
            whose extension Python's import would still prefer to its source)."""
            made = {Path(self.get_ext_fullpath(name)) for name in self._native}
            group = next(name for name in self._native if name.endswith("__mypyc"))
            old = set(Path(self.get_ext_fullpath(group)).parent.glob("native_*__mypyc*"))
            suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
            for folder in set(self.distribution.package_dir.values()):
                old.update(p for p in (HERE / folder).glob("*" + suffix)
                           if p.with_name(p.name[:-len(suffix)] + ".py").exists())
            for path in old - made:
                path.unlink()

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001  any failure: the install goes on without it
                _skipped(e, "the simulator's modules are" if ext.name in self._native else "QAS's kernels are")

    return {"build_ext": OptionalBuildExt}


class CompiledDistribution(Distribution):
    """Always built with build_ext (mypyc's extensions are added when it runs)."""

    def has_ext_modules(self):
        return True


setup(ext_modules=qas_extension(), cmdclass=optional_build(), distclass=CompiledDistribution)
