"""A plain transcription of ContextPilot's per-request live-index path (``EfficientContext/ContextPilot`` at
1fa0a143, ``contextpilot/server/live_index.py``), as the tests' independent truth for
:mod:`prism.policies.context_tree`: children are lists (a split replaces the leaf in place, a removal deletes from
the list), every child is compared at every level, distances go through a float32 array as the code's do. No
per-document index, no ranks: the structure the optimized index must reproduce."""

from __future__ import annotations

import numpy as np


class RefNode:
    def __init__(self, docs, parent=None, owner=None):
        self.docs = list(docs)
        self.parent = parent
        self.children: list[RefNode] = []
        self.owner = owner


def ref_distance(a, b, alpha):  # compute_distance_cpu.py:12-47
    if not a or not b:
        return 1.0
    pa = {d: i for i, d in enumerate(a)}
    pb = {d: i for i, d in enumerate(b)}
    inter = set(pa) & set(pb)
    if not inter:
        return 1.0
    return (1.0 - len(inter) / max(len(a), len(b))) + alpha * (sum(abs(pa[d] - pb[d]) for d in inter) / len(inter))


class RefIndex:
    def __init__(self, alpha=0.001):
        self.alpha = alpha
        self.root = RefNode([])

    def search(self, context):  # live_index.py:1166-1259
        cs = set(context)
        cur = self.root
        while True:
            if not cur.children:
                return None if cur is self.root else (cur, len(cs & set(cur.docs)), cur.docs[0] in cs)
            kids = [c for c in cur.children if c.docs]
            dists = np.ones((1, len(kids)), dtype=np.float32)  # compute_distance_cpu.py:82-85
            for j, c in enumerate(kids):
                dists[0, j] = ref_distance(list(context), c.docs, self.alpha)
            best, best_d, best_o = None, float("inf"), 0
            for j, c in enumerate(kids):
                o = len(cs & set(c.docs))
                if o == 0:
                    continue
                if dists[0, j] < best_d:
                    best, best_d, best_o = c, dists[0, j], o
            if best is None:
                return None if cur is self.root else (cur, len(cs & set(cur.docs)), True)
            if best.docs[0] in cs:
                if best.children:
                    cur = best
                    continue
                return best, best_o, True
            return best, best_o, False

    def insert(self, context, owner, reorder=True):  # live_index.py:460-631 for one context
        context = list(context)
        found = self.search(context)
        if found is None or found[1] == 0:
            return self._child(self.root, context, owner)
        node, _, has_prefix = found
        used, reordered = set(), []
        for d in node.docs:  # _reorder_with_prefix, live_index.py:633-661
            if d in set(context) and d not in used:
                reordered.append(d)
                used.add(d)
        reordered += [d for d in context if d not in used]
        if not reorder:  # a prompt that may not move is indexed as it is
            reordered = context
        if has_prefix and not node.children:
            return self._split(node, reordered, owner)
        if has_prefix:
            return self._child(node, reordered, owner)
        return self._child(node.parent, reordered, owner)

    def _child(self, parent, docs, owner):
        leaf = RefNode(docs, parent, owner)
        parent.children.append(leaf)
        return docs, leaf

    def _split(self, leaf, docs, owner):  # live_index.py:1491-1640
        shared = []
        for a, b in zip(leaf.docs, docs):
            if a != b:
                break
            shared.append(a)
        if not shared or (shared == leaf.docs and set(leaf.docs) == set(docs)):
            return self._child(leaf.parent, docs, owner)
        parent = leaf.parent
        inner = RefNode(shared, parent)
        parent.children[parent.children.index(leaf)] = inner
        leaf.parent = inner
        inner.children.append(leaf)
        return self._child(inner, docs, owner)

    def remove(self, leaf):  # live_index.py:1676-1723
        parent = leaf.parent
        parent.children.remove(leaf)
        if not parent.children and parent is not self.root:
            self.remove(parent)

    def leaves(self):
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if n is not self.root and not n.children:
                out.append(n)
            stack += n.children
        return out

    def shape(self):
        """The tree as nested (docs, children) tuples, children in order."""
        def walk(n):
            return tuple(n.docs), tuple(walk(c) for c in n.children)
        return walk(self.root)
