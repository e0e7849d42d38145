"""A token radix tree KV cache with a capacity, page size, lock references and pluggable eviction.

It follows SGLang's ``RadixCache``: one node per edge of the tree, children keyed by their first page,
``lock_ref`` counts in-use requests on the path (a locked node is never evicted), and eviction pops unlocked
leaves by a policy's sort key until enough tokens are freed. Keys are prompts as int32 token *bytes*, so
edge comparison is a memcmp; only a mismatch asks numpy for the exact position.

Nodes carry the owner segment of their tokens (``kind``, ``seg_id``), from the prompt layout given at
insertion, by the rule of :mod:`prism.policies.anchors`. With ``anchors=True`` every segment boundary becomes
a node boundary (DART's anchors), so each node belongs to exactly one segment.

One walk (:meth:`~prism.policies.prefix_tree.PrefixTree._walk`, shared with the router's and the live
cache's trees) serves the peeks (``match_len``, ``match_path``), admission (``match``) and ``insert``; they
differ in whether it splits a partly matched node and stamps the nodes it enters.
"""

from __future__ import annotations

import heapq
from collections import Counter
from itertools import count
from typing import Any, Callable, ClassVar, Collection, Iterator, cast

import numpy as np

from prism.core import PRIV, TOKEN_BYTES, TOKEN_DTYPE
from prism.policies.anchors import Layout, ResidentSegments, hand_over, pieces, split_owner
from prism.policies.prefix_tree import PrefixNode, PrefixTree


class Node(PrefixNode):
    """One edge of the tree. ``parent``, ``children``, ``key``, ``lock_ref``, ``last_access_time`` and
    ``hit_count`` are SGLang's ``TreeNode`` names; two numbers tell nodes apart (:func:`~prism.policies.anchors
    .hand_over` sets them at a split, for this tree and the live one alike):

    * ``position``: the position in the tree the node holds. A split's upper part takes over the position;
      the lower part moves to a new one. Siblings sorted by position are thus in the order their keys entered
      the parent's ``children``, SGLang's child order (``match_path`` reports positions).
    * ``created``: creation order of node objects (a split's upper part is the newer object). Eviction breaks
      ties with it, as the live cache does with its own ``created``.
    """

    __slots__ = ("created", "parent", "length", "lock_ref", "kind", "seg_id")  # and PrefixNode's

    def __init__(self, node_id: int, parent: "Node | None", key: bytes, depth: int, now: float,
                 kind: str = PRIV, seg_id: str = "") -> None:
        super().__init__(key, node_id, depth, now)  # depth: tokens from the root to the end of this node
        self.created = node_id
        self.parent: Any = parent  # a Node; None for the root and once evicted
        self.length = len(key) // TOKEN_BYTES
        self.lock_ref = 0
        self.kind = kind
        self.seg_id = seg_id

    def __repr__(self) -> str:
        return (f"Node(position={self.position}, len={self.length}, depth={self.depth}, {self.kind}:{self.seg_id}, "
                f"lock={self.lock_ref})")


class RadixCache(PrefixTree):
    """Radix KV cache in token units. ``capacity=None`` means unbounded (the infinite-cache reference)."""

    logs_changes: ClassVar[bool] = True

    def __init__(self, capacity: int | None = None, page_size: int = 1, anchors: bool = False) -> None:
        super().__init__(page_size)
        self.capacity = capacity
        self.anchors = anchors
        self._next_id = 1
        self.root = Node(0, None, b"", 0, 0.0, kind="sys", seg_id="")
        self.root.lock_ref = 1
        self.size = 0  # resident tokens
        self.evictable_size = 0  # resident tokens in unlocked nodes
        self._leaves: set[Node] = set()
        self.resident = ResidentSegments()  # sys / reusable segment id -> resident nodes it owns
        self._leaves_of: dict[str, set[Node]] = {}  # sys / reusable segment id -> its leaves (to re-key them)
        # eviction candidates between passes (see ``evict``): a heap of (*key, serial, tick, node) entries, the
        # key function it was built with, nodes that may have become candidates since the last pass, and the
        # segments whose keys fell (None: rebuild the heap at the next pass)
        self._heap: list[tuple] = []
        self._heap_key: Callable | None = None
        self._fresh: list[Node] = []
        self._lowered: set[str] | None = None
        self._tick = count()
        self._pass_start = 0
        self._logs: list[list] = []  # PrefixTree.log_changes's lists

    def log_changes(self) -> list:
        log: list = []
        self._logs.append(log)
        return log

    def stop_logging(self, log: list) -> None:
        self._logs = [x for x in self._logs if x is not log]

    def _logged(self, node: Node, page: bytes | None) -> None:
        for log in self._logs:
            log.append((node, page))

    # ---------------------------------------------------------------- lookups (peeks: PrefixTree's)
    def match(self, key: bytes, now: float, layout: Layout | None = None, end: int | None = None) -> tuple[int, Node]:
        """Match ``key[:end]`` for admission: split a partly matched node, refresh access times and hit counts.

        Returns the matched length and the last matched node (lock it while the request runs).
        """
        node, pos, _ = self._walk(key, self.root, 0, True, now, True, layout, end=end)
        return pos // TOKEN_BYTES, node

    # ---------------------------------------------------------------- insertion
    def insert(self, key: bytes, now: float, layout: Layout | None = None,
               start: Node | None = None, end: int | None = None) -> tuple[int, Node]:
        """Insert ``key[:end]`` (cut to whole pages); return (tokens newly added, last node of the key).

        ``start``: a node on the key's path that the caller keeps locked (a request's own cached prefix, so
        nothing above it can be evicted). Its path is refreshed through parent links and tokens are compared
        only below it, with the same result as a walk from the root."""
        n = len(key) if end is None else end
        n -= n % self._pb
        node, pos = self.root, 0
        if start is not None:
            node, pos = start, start.depth * TOKEN_BYTES
            while start is not self.root:
                start.last_access_time = now
                start = start.parent
        node, pos, _ = self._walk(key, node, pos, True, now, False, layout, end=n)
        added = 0
        if pos < n:  # the rest of the key is new
            cuts = pieces(layout, pos // TOKEN_BYTES, n // TOKEN_BYTES, self.page_size, self.anchors)
            node = self._new_branch(node, key, pos, cuts, now)
            added = (n - pos) // TOKEN_BYTES
        node.last_access_time = now
        return added, node

    def _new_branch(self, parent: Node, key: bytes, pos: int, pieces: list[tuple[int, str, str]],
                    now: float) -> Node:
        """Hang ``key[pos:]``, up to the last piece's cut, under ``parent`` as a chain of new nodes, one per piece,
        accessed ``now`` (as SGLang stamps a new node); return the last (the only new leaf)."""
        pb = self._pb
        if not parent.children and parent is not self.root:
            self._drop_leaf(parent)
        node, start = parent, pos
        if self._logs:
            self._logged(parent, key[pos:pos + pb])
        for cut, kind, seg in pieces:
            end = cut * TOKEN_BYTES
            child = Node(self._next_id, node, key[start:end], node.depth + (end - start) // TOKEN_BYTES, now,
                         kind, seg)
            self._next_id += 1
            node.children[key[start:start + pb]] = child
            self.resident.add(kind, seg)
            node, start = child, end
        self._add_leaf(node)
        self._candidate(node)
        tokens = (start - pos) // TOKEN_BYTES
        self.size += tokens
        self.evictable_size += tokens
        return node

    def _split(self, child: Node, m: int, layout: Layout | None) -> Node:
        """Split ``child`` after ``m`` tokens; return the new upper node (which keeps the lock count)."""
        cut = m * TOKEN_BYTES
        parent = child.parent
        depth = child.depth - child.length + m
        kind, seg = split_owner(layout, depth, child)
        upper = Node(0, parent, child.key[:cut], depth, child.last_access_time, kind, seg)
        hand_over(upper, child, self._next_id)
        self._next_id += 1
        self.resident.add(kind, seg)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        parent.children[child.key[:self._pb]] = upper
        if self._logs:
            self._logged(parent, child.key[:self._pb])
        child.key = child.key[cut:]
        child.length -= m
        child.parent = upper
        upper.children[child.key[:self._pb]] = child
        return upper

    def _add_leaf(self, node: Node) -> None:
        self._leaves.add(node)
        if node.kind != PRIV:
            self._leaves_of.setdefault(node.seg_id, set()).add(node)

    def _drop_leaf(self, node: Node) -> None:
        self._leaves.discard(node)
        if node.kind != PRIV:
            leaves = self._leaves_of[node.seg_id]
            leaves.discard(node)
            if not leaves:
                del self._leaves_of[node.seg_id]

    def _candidate(self, node: Node) -> None:
        """Note a node that may have become an eviction candidate (an unlocked leaf) for the next pass; past
        a bound (twice the leaves) the next pass rebuilds its heap instead, which costs no more."""
        if self._lowered is not None:
            fresh = self._fresh
            fresh.append(node)
            if len(fresh) > 2 * len(self._leaves) + 64:
                fresh.clear()
                self._lowered = None

    # ---------------------------------------------------------------- locks
    def lock(self, node: Node) -> None:
        self._lock_path(node, self.root)

    def relock(self, old: Node, new: Node) -> None:
        """Move a request's lock from ``old`` to ``new``, old's descendant or old itself (its cached prompt
        grew): the same as lock(new) then unlock(old), but only the nodes in between change."""
        self._lock_path(new, old)

    def _lock_path(self, node: Node, stop: Node) -> None:
        """Lock the nodes from ``node`` up to ``stop`` (excluded)."""
        while node is not stop:
            if node.lock_ref == 0:
                self.evictable_size -= node.length
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += node.length
                if not node.children:
                    self._candidate(node)
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "unlock without lock"
            node = node.parent

    # ---------------------------------------------------------------- eviction
    def evictable_leaves(self) -> list[Node]:
        return [n for n in self._leaves if n.lock_ref == 0]

    def evict(self, num_tokens: int | float, key: Callable[[Node], tuple],
              on_evict: Callable[[Node], None] | None = None, lowered: Collection[str] | None = None) -> int:
        """Evict unlocked leaves, smallest ``key`` first (ties: oldest node), until ``num_tokens`` are freed.

        ``lowered``: the sys/reusable segments whose nodes' keys may have decreased since the last call with
        this key function (the policy's ``lowered_keys``); None: any key may have changed.

        The candidates stay in a heap between passes, each under the key it had when pushed. A key that grew
        since is found stale when its entry surfaces and is pushed again under its current key; so while no
        key falls unreported, every candidate's entry is a lower bound of its key, and the first entry that
        surfaces with its current key is the smallest (key, serial) among the candidates: the node a full sort
        would pick, at a cost per pass of the changes since the last rather than of the tree. Nodes that may
        have become candidates (new leaves, unlocked ones) and the nodes of lowered segments are pushed at the
        next pass, under the keys of that pass; a heap grown past twice the leaves is rebuilt."""
        if lowered is None or key != self._heap_key:
            self._lowered, self._heap_key = None, key
        elif self._lowered is not None:
            self._lowered.update(lowered)
        if num_tokens <= 0:
            return 0
        self._pass_start = next(self._tick)  # entries pushed from here on hold this pass's keys
        heap, tick = self._refresh(key), self._tick
        freed = 0
        root, pb = self.root, self._pb
        node = self._pop(key)
        while node is not None:
            if on_evict is not None:
                on_evict(node)
            parent: Node = node.parent  # typed: compiled, its fields are read directly (a leaf has a parent)
            del parent.children[node.key[:pb]]
            node.parent = None  # out of the tree: its heap entries are stale
            if self._logs:
                self._logged(parent, node.key[:pb])
                self._logged(node, None)
            self._drop_leaf(node)
            self.resident.remove(node.kind, node.seg_id)
            freed += node.length
            if parent is not root and not parent.children:  # the parent is a leaf now
                self._add_leaf(parent)
                if parent.lock_ref == 0:  # a candidate now: often the next to go
                    heapq.heappush(heap, _entry(key(parent), parent, next(tick)))
            if freed >= num_tokens:
                break
            node = self._pop(key)
        self.size -= freed
        self.evictable_size -= freed
        return freed

    def _refresh(self, key: Callable[[Node], tuple]) -> list[tuple]:
        """The candidate heap, brought up to this pass (see ``evict``)."""
        tick, heap, fresh, lowered = self._tick, self._heap, self._fresh, self._lowered
        if lowered is None or len(heap) > 2 * len(self._leaves) + 64:
            heap = self._heap = [_entry(key(n), n, next(tick)) for n in self._leaves if n.lock_ref == 0]
            heapq.heapify(heap)
        else:
            if lowered:
                leaves_of = self._leaves_of
                fresh += [n for seg in lowered for n in leaves_of.get(seg, ())]
            for n in fresh:
                if n.lock_ref == 0 and not n.children and n.parent is not None:
                    heapq.heappush(heap, _entry(key(n), n, next(tick)))
        fresh.clear()
        if lowered is None or lowered:
            self._lowered = set()
        return heap

    def _pop(self, key: Callable[[Node], tuple]) -> Node | None:
        """The candidate with the smallest (key, serial), off the heap; None when there is none."""
        heap, tick, start = self._heap, self._tick, self._pass_start
        while heap:
            entry = heapq.heappop(heap)
            node: Node = entry[-1]  # typed, as is `pushed`: compiled, the checks below read fields directly
            pushed: int = entry[-2]
            if node.lock_ref or node.children or node.parent is None:
                continue  # locked, an inner node or evicted now: it is pushed again when it is a candidate
            if pushed > start:  # keyed in this pass: nothing has touched it since
                return node
            now, was = key(node), entry[:-3]
            if now == was:
                return node
            assert now > was, "an eviction key fell without being reported (EvictionPolicy.lowered_keys)"
            heapq.heappush(heap, _entry(now, node, next(tick)))  # its key grew since it was pushed
        return None

    # ---------------------------------------------------------------- inspection
    def nodes(self) -> Iterator[Node]:
        stack: list[Any] = list(self.root.children.values())  # a Node's children are Nodes
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def sequences(self) -> list[np.ndarray]:
        """The token sequence of every root-to-leaf path (what is resident)."""
        out: list[np.ndarray] = []
        for leaf in self._leaves:
            parts, n = [], leaf
            while n is not self.root:
                parts.append(n.key)
                n = n.parent
            out.append(np.frombuffer(b"".join(reversed(parts)), dtype=TOKEN_DTYPE))
        return out

    def check(self) -> None:
        """Verify the bookkeeping (used by tests)."""
        size = evictable = 0
        leaves = set()
        for n in self.nodes():
            size += n.length
            evictable += n.length if n.lock_ref == 0 else 0
            if not n.children:
                leaves.add(n)
            assert n.length > 0 and n.length % self.page_size == 0, n
            assert n.depth == n.parent.depth + n.length, n
            for k, c in n.children.items():
                assert cast(Node, c).parent is n and c.key[:self._pb] == k
            if n.parent is not self.root:
                assert n.parent.lock_ref >= n.lock_ref, "a parent is locked at least as often as its child"
        assert size == self.size, (size, self.size)
        assert evictable == self.evictable_size, (evictable, self.evictable_size)
        assert leaves == self._leaves
        owners = Counter(n.seg_id for n in self.nodes() if n.kind != PRIV)
        assert owners == dict(self.resident), (owners, self.resident)
        assert self._leaves_of == {s: {n for n in leaves if n.kind != PRIV and n.seg_id == s}
                                   for s in {n.seg_id for n in leaves if n.kind != PRIV}}
        if self.capacity is not None:
            assert self.size <= self.capacity


def _entry(key: tuple, node: Node, tick: int) -> tuple:
    """A candidate's heap entry: its key's items, its creation serial, when it was pushed, the node. Flat, where
    (key, created, tick, node) compared each key tuple twice per step (equal? then less?); an eviction policy's
    keys of one kind, compared in one heap, either differ before the shorter ends or have the same length
    (``EvictionPolicy.key``), so the flat entries sort as the nested ones."""
    return (*key, node.created, tick, node)
