"""ContextPilot's context tree as arrays, with its distance matrix and its search compiled (numba, cached on
disk): the same tree and the same answers as the readable reference in :mod:`prism.policies.contextpilot`
(``distance_matrix``, ``build_tree``, ``search``), at a fraction of the cost.

Model. Contexts are tuples of document ids; documents are numbered in first-seen order. The tree is scipy's
average-linkage dendrogram of the contexts (leaves ``0..n-1``, merge ``k`` is node ``n+k``, its children the
merge's two clusters in scipy's order, the root last). A node's documents are those all its leaves contain.
Nothing per node is stored as a set: leaves are numbered in depth-first order (left child first), so a node
covers a range ``[lo, hi)`` of them, and a prefix count per document over that order gives, for any node and
document, how many of its leaves contain the document (``count``). Then

* a node's *affinity* to a request (mean overlap of its leaves' contexts with the request's documents) is the
  sum of ``count`` over the request's documents divided by the node's size;
* a node's documents are the documents whose ``count`` equals its size; they are a subset of its leftmost
  leaf's context, so their number (``n_docs``) is counted over that context once per tree, and "all of the
  node's documents are in the request" is "as many of the request's documents have ``count`` = size".

The search (one compiled call for a batch of requests) descends as the reference does: while the child with
the highest (affinity, size, first) has all its documents in the request. A node's documents in tree order
(its parent's, in the parent's order, then its own others in its leftmost leaf's order) are built on demand,
only for the nodes searches end at.

Choices. Contexts with a repeated document are rare and the reference's bookkeeping of them is peculiar, so
a history holding one is left to the reference (:func:`make_tree`). Cost per build: O(n² · k²) for the
distances of n contexts of k documents (compiled) and scipy's linkage; O(n · D) for the prefix counts over D
distinct documents. Per search: O(depth · k).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit


@njit(cache=True)
def condensed_distances(docs, positions, lengths, position_weight):
    """ContextPilot's distance of every pair i < j, in scipy's condensed order: 1 − |A∩B| / max(|A|,|B|) +
    position_weight · mean position gap over the shared documents (0 when none are shared). ``docs``: each
    context's document numbers (-1 padded), ``positions`` their positions; each float is computed by the
    reference's operations in the reference's order."""
    n = docs.shape[0]
    out = np.empty(n * (n - 1) // 2)
    k = 0
    for i in range(n):
        for j in range(i + 1, n):
            inter = 0.0
            gaps = 0.0
            for a in range(lengths[i]):
                for b in range(lengths[j]):
                    if docs[i, a] == docs[j, b]:
                        inter += 1.0
                        gaps += abs(positions[i, a] - positions[j, b])
            denom = float(max(max(lengths[i], 1), max(lengths[j], 1)))
            mean_gap = gaps / inter if inter > 0 else 0.0
            out[k] = 1.0 - inter / denom + position_weight * mean_gap
            k += 1
    return out


@njit(cache=True)
def _layout(left, right, root, n):
    """Leaves in depth-first order (left first) and each node's leaf range [lo, hi)."""
    n_nodes = left.shape[0]
    lo = np.zeros(n_nodes, np.int64)
    hi = np.zeros(n_nodes, np.int64)
    order = np.empty(n, np.int64)
    stack = np.empty(2 * n_nodes, np.int64)
    top = 0
    stack[0] = root
    top = 1
    placed = 0
    visited = np.zeros(n_nodes, np.bool_)
    while top > 0:
        v = stack[top - 1]
        if v < n:  # a leaf
            order[placed] = v
            lo[v] = placed
            placed += 1
            hi[v] = placed
            top -= 1
        elif not visited[v]:
            visited[v] = True
            lo[v] = placed
            stack[top] = right[v]
            stack[top + 1] = left[v]
            top += 2
        else:
            hi[v] = placed
            top -= 1
    return order, lo, hi


@njit(cache=True)
def _n_docs(docs, lengths, order, lo, hi, cum):
    """Per node: how many documents all its leaves contain (counted over its leftmost leaf's context)."""
    n_nodes = lo.shape[0]
    out = np.zeros(n_nodes, np.int64)
    for v in range(n_nodes):
        first = order[lo[v]]
        size = hi[v] - lo[v]
        for a in range(lengths[first]):
            d = docs[first, a]
            if cum[hi[v], d] - cum[lo[v], d] == size:
                out[v] += 1
    return out


@njit(cache=True)
def search_batch(left, right, lo, hi, n_docs, cum, root, n, have, have_len):
    """For each request (its distinct document numbers in ``have``, -1 padded; unknown documents left out):
    the length of its search path, the path's first branch (-1 for an empty path) and the node it ends at."""
    m = have.shape[0]
    path_len = np.zeros(m, np.int64)
    first = np.full(m, -1, np.int64)
    end = np.full(m, root, np.int64)
    for q in range(m):
        node = root
        if _contains(node, lo, hi, n_docs, cum, have, have_len, q):
            steps = 0
            while node >= n:  # an inner node
                best = -1
                best_aff = 0.0
                best_size = 0
                for c in range(2):
                    child = left[node] if c == 0 else right[node]
                    size = hi[child] - lo[child]
                    total = 0
                    for x in range(have_len[q]):
                        d = have[q, x]
                        total += cum[hi[child], d] - cum[lo[child], d]
                    aff = total / size
                    if best < 0 or aff > best_aff or (aff == best_aff and size > best_size):
                        best, best_aff, best_size = c, aff, size
                child = left[node] if best == 0 else right[node]
                if not _contains(child, lo, hi, n_docs, cum, have, have_len, q):
                    break
                if steps == 0:
                    first[q] = best
                node = child
                steps += 1
            path_len[q] = steps
        end[q] = node
    return path_len, first, end


@njit(cache=True)
def _contains(node, lo, hi, n_docs, cum, have, have_len, q):
    """Whether all of ``node``'s documents are among request q's."""
    size = hi[node] - lo[node]
    found = 0
    for x in range(have_len[q]):
        d = have[q, x]
        if cum[hi[node], d] - cum[lo[node], d] == size:
            found += 1
    return found == n_docs[node]


class ContextTree:
    """The context tree of ``contexts`` (none with a repeated document; see :func:`make_tree`)."""

    def __init__(self, contexts: Sequence[tuple[str, ...]], position_weight: float = 0.001) -> None:
        from scipy.cluster.hierarchy import linkage

        self.contexts = list(contexts)
        n = self.n = len(self.contexts)
        self.index: dict[str, int] = {}
        width = max(1, max(map(len, self.contexts)))
        docs = np.full((n, width), -1, np.int64)
        lengths = np.zeros(n, np.int64)
        for i, ctx in enumerate(self.contexts):
            docs[i, :len(ctx)] = [self.index.setdefault(d, len(self.index)) for d in ctx]
            lengths[i] = len(ctx)
        self.names = list(self.index)
        positions = np.broadcast_to(np.arange(width, dtype=float), (n, width))
        left = np.full(2 * n - 1, -1, np.int64)
        right = np.full(2 * n - 1, -1, np.int64)
        self.distances = np.zeros(0)
        if n > 1:
            self.distances = condensed_distances(docs, np.ascontiguousarray(positions), lengths, position_weight)
            merges = linkage(self.distances, method="average")
            left[n:] = merges[:, 0]
            right[n:] = merges[:, 1]
        self.left, self.right, self.root = left, right, 2 * n - 2
        self.parent = np.full(2 * n - 1, -1, np.int64)
        self.parent[left[n:]] = np.arange(n, 2 * n - 1)
        self.parent[right[n:]] = np.arange(n, 2 * n - 1)
        self.order, self.lo, self.hi = _layout(left, right, self.root, n)
        onehot = np.zeros((n + 1, max(1, len(self.index))), np.int32)
        rows = np.repeat(np.arange(1, n + 1), lengths[self.order])
        onehot[rows, docs[self.order][docs[self.order] >= 0]] = 1
        self.cum = np.cumsum(onehot, axis=0, dtype=np.int32)
        self.n_docs = _n_docs(docs, lengths, self.order, self.lo, self.hi, self.cum)
        self._docs: dict[int, tuple[str, ...]] = {}  # node -> its documents (see docs)
        self._lists = self.parent.tolist(), self.lo.tolist(), self.hi.tolist(), self.order.tolist()  # for docs

    def docs(self, node: int) -> tuple[str, ...]:
        """The node's documents in tree order: its parent's in the parent's order, then its own others in the
        order of its leftmost leaf's context. Worked out once per node, from the nearest ancestor already
        known down (the tree's arrays as lists: a request's admission asks for one node)."""
        memo = self._docs
        got = memo.get(node)
        if got is not None:
            return got
        parent, lo, hi, order = self._lists
        chain = []
        while got is None:
            chain.append(node)
            node = parent[node]
            got = memo.get(node) if node >= 0 else ()
        cum, index, contexts = self.cum, self.index, self.contexts
        for node in reversed(chain):
            size, cum_hi, cum_lo = hi[node] - lo[node], cum[hi[node]], cum[lo[node]]
            seen = set(got)
            got = memo[node] = got + tuple([d for d in contexts[order[lo[node]]]
                                            if d not in seen and cum_hi[index[d]] - cum_lo[index[d]] == size])
        return got

    def place(self, contexts: Sequence[tuple[str, ...]]) -> list[tuple[int, int, int]]:
        """Per context: (search path length, first branch or -1, the node the search ends at)."""
        index = self.index
        known = [[index[d] for d in dict.fromkeys(ctx) if d in index] for ctx in contexts]
        have = np.full((len(known), max(1, max(map(len, known), default=1))), -1, np.int64)
        for i, row in enumerate(known):
            have[i, :len(row)] = row
        have_len = np.fromiter(map(len, known), np.int64, len(known))
        path_len, first, end = search_batch(self.left, self.right, self.lo, self.hi, self.n_docs, self.cum,
                                            self.root, self.n, have, have_len)
        return list(zip(path_len.tolist(), first.tolist(), end.tolist()))
