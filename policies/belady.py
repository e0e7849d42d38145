"""A Belady-style offline reference for eviction: evict the leaf whose next use lies furthest ahead.

It knows the whole trace. A node is *used* by a future request when the request's prompt runs through it,
i.e. when the segment path from the root to the node's owner segment is a prefix of the request's segment
sequence. Future requests are those not admitted yet, taken in arrival order; a node no future request uses
is evicted first (LRU among those).

With unit-size segments and a fixed admission order this is the classic furthest-in-future rule, the best any
eviction policy can do at the same capacity; with variable sizes, or with schedulers that realign prompts at
admission (the oracle sees the trace's own segment order), it is a reference ceiling rather than a bound.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from prism.core import PRIV, Request

from prism.policies.base import EvictionPolicy, NodeView, WaitingRequest


class Belady(EvictionPolicy):
    name = "belady"
    needs_anchors = True
    offline = True

    @classmethod
    def build(cls, knobs, hints, requests) -> "Belady":
        return cls(requests)  # the oracle reads the whole trace; the registry hands it the run's hints

    def __init__(self, requests: Sequence[Request]) -> None:
        super().__init__()
        order = sorted(requests, key=lambda r: (r.arrival, r.id))
        self.position = {r.id: i for i, r in enumerate(order)}
        self.uses: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i, r in enumerate(order):
            path: tuple[str, ...] = ()
            for s in r.segments:
                path += (s.id,)
                self.uses[path].append(i)
        self._ptr: dict[tuple[str, ...], int] = {}
        self.admitted: set[int] = set()
        self._fell: set[str] = set()  # sys/reusable segments of the requests admitted since the last pass

    def on_admit(self, request: WaitingRequest) -> None:
        self.admitted.add(self.position.get(request.id, -1))
        # a private suffix's node is made after its request's admission, so its key never falls afterwards
        self._fell.update(s.id for s in request.segments if s.kind != PRIV)

    def next_use(self, path: tuple[str, ...]) -> float:
        uses = self.uses.get(path)
        if not uses:
            return float("inf")
        i = self._ptr.get(path, 0)
        while i < len(uses) and uses[i] in self.admitted:
            i += 1
        self._ptr[path] = i
        return float(uses[i]) if i < len(uses) else float("inf")

    @staticmethod
    def path_of(node) -> tuple[str, ...]:
        """Segment ids from the root to the node's owner (consecutive duplicates merged)."""
        ids = []
        while node is not None and node.parent is not None:
            if not ids or ids[-1] != node.seg_id:
                ids.append(node.seg_id)
            node = node.parent
        return tuple(reversed(ids))

    def key(self, node: NodeView) -> tuple:
        return (-self.next_use(self.path_of(node)), node.last_access_time)

    def lowered_keys(self) -> set[str]:
        """The sys/reusable segments of the requests admitted since the last pass. A key falls only when a path's
        next use moves on, i.e. when the request at that use is admitted; that request's trace-order prefix is the
        path, so the path's last segment, which owns the node, is one of the request's (whatever order it was
        realigned into). Access times only grow."""
        fell, self._fell = self._fell, set()
        return fell
