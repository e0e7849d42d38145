"""DART, the demand-aware radix tree's eviction order (DESIGN §3).

The cache places *anchors* at every segment boundary (after the system prompt, after each reusable segment,
after the private suffix), so each node belongs to one segment. Among unlocked leaves, DART evicts:

1. private-suffix nodes (and generated tokens), least recently used first: ``(0, last)``;
2. reusable nodes outside the protection set, lowest published priority P̂ first, then LRU:
   ``(1, P̂(seg), last)``;
3. protected anchors last, LRU among them: ``(2, last)``.

The system prompt counts as a reusable segment with id ``sys``. The protection set F holds the top-``f``
resident reusable segments by P̂ (all of a protected segment's anchors are protected). P̂ comes from QAS
through :class:`~prism.policies.base.DemandHints`; with no published hints DART's key is LRU's. Its run is not
SGLang's LRU run: DART asks for a tree cut at every segment boundary (``needs_anchors``), so an eviction takes a
segment's node where SGLang's takes a whole unshared tail (zipf, 1,024 requests, a 32,768-token pool, FCFS: hit
rate 0.2886 against 0.2883); the ablation's "DART altogether" runs SGLang's ``lru``, uncut.

Default ``f = 32``: on the paper's RAG workload the hot set has 20 passages and the system prompt makes 21
segments that QAS keeps in demand; 32 leaves room for the most demanded cold passages of the next batch
while staying a small fraction of a cache that holds hundreds of segments.

What F can change (measured with ``benchmarks/dart_protection.py``). F holds the top-f segments by the same
P̂ that orders the unprotected reusable tier, so protecting them moves nothing before the pass has taken
every private node and every less demanded reusable node; then it evicts the protected ones by age instead
of by P̂. And F's first member is the system prompt (P̂ is led by w_a·a(r), and every running request holds
it), whose node is locked whenever anything runs, so ``f = 1`` protects nothing that could go: ``f = 0`` and
``f = 1`` are the same run. On the shipped traces with the GPU-sized pool (zipf at 60 and 80 QPS,
zipf-shuffled, multihop at 60, agent at 20) no pass reaches the protected tier at any f (0 protected tokens
evicted, 0-32 byte-identical), although at f = 32 about 300 protected leaves (RAG traces) are candidates at
each pass; on a 32k-token pool (zipf, 60 QPS) passes do: f = 4 evicts 6,272 protected tokens and f = 32
208,256, and the runs differ (hit 0.4111, 0.4108, 0.4089; P99 17.17, 17.18, 17.30 s).
"""

from __future__ import annotations

from dataclasses import dataclass

from prism.config import nonneg
from prism.core import PRIV

from prism.policies.base import DemandHints, EvictionPolicy, NodeView, Part, ResidentIndex


@dataclass
class DARTConfig:
    f: int = nonneg(32, "protection set size: top-f resident reusable segments by published priority (the system "
                        "prompt, held by every running request, is the first)")


class DART(EvictionPolicy):
    name = "dart"
    Knobs = DARTConfig
    needs_anchors = True
    parts = (
        Part("dart_protection", "DART's protection set F (the top-f segments by P-hat evicted last)",
             {"dart": {"f": 0}}),
        Part("dart", "DART altogether (SGLang's LRU instead)", replaced="lru"),
    )

    @classmethod
    def base(cls, knobs: DARTConfig) -> str:
        return "lru"  # SGLang's own eviction, which DART reduces to without hints

    def __init__(self, config: DARTConfig | None = None, hints: DemandHints | None = None) -> None:
        super().__init__(hints)
        self.config = config or DARTConfig()
        self.protected: frozenset[str] = frozenset()
        self._version = -1  # P̂'s version when F was last ranked
        self._floor = 0.0  # the lowest P̂ in F then
        self._hinted = False  # whether QAS has published priorities (else: plain LRU)
        self._keyed: tuple[bool, frozenset[str]] | None = None  # (_hinted, protected) at the last pass

    def prepare(self, cache: ResidentIndex) -> None:
        """F = the top-f resident segments by P̂, ties to the segment resident longest; ranked again when P̂ is
        published, a member leaves, or a segment that may outrank a member becomes resident (the segments a
        dispatch gave the batch's term become resident only when its prefill ends)."""
        prio, f = self.hints.priority, self.config.f
        self._hinted = self.hints.version > 0 and len(prio) > 0
        resident = cache.resident
        joined = resident.take_joined()
        if not self._hinted or f == 0:
            self.protected = frozenset()
            return
        if (self._version == self.hints.version and resident.keys() >= self.protected and joined is not None
                and not self._may_enter(joined, resident)):
            return
        self._version = self.hints.version
        # the cache holds far fewer segments than QAS ranks: rank the resident ones, by P̂ descending, ties in
        # the order they became resident (a stable sort of the cache's own order: it follows the prompts, not the
        # segments' names, so a renamed trace, an imported one say, is served alike)
        ranked = sorted([s for s in resident if s in prio], key=prio.__getitem__, reverse=True)
        top = [s for s in ranked[:f] if prio[s] > 0]
        self.protected = frozenset(top)
        self._floor = prio[top[-1]] if len(top) == f else 0.0

    def _may_enter(self, joined: list[str], resident) -> bool:
        """Whether a segment made resident since F was ranked could be in it: a positive P̂ at least F's lowest
        (equal: the tie is the ranking's to break), or any positive one while F has room."""
        prio, floor = self.hints.priority, self._floor
        return any(prio.get(s, 0.0) > 0 and prio[s] >= floor and s in resident for s in joined)

    def key(self, node: NodeView) -> tuple:
        if not self._hinted:  # no hints: plain LRU
            return (node.last_access_time,)
        if node.kind == PRIV:
            return (0, node.last_access_time)
        if node.seg_id in self.protected:
            return (2, node.last_access_time)
        return (1, self.hints.priority.get(node.seg_id, 0.0), node.last_access_time)

    def lowered_keys(self) -> set[str] | None:
        """Segments outside F whose P̂ fell (as QAS reports it), and those that left F, since the last pass;
        None when the key's form changed (hints appeared or vanished) or QAS did not say what fell. Access
        times only grow, entering F only raises a key, and a protected node's key does not read P̂."""
        fell = self.hints.take_fell()
        keyed, self._keyed = self._keyed, (self._hinted, self.protected)
        if keyed is None or keyed[0] != self._hinted:
            return None
        if not self._hinted:
            return set()  # plain LRU
        if fell is None:
            return None
        return (fell - self.protected) | (keyed[1] - self.protected)

    def tier(self, node: NodeView) -> str:
        if node.kind == PRIV:
            return "private"
        return "protected" if node.seg_id in self.protected else "reusable"
