"""One live run: a trace replayed against a real SGLang server running prism's policies.

The same :class:`~prism.settings.RunSpec` as a simulation decides the method, its knobs, the engine limits and
the trace; :func:`live_run` starts ``python -m sglang.launch_server`` with the matching server arguments and
the prism plugin switched on (or attaches to ``--url``), waits for health, checks that the plugin runs in the
scheduler, warms the server up, empties its cache, replays the trace open-loop and writes ``requests.csv`` and
``summary.json`` in ``prism-sim``'s schema (``engine_kind`` says ``sglang``).

Per-request admission and prefill times come from the plugin's event log in the scheduler process (same
machine, same monotonic clock); the client measures arrival, first token and finish. Attached to a server
that prism did not start, the log is not available: prefill start and end are then reported as the first
token's time (TTFT stays exact; its split into admission wait and prefill does not exist).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from prism.errors import UserError
from prism.metrics import (RecordStream, RequestRecord, prepare_run_folder, run_summary, write_json,
                           write_requests_csv)
from prism.output import InterruptsHeld, write_atomic_text
from prism.policies.registry import engine_scheduler
from prism.settings import RunSpec

from prism.live.client import ClientRecord, ReplayError, replay
from prism.live.hooks import BACKEND, CONFIG_ENV, NATIVE_SCHEDULERS
from prism.live.model import resolve_model
from prism.live.requests import live_requests
from prism.live.server import Server, admission_env, check_attachable, flush_cache, http_json, wait_healthy

ENGINE_KIND = "sglang"

@dataclass
class LiveOptions:
    """How to reach or start the server (the run itself is the RunSpec)."""

    model: str = "tiny"
    url: str | None = None  # attach to a running server instead of starting one
    pace: bool = False  # pace every forward pass to the spec's profile (the CPU twin)
    dilation: float = 10.0
    device: str = "auto"  # cpu | cuda | auto (cuda when nvidia-smi exists)
    port: int = 30123
    dtype: str = "auto"
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    python: str | None = None  # the server's interpreter (default: this one)


def kv_capacity(spec: RunSpec) -> int:
    """The KV pool the server gets: the same figure the simulator would use for this run."""
    cap = spec.engine.max_total_tokens
    return cap if cap is not None else spec.profile.kv_capacity_tokens


def _device(opts: LiveOptions) -> str:
    if opts.device != "auto":
        return opts.device
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def plugin_config(spec: RunSpec, opts: LiveOptions, folder: Path) -> dict[str, Any]:
    return {
        "scheduler": spec.scheduler,
        "eviction": spec.eviction,
        "knobs": {section: asdict(cfg) for section, cfg in spec.policy_configs.items()},
        "deployment": asdict(spec.deployment),  # in the engine, or a front end's windows (live/frontend.py)
        "pace": spec.profile.cost.coefficients() if opts.pace else None,
        "dilation": opts.dilation if opts.pace else 1.0,
        "events": str(folder / "events.jsonl"),
        "counters": str(folder / "counters.json"),
        "overruns": str(folder / "overruns.jsonl"),
    }


def server_args(spec: RunSpec, opts: LiveOptions, model_path: Path, load_format: str, device: str) -> list[str]:
    e = spec.engine
    args = ["--model-path", str(model_path), "--load-format", load_format, "--skip-tokenizer-init",
            "--host", "127.0.0.1", "--port", str(opts.port),
            "--max-total-tokens", str(kv_capacity(spec)), "--page-size", str(e.page_size),
            "--chunked-prefill-size", str(e.chunked_prefill_size), "--max-prefill-tokens", str(e.max_prefill_tokens),
            "--max-running-requests", str(e.max_running_requests),
            "--schedule-policy", NATIVE_SCHEDULERS.get(engine_scheduler(spec.scheduler, spec.deployment), "fcfs"),
            "--radix-cache-backend", BACKEND, "--disable-overlap-schedule", "--random-seed", "0",
            "--log-level", "warning"]
    if opts.dtype != "auto":
        args += ["--dtype", opts.dtype]
    if device == "cpu":
        args += ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
    return args


def check_method(spec: RunSpec, opts: LiveOptions | None = None) -> None:
    """Refuse what a live run cannot do, before any server starts."""
    if opts is not None and opts.url:
        check_attachable(spec.engine)
    if spec.eviction == "belady":
        raise UserError("eviction 'belady' is an offline reference that knows the future: simulator only")


class _Events:
    """Reads the plugin's per-request event log as it grows."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.by_id: dict[int, dict] = {}
        self._pos = 0

    def get(self, rid: int) -> dict | None:
        if rid not in self.by_id and self.path is not None and self.path.exists():
            with self.path.open() as f:
                f.seek(self._pos)
                for line in f:
                    if not line.endswith("\n"):
                        break
                    self._pos += len(line.encode())
                    ev = json.loads(line)
                    self.by_id.setdefault(ev["id"], ev)  # a retracted request prefills again: keep the first
        return self.by_id.get(rid)


def _record(c: ClientRecord, ev: dict | None, t0: float, dilation: float) -> RequestRecord:
    if ev is None:
        start = end = c.first_token
        lane, realigned = "", False
    else:
        start, end = (ev["prefill_start"] - t0) / dilation, (ev["prefill_end"] - t0) / dilation
        lane, realigned = ev.get("lane", ""), bool(ev.get("realigned"))
    return RequestRecord(c.id, c.arrival, c.sent, start, end, c.first_token, c.finish, c.prompt_tokens,
                         c.hit_tokens, c.output_tokens, lane, realigned)


def _counters(url: str) -> dict | None:
    try:
        info = http_json(f"{url}/server_info")
    except OSError:
        return None
    states = info.get("internal_states") if isinstance(info, dict) else None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return states[0].get("prism")
    return None


def _warm_up(url: str, vocab: int) -> None:
    """Two short requests (the first forward passes compile and allocate), then an empty cache."""
    for n in (16, 48):
        payload = {"input_ids": [(7 * i + 3) % (vocab - 2) + 2 for i in range(n)],
                   "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0}}
        http_json(f"{url}/generate", payload, timeout=300)
    flush_cache(url)


def live_run(spec: RunSpec, opts: LiveOptions, out: Path, progress: Callable[[int], None] | None = None
             ) -> dict[str, Any]:
    """Serve ``spec`` live; write results into ``out`` as they come. Raises :class:`UserError` for bad input
    and :class:`ReplayError` (after writing the partial results) when the run breaks off."""
    if spec.cluster.instances > 1:  # several servers behind the project's router
        from prism.live.cluster import live_cluster_run

        return live_cluster_run(spec, opts, out, progress)
    check_method(spec, opts)
    wall0 = time.perf_counter()
    served = resolve_model(opts.model, "bfloat16" if opts.dtype == "auto" else opts.dtype)
    reqs = live_requests(spec.trace, served.vocab_size, served.context_length, spec.trace_source or "trace")
    dilation = opts.dilation if opts.pace else 1.0
    out = prepare_run_folder(out)  # one run per folder: an earlier run's files go, summary first
    server = None
    events = _Events(None)
    if opts.url:
        url = opts.url.rstrip("/")
    else:
        device = _device(opts)
        config = plugin_config(spec, opts, out)
        write_atomic_text(out / "plugin.json", json.dumps(config, indent=2))
        env = {CONFIG_ENV: str((out / "plugin.json").resolve()), "SGLANG_ENABLE_WAITING_PREFIX_REFRESH": "0",
               **admission_env(spec.engine)}
        if device == "cpu":
            env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        server = Server(server_args(spec, opts, served.path, served.load_format, device), env,
                        out / "server.log", opts.python)
        url = f"http://127.0.0.1:{opts.port}"
        events = _Events(out / "events.jsonl")
    records: list[RequestRecord] = []
    stream = RecordStream(out / "requests.csv", flush_every=1)
    complete = False
    summary: dict[str, Any] = {}
    try:
        wait_healthy(url, opts.startup_timeout_s, server)
        _warm_up(url, served.vocab_size)
        if server is not None and _counters(url) is None:
            raise UserError("the prism plugin is not active in the server's scheduler (is prism-serve installed "
                            f"in the server's environment? see {out / 'server.log'})")
        t_start = time.monotonic() + 0.05

        def on_record(c: ClientRecord) -> None:
            r = _record(c, events.get(c.id), t_start, dilation)
            records.append(r)
            stream(r)
            if progress is not None:
                progress(1)

        replay(url, reqs, on_record, dilation=dilation, timeout=opts.request_timeout_s,
                    max_concurrency=spec.engine.max_concurrency, alive=server.dead if server else None,
                    start=t_start, admission=spec.engine.admission, eos_ids=served.eos_ids)
        complete = True
    finally:
        stream.close()
        counters = _counters(url)  # the plugin's, from /server_info; a dead server's last saved file else
        if counters is None and (out / "counters.json").exists():
            counters = json.loads((out / "counters.json").read_text())
        if server is not None:
            server.stop()

        def make_summary() -> dict[str, Any]:
            s = run_summary(spec, records, engine_kind=ENGINE_KIND, kv_capacity_tokens=kv_capacity(spec),
                            counters={k: v for k, v in (counters or {}).items() if isinstance(v, (int, float))},
                            wall_s=time.perf_counter() - wall0, complete=complete)
            s.update({"model": served.name, "paced": opts.pace, "dilation": dilation,
                      "breakdown_from_server": server is not None,
                      # SGLang's admission knobs as the server got them; null: a --url server's own
                      "server_admission_env": admission_env(spec.engine) if server is not None else None})
            return s

        summary = write_results(out, records, make_summary)
    return summary


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


__all__ = ["LiveOptions", "live_run", "write_results", "ReplayError", "kv_capacity"]
