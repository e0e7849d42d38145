"""Where results go, and how they get there: every command's output location is checked before any work
starts, and every result file is written whole or not at all.

    out = prepare_out_dir(args.out, "--out")        # a folder we can write into (created), else UserError
    path = check_out_file(args.out, "-o")           # a file we can write (its folder creatable), else UserError
    write_atomic_text(out / "summary.json", text)   # temporary file in the same folder, then rename
    with atomic_path(out / "data.npz") as tmp:      # the same for any writer that wants a path
        np.savez(tmp, **arrays)
    save_figure(fig, out / "plot.png")              # a matplotlib figure: laid out, written, closed
    with InterruptsHeld() as held:                  # Ctrl-C waits until a finished result is on disk
        write_atomic_text(out / "summary.json", text)   # (held.caught: whether one came meanwhile)

A bad location (under a regular file, under /proc, a read-only file system, a file where a folder is
expected or a folder where a file is expected) raises :class:`~prism.errors.UserError`: one line naming
the flag and the path, exit status 2 at the command line, and nothing written.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from prism.errors import UserError
from prism.interrupts import InterruptsHeld  # here too: where results are written, interruptions are held


def _where(flag: str, path: Path) -> str:
    return f"{flag} {path}" if flag else str(path)


def _existing_ancestor(path: Path) -> Path:
    p = path
    while not os.path.lexists(p):
        if p.parent == p:
            break
        p = p.parent
    return p


def _probe(folder: Path, where: str) -> None:
    """Create and remove a temporary file in ``folder``: the only test that tells /proc, read-only mounts and
    permission bits apart from a usable folder (root passes every permission check but these)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".prism-probe-")
    except OSError as e:
        why = {errno.ENOENT: "files cannot be created there", errno.EROFS: "read-only file system"}.get(
            e.errno, e.strerror or str(e))
        raise UserError(f"cannot write in {folder}: {why}", where) from None
    os.close(fd)
    os.unlink(tmp)


def _check_dir(folder: Path, where: str, given: Path | None = None) -> None:
    """``folder`` exists as a writable folder, or its nearest existing ancestor is one; creates nothing.
    ``given``: the path the flag names (``folder`` itself, or a file in it): any other path is named."""
    anc = _existing_ancestor(folder)
    if not anc.is_dir():
        what = "a file" if anc.exists() else "not a folder"
        raise UserError(f"is {what}, expected a folder" if anc == (given or folder)
                        else f"{anc} is {what}, not a folder", where)
    _probe(anc, where)


def _make_dir(folder: Path, where: str, given: Path | None = None) -> None:
    _check_dir(folder, where, given)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {folder}: {e.strerror or e}", where) from None
    _probe(folder, where)


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """Check that ``path`` is, or can be created as, a folder we can write into; create nothing."""
    p = Path(path)
    _check_dir(p, _where(flag, p))
    return p


def prepare_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """Check ``path`` as :func:`check_out_dir`, then create it (with its parents)."""
    p = Path(path)
    _make_dir(p, _where(flag, p))
    return p


def check_out_file(path: str | Path, flag: str = "-o", inputs: Iterable[str | Path] = ()) -> Path:
    """Check that ``path`` can be written as a file (not a folder; its folder usable, or creatable: the writer
    creates it, so a command that fails first leaves none) and is none of the command's ``inputs`` (writing
    it would destroy what the command reads)."""
    p = Path(path)
    where = _where(flag, p)
    if str(path).endswith(("/", os.sep)) or p.is_dir():
        raise UserError("is a folder, expected a file", where)
    if os.path.lexists(p) and not p.is_file():
        raise UserError("is not a regular file", where)
    for given in inputs:
        if _same_file(p, Path(given)):
            raise UserError(f"is the input {given} (writing it would overwrite what it reads): choose another "
                            "file", where)
    _check_dir(p.parent, where, p)
    return p


def _same_file(a: Path, b: Path) -> bool:
    """The same file (by inode where both exist: a link or another spelling of the path is caught too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def prepare_run_dir(path: str | Path, files: Iterable[str], flag: str = "--out") -> Path:
    """A run's folder, checked and created, with what an earlier run left there removed (``files`` in order:
    the summary first), so that a folder never holds a new run's files beside an old run's summary."""
    p = prepare_out_dir(path, flag)
    for name in files:
        f = check_out_file(p / name, flag)
        f.unlink(missing_ok=True)
        clear_leftovers(f)
    return p


def clear_leftovers(path: Path) -> None:
    """Remove the hidden temporary files (:func:`atomic_path`'s) that a killed writer of ``path`` left beside it."""
    for tmp in path.parent.glob(f".{path.stem}.*.tmp{path.suffix}"):
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same folder, same suffix; the folder created if need be) to write;
    renamed onto ``path`` when the block ends normally, removed when it raises. A reader never sees a
    half-written ``path``."""
    p = Path(path)
    tmp = p.with_name(f".{p.stem}.{os.getpid()}.tmp{p.suffix}")
    p.parent.mkdir(parents=True, exist_ok=True)  # checked by check_out_file, created once there is a result
    try:
        yield tmp
        os.replace(tmp, p)
    except OSError as e:  # a disk that fills up, a folder removed meanwhile: one line naming the file
        if e.filename is not None and str(e.filename) != str(tmp):
            raise  # not this file's (an input read in the block): its own message names it
        raise UserError(f"cannot write: {e.strerror or e}", str(p)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_atomic_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file in the same folder, renamed onto ``path`` once
    complete (safe against a killed process; no fsync: cheap enough for a scheduler's periodic counters)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, newline="")


def write_csv(path: str | Path, fields: Sequence[str], rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> None:
    """A CSV (header ``fields``, one line per row: a sequence in column order, or a mapping by field name,
    missing fields empty), written atomically; rows stream to the file (a big table is never held whole)."""
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for r in rows:
            w.writerow([r.get(k, "") for k in fields] if isinstance(r, Mapping) else r)


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """A matplotlib figure, laid out tight, written atomically as ``path`` (PNG by its suffix) and closed. Every
    plot of the project is saved so; matplotlib is imported by whoever made the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    return Path(path)


__all__ = ["InterruptsHeld", "check_out_dir", "prepare_out_dir", "check_out_file", "prepare_run_dir", "clear_leftovers",
           "atomic_path", "write_atomic_text", "write_csv", "save_figure"]
