"""The ``prefix_groups`` trace kind: its statistics against the spec (closed forms and sampling error), the
infinite-cache hit rate against its closed form and against a token radix tree, determinism, and bad knobs."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from scipy import stats as sps

from prism.cli.sim import main as sim_main
from prism.core import PRIV, SYS
from prism.sim.radix_cache import RadixCache
from prism.traces.prefix_groups import PrefixGroupsSpec
from prism.traces.spec import generate
from prism.traces.spec import load_trace


def group_of(r) -> int:
    return int(r.segments[0].id[1:])


def digest(trace) -> str:
    return hashlib.sha256(json.dumps([(r.id, r.arrival, [(s.id, s.length) for s in r.segments], r.output_len)
                                      for r in trace.requests]).encode()).hexdigest()


def test_shipped_spec_is_the_issue_shape():
    t = load_trace("prefix20")
    assert len(t) == 2048 and t.spec["qps"] == 50
    for r in t.requests:
        assert [s.kind for s in r.segments] == [SYS, PRIV]
        assert [s.length for s in r.segments] == [640, 128]
        assert r.output_len == 32
    assert {group_of(r) for r in t.requests} == set(range(20))


def test_uniform_hit_rate_matches_the_closed_form():
    """A request hits its whole prefix iff its group came before: exactly (P / (P + Q)) · (n − distinct) / n
    for the drawn groups, and in expectation n − G·(1 − (1 − 1/G)^n) repeats (occupancy), within 5 sigma."""
    n, g, p, q = 3000, 2000, 96, 32
    t = generate(PrefixGroupsSpec(num_requests=n, groups=g, prefix_tokens=p, private_tokens=q, seed=3))
    distinct = len({group_of(r) for r in t.requests})
    assert t.infinite_cache_hit_rate() == pytest.approx(p / (p + q) * (n - distinct) / n, rel=1e-12)
    miss = (1 - 1 / g) ** n
    mean = g * (1 - miss)
    var = g * (g - 1) * (1 - 2 / g) ** n + g * miss - g * g * miss * miss
    assert abs(distinct - mean) < 5 * np.sqrt(var)


def test_infinite_hits_equal_a_token_radix_tree():
    t = generate(PrefixGroupsSpec(num_requests=300, groups=7, prefix_tokens=24, private_tokens=8,
                                  popularity="zipf", zipf_s=1.1, seed=4))
    cache, hit = RadixCache(None), 0
    for r in t.requests:
        key = r.tokens().tobytes()
        hit += min(cache.match_len(key), r.prompt_len - 1)
        cache.insert(key, 0.0)
    assert t.infinite_cache_hit_rate() == hit / sum(r.prompt_len for r in t.requests)


@pytest.mark.parametrize("popularity,s", [("uniform", 1.0), ("zipf", 1.2), ("zipf", 0.5)])
def test_group_popularity_follows_the_spec(popularity, s):
    spec = PrefixGroupsSpec(num_requests=6000, groups=12, popularity=popularity, zipf_s=s, seed=9)
    t = generate(spec)
    counts = np.bincount([group_of(r) for r in t.requests], minlength=12)
    w = np.arange(1, 13, dtype=float) ** -s if popularity == "zipf" else np.ones(12)
    assert sps.chisquare(counts, w / w.sum() * len(t)).pvalue > 1e-3


def test_poisson_arrivals_at_the_rate():
    t = generate(PrefixGroupsSpec(num_requests=4000, qps=50.0, seed=1))
    gaps = np.diff([0.0] + [r.arrival for r in t.requests])
    assert abs(gaps.mean() - 0.02) < 4 * 0.02 / np.sqrt(len(gaps))
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1


def test_deterministic_and_qps_changes_arrivals_only():
    a = generate(PrefixGroupsSpec(num_requests=500, seed=5, qps=40.0))
    assert digest(a) == digest(generate(PrefixGroupsSpec(num_requests=500, seed=5, qps=40.0)))
    b = generate(PrefixGroupsSpec(num_requests=500, seed=5, qps=80.0))
    assert [r.segments for r in a.requests] == [r.segments for r in b.requests]
    assert np.allclose([r.arrival for r in a.requests], [2 * r.arrival for r in b.requests])
    assert digest(a) != digest(generate(PrefixGroupsSpec(num_requests=500, seed=6, qps=40.0)))


@pytest.mark.parametrize("spec,fragment", [
    ("groups: 0", "groups"),
    ("prefix_tokens: -5", "prefix_tokens"),
    ("private_tokens: 2.5", "private_tokens"),
    ("popularity: pareto", "popularity"),
    ("zipf_s: 0", "zipf_s"),
    ("prefix_tokens: 4194304\nprivate_tokens: 1", "private_tokens"),
    ("group: 3", "group"),
])
def test_bad_knobs_are_one_line_errors(tmp_path, capsys, spec, fragment):
    path = tmp_path / "p.yaml"
    path.write_text(f"kind: prefix_groups\n{spec}\n")
    code = sim_main(["--trace", str(path), "--no-progress", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("prism-sim: error:") and "p.yaml" in err[0] and fragment in err[0], err
