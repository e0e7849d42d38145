"""The SGLang router's *approximate* radix tree of one worker: the prompts the router sent there.

The router cannot see a worker's KV cache; it assumes the worker still holds every prompt it was sent and
records those prompts in a tree of its own (sglang-router's ``tree.rs`` does it over request text; here over
the prompt's int32 token bytes, one token per edge unit). ``match_len`` is the longest prefix of a prompt the
tree holds (a peek); ``insert`` adds a prompt and stamps its path with the time; ``evict_to`` drops least
recently used leaves until the tree holds at most a given number of tokens (the router's ``max_tree_size``,
applied every ``eviction_interval_s``). Cost: one memcmp per edge on lookups and inserts, a heap over the
leaves on eviction.
"""

from __future__ import annotations

import heapq

import numpy as np

from prism.core import TOKEN_BYTES, TOKEN_DTYPE


class _Node:
    __slots__ = ("parent", "children", "key", "last", "serial")

    def __init__(self, parent: "_Node | None", key: bytes, last: float, serial: int) -> None:
        self.parent = parent
        self.children: dict[bytes, _Node] = {}
        self.key = key
        self.last = last
        self.serial = serial


def _lcp(a: bytes, b: bytes) -> int:
    """Common prefix of two token byte strings, in whole tokens."""
    n = min(len(a), len(b)) // TOKEN_BYTES
    x = np.frombuffer(a, dtype=TOKEN_DTYPE, count=n)
    y = np.frombuffer(b, dtype=TOKEN_DTYPE, count=n)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


class ApproxTree:
    def __init__(self) -> None:
        self.root = _Node(None, b"", 0.0, 0)
        self.size = 0  # tokens held
        self._serial = 0

    def match_len(self, key: bytes) -> int:
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos:pos + TOKEN_BYTES])
            if child is None:
                break
            if not key.startswith(child.key, pos):
                return pos // TOKEN_BYTES + _lcp(child.key, key[pos:pos + len(child.key)])
            pos += len(child.key)
            node = child
        return pos // TOKEN_BYTES

    def insert(self, key: bytes, now: float) -> None:
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos:pos + TOKEN_BYTES])
            if child is None:
                self._serial += 1
                leaf = _Node(node, key[pos:], now, self._serial)
                node.children[key[pos:pos + TOKEN_BYTES]] = leaf
                self.size += (n - pos) // TOKEN_BYTES
                return
            ck = child.key
            if not key.startswith(ck, pos):  # split the child at the common prefix
                m = _lcp(ck, key[pos:pos + len(ck)]) * TOKEN_BYTES
                self._serial += 1
                upper = _Node(node, ck[:m], now, self._serial)
                node.children[ck[:TOKEN_BYTES]] = upper
                child.key, child.parent = ck[m:], upper
                upper.children[ck[m:m + TOKEN_BYTES]] = child
                child = upper
            child.last = now
            pos += len(child.key)
            node = child

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
                heap.append((node.last, node.serial, node))
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
                heapq.heappush(heap, (parent.last, parent.serial, parent))
        return dropped
