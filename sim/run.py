"""Run one simulation of a :class:`~prism.settings.RunSpec`: a trace, a method, an engine configuration and a
calibrated profile."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import simpy

from prism.core import Request
from prism.metrics import RequestRecord, instance_summary, run_summary
from prism.output import InterruptsHeld
from prism.policies.registry import make_router
from prism.settings import RunSpec
from prism.traces.stats import infinite_cache_hit_rate

from prism.sim.client import Client
from prism.sim.engine import Seq
from prism.sim.events import EngineEvents
from prism.sim.instance import Instance


@dataclass
class SimResult:
    records: list[RequestRecord]
    summary: dict[str, Any]
    counters: dict[str, int] = field(default_factory=dict)
    memory: list[tuple] = field(default_factory=list)  # a fleet's memory samples (sim/fleet.py)


class SimInterrupted(KeyboardInterrupt):
    """Ctrl-C during a simulation; ``result`` holds the requests that finished and their summary
    (``complete``: false)."""

    def __init__(self, result: SimResult, total: int) -> None:
        super().__init__(f"interrupted after {len(result.records)} of {total} requests")
        self.result, self.total = result, total


def record_of(seq: Seq, instance: int | None = None) -> RequestRecord:
    """A finished request's record (``instance``: where a cluster served it)."""
    return RequestRecord(seq.id, seq.req.arrival, seq.sent, seq.prefill_start, seq.prefill_end, seq.first_token,
                         seq.finish, seq.prompt_len, seq.hit, seq.output_len, seq.lane, seq.realigned, instance)


def simulate(spec: RunSpec, *, progress: bool = False, on_record: Callable[[RequestRecord], None] | None = None,
             served_reference: bool = False, routed: bool = False, events: EngineEvents | None = None) -> SimResult:
    """Replay ``spec.trace`` through the run's instances; deterministic for a given spec.

    One instance is a single engine; ``spec.cluster.instances`` > 1 puts them behind ``spec.cluster.router``
    (``routed``: a router even in front of one instance, which serves as the single engine does, byte for
    byte). ``on_record`` sees each request's record as it finishes (to write results as they come); records
    carry their instance behind a router. ``served_reference`` adds ``served_infinite_cache_hit_rate``: the
    hit rate an unbounded cache would reach on the prompts as this run served them (after any realignment, in
    admission order), the ceiling for any eviction policy under this run's schedule. The trace-order figure
    (``infinite_cache_hit_rate``) is not that ceiling for a scheduler that reorders segments. ``events``: an
    observer of every engine (:mod:`prism.sim.events`).

    A run of several models sharing GPUs (``spec.fleet``) goes to :func:`prism.sim.fleet.simulate_fleet`.

    The cyclic garbage collector is paused meanwhile (see :func:`_collector_paused`)."""
    if spec.fleet is not None:
        from prism.sim.fleet import simulate_fleet  # it builds on this module

        return simulate_fleet(spec, progress=progress, on_record=on_record, events=events)
    with _collector_paused():
        return _simulate(spec, progress, on_record, served_reference, routed or spec.cluster.instances > 1,
                         events)


def simulate_cluster(spec: RunSpec, **kwargs: Any) -> SimResult:
    """:func:`simulate` behind the run's router, even on one instance."""
    return simulate(spec, routed=True, **kwargs)


def _simulate(spec: RunSpec, progress: bool, on_record: Callable[[RequestRecord], None] | None,
              served_reference: bool, routed: bool, events: EngineEvents | None) -> SimResult:
    run = Replay(spec, progress, on_record, served_reference)
    policy = make_router(spec.cluster.router, spec.router_configs) if routed else None
    instances = [Instance(i, run.env, spec, run.finisher(i if routed else None),
                          policy is not None and policy.reads_queued_prefill, events)
                 for i in range(spec.cluster.instances)]
    if policy is not None:
        from prism.sim.cluster import RouterProcess  # only a routed run imports the router's process
    entry = instances[0].entry if policy is None else RouterProcess(run.env, instances, policy, spec.cluster.router_delay_s,
                                                              spec.cluster.view_interval_s)
    alone = policy is None and instances[0].front is None  # the engine is the only process: its clock sends arrivals
    run.client = Client(run.env, entry, spec.trace.requests, spec.client_limit(),
                        clock=instances[0].engine.ticker if alone else None)

    def result(complete: bool) -> SimResult:
        counters: dict[str, int] = {}
        for inst in instances:
            for k, v in inst.counters().items():
                counters[k] = counters.get(k, 0) + v
        if policy is None:
            return run.result(counters, instances[0].capacity, complete)
        for k, v in policy.stats().items():
            counters[k] = counters.get(k, 0) + v
        return run.result(counters, sum(i.capacity for i in instances), complete,
                          cluster=instance_summary(spec, run.records, [(i.profile, i.capacity) for i in instances]))

    return run.run(result)


class Replay:
    """What every simulated run shares, one engine or a cluster: the clock, the records of the requests as they
    finish (streamed to ``on_record``), the progress bar, the prompts as served (for the served-order
    reference), the summary, and running to the last finish or to Ctrl-C."""

    def __init__(self, spec: RunSpec, progress: bool, on_record: Callable[[RequestRecord], None] | None,
                 served_reference: bool) -> None:
        self.spec, self.on_record = spec, on_record
        self.wall0 = time.perf_counter()
        self.env = simpy.Environment()
        self.records: list[RequestRecord] = []
        self.done = self.env.event()
        self.total = len(spec.trace.requests)
        self.bar = _progress_bar(self.total, spec.label) if progress else None
        # as the engines served them: (admission, id, segments in their final order, output length); made
        # requests only where the run's order differs from the trace's (_served_rate)
        self.served: list[tuple] | None = [] if served_reference else None
        self.client: Client | None = None  # set once the engines exist: it hands them the trace

    def finisher(self, instance: int | None) -> Callable[[Seq], None]:
        """What an instance calls when a request finishes (``instance``: where a router sent it)."""
        return self.finished if instance is None else lambda seq: self.finished(seq, instance)

    def finished(self, seq: Seq, instance: int | None = None, record: RequestRecord | None = None) -> None:
        """``seq`` finished (``instance``: where a router sent it; ``record``: its record, made by the caller)."""
        if self.served is not None:
            self.served.append((seq.prefill_start, seq.id, seq.segments, seq.output_len))
        self.take(record if record is not None else record_of(seq, instance))
        self.client.finished(seq)
        if len(self.records) == self.total:
            self.done.succeed()

    def take(self, record: RequestRecord) -> None:
        """A finished request's record: kept, streamed and counted (a fleet's parts hand theirs to the whole
        run's, ``sim/fleet.py``)."""
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        if self.bar is not None:
            self.bar.update(1)

    def result(self, counters: Mapping[str, int], kv_capacity_tokens: int, complete: bool,
               **extra: Any) -> SimResult:
        summary = run_summary(
            self.spec, self.records, engine_kind="sim", kv_capacity_tokens=kv_capacity_tokens, counters=counters,
            served_infinite_cache_hit_rate=self._served_rate(),
            wall_s=time.perf_counter() - self.wall0, complete=complete, **extra)
        return SimResult(self.records, summary, summary["counters"])

    def _served_rate(self) -> float | None:
        """The served-order reference (None: not asked for). Where the run admitted every request in the
        trace's order with the trace's own prompts (FCFS without realignment), it is the trace's, computed once."""
        if self.served is None:
            return None
        served = self.served
        served.sort()  # by admission, then id (ids are unique: segments are never compared)
        trace = self.spec.trace.requests
        if len(served) == len(trace) and all(rid == b.id and segments is b.segments and b.model is None
                                             for (_, rid, segments, _), b in zip(served, trace)):
            return self.spec.trace.infinite_cache_hit_rate()
        return infinite_cache_hit_rate(self.served_requests())

    def served_requests(self) -> list[Request]:
        """The prompts as the engines served them, by admission (then id): their segments in their final order,
        their arrival their admission."""
        return [Request(rid, t, segments, out) for t, rid, segments, out in sorted(self.served)]

    def run(self, result: Callable[[bool], SimResult], advance: Callable[[], None] | None = None) -> SimResult:
        """Simulate to the last finish (``advance``: how, where not this run's clock to its last finish). Ctrl-C
        raises :class:`SimInterrupted` with ``result(False)``, the requests that finished; once all have finished,
        Ctrl-C waits for the summary, and the interruption carries the whole result (``complete``: true)."""
        try:
            # the summary's trace-order reference first: the trie it walks (223 bytes a request on prefix20) is
            # freed before the simulation's state grows, not built on top of it at the end
            self.spec.trace.infinite_cache_hit_rate()
            if advance is None:
                self.env.run(until=self.done)
            else:
                advance()
        except KeyboardInterrupt:
            with InterruptsHeld():
                res = result(False)
            raise SimInterrupted(res, self.total) from None
        finally:
            if self.bar is not None:
                self.bar.close()
        with InterruptsHeld() as held:
            res = result(True)
        if held.caught:
            raise SimInterrupted(res, self.total)
        return res


@contextmanager
def _collector_paused():
    """CPython's cyclic garbage collector off during a simulation (then as it was before).

    A run allocates hundreds of thousands of objects that live until it ends (an oracle's index, tree nodes,
    requests in the engine, records), and the generational collector, set off by allocations, scans the
    survivors again and again, and with them whatever else the process holds (every full collection walks
    the imported libraries and the sweep's traces): a fifth of an in-process sweep's time went to it. Yet a
    run makes almost no cyclic garbage before it ends (its tree, with parent links, is freed by the next
    collection after it); reference counting frees everything else at once, paused or not. (Tests collect
    mid-run and find nothing, for every method on one engine and every router: ``cyclic_garbage_during`` in
    ``tests/conftest.py``. A fleet leaves each copy it unloads, engine and tree, to the end of the run.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _progress_bar(total: int, label: str):
    from tqdm import tqdm  # only a run that shows progress pays for importing it

    return tqdm(total=total, unit="req", desc=label, mininterval=0.25, leave=False)
