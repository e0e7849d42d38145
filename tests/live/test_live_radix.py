"""prism's policies inside SGLang's real radix cache, against the simulator's cache (differential).

Both caches see the same random sequence of inserts, admission matches, locks and evictions, on one logical
clock (SGLang's classic tree reads ``time.monotonic``; the test points its module at the logical clock). With
LRU both must give equal hit lengths and evicted-token counts at every step; with DART (anchors, published
priorities) they must evict the same nodes in the same order.
"""

from __future__ import annotations

import random
from contextlib import nullcontext
from array import array

import numpy as np
import pytest

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from hypothesis import given, settings, strategies as st  # noqa: E402
from sglang.srt.mem_cache import radix_cache as sgl_radix  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402

from prism.core import PRIV, REUSE, SYS, SegmentTable, layout, serialize  # noqa: E402
from prism.live.radix import PrismRadixCache  # noqa: E402
from prism.policies.base import DemandHints  # noqa: E402
from prism.policies.dart import DART, DARTConfig  # noqa: E402
from prism.policies.eviction import LRU  # noqa: E402
from prism.sim.radix_cache import RadixCache  # noqa: E402


class Clock:
    """Stands in for the ``time`` module inside SGLang's radix_cache: a logical monotonic clock. With ``tick``,
    every reading is a hair later than the previous one (SGLang's own LRU breaks ties in access time by the
    order of a set; ticks make its times follow the order nodes are stamped in, which is the simulator's
    tie-break by node age)."""

    def __init__(self, real, tick: float = 0.0) -> None:
        self._now = 0.0
        self._tick = tick
        self._real = real

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value

    def monotonic(self) -> float:
        self._now += self._tick
        return self._now

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.fixture
def clock(monkeypatch):
    c = Clock(sgl_radix.time)
    monkeypatch.setattr(sgl_radix, "time", c)
    return c


class _Allocator:
    device = "cpu"

    def free_segment(self, *args, **kwargs) -> None:
        pass


def sglang_cache(policy, page_size: int) -> PrismRadixCache:
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=_Allocator(),
                             page_size=page_size)
    return PrismRadixCache(params, policy)


def prompts(rng: random.Random, n: int):
    table = SegmentTable()
    sys_seg = table.segment("sys", SYS, rng.choice([5, 8, 13]))
    pool = [table.segment(f"p{i}", REUSE, rng.randint(3, 12)) for i in range(8)]
    out = []
    for i in range(n):
        segs = (sys_seg, *rng.sample(pool, rng.randint(1, 3)), table.segment(f"q{i}", PRIV, rng.randint(2, 9)))
        out.append((serialize(segs), layout(segs)))
    return out


def _key(tokens):
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(token_ids=array("q", tokens.astype("int64").tobytes()))


def native_lru_cache(page_size: int):
    """SGLang's own classic RadixCache with its own LRU strategy: no prism code at all."""
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=_Allocator(),
                             page_size=page_size)
    return sgl_radix.RadixCache(params)


def check_peeks(sim: RadixCache, live: PrismRadixCache, items, rng: random.Random, step: int) -> None:
    """The live cache's peek index has SGLang's tree's shape, edge for edge, and its peeks (the project's one
    prefix walk over it) answer as the simulator's cache does, for whole and cut prompts. The index is built at
    the first peek and kept from then on; now and then it is dropped, so that one built late from the tree is
    checked as well as one kept through inserts, splits and evictions."""
    if rng.random() < 0.2:
        live.index = None
    index = live._peeks()
    stack = [(live.root_node, index.root)]
    while stack:
        node, peek = stack.pop()
        assert (peek.position, peek.depth) == (node.position, node.depth), step
        assert len(peek.children) == len(node.children), step
        for child in node.children.values():
            entry = peek.children[child.peek.key[:index._pb]]
            assert entry is child.peek, step
            assert np.frombuffer(entry.key, dtype=np.int32).tolist() == list(child.key.token_ids), step
            stack.append((child, entry))
    for tokens, _ in items:
        key = tokens.tobytes()[:rng.randint(0, len(tokens)) * 4] if rng.random() < 0.3 else tokens.tobytes()
        assert live.match_len(key) == sim.match_len(key), step
        assert [d for _, d in live.match_path(key)] == [d for _, d in sim.match_path(key)], step


def play(seed: int, page_size: int, make_policy, check_order: bool, clock, native: bool = False) -> None:
    """One random sequence of inserts, matches, locks and evictions on the simulator's cache and an SGLang
    cache (prism's backend, or with ``native`` SGLang's own RadixCache and LRU), compared at every step."""
    rng = random.Random(seed)
    items = prompts(rng, 14)
    hints = DemandHints()
    sim_policy, live_policy = make_policy(hints), make_policy(hints)
    sim = RadixCache(None, page_size, anchors=sim_policy.needs_anchors)
    live = native_lru_cache(page_size) if native else sglang_cache(live_policy, page_size)
    sim_evicted, live_evicted = [], []
    delete = live._delete_leaf

    def record(node):
        live_evicted.append((len(node.key), *((node.kind, node.seg_id) if not native else ())))
        delete(node)

    def layout_of(lay):
        return nullcontext() if native else live.with_layout(lay)

    live._delete_leaf = record
    locks = []
    for step in range(60):
        clock.now = float(step)
        tokens, lay = rng.choice(items)
        op = rng.random()
        if op < 0.45:
            a = sim.insert(tokens.tobytes(), clock.now, lay)
            with layout_of(lay):
                b = live.insert(InsertParams(key=_key(tokens)))
            assert (len(tokens) - len(tokens) % page_size) - a[0] == b.prefix_len, step
        elif op < 0.75:
            hit, node = sim.match(tokens.tobytes(), clock.now, lay)
            with layout_of(lay):
                m = live.match_prefix(MatchPrefixParams(key=_key(tokens)))
            assert hit == m.device_prefix_len, step
            if rng.random() < 0.5 and hit:
                sim.lock(node)
                live.inc_lock_ref(m.last_device_node)
                locks.append((node, m.last_device_node))
        elif op < 0.85 and locks:
            node, lnode = locks.pop(rng.randrange(len(locks)))
            sim.unlock(node)
            live.dec_lock_ref(lnode)
        else:
            if rng.random() < 0.5:
                segs = sorted({s for _, l in items for _, _, s in l})
                hints.publish({s: float(rng.randint(0, 5)) for s in segs if rng.random() < 0.7})
            n = rng.randint(1, 40)
            sim_policy.prepare(sim)
            freed = sim.evict(n, sim_policy.key, lambda x: sim_evicted.append((x.length, x.kind, x.seg_id)))
            got = live.evict(EvictParams(num_tokens=n)).num_tokens_evicted
            assert freed == got, step
        assert sim.size == live.total_size(), step
        assert sim.evictable_size == live.evictable_size(), step
        if not native:
            assert dict(sim.resident) == dict(live.resident), step
            check_peeks(sim, live, items, rng, step)
    if check_order:
        assert sim_evicted == live_evicted
    if not native:  # the PrefixIndex protocol: siblings sorted by place are in SGLang's child order
        stack = [live.root_node]
        while stack:
            node = stack.pop()
            kids = list(node.children.values())
            assert kids == sorted(kids, key=lambda n: n.position)
            stack.extend(kids)


@pytest.mark.parametrize("policy, same_order", [
    (lambda hints: LRU(hints=hints), False), (lambda hints: DART(hints=hints), True),
    (lambda hints: DART(DARTConfig(f=2), hints), True)], ids=["lru", "dart", "dart-f2"])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), page_size=st.sampled_from([1, 4]))
def test_sglang_cache_matches_the_simulator_step_by_step(policy, same_order, seed, page_size):
    """LRU: equal hits, evictions and sizes at every step; DART: also the same nodes evicted in order (with a
    protection set smaller than the segments, whose ties in P̂ both caches break in the order segments became
    resident)."""
    with pytest.MonkeyPatch.context() as mp:
        c = Clock(sgl_radix.time)
        mp.setattr(sgl_radix, "time", c)
        play(seed, page_size, policy, check_order=same_order, clock=c)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), page_size=st.sampled_from([1, 4]))
def test_sglangs_own_lru_gives_the_simulators_hits_and_evicted_tokens(seed, page_size):
    """Unmodified SGLang RadixCache (its LRU strategy) against the simulator's LRU: equal hit lengths, evicted
    tokens and sizes at every step (nodes stamped in one operation: see ``Clock``'s tick)."""
    with pytest.MonkeyPatch.context() as mp:
        c = Clock(sgl_radix.time, tick=1e-9)
        mp.setattr(sgl_radix, "time", c)
        play(seed, page_size, lambda hints: LRU(hints=hints), check_order=False, clock=c, native=True)


def test_split_hands_segment_ownership_to_the_new_upper_node(clock):
    table = SegmentTable()
    a = (table.segment("sys", SYS, 4), table.segment("p1", REUSE, 6), table.segment("q1", PRIV, 3))
    b = (table.segment("sys", SYS, 4), table.segment("p2", REUSE, 5), table.segment("q2", PRIV, 3))
    live = sglang_cache(DART(hints=DemandHints()), 1)
    for segs in (a, b):
        with live.with_layout(layout(segs)):
            live.insert(InsertParams(key=_key(serialize(segs))))
    # anchors: sys | p1 | q1 and, after the shared sys node, p2 | q2
    sys_node = live.root_node.children[int(a[0].tokens[0])]
    assert (len(sys_node.key), sys_node.kind, sys_node.seg_id, sys_node.depth) == (4, SYS, "sys", 4)
    kids = sorted((c.seg_id, len(c.key), c.depth) for c in sys_node.children.values())
    assert kids == [("p1", 6, 10), ("p2", 5, 9)]
    assert dict(live.resident) == {"sys": 1, "p1": 1, "p2": 1}


def test_a_hashed_branch_is_cut_as_a_fresh_one():
    """``_cut``'s two paths give the same nodes: a branch this insert made, sliced once per part, and one whose
    page hashes SGLang already computed, split by SGLang part by part (the offsets then relative to what is
    left): the same keys and KV indices top-down, each part linked under the one above it, and the hashes
    split by page."""
    import torch

    for hashed in (False, True):
        cache = sglang_cache(LRU(), 1)
        cache.insert(InsertParams(key=_key(np.arange(100, 112)), value=torch.arange(12)))
        node = next(iter(cache.root_node.children.values()))
        if hashed:
            node.hash_value = [str(i) for i in range(12)]
        chain = [*cache._cut(node, [3, 7]), node]
        parents = [cache.root_node, *chain[:-1]]
        assert all(n.parent is p and p.children[n.key.child_key(1)] is n for n, p in zip(chain, parents))
        assert [list(n.key.token_ids) for n in chain] == [[100, 101, 102], [103, 104, 105, 106], list(range(107, 112))]
        assert [n.value.tolist() for n in chain] == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9, 10, 11]]
        if hashed:
            assert [n.hash_value for n in chain] == [["0", "1", "2"], ["3", "4", "5", "6"], ["7", "8", "9", "10", "11"]]
