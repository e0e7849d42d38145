"""ContextPilot's online path (Jiang et al., MLSys 2026; ``EfficientContext/ContextPilot`` at 1fa0a143): a layer
in front of an unmodified engine that reorders each request's retrieved documents against its live context
index of the requests it has sent (:mod:`prism.policies.context_tree`), then lets the engine schedule its
queue as it always does.

What the code says about scheduling (paths under ``contextpilot/``):

* ContextPilot reorders requests one at a time: its proxy sends each request's documents as one context
  (``server/http_server.py:1379-1413``, "All docs = one context") through ``build_incremental``, and forwards
  the request at once. Its orderings of *several* requests (``_schedule_incremental``,
  ``server/live_index.py:820-851``: grouped by the first branch of the search path, longer paths first;
  ``InterContextScheduler``, ``context_ordering/inter_scheduler.py:29-72``, which sorts groups by size) order
  the contexts of one ``/reorder`` call, a batch a client hands over at once; per-request traffic never makes
  one. Nothing reorders a request once it is sent, and the code has no aging or fairness rule: the engine's
  own scheduler orders its queue.
* ContextPilot's own instructions start SGLang with ``--schedule-policy lpm``
  (``docs/getting_started/quickstart.md:167``, ``examples/README.md:43``), so the engine's order here is
  SGLang's LPM (:mod:`prism.policies.lpm`, the ``sglang`` method's) over the prompts as ContextPilot sent them;
  ``engine_order: fcfs`` is SGLang 0.5.23's default policy instead.
* The engine reports evictions back (``_sglang_hook.py:142-171``: a radix node tagged with a request is
  deleted) and the index drops that request (``live_index.py:1055-1085``). A policy sees no evictions here, so
  a request counts as evicted once it has been admitted, is neither waiting nor running, and its prompt is no
  longer wholly in the cache; one never admitted, once it no longer waits (aborted). That is a peek, done for
  the leaves a search is about to use (removing the others later changes no search); ContextPilot's hook fires
  a little earlier, when the request's first node goes (its generated tokens, usually). Leaves no search
  reaches are peeked all at once when the requests seen have doubled since the last such prune
  (``PRUNE_SLACK``), else a server's index would grow with its history; that changes no search either, unless
  another request caches the very same prompt again in between. The live engine shows no running requests to
  a policy, so there a request whose prompt is still being prefilled in chunks can be dropped early (and, by a
  prune, forgotten: indexed again should it be retracted).

Prompts marked ``fixed_order`` (agent history, Mooncake blocks) and prompts that repeat a document are indexed
in their own order and never moved. This replaces an earlier reading (a tree rebuilt by hierarchical
clustering every 128 requests, and the engine's whole queue re-sorted by search-path groups every round, longer
paths first), which starved requests with short paths: P99 TTFT 36 s at 80 QPS on the README's trace.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from prism.config import choice, nonneg
from prism.core import REUSE, TOKEN_BYTES, SegmentedPrompt, realigned, serialize_bytes
from prism.counters import CONTEXTPILOT_EVICTED, CONTEXTPILOT_REORDERED, CONTEXTPILOT_SPLITS

from prism.policies.base import Part, Plan, SchedContext, Scheduler, WaitingRequest
from prism.policies.context_tree import ContextIndex, Node
from prism.policies.expected_queue import ExpectedQueue
from prism.policies.fcfs import FCFS
from prism.policies.lpm import LPM


@dataclass
class ContextPilotConfig:
    position_weight: float = nonneg(0.001, "ContextPilot's alpha: weight of the mean position gap in the distance "
                                    "(at most 1e6: far above, a distance overflows the float32 its search compares)",
                                    le=1e6)
    engine_order: str = choice("lpm", ("lpm", "fcfs"), "the engine's own queue order behind ContextPilot: lpm "
                               "(its docs run SGLang with --schedule-policy lpm) or fcfs (SGLang 0.5.23's default)")
    reorder: bool = dataclasses.field(default=True, metadata={
        "doc": "reorder each request's documents against the index (false: the engine's order alone)"})


class _Sent(SegmentedPrompt):
    """A request as ContextPilot sent it: what the engine's LPM reads of it (id, serialized prompt, length),
    in its new document order. A leaf of the index owns the request's ``_Sent``: once the engine admitted it,
    only its id and key (is its prompt still cached?), not the request (a live server's holds SGLang's). Its
    prompt is serialized when first read, and once admitted it takes the engine's own: of the 16,600 moved
    prompts of a zipf run of 20,480 requests, LPM read 700 while they waited (before a queue of one went unread);
    the index reads most after."""

    __slots__ = ("id", "prompt_len", "request", "admitted")

    def __init__(self, request: WaitingRequest) -> None:
        self.id, self.prompt_len, self.request = request.id, request.prompt_len, request
        self.admitted = False  # then its prompt may be cached, and evicted
        self.set_segments(request.segments)  # until it moves

    def admit(self, request: WaitingRequest) -> None:
        """The engine admitted it: keep its key (the engine's own where it serves the request in the order
        sent), and neither the request nor its segments (a live request's hold its tokens)."""
        if self._key is None:
            self._key = request.key if request.segments == self.segments else serialize_bytes(self.segments)
        self.segments, self.admitted, self.request = (), True, None


class ContextPilot(Scheduler):
    """ContextPilot in front of the engine's own scheduler (module docstring): each request is indexed and
    reordered once, the first round it waits in; every round the engine's order runs on the prompts as sent (an
    order that keeps the queue's, FCFS, or LPM past its threshold or on a queue of one, reads none: the queue
    itself)."""

    name = "contextpilot"
    Knobs = ContextPilotConfig
    parts = (
        Part("reorder", "its reordering of each request's documents against its context index",
             {"contextpilot": {"reorder": False}}),
        Part("engine_order", "its engine order, SGLang's LPM as its docs run it (off: FCFS, SGLang's default)",
             {"contextpilot": {"engine_order": "fcfs"}}),
    )

    @classmethod
    def base(cls, knobs: ContextPilotConfig) -> str:
        """The engine ContextPilot sits in front of: its engine order's scheduler (``lpm`` or ``fcfs``)."""
        return knobs.engine_order

    #: the index drops its dead leaves once the requests it has seen are more than twice those the last prune
    #: kept plus this many (``_prune``): a search drops only those it meets, so a server's index grew with its
    #: history
    PRUNE_SLACK = 4096

    def __init__(self, config: ContextPilotConfig | None = None) -> None:
        self.config = config or ContextPilotConfig()
        self.index = ContextIndex(self.config.position_weight)
        self.engine: LPM | FCFS = LPM() if self.config.engine_order == "lpm" else FCFS()
        self._seen: set[int] = set()  # requests indexed
        self._sent: dict[int, _Sent] = {}  # waiting request id -> as sent
        self.align: dict[int, tuple[str, ...]] = {}  # waiting request id -> its new document order (moved ones)
        self._kept = 0  # requests remembered as sent after the last prune
        self._queue = ExpectedQueue()  # the queue of the last round, less what the engine took: all indexed
        self.reordered = 0

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if not self.config.reorder:
            return self.engine.plan(waiting, ctx)
        joined = self._queue.joined(waiting, ctx.kept)  # past the knee: a queue of thousands, a few new
        new = [r for r in (waiting if joined is None else joined) if r.id not in self._seen]
        if new:
            alive = self._alive(waiting, ctx)
            if len(self._seen) > 2 * self._kept + self.PRUNE_SLACK:  # each leaf is a request it has seen
                self._prune(waiting, alive)
            for r in new:
                self._send(r, alive)
        if self.engine.keeps_order(len(waiting)):
            # FCFS, or LPM past its threshold or on one request, reads no prompt: the queue itself, whose admitted
            # head an engine then drops in place, instead of a copy of the backlog as sent (3% of a zipf run of 20,480)
            order = waiting if isinstance(waiting, list) else list(waiting)
            self._queue.expect(order)
            return Plan(order, self.align)
        sent = self._sent
        as_sent = [sent.get(r.id) or sent.setdefault(r.id, _Sent(r)) for r in waiting]  # a retracted one
        order = [s.request for s in self.engine.plan(as_sent, ctx).order]
        self._queue.expect(order)
        return Plan(order, self.align)

    def _prune(self, waiting: Sequence[WaitingRequest], alive) -> None:
        """Drop the dead leaves, and forget the requests that can no longer come back to the queue: those neither
        waiting nor in a live leaf (a running request without documents has none: sent again if retracted,
        it has nothing to index), and those sent but gone unadmitted (a live server's aborted requests)."""
        live = self.index.prune(alive)
        queued = {r.id for r in waiting}
        self._sent = {i: s for i, s in self._sent.items() if i in queued}
        self.align = {i: a for i, a in self.align.items() if i in queued}
        self._seen = {n.owner.id for n in live} | queued
        self._kept = len(self._seen)

    def _send(self, r: WaitingRequest, alive) -> None:
        """Index the request and put its documents in their new order (ContextPilot's proxy, one context)."""
        self._seen.add(r.id)
        docs = tuple(s.id for s in r.segments if s.kind == REUSE)
        sent = self._sent[r.id] = _Sent(r)
        if docs:
            movable = not r.fixed_order and len(set(docs)) == len(docs)
            new, _ = self.index.insert(docs, sent, alive, reorder=movable)
            if new != docs:
                sent.set_segments(realigned(r.segments, new, r.id))
                self.align[r.id] = new
                self.reordered += 1

    def _alive(self, waiting: Sequence[WaitingRequest], ctx: SchedContext):
        """``alive(leaf)`` for this round: whether the leaf's request may still be in the engine's cache: it waits
        or runs, or the engine admitted it and still caches its whole prompt (one never admitted and no longer
        waiting was aborted)."""
        busy: set[int] | None = None
        cache = ctx.cache

        def alive(leaf: Node) -> bool:
            nonlocal busy
            sent: _Sent = leaf.owner
            if busy is None:
                busy = {r.id for r in waiting}
                busy.update(r.id for r in ctx.running)
            if sent.id in busy:
                return True
            return sent.admitted and cache.match_len(sent.key) * TOKEN_BYTES >= len(sent.key)

        return alive

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        self._queue.dispatched(admitted, ctx.kept)
        for r in admitted:
            sent = self._sent.pop(r.id, None)
            if sent is not None:
                sent.admit(r)
            self.align.pop(r.id, None)

    def stats(self) -> dict[str, int]:
        return {CONTEXTPILOT_REORDERED: self.reordered, CONTEXTPILOT_SPLITS: self.index.splits,
                CONTEXTPILOT_EVICTED: self.index.removed}
