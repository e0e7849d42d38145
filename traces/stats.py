"""Trace statistics, including the hit rate an infinite cache would reach.

The infinite-cache hit of a request is the longest common token prefix of its prompt with any earlier
prompt. Because different segments never share a first token, two prompts agree exactly as far as their
leading segments agree (a segment used at two lengths agrees up to the shorter), so a trie over segments
gives the exact token count without touching tokens.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from prism.core import PRIV, REUSE, Request


class _SegNode:
    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: dict[str, dict[int, _SegNode]] = {}


def infinite_cache_hits(requests: Sequence[Request], keep_last_token: bool = True) -> list[int]:
    """Per request, in order: tokens of its prompt that earlier prompts already cover.

    ``keep_last_token``: like an engine, at least one prompt token is always computed.
    """
    root = _SegNode()
    hits = []
    for r in requests:
        node, hit, matching = root, 0, True
        for seg in r.segments:
            by_len = node.children.setdefault(seg.id, {})
            if matching:
                if seg.length in by_len:
                    hit += seg.length
                else:
                    hit += max((min(n, seg.length) for n in by_len), default=0)
                    matching = False
            node = by_len.setdefault(seg.length, _SegNode())
        if keep_last_token:
            hit = min(hit, r.prompt_len - 1)
        hits.append(hit)
    return hits


def infinite_cache_hit_rate(requests: Sequence[Request]) -> float:
    total = sum(r.prompt_len for r in requests)
    return sum(infinite_cache_hits(requests)) / total if total else 0.0


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
        "infinite_cache_hit_rate": infinite_cache_hit_rate(reqs),
    }
    if hot:
        out["hot_fraction"] = float(np.mean([any(s.id in hot for s in r.segments) for r in reqs]))
    return out
