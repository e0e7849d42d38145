"""Trace statistics, including the hit rate an infinite cache would reach.

The infinite-cache hit of a request is the longest common token prefix of its prompt with any earlier
prompt. In a generated trace different segments never share a first token, so two prompts agree exactly as far
as their leading segments agree (a segment used at two lengths agrees up to the shorter), and a trie over
segments gives the exact token count without touching tokens. A trace of real tokens (imported, or made with a
tokenizer) breaks that premise — every ChatML message starts with ``<|im_start|>``, and a turn's prompt ends with
the generation prompt its successor's history continues — so its hits come from the tokens themselves: the
longest common prefix of a string with a set of strings is the longer of those with its two neighbours in sorted
order, kept as big-endian bytes (whose order is the tokens' order).
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any, Iterator, Sequence

import numpy as np

from prism.core import KINDS, PRIV, REUSE, TOKEN_BYTES, Request, Segment


class _SegNode:
    """A node of the segment trie: its children by segment (by the segment's code, :func:`_walk`), and their
    segments by first token. A child is a node, or ``(segments, i)``: a path that one prompt alone has taken so
    far, which goes on with ``segments[i + 1:]``; it becomes nodes only where a later prompt follows it."""

    __slots__ = ("children", "by_first")

    def __init__(self) -> None:
        self.children: dict[int, "_SegNode | tuple[tuple[Segment, ...], int]"] = {}
        self.by_first: dict[int, Segment | list[Segment]] = {}

    def add(self, code: int, seg: Segment, child: "_SegNode | tuple[tuple[Segment, ...], int]") -> None:
        self.children[code] = child
        if seg.length:
            other = self.by_first.get(seg.first)
            self.by_first[seg.first] = seg if other is None else [*(other if isinstance(other, list) else [other]), seg]

    def expand(self, code: int, path: tuple[tuple[Segment, ...], int], codes: "_Codes") -> "_SegNode":
        """The child at ``code``, a one-prompt ``path``, made a node."""
        segments, i = path
        node = _SegNode()
        if i + 1 < len(segments):
            nxt = segments[i + 1]
            node.add(codes.of(nxt), nxt, (segments, i + 1))
        self.children[code] = node
        return node


class _Codes:
    """A small integer per segment value (equal by kind, id and length), found by the segment object's ``id``: a
    segment's own hash is a Python call, and a trie walk would make one at every level (a trace reuses a few
    thousand segment objects in every prompt). An object enters ``by_id`` once a lookup finds its value already
    coded (its second sighting, or the first of an object equal to one seen): a prompt's own segments, seen once,
    never do (prefix20: the walk's peak 305 -> 223 bytes a request). The objects in ``by_id`` are held, so an
    ``id`` is never another's."""

    __slots__ = ("by_id", "by_value", "held")

    def __init__(self) -> None:
        self.by_id: dict[int, int] = {}
        self.by_value: dict[Segment, int] = {}
        self.held: list[Segment] = []

    def of(self, seg: Segment) -> int:
        code = self.by_id.get(id(seg))
        if code is None:
            new = len(self.by_value)
            code = self.by_value.setdefault(seg, new)
            if code != new:
                self.by_id[id(seg)] = code
                self.held.append(seg)
        return code


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def infinite_cache_hits(requests: Sequence[Request], keep_last_token: bool = True,
                        unit: str = "tokens") -> list[int]:
    """Per request, in order: how much of its prompt earlier prompts already cover.

    ``unit="tokens"`` counts tokens (with ``keep_last_token``, at least one prompt token is always computed,
    as in an engine), from the tokens if any segment holds real ones; ``unit="segments"`` counts whole leading
    segments (Mooncake's block hit rate).
    """
    return list(_hits(requests, keep_last_token, unit))


def _hits(requests: Sequence[Request], keep_last_token: bool = True, unit: str = "tokens") -> Iterator[int]:
    """:func:`infinite_cache_hits` one request at a time."""
    if unit == "tokens" and any(s.explicit is not None for r in requests for s in r.segments):
        return iter(_token_hits(requests, keep_last_token))
    return (t if unit == "tokens" else s for t, s in _walk(requests, keep_last_token))


def _token_hits(requests: Sequence[Request], keep_last_token: bool) -> list[int]:
    """Exact token hits over the prompts' tokens (module docstring). Memory: every prompt's bytes."""
    earlier: list[bytes] = []
    hits = []
    for r in requests:
        key = r.tokens().astype(">i4").tobytes()
        i = bisect.bisect_left(earlier, key)
        best = max((_lcp_bytes(key, earlier[j]) for j in (i - 1, i) if 0 <= j < len(earlier)), default=0)
        earlier.insert(i, key)
        hit = best // TOKEN_BYTES
        hits.append(min(hit, r.prompt_len - 1) if keep_last_token else hit)
    return hits


def _lcp_bytes(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    diff = np.flatnonzero(np.frombuffer(a, np.uint8, n) != np.frombuffer(b, np.uint8, n))
    return int(diff[0])


def _walk(requests: Sequence[Request], keep_last_token: bool = True) -> Iterator[tuple[int, int]]:
    """(token hit, whole-segment hit) per request, in turn (a sum keeps no list): see :func:`infinite_cache_hits`.

    Memory: a node per segment prefix that two or more prompts share, one entry per prompt where it leaves them
    (its own path is referred to, not copied), a code per segment value and an entry per object seen twice:
    O(requests) small objects."""
    root, codes = _SegNode(), _Codes()
    by_id = codes.by_id
    for r in requests:
        node, hit, whole = root, 0, 0
        segments = r.segments
        for i, seg in enumerate(segments):
            code = by_id.get(id(seg))  # codes.of(seg), its common case inline: once a level
            if code is None:
                code = codes.of(seg)
            child = node.children.get(code)
            if child is None:  # the prompt leaves the tree: credit a sibling's common first tokens
                same = node.by_first.get(seg.first) if seg.length else None
                if same is not None:
                    hit += max(_lcp(seg.tokens, other.tokens) for other in (same if isinstance(same, list) else [same]))
                node.add(code, seg, (segments, i))
                break
            hit += seg.length
            whole += 1
            node = child if isinstance(child, _SegNode) else node.expand(code, child, codes)
        if keep_last_token:
            hit = min(hit, r.prompt_len - 1)
        yield hit, whole


def infinite_cache_hit_rate(requests: Sequence[Request]) -> float:
    """Over a trace of several models, each model's prompts only see its own (models never share KV)."""
    total = sum(r.prompt_len for r in requests)
    if not total:
        return 0.0
    groups: dict[str | None, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.model, []).append(r)
    return sum(sum(_hits(g)) for g in groups.values()) / total


def model_stats(requests: Sequence[Request], gap_s: float = 10.0) -> dict[str, Any]:
    """What characterizes several models' traffic (DESIGN §9; ../shared/data/README.md): requests per model,
    the top models' shares, models active (with a request) in each whole minute, idle gaps over ``gap_s``
    between a model's consecutive requests, and the inter-arrival CV of all requests."""
    times: dict[str, list[float]] = {}
    for r in requests:
        times.setdefault(str(r.model), []).append(r.arrival)
    counts = sorted(((len(t), m) for m, t in times.items()), key=lambda c: (-c[0], c[1]))
    n = len(requests)
    arrivals = np.array([r.arrival for r in requests])
    start = arrivals[0]
    minutes = int((arrivals[-1] - start) // 60)
    active = [sum(bool(np.any((t >= start + 60 * k) & (t < start + 60 * (k + 1))))
                  for t in map(np.asarray, times.values())) for k in range(minutes)]
    gaps = np.diff(arrivals)
    return {
        "requests_per_model": {m: c for c, m in counts},
        "top3_models_share": sum(c for c, _ in counts[:3]) / n,
        "top5_models_share": sum(c for c, _ in counts[:5]) / n,
        "active_models_per_minute": ({"min": min(active), "p50": float(np.median(active)), "max": max(active)}
                                     if active else {}),
        f"idle_gaps_over_{gap_s:g}s": int(sum((np.diff(t) > gap_s).sum() for t in times.values())),
        "interarrival_cv": float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 0.0,
    }


def segment_stats(requests: Sequence[Request], top: int = 5) -> dict[str, Any]:
    """What a trace's prompts are made of: per kind the distinct segments and their share of the prompt tokens;
    per label (the ``LABEL:`` of an imported trace's ids: sys, tools, doc, tool, user, asst, blk) the distinct
    segments; and reuse: how many requests share each reusable segment, and the most shared."""
    tokens: Counter = Counter()
    distinct: dict[str, set] = {}
    users: Counter = Counter()  # requests per segment id
    length: dict[str, int] = {}
    for r in requests:
        for sid in {s.id for s in r.segments}:
            users[sid] += 1
        for s in r.segments:
            tokens[s.kind] += s.length
            distinct.setdefault(s.kind, set()).add(s.id)
            length[s.id] = max(length.get(s.id, 0), s.length)
    total = sum(tokens.values()) or 1
    by_kind = {k: {"segments": len(distinct[k]), "token_share": tokens[k] / total} for k in KINDS if k in distinct}
    labels = Counter(sid.split(":", 1)[0] for ids in distinct.values() for sid in ids if ":" in sid)
    reusable = [sid for sid in distinct.get(REUSE, ())]
    shared = [sid for sid in reusable if users[sid] > 1]
    ranked = sorted(shared, key=lambda sid: (-users[sid], sid))[:top]
    return {"segments_by_kind": by_kind,
            **({"segments_by_label": dict(sorted(labels.items()))} if labels else {}),
            "reusable_shared": {"segments": len(shared), "of": len(reusable),
                                "requests_with_one": sum(any(users[s.id] > 1 for s in r.segments if s.kind == REUSE)
                                                         for r in requests)},
            "most_shared": [[sid, users[sid], length[sid]] for sid in ranked]}


def trace_stats(trace) -> dict[str, Any]:
    reqs = trace.requests
    lens = np.array([r.prompt_len for r in reqs])
    uses: Counter = Counter()
    kinds: dict[str, str] = {}
    for r in reqs:
        for s in r.segments:
            uses[s.id] += 1
            kinds[s.id] = s.kind
    reuse_counts = np.array([c for sid, c in uses.items() if kinds[sid] == REUSE] or [0])
    hot = set(trace.meta.get("hot_set", []))
    sessions = {r.session for r in reqs if r.session is not None}
    arrivals = np.array([r.arrival for r in reqs])
    span = float(arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0
    out: dict[str, Any] = {
        "kind": trace.kind,
        "requests": len(reqs),
        "sessions": len(sessions),
        "unique_segments": len(uses),
        "unique_reusable_segments": int(sum(1 for k in kinds.values() if k == REUSE)),
        "unique_private_segments": int(sum(1 for k in kinds.values() if k == PRIV)),
        "prompt_tokens": {"mean": float(lens.mean()), "p50": float(np.percentile(lens, 50)),
                          "p90": float(np.percentile(lens, 90)), "p99": float(np.percentile(lens, 99)),
                          "min": int(lens.min()), "max": int(lens.max())},
        "output_tokens_mean": float(np.mean([r.output_len for r in reqs])),
        "reusable_segment_uses": {"mean": float(reuse_counts.mean()), "p50": float(np.percentile(reuse_counts, 50)),
                                  "p99": float(np.percentile(reuse_counts, 99)), "max": int(reuse_counts.max()),
                                  "used_once": int((reuse_counts == 1).sum())},
        "mean_qps": (len(reqs) - 1) / span if span > 0 else 0.0,
        "infinite_cache_hit_rate": trace.infinite_cache_hit_rate(),
        **segment_stats(reqs),
    }
    if trace.kind == "mooncake":
        total = sum(len(r.segments) for r in reqs)
        out["infinite_cache_block_hit_rate"] = sum(s for _, s in _walk(reqs)) / total
    if hot:
        out["hot_fraction"] = float(np.mean([any(s.id in hot for s in r.segments) for r in reqs]))
    if any(r.model is not None for r in reqs):
        out.update(model_stats(reqs))
    return out
