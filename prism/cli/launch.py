"""The console scripts' entry points: each imports its command, then runs it. A command's module imports numpy
and the rest at its top, before its ``main`` (:func:`~prism.cli.common.entry_point`) can catch anything, so a
Ctrl-C in that first fraction of a second would end in a traceback; here it ends as a Ctrl-C during the run
does: one line and exit status 130.

The simulator and the trace tool run numpy with one OpenBLAS thread (``OPENBLAS_NUM_THREADS``, unless the user set
it): at import, OpenBLAS starts a thread per core that spins waiting for work for about 0.1 s, and neither command
does BLAS work. A 2,048-request prism run on 2 cores spent 0.35 s of CPU with them, 0.25 without; sweeps run their
processes side by side. Their child processes (a sweep's workers) inherit it."""

from __future__ import annotations

import importlib
import os
import signal
import sys


def _run(module: str, prog: str, blas_threads: bool = True) -> None:
    if not blas_threads:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        main = importlib.import_module(module).main
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    main()


def sim() -> None:
    _run("prism.cli.sim", "prism-sim", blas_threads=False)


def trace() -> None:
    _run("prism.cli.trace", "prism-trace", blas_threads=False)


def calibrate() -> None:
    _run("prism.cli.calibrate", "prism-calibrate")


def theory() -> None:
    _run("prism.cli.theory", "prism-theory")


def live() -> None:
    _run("prism.cli.live", "prism-live")
