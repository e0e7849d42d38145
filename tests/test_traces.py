"""Trace generation statistics, determinism, the JSONL format, and the infinite-cache hit rate."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from conftest import PRIV, REUSE, SYS, brute_force_hits, make_trace, need_data
from prism.core import Request, SegmentTable, hashed_tokens, output_token_bytes
from prism.core import _OUTPUT_SEED
from prism.errors import UserError
from prism.sim.radix_cache import RadixCache
from prism.traces import trace as fmt
from prism.traces.spec import generate, load_trace
from prism.traces.stats import infinite_cache_hits, trace_stats
from prism.traces.zipf import ZipfHotspotSpec, _categorical, _ZipfDraws


@pytest.fixture(scope="module")
def big():
    return generate(ZipfHotspotSpec(num_requests=4000, seed=11))


def test_hot_fraction_within_sampling_error(big):
    hot = set(big.meta["hot_set"])
    flags = np.array([any(s.id in hot for s in r.segments) for r in big.requests])
    n, p = len(flags), 0.7
    assert abs(flags.mean() - p) < 4 * np.sqrt(p * (1 - p) / n)


def test_single_hot_passage_ranks_follow_zipf(big):
    """The first hot draw is Zipf(1.2) over the hot ranks; requests with exactly one hot passage show it."""
    hot = big.meta["hot_set"]
    rank = {p: i for i, p in enumerate(hot)}
    counts = np.zeros(len(hot))
    for r in big.requests:
        mine = [rank[s.id] for s in r.segments if s.id in rank]
        if len(mine) == 1:
            counts[mine[0]] += 1
    w = np.arange(1, len(hot) + 1, dtype=float) ** -1.2
    expected = w / w.sum() * counts.sum()
    assert counts.sum() > 300
    # pool the sparse tail so every expected count is >= 5
    keep = expected >= 5
    obs, exp = counts[keep], expected[keep]
    if (~keep).any():
        obs, exp = np.append(obs, counts[~keep].sum()), np.append(exp, expected[~keep].sum())
    assert sps.chisquare(obs, exp).pvalue > 1e-3


PAPER = dict(hot_placement="draw", hot_count=[0, 0, 0.4, 0.4, 0.2])  # traces/zipf.yaml's reading


def test_hot_count_follows_its_probabilities():
    tr = generate(ZipfHotspotSpec(num_requests=4000, seed=5, **PAPER))
    hot = set(tr.meta["hot_set"])
    counts = np.bincount([sum(s.id in hot for s in r.segments) for r in tr.requests], minlength=6)
    n_hot = counts[1:].sum()
    assert counts[1] == counts[2] == 0  # a hot request takes 3, 4 or 5 hot passages
    assert abs(n_hot / 4000 - 0.7) < 4 * np.sqrt(0.7 * 0.3 / 4000)
    assert sps.chisquare(counts[3:], np.array([0.4, 0.4, 0.2]) * n_hot).pvalue > 1e-3


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.integers(0, 9), min_size=1, max_size=8).filter(any), seed=st.integers(0, 2**32 - 1))
def test_categorical_draws_what_numpys_choice_draws(weights, seed):
    """The generator's draw of a hot count is numpy's ``choice`` with probabilities, draw for draw (zero
    weights included), and leaves the stream where ``choice`` leaves it."""
    p = np.array(weights, dtype=float) / sum(weights)
    draw = _categorical(p)
    ours, numpys = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(200):
        assert draw(ours) == int(numpys.choice(len(p), p=p))
    assert ours.random() == numpys.random()


def test_zipf_draws_are_the_same_whichever_sets_are_kept(monkeypatch):
    """The cumulative weights kept per set drawn are a cache: a trace made keeping none is the same trace."""
    spec = ZipfHotspotSpec(num_requests=300, qps=50.0, seed=7)
    kept = generate(spec)
    monkeypatch.setattr(_ZipfDraws, "MAX_SETS", 0)
    assert [r.segments for r in generate(spec).requests] == [r.segments for r in kept.requests]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_shuffling_a_range_draws_numpys_permutation(seed):
    """The retriever's order is ``rng.permutation``'s, made by shuffling a list (numpy's permutation of an int
    shuffles an arange the same way), and leaves the stream where ``permutation`` leaves it."""
    ours, numpys = np.random.default_rng(seed), np.random.default_rng(seed)
    for n in [*range(12), 40] * 5:
        order = list(range(n))
        ours.shuffle(order)
        assert order == numpys.permutation(n).tolist()
    assert ours.random() == numpys.random()


@pytest.mark.parametrize("placement", ["draw", "rank"])
def test_hot_passages_lead_the_retrieved_ones(placement):
    tr = generate(ZipfHotspotSpec(num_requests=500, seed=2, hot_placement=placement, hot_count="uniform"))
    rank = {p: i for i, p in enumerate(tr.meta["hot_set"])}
    for r in tr.requests:
        flags = [s.id in rank for s in r.segments[1:-1]]
        assert flags == sorted(flags, reverse=True)  # every hot passage before every other one
        if placement == "rank":
            ranks = [rank[s.id] for s in r.segments[1:-1] if s.id in rank]
            assert ranks == sorted(ranks)


def test_placement_moves_passages_not_their_choice():
    """The hot passages drawn, and every request's passage set, do not depend on where they are placed."""
    shuffled = generate(ZipfHotspotSpec(num_requests=300, seed=4, hot_count=[0, 0, 0.4, 0.4, 0.2]))
    for placement in ("draw", "rank"):
        tr = generate(ZipfHotspotSpec(num_requests=300, seed=4, hot_placement=placement,
                                      hot_count=[0, 0, 0.4, 0.4, 0.2]))
        hot = set(tr.meta["hot_set"])
        for a, b in zip(shuffled.requests, tr.requests):
            assert {s.id for s in a.segments if s.id in hot} == {s.id for s in b.segments if s.id in hot}


def test_paper_reading_raises_the_trace_order_ceiling():
    """Hot passages first (in draw order) let requests share prefixes in trace order: the infinite-cache hit
    rate of traces/zipf.yaml's reading is far above the shuffled one's (0.41 vs 0.27 at 2,048 requests)."""
    first = trace_stats(generate(ZipfHotspotSpec(num_requests=2048, seed=0, **PAPER)))["infinite_cache_hit_rate"]
    shuffled = trace_stats(generate(ZipfHotspotSpec(num_requests=2048, seed=0)))["infinite_cache_hit_rate"]
    assert first == pytest.approx(0.41, abs=0.02) and shuffled == pytest.approx(0.27, abs=0.02)


@pytest.mark.parametrize("bad,message", [
    ({"hot_count": [0.5, 0.5]}, "expected k = 5"),
    ({"hot_count": [0, 0, 0.5, 0.4, 0.2]}, "sum to 1"),
    ({"hot_count": [0, 0, -0.2, 1.0, 0.2]}, "sum to 1"),
    ({"hot_count": "zipf"}, "'uniform'"),
])
def test_bad_hot_count(bad, message):
    with pytest.raises(ValueError, match=message):
        ZipfHotspotSpec(**bad)


def test_prompt_shape_and_mean_length(big):
    lens = np.array([r.prompt_len for r in big.requests])
    assert abs(lens.mean() - 768) < 2
    for r in big.requests[:200]:
        kinds = [s.kind for s in r.segments]
        assert kinds == [SYS] + [REUSE] * 5 + [PRIV]
        assert len({s.id for s in r.segments}) == 7


def test_qps_changes_arrivals_only():
    a = generate(ZipfHotspotSpec(num_requests=300, qps=40.0, seed=5))
    b = generate(ZipfHotspotSpec(num_requests=300, qps=80.0, seed=5))
    assert [r.segments for r in a.requests] == [r.segments for r in b.requests]
    assert all((ra.tokens() == rb.tokens()).all() for ra, rb in zip(a.requests, b.requests))
    ta = np.array([r.arrival for r in a.requests])
    tb = np.array([r.arrival for r in b.requests])
    assert np.allclose(ta, 2 * tb)  # the same exponential draws, scaled


def test_poisson_rate_within_sampling_error():
    t = generate(ZipfHotspotSpec(num_requests=4000, qps=50.0, seed=1))
    gaps = np.diff([0.0] + [r.arrival for r in t.requests])
    # mean gap 1/50 with standard error (1/50)/sqrt(n)
    assert abs(gaps.mean() - 0.02) < 4 * 0.02 / np.sqrt(len(gaps))
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1


def test_different_segments_never_share_a_first_token(big):
    firsts = {}
    for r in big.requests:
        for s in r.segments:
            firsts.setdefault(int(s.tokens[0]), set()).add(s.id)
    assert all(len(ids) == 1 for ids in firsts.values())


def _splitmix64_token(seed: int, position: int, low: int, high: int) -> int:
    """splitmix64 (Steele, Lea and Flood 2014) in Python integers, one position: the reference."""
    mask = (1 << 64) - 1
    x = (seed + (position + 1) * 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return low + (x ^ (x >> 31)) % (high - low)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), start=st.integers(0, 2**40), count=st.integers(0, 40_000),
       low=st.integers(0, 2**20), width=st.integers(1, 2**30))
@example(seed=2**64 - 1, start=2**40, count=40_000, low=0, width=2**30)  # three blocks, whatever the draws
def test_hashed_tokens_are_splitmix64_of_their_position(seed, start, count, low, width):
    """Every token, across the blocks the array is worked in, is the position's splitmix64 in Python integers."""
    got = hashed_tokens(seed, start, count, low, low + width)
    assert got.shape == (count,) and got.dtype == np.int32
    for i in sorted({0, count // 2, 16_383, 16_384, 16_385, 32_767, 32_768, count - 1} & set(range(count))):
        assert int(got[i]) == _splitmix64_token(seed, start + i, low, low + width), i


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 5000), min_size=1, max_size=12))
def test_output_tokens_are_one_stream_cut_to_each_length(counts):
    """Whatever lengths are asked for, in whatever order (the stream grows as longer ones come), a request's
    output tokens are the shared stream's first ones, hashed by position."""
    for n in counts:
        assert output_token_bytes(n) == hashed_tokens(_OUTPUT_SEED, 0, n).tobytes()


def test_jsonl_round_trip(tmp_path, tiny_zipf):
    path = tmp_path / "t.jsonl"
    fmt.save(tiny_zipf, path)
    back = fmt.load(path)
    assert len(back) == len(tiny_zipf)
    for a, b in zip(tiny_zipf.requests, back.requests):
        assert a.id == b.id and a.arrival == pytest.approx(b.arrival, abs=1e-9) and a.output_len == b.output_len
        assert np.array_equal(a.tokens(), b.tokens())
    assert back.meta == tiny_zipf.meta
    # loading through the generic entry point, with a rate change, keeps the prompts
    re = load_trace(str(path), {"qps": 5.0})
    assert np.array_equal(re.requests[7].tokens(), tiny_zipf.requests[7].tokens())
    assert trace_stats(re)["mean_qps"] == pytest.approx(5.0)


def test_explicit_tokens_round_trip(tmp_path):
    table = SegmentTable()
    table.declare("tok", REUSE, tokens=[500, 501, 502, 503])
    tr = make_trace([(0.0, [(SYS, "s", 3), (REUSE, "tok", 4), (PRIV, "q", 2)], 1)], table)
    fmt.save(tr, tmp_path / "x.jsonl")
    back = fmt.load(tmp_path / "x.jsonl")
    assert back.requests[0].tokens()[3:7].tolist() == [500, 501, 502, 503]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=0, max_size=4), st.integers(0, 3),
                          st.integers(1, 3)), min_size=1, max_size=30))
def test_infinite_cache_trie_equals_token_radix(reqs):
    """The segment trie's exact hit counts equal a token-level radix tree of unbounded size."""
    specs = []
    for i, (passages, trunc, sys_len) in enumerate(reqs):
        segs = [(SYS, f"s{sys_len}", 4)] + [(REUSE, f"p{p}", 6 - (trunc if j == len(passages) - 1 else 0))
                                            for j, p in enumerate(passages)] + [(PRIV, f"q{i}", 3)]
        specs.append((float(i), segs, 1))
    tr = make_trace(specs)
    expected = []
    cache = RadixCache(None)
    for r in tr.requests:
        key = r.tokens().tobytes()
        expected.append(min(cache.match_len(key), r.prompt_len - 1))
        cache.insert(key, 0.0)
    assert infinite_cache_hits(tr.requests) == expected
    # equal segments that are other objects (a trace read from a file, requests rebuilt): the same walk
    copies = [Request(r.id, r.arrival, tuple(replace(s) for s in r.segments), r.output_len) for r in tr.requests]
    assert infinite_cache_hits(copies) == expected


def test_multihop_corpus_uses_real_evidence():
    need_data("multihop_rag", "queries.json")
    t = load_trace("zipf.yaml", {"corpus": "multihop_rag", "num_requests": 300, "hot_choice": "most_cited"})
    ids = {s.id for r in t.requests for s in r.segments if s.kind == REUSE}
    assert all(i.startswith("mh") for i in ids)
    assert len(t.meta["hot_set"]) == 20
    st_ = trace_stats(t)
    assert 0.6 < st_["hot_fraction"] < 0.8


def _as_rows(trace):
    return (trace.kind, trace.spec, trace.meta,
            [(r.id, r.arrival, [(s.kind, s.id, s.length) for s in r.segments], r.output_len, r.session,
              r.fixed_order) for r in trace.requests])


@pytest.mark.parametrize("source, data, first, then", [
    ("zipf", None, {"qps": 40.0}, [{"qps": 80.0}, {"arrival": "gamma", "arrival_cv": 3.0, "qps": 50.0}]),
    ("prefix20", None, {"qps": 40.0, "num_requests": 500}, [{"qps": 218.0, "num_requests": 500}]),
    ("multihop", "multihop_rag", {"qps": 40.0, "num_requests": 300}, [{"qps": 70.0, "num_requests": 300}]),
    ("agent", "tau_bench", {"qps": 10.0, "num_requests": 300}, [{"qps": 30.0, "num_requests": 300}]),
    ("mooncake", "mooncake", {"num_requests": 300}, [{"num_requests": 300, "qps": 5.0},
                                                     {"num_requests": 300, "time_scale": 0.5},
                                                     {"num_requests": 300, "arrival": "poisson", "qps": 7.0,
                                                      "seed": 3}]),
])
def test_traces_at_other_arrivals_reuse_their_prompts_exactly(source, data, first, then):
    """A memo of load_trace keeps a spec's prompts across arrival settings (a sweep's rates): each trace made
    from it is the trace made from scratch, field by field, with the same infinite-cache hit rate."""
    if data:
        need_data(data)
    memo: dict = {}
    load_trace(source, first, memo)
    for overrides in then:
        made = load_trace(source, overrides, memo)
        fresh = load_trace(source, overrides)
        assert len(memo) == 1, "the prompts were made again"
        assert _as_rows(made) == _as_rows(fresh)
        assert made.infinite_cache_hit_rate() == fresh.infinite_cache_hit_rate()
    other = load_trace(source, {**first, "num_requests": 100}, memo)  # a content field: new prompts
    assert len(memo) == 2 and _as_rows(other) == _as_rows(load_trace(source, {**first, "num_requests": 100}))


def test_a_materialized_trace_at_other_rates_is_read_once(tmp_path):
    path = tmp_path / "t.jsonl"
    fmt.save(load_trace("zipf", {"num_requests": 300}), path)
    memo: dict = {}
    for overrides in ({"qps": 40.0}, {"qps": 90.0}, {}):
        made = load_trace(str(path), overrides, memo)
        assert len(memo) == 1, "the file was read again"
        assert _as_rows(made) == _as_rows(load_trace(str(path), overrides))
        assert made.infinite_cache_hit_rate() == load_trace(str(path), overrides).infinite_cache_hit_rate()
    assert _as_rows(load_trace(str(path), {"qps": 40.0, "num_requests": 50}, memo)) == _as_rows(
        load_trace(str(path), {"qps": 40.0, "num_requests": 50}))
    assert len(memo) == 2
    with pytest.raises(UserError, match="cannot override 'seed'"):  # a field a file cannot take, memo or not
        load_trace(str(path), {"qps": 40.0, "seed": 3}, memo)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=4),
                min_size=1, max_size=12))
def test_the_hit_ceiling_of_real_tokens_matches_brute_force(prompts):
    """Tiny vocabularies make segments share first tokens, be prefixes of each other and repeat under other ids."""
    table = SegmentTable()
    reqs = []
    for i, segs in enumerate(prompts):
        parts = []
        for j, tokens in enumerate(segs):
            sid = f"r{i}.{j}"
            table.declare(sid, REUSE, tokens=tokens)
            parts.append(table.segment(sid, REUSE, len(tokens)))
        reqs.append(Request(i, float(i), tuple(parts), 1))
    assert infinite_cache_hits(reqs) == brute_force_hits(reqs)
