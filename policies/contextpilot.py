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
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.cluster.hierarchy import linkage, to_tree

from prism.config import nonneg, positive
from prism.core import REUSE

from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


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


class ContextPilot(Scheduler):
    def __init__(self, config: ContextPilotConfig | None = None) -> None:
        self.config = config or ContextPilotConfig()
        self.history: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self.since_build = 0
        self.root: TreeNode | None = None
        self._seen: set[int] = set()
        self._memo: dict[int, tuple[list[int], tuple[str, ...]]] = {}
        self.rebuilds = 0

    def _observe(self, waiting: Sequence[WaitingRequest]) -> None:
        for r in waiting:
            if r.id in self._seen:
                continue
            self._seen.add(r.id)
            ctx = tuple(s.id for s in r.segments if s.kind == REUSE)
            self.history.pop(ctx, None)
            self.history[ctx] = None
            while len(self.history) > self.config.tree_size:
                self.history.popitem(last=False)
            self.since_build += 1
        if self.history and (self.root is None or self.since_build >= self.config.rebuild_every):
            self.root = build_tree([c for c in self.history if c] or [()], self.config.position_weight)
            self.since_build = 0
            self._memo.clear()
            self.rebuilds += 1

    def _place(self, r: WaitingRequest) -> tuple[list[int], tuple[str, ...] | None]:
        """(search path, new document order or None when the order stays), once per request and tree."""
        got = self._memo.get(r.id)
        if got is None:
            ctx = tuple(s.id for s in r.segments if s.kind == REUSE)
            path, node = search(self.root, ctx)
            aligned = None
            if not r.fixed_order:  # fixed-order prompts are grouped but keep their order
                have = set(ctx)
                first = tuple(d for d in node.docs if d in have)
                moved = first + tuple(d for d in ctx if d not in set(first))
                aligned = moved if moved != ctx else None
            got = self._memo[r.id] = (path, aligned)
        return got

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        self._observe(waiting)
        keyed, oldest = [], {}
        for r in waiting:
            path, _ = self._place(r)
            group = path[0] if path else ("alone", r.id)
            age = (r.arrival, r.id)
            if group not in oldest or age < oldest[group]:
                oldest[group] = age
            keyed.append((group, -len(path), age, r))
        keyed.sort(key=lambda t: (oldest[t[0]], t[1], t[2]))
        align = {r.id: al for r in waiting if (al := self._memo[r.id][1]) is not None}
        return Plan([t[3] for t in keyed], align)

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        for r in admitted:
            self._memo.pop(r.id, None)

    def stats(self) -> dict[str, int]:
        return {"contextpilot_tree_rebuilds": self.rebuilds}
