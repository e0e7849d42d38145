"""A plain CSV of arrivals and lengths (``--format csv``): ``timestamp,prompt_tokens,output_tokens``.

The header names the columns (any order; other columns are read past); ``timestamp`` is in seconds. Nothing is
known of the prompts' content, so each is one private segment of its length: no request shares a token with
another, the load a cache cannot help with (the infinite-cache hit rate is 0). With ``--qps`` the arrivals are
Poisson instead, and with a distribution ``--output-len`` replaces the logged lengths.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from prism.config import MAX_TOKENS, check_csv_header, read_text
from prism.core import PRIV
from prism.errors import UserError

from prism.traces.importing import ImportOptions, LaidOut, Timestamps, build_trace, progress
from prism.traces.trace import Trace

COLUMNS = ("timestamp", "prompt_tokens", "output_tokens")


def _field(row: dict, name: str, where: str, integer: bool) -> float:
    raw = (row.get(name) or "").strip()
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise UserError(f"field '{name}': expected {'an integer' if integer else 'a number'}, got {raw!r}",
                        where) from None
    low = 1 if name == "prompt_tokens" else 0
    if not (math.isfinite(value) and low <= value <= (MAX_TOKENS if integer else math.inf)):
        bound = f"{low}..{MAX_TOKENS}" if integer else "a finite number >= 0"
        raise UserError(f"field '{name}': must be {bound}, got {raw!r}", where)
    return value


def read(path: Path, options: ImportOptions) -> Trace:
    reader = csv.DictReader(io.StringIO(read_text(path, "CSV file"), newline=""))
    names = None if reader.fieldnames is None else [n.strip().lower() for n in reader.fieldnames]
    check_csv_header(names, f"{path}:1", COLUMNS)
    reader.fieldnames = names
    out, stamps = LaidOut(), Timestamps(options.qps is None)
    with progress(options) as bar:
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            if None in row or any(row.get(c) is None for c in COLUMNS):
                raise UserError(f"expected {len(names)} fields, got a row of another length", where)
            seconds = _field(row, "timestamp", where, integer=False) if options.qps is None else None
            stamps.add(seconds, where)
            n = int(_field(row, "prompt_tokens", where, integer=True))
            logged = int(_field(row, "output_tokens", where, integer=True))
            out.add_segments(((PRIV, f"csv{len(out.records)}", n),), logged, seconds, where)
            bar.update(1)
    return build_trace(path, options, [out])
