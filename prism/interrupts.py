"""Signals that stop a command as Ctrl-C does, and child processes that end with their parent.

SIGTERM (``kill``, a service manager, a batch scheduler's time limit) and SIGHUP (the terminal closed) stop a
command exactly as Ctrl-C does: while a command runs (:func:`stopped_by_signals`, entered by every entry
point) they raise :class:`Terminated`, a ``KeyboardInterrupt``, so that every path that keeps partial results on
Ctrl-C keeps them on these too. The command then exits with 128 + the signal's number, as a shell reports a
process that signal ended (:func:`exit_status`: 143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C). A signal the
command was started to ignore (``nohup`` ignores SIGHUP) stays ignored.

:class:`InterruptsHeld` holds all three back for the short work between a finished computation and its files.

A child process never outlives the command: :func:`die_with_parent` asks the kernel (Linux's
``PR_SET_PDEATHSIG``, prctl(2)) to kill a child once its parent is gone, even a parent killed by SIGKILL, which
runs no code of its own; the command stops its children itself on every other way out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Callable, Iterator

#: the signals that stop a command as Ctrl-C does, and those :class:`InterruptsHeld` holds back
STOPPING = (signal.SIGTERM, signal.SIGHUP)
HELD = (signal.SIGINT, *STOPPING)
_received: list[int] = []  # the signals that stopped (or were held from) the command since it started


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises ``KeyboardInterrupt`` (``signum``: which one)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)  # the args rebuild it (SimPy re-raises an exception as type(e)(*e.args))
        self.signum = signum

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Terminated(signum)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # where Python runs signal handlers


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """For the block (a command's run): SIGTERM and SIGHUP raise :class:`Terminated`; then as before. Outside
    the main thread, where Python delivers no signal, it changes nothing."""
    if not _on_main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOPPING}
    _received.clear()
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def exit_status() -> int:
    """The exit status of a command stopped by a signal: 128 + the last one it received (SIGINT, 130, when
    none of the others came: Ctrl-C raises ``KeyboardInterrupt`` by Python's own handler)."""
    return 128 + (_received[-1] if _received else signal.SIGINT)


def received() -> bool:
    """Whether a signal came since the command started, one held back by :class:`InterruptsHeld` included: a
    command whose work then ended anyway must still stop with it (:func:`exit_status`)."""
    return bool(_received)


class InterruptsHeld:
    """Hold Ctrl-C (SIGINT), SIGTERM and SIGHUP back while the block runs: for the short work between a finished
    computation and its files (a run's summary, then ``requests.csv`` and ``summary.json``), or a server's stop,
    so that an interruption there cannot leave a complete ``requests.csv`` without its summary, a folder that
    reads as a killed run, or a server running.

    ``caught`` says whether one came meanwhile, for the caller to act on once its files are written (prism-sim
    then exits with :func:`exit_status`; a live run's files come after its replay ended either way). Outside the
    main thread (where Python delivers no signal) it holds nothing. A signal the process ignores stays ignored."""

    def __init__(self) -> None:
        self.caught = False
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: Any) -> None:
        self.caught = True
        _received.append(signum)

    def __enter__(self) -> "InterruptsHeld":
        if _on_main_thread():
            for sig in HELD:
                handler = signal.getsignal(sig)
                if handler is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *_: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal() -> Callable[[], None] | None:
    """A function that, run in a child process, has the kernel send it SIGKILL when its parent dies (None off
    Linux, where the parent's own clean-up is all there is). Resolved here, in the parent, so that the child
    (between fork and exec: ``preexec_fn``) only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_parent(parent: int) -> None:
    """In a child process: be killed when ``parent`` (its parent's pid) dies; exits at once if it already has
    (the child was then adopted, and the kernel's signal would never come)."""
    arm = parent_death_signal()
    if arm is not None:
        arm()
    if os.getppid() != parent:
        os._exit(1)


__all__ = ["Terminated", "stopped_by_signals", "exit_status", "InterruptsHeld", "die_with_parent",
           "parent_death_signal", "STOPPING", "HELD"]
