"""The radix cache against brute force: hit lengths, capacity, locks, eviction order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.sim.radix_cache import RadixCache


def key(tokens) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


def brute_lcp(query, resident, page: int) -> int:
    best = 0
    for seq in resident:
        n = min(len(seq), len(query))
        m = 0
        while m < n and seq[m] == query[m]:
            m += 1
        best = max(best, m)
    return best - best % page


# small alphabets and shared stems make long common prefixes likely
stems = st.lists(st.integers(0, 3), min_size=0, max_size=12)
seqs = st.lists(st.integers(0, 3), min_size=1, max_size=24)
ops = st.lists(st.tuples(st.sampled_from(["insert", "match", "lock", "unlock", "evict"]), seqs,
                         st.integers(1, 30)), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, page=st.sampled_from([1, 2, 4]), capacity=st.integers(8, 80), anchors=st.booleans())
def test_cache_matches_brute_force(ops, page, capacity, anchors):
    cache = RadixCache(capacity, page, anchors=anchors)
    locked = []  # nodes we hold locks on
    clock = 0.0
    for op, seq, n in ops:
        clock += 1.0
        k = key(seq)
        resident = [s.tolist() for s in cache.sequences()]
        # the peek equals brute-force LCP against what is resident, and changes nothing
        assert cache.match_len(k) == brute_lcp(seq, resident, page)
        if op == "insert":
            layout = [(len(seq) // 2, "reuse", "a"), (len(seq), "priv", "b")]
            cache.insert(k, clock, layout)
            # keep within capacity the way the engine does: evict unlocked leaves
            over = cache.size - capacity
            if over > 0:
                cache.evict(over, lambda nd: (nd.last_access_time,))
        elif op == "match":
            m, node = cache.match(k, clock)
            assert m == brute_lcp(seq, resident, page)
            assert node.depth == m
        elif op == "lock":
            _, node = cache.match(k, clock)
            if node is not cache.root:
                cache.lock(node)
                locked.append(node)
        elif op == "unlock" and locked:
            cache.unlock(locked.pop(n % len(locked)))
        elif op == "evict":
            protected = {id(x) for node in locked for x in _path(cache, node)}
            evicted = []
            cache.evict(n, lambda nd: (nd.last_access_time,), evicted.append)
            assert not protected & {id(e) for e in evicted}, "a locked node was evicted"
        cache.check()
        locked_tokens = sum(x.length for x in {id(x): x for nd in locked for x in _path(cache, nd)}.values())
        # capacity is exceeded only when locked prefixes alone exceed it (the engine never lets that happen)
        assert cache.size <= max(capacity, locked_tokens + len(seq))


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["insert", "match"]), seqs, st.integers(0, 30)), min_size=1,
                    max_size=40),
       page=st.sampled_from([1, 2, 4]), anchors=st.booleans())
def test_a_walk_to_an_end_equals_a_walk_of_the_cut_key(ops, page, anchors):
    """match and insert of ``key`` up to ``end`` (the engine's prompt less its last token, its part computed so
    far) do to the tree what they do with ``key[:end]``: the same results, the same nodes, stamps and splits."""
    cut, bounded = RadixCache(None, page, anchors=anchors), RadixCache(None, page, anchors=anchors)
    for clock, (op, seq, e) in enumerate(ops):
        k, end = key(seq), min(e, len(seq)) * 4
        layout = [(len(seq) // 2, "reuse", "a"), (len(seq), "priv", "b")]
        if op == "insert":
            a, na = cut.insert(k[:end], float(clock), layout)
            b, nb = bounded.insert(k, float(clock), layout, end=end)
        else:
            a, na = cut.match(k[:end], float(clock), layout)
            b, nb = bounded.match(k, float(clock), layout, end=end)
        assert (a, na.depth, na.position) == (b, nb.depth, nb.position)
        assert _shape(cut) == _shape(bounded)
    bounded.check()


def _shape(cache):
    return sorted((n.position, n.key, n.depth, n.last_access_time, n.hit_count, n.kind, n.seg_id, n.parent.position)
                  for n in cache.nodes())


def _path(cache, node):
    out = []
    while node is not cache.root:
        out.append(node)
        node = node.parent
    return out


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(seqs, min_size=2, max_size=25), seed=st.integers(0, 1000), tokens=st.integers(1, 40))
def test_evictions_follow_the_key(batch, seed, tokens):
    """Every evicted node is, at its turn, the evictable leaf with the smallest (key, id)."""
    rng = np.random.default_rng(seed)
    cache = RadixCache(None, 1)
    for i, s in enumerate(batch):
        _, node = cache.insert(key(s), float(i))
        if rng.random() < 0.3:
            cache.lock(node)
    score = {n.created: float(rng.random()) for n in cache.nodes()}
    keyf = lambda nd: (score[nd.created],)  # noqa: E731
    order = []

    def on_evict(nd):
        candidates = cache.evictable_leaves()
        best = min(candidates, key=lambda c: (keyf(c), c.created))
        assert best is nd
        order.append(nd)

    before = cache.size
    freed = cache.evict(tokens, keyf, on_evict)
    assert freed == before - cache.size
    assert freed >= tokens or not cache.evictable_leaves()
    cache.check()


def test_split_keeps_locks_and_anchors_place_boundaries():
    cache = RadixCache(None, 1, anchors=True)
    layout = [(2, "sys", "s"), (5, "reuse", "r1"), (8, "priv", "q")]
    _, leaf = cache.insert(key([1, 1, 2, 2, 2, 3, 3, 3]), 1.0, layout)
    nodes = sorted(cache.nodes(), key=lambda n: n.depth)
    assert [(n.depth, n.kind, n.seg_id) for n in nodes] == [(2, "sys", "s"), (5, "reuse", "r1"), (8, "priv", "q")]
    cache.lock(leaf)
    assert cache.evictable_size == 0
    # a second prompt sharing sys + r1 splits nothing new and only adds its private suffix
    added, _ = cache.insert(key([1, 1, 2, 2, 2, 4, 4]), 2.0, [(2, "sys", "s"), (5, "reuse", "r1"), (7, "priv", "q2")])
    assert added == 2
    # a match that ends inside r1 splits it, and the upper half inherits the lock count
    m, node = cache.match(key([1, 1, 2, 9]), 3.0)
    assert m == 3 and node.lock_ref == 1
    cache.check()
    cache.unlock(leaf)
    assert cache.evictable_size == cache.size
    cache.check()


def test_page_size_floors_matches_and_insertions():
    cache = RadixCache(None, 4)
    added, _ = cache.insert(key(range(10)), 0.0)
    assert added == 8  # the partial page is not cached
    assert cache.match_len(key(list(range(6)) + [99, 99])) == 4


def _state(cache):
    nodes = sorted((n.position, n.created, n.key, n.depth, n.lock_ref, n.last_access_time, n.hit_count, n.kind, n.seg_id,
                    n.parent.position) for n in cache.nodes())
    return nodes, cache.size, cache.evictable_size, dict(cache.resident)


@settings(max_examples=150, deadline=None)
@given(requests=st.lists(st.tuples(seqs, st.integers(1, 10), st.lists(st.integers(0, 3), max_size=6)),
                         min_size=1, max_size=12),
       turns=st.lists(st.integers(0, 2), min_size=60, max_size=60), page=st.sampled_from([1, 2, 4]),
       anchors=st.booleans())
def test_walks_from_a_locked_node_equal_walks_from_the_root(requests, turns, page, anchors):
    """The engine's shortcuts over a request's life (each prefill chunk and the finished sequence inserted
    from the request's own locked node; its lock moved down with ``relock``) leave exactly the tree that
    walks from the root with lock-then-unlock leave, with requests interleaved so that others split their
    paths in between."""
    fast, plain = RadixCache(None, page, anchors=anchors), RadixCache(None, page, anchors=anchors)
    pending = list(enumerate(requests))
    active = []  # [request, stage, cached tokens, locked node in fast, locked node in plain]
    clock = 0.0
    for turn in turns:
        if pending and (len(active) < 3 or turn == 0):
            i, (seq, chunk, out) = pending.pop(0)
            layout = [(len(seq) // 2, "reuse", f"a{i % 3}"), (len(seq), "priv", f"q{i}")]
            clock += 1.0
            (m1, n1), (m2, n2) = (c.match(key(seq)[:-4], clock, layout) for c in (fast, plain))
            assert m1 == m2
            fast.lock(n1)
            plain.lock(n2)
            active.append([seq, chunk, out, layout, m1, n1, n2])
        elif active:
            a = active[turn % len(active)]
            seq, chunk, out, layout, done, n1, n2 = a
            clock += 1.0
            if done < len(seq):  # a prefill chunk
                done = min(len(seq), done + chunk)
                _, new1 = fast.insert(key(seq[:done]), clock, layout, start=n1)
                fast.relock(n1, new1)
                _, new2 = plain.insert(key(seq[:done]), clock, layout)
                plain.lock(new2)
                plain.unlock(n2)
                a[4:] = [done, new1, new2]
            else:  # finished: the prompt and its generated tokens
                fast.insert(key(seq + out), clock, layout, start=n1)
                plain.insert(key(seq + out), clock, layout)
                fast.unlock(n1)
                plain.unlock(n2)
                active.remove(a)
        assert _state(fast) == _state(plain)
        fast.check()


def brute_owner(ends, kinds, ids, offset):
    """The segment holding token ``offset - 1``, by a linear scan (past the prompt: the last segment)."""
    for e, k, s in zip(ends, kinds, ids):
        if offset - 1 < e:
            return k, s
    return kinds[-1], ids[-1]


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=8), page=st.sampled_from([1, 2, 4]),
       anchors=st.booleans(), data=st.data())
def test_pieces_cut_at_page_floors_of_segment_ends_and_belong_to_the_owner(lengths, page, anchors, data):
    """A new branch's pieces: with anchors, one per page-floored segment end strictly inside (start, end), then
    one to the end (generated tokens may run past the prompt); each owned by the segment holding its last
    token, found by a linear scan over the segments."""
    from prism.core import layout as make_layout
    from prism.core import Segment
    from prism.policies.anchors import owner, pieces
    ends = np.cumsum(lengths).tolist()
    kinds = ["sys"] + ["reuse"] * (len(lengths) - 2) + ["priv"] if len(lengths) > 1 else ["priv"]
    ids = [f"s{i}" for i in range(len(lengths))]
    layout = make_layout([Segment(k, s, np.zeros(n, dtype=np.int32)) for k, s, n in zip(kinds, ids, lengths)])
    start = data.draw(st.integers(0, ends[-1] - 1))
    end = data.draw(st.integers(start + 1, ends[-1] + 6))
    got = pieces(layout, start, end, page, anchors)
    inner = sorted({e - e % page for e in ends if start < e - e % page < end}) if anchors else []
    assert [c for c, _, _ in got] == inner + [end]
    assert [(k, s) for _, k, s in got] == [brute_owner(ends, kinds, ids, c) for c, _, _ in got]
    offset = data.draw(st.integers(1, ends[-1] + 6))
    assert owner(layout, offset) == brute_owner(ends, kinds, ids, offset)


def test_pieces_without_a_layout_are_one_private_node():
    from prism.policies.anchors import pieces
    assert pieces(None, 3, 10, 4, True) == [(10, "priv", "")]
    assert pieces((), 0, 5, 1, False) == [(5, "priv", "")]


def test_pieces_example():
    """sys [0,5), reuse r [5,12), priv q [12,14), pages of 4: the page holding 4..7 ends in r, so the first
    cut is at 4 (owned by sys, which holds token 3), then 12 (owned by r); 14 is not inside."""
    from prism.policies.anchors import pieces
    layout = ((5, "sys", "S"), (12, "reuse", "r"), (14, "priv", "q"))
    assert pieces(layout, 0, 16, 4, True) == [(4, "sys", "S"), (12, "reuse", "r"), (16, "priv", "q")]
    assert pieces(layout, 4, 13, 4, True) == [(12, "reuse", "r"), (13, "priv", "q")]
    assert pieces(layout, 0, 16, 4, False) == [(16, "priv", "q")]
    assert pieces(layout, 0, 8, 1, False) == [(8, "reuse", "r")]


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=7), page=st.sampled_from([1, 2, 4, 8]),
       span=st.tuples(st.integers(0, 70), st.integers(1, 70)), anchors=st.booleans())
def test_new_nodes_follow_the_anchor_rule(lengths, page, span, anchors):
    """``anchors.pieces`` against the rule token by token: a cut at every segment end (floored to the page)
    strictly inside (start, end), each piece owned by the segment holding its last token (past the prompt: the
    last segment). Empty segments and pages that straddle boundaries included."""
    from prism.policies.anchors import pieces

    kinds = ["sys", *["reuse"] * (len(lengths) - 2), "priv"][-len(lengths):]
    ends = np.cumsum(lengths).tolist()
    layout = tuple((e, k, f"s{i}") for i, (e, k) in enumerate(zip(ends, kinds)))
    start, end = sorted(span)
    if start == end:
        end += 1

    def holder(t: int) -> tuple[str, str]:  # the segment holding token t - 1: the first ending at or after t
        for e, k, s in layout:
            if e >= t:
                return k, s
        return layout[-1][1:]

    cuts = sorted({e - e % page for e, _, _ in layout if start < e - e % page < end}) if anchors else []
    assert pieces(layout, start, end, page, anchors) == [(c, *holder(c)) for c in [*cuts, end]]


@settings(max_examples=200, deadline=None)
@given(queued=st.lists(seqs, min_size=1, max_size=12), ops=ops, page=st.sampled_from([1, 2, 4]),
       capacity=st.integers(8, 80), anchors=st.booleans(), requeue=st.lists(st.booleans(), min_size=60,
                                                                           max_size=60))
def test_kept_matches_equal_fresh_peeks_while_the_tree_changes(queued, ops, page, capacity, anchors, requeue):
    """Waiting requests' matches kept current from the tree's change log (``MatchMemo``: walked again only
    when a slot or node they watch changed) equal fresh peeks after every insert, split (admission's match),
    lock, unlock and eviction; a request added again with a new prompt is matched on it; a round without
    changes walks nothing; forgotten requests are dropped and their watches ignored."""
    from prism.policies.match_memo import MatchMemo

    class Counted:
        """The cache, its walks counted (its class is compiled: prism/native.py; its methods cannot be wrapped)."""

        def __init__(self, tree):
            self.tree, self.walks = tree, 0

        def peek(self, k):
            self.walks += 1
            return self.tree.peek(k)

        def __getattr__(self, name):
            return getattr(self.tree, name)

    cache = RadixCache(capacity, page, anchors=anchors)
    counted = Counted(cache)
    memo = MatchMemo(counted)
    keys = {i: key(s) for i, s in enumerate(queued)}
    for i, k in keys.items():
        memo.add(i, k)
    locked, clock = [], 0.0
    for step, (op, seq, n) in enumerate(ops):
        clock += 1.0
        k = key(seq)
        if op == "insert":
            cache.insert(k, clock, [(len(seq) // 2, "reuse", "a"), (len(seq), "priv", "b")])
            over = cache.size - capacity
            if over > 0:
                cache.evict(over, lambda nd: (nd.last_access_time,))
        elif op in ("match", "lock"):
            _, node = cache.match(k, clock)
            if op == "lock" and node is not cache.root:
                cache.lock(node)
                locked.append(node)
        elif op == "unlock" and locked:
            cache.unlock(locked.pop(n % len(locked)))
        elif op == "evict":
            cache.evict(n, lambda nd: (nd.last_access_time,))
        old = dict(memo.hits)
        changed = memo.refresh()
        assert changed == {i: h for i, h in old.items() if memo.hits[i] != h}
        rid = n % len(queued)
        if requeue[step]:  # the request comes back with another prompt (the next one's)
            keys[rid] = keys[(rid + 1) % len(queued)]
            memo.add(rid, keys[rid])
        for i, kk in keys.items():
            assert memo.hits[i] == cache.match_len(kk)
    before = counted.walks
    assert before > 0  # the memo's walks go through the counter
    assert memo.refresh() == {} and counted.walks == before  # nothing changed since: no walk
    memo.forget(list(keys)[1:])
    cache.insert(key([9] * 8), clock + 1)
    cache.evict(cache.size, lambda nd: (nd.last_access_time,))
    memo.refresh()
    assert list(memo.hits) == [0] and memo.hits[0] == cache.match_len(keys[0])
    assert memo.watches() <= 2  # the forgotten requests' watches went with them
    memo.close()
    assert not cache._logs
