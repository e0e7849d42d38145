"""Run one simulation: a trace, a method, an engine configuration and a calibrated profile."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any, Callable

import simpy
from tqdm import tqdm

from prism.calibration.cost_model import Profile
from prism.core import Request
from prism.errors import UserError
from prism.policies.registry import make_policies
from prism.traces.stats import infinite_cache_hit_rate
from prism.traces.trace import Trace

from prism.policies.fcfs import FCFS
from prism.policies.qas import QAS
from prism.sim.client import Client
from prism.sim.engine import Engine, EngineConfig, Seq
from prism.sim.frontend import FrontEnd
from prism.sim.metrics import RequestRecord, summarize


@dataclass
class SimResult:
    records: list[RequestRecord]
    summary: dict[str, Any]
    counters: dict[str, int] = field(default_factory=dict)


def kv_capacity(config: EngineConfig, profile: Profile, trace: Trace) -> int:
    cap = config.max_total_tokens if config.max_total_tokens is not None else profile.kv_capacity_tokens
    biggest = max(trace.requests, key=lambda r: r.prompt_len + r.output_len)
    need = biggest.prompt_len + biggest.output_len - 1
    if need > cap:
        raise UserError(f"KV capacity of {cap} tokens is smaller than request {biggest.id} "
                        f"({biggest.prompt_len} prompt + {biggest.output_len} output tokens)",
                        "engine.max_total_tokens")
    return cap


def _record(seq: Seq) -> RequestRecord:
    return RequestRecord(seq.id, seq.req.arrival, seq.sent, seq.prefill_start, seq.prefill_end, seq.first_token,
                         seq.finish, seq.prompt_len, seq.hit, seq.output_len, seq.lane, seq.realigned)


def simulate(trace: Trace, scheduler: str, eviction: str, engine: EngineConfig, profile: Profile,
             knobs: dict[str, Any] | None = None, label: str | None = None, progress: bool = False,
             qps: float | None = None, on_record: Callable[[RequestRecord], None] | None = None,
             served_reference: bool = False) -> SimResult:
    """Replay ``trace`` through one simulated engine; deterministic for a given input.

    ``on_record`` sees each request's record as it finishes (to write results as they come).
    ``served_reference`` adds ``served_infinite_cache_hit_rate``: the hit rate an unbounded cache would reach
    on the prompts as this run served them (after any realignment, in admission order), the ceiling for any
    eviction policy under this run's schedule. The trace-order figure (``infinite_cache_hit_rate``) is not
    that ceiling for a scheduler that reorders segments."""
    wall0 = time.perf_counter()
    capacity = kv_capacity(engine, profile, trace)
    sched, evict, hints = make_policies(scheduler, eviction, knobs, requests=trace.requests)
    front_sched = None
    if isinstance(sched, QAS) and sched.config.window_s > 0:  # QAS before an unmodified FCFS engine
        front_sched, sched = sched, FCFS()
    env = simpy.Environment()
    records: list[RequestRecord] = []
    done = env.event()
    total = len(trace.requests)
    bar = tqdm(total=total, disable=not progress, unit="req", desc=label or f"{scheduler}+{eviction}",
               mininterval=0.25, leave=False)

    served: list[Request] = []  # as the engine served them: final segment order; arrival = admission

    def on_finish(seq: Seq) -> None:
        records.append(_record(seq))
        if served_reference:
            served.append(Request(seq.id, seq.prefill_start, seq.segments, seq.output_len))
        if on_record is not None:
            on_record(records[-1])
        client.finished(seq)
        bar.update(1)
        if len(records) == total:
            done.succeed()

    eng = Engine(env, engine, profile.cost, sched, evict, capacity, hints, on_finish)
    front = FrontEnd(env, eng, front_sched, front_sched.config.window_s) if front_sched else None
    client = Client(env, front or eng, trace.requests, engine.max_concurrency)
    env.run(until=done)
    bar.close()

    counters = dict(sorted({**eng.counters, **sched.stats(),
                            **(front_sched.stats() if front else {}), **(front.counters if front else {})}.items()))
    if qps is None:
        qps = trace.spec.get("qps")
    if qps is None:  # a replayed trace at its own timestamps: report its measured rate
        arr = [r.arrival for r in trace.requests]
        qps = round((len(arr) - 1) / (arr[-1] - arr[0]), 6) if len(arr) > 1 and arr[-1] > arr[0] else 0.0
    summary = {
        "method": label or f"{scheduler}+{eviction}",
        "scheduler": scheduler,
        "eviction": eviction,
        "qps": qps,
        "seed": trace.spec.get("seed"),
        "trace_kind": trace.kind,
        **summarize(records, engine.warmup_requests),
        "infinite_cache_hit_rate": trace.infinite_cache_hit_rate(),
        **({"served_infinite_cache_hit_rate": infinite_cache_hit_rate(sorted(served, key=attrgetter("arrival", "id")))}
           if served_reference else {}),
        "kv_capacity_tokens": capacity,
        "profile": profile.name,
        "engine": asdict(engine),
        "counters": counters,
        "wall_s": time.perf_counter() - wall0,
    }
    return SimResult(records, summary, counters)
