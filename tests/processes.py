"""The processes a test started, read from /proc (Linux): which descendants a command had, and whether any is
still running once it has exited (a zombie, dead and waiting for its new parent to reap it, is not); and the
signals of a command a test signals, as from a terminal."""

from __future__ import annotations

import signal
import time
from pathlib import Path


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a command a test signals: SIGINT, SIGTERM and SIGHUP at their default, as a command run
    from a terminal has them. A test run by ``nohup`` or in a non-interactive shell's background ignores SIGHUP
    or SIGINT, an ignored signal stays ignored across exec, and the command would rightly keep ignoring it."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces: state, ppid, ...


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now (children, their children, ...)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            kids.setdefault(int(st[1]), []).append(int(d.name))
    found, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pids: list[int], wait_s: float = 5.0) -> list[int]:
    """Those of ``pids`` still running after up to ``wait_s`` (a process the kernel is killing takes a moment)."""
    deadline = time.monotonic() + wait_s
    while True:
        running = [p for p in pids if (st := _stat(p)) is not None and st[0] not in ("Z", "X")]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)
