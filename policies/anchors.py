"""Which segment owns which tokens of a radix KV cache, and where DART's anchors cut new nodes.

Both the simulator's radix cache and SGLang's tree (a ``RadixCache`` subclass in live mode) follow the one
rule written here, so that a node covers the same tokens and belongs to the same segment in either engine.

A prompt's *layout* is ``prism.core.layout(segments)``: ``(end offset, kind, segment id)`` per segment, in
prompt order. The rule:

* **owner**: a node belongs to the segment holding its *last* token, i.e. the first segment that ends at or
  after the node's end offset. Tokens past the prompt (generated output, inserted at finish) belong to the
  last segment, the private suffix (DESIGN §3).
* **anchors**: DART needs each node to belong to one segment, so a new branch is cut at every segment end
  inside it (DESIGN §3: anchors after the system prompt, after each reusable segment, after the private
  suffix). A radix cache only holds whole pages, so a cut lands on the segment end floored to the page size;
  a page that straddles a boundary goes with the segment that holds its last token. Without anchors (plain
  LRU, like SGLang's) a new branch is one node.

A split of an existing node (two prompts diverge inside it) gives the new upper node the owner of its own end
by the same rule. Existing nodes need no anchor pass: a boundary inside one would mean two prompts that agree
on the token where a segment starts, and only that segment's prompts have its first token there (first
tokens are unique, see ``prism.core``); text-tokenized traces are the exception and keep the owner of the
prompt that inserted the node.

Cost: a binary search over the layout per node made (a prompt has a few segments), nothing per token.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from prism.core import PRIV

Layout = Sequence[tuple[int, str, str]]  # (segment end offset, kind, segment id), in prompt order
Piece = tuple[int, str, str]  # (end offset, kind, segment id) of one node


def _holder(layout: Layout, offset: int, lo: int = 0) -> int:
    """Index of the segment holding the token just before ``offset``: the first one ending at or after it, at
    or after index ``lo`` (past the prompt: the last segment)."""
    i = bisect_left(layout, (offset,), lo)
    return i if i < len(layout) else len(layout) - 1


def owner(layout: Layout, offset: int) -> tuple[str, str]:
    """(kind, segment id) of the segment holding the token just before ``offset`` (past the end: the last)."""
    _, kind, seg_id = layout[_holder(layout, offset)]
    return kind, seg_id


def pieces(layout: Layout | None, start: int, end: int, page_size: int, anchors: bool) -> list[Piece]:
    """The new nodes covering tokens [start, end) of a prompt, as (end, kind, segment id) in order.

    With ``anchors``: cut at every segment end floored to ``page_size`` that lies strictly inside
    (start, end), then one last piece to ``end``. Without: one piece. Each piece is owned by the segment
    holding its last token (:func:`owner`). Without a layout: one private piece.
    """
    if not layout:
        return [(end, PRIV, "")]
    out: list[Piece] = []
    n = len(layout)
    i = lo = bisect_left(layout, (start + 1,))  # the first segment ending after start
    if anchors:
        last = start
        for j in range(i, n):
            e = layout[j][0]
            cut = e - e % page_size  # page floors of increasing ends never decrease
            if cut >= end:
                break
            if cut > last:  # held by segment j: an earlier one ending at or after cut would have cut here first
                _, kind, seg = layout[j]
                out.append((cut, kind, seg))
                last, lo = cut, j
    _, kind, seg = layout[_holder(layout, end, lo)]
    out.append((end, kind, seg))
    return out


def split_owner(layout: Layout | None, end: int, lower) -> tuple[str, str]:
    """(kind, segment id) of a split's new upper node, which ends at prompt offset ``end``: by :func:`owner`
    from the layout of the prompt that split it, else that of the node it was cut from (``lower``: an
    insertion without segments keeps what the tree knew)."""
    return owner(layout, end) if layout else (lower.kind, lower.seg_id)


def hand_over(upper, lower, number: int) -> None:
    """Where a split's two parts stand: the new ``upper`` part takes over ``lower``'s position among its
    siblings (so siblings sorted by position keep the order their keys entered the parent: SGLang's child
    order) and is the newer node (creation ``number``); ``lower`` moves to a new position, ``number``."""
    upper.position = lower.position
    upper.created = lower.position = number


class ResidentSegments(dict):
    """Segment id -> resident nodes it owns, over the ``sys`` and reusable segments (what DART ranks; private
    nodes are not counted). A cache calls :meth:`add` for every node it makes and :meth:`remove` for every node
    it drops; a segment with no resident node has no entry. ``joined``: the segments that became resident (a
    first node) since the last :meth:`take_joined`, so that a policy ranking the resident segments knows what
    came; None until a first take (a cache whose policy never asks keeps no record)."""

    def __init__(self) -> None:
        super().__init__()
        self.joined: list[str] | None = None

    def add(self, kind: str, seg_id: str) -> None:
        if kind != PRIV:
            nodes = self.get(seg_id, 0)
            if not nodes and self.joined is not None:
                self.joined.append(seg_id)
            self[seg_id] = nodes + 1

    def take_joined(self) -> list[str] | None:
        """The segments that became resident since the last call (None: unknown, the first call), and start a
        new record. Between two calls a segment joins again only after leaving, so the record holds at most
        the segments that were made resident in between."""
        out, self.joined = self.joined, []
        return out

    def remove(self, kind: str, seg_id: str) -> None:
        if kind != PRIV:
            c = self[seg_id] - 1
            if c:
                self[seg_id] = c
            else:
                del self[seg_id]


__all__ = ["Layout", "Piece", "owner", "pieces", "split_owner", "hand_over", "ResidentSegments"]
