"""The client-side dispatcher of a live cluster: N SGLang servers behind one of the project's routing policies.

The routing policies are the simulator's (``policies/``, built through the registry); they see each server
through :class:`~prism.policies.routing.InstanceView`. A live client cannot read a server's scheduler or its
radix cache, so :class:`ClientView` builds that view from what the client itself knows, for each server:

* ``queued``: requests sent there whose first token has not come back yet (waiting in the server's queue
  *or* prefilling: the client cannot tell the two apart);
* ``running``: requests whose first token came back and whose stream has not ended (decoding);
* ``queued_prefill_tokens``: over the ``queued`` requests, each one's uncached prompt tokens as estimated when
  it was routed (prompt length - ``match_len`` there at that moment), as LMetric's P counts them; a request
  leaves this sum at its first token (in the simulator: at admission, a little earlier);
* ``match_len(key)``: **an estimate**: the longest prefix of ``key`` among the prompts the client sent to that
  server (an :class:`~prism.policies.approx_tree.ApproxTree`, sglang-router's own kind of estimate), cut back
  to the server's KV capacity by dropping least recently sent leaves whenever it holds more. The estimate is
  wrong where the server evicted differently (its eviction policy, its running requests' decode tokens, locked
  nodes) and for a prompt whose prefix is in flight but not yet cached; the hit rate in the results is always
  the server's own (``meta_info.cached_tokens``).

A routing decision is made when the request is sent (after any client-side concurrency wait), on the view at
that moment, with ``now`` = the replay's undilated clock (the cache-aware router's eviction interval reads it).
Cost per request: the policy's own (N tree walks for LMetric or the cache-aware router), one insert into the
chosen server's tree, and a least-recently-sent cut (a heap over the tree's leaves) while the tree is over
capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from prism.core import TOKEN_BYTES, TOKEN_DTYPE, Segment
from prism.policies.approx_tree import ApproxTree
from prism.policies.routing import Router

from prism.live.requests import LiveRequest


class ClientView:
    """One server as the client sees it (an :class:`~prism.policies.routing.InstanceView`)."""

    def __init__(self, index: int, capacity_tokens: int) -> None:
        self.index = index
        self.capacity = capacity_tokens
        self.running = 0
        self.queued = 0
        self.queued_prefill_tokens = 0
        self.tree = ApproxTree()
        self._queued: dict[int, int] = {}  # request id -> its uncached-token estimate, until the first token
        self._running: set[int] = set()

    def match_len(self, key: bytes) -> int:
        return self.tree.match_len(key)

    def sent(self, rid: int, key: bytes, now: float) -> int:
        """Request ``rid`` (prompt ``key``) was routed here; returns its uncached-token estimate."""
        if rid in self._queued or rid in self._running:
            raise ValueError(f"request {rid} is already on instance {self.index}")
        est = len(key) // TOKEN_BYTES - self.tree.match_len(key)
        self._queued[rid] = est
        self.queued += 1
        self.queued_prefill_tokens += est
        self.tree.insert(key, now)
        if self.tree.size > self.capacity:
            self.tree.evict_to(self.capacity)
        return est

    def first_token(self, rid: int) -> None:
        """Its first token came back: prefilled, now decoding."""
        est = self._queued.pop(rid, None)
        if est is None:
            return
        self.queued -= 1
        self.queued_prefill_tokens -= est
        self._running.add(rid)
        self.running += 1

    def done(self, rid: int) -> None:
        """Its stream ended (finished, failed or cancelled, with or without a first token)."""
        self.first_token(rid)  # a stream that ended before its first token leaves the queue too
        if rid in self._running:
            self._running.remove(rid)
            self.running -= 1


@dataclass(frozen=True)
class RoutedRequest:
    """A request as a routing policy reads it (:class:`~prism.policies.base.WaitingRequest`); ``key`` is the
    prompt the server receives (in-vocabulary ids), so the trees share exactly what the server's tree shares."""

    id: int
    arrival: float
    segments: tuple[Segment, ...]
    key: bytes
    prompt_len: int
    fixed_order: bool


class Dispatcher:
    """Routes each request of a replay to one of ``urls`` with ``router`` (a :class:`~prism.live.client.Dispatch`).
    ``clock()``: the replay's undilated time in seconds; ``placed``: request id -> instance, for the records."""

    def __init__(self, router: Router, urls: Sequence[str], capacities: Sequence[int],
                 clock: Callable[[], float], segments: Mapping[int, tuple[tuple[Segment, ...], bool]] | None = None
                 ) -> None:
        if len(urls) != len(capacities):
            raise ValueError("one capacity per server")
        self.router = router
        self.urls = [u.rstrip("/") for u in urls]
        self.views = [ClientView(i, c) for i, c in enumerate(capacities)]
        self.clock = clock
        self.segments = segments or {}
        self.placed: dict[int, int] = {}

    def route(self, req: LiveRequest) -> int:
        key = np.asarray(req.input_ids, dtype=TOKEN_DTYPE).tobytes()
        segs, fixed = self.segments.get(req.id, ((), False))
        now = self.clock()
        i = self.router.route(RoutedRequest(req.id, req.arrival, segs, key, len(req.input_ids), fixed),
                              self.views, now)
        self.placed[req.id] = i
        self.views[i].sent(req.id, key, now)
        return i

    def pick(self, req: LiveRequest) -> str:
        return self.urls[self.route(req)]

    def first_token(self, rid: int) -> None:
        self.views[self.placed[rid]].first_token(rid)

    def done(self, rid: int) -> None:
        i = self.placed.get(rid)
        if i is not None:
            self.views[i].done(rid)


__all__ = ["ClientView", "Dispatcher", "RoutedRequest"]
