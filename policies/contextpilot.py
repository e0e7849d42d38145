"""ContextPilot's online path (Jiang et al. 2026): align retrieved contexts to a context tree.

A *context tree* is built by hierarchical clustering (average linkage) of recent requests' context sets with
the distance ``1 − |A∩B| / max(|A|,|B|) + 0.001 · mean position gap`` (the gap over the shared documents).
A leaf holds one context; an inner node holds the documents all its leaves share. Node orders are made
prefix-consistent from the root down: a node lists its parent's documents in the parent's order, then its
own extra documents in the order of its first leaf.

Online, each request descends from the root to the closest node: at each step the child sharing the most
documents with it, as long as that child's documents are all in the request. The matched node's documents
go first (in the node's order), the request's other documents keep their order. Requests are scheduled
grouped by the first branch of their search path (groups in order of their oldest request), longer paths
first inside a group, then FIFO.

Choices made here: the tree is built from the last ``tree_size`` (256) distinct contexts seen and rebuilt
after every ``rebuild_every`` (128) new requests, so the clustering's quadratic cost stays bounded.

Cost. ``distance_matrix``, ``build_tree`` and ``search`` below are the readable reference; the scheduler runs
the same tree as arrays (:mod:`prism.policies.context_tree`: compiled distances, one compiled search for a
batch of requests), places each request once per tree, derives a request's new order only when the engine
admits it, and keeps the queue in its order between rounds (:class:`_Queue`), so a round costs its arrivals
and admissions rather than a pass over the whole queue (a rebuild places the queue again).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy.cluster.hierarchy import linkage, to_tree

from prism.config import nonneg, positive
from prism.core import REUSE

from prism.policies.base import LazyAlignment, Plan, SchedContext, Scheduler, WaitingRequest
from prism.policies.context_tree import ContextTree


@dataclass
class ContextPilotConfig:
    tree_size: int = positive(256, "distinct recent contexts the tree is built from")
    rebuild_every: int = positive(128, "new requests between rebuilds of the tree")
    position_weight: float = nonneg(0.001, "weight of the mean position gap in the distance")


@dataclass
class TreeNode:
    docs: tuple[str, ...]
    children: list["TreeNode"] = field(default_factory=list)
    size: int = 1  # leaves below
    counts: dict[str, int] = field(default_factory=dict)  # document -> leaves below that contain it

    def affinity(self, have: set[str]) -> float:
        """Mean overlap of a context below this node with ``have``."""
        return sum(self.counts.get(d, 0) for d in have) / self.size


def distance_matrix(contexts: Sequence[tuple[str, ...]], position_weight: float = 0.001) -> np.ndarray:
    """Square matrix of ContextPilot's distance between every pair of contexts."""
    n = len(contexts)
    inter = np.zeros((n, n))
    gaps = np.zeros((n, n))
    columns: dict[str, tuple[list[int], list[int]]] = {}
    for i, ctx in enumerate(contexts):
        for pos, d in enumerate(ctx):
            rows, poss = columns.setdefault(d, ([], []))
            rows.append(i)
            poss.append(pos)
    for rows, poss in columns.values():
        r = np.asarray(rows)
        p = np.asarray(poss, dtype=float)
        idx = np.ix_(r, r)
        inter[idx] += 1.0
        gaps[idx] += np.abs(p[:, None] - p[None, :])
    sizes = np.array([max(len(c), 1) for c in contexts], dtype=float)
    denom = np.maximum(sizes[:, None], sizes[None, :])
    mean_gap = np.divide(gaps, inter, out=np.zeros_like(gaps), where=inter > 0)
    dist = 1.0 - inter / denom + position_weight * mean_gap
    np.fill_diagonal(dist, 0.0)
    return dist


def build_tree(contexts: Sequence[tuple[str, ...]], position_weight: float = 0.001) -> TreeNode:
    if len(contexts) == 1:
        return TreeNode(tuple(contexts[0]), counts=dict.fromkeys(contexts[0], 1))
    dist = distance_matrix(contexts, position_weight)
    iu = np.triu_indices(len(contexts), k=1)
    root = to_tree(linkage(dist[iu], method="average"))

    def convert(node) -> TreeNode:
        if node.is_leaf():
            ctx = tuple(contexts[node.id])
            return TreeNode(ctx, counts=dict.fromkeys(ctx, 1))
        left, right = convert(node.get_left()), convert(node.get_right())
        shared = set(left.docs) & set(right.docs)
        counts = dict(left.counts)
        for d, c in right.counts.items():
            counts[d] = counts.get(d, 0) + c
        return TreeNode(tuple(d for d in left.docs if d in shared), [left, right], left.size + right.size, counts)

    tree = convert(root)
    _order_top_down(tree, ())
    return tree


def _order_top_down(node: TreeNode, parent_docs: tuple[str, ...]) -> None:
    own = set(node.docs)
    head = tuple(d for d in parent_docs if d in own)
    node.docs = head + tuple(d for d in node.docs if d not in set(head))
    for child in node.children:
        _order_top_down(child, node.docs)


def search(root: TreeNode, context: tuple[str, ...]) -> tuple[list[int], TreeNode]:
    """Descend towards the closest leaf (the child whose contexts overlap the request most, then the larger
    child) while the child's shared documents are all in the request; return (branch indices, last node)."""
    have = set(context)
    node, path = root, []
    if not set(root.docs) <= have:
        return path, root
    while node.children:
        best_i = max(range(len(node.children)),
                     key=lambda i: (node.children[i].affinity(have), node.children[i].size, -i))
        best = node.children[best_i]
        if not set(best.docs) <= have:
            break
        node = best
        path.append(best_i)
    return path, node


class _Queue:
    """The waiting requests in ContextPilot's order, kept between rounds: groups in order of their oldest
    request, inside a group longer search paths first, then FIFO. A group's members and their ages are sorted
    lists updated by insertion and removal, so a round costs its arrivals and departures, plus a sort of the
    groups (two branches of the root, and each request that could not descend, alone)."""

    def __init__(self) -> None:
        self.keys: dict[Any, list[tuple]] = {}  # group -> (-path length, arrival, id) of its members, sorted
        self.members: dict[Any, list] = {}  # group -> its requests, in the same order
        self.ages: dict[Any, list[tuple]] = {}  # group -> (arrival, id) of its members, sorted
        self.where: dict[int, tuple[Any, tuple]] = {}  # request id -> (group, key)

    def add(self, requests: Sequence[WaitingRequest], keys: list[tuple]) -> None:
        """Queue requests with their (group, -path length, arrival, id); into an empty queue by one sort."""
        if not self.where:
            for k, r in sorted(zip(keys, requests), key=lambda kr: kr[0][1:]):
                group, key = k[0], k[1:]
                if group not in self.keys:
                    self.keys[group], self.members[group], self.ages[group] = [], [], []
                self.keys[group].append(key)
                self.members[group].append(r)
                self.ages[group].append(key[1:])
                self.where[key[2]] = (group, key)
            for ages in self.ages.values():
                ages.sort()
            return
        for k, r in zip(keys, requests):
            group, key = k[0], k[1:]
            if group not in self.keys:
                self.keys[group], self.members[group], self.ages[group] = [], [], []
            i = bisect_right(self.keys[group], key)
            self.keys[group].insert(i, key)
            self.members[group].insert(i, r)
            insort(self.ages[group], key[1:])
            self.where[key[2]] = (group, key)

    def remove(self, r: WaitingRequest) -> None:
        group, key = self.where.pop(r.id)
        keys = self.keys[group]
        i = bisect_left(keys, key)
        del keys[i], self.members[group][i]
        ages = self.ages[group]
        del ages[bisect_left(ages, key[1:])]
        if not keys:
            del self.keys[group], self.members[group], self.ages[group]

    def __len__(self) -> int:
        return len(self.where)

    def order(self) -> list:
        out: list = []
        for group in sorted(self.ages, key=lambda g: self.ages[g][0]):
            out += self.members[group]
        return out


class ContextPilot(Scheduler):
    """ContextPilot's online scheduling (module docstring). Between rounds it keeps the tree, each queued
    request's placement (search path and new order, once per request and tree) and the queue in its order;
    a round places only the requests it has not seen (all of them after a rebuild of the tree)."""

    name = "contextpilot"
    Knobs = ContextPilotConfig

    def __init__(self, config: ContextPilotConfig | None = None) -> None:
        self.config = config or ContextPilotConfig()
        self.history: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self.since_build = 0
        self.tree: ContextTree | _ReferenceTree | None = None
        self._seen: set[int] = set()
        self._contexts: dict[int, tuple[str, ...]] = {}  # queued request id -> its documents (their set is fixed)
        # queued request id -> (first branch of its search path or -1, path length, the node it ends at, the
        # request), for this tree; a request's new order is derived from it when the engine asks
        self._memo: dict[int, tuple[int, int, Any, WaitingRequest]] = {}
        self._queue = _Queue()
        self._expected: list = []  # the queue the engine should show next: the last order minus its admissions
        self.rebuilds = 0

    def _observe(self, new: Sequence[WaitingRequest]) -> bool:
        """Record the contexts of requests not seen before; rebuild the tree when due. True if rebuilt."""
        for r in new:
            if r.id in self._seen:
                continue
            self._seen.add(r.id)
            ctx = self._contexts[r.id] = _context(r)
            self.history.pop(ctx, None)
            self.history[ctx] = None
            while len(self.history) > self.config.tree_size:
                self.history.popitem(last=False)
            self.since_build += 1
        if self.history and (self.tree is None or self.since_build >= self.config.rebuild_every):
            self.tree = make_tree([c for c in self.history if c] or [()], self.config.position_weight)
            self.since_build = 0
            self._memo = {}
            self.rebuilds += 1
            return True
        return False

    def _place(self, requests: Sequence[WaitingRequest]) -> list[tuple]:
        """(group, -path length, arrival, id) per request, placing those not placed on this tree (one search)."""
        memo, contexts = self._memo, self._contexts
        todo = [r for r in requests if r.id not in memo]
        if todo:
            ctxs = [contexts.get(r.id) or contexts.setdefault(r.id, _context(r)) for r in todo]
            for r, (path_len, first, end) in zip(todo, self.tree.place(ctxs)):
                memo[r.id] = (first, path_len, end, r)
        out = []
        for r in requests:
            first, path_len, _, _ = memo[r.id]
            out.append((first if first >= 0 else ("alone", r.id), -path_len, r.arrival, r.id))
        return out

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        m = len(self._expected)
        known = len(self._queue) == m and len(waiting) >= m and waiting[:m] == self._expected
        new = waiting[m:] if known else waiting
        if self._observe(new) or not known:  # a new tree places every request again
            self._queue = _Queue()
            new = waiting
        self._queue.add(new, self._place(new))
        order = self._expected = self._queue.order()
        return Plan(order, _Alignment(self._memo, self.tree.docs, self._contexts))

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        for r in admitted:
            self._memo.pop(r.id, None)
            self._contexts.pop(r.id, None)
            if r.id in self._queue.where:
                self._queue.remove(r)
        k = len(admitted)
        if self._expected[:k] == list(admitted):  # the engine admits a prefix of the order
            self._expected = self._expected[k:]
        else:
            self._expected = self._queue.order()

    def stats(self) -> dict[str, int]:
        return {"contextpilot_tree_rebuilds": self.rebuilds}


def _context(r: WaitingRequest) -> tuple[str, ...]:
    return tuple(s.id for s in r.segments if s.kind == REUSE)


class _ReferenceTree:
    """The reference tree (``build_tree``, ``search``) behind :class:`ContextTree`'s ``place``."""

    def __init__(self, contexts: Sequence[tuple[str, ...]], position_weight: float) -> None:
        self.root = build_tree(contexts, position_weight)

    def place(self, contexts: Sequence[tuple[str, ...]]) -> list[tuple[int, int, TreeNode]]:
        out = []
        for ctx in contexts:
            path, node = search(self.root, ctx)
            out.append((len(path), path[0] if path else -1, node))
        return out

    @staticmethod
    def docs(node: TreeNode) -> tuple[str, ...]:
        return node.docs


def make_tree(contexts: Sequence[tuple[str, ...]], position_weight: float = 0.001) -> "ContextTree | _ReferenceTree":
    """The context tree of ``contexts``: compiled, unless a context repeats a document (then the reference)."""
    if any(len(set(c)) != len(c) for c in contexts):
        return _ReferenceTree(contexts, position_weight)
    return ContextTree(contexts, position_weight)


class _Alignment(LazyAlignment):
    """Plan.align: request id -> new document order, for the placed requests whose order changes: the end
    node's documents (those of the request) first, in the node's order, then its others in their order."""

    def __init__(self, memo: dict[int, tuple], docs: Callable[[Any], tuple[str, ...]],
                 contexts: dict[int, tuple[str, ...]]) -> None:
        self._memo, self._docs, self._contexts = memo, docs, contexts

    def get(self, rid: int, default=None):
        got = self._memo.get(rid)
        if got is None or got[3].fixed_order:  # fixed-order prompts are grouped but keep their order
            return default
        ctx = self._contexts.get(rid) or _context(got[3])
        have = set(ctx)
        head = tuple([d for d in self._docs(got[2]) if d in have])
        have.difference_update(head)
        moved = head + tuple([d for d in ctx if d in have])
        return moved if moved != ctx else default

    def __iter__(self):
        return (rid for rid in list(self._memo) if self.get(rid) is not None)
