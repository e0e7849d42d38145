"""k-LPM's limits (k=1 is FCFS, large k is LPM), SGLang's LPM details, and ContextPilot on a known example."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.core import PRIV, REUSE, SYS, SegmentTable, serialize
from prism.policies.base import SchedContext
from prism.policies.contextpilot import ContextPilot, build_tree, distance_matrix, search
from prism.policies.klpm import KLPM, KLPMConfig
from prism.policies.lpm import LPM
from prism.sim.radix_cache import RadixCache

TABLE = SegmentTable()


class W:
    fixed_order = False

    def __init__(self, rid, t, skeleton, priv_len=3):
        self.id, self.arrival = rid, t
        self.segments = (TABLE.segment("sys", SYS, 4), *(TABLE.segment(s, REUSE, 8) for s in skeleton),
                         TABLE.segment(f"q{rid}", PRIV, priv_len))
        self.key = serialize(self.segments).tobytes()
        self.prompt_len = len(self.key) // 4


def queue_and_cache(data, cached):
    cache = RadixCache(None)
    for sk in cached:
        cache.insert(W(-1, 0.0, sk).key, 0.0)
    waiting = [W(i, float(t), sk) for i, (t, sk) in enumerate(data)]
    return waiting, SchedContext(0.0, cache)


queues = st.lists(st.tuples(st.integers(0, 20), st.lists(st.sampled_from("abcdef"), max_size=3, unique=True)),
                  min_size=1, max_size=30)
cached_sets = st.lists(st.lists(st.sampled_from("abcdef"), max_size=3, unique=True), max_size=5)


@settings(max_examples=80, deadline=None)
@given(data=queues, cached=cached_sets)
def test_klpm_with_k1_is_fcfs(data, cached):
    waiting, ctx = queue_and_cache(data, cached)
    # k=1: every admission is the oldest request's (FCFS by arrival; the engine's FCFS keeps its queue's order,
    # which is arrival order but for retracted requests)
    assert [r.id for r in KLPM(KLPMConfig(k=1)).plan(waiting, ctx).order] == \
           [r.id for r in sorted(waiting, key=lambda r: (r.arrival, r.id))]


@settings(max_examples=80, deadline=None)
@given(data=queues, cached=cached_sets)
def test_klpm_with_large_k_is_lpm(data, cached):
    waiting, ctx = queue_and_cache(data, cached)
    order = [r.id for r in KLPM(KLPMConfig(k=10**6)).plan(waiting, ctx).order]
    by_age = sorted(waiting, key=lambda r: (r.arrival, r.id))
    expected = [r.id for r in sorted(by_age, key=lambda r: -ctx.cache.match_len(r.key))]
    assert order == expected


def test_klpm_k2_alternates_and_carries_the_count():
    waiting, ctx = queue_and_cache([(0, ["x"]), (1, ["a"]), (2, ["a"]), (3, ["y"])], [["a"]])
    k = KLPM(KLPMConfig(k=2))
    # slot 0: best hit (request 1, shares sys+a), slot 1: oldest left (0), slot 2: best hit (2), slot 3: 3
    assert [r.id for r in k.plan(waiting, ctx).order] == [1, 0, 2, 3]
    k.on_dispatch(waiting[:1], ctx)  # one admission: the next slot is the FCFS one
    assert [r.id for r in k.plan(waiting, ctx).order][0] == 0


def test_lpm_in_batch_check_and_fcfs_fallback():
    # nothing cached: requests 0 and 2 share their first 32+ tokens; 2 is deferred behind 1 although it
    # stands before 1 in the queue
    t = SegmentTable()
    long = t.segment("long", REUSE, 64)

    class R:
        def __init__(self, rid, segs):
            self.id, self.arrival, self.segments = rid, float(rid), segs
            self.key = serialize(segs).tobytes()
            self.prompt_len = len(self.key) // 4

    s = t.segment("sys", SYS, 4)
    reqs = [R(0, (s, long, t.segment("q0", PRIV, 4))), R(1, (t.segment("other", SYS, 40), t.segment("q1", PRIV, 4))),
            R(2, (s, long, t.segment("q2", PRIV, 4)))]
    ctx = SchedContext(0.0, RadixCache(None))
    queue = [reqs[0], reqs[2], reqs[1]]
    assert [r.id for r in LPM().plan(queue, ctx).order] == [0, 1, 2]
    # once request 0's prompt is cached, request 2 matches sys + long (68 tokens): no longer deferred
    ctx.cache.insert(reqs[0].key, 0.0)
    assert [r.id for r in LPM().plan(queue, ctx).order] == [0, 2, 1]
    # past 128 waiting, the queue keeps its order
    many = [W(i, float(200 - i), ["a"]) for i in range(129)]
    assert [r.id for r in LPM().plan(many, ctx).order] == list(range(129))


def test_contextpilot_distance():
    d = distance_matrix([("a", "b", "c"), ("a", "b", "d"), ("b", "a"), ("x",)])
    assert d[0, 1] == pytest.approx(1 - 2 / 3)
    # (a,b,c) vs (b,a): shared a (0 vs 1) and b (1 vs 0): 1 - 2/3 + 0.001 * 1
    assert d[0, 2] == pytest.approx(1 - 2 / 3 + 0.001)
    assert d[0, 3] == pytest.approx(1.0)
    assert np.allclose(d, d.T)


def test_contextpilot_known_example():
    contexts = [("a", "b", "c"), ("a", "b", "d"), ("x", "y"), ("x", "y", "z")]
    tree = build_tree(contexts)
    assert tree.docs == ()
    ab = next(c for c in tree.children if "a" in c.docs)
    xy = next(c for c in tree.children if "x" in c.docs)
    assert ab.docs == ("a", "b") and xy.docs == ("x", "y")
    # the closest node of (d, b, a) is the leaf (a, b, d): its order is the parent's (a, b) then d
    path, node = search(tree, ("d", "b", "a"))
    assert len(path) == 2 and node.docs == ("a", "b", "d")
    # (q, a, b) stops at the (a, b) node: neither leaf is contained in it
    path2, node2 = search(tree, ("q", "a", "b"))
    assert len(path2) == 1 and node2.docs == ("a", "b") and path2[0] == path[0]
    # (z, x) cannot enter (x, y): y is missing
    assert search(tree, ("z", "x"))[0] == []

    cp = ContextPilot()
    seed = [W(100 + i, float(i), c) for i, c in enumerate(contexts)]
    cp.plan(seed, SchedContext(0.0, RadixCache(None)))  # builds the tree from what it has seen
    waiting = [W(1, 10.0, ["q", "a", "b"]), W(2, 11.0, ["z", "x"]), W(3, 12.0, ["d", "b", "a"])]
    plan = cp.plan(waiting, SchedContext(1.0, RadixCache(None)))
    assert plan.align[3] == ("a", "b", "d")
    assert plan.align[1] == ("a", "b", "q")
    assert 2 not in plan.align
    # grouped by first branch (1 and 3 share it, the group's oldest is 1 at t=10), longer path first
    assert [r.id for r in plan.order] == [3, 1, 2]


docs_lists = st.lists(st.lists(st.sampled_from("abcdefghij"), min_size=0, max_size=5, unique=True).map(tuple),
                      min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(contexts=docs_lists, queries=docs_lists)
def test_compiled_context_tree_answers_as_the_reference(contexts, queries):
    """The array tree (compiled distances and search) gives every query the reference's search path length,
    first branch and end node documents, in the same order."""
    from prism.policies.context_tree import ContextTree

    tree, root = ContextTree(contexts), build_tree(contexts)
    for q, (path_len, first, end) in zip(queries, tree.place(queries)):
        path, node = search(root, q)
        assert (path_len, first, tree.docs(end)) == (len(path), path[0] if path else -1, node.docs)
    if len(contexts) > 1:  # the same distances, bit for bit
        d = distance_matrix(contexts)
        assert (tree.distances == d[np.triu_indices(len(contexts), k=1)]).all()


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(st.tuples(docs_lists, st.integers(0, 6)), min_size=1, max_size=12),
       rebuild=st.integers(1, 20), size=st.integers(2, 30))
def test_contextpilot_order_is_the_sort_of_its_placements(rounds, rebuild, size):
    """Round after round (arrivals, then the engine admits a prefix of the order), the kept queue is the
    sort the paper describes: groups by their oldest request, longer search paths first, then FIFO; each
    request placed by the reference search on the tree of the round."""
    from prism.policies.contextpilot import ContextPilotConfig

    cp = ContextPilot(ContextPilotConfig(tree_size=size, rebuild_every=rebuild))
    waiting, rid, built = [], 0, 0
    for arrivals, admit in rounds:
        for c in arrivals:
            waiting.append(W(rid, float(rid), list(c)))
            rid += 1
        plan = cp.plan(waiting, SchedContext(0.0, RadixCache(None)))
        if cp.rebuilds != built:  # the tree of the recent contexts, as of its last rebuild
            root, built = build_tree([c for c in cp.history if c] or [()]), cp.rebuilds
        placed = {}
        for r in waiting:
            path, _ = search(root, tuple(s.id for s in r.segments if s.kind == REUSE))
            placed[r.id] = (path[0] if path else ("alone", r.id), len(path))
        oldest = {}
        for r in waiting:
            g = placed[r.id][0]
            oldest[g] = min(oldest.get(g, (r.arrival, r.id)), (r.arrival, r.id))
        expected = sorted(waiting, key=lambda r: (oldest[placed[r.id][0]], -placed[r.id][1], r.arrival, r.id))
        assert [r.id for r in plan.order] == [r.id for r in expected]
        taken = plan.order[:admit]
        cp.on_dispatch(taken, SchedContext(0.0, RadixCache(None)))
        waiting = list(plan.order[admit:])




def test_fcfs_hands_back_the_queue_itself():
    """FCFS does not sort (as SGLang's): it hands the engine's queue back as it is, for the engine to drop
    the admitted head in place."""
    from prism.policies.fcfs import FCFS

    queue = [W(i, float(5 - i), ["a"]) for i in range(5)]
    plan = FCFS().plan(queue, SchedContext(0.0, RadixCache(None)))
    assert plan.order is queue and [r.id for r in plan.order] == list(range(5))
