"""Replay of Mooncake (FAST'25) block-hash traces.

Each record is ``{timestamp (ms), input_length, output_length, hash_ids}`` with one hash id per 512-token
block: equal ids mean identical block content, so a request's prefix is its hash-id list. Each block becomes
a reusable segment with deterministic tokens (equal ids, equal tokens); the last block is cut to the input
length (a cut block is a prefix of the full one). The prompt is exactly its blocks, in order
(``fixed_order``); it has no private segment (a block used once is private in effect).

Options: a time scale or a target QPS (arrival order kept), a request cap, a prompt-length cap, and
``segment_tokens`` to cut each block into smaller segments, for engines whose page or QAS segment size is
smaller than 512 tokens. ``time_scale`` is bounded to [1e-6, 1e6] (MIN_TIME_SCALE, MAX_TIME_SCALE): a
factor of a million either way turns an hour of the trace into 4 ms or 114 years, past any replay, and a scale
near a float's limits turns timestamps into 0 or infinity.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from prism.config import MAX_TOKENS, choice, count, nonneg, optional_path, path_kind, rate, read_jsonl, tokens, within
from prism.core import REUSE, Request, SegmentTable
from prism.errors import UserError

from prism.traces.arrivals import ArrivalSpec, arrival_times, default_data_dir, streams, variation
from prism.traces.trace import Trace

MIN_TIME_SCALE, MAX_TIME_SCALE = 1e-6, 1e6


@dataclass
class MooncakeSpec:
    kind: str = "mooncake"
    path: str | None = optional_path("the trace file (default ../shared/data/mooncake/conversation_trace.jsonl)")
    seed: int = nonneg(0, "seed of synthetic arrivals")
    num_requests: int | None = count(None, "request cap (null: the whole trace)")
    qps: float | None = rate(None, "target mean rate (rescales the timestamps; null: keep them)")
    time_scale: float = within(1.0, MIN_TIME_SCALE, MAX_TIME_SCALE,
                               "multiply inter-arrival times (ignored when qps is set)")
    arrival: str = choice("trace", ("trace", "poisson", "gamma", "azure_code", "azure_conv"),
                          "trace timestamps, or a synthetic process at qps")
    arrival_cv: float = variation(1.0, "gamma arrivals: coefficient of variation")
    block_tokens: int = tokens(512, "tokens per hash block in the source trace")
    segment_tokens: int = tokens(512, "tokens per segment (divides block_tokens)")
    output_len_cap: int | None = tokens(None, "cap on output tokens (null: the trace's)")
    max_input_tokens: int | None = tokens(None, "skip requests with longer prompts (null: keep all)")

    #: the fields only :meth:`arrive` reads (``content`` reads the file and the others)
    ARRIVAL_FIELDS: ClassVar[tuple[str, ...]] = ("seed", "qps", "time_scale", "arrival", "arrival_cv")

    def __post_init__(self) -> None:
        if self.block_tokens % self.segment_tokens:
            raise ValueError(f"field 'segment_tokens': {self.segment_tokens} does not divide "
                             f"block_tokens {self.block_tokens}")
        if self.arrival != "trace" and self.qps is None:
            raise ValueError(f"field 'qps': required with arrival {self.arrival!r}")

    def arrive(self, content: Trace) -> Trace:
        """The requests of ``content`` (at the file's timestamps) at this spec's arrival times: the file's,
        from 0 and scaled (to ``qps`` if set), or a synthetic process's at ``qps``."""
        spec = asdict(self)
        if self.arrival != "trace":
            return content.with_arrivals(arrival_times(ArrivalSpec(self.arrival, self.qps, self.arrival_cv),
                                                       len(content), streams(self.seed)[1]), spec)
        t0 = content.requests[0].arrival
        trace = content.with_arrivals(np.array([(r.arrival - t0) * self.time_scale for r in content.requests]), spec)
        return trace.rescaled(self.qps) if self.qps is not None else trace


def read_records(path: Path, limit: int | None = None) -> list[dict]:
    """The records of a raw Mooncake file, checked line by line (timestamps finite and non-decreasing)."""
    if path_kind(path) is None:
        raise UserError("Mooncake trace not found (set path)", str(path))
    out: list[dict] = []
    for where, rec in read_jsonl(path, "Mooncake trace (JSONL)"):
        if not isinstance(rec, dict):
            raise UserError(f"expected a JSON object, got {type(rec).__name__}", where)
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in rec:
                raise UserError(f"missing field {key!r}", where)
        ts = rec["timestamp"]
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not 0 <= ts < math.inf:
            raise UserError(f"field 'timestamp': must be a finite non-negative number of ms, got {ts!r}", where)
        if out and ts < out[-1]["timestamp"]:
            raise UserError(f"field 'timestamp': {ts!r} is earlier than the previous line's "
                            f"{out[-1]['timestamp']!r} (timestamps must not decrease)", where)
        hashes = rec["hash_ids"]
        if not isinstance(hashes, list) or not hashes or not all(_int(h) and h >= 0 for h in hashes):
            raise UserError("field 'hash_ids': must be a non-empty list of integers >= 0 (block hashes)", where)
        if not _int(rec["input_length"]) or not 1 <= rec["input_length"] <= MAX_TOKENS:
            raise UserError(f"field 'input_length': must be an integer in 1..{MAX_TOKENS}", where)
        if not _int(rec["output_length"]) or not 0 <= rec["output_length"] <= MAX_TOKENS:
            raise UserError(f"field 'output_length': must be an integer in 0..{MAX_TOKENS}", where)
        rec["_line"] = int(where.rsplit(":", 1)[1])
        out.append(rec)
        if limit is not None and len(out) >= limit:
            break
    return out


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def content(spec: MooncakeSpec) -> Trace:
    """The requests the filters keep, at the file's timestamps (their arrival times: ``spec.arrive``)."""
    path = Path(spec.path) if spec.path else default_data_dir() / "mooncake" / "conversation_trace.jsonl"
    records = read_records(path)
    bt, st = spec.block_tokens, spec.segment_tokens
    table = SegmentTable()
    requests = []
    for rec in records:
        n_in = rec["input_length"]
        if spec.max_input_tokens is not None and n_in > spec.max_input_tokens:
            continue
        blocks = rec["hash_ids"]
        if len(blocks) != math.ceil(n_in / bt):
            raise UserError(f"{len(blocks)} hash ids for {n_in} tokens (expected ceil(input/{bt}))",
                            f"{path}:{rec['_line']}")
        rid = len(requests)
        segs = []
        left = n_in
        for h in blocks:
            for part in range(bt // st):
                if left <= 0:
                    break
                n = min(st, left)
                seg_id = f"b{h}" if st == bt else f"b{h}.{part}"
                segs.append(table.segment(seg_id, REUSE, n))
                left -= n
        out = rec["output_length"] if spec.output_len_cap is None else min(rec["output_length"], spec.output_len_cap)
        requests.append(Request(rid, rec["timestamp"] / 1000.0, tuple(segs), max(1, out), None, True))
        if spec.num_requests is not None and len(requests) >= spec.num_requests:
            break
    if not requests:
        raise UserError("no request left after the filters", str(path))
    return Trace(requests, table, "mooncake", asdict(spec), {"source": str(path), "block_tokens": bt})


def block_hit_rate(records: list[dict]) -> float:
    """Share of blocks an infinite cache already holds as a prefix (the trace's own definition)."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for rec in records:
        h = tuple(rec["hash_ids"])
        total += len(h)
        k = 0
        while k < len(h) and h[:k + 1] in seen:
            k += 1
        hit += k
        seen.update(h[:i + 1] for i in range(len(h)))
    return hit / total if total else 0.0
