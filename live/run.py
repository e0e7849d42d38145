"""One live run: a trace replayed against real SGLang servers running prism's policies.

The same :class:`~prism.settings.RunSpec` as a simulation decides the method, its knobs, the engine limits and
the trace. :func:`live_run` starts the run's servers (:class:`~prism.live.instance.ServerInstance`: one, or
``--instances N`` behind a router; or attaches to ``--url``), waits for them, checks that the plugin runs in
their schedulers, warms them up, empties their caches, replays the trace open-loop and writes
``requests.csv`` and ``summary.json`` in ``prism-sim``'s schema (``engine_kind`` says ``sglang``).

**Several servers** (``--instances N --router R``): the servers start side by side (ports ``--port`` ..
``--port + N - 1``), each exactly as a single run's server starts (the method's server arguments and plugin,
the instance's profile for its KV capacity and pacing), and each request of the trace is routed when it is
sent by the same routing policy object as the simulator's cluster (:mod:`prism.live.dispatch`: the
registry's router over client-side views of the servers). Results follow the simulator's cluster schema:
``requests.csv`` with an ``instance`` column, ``summary.json`` with the ``cluster`` block (per-instance load,
hit rate from SGLang's ``cached_tokens``, TTFT, imbalance) and the counters of every server's plugin summed,
plus the router's own counters. With ``--router sglang_router`` the real sglang-router 0.3.2 routes instead
(:mod:`prism.live.router`): the replay goes through it, each server gets the run's segment table by ``rid``,
and each request's instance is read from the servers' event logs. Each server's log and plugin files are in
the run folder's ``instance-I/``
(a single server's in the run folder itself). Servers are started together and waited for together (on a
small machine their start-ups share the CPU); a server that dies stops the replay (``complete: false``);
every server is stopped whatever happens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from prism.errors import UserError
from prism.metrics import (SERVER_FILES, RecordStream, RequestRecord, instance_summary, prepare_run_folder,
                           run_summary, write_json, write_requests_csv)
from prism.output import InterruptsHeld, prepare_run_dir
from prism.policies.registry import EVICTIONS, make_router, policy_class
from prism.settings import RunSpec

from prism.live.client import ClientRecord, ReplayError, replay
from prism.live.dispatch import Dispatcher
from prism.live.instance import ServerInstance, device_of
from prism.live.model import resolve_model
from prism.live.requests import live_requests
from prism.live.server import SERVER_HOST, admission_env, check_attachable, check_port

ENGINE_KIND = "sglang"


@dataclass
class LiveOptions:
    """How to reach or start the servers (the run itself is the RunSpec)."""

    model: str = "tiny"
    url: str | None = None  # attach to a running server instead of starting one
    pace: bool = False  # pace every forward pass to the spec's profile (the CPU twin)
    dilation: float = 10.0
    device: str = "auto"  # cpu | cuda | auto (cuda when nvidia-smi exists)
    port: int = 30123
    dtype: str = "auto"
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    python: str | None = None  # the servers' interpreter (default: this one)
    real_router: bool = False  # sglang-router itself in front of the servers (its cache-aware policy)


def check_method(spec: RunSpec, opts: LiveOptions | None = None) -> None:
    """Refuse what a live run cannot do, before any server starts."""
    if opts is not None and opts.url:
        check_attachable(spec.engine)
    if policy_class(EVICTIONS, spec.eviction).offline:
        raise UserError(f"eviction {spec.eviction!r} is an offline reference that knows the future: simulator only")
    if opts is not None:
        check_cluster(spec, opts)


def check_cluster(spec: RunSpec, opts: LiveOptions) -> None:
    """What a run on several servers cannot do with these options (before any server starts)."""
    n = spec.cluster.instances
    if n > 1 and opts.url:
        raise UserError(f"--url attaches to one server; --instances {n} starts its own servers (drop --url)")
    if opts.port + n - 1 > 65535:
        raise UserError(f"--port {opts.port} leaves no room for {n} servers (they take ports --port .. "
                        f"--port + {n - 1})")
    if opts.real_router:
        from prism.live.router import check_installed

        if opts.url:
            raise UserError("--router sglang_router starts its own servers behind the router (drop --url)")
        if opts.port + n > 65535:
            raise UserError(f"--port {opts.port} leaves no room for the router (port --port + {n})")
        check_installed(opts.python)
    if not opts.url:  # the servers' ports (and the router's): free now, or the run would talk to their holder
        for port in range(opts.port, opts.port + n + opts.real_router):
            check_port(SERVER_HOST, port)


def instance_dir(out: Path, i: int) -> Path:
    return out / f"instance-{i}"


def instance_spec(spec: RunSpec, i: int) -> RunSpec:
    """Instance ``i``'s run as a single server sees it: the cluster's run on that instance's profile."""
    return replace(spec, profile=spec.profile_of(i), instance_profiles=())


def live_run(spec: RunSpec, opts: LiveOptions, out: Path, progress: Callable[[int], None] | None = None,
             timeline: Path | None = None) -> dict[str, Any]:
    """Serve ``spec`` live; write results into ``out`` as they come. Raises :class:`UserError` for bad input
    and :class:`ReplayError` (after writing the partial results) when the run breaks off. ``timeline``: also
    write the run's timeline there (:mod:`prism.live.timeline`, from the plugin's event log)."""
    check_method(spec, opts)
    if timeline is not None and opts.url:
        raise UserError("--timeline needs the servers prism starts: an attached --url server keeps no event log")
    n, real = spec.cluster.instances, opts.real_router
    routed = n > 1 or real
    wall0 = time.perf_counter()
    model = resolve_model(opts.model, "bfloat16" if opts.dtype == "auto" else opts.dtype)
    reqs = live_requests(spec.trace, model.vocab_size, model.context_length, spec.trace_source or "trace")
    dilation = opts.dilation if opts.pace else 1.0
    out = prepare_run_folder(out)  # one run per folder: an earlier run's files go, summary first
    folders = [prepare_run_dir(instance_dir(out, i), SERVER_FILES) for i in range(n)] if routed else [out]
    specs = [instance_spec(spec, i) for i in range(n)]
    records: list[RequestRecord] = []
    stream = RecordStream(out / "requests.csv", flush_every=1, cluster=routed)
    router = make_router(spec.cluster.router, spec.router_configs) if routed and not real else None
    table = None
    if real:
        from prism.live.router import write_segment_table

        table = write_segment_table(spec.trace, out / "segments.json", spec.engine.admission, model.eos_ids)
    front = None  # the real router (its process), once the servers are up
    servers: list[ServerInstance] = []
    complete = False
    counters: list[dict | None] = []
    t_start: float | None = None
    try:
        if opts.url:
            servers.append(ServerInstance.attach(opts.url, out))
        else:
            device = device_of(opts.device)
            for i, (s, folder) in enumerate(zip(specs, folders)):
                servers.append(ServerInstance.start(i, s, model, folder, opts.port + i, device, opts.pace,
                                                    opts.dilation, opts.dtype, opts.python, timeline is not None,
                                                    table))
        for server in servers:
            server.wait_ready(opts.startup_timeout_s)
        for server in servers:
            server.warm_up(model.vocab_size)
        if real:
            from prism.live.router import RealRouter

            front = RealRouter([s.url for s in servers], opts.port + n, _cache_aware_knobs(spec), out, opts.python)
            front.wait_ready(opts.startup_timeout_s, n)
        t_start = time.monotonic() + 0.05
        dispatch = (Dispatcher(router, [s.url for s in servers], [s.kv_capacity_of() for s in specs],
                               lambda: (time.monotonic() - t_start) / dilation,
                               {r.id: (r.segments, r.fixed_order) for r in spec.trace.requests})
                    if routed and not real else None)

        def instance_of(rid: int) -> int:
            if dispatch is not None:
                return dispatch.placed[rid]
            if not real:
                return 0
            from prism.live.router import placement

            i = placement(rid, [s.events for s in servers])
            if i is None:
                raise ReplayError(f"request {rid}: answered through sglang-router, but no server's event log has it")
            return i

        def on_record(c: ClientRecord) -> None:
            i = instance_of(c.id)
            r = servers[i].record(c, t_start, dilation, i if routed else None)
            records.append(r)
            stream(r)
            if progress is not None:
                progress(1)

        def alive() -> str | None:
            for server in servers:
                if why := server.dead():
                    return f"instance {server.index}: {why}" if routed else why
            return front.dead() if front is not None else None

        target = front.url if front is not None else servers[0].url
        replay(target, reqs, on_record, dilation=dilation, timeout=opts.request_timeout_s,
               max_concurrency=spec.client_limit(), alive=alive, start=t_start,
               admission=spec.engine.admission, eos_ids=model.eos_ids, dispatch=dispatch)
        complete = True
    finally:
        stream.close()
        if front is not None:
            front.stop()
        counters = [server.counters() for server in servers]
        for server in servers:
            server.stop()

        def make_summary() -> dict[str, Any]:
            total = _sum_counters(counters)
            if router is not None:
                for k, v in router.stats().items():
                    total[k] = total.get(k, 0) + v
            cluster = (instance_summary(spec, records, [(s.profile.name, s.kv_capacity_of()) for s in specs])
                       if routed else None)
            s = run_summary(spec, records, engine_kind=ENGINE_KIND,
                            kv_capacity_tokens=sum(x.kv_capacity_of() for x in specs), counters=total,
                            wall_s=time.perf_counter() - wall0, complete=complete, cluster=cluster)
            started = not opts.url
            s.update({"model": model.name, "paced": opts.pace, "dilation": dilation, "breakdown_from_server": started,
                      "clock_zero_monotonic": t_start,  # the replay's time zero on the servers' event logs' clock
                      # SGLang's admission knobs as the servers got them; null: a --url server's own
                      "server_admission_env": admission_env(spec.engine) if started else None})
            if real:
                from prism.live.router import VERSION

                s["router_process"] = {"name": "sglang_router", "version": VERSION, "policy": "cache_aware"}
            return s

        summary = write_results(out, records, make_summary, cluster=routed)
        if timeline is not None and summary:
            from prism.live.timeline import write_live_timeline

            write_live_timeline(out, timeline)
    return summary


def _cache_aware_knobs(spec: RunSpec):
    """The run's cache-aware knobs (its section, else the defaults): what the real router is started with."""
    from prism.policies.cache_aware import CacheAwareConfig

    return spec.router_configs.get("cache_aware") or CacheAwareConfig()


def _sum_counters(counters: list[dict | None]) -> dict[str, float]:
    """The servers' plugin counters, summed (the overhead ratio of the sums, not a sum of ratios)."""
    total: dict[str, float] = {}
    for c in counters:
        for k, v in (c or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total[k] = round(total.get(k, 0) + v, 6) if len(counters) > 1 else v
    if len(counters) > 1 and total.get("scheduler_cpu_ms"):
        total["plugin_overhead"] = round(total.get("plugin_cpu_ms", 0) / total["scheduler_cpu_ms"], 5)
        if total.get("scheduler_busy_cpu_ms"):
            total["plugin_overhead_busy"] = round(total.get("plugin_cpu_ms", 0) / total["scheduler_busy_cpu_ms"], 5)
    return total


def write_results(out: Path, records: list[RequestRecord], make_summary: Callable[[], dict[str, Any]],
                  cluster: bool = False) -> dict[str, Any]:
    """A run's files once it is over or broken off: requests.csv in request order, then summary.json, both
    whole whatever a second Ctrl-C does meanwhile; the summary, or {} for a server that never served, which
    leaves its log and the one-line error but no requests.csv (a header alone would read as a killed run)."""
    with InterruptsHeld():
        if not records:
            (out / "requests.csv").unlink(missing_ok=True)
            return {}
        summary = make_summary()
        write_requests_csv(records, out / "requests.csv", cluster=cluster)
        write_json(summary, out / "summary.json")
        return summary


__all__ = ["LiveOptions", "live_run", "write_results", "check_method", "check_cluster", "ReplayError"]
