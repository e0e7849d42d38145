"""Cached prefix matches of waiting requests, kept current between scheduling rounds from the tree's changes.

A scheduler that ranks its whole queue by cached prefix every round (k-LPM) would walk the tree once per
waiting request per round: past the knee, thousands of walks a round for matches that mostly did not change.
A peek (:meth:`~prism.policies.prefix_tree.PrefixTree.peek`) stops at a node, either at the key's end, or at
the *slot* of the key's next page among that node's children: empty there, or holding a child that the key
then leaves (matched in part). The match can grow only through that slot (a new child there, or its child
replaced by a split's upper part) and shrink only when the node it stops at, or the child in the slot, is
evicted (only leaves are: the nodes above are held by them). A tree that logs its changes
(:meth:`~prism.policies.prefix_tree.PrefixTree.log_changes`: each slot that gains, loses or replaces a child,
each evicted node) lets the memo walk again, each round, only the requests watching a changed slot or node:
the matches are those of fresh peeks, at a cost per round of the changes, not of the queue.
"""

from __future__ import annotations

from typing import Iterable

_EVICTED = None  # the page of a log entry that says the node itself was evicted


class MatchMemo:
    """Matched tokens of the requests it was asked about, against one tree (``index``), kept current."""

    def __init__(self, index) -> None:
        self.index = index
        self._log = index.log_changes()  # the tree appends (node, page) entries
        self.hits: dict[int, int] = {}  # request id -> tokens matched
        self._keys: dict[int, bytes] = {}
        self._watchers: dict[tuple, set[int]] = {}  # (node, page) or (node, _EVICTED) -> request ids
        self._watching: dict[int, tuple] = {}  # request id -> what it watches (dropped when it is forgotten)

    def add(self, rid: int, key: bytes) -> int:
        """Peek request ``rid``'s prompt ``key`` and keep its match current; returns it."""
        m, (node, page, _) = self.index.peek(key)
        self.hits[rid] = m
        self._keys[rid] = key
        self._unwatch(rid)
        watched = ((node, page),) if page is not None else ()
        if node is not self.index.root:
            watched += ((node, _EVICTED),)
        for w in watched:
            self._watchers.setdefault(w, set()).add(rid)
        self._watching[rid] = watched
        return m

    def _unwatch(self, rid: int) -> None:
        watchers = self._watchers
        for w in self._watching.pop(rid, ()):
            rids = watchers.get(w)
            if rids is not None:
                rids.discard(rid)
                if not rids:
                    del watchers[w]

    def forget(self, rids: Iterable[int]) -> None:
        """Stop keeping these requests' matches (and their watches: the memo holds only what it keeps)."""
        for rid in rids:
            self.hits.pop(rid, None)
            self._keys.pop(rid, None)
            self._unwatch(rid)

    def refresh(self) -> dict[int, int]:
        """Bring the kept matches up to the tree's changes since the last call: {request id: old match} of
        those whose match changed."""
        log, watch = self._log, self._watchers
        if not log:
            return {}
        dirty: set[int] = set()
        for entry in log:
            rids = watch.pop(entry, None)
            if rids:
                dirty |= rids
        log.clear()
        changed = {}
        hits, keys = self.hits, self._keys
        for rid in dirty:
            key = keys.get(rid)
            if key is None:  # forgotten since
                continue
            old = hits[rid]
            if self.add(rid, key) != old:
                changed[rid] = old
        return changed

    def close(self) -> None:
        """The tree stops logging for this memo."""
        self.index.stop_logging(self._log)

    def __len__(self) -> int:
        return len(self.hits)

    def watches(self) -> int:
        """Watches held (one or two per kept request; for tests)."""
        return sum(map(len, self._watchers.values()))
