"""Several engine instances behind a router, on one SimPy clock.

Each instance (:class:`~prism.sim.instance.Instance`) is one engine as ``sim/engine.py`` models it, with the
read-only view a routing policy reads (``policies/routing.py``). The :class:`RouterProcess` receives the
client's requests. With ``router_delay_s = 0`` each request is routed the moment it arrives; with a delay the
router is a serial server: requests wait in its FIFO queue and each decision takes ``router_delay_s`` (so the
router saturates at 1/delay requests per second), made on the view at the decision's end. The view is exact
(``view_interval_s = 0``) or a snapshot of the instances' load figures refreshed when it is older than
``view_interval_s`` (a router polling its workers); cache peeks always read the instance's current cache.

A cluster of one instance serves exactly as the single engine does: the same requests.csv, byte for byte
(tests/test_cluster.py). Cost over a single engine: per request, the router's own work (N cache peeks for
LMetric, N approximate-tree walks for the cache-aware router) and one admission callback.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import simpy

from prism.policies.routing import Router

from prism.sim.engine import Seq
from prism.sim.instance import Instance


class _Snapshot:
    """An instance's load figures as of the router's last poll; cache peeks go to the live instance."""

    __slots__ = ("index", "running", "queued", "queued_prefill_tokens", "match_len")

    def __init__(self, inst: Instance) -> None:
        self.index, self.running, self.queued = inst.index, inst.running, inst.queued
        self.queued_prefill_tokens = inst.queued_prefill_tokens
        self.match_len = inst.match_len


class RouterProcess:
    """Receives the client's requests and sends each to the instance its routing policy chooses."""

    def __init__(self, env: simpy.Environment, instances: list[Instance], policy: Router, delay_s: float,
                 view_interval_s: float) -> None:
        self.env = env
        self.instances = instances
        self.policy = policy
        self.delay = delay_s
        self.interval = view_interval_s
        self.placed: dict[int, int] = {}  # request id -> instance
        self._snap: list[_Snapshot] = []
        self._snap_time = float("-inf")
        self._queue: deque[Seq] = deque()
        self._wake: simpy.Event | None = None
        if delay_s > 0:
            env.process(self._loop())

    def submit(self, seq: Seq) -> None:
        if self.delay <= 0:
            self._dispatch(seq)
            return
        self._queue.append(seq)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self):
        while True:
            if not self._queue:
                self._wake = self.env.event()
                yield self._wake
                self._wake = None
            yield self.env.timeout(self.delay)
            self._dispatch(self._queue.popleft())

    def views(self) -> Sequence[Any]:
        if self.interval <= 0:
            return self.instances
        now = self.env.now
        if now - self._snap_time >= self.interval:
            self._snap = [_Snapshot(i) for i in self.instances]
            self._snap_time = now
        return self._snap

    def _dispatch(self, seq: Seq) -> None:
        i = self.policy.route(seq, self.views(), self.env.now)
        self.placed[seq.id] = i
        self.instances[i].submit(seq)
