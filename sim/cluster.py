"""Several engine instances behind a router, on one SimPy clock.

Each :class:`Instance` is one engine as ``sim/engine.py`` models it (its own scheduler, eviction policy and
``DemandHints``, its own radix cache, capacity and cost profile; a QAS front end of its own where the method
deploys one) plus the read-only view a routing policy reads (``policies/routing.py``): running and queued
requests, the uncached prompt tokens of its queued requests, and a peek of its cache. Profiles may differ per
instance (``cluster.profiles``): a heterogeneous cluster.

The :class:`RouterProcess` receives the client's requests. With ``router_delay_s = 0`` each request is routed
the moment it arrives; with a delay the router is a serial server: requests wait in its FIFO queue and each
decision takes ``router_delay_s`` (so the router saturates at 1/delay requests per second), made on the view
at the decision's end. The view is exact (``view_interval_s = 0``) or a snapshot of the instances' load figures
refreshed when it is older than ``view_interval_s`` (a router polling its workers); cache peeks always read
the instance's current cache.

Queued prefill tokens (kept only for a routing policy that reads them: ``Router.reads_queued_prefill``): when
a request is routed, its uncached tokens on the chosen instance are recorded; they leave the instance's queue
when its engine admits the request (the cluster learns admissions through the engine's scheduler, which it
wraps in :class:`_AdmissionProbe`, a pure delegate). A request the engine later puts back in its queue (a
retraction) is not counted again.

A cluster of one instance serves exactly as the single engine (``sim/run.py``) does: the same requests.csv,
byte for byte (tests/test_cluster.py). Cost over a single engine: per request, the router's own work (N cache
peeks for LMetric, N approximate-tree walks for the cache-aware router) and one admission callback.
"""

from __future__ import annotations

from collections import Counter, deque
from functools import partial
from typing import Any, Callable, Sequence

import simpy

from prism.metrics import RequestRecord, instance_summary
from prism.policies.base import Plan, SchedContext, Scheduler, WaitingRequest
from prism.policies.registry import Policies, make_policies, make_router
from prism.policies.routing import Router
from prism.settings import RunSpec, kv_capacity

from prism.sim.client import Client
from prism.sim.engine import Engine, Seq
from prism.sim.frontend import FrontEnd
from prism.sim.run import Replay, SimResult


class _AdmissionProbe(Scheduler):
    """The engine's scheduler, unchanged, that also tells its instance which requests the engine admitted."""

    def __init__(self, inner: Scheduler, on_admitted: Callable[[Sequence[WaitingRequest]], None]) -> None:
        self.inner = inner
        self.on_admitted = on_admitted

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        return self.inner.plan(waiting, ctx)

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        self.on_admitted(admitted)
        self.inner.on_dispatch(admitted, ctx)

    def stats(self) -> dict[str, int]:
        return self.inner.stats()


class Instance:
    """One engine of the cluster and its live view (the :class:`~prism.policies.routing.InstanceView`)."""

    def __init__(self, index: int, env: simpy.Environment, spec: RunSpec, capacity: int,
                 on_finish: Callable[[Seq], None], track_prefill: bool = True) -> None:
        self.index = index
        self.track_prefill = track_prefill
        profile = spec.profile_of(index)
        self.profile = profile.name
        self.capacity = capacity
        self.policies: Policies = make_policies(spec.scheduler, spec.eviction, spec.policy_configs, spec.deployment,
                                                requests=spec.trace.requests)
        scheduler = (_AdmissionProbe(self.policies.scheduler, self._admitted) if track_prefill
                     else self.policies.scheduler)
        self.engine = Engine(env, spec.engine, profile.cost, scheduler, self.policies.eviction, self.capacity,
                             self.policies.hints, on_finish)
        self.front = (FrontEnd(env, self.engine, self.policies.front_end, spec.deployment.window_s)
                      if self.policies.front_end is not None else None)
        self.entry = self.front or self.engine
        self.queued_prefill_tokens = 0
        self._estimate: dict[int, int] = {}  # queued request id -> uncached tokens when routed
        self._peek: tuple[bytes | None, int] = (None, 0)

    # ---------------------------------------------------------------- the view
    @property
    def running(self) -> int:
        return len(self.engine.active)

    @property
    def queued(self) -> int:
        return len(self.engine.waiting) + (len(self.front.buffer) if self.front is not None else 0)

    def match_len(self, key: bytes) -> int:
        if self._peek[0] is not key:
            self._peek = (key, self.engine.cache.match_len(key))
        return self._peek[1]

    # ---------------------------------------------------------------- traffic
    def submit(self, seq: Seq) -> None:
        if self.track_prefill:
            est = seq.prompt_len - self.match_len(seq.key)
            self._estimate[seq.id] = est
            self.queued_prefill_tokens += est
            self._peek = (None, 0)
        self.entry.submit(seq)

    def _admitted(self, admitted: Sequence[WaitingRequest]) -> None:
        for seq in admitted:
            est = self._estimate.pop(seq.id, None)
            if est is not None:
                self.queued_prefill_tokens -= est

    def counters(self) -> dict[str, int]:
        return {**self.engine.counters, **self.policies.stats(), **(self.front.counters if self.front else {})}


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


def simulate_cluster(spec: RunSpec, *, progress: bool = False,
                     on_record: Callable[[RequestRecord], None] | None = None,
                     served_reference: bool = False) -> SimResult:
    """Replay ``spec.trace`` through ``spec.cluster.instances`` engines behind ``spec.cluster.router``; as
    :func:`prism.sim.run.simulate` (records carry their instance)."""
    cfg = spec.cluster
    run = Replay(spec, progress, on_record, served_reference)
    capacity: dict[str, int] = {}  # per profile (checking a capacity against the trace reads every request)
    for i in range(cfg.instances):
        p = spec.profile_of(i)
        if p.name not in capacity:
            capacity[p.name] = kv_capacity(spec.engine, p, spec.trace, spec.trace_source)
    policy = make_router(cfg.router, spec.router_configs)
    instances = [Instance(i, run.env, spec, capacity[spec.profile_of(i).name], partial(run.finished, instance=i),
                          policy.reads_queued_prefill)
                 for i in range(cfg.instances)]
    router = RouterProcess(run.env, instances, policy, cfg.router_delay_s, cfg.view_interval_s)
    run.client = Client(run.env, router, spec.trace.requests, spec.engine.max_concurrency)

    def result(complete: bool) -> SimResult:
        counters: Counter = Counter()
        for inst in instances:
            counters.update(inst.counters())
        counters.update(router.policy.stats())
        return run.result(counters, sum(i.capacity for i in instances), complete,
                          cluster=instance_summary(spec, run.records, [(i.profile, i.capacity) for i in instances]))

    return run.run(result)
