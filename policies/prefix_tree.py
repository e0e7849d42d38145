"""The one walk down a radix tree of prompts, which every tree of the project takes.

A prompt is its int32 token *bytes* (``prism.core``), so comparing an edge is a memcmp. Nodes have
``children`` (keyed by the first page of their edge, as token bytes), ``key`` (their edge), ``place`` and
``depth`` (reported by :meth:`PrefixTree.match_path`) and ``last_access_time`` and ``hit_count`` (stamped by
a walk that says so). Three trees are :class:`PrefixTree` subclasses, each with its own nodes and split:

* the simulator's KV cache (``sim/radix_cache.py``): match and insert for admission, peeks for schedulers;
* a router's approximate tree of a worker (``policies/approx_tree.py``): match and insert of routed prompts;
* the live cache's peek index (``live/radix.py``): a copy of SGLang's tree's shape in token bytes, which a
  scheduler's peeks walk without SGLang's side effects.

:meth:`PrefixTree._walk` has mini-sglang's ``_tree_walk`` shape: from a node, follow the child of the next
page while its edge is a prefix of the rest of the key; at a partly matched child either stop (a peek) or
split it at the match and go on into its upper part (admission and insertion).
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

from mypy_extensions import mypyc_attr

from prism.core import TOKEN_BYTES


@mypyc_attr(allow_interpreted_subclasses=True)  # a router's tree's nodes and the live peek index's (prism/native.py)
class PrefixNode:
    """What the walk reads and stamps of a node, which each tree's nodes extend (not SGLang's ``TreeNode``: the live
    peek index's): typed, so that the compiled walk reads them as fields, where untyped nodes cost a generic lookup
    each (zipf, 20,480 requests: 1.1% of an FCFS run's instructions, 1.6% of k-LPM's)."""

    __slots__ = ("children", "key", "position", "depth", "last_access_time", "hit_count")

    def __init__(self, key: bytes, position: int = 0, depth: int = 0, last_access_time: float = 0.0) -> None:
        self.children: dict[bytes, PrefixNode] = {}
        self.key = key
        self.position = position
        self.depth = depth
        self.last_access_time = last_access_time
        self.hit_count = 0


@mypyc_attr(allow_interpreted_subclasses=True)  # a router's tree and the live peek index (prism/native.py)
class PrefixTree:
    """A radix tree over token bytes in pages of ``page_size`` tokens; subclasses own ``root`` and ``_split``.

    ``stamps_split_child``: a stamping walk (``now``) also stamps a child it splits, so that both its parts
    are touched (SGLang's ``_match_prefix_helper`` and ``_insert_helper`` stamp a child before they compare
    it); sglang-router's tree gives the new upper part the time and leaves the lower part's (``tree.rs``
    ``insert``)."""

    stamps_split_child: ClassVar[bool] = True  # ClassVar: a compiled walk reads a subclass's (prism/native.py)

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self._pb = page_size * TOKEN_BYTES
        self.root: Any = None  # the subclass's node

    def _lcp(self, a: bytes, b: bytes) -> int:
        """Common prefix of two token byte strings, in tokens, floored to the page size.

        A bisection over whole pages, each step one comparison of byte slices in C: a partly matched node
        usually diverges hundreds of tokens in (at a segment boundary), where this takes a third less time
        than comparing token arrays in numpy, whose fixed cost per call dominates."""
        pb = self._pb
        lo, hi = 0, min(len(a), len(b)) // pb  # pages: the first lo are equal; past hi there are none
        if a[:hi * pb] == b[:hi * pb]:
            return hi * self.page_size
        while hi - lo > 1:  # the first hi pages differ somewhere
            mid = (lo + hi) // 2
            if a[lo * pb:mid * pb] == b[lo * pb:mid * pb]:
                lo = mid
            else:
                hi = mid
        return lo * self.page_size

    def _walk(self, key: bytes, node: PrefixNode, pos: int, split: bool, now: float | None = None, hit: bool = False,
              layout=None, path: list | None = None, end: int | None = None) -> Any:
        """The descent along ``key`` from ``node`` (which ends at byte ``pos`` of ``key``).

        ``split``: split a partly matched child at the match and go on into its upper part, or stop above it
        (peeks). ``now``: stamp every node entered with this access time and, with ``hit``, count a hit; None
        leaves nodes untouched. ``layout``: the prompt's segments, for a split's ownership. ``path``: a list
        to which the (position, end depth) of every child entered is appended, a partly matched one included.
        ``end``: walk ``key[:end]`` (None: all of it) without copying it (an engine's prompt less its last token,
        or its part computed so far: tens of kilobytes on Mooncake).

        Returns the last node matched whole, its end in bytes of ``key``, and the partly matched child where a
        peek stopped (None if the walk ended at a node boundary)."""
        pb, n = self._pb, len(key) if end is None else end
        while pos + pb <= n:  # a child is keyed by a whole page
            child = node.children.get(key[pos:pos + pb])
            if child is None:
                break
            if path is not None:
                path.append((child.position, child.depth))
            ck = child.key
            if not key.startswith(ck, pos, n):
                if not split:
                    return node, pos, child
                if now is not None and self.stamps_split_child:
                    child.last_access_time = now
                child = cast(PrefixNode, self._split(child, self._lcp(ck, key[pos:min(pos + len(ck), n)]), layout))
                ck = child.key
            if now is not None:
                child.last_access_time = now
                if hit:
                    child.hit_count += 1
            pos += len(ck)
            node = child
        return node, pos, None

    def _split(self, child, m: int, layout):
        """Split ``child`` after ``m`` tokens; return the new upper node."""
        raise NotImplementedError

    def match_len(self, key: bytes) -> int:
        """Tokens of ``key`` the tree holds: a peek that changes nothing (for schedulers and routers)."""
        _, pos, partial = self._walk(key, self.root, 0, False)
        if partial is not None:
            ck = partial.key
            return pos // TOKEN_BYTES + self._lcp(ck, key[pos:pos + len(ck)])
        return pos // TOKEN_BYTES

    def peek(self, key: bytes) -> tuple[int, tuple]:
        """:meth:`match_len` and where the walk stopped: (the last node matched whole, the key's next page there
        (None at the key's end), the child in that slot matched in part or None). A match can change only
        through that slot or by that node's eviction (:mod:`prism.policies.match_memo`)."""
        node, pos, partial = self._walk(key, self.root, 0, False)
        m = pos // TOKEN_BYTES
        if partial is not None:
            ck = partial.key
            m += self._lcp(ck, key[pos:pos + len(ck)])
        return m, (node, key[pos:pos + self._pb] if pos < len(key) else None, partial)

    #: whether the tree logs its changes for :meth:`log_changes` (the simulator's cache does)
    logs_changes: ClassVar[bool] = False

    def log_changes(self) -> list:
        """A list the tree appends its changes to from now on: (node, page) for each child slot of a node that
        gains, loses or replaces a child, (node, None) for each node evicted."""
        raise TypeError(f"{type(self).__name__} does not log its changes")

    def stop_logging(self, log: list) -> None:
        """Stop appending to ``log``."""

    def match_path(self, key: bytes) -> list[tuple[int, int]]:
        """(position, end depth) of the nodes the held part of ``key`` runs through, a partly matched node
        included (:meth:`match_len` tells where in it the match ends): a peek too."""
        path: list[tuple[int, int]] = []
        self._walk(key, self.root, 0, False, path=path)
        return path


__all__ = ["PrefixNode", "PrefixTree"]
