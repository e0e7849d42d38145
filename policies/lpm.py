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
from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest

TOKEN_BYTES = 4


@dataclass
class LPMConfig:
    fcfs_threshold: int = nonneg(128, "past this many waiting requests, skip matching (keep queue order)")
    check_threshold: int = nonneg(32, "in-batch check for requests with at most this many cached tokens")
    deprioritize_threshold: int = nonneg(32, "defer a request sharing this many tokens with an earlier one")


class LPM(Scheduler):
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

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if len(waiting) > self.config.fcfs_threshold:
            return Plan(list(waiting))
        cache = ctx.cache
        matched = {r.id: cache.match_len(r.key) for r in waiting}
        deferred = self._deprioritized(waiting, matched)
        inf = float("inf")
        return Plan(sorted(waiting, key=lambda r: inf if r.id in deferred else -matched[r.id]))


class DFSWeight(LPM):
    """SGLang's DFS-weight: group requests by the cache node their match ends at, weight each node by the
    requests below it, and emit a depth-first walk that enters heavier children first
    and emits a node's own requests after its subtree."""

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if len(waiting) > self.config.fcfs_threshold:
            return Plan(list(waiting))
        at_node: dict[int, list] = defaultdict(list)
        children: dict[int, set[int]] = defaultdict(set)
        weight: dict[int, int] = defaultdict(int)
        for r in waiting:
            path = ctx.cache.match_path(r.key)
            last = path[-1] if path else 0
            at_node[last].append(r)
            parent = 0
            weight[0] += 1
            for nid in path:
                children[parent].add(nid)
                weight[nid] += 1
                parent = nid
        order: list = []

        def visit(nid: int) -> None:  # SGLang's order: heavier children first, then the node's own requests
            for child in sorted(children.get(nid, ()), key=lambda c: (-weight[c], c)):
                visit(child)
            order.extend(at_node.get(nid, ()))

        visit(0)
        return Plan(order)
