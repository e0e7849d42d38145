"""Cached prefix matches of waiting requests, kept between scheduling rounds.

A scheduler that ranks its whole queue by cached prefix every round (k-LPM) would walk the tree once per
waiting request per round: past the knee, thousands of walks a round for matches that mostly did not change.
the index's witness of it (:meth:`~prism.policies.prefix_tree
.PrefixTree.peek`) and walks again only where the witness says the tree changed under it (an insert, split or
eviction at the node the match stopped in) or the request's prompt changed (a new key object: realigned,
retracted). Matches are the same as fresh peeks, round after round; an index without witnesses is peeked
every time.
"""

from __future__ import annotations

from typing import Iterable


class MatchMemo:
    """Request id -> (key, index, matched tokens, witness) of its last peek."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple] = {}

    def match_len(self, index, rid: int, key: bytes) -> int:
        """Tokens of ``key`` (request ``rid``'s prompt) that ``index`` holds, as ``index.match_len(key)``."""
        e = self._entries.get(rid)
        if e is not None and e[0] is key and e[1] is index and index.still_matches(e[3]):
            return e[2]
        peek = getattr(index, "peek", None)
        if peek is None:
            return index.match_len(key)
        m, witness = peek(key)
        if witness is not None:
            self._entries[rid] = (key, index, m, witness)
        return m

    def forget(self, rids: Iterable[int]) -> None:
        """Drop what is kept of these requests (admitted: they leave the queue)."""
        pop = self._entries.pop
        for rid in rids:
            pop(rid, None)

    def __len__(self) -> int:
        return len(self._entries)
