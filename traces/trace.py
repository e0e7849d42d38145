"""A materialized trace, and its JSONL file format.

Format (one JSON object per line, UTF-8):

1. header: ``{"prism_trace": 1, "kind": "zipf_hotspot", "spec": {...}, "meta": {...}}``;
2. one line per segment id, before its first use:
   ``{"seg": "p17", "kind": "reuse", "first": 18}``: tokens are ``first`` followed by the hashed stream of
   the id (see :mod:`prism.core`), or ``{"seg": ..., "kind": ..., "tokens": [...]}`` with explicit ids
   (when a real tokenizer made them);
3. one line per request, in arrival order:
   ``{"id": 0, "t": 0.0123, "segs": [["sys", 96], ["p17", 128], ..., ["q0", 31]], "out": 32}``
   (``t`` in seconds; each segment used with its length, a prefix of the segment's tokens; optional
   ``"session"``, ``"fixed": true`` for prompts whose segments must keep their order, and ``"model"`` for a
   trace of several models: one of the header's ``meta.models``).

A trace of several models lists them in its header's ``meta.models`` (:class:`ServedModel`: name, profile
model, tensor-parallel size, SLOs); files without models are single-model traces, as before.

Loading checks every line and names the file and line of the first problem. Of the header's ``spec`` (the
spec the trace was made from), the fields a run reads, ``qps`` and ``seed``, are checked by the rules of a
spec's own fields (:class:`HeaderSpec`); the others only describe the trace.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from prism.core import KINDS, SYS, Request, Segment, SegmentTable
from prism.config import MAX_TOKENS, build, nonneg, positive, rate, read_jsonl
from prism.errors import UserError
from prism.output import atomic_path

FORMAT_VERSION = 1
MAX_TOKEN_ID = 2**31 - 1  # token ids are int32


@dataclass
class HeaderSpec:
    """The fields of a header's ``spec`` that a run reads: summaries and run folders name its rate and seed."""

    qps: float | None = rate(None, "the mean arrival rate the trace was made at")
    seed: int | None = nonneg(None, "the seed it was made with")


@dataclass
class ServedModel:
    """A model the requests of a multi-model trace go to. ``profile`` names a profile model
    (``calibration/profiles/models.yaml``), checked where profiles are known (the command-line layer); null SLOs
    are set by the run (a dedicated-GPU calibration)."""

    name: str = ""
    profile: str = ""
    tp: int = positive(1, "GPUs the model is split over (tensor parallelism)")
    ttft_slo_s: float | None = positive(None, "time-to-first-token SLO, seconds (null: set by the run)")
    tpot_slo_s: float | None = positive(None, "time-per-output-token SLO, seconds (null: set by the run)")

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"field 'name': must be a non-empty name without '/', got {self.name!r}")
        if not self.profile:
            raise ValueError("field 'profile': must name a profile model (e.g. llama-3.2-1b)")


def served_models(meta: dict[str, Any], where: str = "meta") -> list[ServedModel]:
    """The models of a trace's ``meta.models`` (none for a single-model trace), validated."""
    entries = meta.get("models", [])
    if not isinstance(entries, list):
        raise UserError("field 'models': must be a list of models", where)
    served = [build(ServedModel, e, f"{where}.models[{i}]") for i, e in enumerate(entries)]
    names = [m.name for m in served]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise UserError(f"field 'name': model {n!r} is listed twice", f"{where}.models[{i}]")
    return served


def _token_ok(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID


@dataclass
class Trace:
    requests: list[Request]
    table: SegmentTable
    kind: str = "custom"
    spec: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. the hot set
    _infinite_hit_rate: float | None = field(default=None, repr=False, compare=False)
    _largest: tuple[Segment, Request] | None = field(default=None, repr=False, compare=False)
    _of_model: dict[str | None, list[int]] | None = field(default=None, repr=False, compare=False)
    _last_arrival: float | None = field(default=None, repr=False, compare=False)

    def infinite_cache_hit_rate(self) -> float:
        """Hit rate of an unbounded cache over the trace's own prompt order (computed once)."""
        if self._infinite_hit_rate is None:
            from prism.traces.stats import infinite_cache_hit_rate

            self._infinite_hit_rate = infinite_cache_hit_rate(self.requests)
        return self._infinite_hit_rate

    def largest(self) -> tuple[Segment, Request]:
        """The longest segment and the request with the most prompt + output tokens (computed once: every run
        checks them against its KV pool)."""
        if self._largest is None:  # C-level iteration: a trace of 20,480 RAG prompts holds 143,000 segments
            segments = chain.from_iterable(map(attrgetter("segments"), self.requests))
            self._largest = (max(segments, key=attrgetter("length")),
                             max(self.requests, key=lambda r: r.prompt_len + r.output_len))
        return self._largest

    def positions_of_models(self) -> dict[str | None, list[int]]:
        """Where each model's requests stand in the trace, in order (None: requests without a model); computed
        once: a fleet and each of its parts read them."""
        if self._of_model is None:
            out: dict[str | None, list[int]] = {}
            for i, r in enumerate(self.requests):
                out.setdefault(r.model or None, []).append(i)
            self._of_model = out
        return self._of_model

    def last_arrival(self) -> float:
        """The latest arrival (0 without requests); computed once."""
        if self._last_arrival is None:
            self._last_arrival = max((r.arrival for r in self.requests), default=0.0)
        return self._last_arrival

    def __len__(self) -> int:
        return len(self.requests)

    def with_arrivals(self, times: np.ndarray, spec: dict[str, Any] | None = None) -> "Trace":
        """The same prompts in the same order at new arrival times (``spec``: the spec they are now of). The
        infinite-cache hit rate, a property of the prompts in that order, goes with them if computed."""
        reqs = [Request(r.id, t, r.segments, r.output_len, r.session, r.fixed_order, r.model)  # tolist: same floats,
                for r, t in zip(self.requests, np.asarray(times, dtype=float).tolist())]  # made in one call
        return Trace(reqs, self.table, self.kind, self.spec if spec is None else spec, self.meta,
                     self._infinite_hit_rate)

    def rescaled(self, qps: float) -> "Trace":
        """Same requests, arrival times scaled so that the mean rate is ``qps`` (order kept)."""
        t = np.array([r.arrival for r in self.requests])
        if len(t) < 2 or t[-1] <= t[0]:
            return self
        t = (t - t[0]) * ((len(t) - 1) / qps / (t[-1] - t[0]))
        return self.with_arrivals(t)

    def head(self, n: int) -> "Trace":
        return Trace(self.requests[:n], self.table, self.kind, self.spec, self.meta)


def save(trace: Trace, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    declared: set[str] = set()
    with atomic_path(p) as tmp, tmp.open("w") as f:  # a reader never sees half a trace
        head = {"prism_trace": FORMAT_VERSION, "kind": trace.kind, "spec": trace.spec, "meta": trace.meta}
        f.write(json.dumps(head, sort_keys=True) + "\n")
        for r in trace.requests:
            for s in r.segments:
                if s.id not in declared:
                    declared.add(s.id)
                    explicit = trace.table.explicit_tokens(s.id)
                    line: dict[str, Any] = {"seg": s.id, "kind": s.kind}
                    if explicit is not None:
                        line["tokens"] = explicit.tolist()
                    else:
                        line["first"] = trace.table.first_token(s.id)
                    f.write(json.dumps(line) + "\n")
            line = {"id": r.id, "t": round(r.arrival, 9), "segs": [[s.id, s.length] for s in r.segments],
                    "out": r.output_len}
            if r.session is not None:
                line["session"] = r.session
            if r.fixed_order:
                line["fixed"] = True
            if r.model is not None:
                line["model"] = r.model
            f.write(json.dumps(line) + "\n")


def load(path: str | Path) -> Trace:
    p = Path(path)
    table = SegmentTable()
    requests: list[Request] = []
    ids: dict[int, str] = {}
    declared: dict[str, str] = {}  # segment id -> the line that declared it
    header: dict[str, Any] | None = None
    models: set[str] = set()
    for where, obj in read_jsonl(p, "trace file (JSONL)"):
        if not isinstance(obj, dict):
            raise UserError(f"expected a JSON object, got {type(obj).__name__}", where)
        if header is None:
            if obj.get("prism_trace") != FORMAT_VERSION:
                raise UserError(f"not a PRISM trace (first line needs \"prism_trace\": {FORMAT_VERSION})", where)
            _check_header(obj, where)
            header = obj
            models = {m.name for m in served_models(obj.get("meta") or {}, f"{where}: meta")}
            continue
        if "seg" in obj:
            _segment_line(obj, table, where, declared)
        else:
            req = _request_line(obj, table, where, requests)
            if req.model is not None and req.model not in models:
                raise UserError(f"field 'model': {req.model!r} is not one of the header's meta.models "
                                f"({', '.join(sorted(models)) or 'none'})", where)
            if req.id in ids:
                raise UserError(f"field 'id': request id {req.id} repeats (first at {ids[req.id]})", where)
            ids[req.id] = where
            requests.append(req)
    if header is None:
        raise UserError("empty trace file", str(p))
    if not requests:
        raise UserError("trace has no requests", str(p))
    return Trace(requests, table, str(header.get("kind", "custom")), header.get("spec") or {},
                 header.get("meta") or {})


def _check_header(obj: dict, where: str) -> None:
    if not isinstance(obj.get("kind", ""), str):
        raise UserError("field 'kind': must be a string", where)
    for key in ("spec", "meta"):
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            raise UserError(f"field {key!r}: must be a JSON object", where)
    spec, meta = obj.get("spec") or {}, obj.get("meta") or {}
    read = {f.name for f in fields(HeaderSpec)}
    build(HeaderSpec, {k: v for k, v in spec.items() if k in read}, f"{where}: spec")
    hot = meta.get("hot_set", [])
    if not isinstance(hot, list) or not all(isinstance(s, str) for s in hot):
        raise UserError("field 'meta': 'hot_set' must be a list of segment ids", where)


def _segment_line(obj: dict, table: SegmentTable, where: str, declared: dict[str, str]) -> None:
    """A segment's declaration; one that repeats an earlier one must say the same (two segments with one id
    have identical tokens: a second declaration with other tokens would be ignored without a word)."""
    seg_id, kind = obj.get("seg"), obj.get("kind")
    if not isinstance(seg_id, str) or not seg_id:
        raise UserError("field 'seg': must be a non-empty string", where)
    if kind not in KINDS:
        raise UserError(f"field 'kind': must be one of {', '.join(KINDS)}, got {kind!r}", where)
    tokens = obj.get("tokens")
    first = obj.get("first")
    if tokens is not None:
        if (not isinstance(tokens, list) or not tokens or len(tokens) > MAX_TOKENS
                or not all(_token_ok(t) for t in tokens)):
            raise UserError(f"field 'tokens': must be a list of 1..{MAX_TOKENS} token ids in 0..{MAX_TOKEN_ID}",
                            where)
    elif not _token_ok(first):
        raise UserError(f"field 'first': must be a token id in 0..{MAX_TOKEN_ID} (or give 'tokens')", where)
    if seg_id in declared:
        explicit = table.explicit_tokens(seg_id)
        same = (explicit.tolist() == tokens if explicit is not None and tokens is not None
                else explicit is None and tokens is None and table.first_token(seg_id) == first)
        if table.kind(seg_id) == kind and not same:
            raise UserError(f"segment {seg_id!r} declared again with other tokens (first at {declared[seg_id]}): a "
                            "segment id names one token sequence", where)
    try:
        table.declare(seg_id, kind, first_token=first, tokens=tokens)
    except ValueError as e:
        raise UserError(str(e), where) from None
    declared.setdefault(seg_id, where)


def _request_line(obj: dict, table: SegmentTable, where: str, previous: list[Request]) -> Request:
    unknown = set(obj) - {"id", "t", "segs", "out", "session", "fixed", "model"}
    if unknown:
        raise UserError(f"unknown field {sorted(unknown)[0]!r}", where)
    rid, t, segs, out = obj.get("id"), obj.get("t"), obj.get("segs"), obj.get("out")
    if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
        raise UserError("field 'id': must be a non-negative integer", where)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t < math.inf:
        raise UserError(f"field 't': must be a finite non-negative number of seconds, got {t!r}", where)
    if previous and t < previous[-1].arrival:
        raise UserError("field 't': requests must be in arrival order", where)
    if not isinstance(out, int) or isinstance(out, bool) or not 1 <= out <= MAX_TOKENS:
        raise UserError(f"field 'out': must be an integer in 1..{MAX_TOKENS}, got {out!r}", where)
    if not isinstance(segs, list) or not segs:
        raise UserError("field 'segs': must be a non-empty list of [id, length]", where)
    segments = []
    for item in segs:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or not isinstance(item[1], int) or isinstance(item[1], bool) or not 1 <= item[1] <= MAX_TOKENS):
            raise UserError(f"field 'segs': bad entry {item!r} (expected [id, length in 1..{MAX_TOKENS}])", where)
        if item[0] not in table:
            raise UserError(f"field 'segs': segment {item[0]!r} used before its declaration", where)
        try:
            segments.append(table.segment(item[0], table.kind(item[0]), item[1]))
        except ValueError as e:
            raise UserError(str(e), where) from None
    check_layout(segments, where)
    session = obj.get("session")
    fixed = obj.get("fixed", False)
    if not isinstance(fixed, bool):
        raise UserError("field 'fixed': must be true or false", where)
    model = obj.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise UserError("field 'model': must be a model name", where)
    return Request(rid, float(t), tuple(segments), out, None if session is None else str(session), fixed, model)


def check_layout(segments: Iterable[Segment], where: str) -> None:
    """At most one system segment, and it comes first."""
    kinds = [s.kind for s in segments]
    if SYS in kinds[1:]:
        raise UserError("the system ('sys') segment must come first", where)
