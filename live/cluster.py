"""A live run on several SGLang servers behind the project's router (``prism-live --instances N --router R``).

The run is the same :class:`~prism.settings.RunSpec` as ``prism-sim --instances N --router R``: N servers start
side by side (ports ``--port`` .. ``--port + N - 1``), each exactly as a single live run starts its one server
(the method's server arguments and plugin, the instance's profile for its KV capacity and pacing), and each
request of the trace is routed when it is sent by the same routing policy object as the simulator's cluster
(:mod:`prism.live.dispatch`: the registry's router over client-side views of the servers). Results follow the
simulator's cluster schema: ``requests.csv`` with an ``instance`` column, ``summary.json`` with the ``cluster``
block (per-instance load, hit rate from SGLang's ``cached_tokens``, TTFT, imbalance) and the counters of every
server's plugin summed, plus the router's own counters. Each server's log and plugin files are in the run
folder's ``instance-I/``.

Servers are started together and waited for together (on a small machine their start-ups share the CPU);
a server that dies stops the replay (``complete: false``); every server is stopped whatever happens.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from prism.errors import UserError
from prism.metrics import SERVER_FILES, RecordStream, RequestRecord, instance_summary, prepare_run_folder, run_summary
from prism.output import prepare_run_dir, write_atomic_text
from prism.policies.registry import make_router
from prism.settings import RunSpec

from prism.live.client import ClientRecord, replay
from prism.live.dispatch import Dispatcher
from prism.live.hooks import CONFIG_ENV
from prism.live.model import resolve_model
from prism.live.requests import live_requests
from prism.live.server import Server, admission_env, wait_healthy

def instance_dir(out: Path, i: int) -> Path:
    return out / f"instance-{i}"


def instance_spec(spec: RunSpec, i: int) -> RunSpec:
    """Instance ``i``'s run as a single server sees it: the cluster's run on that instance's profile."""
    return replace(spec, profile=spec.profile_of(i), instance_profiles=())


def check_cluster(spec: RunSpec, opts) -> None:
    """What a cluster run cannot do with these options (before any server starts)."""
    n = spec.cluster.instances
    if n > 1 and opts.url:
        raise UserError(f"--url attaches to one server; --instances {n} starts its own servers (drop --url)")
    if opts.port + n - 1 > 65535:
        raise UserError(f"--port {opts.port} leaves no room for {n} servers (they take ports --port .. "
                        f"--port + {n - 1})")


def live_cluster_run(spec: RunSpec, opts, out: Path, progress: Callable[[int], None] | None = None
                     ) -> dict[str, Any]:
    """Serve ``spec`` on ``spec.cluster.instances`` servers; as :func:`prism.live.run.live_run`."""
    from prism.live import run as single  # the single server's pieces (run.py hands clusters to this module)

    single.check_method(spec, opts)
    check_cluster(spec, opts)
    n = spec.cluster.instances
    wall0 = time.perf_counter()
    served = resolve_model(opts.model, "bfloat16" if opts.dtype == "auto" else opts.dtype)
    reqs = live_requests(spec.trace, served.vocab_size, served.context_length, spec.trace_source or "trace")
    dilation = opts.dilation if opts.pace else 1.0
    out = prepare_run_folder(out)  # every earlier run's files go, those of its instance folders too
    for i in range(n):
        prepare_run_dir(instance_dir(out, i), SERVER_FILES)
    device = single._device(opts)
    specs = [instance_spec(spec, i) for i in range(n)]
    capacities = [single.kv_capacity(s) for s in specs]
    urls = [f"http://127.0.0.1:{opts.port + i}" for i in range(n)]
    servers: list[Server] = []
    events = [single._Events(instance_dir(out, i) / "events.jsonl") for i in range(n)]
    records: list[RequestRecord] = []
    stream = RecordStream(out / "requests.csv", flush_every=1, cluster=True)
    router = make_router(spec.cluster.router, spec.router_configs)
    complete = False
    summary: dict[str, Any] = {}
    counters: list[dict | None] = [None] * n
    try:
        for i, s in enumerate(specs):
            folder = instance_dir(out, i)
            write_atomic_text(folder / "plugin.json", json.dumps(single.plugin_config(s, opts, folder), indent=2))
            env = {CONFIG_ENV: str((folder / "plugin.json").resolve()), "SGLANG_ENABLE_WAITING_PREFIX_REFRESH": "0",
                   **admission_env(s.engine)}
            if device == "cpu":
                env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            args = single.server_args(s, replace(opts, port=opts.port + i), served.path, served.load_format, device)
            servers.append(Server(args, env, folder / "server.log", opts.python))
        for url, server in zip(urls, servers):
            wait_healthy(url, opts.startup_timeout_s, server)
        for i, (url, server) in enumerate(zip(urls, servers)):
            single._warm_up(url, served.vocab_size)
            if single._counters(url) is None:
                raise UserError(f"the prism plugin is not active in server {i}'s scheduler (is prism-serve installed "
                                f"in the server's environment? see {server.log_path})")
        t_start = time.monotonic() + 0.05
        dispatch = Dispatcher(router, urls, capacities, lambda: (time.monotonic() - t_start) / dilation,
                              {r.id: (r.segments, r.fixed_order) for r in spec.trace.requests})

        def on_record(c: ClientRecord) -> None:
            i = dispatch.placed[c.id]
            r = replace(single._record(c, events[i].get(c.id), t_start, dilation), instance=i)
            records.append(r)
            stream(r)
            if progress is not None:
                progress(1)

        def alive() -> str | None:
            for i, server in enumerate(servers):
                if why := server.dead():
                    return f"instance {i}: {why}"
            return None

        replay(urls[0], reqs, on_record, dilation=dilation, timeout=opts.request_timeout_s,
               max_concurrency=spec.engine.max_concurrency, alive=alive, start=t_start,
               admission=spec.engine.admission, eos_ids=served.eos_ids, dispatch=dispatch)
        complete = True
    finally:
        stream.close()
        for i, url in enumerate(urls[:len(servers)]):
            counters[i] = single._counters(url)
            saved = instance_dir(out, i) / "counters.json"
            if counters[i] is None and saved.exists():
                counters[i] = json.loads(saved.read_text())
        for server in servers:
            server.stop()

        def make_summary() -> dict[str, Any]:
            total: dict[str, float] = {}
            for c in counters:
                for k, v in (c or {}).items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        total[k] = round(total.get(k, 0) + v, 6)
            if total.get("scheduler_cpu_ms"):  # a ratio: of the sums, not a sum of ratios
                total["plugin_overhead"] = round(total.get("plugin_cpu_ms", 0) / total["scheduler_cpu_ms"], 5)
            for k, v in router.stats().items():
                total[k] = total.get(k, 0) + v
            run = run_summary(spec, records, engine_kind=single.ENGINE_KIND, kv_capacity_tokens=sum(capacities),
                              counters=total, wall_s=time.perf_counter() - wall0, complete=complete,
                              cluster=instance_summary(spec, records,
                                                       [(s.profile.name, c) for s, c in zip(specs, capacities)]))
            run.update({"model": served.name, "paced": opts.pace, "dilation": dilation,
                        "breakdown_from_server": True, "server_admission_env": admission_env(spec.engine)})
            return run

        summary = single.write_results(out, records, make_summary, cluster=True)
    return summary


__all__ = ["live_cluster_run", "check_cluster", "instance_dir"]
