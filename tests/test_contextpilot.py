"""ContextPilot against its code (``EfficientContext/ContextPilot`` at 1fa0a143, paths under ``contextpilot/``):
one test per rule of the per-request path, citing the lines it comes from, plus the optimized index against a
plain transcription of the code (tests/contextpilot_reference.py) and the scheduler against SGLang's LPM."""

from __future__ import annotations

import sys
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_reference import RefIndex, ref_distance
from prism.core import PRIV, REUSE, SYS, SegmentTable, realigned, serialize, serialize_bytes
from prism.policies.base import SchedContext
from prism.policies import context_tree
from prism.policies.context_tree import ContextIndex, distance, positions, reorder_with_prefix
from prism.policies.contextpilot import ContextPilot, ContextPilotConfig
from prism.policies.lpm import LPM
from prism.sim.radix_cache import RadixCache

TABLE = SegmentTable()


class W:
    fixed_order = False

    def __init__(self, rid, skeleton, t=None, priv_len=3):
        self.id, self.arrival = rid, float(rid if t is None else t)
        self.segments = (TABLE.segment("sys", SYS, 4), *(TABLE.segment(s, REUSE, 8) for s in skeleton),
                         TABLE.segment(f"q{rid}", PRIV, priv_len))
        self.key = serialize(self.segments).tobytes()
        self.prompt_len = len(self.key) // 4


def shape(index: ContextIndex):
    """The optimized index as nested (docs, children) tuples, siblings by rank: comparable to RefIndex.shape."""
    def walk(n):
        return tuple(n.docs), tuple(walk(c) for c in sorted(n.children, key=lambda c: c.rank))
    return walk(index.root)


def grown(contexts):
    index = ContextIndex()
    return index, [index.insert(c, i)[0] for i, c in enumerate(contexts)]


# ------------------------------------------------------------------ the distance
def test_distance_as_compute_distance_single():
    """compute_distance_cpu.py:25-47: 1 − |A∩B|/max(|A|,|B|) + α·mean position gap; 1.0 for an empty list or
    nothing shared; compared as float32 (compute_distance_cpu.py:82-85: the search's array is float32)."""
    assert distance(["a", "b", "c"], ["a", "b", "d"]) == np.float32(1 - 2 / 3)
    # a: positions 0 and 1, b: 1 and 0: mean gap 1
    assert distance(["a", "b", "c"], ["b", "a"]) == np.float32(1 - 2 / 3 + 0.001 * 1)
    assert distance(["a"], ["x"]) == 1.0 and distance([], ["a"]) == 1.0 and distance(["a"], []) == 1.0
    assert distance(["a", "b"], ["b", "a"], alpha=0.5) == np.float32(0 + 0.5 * 1)
    # float32 makes two float64-distinct distances tie: 1 − 4/7 + α·g for gaps that differ below float32's ulp
    d1 = (1 - 4 / 7) + 1e-9 * 1
    assert d1 != 1 - 4 / 7 and np.float32(d1) == np.float32(1 - 4 / 7)


@given(a=st.lists(st.sampled_from("abcdefgh"), max_size=6), b=st.lists(st.sampled_from("abcdefgh"), max_size=6),
       alpha=st.sampled_from([0.0, 0.001, 0.3]))
def test_distance_equals_the_transcription(a, b, alpha):
    assert distance(a, b, alpha) == float(np.float32(ref_distance(a, b, alpha)))


# ------------------------------------------------------------------ reorder
def test_reorder_puts_the_matched_nodes_documents_first():
    """live_index.py:633-661 (_reorder_with_prefix): the prefix's documents the context has, in the prefix's
    order, then the context's others in their order; its docstring's example."""
    assert reorder_with_prefix(["a", "b", "c"], ["c", "a"]) == ("c", "a", "b")
    assert reorder_with_prefix(["d", "b", "x", "a"], ["a", "b", "c"]) == ("a", "b", "d", "x")
    assert reorder_with_prefix(["x", "y"], ["a", "b"]) == ("x", "y")


# ------------------------------------------------------------------ search
def test_search_takes_the_closest_child_sharing_a_document_ties_to_the_earlier():
    """live_index.py:1215-1228: among the children with overlap > 0, the smallest distance; ``dist <
    best_distance`` keeps the earlier child on a tie."""
    index, _ = grown([["a", "x"], ["b", "y"], ["a", "b", "c"]])
    # (a, b): distance 0.5 to (a, x) and (b, y) and 1/3 to (a, b, c): the third child
    assert index.search(["a", "b"]).node.docs == ("a", "b", "c")
    # (a, b, q, r): 0.75 to (a, x) and to (b, y) (positions equal), 0.5 to (a, b, c)
    assert index.search(["a", "b", "q", "r"]).node.docs == ("a", "b", "c")
    tie, _ = grown([["a", "x"], ["b", "y"]])
    assert tie.search(["a", "b"]).node.docs == ("a", "x")  # equal distances: the first child
    # a child sharing nothing is never the match, however close the rest: (z,) shares nothing
    assert grown([["z"]])[0].search(["a"]) is None


def test_search_descends_while_the_first_document_is_in_the_context():
    """live_index.py:1246-1259: the best child's first document in the context (has_prefix) and it has
    children: descend; a leaf: the match, has_prefix; first document missing: the match, without has_prefix."""
    index, _ = grown([["a", "b", "c"], ["a", "b", "d"]])  # split: (a, b) over (a, b, c) and (a, b, d)
    m = index.search(["a", "b", "d", "e"])
    assert m.node.docs == ("a", "b", "d") and m.has_prefix and m.overlap == 3
    m = index.search(["b", "q"])  # (a, b) is closest but a is missing: stop at it, no prefix
    assert m.node.docs == ("a", "b") and not m.has_prefix and m.overlap == 1


def test_no_child_of_the_root_sharing_a_document_is_no_match():
    """live_index.py:1230-1239 and 1281: nothing shared with the root's children, or an empty index: no match."""
    index, _ = grown([["a", "b", "c"], ["a", "b", "d"]])
    assert index.search(["z"]) is None
    assert ContextIndex().search(["a"]) is None


# ------------------------------------------------------------------ insert
def test_a_prefix_match_on_a_leaf_splits_it():
    """live_index.py:551-555, 1491-1640: the shared leading documents become an inner node where the leaf
    was, the leaf its first child and the new context its second (the docstring's example)."""
    index, docs = grown([["a", "b", "c", "d", "e"], ["a", "b", "c", "x", "y"]])
    assert docs[1] == ("a", "b", "c", "x", "y")
    assert shape(index) == ((), ((("a", "b", "c"), ((("a", "b", "c", "d", "e"), ()), (("a", "b", "c", "x", "y"), ()))),))
    assert index.splits == 1


def test_a_split_of_the_same_list_makes_a_sibling():
    """live_index.py:1536-1538: the same documents in the same order (after reordering): the new leaf is the
    leaf's sibling, no inner node. (No shared head at all, live_index.py:1532-1534, cannot happen after a
    has_prefix match: the reordered context starts with the leaf's first document.)"""
    index, docs = grown([["a", "b"], ["b", "a"]])
    assert docs[1] == ("a", "b") and shape(index) == ((), ((("a", "b"), ()), (("a", "b"), ())))
    assert index.splits == 0
    index, docs = grown([["a", "b"], ["x", "a"]])  # reordered to (a, x): split at (a,)
    assert docs[1] == ("a", "x") and shape(index)[1][0][0] == ("a",) and index.splits == 1


def test_a_prefix_match_on_an_inner_node_appends_a_child():
    """live_index.py:1230-1239 then 556-560, 1398-1435: a search that enters a node none of whose children
    shares a document matches the node itself (has_prefix), which takes the new leaf as its last child. It
    takes prompts indexed in their own order, then evictions, to leave such a node: here (a, b) keeps only
    (b, x), split off a prompt that may not move."""
    index, ref = ContextIndex(), RefIndex()
    steps = [(("a", "b", "c"), True), (("a", "b", "d"), True), (("b", "x", "a"), False), (("b", "x", "q", "a"), False)]
    leaves, ref_leaves = [], []
    for i, (c, movable) in enumerate(steps):
        leaves.append(index.insert(c, i, reorder=movable)[1])
        ref_leaves.append(ref.insert(c, i, reorder=movable)[1])
    assert shape(index) == ref.shape()
    inner = shape(index)[1][0]
    assert inner[0] == ("a", "b") and [c[0] for c in inner[1]] == [("a", "b", "c"), ("a", "b", "d"), ("b", "x")]
    dead = {0, 1}
    docs, _ = index.insert(("z", "a"), 4, alive=lambda leaf: leaf.owner not in dead)
    for j in dead:
        ref.remove(ref_leaves[j])
    assert docs == tuple(ref.insert(("z", "a"), 4)[0]) == ("a", "z")
    assert shape(index) == ref.shape()
    assert [c[0] for c in shape(index)[1][0][1]] == [("b", "x"), ("a", "z")]


def test_a_match_without_its_first_document_goes_beside_it():
    """live_index.py:561-566: without has_prefix, the new leaf is the last child of the match's parent; its
    documents are still reordered to the match's (live_index.py:523-524 runs for either mode)."""
    index, docs = grown([["a", "b", "c"], ["c", "b", "q"]])
    assert docs[1] == ("b", "c", "q")  # the match (a, b, c)'s order for b and c
    assert [c[0] for c in shape(index)[1]] == [("a", "b", "c"), ("b", "c", "q")]


def test_no_match_keeps_the_order_and_hangs_from_the_root():
    """live_index.py:533-535, 573-609 with index_construction.py:234-282: an unmatched context builds a
    one-context index (order unchanged) merged under the root."""
    index, docs = grown([["a", "b"], ["y", "x"]])
    assert docs[1] == ("y", "x") and [c[0] for c in shape(index)[1]] == [("a", "b"), ("y", "x")]


# ------------------------------------------------------------------ remove
def test_an_evicted_leaf_goes_and_empty_parents_with_it():
    """live_index.py:1676-1723: remove the request's leaf; a parent left without children goes too (never
    the root)."""
    index, _ = grown([["a", "b", "c"], ["a", "b", "d"], ["x"]])
    leaves = {n.owner: n for n in index.nodes() if n.is_leaf}
    index.remove(leaves[0])
    assert shape(index) == ((), ((("a", "b"), ((("a", "b", "d"), ()),)), (("x",), ())))
    index.remove(leaves[1])
    index.remove(leaves[2])
    assert shape(index) == ((), ()) and index.leaves == 0


def test_a_search_drops_the_dead_leaves_it_would_use():
    """The engine's eviction callback removes a request (_sglang_hook.py:142-171, live_index.py:1055-1085):
    a leaf the caller says is dead is removed before the search uses it, with its emptied parents, and the
    search runs again on what is left."""
    index, _ = grown([["a", "b", "c"], ["a", "b", "d"], ["q", "b"]])
    assert [c[0] for c in shape(index)[1]] == [("a", "b"), ("b", "q")]
    dead = {0, 1}
    m = index.search(["a", "b", "c"], alive=lambda leaf: leaf.owner not in dead)
    # (a, b) held only dead leaves: both and it pruned; the closest live node is (b, q)
    assert m.node.docs == ("b", "q") and m.has_prefix and index.removed == 2
    assert [c[0] for c in shape(index)[1]] == [("b", "q")]


def recursive_live(index, node, alive, live):
    """The walk as first written, a recursion: the reference for ``ContextIndex._live``'s loop."""
    if node in live:
        return True
    if node.is_leaf:
        if alive(node):
            live.add(node)
            return True
        index.remove(node)
        return False
    for child in list(node.children):
        if recursive_live(index, child, alive, live):
            live.add(node)
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(cs=st.lists(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True), min_size=1,
                   max_size=25),
       dead=st.sets(st.integers(0, 24)), known=st.sets(st.integers(0, 60)))
def test_the_live_walk_is_the_depth_first_recursion(cs, dead, known):
    """From every node of a grown index (some nodes already known live), the loop answers as the recursion
    did, removes the same dead leaves and marks the same nodes live."""
    for start in range(len(grown(cs)[0].nodes())):
        answers = []
        for walk in (ContextIndex._live, recursive_live):
            index, _ = grown(cs)
            nodes = index.nodes()
            live = {n for i, n in enumerate(nodes) if i in known and not n.is_leaf and i != start}
            live = {n for n in live if all(index_leaf.owner not in dead for index_leaf in leaves_below(n))}
            found = walk(index, nodes[start], lambda leaf: leaf.owner not in dead, live)
            answers.append((found, shape(index), sorted(nodes.index(n) for n in live), index.removed))
        assert answers[0] == answers[1]


def leaves_below(node):
    return [node] if node.is_leaf else [leaf for c in node.children for leaf in leaves_below(c)]


def test_a_chain_deeper_than_the_recursion_limit_is_walked():
    """Evictions leave chains of inner nodes with one child each (one per split of a request that shares only
    their documents): a search walks one longer than Python's recursion limit."""
    index = ContextIndex()
    depth = sys.getrecursionlimit() + 100
    _, before = index.insert(("a", "x0"), 0)
    for i in range(1, depth):
        _, leaf = index.insert(("a", f"x{i}"), i)
        index.remove(before)
        before = leaf
    assert len(index.nodes()) == depth  # depth - 1 inner nodes of ("a",) and the last leaf
    m = index.search(("a", "y"), alive=lambda leaf: True)
    assert m.node is before and m.has_prefix


def test_a_split_below_a_node_of_the_same_documents_leads_the_search():
    """A split whose shared documents are its parent's makes a child of the parent's own documents (as the
    code's does: live_index.py:1553-1570); it wins the next search that shares nothing else with the other
    children, without a distance (``_lead``), and loses to a child that shares more."""
    index = ContextIndex()
    index.insert(("a", "b", "c"), 0)
    index.insert(("a", "b", "d"), 1)  # split: (a, b) over (a, b, c), (a, b, d)
    index.insert(("a", "b", "e"), 2)  # the tie goes to (a, b, c), split again below (a, b)
    (top,) = index.root.children
    same = next(c for c in top.children if c.docs == ("a", "b"))
    assert context_tree._lead(top) == (same, {"d"})
    assert index.search(("a", "b", "x")).node.docs in {("a", "b", "c"), ("a", "b", "e")}
    assert index.search(("b", "a", "d")).node.docs == ("a", "b", "d")
    ref = RefIndex()
    for i, c in enumerate([("a", "b", "c"), ("a", "b", "d"), ("a", "b", "e")]):
        ref.insert(c, i)
    for probe in [("a", "b", "x"), ("b", "a", "d"), ("a", "x"), ("x", "a", "b", "c", "e")]:
        want = ref.search(probe)
        assert index.search(probe).node.docs == tuple(want[0].docs)


@settings(max_examples=150, deadline=None)
@given(cs=st.lists(st.lists(st.sampled_from("abcde"), min_size=1, max_size=5), min_size=2, max_size=40),
       fixed=st.lists(st.booleans(), min_size=40, max_size=40), drops=st.lists(st.integers(0, 39), max_size=15),
       extra=st.lists(st.sampled_from("abcdefg"), max_size=4), alpha=st.sampled_from([0.001, 0.0, 0.4]))
def test_where_a_node_has_a_lead_it_is_the_closest_child(cs, fixed, drops, extra, alpha):
    """``_lead``'s claim against brute force: at every node of a grown index (repeated documents, prompts in
    their own order, leaves removed on the way) that has a lead, a context holding the node's first document and
    none of the documents the other children hold past the node's is closest to the lead among all children
    sharing a document, by the transcription's float32 distance, ties to the earlier rank."""
    index, leaves = ContextIndex(alpha), {}
    for i, c in enumerate(cs):
        leaves[i] = index.insert(c, i, reorder=not fixed[i])[1]
        if i // 2 in drops and i // 2 in leaves:
            index.remove(leaves.pop(i // 2))
    for node in index.nodes():
        lead = context_tree._lead(node)
        if not lead:
            continue
        first, rest = lead
        context = [node.docs[0], *[d for d in extra if d not in rest]]
        kids = [c for c in node.children if set(c.docs) & set(context)]
        closest = min(kids, key=lambda c: (np.float32(ref_distance(context, list(c.docs), alpha)), c.rank))
        assert closest is first
        assert index._closest(node, positions(context), len(context)) is first


@settings(max_examples=150, deadline=None)
@given(cs=st.lists(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=4, unique=True), min_size=2,
                   max_size=30),
       dead=st.sets(st.integers(0, 29)), at=st.integers(0, 29))
def test_pruning_now_is_what_the_searches_would_find_later(cs, dead, at):
    """Requests die (``dead``: admitted, then evicted) while others keep arriving. Pruning every dead leaf at one
    moment (``at``), or never, gives the same reordering of every later request, and once both indexes are
    pruned the same tree: a search drops the dead leaves it meets, and a dead request stays dead."""
    pruned, lazy = ContextIndex(), ContextIndex()
    alive = lambda leaf: leaf.owner not in dead  # noqa: E731
    for i, c in enumerate(cs):
        if i == min(at, len(cs) - 1):
            kept = pruned.prune(alive)
            assert set(kept) == {n for n in pruned.nodes() if n.is_leaf} and all(map(alive, kept))
        assert pruned.insert(c, i, alive)[0] == lazy.insert(c, i, alive)[0]
    for index in (pruned, lazy):
        index.prune(alive)
    assert shape(pruned) == shape(lazy) and pruned.leaves == lazy.leaves and pruned.removed == lazy.removed


def test_a_long_running_server_keeps_an_index_the_size_of_what_is_cached():
    """ContextPilot on a server that admits every request at once and keeps none of them cached: a search
    drops only the dead leaves it meets, which on documents that seldom come back are few; the prune keeps the
    index, and the requests it remembers as sent (aborted ones too), within twice what is alive plus its
    slack."""
    cp = ContextPilot()
    cp.PRUNE_SLACK = 50
    cache = RadixCache(None)
    for i in range(2000):
        r = W(i, [f"d{i}", f"d{i + 1}", "hot"] if i % 10 else [f"d{i}"])
        cp.plan([r], SchedContext(0.0, cache))
        if i % 7:  # else its client gave up while it waited: aborted, never admitted
            cp.on_dispatch([r], SchedContext(0.0, cache))
        assert cp.index.leaves <= 2 * 1 + 50 + 1 and len(cp._seen) <= 2 * 1 + 50 + 1
        assert len(cp._sent) <= 2 * 1 + 50 + 1 and len(cp.align) <= 2 * 1 + 50 + 1
    assert cp.index.removed >= 2000 * 6 // 7 - 53


# ------------------------------------------------------------------ against the transcription
contexts = st.lists(st.lists(st.sampled_from("abcdefghij"), min_size=0, max_size=5, unique=True)
                    | st.lists(st.sampled_from("abc"), min_size=2, max_size=4),  # a repeated document, now and then
                    min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(cs=contexts, drops=st.lists(st.integers(0, 59), max_size=20), alpha=st.sampled_from([0.001, 0.0, 0.4, 1e6]),
       fixed=st.lists(st.booleans(), min_size=60, max_size=60))
def test_the_index_grows_and_prunes_as_the_code_does(cs, drops, alpha, fixed):
    """Context after context (some indexed in their own order, as prompts that may not move are; some leaves
    removed on the way, as evictions would), the optimized index gives every context the transcription's new
    order and keeps the same tree; both ways of choosing among the children (each intersected with the
    context, or narrowed down by their bounds first) are checked, the second for every node. (The largest alpha
    allowed puts distances far above 1.)"""
    for few in (context_tree._FEW, 1):
        with patch.object(context_tree, "_FEW", few):
            grow_and_prune(cs, drops, alpha, fixed)


@settings(max_examples=60, deadline=None)
@given(cs=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=3, unique=True), min_size=30, max_size=120),
       drops=st.lists(st.integers(0, 59), max_size=50))
def test_a_node_of_many_children_counts_them_by_columns_as_the_code_does(cs, drops):
    """A root of many children (contexts of few documents from a large set mostly match nothing): its columns
    grow past their first width, removed children free columns that later ones reuse, and every search still
    finds what the transcription's, which compares every child."""
    grow_and_prune(cs, drops, 0.001, [False] * len(cs))


@settings(max_examples=500, deadline=None)
@given(length=st.integers(1, 100_000), data=st.data(),
       alpha=st.sampled_from([0.0, 1e-9, 0.001, 0.4, 2.0]), m_extra=st.integers(0, 1000))
def test_the_fewest_shared_documents_is_the_scan_down_from_the_most(length, data, alpha, m_extra):
    """The root's threshold (``_fewest_shared``), found from its estimate, against its definition: the scan down
    from the most shared documents while the next fewer still round to the cut or below."""
    top = data.draw(st.integers(1, min(length, 2_000)))
    m = length + m_extra
    f32 = lambda x: float(np.float32(x))
    cut = f32(min(2.0, 1.0 - top / m + alpha * (m - 1)))
    want = top
    while want > 1 and f32(1.0 - (want - 1) / length) <= cut:
        want -= 1
    assert context_tree._fewest_shared(top, length, cut) == want


def test_columns_count_the_shared_documents_of_each_child():
    index = ContextIndex()
    leaves = [index.insert((f"d{i}", f"e{i % 3}"), i)[1] for i in range(40)]  # one shared doc in three
    for leaf in leaves[::2]:
        index.remove(leaf)
    _, again = index.insert(("z", "e1"), 99)  # takes a freed column
    columns = index.root.columns
    assert len(index.root.children) == 21 and len(columns.nodes) == 40 and columns.nodes[again.col] is again
    counts = columns.counts(positions(("d1", "e1", "q")))
    got = {columns.nodes[c].docs: int(counts[c]) for c in range(len(columns.nodes)) if columns.nodes[c] is not None}
    want = {leaf.docs: len({"d1", "e1"} & set(leaf.docs)) for leaf in index.root.children}
    assert got == want
    assert all(counts[c] == 0 for c in columns.free) and columns.counts(positions(("q",))) is None
    assert "d0" not in columns.rows and columns.holders["e1"] == sum("e1" in c.docs for c in index.root.children)


def test_columns_count_past_the_rows_width():
    """A context of 70,000 documents shares them all with a child: the count does not wrap at 2^16."""
    index = ContextIndex()
    docs = tuple(range(70_000))
    leaf = index.insert(docs, 0, reorder=False)[1]
    for i in range(5):
        index.insert((f"other{i}",), 1 + i, reorder=False)
    counts = index.root.columns.counts(positions(docs))
    assert counts[leaf.col] == 70_000 and counts.sum() == 70_000


def grow_and_prune(cs, drops, alpha, fixed):
    mine, ref = ContextIndex(alpha), RefIndex(alpha)
    mine_leaf, ref_leaf = {}, {}
    for i, c in enumerate(cs):
        if not c:
            continue
        got, leaf = mine.insert(c, i, reorder=not fixed[i])
        want, rleaf = ref.insert(c, i, reorder=not fixed[i])
        assert got == tuple(want)
        mine_leaf[i], ref_leaf[i] = leaf, rleaf
        for j in sorted({d for d in drops if d == i // 2 and d in mine_leaf}):  # drop an earlier one now and then
            mine.remove(mine_leaf.pop(j))
            ref.remove(ref_leaf.pop(j))
        assert shape(mine) == ref.shape()


# ------------------------------------------------------------------ the scheduler
def lpm_order_on_sent(waiting, cache, sent_order):
    """SGLang's LPM over the prompts as ContextPilot sent them (its new order per request)."""
    class S:
        def __init__(self, r):
            self.id, self.r, self.prompt_len = r.id, r, r.prompt_len
            segs = realigned(r.segments, sent_order[r.id], r.id) if r.id in sent_order else None
            self.key = serialize_bytes(segs) if segs else r.key
    return [s.r.id for s in LPM().plan([S(r) for r in waiting], SchedContext(0.0, cache)).order]


@settings(max_examples=80, deadline=None)
@given(cs=st.lists(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True), min_size=1,
                   max_size=30),
       cached=st.lists(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True), max_size=4))
def test_the_engine_orders_the_queue_as_lpm_on_the_prompts_as_sent(cs, cached):
    """No ordering of its own: each request is indexed once, alone (http_server.py:1394), and the queue is
    SGLang's LPM order over the reordered prompts (ContextPilot's docs run SGLang with --schedule-policy lpm,
    docs/getting_started/quickstart.md:167), so no request waits on a rule of ContextPilot's."""
    cache = RadixCache(None)
    for sk in cached:
        cache.insert(W(-1, sk).key, 0.0)
    waiting = [W(i, c) for i, c in enumerate(cs)]
    cp = ContextPilot()
    plan = cp.plan(waiting, SchedContext(0.0, cache))
    ref, want = RefIndex(), {}
    for r, c in zip(waiting, cs):
        new = tuple(ref.insert(c, r.id)[0])
        if new != tuple(c):
            want[r.id] = new
    assert dict(plan.align) == want
    assert [r.id for r in plan.order] == lpm_order_on_sent(waiting, cache, want)


def test_reorder_off_is_the_engines_order():
    """``reorder: false`` is the engine's scheduler alone: the ablation baseline (SGLang's LPM, byte for
    byte)."""
    waiting = [W(0, ["a", "b"]), W(1, ["b", "a"]), W(2, ["c"])]
    cache = RadixCache(None)
    cache.insert(W(-1, ["c"]).key, 0.0)
    off = ContextPilot(ContextPilotConfig(reorder=False)).plan(waiting, SchedContext(0.0, cache))
    assert [r.id for r in off.order] == [r.id for r in LPM().plan(waiting, SchedContext(0.0, cache)).order]
    assert not off.align


def test_an_evicted_request_leaves_the_index_a_queued_one_stays():
    """A request leaves the index once admitted, gone from the engine and no longer wholly cached; while it
    waits (nothing of it is cached yet) it stays."""
    cache = RadixCache(None)
    cp = ContextPilot()
    first = W(0, ["a", "b", "c"])
    cp.plan([first], SchedContext(0.0, cache))
    second = W(1, ["c", "b", "z"])
    plan = cp.plan([first, second], SchedContext(0.0, cache))
    assert plan.align[1] == ("b", "c", "z")  # matched (a, b, c) without its first document: beside it
    cp.on_dispatch([first], SchedContext(0.0, cache))  # admitted, finished, never cached (or evicted): dead
    third = W(2, ["c", "b", "y"])
    plan = cp.plan([second, third], SchedContext(0.0, cache))
    assert cp.index.removed == 1  # the first one's leaf went; the second, still queued, is what third matches
    assert plan.align[2] == ("b", "c", "y")
    cache.insert(serialize_bytes(realigned(second.segments, ("b", "c", "z"), 1)), 0.0)
    cp.on_dispatch([second], SchedContext(0.0, cache))  # admitted and its prompt cached: alive
    cp.plan([third, W(3, ["c", "b"])], SchedContext(0.0, cache))
    assert cp.index.removed == 1


@pytest.mark.parametrize("served_as_sent", [True, False])
def test_an_admitted_request_keeps_the_prompt_it_was_sent_with(served_as_sent):
    """Once admitted, a request's leaf asks the cache for the prompt ContextPilot sent: the engine's own key
    where the engine serves it in that order (one serialization, not two), its own where the request came
    back in another (no engine does so today, each realigns before it dispatches: the guard keeps the key right
    if one did). The leaf then holds neither the request nor its segments (a live request's hold its tokens).
    (Behind FCFS: nothing read its prompt while it waited.)"""
    cp = ContextPilot(ContextPilotConfig(engine_order="fcfs"))
    first, second = W(0, ["a", "b", "c"]), W(1, ["c", "b", "z"])
    cp.plan([first, second], SchedContext(0.0, RadixCache(None)))
    moved = cp.align[1]
    sent = cp._sent[1]
    if served_as_sent:
        second.segments = realigned(second.segments, moved, 1)
        second.key = serialize_bytes(second.segments)
    cp.on_dispatch([second], SchedContext(0.0, RadixCache(None)))
    assert sent.admitted and sent.request is None and sent.segments == ()
    assert sent.key == serialize_bytes(realigned(W(1, ["c", "b", "z"]).segments, moved, 1))
    assert (sent.key is second.key) is served_as_sent


@pytest.mark.parametrize("fixed", [True, False])
def test_prompts_that_may_not_move_are_indexed_as_they_are(fixed):
    w = W(1, ["c", "b"])
    w.fixed_order = fixed
    cp = ContextPilot()
    plan = cp.plan([W(0, ["b", "c", "a"]), w], SchedContext(0.0, RadixCache(None)))
    assert (1 in plan.align) is (not fixed)
    assert [n.docs for n in cp.index.nodes() if n.owner is not None and n.owner.id == 1] == [
        ("c", "b") if fixed else ("b", "c")]
