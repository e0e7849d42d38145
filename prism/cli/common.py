"""What every command shares: the error contract and small output helpers."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any, Callable

from prism.config import MAX_QPS, MIN_QPS, comma_list  # noqa: F401 (comma_list: every command's lists)
from prism.errors import UserError
from prism.interrupts import exit_status, stopped_by_signals


def entry_point(prog: str) -> Callable[[Callable[[list[str] | None], int]], Callable[[list[str] | None], int]]:
    """Bad input ends the command with one line on stderr and exit status 2, never a traceback; a closed
    standard output (``| head``) ends it quietly with status 1. SIGTERM and SIGHUP stop it as Ctrl-C does
    (:mod:`prism.interrupts`), with status 128 + the signal's number."""

    def wrap(fn: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
        @functools.wraps(fn)
        def main(argv: list[str] | None = None) -> int:
            try:
                with stopped_by_signals():
                    code = fn(argv)
            except UserError as e:
                print(f"{prog}: error: {' '.join(str(e).splitlines())}", file=sys.stderr)  # one line, always
                code = 2
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                code = exit_status()
            except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as a shell tool does
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail
                code = 1
            except OSError as e:  # what the checks cannot foresee: a disk that fills up, a folder gone mid-run
                print(f"{prog}: error: {os_error_text(e)}", file=sys.stderr)
                code = 2
            if argv is None:
                sys.exit(code)
            return code

        return main

    return wrap


def os_error_text(e: OSError) -> str:
    """An operating system's refusal in one line, naming the file where it has one."""
    what = e.strerror or str(e) or type(e).__name__
    return f"{e.filename}: {what}" if e.filename is not None else what


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every flag's help says its default (appended where the text does not
    already say it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.option_strings and not action.required and "default" not in text
                and default is not None and default is not False and default != argparse.SUPPRESS):
            text += f" (default {str(default).replace('%', '%%')})"  # argparse formats help with %
        return text


class Parser(argparse.ArgumentParser):
    """argparse's parser under the error contract: a bad flag is one line and exit status 2 (argparse prints its
    whole usage first); the line points to ``--help``. Subcommands' parsers are of this class too. Help comes
    in :class:`HelpFormatter`'s form."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extra = super().parse_known_args(args, namespace)
        if getattr(ns, "out", None) == "":  # Path("") is the current folder: never where a user meant to write
            flag = next(("/".join(a.option_strings) for a in self._actions if a.dest == "out"), "--out")
            self.error(f"argument {flag}: expected a path, got an empty one")
        return ns, extra


def parse_rates(text: str, flag: str = "--qps") -> list[float]:
    """``"40,50,60"`` → arrival rates, each finite and within the documented bounds of a trace's rate."""
    items = comma_list(text, flag, "numbers")
    try:
        vals = [float(x) for x in items]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not MIN_QPS <= v <= MAX_QPS for v in vals):  # NaN fails too
        raise UserError(f"{flag}: rates must be numbers in {MIN_QPS:g}..{MAX_QPS:g}, got {text!r}")
    return vals


def add_trace_flag(p: argparse.ArgumentParser) -> None:
    from prism.traces.spec import BUILTIN  # here, not at import: imported ahead of numpy, it slows numpy's by 30 ms

    p.add_argument("--trace", required=True, help="trace spec (YAML), materialized trace (JSONL), or a built-in "
                                                  f"spec: {', '.join(BUILTIN)}")


def add_set_flag(p: argparse.ArgumentParser, what: str = "a setting",
                 example: str = "engine.max_total_tokens=65536, lpm.fcfs_threshold=64, trace.num_requests=200"
                 ) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override {what}, e.g. {example} (repeatable)")


def add_workers_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=0, help="worker processes (default 0: one per CPU)")


def add_no_progress_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def check_workers(workers: int) -> None:
    if workers < 0:
        raise UserError(f"--workers must be >= 0 (0: one per CPU), got {workers}")


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in header]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)
