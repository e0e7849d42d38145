"""The console scripts' entry points: each imports its command, then runs it. A command's module imports numpy
and the rest at its top, before its ``main`` (:func:`~prism.cli.common.entry_point`) can catch anything, so a
Ctrl-C in that first fraction of a second would end in a traceback; here it ends as a Ctrl-C during the run
does: one line and exit status 130."""

from __future__ import annotations

import importlib
import signal
import sys


def _run(module: str, prog: str) -> None:
    try:
        main = importlib.import_module(module).main
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    main()


def sim() -> None:
    _run("prism.cli.sim", "prism-sim")


def trace() -> None:
    _run("prism.cli.trace", "prism-trace")


def calibrate() -> None:
    _run("prism.cli.calibrate", "prism-calibrate")


def theory() -> None:
    _run("prism.cli.theory", "prism-theory")


def live() -> None:
    _run("prism.cli.live", "prism-live")
