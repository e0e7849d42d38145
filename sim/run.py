"""Run one simulation of a :class:`~prism.settings.RunSpec`: a trace, a method, an engine configuration and a
calibrated profile."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable

import simpy

from prism.core import Request
from prism.metrics import RequestRecord, run_summary
from prism.policies.registry import make_policies
from prism.settings import RunSpec, kv_capacity
from prism.traces.stats import infinite_cache_hit_rate

from prism.sim.client import Client
from prism.sim.engine import Engine, Seq
from prism.sim.frontend import FrontEnd


@dataclass
class SimResult:
    records: list[RequestRecord]
    summary: dict[str, Any]
    counters: dict[str, int] = field(default_factory=dict)


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
             served_reference: bool = False) -> SimResult:
    """Replay ``spec.trace`` through one simulated engine; deterministic for a given spec.

    ``on_record`` sees each request's record as it finishes (to write results as they come).
    ``served_reference`` adds ``served_infinite_cache_hit_rate``: the hit rate an unbounded cache would reach
    on the prompts as this run served them (after any realignment, in admission order), the ceiling for any
    eviction policy under this run's schedule. The trace-order figure (``infinite_cache_hit_rate``) is not
    that ceiling for a scheduler that reorders segments.

    A spec with ``cluster.instances > 1`` runs on a cluster (:func:`prism.sim.cluster.simulate_cluster`)."""
    if spec.cluster.instances > 1:
        from prism.sim.cluster import simulate_cluster  # it builds on this module

        return simulate_cluster(spec, progress=progress, on_record=on_record, served_reference=served_reference)
    wall0 = time.perf_counter()
    trace = spec.trace
    capacity = kv_capacity(spec.engine, spec.profile, trace, spec.trace_source)
    policies = make_policies(spec.scheduler, spec.eviction, spec.policy_configs, spec.deployment,
                             requests=trace.requests)
    env = simpy.Environment()
    records: list[RequestRecord] = []
    done = env.event()
    total = len(trace.requests)
    bar = _progress_bar(total, spec.label) if progress else None

    served: list[Request] = []  # as the engine served them: final segment order; arrival = admission

    def on_finish(seq: Seq) -> None:
        records.append(record_of(seq))
        if served_reference:
            served.append(Request(seq.id, seq.prefill_start, seq.segments, seq.output_len))
        if on_record is not None:
            on_record(records[-1])
        client.finished(seq)
        if bar is not None:
            bar.update(1)
        if len(records) == total:
            done.succeed()

    eng = Engine(env, spec.engine, spec.profile.cost, policies.scheduler, policies.eviction, capacity,
                 policies.hints, on_finish)
    front = (FrontEnd(env, eng, policies.front_end, spec.deployment.window_s)
             if policies.front_end is not None else None)
    client = Client(env, front or eng, trace.requests, spec.engine.max_concurrency)

    def result(complete: bool) -> SimResult:
        counters = {**eng.counters, **policies.stats(), **(front.counters if front else {})}
        summary = run_summary(
            spec, records, engine_kind="sim", kv_capacity_tokens=capacity, counters=counters,
            served_infinite_cache_hit_rate=(infinite_cache_hit_rate(sorted(served, key=attrgetter("arrival", "id")))
                                            if served_reference else None),
            wall_s=time.perf_counter() - wall0, complete=complete)
        return SimResult(records, summary, summary["counters"])

    try:
        env.run(until=done)
    except KeyboardInterrupt:
        raise SimInterrupted(result(False), total) from None
    finally:
        if bar is not None:
            bar.close()
    return result(True)


def _progress_bar(total: int, label: str):
    from tqdm import tqdm  # only a run that shows progress pays for importing it

    return tqdm(total=total, unit="req", desc=label, mininterval=0.25, leave=False)
