"""SGLang's cache-aware orderings: longest prefix match (LPM) and DFS-weight.

Faithful to SGLang's ``SchedulePolicy.calc_priority``:

* past ``fcfs_threshold`` (128) waiting requests the prefix matching is skipped and the queue keeps its
  current order (SGLang then behaves as FCFS on a queue that earlier rounds left sorted);
* the in-batch prefix check: a request with at most ``check_threshold`` (32) cached tokens whose first
  ``deprioritize_threshold`` (32) tokens equal those of an earlier such request is moved to the back, since
  admitting the earlier one first will make its prefix cached (sharing >= 32 tokens with an earlier request
  is exactly equality of the first 32 tokens, so a set of those prefixes replaces SGLang's temporary tree);
* LPM sorts stably by matched length, longest first; DFS-weight walks the tree of matched prefixes, heavier
  subtrees first.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from prism.config import nonneg
from prism.core import TOKEN_BYTES
from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest


@dataclass
class LPMConfig:
    fcfs_threshold: int = nonneg(128, "past this many waiting requests, skip matching (keep queue order)")
    check_threshold: int = nonneg(32, "in-batch check for requests with at most this many cached tokens")
    deprioritize_threshold: int = nonneg(32, "defer a request sharing this many tokens with an earlier one")


class LPM(Scheduler):
    name = "lpm"
    Knobs = LPMConfig

    def __init__(self, config: LPMConfig | None = None) -> None:
        self.config = config or LPMConfig()

    def _deprioritized(self, waiting: Sequence[WaitingRequest], matched: dict[int, int]) -> set[int]:
        cfg = self.config
        nbytes = cfg.deprioritize_threshold * TOKEN_BYTES
        seen: set[bytes] = set()
        out: set[int] = set()
        for r in waiting:
            if matched[r.id] <= cfg.check_threshold and r.prompt_len >= cfg.deprioritize_threshold:
                head = r.key[:nbytes]
                if head in seen:
                    out.add(r.id)
                else:
                    seen.add(head)
        return out

    def keeps_order(self, n_waiting: int) -> bool:
        """Whether a queue of ``n_waiting`` requests keeps its own order: past ``fcfs_threshold`` (unmatched), and
        a queue of one, which any order leaves as it is (most rounds below the knee: matching its request here
        would only repeat the walk its admission makes)."""
        return n_waiting > self.config.fcfs_threshold or n_waiting < 2

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if self.keeps_order(len(waiting)):
            return Plan(waiting if isinstance(waiting, list) else list(waiting))  # the queue itself: no copy
        cache = ctx.cache
        matched = {r.id: cache.match_len(r.key) for r in waiting}
        deferred = self._deprioritized(waiting, matched)
        # SGLang sorts by the usable prefix (the last prompt token is always computed), deferred ones last
        usable = {r.id: float("inf") if r.id in deferred else -min(matched[r.id], r.prompt_len - 1) for r in waiting}
        return Plan(sorted(waiting, key=lambda r: usable[r.id]))


class DFSWeight(LPM):
    """SGLang's DFS-weight: group requests by the place in the cache tree where their match ends, weight each
    place by the requests at or below it, and emit a depth-first walk that enters heavier children first
    (ties: the older child) and emits a place's own requests after its subtree.

    SGLang's match splits a partly matched node, so a match that ends inside a node ends at a place of its
    own, above the node's remainder. Matching here is a peek, so a place is (the cache node's position, depth):
    the node itself at its end depth, or a split point inside it."""

    name = "dfs_weight"
    section = "lpm"  # LPM's knobs

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if self.keeps_order(len(waiting)):
            return Plan(waiting if isinstance(waiting, list) else list(waiting))  # the queue itself: no copy
        root = (0, 0)
        ends = []  # per request: the matched path and length
        cuts: dict[int, set[int]] = defaultdict(set)  # node position -> depths where a match ends inside it
        for r in waiting:
            path, m = ctx.cache.match_path(r.key), ctx.cache.match_len(r.key)
            if path and m <= (path[-2][1] if len(path) > 1 else 0):
                path.pop()  # matched none of the last node (a partial page)
            if path and m < path[-1][1]:
                cuts[path[-1][0]].add(m)
            ends.append((path, m))
        cut_lists = {nid: sorted(ds) for nid, ds in cuts.items()}
        at_place: dict[tuple, list] = defaultdict(list)
        children: dict[tuple, set[tuple]] = defaultdict(set)
        weight: dict[tuple, int] = defaultdict(int)
        for r, (path, m) in zip(waiting, ends):
            parent = root
            for nid, depth in path:
                chain = [(nid, d) for d in cut_lists.get(nid, ()) if d <= m]  # the split points it reaches
                if m >= depth:
                    chain.append((nid, depth))  # and the node itself, when the match runs to its end
                for place in chain:
                    children[parent].add(place)
                    weight[place] += 1
                    parent = place
            at_place[parent].append(r)
        order: list = []
        _visit(root, children, weight, at_place, order)
        return Plan(order)


def _visit(place: tuple, children: dict, weight: dict, at_place: dict, order: list) -> None:
    """SGLang's order below ``place``: heavier children first (ties: the older), then the place's own requests.

    A function of its own, not a closure over itself: that would be a reference cycle per round, which a
    simulation, its cyclic collector paused (``sim/run.py``), would keep until the run ends."""
    for child in sorted(children.get(place, ()), key=lambda c: (-weight[c], c)):
        _visit(child, children, weight, at_place, order)
    order.extend(at_place.get(place, ()))
