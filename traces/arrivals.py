"""Arrival processes: Poisson, a bursty Gamma renewal process, and real Azure 2023 timestamps.

Each draws from its own random stream, so that changing the rate never changes the prompts.

The Gamma process's coefficient of variation is bounded to [MIN_CV, MAX_CV]: its gaps are Gamma(1/cv², ·),
and past cv 10 the shape is so small that a growing share of gaps underflow to exactly 0 (15% at cv 20, 74% at
50), so the sampled CV and rate drift from the ones asked for; below cv 0.001 the gaps are equal to within 0.1%
(periodic arrivals in all but name), and at cv 1e-300 the shape 1/cv² is a division by zero.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from prism.config import (check_csv_header, choice, count, nonneg, optional_path, path_kind, rate, read_text, tokens,
                          within)
from prism.errors import UserError

if TYPE_CHECKING:
    from prism.traces.trace import Trace

PROCESSES = ("poisson", "gamma", "azure_code", "azure_conv")
MIN_CV, MAX_CV = 1e-3, 10.0


def variation(default: float, doc: str) -> float:
    """A Gamma process's coefficient of variation, in [MIN_CV, MAX_CV] (module docstring)."""
    return within(default, MIN_CV, MAX_CV, doc)


@dataclass
class ArrivalSpec:
    process: str = choice("poisson", PROCESSES, "inter-arrival process")
    qps: float = rate(60.0, "target mean arrival rate, requests/s")
    cv: float = variation(1.0, "gamma: coefficient of variation of inter-arrival gaps (1 = Poisson)")
    azure_path: str | None = optional_path("folder of AzureLLMInferenceTrace_{code,conv}.csv (default "
                                           "../shared/data/azure_llm)")


@dataclass
class GeneratedTraceSpec:
    """Fields every generated trace has: its seed, size, arrival process and decode length.

    Content and arrival times come from two streams of the seed (:func:`streams`), so that changing the rate
    or the process never changes a prompt: a kind's ``content(spec)`` makes the prompts, :meth:`arrive` their
    arrival times, and ``ARRIVAL_FIELDS`` are the fields only the latter reads.
    """

    ARRIVAL_FIELDS: ClassVar[tuple[str, ...]] = ("qps", "arrival", "arrival_cv")

    kind: str = ""
    seed: int = nonneg(0, "seed of the content and arrival streams")
    num_requests: int = count(2048, "requests in the trace")
    qps: float = rate(60.0, "mean arrival rate, requests/s")
    arrival: str = choice("poisson", PROCESSES, "arrival process")
    arrival_cv: float = variation(1.0, "gamma arrivals: coefficient of variation")
    output_len: int = tokens(32, "decoded tokens per request")

    def arrival_times(self, rng: np.random.Generator) -> np.ndarray:
        return arrival_times(ArrivalSpec(self.arrival, self.qps, self.arrival_cv), self.num_requests, rng)

    def arrive(self, content: "Trace") -> "Trace":
        """The prompts of ``content`` (this spec's kind's ``content``, made at any arrival fields) at this
        spec's arrival times."""
        return content.with_arrivals(self.arrival_times(streams(self.seed)[1]), asdict(self))


def streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(content, arrivals) random generators of one seed, independent of each other."""
    content_ss, arrival_ss = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(content_ss), np.random.default_rng(arrival_ss)


def default_data_dir() -> Path:
    """``$PRISM_DATA_DIR``, else ``../shared/data`` beside the working directory or the project checkout."""
    import os

    if os.environ.get("PRISM_DATA_DIR"):
        return Path(os.environ["PRISM_DATA_DIR"])
    here = Path(__file__).resolve().parent.parent
    for base in (Path.cwd(), here):
        cand = base.parent / "shared" / "data"
        if cand.is_dir():
            return cand
    return here.parent / "shared" / "data"


def arrival_times(spec: ArrivalSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` non-decreasing arrival times in seconds, starting near 0, at mean rate ``spec.qps``."""
    if spec.process == "poisson":
        gaps = rng.exponential(1.0 / spec.qps, n)
    elif spec.process == "gamma":
        shape = 1.0 / spec.cv**2
        gaps = rng.gamma(shape, 1.0 / (spec.qps * shape), n)
    else:
        return azure_times(spec, n)
    return np.cumsum(gaps)


def azure_times(spec: ArrivalSpec, n: int) -> np.ndarray:
    """The first ``n`` arrivals of an Azure 2023 trace, rescaled so that their mean rate is ``spec.qps``."""
    which = spec.process.split("_", 1)[1]
    folder = Path(spec.azure_path) if spec.azure_path else default_data_dir() / "azure_llm"
    path = folder / f"AzureLLMInferenceTrace_{which}.csv"
    stamps = load_azure_timestamps(path, n)
    if len(stamps) < 2:
        raise UserError(f"needs at least 2 arrivals, found {len(stamps)}", str(path))
    t = stamps - stamps[0]
    span = t[-1]
    if span <= 0:
        raise UserError("all timestamps are equal", str(path))
    # n arrivals at rate qps span (n - 1) / qps seconds
    return t * ((len(t) - 1) / spec.qps / span)


def load_azure_timestamps(path: Path, limit: int | None = None) -> np.ndarray:
    return np.sort(np.asarray([row[0] for row in _azure_rows(path, limit, False)], dtype=float))


def load_azure_records(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(timestamps, ContextTokens, GeneratedTokens) of an Azure 2023 trace, in time order."""
    rows = sorted(_azure_rows(path, None, True))
    if not rows:
        raise UserError("no requests", str(path))
    t, ctx, gen = (np.asarray(col) for col in zip(*rows))
    return t.astype(float), ctx.astype(int), gen.astype(int)


def _azure_rows(path: Path, limit: int | None, tokens: bool):
    """(timestamp, context, generated) per row, in file order (the token columns only when ``tokens``)."""
    from datetime import datetime

    if path_kind(path) != "file":
        raise UserError("Azure trace not found (pass arrival.azure_path)", str(path))
    reader = csv.DictReader(io.StringIO(read_text(path, "CSV file"), newline=""))
    check_csv_header(reader.fieldnames, f"{path}:1",
                     ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if tokens else ("TIMESTAMP",))
    count = 0
    for i, row in enumerate(reader, start=2):
        raw = (row["TIMESTAMP"] or "").strip()
        try:
            # e.g. 2023-11-16 18:15:46.6805900 (7 fractional digits: cut to microseconds)
            head, _, frac = raw.partition(".")
            ts = datetime.fromisoformat(head).timestamp() + (float("0." + frac) if frac else 0.0)
        except ValueError:
            raise UserError(f"bad TIMESTAMP {raw!r}", f"{path}:{i}") from None
        ctx = gen = 0
        if tokens:
            try:
                ctx, gen = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError):
                raise UserError("ContextTokens and GeneratedTokens must be integers", f"{path}:{i}") from None
        yield ts, ctx, gen
        count += 1
        if limit is not None and count >= limit:
            break
