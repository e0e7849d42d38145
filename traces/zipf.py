"""The ``zipf_hotspot`` RAG workload of the PRISM paper.

Each request is ``sys`` (system prompt and template) + k retrieved passages of ``chunk_tokens`` tokens +
a private question. A request is *hot* (probability ``r_hot``) when at least one of its passages is in the
hot set: it takes n hot passages (``hot_count``: ``uniform`` over 1..k, or the probabilities of 1, 2, ..., k),
drawn without replacement with Zipf(``zipf_s``) weights over the hot set's ranks, and fills the other slots
with non-hot passages. A cold request takes no hot passage.

The paper leaves two things open, and its published hit rates (49.1% for PRISM, 43.2% for the strongest
baseline, which never reorders passages) pin them down only loosely; ``hot_placement`` says where the hot
passages sit among the k:

* ``random``: the retriever's order is a random permutation of all k passages, so two requests that share
  passages rarely share a *prefix* until a scheduler aligns them (QAS's front alignment). With uniform
  counts the trace-order hit ceiling is about 0.27, below the baseline's published rate: this reading
  cannot be the paper's (``traces/zipf-shuffled.yaml`` keeps it as a sensitivity case).
* ``draw``: hot passages first, in the order the Zipf draw picked them (a retriever that ranks popular
  passages high), the non-hot ones after them in random order;
* ``rank``: hot passages first by hot-set rank (most popular first), the non-hot ones after.

``traces/zipf.yaml`` uses ``draw`` with 3/4/5 hot passages at probabilities 0.4/0.4/0.2: its trace-order
ceiling is about 0.41, the reading closest to the published rates.

Non-hot passages come from the synthetic corpus (uniform) or, with ``corpus: multihop_rag``, from the
evidence set of a real MultiHop-RAG query (topped up to k at random), so co-citation is real.

Content and arrivals use separate random streams: changing ``qps`` never changes a prompt.

Bounds: the synthetic corpus holds at most MAX_PASSAGES passages (their ids take about 100 MB at the bound),
the hot set at most MAX_HOT_SET (the Zipf draw keeps the remaining weights of the first 4,096 sets it draws,
about 130 MB at the bound, 1.3 GB at 10,000), a request retrieves at most MAX_K passages (RAG pipelines retrieve
3-20), and a prompt (system + k passages + question) holds at most MAX_TOKENS tokens.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from prism.config import (MAX_TOKENS, MAX_ZIPF_S, choice, fraction, optional_path, parse_json, path_kind, positive,
                          read_jsonl, read_text, tokens)
from prism.core import PRIV, REUSE, SYS, Request, SegmentTable
from prism.errors import UserError

from prism.traces.arrivals import GeneratedTraceSpec, default_data_dir, streams
from prism.traces.trace import Trace


MAX_PASSAGES, MAX_HOT_SET, MAX_K = 1_000_000, 1000, 100


@dataclass
class ZipfHotspotSpec(GeneratedTraceSpec):
    kind: str = "zipf_hotspot"
    corpus: str = choice("synthetic", ("synthetic", "multihop_rag"), "where non-hot passages come from")
    corpus_path: str | None = optional_path("multihop_rag folder (default ../shared/data/multihop_rag)")
    num_passages: int = positive(981, "passages in the synthetic corpus", le=MAX_PASSAGES)
    chunk_tokens: int = tokens(128, "tokens per passage")
    k: int = positive(5, "passages retrieved per request", le=MAX_K)
    hot_set: int = positive(20, "passages in the hot set", le=MAX_HOT_SET)
    r_hot: float = fraction(0.7, "probability that a request is hot")
    zipf_s: float = positive(1.2, "Zipf exponent over the hot set's ranks", le=MAX_ZIPF_S)
    hot_choice: str = choice("random", ("random", "most_cited"), "hot set: random, or most-cited (multihop)")
    hot_placement: str = choice("random", ("random", "draw", "rank"),
                                "where hot passages sit among the k: random order, first in draw order, first by rank")
    hot_count: str | list[float] = field(default="uniform", metadata={
        "doc": "hot passages per hot request: 'uniform' over 1..k, or the probabilities of 1, 2, ..., k"})
    sys_tokens: int = tokens(96, "system prompt + template tokens")
    suffix_min: int = tokens(16, "private question, minimum tokens")
    suffix_max: int = tokens(48, "private question, maximum tokens")

    def __post_init__(self) -> None:
        if self.suffix_max < self.suffix_min:
            raise ValueError("field 'suffix_max': must be >= suffix_min")
        longest = self.sys_tokens + self.k * self.chunk_tokens + self.suffix_max
        if longest > MAX_TOKENS:
            raise ValueError(f"field 'k': a prompt of {self.sys_tokens} + {self.k} x {self.chunk_tokens} + "
                             f"{self.suffix_max} tokens is longer than {MAX_TOKENS}")
        if self.corpus == "synthetic":
            if self.hot_set >= self.num_passages:
                raise ValueError(f"field 'hot_set': must be < num_passages ({self.num_passages})")
            if self.k > self.num_passages - self.hot_set:
                raise ValueError(f"field 'k': {self.k} is larger than the {self.num_passages - self.hot_set} "
                                 "non-hot passages of the corpus")
        if isinstance(self.hot_count, str):
            if self.hot_count != "uniform":
                raise ValueError(f"field 'hot_count': must be 'uniform' or a list of {self.k} probabilities, "
                                 f"got {self.hot_count!r}")
        else:
            probs = self.hot_count
            if len(probs) != self.k:
                raise ValueError(f"field 'hot_count': {len(probs)} probabilities, expected k = {self.k} "
                                 "(of 1, 2, ..., k hot passages)")
            if not all(math.isfinite(p) and p >= 0 for p in probs) or abs(sum(probs) - 1) > 1e-9:
                raise ValueError(f"field 'hot_count': probabilities must be >= 0 and sum to 1, got {list(probs)}")


class _ZipfDraws:
    """Distinct indices drawn one by one with probability proportional to the remaining weights.

    The first draw is exactly Zipf-distributed, which the tests check on single-hot requests. The cumulative
    weights once the indices drawn so far are set to zero are numpy's sums, as ever, made once for each set drawn
    (a trace draws from the same few sets thousands of times) up to ``MAX_SETS`` sets: each holds a cumulative
    sum of the hot set."""

    MAX_SETS = 4096

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = np.array(weights, dtype=float)  # its own copy: the sums it keeps are of these
        self._after: dict[int, tuple[list[float], float, int]] = {}  # drawn, as a bit set -> cumulative, total, last

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        after, out, drawn = self._after, [], 0
        for _ in range(n):
            sums = after.get(drawn)
            if sums is None:
                sums = self._remaining(drawn)
            cumulative, total, last = sums
            i = bisect.bisect_right(cumulative, rng.random() * total)
            if i > last:
                i = last
            out.append(i)
            drawn |= 1 << i
        return out

    def _remaining(self, drawn: int) -> tuple[list[float], float, int]:
        w = self.weights.copy()
        w[[i for i in range(len(w)) if drawn >> i & 1]] = 0.0
        sums = (np.cumsum(w).tolist(), float(w.sum()), len(w) - 1)
        if len(self._after) < self.MAX_SETS:
            self._after[drawn] = sums
        return sums


def _categorical(p: np.ndarray) -> Callable[[np.random.Generator], int]:
    """A draw of index i with probability ``p[i]``: ``rng.choice(len(p), p=p)`` draw for draw (numpy's own
    method: one uniform variate placed among the normalized cumulative sums), without its checks of ``p`` at
    every call, which were a quarter of a trace's generation. The tests hold it to ``rng.choice``."""
    cdf = p.cumsum()
    cdf /= cdf[-1]
    bounds = cdf.tolist()
    return lambda rng: bisect.bisect_right(bounds, rng.random())


def load_multihop(folder: Path) -> tuple[list[str], dict[str, int], list[list[str]]]:
    """Passage ids, citation counts, and each query's evidence list (queries with evidence only)."""
    passages = folder / "evidence_passages.jsonl"
    queries = folder / "queries.json"
    if path_kind(passages) != "file" or path_kind(queries) != "file":
        raise UserError("MultiHop-RAG data not found (expected evidence_passages.jsonl and queries.json; "
                        "set corpus_path)", str(folder))
    ids, cites = [], {}
    for where, rec in read_jsonl(passages, "passages file (JSONL)"):
        if not isinstance(rec, dict) or not isinstance(rec.get("passage_id"), (int, str)):
            raise UserError("bad passage record (expected an object with 'passage_id')", where)
        pid = f"mh{rec['passage_id']}"
        ids.append(pid)
        query_ids = rec.get("query_ids", [])
        cites[pid] = len(query_ids) if isinstance(query_ids, list) else 0
    qs = parse_json(read_text(queries, "queries file (JSON)"), str(queries))
    if not isinstance(qs, list) or not all(isinstance(q, dict) for q in qs):
        raise UserError("expected a JSON list of query objects", str(queries))
    evidence = []
    for q in qs:
        ev = [f"mh{e['passage_id']}" for e in q.get("evidence_list") or [] if isinstance(e, dict) and "passage_id" in e]
        ev = list(dict.fromkeys(p for p in ev if p in cites))
        if ev:
            evidence.append(ev)
    return ids, cites, evidence


def content(spec: ZipfHotspotSpec) -> Trace:
    """The prompts, in arrival order (their arrival times: ``spec.arrive``)."""
    rng = streams(spec.seed)[0]

    evidence: list[list[str]] = []
    if spec.corpus == "multihop_rag":
        folder = Path(spec.corpus_path) if spec.corpus_path else default_data_dir() / "multihop_rag"
        passages, cites, evidence = load_multihop(folder)
        if spec.hot_set >= len(passages):
            raise UserError(f"field 'hot_set': must be < the corpus's {len(passages)} passages")
        if spec.hot_choice == "most_cited":
            hot = sorted(passages, key=lambda p: (-cites[p], int(p[2:])))[:spec.hot_set]
        else:
            hot = [passages[i] for i in rng.choice(len(passages), spec.hot_set, replace=False)]
    else:
        passages = [f"p{i}" for i in range(spec.num_passages)]
        hot = [passages[i] for i in rng.choice(len(passages), spec.hot_set, replace=False)]
    hot_set = set(hot)
    cold = [p for p in passages if p not in hot_set]
    if spec.k > len(cold):
        raise UserError(f"field 'k': {spec.k} is larger than the corpus's {len(cold)} non-hot passages")
    evidence = [[p for p in ev if p not in hot_set] for ev in evidence]
    evidence = [ev for ev in evidence if ev]

    ranks = np.arange(1, len(hot) + 1, dtype=float)
    zipf_w = ranks ** -spec.zipf_s
    zipf_w /= zipf_w.sum()

    hot_count = None if isinstance(spec.hot_count, str) else _categorical(np.asarray(spec.hot_count, dtype=float))
    zipf_draws = _ZipfDraws(zipf_w)
    table = SegmentTable()
    sys_seg = table.segment("sys", SYS, spec.sys_tokens)
    requests = []
    hot_flags = []
    for rid in range(spec.num_requests):
        is_hot = rng.random() < spec.r_hot
        chosen: list[str] = []
        if is_hot:
            n_hot = int(rng.integers(1, spec.k + 1)) if hot_count is None else hot_count(rng) + 1
            drawn = zipf_draws.draw(rng, min(n_hot, len(hot)))
            chosen = [hot[i] for i in (sorted(drawn) if spec.hot_placement == "rank" else drawn)]
        need = spec.k - len(chosen)
        if need:
            picked: list[str] = []
            if evidence:
                ev = evidence[int(rng.integers(len(evidence)))]
                picked = ev[:need]
            while len(picked) < need:
                p = cold[int(rng.integers(len(cold)))]
                if p not in picked:
                    picked.append(p)
            chosen += picked
        order = list(range(len(chosen)))  # the retriever's order (drawn whatever the placement): rng.permutation's,
        rng.shuffle(order)  # which shuffles an arange the same way, at about half the cost (tests/test_traces.py)
        if spec.hot_placement != "random":  # the hot passages lead, the rest follow in the retriever's order
            n_lead = spec.k - need
            order = [*range(n_lead), *(i for i in order if i >= n_lead)]
        reuse = [table.segment(chosen[i], REUSE, spec.chunk_tokens) for i in order]
        suffix = table.segment(f"q{rid}", PRIV, int(rng.integers(spec.suffix_min, spec.suffix_max + 1)))
        requests.append(Request(rid, 0.0, (sys_seg, *reuse, suffix), spec.output_len))
        hot_flags.append(bool(is_hot))

    return Trace(requests, table, "zipf_hotspot", asdict(spec), {"hot_set": hot})
