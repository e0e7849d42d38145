"""What every importer of request logs shares (``prism-trace import``): the options, output lengths from the log or
a stated distribution, arrival times from the log or Poisson at a rate, and the trace the layouts make.

A log's arrivals are its own timestamps, from 0 (the first request's), and must not go backwards; with ``--qps``
they are a Poisson process at that rate instead (seeded; the log's timestamps are then not read). Output lengths
come from the log (``--output-len log``, the default: a request without one is an error naming its line), from the
log with a distribution for the requests that have none (``log:DIST``), or from a distribution for every request
(``DIST``): ``N`` tokens, ``uniform:A,B`` (integers, both included), ``exponential:MEAN`` or
``lognormal:MEDIAN,SIGMA`` (each at least 1 token and at most MAX_TOKENS). A logged length of 0 (a request that
produced nothing) counts as 1, the least an engine decodes, as the Mooncake reader does.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from prism.config import MAX_QPS, MAX_TOKENS, MIN_QPS
from prism.core import Request, SegmentTable
from prism.errors import UserError

from prism.traces.arrivals import ArrivalSpec, arrival_times, streams
from prism.traces.chat import ChatLayout
from prism.traces.trace import Trace

#: format -> (module of prism.traces, its reader ``read(path, options) -> Trace``)
FORMATS: dict[str, str] = {"openai": "openai_log", "sharegpt": "sharegpt", "autobench": "autobench",
                           "csv": "csv_log"}
DISTRIBUTIONS = ("uniform", "exponential", "lognormal")
MAX_BLOCK_TOKENS = 1 << 16


@dataclass(frozen=True)
class OutputLengths:
    """Where a request's output length comes from (module docstring)."""

    from_log: bool = True
    dist: tuple[str, tuple[float, ...]] | None = None
    text: str = "log"

    @classmethod
    def parse(cls, text: str, flag: str = "--output-len") -> "OutputLengths":
        spec = text.strip()
        from_log = spec == "log" or spec.startswith("log:")
        rest = spec[4:] if spec.startswith("log:") else ("" if spec == "log" else spec)
        return cls(from_log, _distribution(rest, text, flag) if rest else None, spec)

    def check(self, logged: int | None, where: str) -> int | None:
        """``logged``, or a UserError if the log must give one and does not (a reader checks as it reads)."""
        if logged is None and self.dist is None:
            raise UserError("no output length in the log: give --output-len (e.g. 256, uniform:32,512)", where)
        return logged

    def value(self, logged: int | None, rng: np.random.Generator, where: str) -> int:
        if self.from_log and logged is not None:
            return max(1, logged)
        self.check(logged, where)
        name, args = self.dist
        if name == "fixed":
            x = args[0]
        elif name == "uniform":
            x = rng.integers(int(args[0]), int(args[1]) + 1)
        elif name == "exponential":
            x = rng.exponential(args[0])
        else:
            x = args[0] * math.exp(args[1] * rng.standard_normal())
        return int(min(MAX_TOKENS, max(1, round(float(x)))))


def _distribution(text: str, given: str, flag: str) -> tuple[str, tuple[float, ...]]:
    bad = (f"{flag}: expected log, log:DIST or DIST (N, uniform:A,B, exponential:MEAN, lognormal:MEDIAN,SIGMA), "
           f"got {given!r}")
    name, _, args = text.partition(":")
    try:
        values = tuple(float(a) for a in args.split(",")) if args else ()
        if not args:
            values, name = (float(name),), "fixed"
    except ValueError:
        raise UserError(bad) from None
    arity = {"fixed": 1, "uniform": 2, "exponential": 1, "lognormal": 2}
    if name not in arity or len(values) != arity[name] or not all(math.isfinite(v) for v in values):
        raise UserError(bad)
    if name in ("fixed", "uniform") and not all(v == int(v) and 1 <= v <= MAX_TOKENS for v in values):
        raise UserError(f"{flag}: token counts must be integers in 1..{MAX_TOKENS}, got {given!r}")
    if name == "uniform" and values[1] < values[0]:
        raise UserError(f"{flag}: uniform:A,B needs A <= B, got {given!r}")
    if name in ("exponential", "lognormal") and not (0 < values[0] <= MAX_TOKENS and values[-1] > 0):
        raise UserError(f"{flag}: the mean or median must be in (0, {MAX_TOKENS}] and sigma > 0, got {given!r}")
    return name, values


@dataclass(frozen=True)
class ImportOptions:
    format: str
    tokenizer: str | None = None
    qps: float | None = None
    seed: int = 0
    output_len: OutputLengths = field(default_factory=OutputLengths)
    block_tokens: int = 512
    sessions: int = 16
    progress: bool = True
    workers: int = 0  # processes for a large OpenAI log (0: one per CPU)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise UserError(f"--format: must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.qps is not None and not MIN_QPS <= self.qps <= MAX_QPS:  # NaN fails too
            raise UserError(f"--qps: must be a number in {MIN_QPS:g}..{MAX_QPS:g}, got {self.qps!r}")
        if self.seed < 0:
            raise UserError(f"--seed: must be >= 0, got {self.seed}")
        if not 1 <= self.block_tokens <= MAX_BLOCK_TOKENS:
            raise UserError(f"--block-tokens: must be in 1..{MAX_BLOCK_TOKENS}, got {self.block_tokens}")
        if not 1 <= self.sessions <= 100_000:
            raise UserError(f"--sessions: must be in 1..100000, got {self.sessions}")
        if self.workers < 0:
            raise UserError(f"--workers: must be >= 0 (0: one per CPU), got {self.workers}")


class Timestamps:
    """The log's arrival times in seconds, checked as they come (none, or one per request, never going back)."""

    def __init__(self, used: bool) -> None:
        self.used = used
        self.stamps: list[float] = []
        self._first_missing: str | None = None

    def add(self, seconds: float | None, where: str, name: str = "timestamp") -> None:
        if not self.used:
            return
        if seconds is None:
            if self.stamps:
                raise UserError(f"no '{name}', where the lines before have one (give all or none)", where)
            self._first_missing = self._first_missing or where
            return
        if self._first_missing is not None:
            raise UserError(f"field '{name}': given here, but not at {self._first_missing} (give all or none)", where)
        if self.stamps and seconds < self.stamps[-1]:
            raise UserError(f"field '{name}': earlier than the line before (a log must be in arrival order)", where)
        self.stamps.append(seconds)

    def times(self, n: int, options: ImportOptions, where: str) -> np.ndarray:
        """Arrival times of the ``n`` requests: the log's from 0, or Poisson at ``options.qps``."""
        if options.qps is not None:
            return arrival_times(ArrivalSpec("poisson", options.qps), n, streams(options.seed)[1])
        if n == 0:
            return np.zeros(0)
        if len(self.stamps) != n:
            raise UserError("the log has no timestamps: give --qps for Poisson arrivals", where)
        t = np.asarray(self.stamps, dtype=float)
        return t - t[0]


def number(value: Any, name: str, where: str, low: float = 0.0) -> float | None:
    """An optional finite number >= ``low`` (None if absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
        raise UserError(f"field '{name}': must be a finite number >= {low:g}, got {value!r}", where)
    return float(value)


def count(value: Any, name: str, where: str, low: int = 0) -> int | None:
    """An optional integer in ``low``..MAX_TOKENS (None if absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TOKENS:
        raise UserError(f"field '{name}': must be an integer in {low}..{MAX_TOKENS}, got {value!r}", where)
    return value


@dataclass
class LaidOut:
    """Requests as one reader (one process, over one part of a log) lays them out: per request its segments
    ``(kind, id, length)`` and what the log says of it; the tokens of each segment id the first time this reader
    meets it (none for a segment of made-up tokens, a CSV row's). Small to send between processes: a shared
    segment's tokens travel once."""

    records: list[tuple] = field(default_factory=list)  # (segments, logged output, session, fixed, seconds, where)
    tokens: dict[str, np.ndarray] = field(default_factory=dict)
    unplaced: int = 0

    def add(self, layout: ChatLayout, logged: int | None, session: str | None, seconds: float | None,
            where: str) -> None:
        segments, start, tokens = [], 0, self.tokens
        for kind, seg_id, end in layout.segments:
            if seg_id not in tokens:
                tokens[seg_id] = layout.tokens[start:end].copy()  # a copy: the prompt is not kept
            segments.append((kind, seg_id, end - start))
            start = end
        self.records.append((tuple(segments), logged, session, layout.fixed_order, seconds, where))
        self.unplaced += layout.unplaced

    def add_segments(self, segments: tuple, logged: int | None, seconds: float | None, where: str) -> None:
        self.records.append((segments, logged, None, True, seconds, where))


def build_trace(path: Path, options: ImportOptions, parts: list[LaidOut], meta: dict | None = None) -> Trace:
    """The trace of a log's parts, in order: arrivals from the log (checked across the parts) or Poisson, output
    lengths from the log or drawn (one stream, request by request, however the log was split), each segment id
    declared once."""
    table, requests = SegmentTable(), []
    stamps = Timestamps(options.qps is None)
    rng = streams(options.seed)[0]
    for part in parts:
        for segments, logged, session, fixed, seconds, where in part.records:
            stamps.add(seconds, where)
            out = options.output_len.value(logged, rng, where)
            segs = []
            for kind, seg_id, n in segments:
                if seg_id not in table:
                    table.declare(seg_id, kind, tokens=part.tokens.get(seg_id))
                segs.append(table.segment(seg_id, kind, n))
            requests.append(Request(len(requests), 0.0, tuple(segs), out, session, fixed))
    if not requests:
        raise UserError("the log has no requests", str(path))
    spec = {"format": options.format, "source": str(path), "tokenizer": options.tokenizer, "qps": options.qps,
            "seed": options.seed, "output_len": options.output_len.text}
    if options.format in ("autobench", "csv"):
        spec["block_tokens"] = options.block_tokens
    info = {"source": str(path), "format": options.format,
            "unplaced_messages": sum(p.unplaced for p in parts), **(meta or {})}
    trace = Trace(requests, table, "imported", spec, info)
    return trace.with_arrivals(stamps.times(len(requests), options, str(path)), spec)


def reader(fmt: str) -> Callable[[Path, ImportOptions], Trace]:
    return importlib.import_module(f"prism.traces.{FORMATS[fmt]}").read


def import_trace(path: str | Path, options: ImportOptions) -> Trace:
    """The trace of a request log in one of FORMATS."""
    return reader(options.format)(Path(path), options)


def progress(options: ImportOptions, what: str = "requests"):
    """A progress bar over the requests read (off with --no-progress)."""
    import sys

    from tqdm import tqdm

    return tqdm(disable=not options.progress or not sys.stderr.isatty(), unit=" req", desc=f"import {what}",
                leave=False, mininterval=0.5)
