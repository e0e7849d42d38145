"""prism's eviction policies inside SGLang's radix cache (the ``prism`` radix cache backend).

SGLang 0.5.23 builds its default tree on a Rust core that only takes a policy *name*; its classic Python
``RadixCache`` honours any eviction strategy object, whose ``get_priority(node)`` is a sort key (smallest
evicted first). :class:`PrismRadixCache` subclasses that classic tree and:

* gives the strategy the policy's ``key`` (LRU, LFU, LRU+active, DART: one object, as in ``prism-sim``), ties
  broken by creation order as in the simulator's cache, and calls the policy's ``prepare`` once per eviction;
* tags nodes with the segment that owns their tokens (``kind``, ``seg_id``, ``depth``: the node fields of
  :class:`~prism.policies.base.NodeView` beside SGLang's own ``last_access_time``, ``hit_count``,
  ``lock_ref``, ``parent``) by the one anchor rule of :mod:`prism.policies.anchors`; for a policy that
  needs anchors, a newly inserted branch is split at every page-aligned segment boundary;
* hands the ownership to the new upper node of a split (SGLang's ``_split_node`` copies only its own
  fields), keeps the per-segment count of resident nodes DART ranks, counts evicted tokens by tier, and
  tells the engine state when a request leaves (``on_release``);
* keeps a peek index (:class:`PeekIndex`): the tree's shape with each edge in token bytes, which a
  scheduler's peeks (``match_len``, ``match_path``) walk by the project's one prefix walk, without SGLang's
  side effects (its ``match_prefix`` splits and touches). It is built at the first peek and kept from then
  on: QAS never peeks, and keeping it costs about a tenth of the plugin's time in the cache.

The request being matched or inserted gives the layout: SGLang passes it to ``match_prefix`` and
``checkpoint``; inserts between them (tests, warm-up) may give one with :meth:`PrismRadixCache.with_layout`.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable

import numpy as np
from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode

from prism.core import PRIV, TOKEN_DTYPE
from prism.counters import EVICTED_NODES, EVICTED_TOKENS
from prism.policies.anchors import ResidentSegments, hand_over, owner, pieces, split_owner
from prism.policies.base import EvictionPolicy
from prism.policies.prefix_tree import PrefixNode, PrefixTree

from prism.live.seq import LiveSeq


class _PolicyStrategy:
    """SGLang's ``EvictionStrategy`` interface over a prism policy."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy

    def get_priority(self, node) -> tuple:
        return (self.policy.key(node), node.created)


class _PeekNode(PrefixNode):
    """A node of the peek index: its SGLang node's edge as token bytes, its children by their first page, and
    the position and end depth a peek reports (a walk's :class:`~prism.policies.prefix_tree.PrefixNode`)."""

    __slots__ = ()


class PeekIndex(PrefixTree):
    """SGLang's tree's shape in token bytes: every tagged SGLang node has its ``_PeekNode`` (``node.peek``),
    updated where the cache adds, splits or deletes nodes. Peeks only: it is never split by a walk."""

    def __init__(self, page_size: int) -> None:
        super().__init__(page_size)
        self.root = _PeekNode(b"", 0, 0)

    def attach(self, node) -> None:
        """Index a newly tagged SGLang ``node`` under its parent's entry."""
        key = _token_bytes(node.key)
        node.peek = _PeekNode(key, node.position, node.depth)
        node.parent.peek.children[key[:self._pb]] = node.peek

    def split(self, upper, lower) -> None:
        """SGLang split a tagged node: ``upper`` (newly tagged) takes its entry; ``lower`` hangs from it."""
        self.attach(upper)
        peek = lower.peek
        peek.key, peek.position = peek.key[len(upper.peek.key):], lower.position
        upper.peek.children[peek.key[:self._pb]] = peek

    def detach(self, node) -> None:
        del node.parent.peek.children[node.peek.key[:self._pb]]


def _token_bytes(key) -> bytes:
    """An SGLang ``RadixKey``'s token ids as prompt token bytes (int32: the client validates the vocabulary)."""
    return np.frombuffer(key.token_ids, dtype=np.int64)[:len(key)].astype(TOKEN_DTYPE).tobytes()


class PrismRadixCache(RadixCache):
    """SGLang's classic ``RadixCache`` with a prism eviction policy and segment-owned nodes."""

    def __init__(self, params, policy: EvictionPolicy, counters: Counter | None = None,
                 on_release: Callable[[object], None] | None = None,
                 on_reset: Callable[[], None] | None = None) -> None:
        self.policy = policy
        self.anchors = policy.needs_anchors
        self.counters = counters if counters is not None else Counter()
        self._on_release = on_release
        self._on_reset = on_reset
        self._layout = None
        self._serial = 0
        self.plugin_s = 0.0  # CPU time in prism's part of the cache: protection sets and anchor tagging
        self.resident = ResidentSegments()
        self.index: PeekIndex | None = None  # made at the first peek (_peeks)
        super().__init__(params)
        self.eviction_strategy = _PolicyStrategy(policy)

    # ------------------------------------------------------------ node bookkeeping
    def reset(self) -> None:
        super().reset()
        self.resident = ResidentSegments()
        self.index = None
        root = self.root_node
        root.kind, root.seg_id, root.depth, root.created, root.position = "sys", "", 0, 0, 0
        if self._on_reset is not None:  # /flush_cache: a new run starts
            self._on_reset()

    def _own(self, node, kind: str, seg: str, depth: int) -> None:
        """Give a node its owner segment and end depth (its ``created`` and ``position`` are set)."""
        node.kind, node.seg_id, node.depth = kind, seg, depth
        self.resident.add(kind, seg)

    def _tag(self, node, kind: str, seg: str, depth: int) -> None:
        """Tag a new node: owner, end depth, a creation number (eviction ties, as in the simulator) and a new
        position; index it for peeks."""
        self._serial += 1
        node.created = node.position = self._serial
        self._own(node, kind, seg, depth)
        if self.index is not None:
            self.index.attach(node)

    @contextmanager
    def with_layout(self, layout):
        """Match and insert for a prompt of this layout ((end, kind, segment id) per segment)."""
        saved, self._layout = self._layout, layout
        try:
            yield self
        finally:
            self._layout = saved

    def _split_node(self, key, child, split_len: int):
        upper = super()._split_node(key, child, split_len)
        if getattr(child, "created", None) is None:  # a branch of this insert: tagged by _own_path
            upper.created = None
            return upper
        depth = child.depth - len(child.key)  # child.key is already the lower part
        self._serial += 1
        hand_over(upper, child, self._serial)  # as in the simulator's tree
        self._own(upper, *split_owner(self._layout, depth, child), depth)
        if self.index is not None:
            self.index.split(upper, child)
        return upper

    def _owner(self, end: int) -> tuple[str, str]:
        return owner(self._layout, end) if self._layout else (PRIV, "")

    def _own_path(self, last) -> None:
        """Tag the untagged nodes on the path to ``last`` (a new branch), top-down, each with the segment that
        holds its last token; with anchors the branch is first cut at each page-aligned segment boundary."""
        path, node = [], last
        while node is not self.root_node and getattr(node, "created", None) is None:
            path.append(node)
            node = node.parent
        if not path:
            return
        pos = node.depth
        lengths = [len(n.key) for n in path]
        owners = pieces(self._layout, pos, pos + sum(lengths), self.page_size, self.anchors)
        i = 0  # the next piece
        for node, length in zip(reversed(path), reversed(lengths)):
            end = pos + length
            j = i
            while owners[j][0] < end:  # SGLang made one edge across segment boundaries: cut off the parts above
                j += 1
            if j > i:
                cuts = owners[i:j]
                for upper, (cut, kind, seg) in zip(self._cut(node, [c - pos for c, _, _ in cuts]), cuts):
                    self._tag(upper, kind, seg, cut)
            if owners[j][0] == end:
                self._tag(node, owners[j][1], owners[j][2], end)
                j += 1
            else:  # a node boundary inside a piece (an existing node's split): its owner by the rule
                self._tag(node, *self._owner(end), end)
            pos, i = end, j

    def _cut(self, node, offsets: list[int]) -> list:
        """Split the parts before each of ``offsets`` (increasing, inside it) off a node this insert made, for
        anchors; the new upper nodes, top-down. SGLang's ``_split_node`` (``radix_cache.py``) once per part, less
        what a fresh node does without: its value is this insert's own copy, so every part is a view of it (no
        clones), and it has no page hashes yet (computed when its KV event is sent); and the key and value are
        sliced once per part, not twice per cut. Measured on a 150-request zipf run: the anchors' splits took
        22 ms with SGLang's, 11-14 ms one cut at a time; a new branch's whole anchor pass 47-49 -> 40-41 us with
        engine work between inserts once the parts were cut in one pass (the cache's part 15-17 -> 12-14 ms)."""
        if node.hash_value is not None or node.event_hash_value is not None:  # hashed already: SGLang splits them
            uppers, done = [], 0
            for offset in offsets:
                uppers.append(super()._split_node(node.key, node, offset - done))
                done = offset
            return uppers
        key, value, parent, page = node.key, node.value, node.parent, self.page_size
        uppers, start = [], 0
        for offset in offsets:
            upper = TreeNode(priority=node.priority)
            upper.hit_count, upper.lock_ref, upper.parent = node.hit_count, node.lock_ref, parent
            upper.key, upper.value = key[start:offset], value[start:offset]
            parent.children[upper.key.child_key(page)] = upper
            uppers.append(upper)
            parent, start = upper, offset
        node.key, node.value, node.parent = key[start:], value[start:], parent
        parent.children[node.key.child_key(page)] = node
        return uppers

    # ------------------------------------------------------------ SGLang's entry points
    def match_prefix(self, params):
        req = getattr(params, "req", None)
        seq = LiveSeq.of(req, time.monotonic()) if req is not None else None
        if seq is None:
            return super().match_prefix(params)
        with self.with_layout(seq.layout):
            return super().match_prefix(params)

    def insert(self, params):
        result = super().insert(params)
        t0 = time.perf_counter()
        self._own_path(result.last_device_node)
        self.plugin_s += time.perf_counter() - t0
        return result

    def checkpoint(self, req, *, up_to: int):
        seq = LiveSeq.of(req, time.monotonic())
        if seq is None:
            return super().checkpoint(req, up_to=up_to)
        with self.with_layout(seq.layout):
            return super().checkpoint(req, up_to=up_to)

    def evict(self, params):
        t0 = time.perf_counter()
        self.policy.prepare(self)
        self.plugin_s += time.perf_counter() - t0
        return super().evict(params)

    def _delete_leaf(self, node) -> None:
        self.counters[EVICTED_TOKENS[self.policy.tier(node)]] += len(node.key)
        self.counters[EVICTED_NODES] += 1
        self.resident.remove(node.kind, node.seg_id)
        if self.index is not None:
            self.index.detach(node)
        super()._delete_leaf(node)

    def on_release(self, req, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        if self._on_release is not None:
            self._on_release(req)

    # ------------------------------------------------------------ prefix index for schedulers
    def _peeks(self) -> PeekIndex:
        """The peek index, built from the tree at the first peek (parents before children)."""
        if self.index is None:
            self.index = index = PeekIndex(self.page_size)
            self.root_node.peek = index.root
            stack = list(self.root_node.children.values())
            while stack:
                node = stack.pop()
                index.attach(node)
                stack.extend(node.children.values())
        return self.index

    def match_len(self, key: bytes) -> int:
        """Cached tokens of ``key`` (int32 token bytes): the PrefixIndex a prism scheduler reads."""
        return self._peeks().match_len(key)

    def match_path(self, key: bytes) -> list[tuple[int, int]]:
        """(position, end depth) of the nodes the cached part of ``key`` runs through (the PrefixIndex
        protocol: siblings sorted by position are in SGLang's child order)."""
        return self._peeks().match_path(key)
