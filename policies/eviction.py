"""Classic eviction policies, each a sort key over a node (smallest evicted first), as in SGLang's
``mem_cache/evict_policy.py``."""

from __future__ import annotations

from prism.core import REUSE, SYS

from prism.policies.base import EvictionPolicy, NodeView


class LRU(EvictionPolicy):
    """Least recently used leaf first: SGLang's default."""

    name = "lru"

    def key(self, node: NodeView) -> tuple:
        return (node.last_access_time,)

    def lowered_keys(self) -> tuple:
        return ()  # access times only grow


class LFU(EvictionPolicy):
    """Least often hit first, least recently used among equals."""

    name = "lfu"

    def key(self, node: NodeView) -> tuple:
        return (node.hit_count, node.last_access_time)

    def lowered_keys(self) -> tuple:
        return ()  # hit counts and access times only grow


class LRUActive(EvictionPolicy):
    """LRU, but nodes of segments that running requests contain (a(r) > 0) go after all others."""

    name = "lru_active"
    needs_anchors = True

    def __init__(self, hints=None) -> None:
        super().__init__(hints)
        self._was_active: set[str] | None = None  # the active segments at the last pass (None: no pass yet)

    def _active(self, node: NodeView) -> bool:
        return node.kind in (REUSE, SYS) and self.hints.active.get(node.seg_id, 0) > 0

    def key(self, node: NodeView) -> tuple:
        return (1 if self._active(node) else 0, node.last_access_time)

    def lowered_keys(self) -> set[str] | None:
        """The segments no longer active since the last pass (their nodes' keys fell from 1 to 0)."""
        now = {r for r, c in self.hints.active.items() if c > 0}
        was, self._was_active = self._was_active, now
        return None if was is None else was - now

    def tier(self, node: NodeView) -> str:
        return "protected" if self._active(node) else super().tier(node)
