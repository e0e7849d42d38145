"""The SGLang router's *approximate* radix tree of one worker: the prompts the router sent there.

The router cannot see a worker's KV cache; it assumes the worker still holds every prompt it was sent and
records those prompts in a tree of its own (sglang-router's ``tree.rs`` does it over request text; here over
the prompt's int32 token bytes, one token per edge unit). It is a :class:`~prism.policies.prefix_tree
.PrefixTree`, walked as every tree here is: ``match_len`` is the longest prefix of a prompt the tree holds (a
peek); ``insert`` adds a prompt and stamps its path with the time (a split's lower part keeps its own, as in
``tree.rs``); ``evict_to`` drops least recently used leaves until the tree holds at most a given number of
tokens (the router's ``max_tree_size``, applied every ``eviction_interval_s``). Cost: one memcmp per edge on
lookups and inserts, a heap over the leaves on eviction.
"""

from __future__ import annotations

import heapq

from prism.core import TOKEN_BYTES

from prism.policies.prefix_tree import PrefixNode, PrefixTree


class _Node(PrefixNode):
    __slots__ = ("parent", "created")  # and PrefixNode's

    def __init__(self, parent: "_Node | None", key: bytes, last: float, created: int) -> None:
        super().__init__(key, last_access_time=last)
        self.parent = parent
        self.created = created


class ApproxTree(PrefixTree):
    stamps_split_child = False  # tree.rs: the split's lower part keeps its access time

    def __init__(self) -> None:
        super().__init__(page_size=1)
        self.root = _Node(None, b"", 0.0, 0)
        self.size = 0  # tokens held
        self._created = 0

    def insert(self, key: bytes, now: float) -> None:
        node, pos, _ = self._walk(key, self.root, 0, True, now)
        if pos < len(key):
            self._created += 1
            node.children[key[pos:pos + TOKEN_BYTES]] = _Node(node, key[pos:], now, self._created)
            self.size += (len(key) - pos) // TOKEN_BYTES

    def _split(self, child: _Node, m: int, layout) -> _Node:
        cut = m * TOKEN_BYTES
        ck, parent = child.key, child.parent
        self._created += 1
        upper = _Node(parent, ck[:cut], child.last_access_time, self._created)
        parent.children[ck[:TOKEN_BYTES]] = upper
        child.key, child.parent = ck[cut:], upper
        upper.children[ck[cut:cut + TOKEN_BYTES]] = child
        return upper

    def evict_to(self, max_tokens: int) -> int:
        """Drop least recently used leaves until at most ``max_tokens`` remain; returns the tokens dropped."""
        if self.size <= max_tokens:
            return 0
        heap = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                heap.append((node.last_access_time, node.created, node))
        heapq.heapify(heap)
        dropped = 0
        while heap and self.size > max_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[:TOKEN_BYTES]]
            tokens = len(leaf.key) // TOKEN_BYTES
            self.size -= tokens
            dropped += tokens
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access_time, parent.created, parent))
        return dropped
