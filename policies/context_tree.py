"""ContextPilot's live context index: a tree of the document lists of the requests it has sent, grown one leaf
per request and pruned when the engine evicts a request.

Read from ContextPilot's code (``EfficientContext/ContextPilot`` at 1fa0a143; paths under ``contextpilot/``),
the path one request takes through ``build_incremental`` (``server/live_index.py:460``), which is what its
proxy runs for every request (``server/http_server.py:1394``: "All docs = one context"):

* **Nodes.** The root holds no documents. A leaf is one request, its documents in the order it was sent. An
  inner node is made by a split and holds the leading documents its first two leaves share
  (``live_index.py:1491-1640``). Children keep the order they were added in; a split puts the new inner node
  where the leaf was (``live_index.py:1570``), the leaf first and the new leaf second below it.
* **Distance** (``context_index/compute_distance_cpu.py:12-47``): ``1 − |A∩B| / max(|A|,|B|) + α · mean
  |pos_A − pos_B|`` over the shared documents, 1 when they share none or one is empty; the search stores it
  in a float32 array (``compute_distance_cpu.py:82-85``), so it is compared rounded to float32 here too.
* **Search** (``live_index.py:1166-1259``): from the root, among the children that share a document with the
  context, the one at the smallest distance (ties: the earlier child, ``dist < best``). If its first document
  is in the context (*has_prefix*) and it has children, descend into it; otherwise it is the match. When no
  child shares a document, the node the search stands on is the match (with has_prefix), or at the root there
  is no match. (Below the root that needs children without the node's first document, which only prompts
  indexed in their own order, then evictions, leave behind: otherwise a has_prefix match is a leaf.)
* **Reorder** (``live_index.py:514-524, 633-661``): a matched context puts the matched node's documents that it
  has first, in the node's order, then its others in their order; an unmatched one keeps its order.
* **Insert** (``live_index.py:549-566``): a has_prefix match on a leaf splits the leaf (the shared leading
  documents of the leaf and the reordered context become an inner node above both; none shared, or the same
  documents in the same order: the new leaf becomes the leaf's sibling instead, ``live_index.py:1532-1538``);
  a has_prefix match on an inner node takes the new leaf as its last child (``live_index.py:1398-1435``); a
  match without has_prefix puts it beside the match, as the last child of the match's parent
  (``live_index.py:561-566``); no match: the last child of the root (a one-context index merged under the
  root, ``live_index.py:573-609``, which for one context is a leaf with the context's order,
  ``context_index/index_construction.py:234-282``).
* **Remove** (``live_index.py:1676-1723``): an evicted request's leaf goes, and a parent left without children
  goes too, up to (not including) the root.

Not modelled: batches of several contexts in one ``/reorder`` call (their hierarchical clustering and
``_schedule_incremental`` order, ``live_index.py:573-615, 820-851``), which per-request traffic never makes,
and multi-turn deduplication.

Cost. A node of more than a few children keeps, per document, a row marking the children that hold it, so a
search level counts what every child shares with the context in k vector adds for k documents, and computes
the distance only for those whose shared count leaves them a chance to be the closest (``_contenders``). A
split below a node of the same leading documents makes a child of the node's own documents, and evictions leave
chains of them (the code's index has them too): on zipf, 20,480 requests, 82% of the levels a search walks. Such
a child wins its level without a distance where no other child can beat it (``_lead``).
"""

from __future__ import annotations

import math
import struct
from itertools import count
from typing import Any, Callable, Hashable, Sequence

import numpy as np

Doc = Hashable


_F32 = struct.Struct("f")
#: up to this many children, a search level intersects each with the context; past it, a node keeps columns
_FEW = 4


def positions(docs: Sequence[Doc]) -> dict[Doc, int]:
    """Each document's position (the last one, for a repeated document, as the code's dict keeps it)."""
    return {d: i for i, d in enumerate(docs)}


def _distance(pos_a: dict, len_a: int, pos_b: dict, len_b: int, alpha: float) -> float:
    if not len_a or not len_b:
        return 1.0
    shared = pos_a.keys() & pos_b.keys()
    if not shared:
        return 1.0
    return _shared_distance(shared, pos_a, len_a, pos_b, len_b, alpha)


def _shared_distance(shared: set, pos_a: dict, len_a: int, pos_b: dict, len_b: int, alpha: float) -> float:
    """:func:`_distance` of two lists that share the documents ``shared`` (not empty)."""
    gap = sum([abs(pos_a[d] - pos_b[d]) for d in shared])
    exact = _overlap_term(len(shared), len_a, len_b) + alpha * (gap / len(shared))
    return _F32.unpack(_F32.pack(exact))[0]  # float32, as the code's distance array holds it


def _overlap_term(shared: int, len_a: int, len_b: int) -> float:
    """The distance's first term, 1 − shared/max(len_a, len_b): the whole distance where the shared documents
    sit at the same positions, and below it otherwise (the search's lower bound)."""
    return 1.0 - shared / (len_a if len_a > len_b else len_b)


def distance(a: Sequence[Doc], b: Sequence[Doc], alpha: float = 0.001) -> float:
    """ContextPilot's distance of two document lists, rounded to float32 as its search compares it."""
    return _distance(positions(a), len(a), positions(b), len(b), alpha)


def reorder_with_prefix(context: Sequence[Doc], prefix: Sequence[Doc]) -> tuple[Doc, ...]:
    """The prefix's documents that the context holds, in the prefix's order, then the context's others."""
    have = set(context)
    head = list(dict.fromkeys(d for d in prefix if d in have))
    used = set(head)
    return tuple(head + [d for d in context if d not in used])


class Node:
    """A node of the index. ``rank`` orders siblings as ContextPilot's children list does; ``columns``, once it
    has more than a few children, counts which of them hold each document (:class:`_Columns`)."""

    __slots__ = ("docs", "pos", "parent", "rank", "children", "columns", "col", "owner", "lead")

    def __init__(self, docs: tuple[Doc, ...], parent: "Node | None", rank: int, owner: Any = None) -> None:
        self.docs = docs
        self.pos = positions(docs)
        self.parent = parent
        self.rank = rank
        self.children: dict[Node, None] = {}
        self.columns: _Columns | None = None
        self.col = -1  # its column in its parent's columns
        self.owner = owner  # a leaf's request (whatever the caller keys it by); None for inner nodes
        self.lead: tuple | None = None  # ``_lead``'s answer: (child, rest) or (); None: not asked since a change

    @property
    def is_leaf(self) -> bool:
        return not self.children


class _Columns:
    """A node's children as columns, and per document a row marking the children that hold it (numpy): a
    search level adds the context's rows to count what each child shares with it, in a few vector operations
    however many children the node has (the root of a zipf run of 20,480 requests holds 1,500 on average: the
    requests that matched nothing and the inner nodes their splits made). A freed column is reused by the next
    child. Memory: 2 bytes a column for each document a child holds; on the Mooncake trace (its blocks as
    documents) the run's peak RSS is 712 MiB, against 784 with a dict of holders per document."""

    def __init__(self) -> None:
        self.nodes: list[Node | None] = []
        self.free: list[int] = []
        self.lengths = np.zeros(16)  # each column's child's document count (a float: it divides)
        self.rows: dict[Doc, np.ndarray] = {}  # document -> holders, 1 per column that holds it
        self.holders: dict[Doc, int] = {}  # document -> how many columns hold it (its row goes at 0)

    def add(self, child: Node) -> None:
        if self.free:
            col = self.free.pop()
            self.nodes[col] = child
        else:
            col = len(self.nodes)
            self.nodes.append(child)
            if col == len(self.lengths):
                self._grow()
        child.col = col
        self.lengths[col] = len(child.docs)
        rows, holders, width = self.rows, self.holders, len(self.lengths)
        for d in child.pos:
            row = rows.get(d)
            if row is None:
                row = rows[d] = np.zeros(width, np.uint16)
            row[col] = 1
            holders[d] = holders.get(d, 0) + 1

    def drop(self, child: Node) -> None:
        col = child.col
        rows, holders = self.rows, self.holders
        for d in child.pos:
            if holders[d] == 1:
                del rows[d], holders[d]
            else:
                rows[d][col] = 0
                holders[d] -= 1
        self.nodes[col] = None
        self.free.append(col)

    def _grow(self) -> None:
        width = 2 * len(self.lengths)
        self.lengths = np.concatenate([self.lengths, np.zeros(width - len(self.lengths))])
        for d, row in self.rows.items():
            self.rows[d] = np.concatenate([row, np.zeros(width - len(row), np.uint16)])

    def counts(self, pos: dict) -> np.ndarray | None:
        """How many of the context's documents each column's child holds (0 for a freed column), or None when
        no child holds any."""
        rows = self.rows
        mine = [rows[d] for d in pos if d in rows]
        if not mine:
            return None
        first = mine[0] if len(mine) < 1 << 16 else mine[0].astype(np.int64)  # a count fits the rows' uint16
        return sum(mine[1:], first)  # rows added in turn: np.add.reduce would stack them first


def _lead(node: Node) -> tuple[Node, set] | tuple[()]:
    """The node's child of the node's own documents and the documents its other children hold past the node's
    (a split below a node whose documents it shares makes such a child: chains of them, once evictions took
    the leaves in between), or (): unless that child is the only one of its documents, every other child
    extends the node's documents and came after it (a later rank). A context that holds the node's first
    document and none of those others is then closest to that child: any other child shares with the context
    what the node does, at the same positions, and is no shorter, so it lies at least as far and loses a tie by
    its rank. A node of more than a few children answers () at once; a child attached or detached makes the
    search ask again."""
    docs, n, children = node.docs, len(node.docs), node.children
    same = [c for c in children if c.docs == docs] if n and len(children) <= _FEW else ()
    if len(same) != 1:
        return ()
    first = same[0]
    rest: set[Doc] = set()
    for c in children:
        if c is not first:
            if c.rank < first.rank or c.docs[:n] != docs:
                return ()
            rest.update(c.docs[n:])
    return first, rest


def _fewest_shared(top: int, length: int, cut: float) -> int:
    """The fewest shared documents, at most ``top``, whose lower bound 1 − s/length rounds (float32) to ``cut`` or
    below: the smallest such s. Found from the real-valued estimate, then moved to its float32 neighbours (a
    context of 800 documents would take 600 steps down from ``top``); ``tests/test_contextpilot.py`` holds it
    to the scan down from ``top``."""
    def low(s: int) -> float:
        return _F32.unpack(_F32.pack(1.0 - s / length))[0]

    need = min(top, max(1, math.ceil((1.0 - cut) * length)))
    while need > 1 and low(need - 1) <= cut:
        need -= 1
    while need < top and low(need) > cut:
        need += 1
    return need


class Match:
    """What a search found: the node, how many of its documents the context has, and whether its first
    document is in the context (``has_prefix``)."""

    __slots__ = ("node", "overlap", "has_prefix")

    def __init__(self, node: Node, overlap: int, has_prefix: bool) -> None:
        self.node, self.overlap, self.has_prefix = node, overlap, has_prefix


#: a leaf the caller says was evicted was removed during the search: search again
_AGAIN = object()


class ContextIndex:
    """ContextPilot's live index (module docstring). ``alive(leaf)`` (optional) tells whether a leaf's
    request is still in the engine's cache; the search removes, as ContextPilot's eviction callback would
    have, each leaf it is about to use that is not."""

    def __init__(self, alpha: float = 0.001) -> None:
        self.alpha = alpha
        self._ranks = count()
        self.root = Node((), None, next(self._ranks))
        self.leaves = 0
        self.splits = 0
        self.removed = 0

    # ------------------------------------------------------------ the tree
    def _attach(self, parent: Node, child: Node) -> None:
        child.parent = parent
        parent.children[child] = None
        parent.lead = None
        if parent.columns is not None:
            parent.columns.add(child)
        elif len(parent.children) > _FEW:  # from now on a search counts shared documents by columns
            parent.columns = _Columns()
            for c in parent.children:
                parent.columns.add(c)

    def _detach(self, parent: Node, child: Node) -> None:
        del parent.children[child]
        parent.lead = None
        if parent.columns is not None:
            parent.columns.drop(child)

    def _new_leaf(self, parent: Node, docs: tuple[Doc, ...], owner: Any) -> Node:
        leaf = Node(docs, parent, next(self._ranks), owner)
        self._attach(parent, leaf)
        self.leaves += 1
        return leaf

    def remove(self, leaf: Node) -> None:
        """An evicted request's leaf goes; so does each ancestor left without children, below the root."""
        node = leaf
        self.leaves -= 1
        self.removed += 1
        while node is not self.root and node.is_leaf:
            parent = node.parent
            assert parent is not None  # only the root has none
            self._detach(parent, node)
            node = parent

    def prune(self, alive: Callable[[Node], bool]) -> list[Node]:
        """Remove every dead leaf now (and the parents it leaves empty), as ContextPilot's eviction callback
        would have, and return the leaves that stay. A search removes only the dead leaves it is about to use
        (:meth:`search`), which gives the same answers while a dead request stays dead; but a leaf no search
        reaches would stay for ever, holding its request's key: on a long-running server, most leaves."""
        kept = []
        for leaf in self.leaf_nodes():
            if alive(leaf):
                kept.append(leaf)
            else:
                self.remove(leaf)  # its parents may go, never another leaf
        return kept

    def leaf_nodes(self) -> list[Node]:
        """The index's leaves, in no particular order."""
        stack, out = list(self.root.children), []
        while stack:
            node = stack.pop()
            if node.is_leaf:
                out.append(node)
            else:
                stack += node.children
        return out

    # ------------------------------------------------------------ search
    def search(self, context: Sequence[Doc], alive: Callable[[Node], bool] | None = None) -> Match | None:
        """The node the context matches (None: no match), after removing the dead leaves on the way."""
        pos = positions(context)
        live: set[Node] = set()  # nodes known to hold a live leaf during this search
        while True:
            found = self._descend(pos, len(context), alive, live)
            if found is not _AGAIN:
                return found

    def _descend(self, pos: dict, length: int, alive: Callable[[Node], bool] | None, live: set[Node]):
        node, have = self.root, pos.keys()
        while True:
            lead = node.lead
            if lead is None:
                lead = node.lead = _lead(node)
            if lead and have.isdisjoint(lead[1]) and node.docs[0] in have:
                best = lead[0]  # the closest child without a distance: 77% of the levels
            elif not node.children:  # only the root can be reached without children: an empty index
                return None
            else:
                best = self._closest(node, pos, length)
                if best is None:  # no child shares a document (live_index.py:1230-1239)
                    if node is self.root:
                        return None
                    return Match(node, len(have & node.pos.keys()), True)
            if alive is not None and best not in live and not self._live(best, alive, live):
                return _AGAIN
            prefix = best.docs[0] in have
            if prefix and best.children:
                node = best
                continue
            return Match(best, len(have & best.pos.keys()), prefix)

    def _closest(self, node: Node, pos: dict, length: int) -> Node | None:
        """The child at the smallest distance among those sharing a document (ties: the earlier), or None. Where
        the node's child of its own documents wins whatever the distances (``_lead``: 77% of all levels),
        :meth:`_descend` takes it without asking this. A lone contender needs no distance (zipf, 20,480 requests:
        26,000 of the 85,000 levels that ask). A few children are each intersected with the context; many are
        narrowed down by their bounds first (``_contenders``: a threshold on their shared counts).

        The contenders are then seen in rank order, and a distance is computed only where the contender's lower
        bound, 1 − s/max(its length, the context's) for s shared documents, is below the closest so far (at it
        or above, the contender lies no closer and loses the tie), and none once one lies at the lowest bound
        of all. That halves the distances at the root of a zipf run of 20,480 requests (its contenders share as
        many documents and are as long, and half the time one has the context's positions), and the position gaps
        summed on Mooncake's levels of a few children (each of which is still intersected with the context)."""
        children, have = node.children, pos.keys()
        contenders: list[tuple[int, Node, float, set | None]]
        if len(children) > _FEW:
            contenders = self._contenders(node, pos, length)
        else:
            contenders = []
            for c in children:
                common = have & c.pos.keys()
                if common:
                    contenders.append((c.rank, c, _overlap_term(len(common), length, len(c.docs)), common))
        if len(contenders) <= 1:
            return contenders[0][1] if contenders else None
        contenders.sort()  # by rank: a tie goes to the earlier
        floor = _F32.unpack(_F32.pack(min([c[2] for c in contenders])))[0]  # no distance lies below it
        best, best_d, alpha = None, math.inf, self.alpha
        for _, child, low, shared in contenders:
            if low < best_d:
                dist = _shared_distance(shared or have & child.pos.keys(), pos, length, child.pos, len(child.docs),
                                        alpha)
                if dist < best_d:
                    best, best_d = child, dist
                    if dist <= floor:
                        break
        return best

    def _contenders(self, node: Node, pos: dict, length: int) -> list[tuple[int, Node, float, set | None]]:
        """The children sharing a document with the context that may be the closest, as :meth:`_closest` takes them
        (rank, child, the lower bound of its distance, and None for the shared documents). A child sharing s documents
        lies at least 1 − s/length away (its list is compared at a length of at least the context's), and the child
        sharing the most, s*, at most 1 − s*/m* + α·(m* − 1) (m* the longer of its list and the context; no position gap
        exceeds m* − 1); float32 rounding keeps order, so a child whose lower bound rounds above that can neither win
        nor tie: the others are those sharing at least ``_fewest_shared``. The counting runs in numpy (the node's
        columns): near the root a document has hundreds of holders."""
        columns = node.columns
        assert columns is not None  # a node of more than a few children
        counts = columns.counts(pos)
        if counts is None:
            return []
        best = int(counts.argmax())
        top = int(counts[best])
        m = max(int(columns.lengths[best]), length)
        cut = _F32.unpack(_F32.pack(min(2.0, 1.0 - top / m + self.alpha * (m - 1))))[0]
        cols = (counts >= _fewest_shared(top, length, cut)).nonzero()[0].tolist()
        nodes, shared = columns.nodes, counts[cols].tolist()
        out: list[tuple[int, Node, float, set | None]] = []
        for col, s in zip(cols, shared):
            child = nodes[col]
            assert child is not None  # a freed column counts 0
            out.append((child.rank, child, _overlap_term(s, length, len(child.docs)), None))
        return out

    def _live(self, node: Node, alive: Callable[[Node], bool], live: set[Node]) -> bool:
        """Whether ``node`` holds a live leaf; the dead leaves found on the way are removed (which may prune ``node``
        itself). Stops at the first live leaf, depth first, children in order: a child passed over held no live leaf, so
        its whole subtree is gone and the next child to see is the first one left. The nodes on the way down to it go
        into ``live``: a search asks again for the child it descends into, and for a node on that way the walk would
        meet only that leaf again (the dead leaves before it are gone), so the answer is known. A loop, not a recursion:
        evictions leave chains of inner nodes deeper than Python's recursion limit."""
        stack: list[Node] = []  # the inner nodes on the way
        while True:
            if node in live:
                found = True
            elif not node.children:  # a leaf
                found = alive(node)
                if found:
                    live.add(node)
                else:
                    self.remove(node)
            else:
                stack.append(node)
                found = False
            if found:
                live.update(stack)
                return True
            while stack:
                children = stack[-1].children
                if children:
                    node = next(iter(children))
                    break
                stack.pop()
            else:
                return False

    # ------------------------------------------------------------ insert
    def insert(self, context: Sequence[Doc], owner: Any, alive: Callable[[Node], bool] | None = None,
               reorder: bool = True) -> tuple[tuple[Doc, ...], Node]:
        """Index one request's context, as ContextPilot's ``build_incremental`` does for one context: the new
        document order (the context's own when ``reorder`` is False: a prompt that may not move is indexed as
        it is) and the request's leaf."""
        context = tuple(context)
        match = self.search(context, alive)
        if match is None or match.overlap == 0:
            return context, self._new_leaf(self.root, context, owner)
        node = match.node
        docs = reorder_with_prefix(context, node.docs) if reorder else context
        if not match.has_prefix:
            assert node.parent is not None  # a match is below the root
            return docs, self._new_leaf(node.parent, docs, owner)
        if node.is_leaf:
            return docs, self._split(node, docs, owner)
        return docs, self._new_leaf(node, docs, owner)

    def _split(self, leaf: Node, docs: tuple[Doc, ...], owner: Any) -> Node:
        """The leaf and the new context under a new inner node of their shared leading documents; a sibling
        instead when they share none or are the same list."""
        shared = 0
        for a, b in zip(leaf.docs, docs):
            if a != b:
                break
            shared += 1
        parent = leaf.parent
        assert parent is not None
        if shared == 0 or (shared == len(leaf.docs) and set(leaf.docs) == set(docs)):
            return self._new_leaf(parent, docs, owner)
        self._detach(parent, leaf)
        inner = Node(leaf.docs[:shared], parent, leaf.rank)  # where the leaf was among its siblings
        self._attach(parent, inner)
        leaf.rank = next(self._ranks)
        self._attach(inner, leaf)
        self.splits += 1
        return self._new_leaf(inner, docs, owner)

    # ------------------------------------------------------------ views (tests, stats)
    def nodes(self) -> list[Node]:
        """Every node below the root, depth first, siblings in order."""
        out: list[Node] = []
        stack = sorted(self.root.children, key=lambda n: n.rank, reverse=True)
        while stack:
            n = stack.pop()
            out.append(n)
            stack += sorted(n.children, key=lambda c: c.rank, reverse=True)
        return out
