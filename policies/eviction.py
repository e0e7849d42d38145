"""Classic eviction policies, each a sort key over a node (smallest evicted first), as in SGLang's
``mem_cache/evict_policy.py``."""

from __future__ import annotations

from prism.core import REUSE, SYS

from prism.policies.base import EvictionPolicy, NodeView


class LRU(EvictionPolicy):
    """Least recently used leaf first: SGLang's default."""

    def key(self, node: NodeView) -> tuple:
        return (node.last_access_time,)


class LFU(EvictionPolicy):
    """Least often hit first, least recently used among equals."""

    def key(self, node: NodeView) -> tuple:
        return (node.hit_count, node.last_access_time)


class LRUActive(EvictionPolicy):
    """LRU, but nodes of segments that running requests contain (a(r) > 0) go after all others."""

    needs_anchors = True

    def _active(self, node: NodeView) -> bool:
        return node.kind in (REUSE, SYS) and self.hints.active.get(node.seg_id, 0) > 0

    def key(self, node: NodeView) -> tuple:
        return (1 if self._active(node) else 0, node.last_access_time)

    def tier(self, node: NodeView) -> str:
        return "protected" if self._active(node) else super().tier(node)
