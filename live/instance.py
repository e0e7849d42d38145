"""One SGLang server of a live run: the live counterpart of the simulator's :class:`~prism.sim.instance.Instance`.

A :class:`ServerInstance` is started with the method's server arguments and the prism plugin switched on (or
attached to by ``--url``), waited for until healthy, checked to run the plugin in its scheduler, warmed up
and emptied, read (the plugin's per-request event log and counters) and stopped. A single live run and a
cluster of N servers (``prism-live --instances N``) both run their servers through it (``live/run.py``).

Per-request admission and prefill times come from the plugin's event log in the scheduler process (same
machine, same monotonic clock); the client measures arrival, first token and finish. Attached to a server
that prism did not start, the log is not available: prefill start and end are then reported as the first
token's time (TTFT stays exact; its split into admission wait and prefill does not exist).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prism.errors import UserError
from prism.metrics import RequestRecord
from prism.policies.registry import engine_scheduler
from prism.settings import RunSpec

from prism.live.client import ClientRecord
from prism.live.hooks import BACKEND, CONFIG_ENV, NATIVE_SCHEDULERS, PluginConfig
from prism.live.model import ServedModel
from prism.live.server import SERVER_HOST, Server, admission_env, flush_cache, http_json, wait_healthy


def device_of(device: str) -> str:
    """``auto``: cuda where ``nvidia-smi`` exists, else cpu."""
    if device != "auto":
        return device
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def server_args(spec: RunSpec, model: ServedModel, port: int, device: str, dtype: str = "auto") -> list[str]:
    """``python -m sglang.launch_server``'s arguments for a server of ``spec``'s run: the engine's limits as
    SGLang's server arguments, the method's native scheduling policy (or FCFS under prism's), prism's cache."""
    e = spec.engine
    args = ["--model-path", str(model.path), "--load-format", model.load_format, "--skip-tokenizer-init",
            "--host", SERVER_HOST, "--port", str(port),
            "--max-total-tokens", str(spec.kv_capacity_of()), "--page-size", str(e.page_size),
            "--chunked-prefill-size", str(e.chunked_prefill_size), "--max-prefill-tokens", str(e.max_prefill_tokens),
            "--max-running-requests", str(e.max_running_requests),
            "--schedule-policy", NATIVE_SCHEDULERS.get(engine_scheduler(spec.scheduler, spec.deployment), "fcfs"),
            "--radix-cache-backend", BACKEND, "--disable-overlap-schedule", "--random-seed", "0",
            "--log-level", "warning"]
    if dtype != "auto":
        args += ["--dtype", dtype]
    if device == "cpu":
        args += ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
    return args


class EventLog:
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
                    if "ev" in ev:  # a batch or a retraction (--timeline), not a request's line
                        continue
                    self.by_id.setdefault(ev["id"], ev)  # a retracted request prefills again: keep the first
        return self.by_id.get(rid)


class ServerInstance:
    """Server ``index`` of a run: its URL, its folder (log, plugin settings, counters, event logs) and, when
    prism started it, its process."""

    def __init__(self, index: int, url: str, folder: Path, server: Server | None = None) -> None:
        self.index, self.url, self.folder, self.server = index, url.rstrip("/"), folder, server
        self.events = EventLog(folder / "events.jsonl" if server is not None else None)

    @classmethod
    def start(cls, index: int, spec: RunSpec, model: ServedModel, folder: Path, port: int, device: str,
              pace: bool, dilation: float, dtype: str = "auto", python: str | None = None,
              iterations: bool = False, segments: Path | None = None) -> "ServerInstance":
        """Start a server of ``spec``'s run on ``SERVER_HOST``:``port`` with the plugin (it returns at once: see
        :meth:`wait_ready`); ``iterations``: its event log records every batch (a timeline's); ``segments``: the
        run's table of requests by rid (behind sglang-router)."""
        plugin = folder / "plugin.json"
        PluginConfig.of(spec, folder, pace, dilation, iterations, segments).write(plugin)
        env = {CONFIG_ENV: str(plugin.resolve()), "SGLANG_ENABLE_WAITING_PREFIX_REFRESH": "0",
               **admission_env(spec.engine)}
        if device == "cpu":
            env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        server = Server(server_args(spec, model, port, device, dtype), env, folder / "server.log", python)
        return cls(index, f"http://{SERVER_HOST}:{port}", folder, server)

    @classmethod
    def attach(cls, url: str, folder: Path) -> "ServerInstance":
        """A server that prism did not start (``--url``): no event log, its own settings."""
        return cls(0, url, folder)

    # ---------------------------------------------------------------- start-up
    def wait_ready(self, timeout_s: float) -> None:
        wait_healthy(self.url, timeout_s, self.server)

    def warm_up(self, vocab: int) -> None:
        """Two short requests (the first forward passes compile and allocate), then an empty cache; and for a
        server prism started, proof that the plugin runs in its scheduler."""
        for n in (16, 48):
            payload = {"input_ids": [(7 * i + 3) % (vocab - 2) + 2 for i in range(n)],
                       "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0}}
            http_json(f"{self.url}/generate", payload, timeout=300)
        flush_cache(self.url)
        if self.server is not None and self.counters() is None:
            raise UserError(f"the prism plugin is not active in the scheduler of server {self.index} (is "
                            "prism-serve installed in the server's environment? see "
                            f"{self.server.log_path})")

    # ---------------------------------------------------------------- while it serves
    def dead(self) -> str | None:
        """Why the server is gone, or None while it runs (an attached server is not watched)."""
        return self.server.dead() if self.server is not None else None

    def record(self, c: ClientRecord, t0: float, dilation: float, instance: int | None = None) -> RequestRecord:
        """A finished request's record: the client's times, and the plugin's admission and prefill times
        (``t0``: the replay's time zero on the monotonic clock) where the event log has them."""
        ev = self.events.get(c.id)
        if ev is None:
            start = end = c.first_token
            lane, realigned = "", False
        else:
            start, end = (ev["prefill_start"] - t0) / dilation, (ev["prefill_end"] - t0) / dilation
            lane, realigned = ev.get("lane", ""), bool(ev.get("realigned"))
        return RequestRecord(c.id, c.arrival, c.sent, start, end, c.first_token, c.finish, c.prompt_tokens,
                             c.hit_tokens, c.output_tokens, lane, realigned, instance)

    def counters(self) -> dict | None:
        """The plugin's counters from ``/server_info``; a dead server's last saved file else (None: neither)."""
        try:
            info = http_json(f"{self.url}/server_info")
        except OSError:
            info = None
        states = info.get("internal_states") if isinstance(info, dict) else None
        if isinstance(states, list) and states and isinstance(states[0], dict) and "prism" in states[0]:
            return states[0]["prism"]
        saved = self.folder / "counters.json"
        if self.server is not None and saved.exists():
            return json.loads(saved.read_text())
        return None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


__all__ = ["ServerInstance", "EventLog", "server_args", "device_of"]
