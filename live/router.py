"""sglang-router 0.3.2 (the Rust router on PyPI, ``pip install sglang-router``) in front of a live cluster.

``prism-live --instances N --router sglang_router`` starts the N servers as for any cluster, then the real
router with its cache-aware policy in front of them (``python -m sglang_router.launch_router --policy
cache_aware``, the thresholds from the run's ``cache_aware`` section, so that the simulator's model of the router
and the router itself run on the same knobs), and replays the trace through the router's ``/generate``.

What survives the router, seen on 0.3.2 in front of stub workers (``tests/live/test_live_router.py``): it
re-serializes a typed request, keeping ``input_ids``, ``rid``, ``stream`` and the sampling parameters it knows
(``max_new_tokens``, ``temperature``, ``ignore_eos``...), and drops ``sampling_params.custom_params`` and
``logit_bias``. So each server is started with a table of the run's requests by ``rid`` (``segments.json``: the
segment metadata the client would send, and the EOS ban of ``engine.admission: sglang``), which the plugin
applies to a request that arrives without them (:func:`prism.live.hooks._arrive`). The router's choice is read
back from the servers: a request's instance is the one whose event log has it (:func:`placement`).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from prism.errors import UserError
from prism.output import write_atomic_text
from prism.policies.cache_aware import CacheAwareConfig
from prism.traces.trace import Trace

from prism.live.requests import length_params, segment_meta
from prism.live.server import SERVER_HOST, Server

REAL_ROUTER = "sglang_router"
MODULE = "sglang_router.launch_router"
VERSION = "0.3.2"  # the release whose behaviour this module was checked against


def check_installed(python: str | None = None) -> None:
    """sglang-router importable by the interpreter that will run it (the servers' one), at the checked release."""
    if python is None:
        found = importlib.util.find_spec("sglang_router") is not None
        version = _version_here() if found else None
    else:
        out = subprocess.run([python, "-c", "import sglang_router.version as v; print(v.__version__)"],
                             capture_output=True, text=True)
        found, version = out.returncode == 0, out.stdout.strip() or None
    if not found:
        raise UserError("--router sglang_router needs the sglang-router package (pip install -e '.[router]', "
                        f"sglang-router=={VERSION})", "--router")
    if version != VERSION:
        raise UserError(f"sglang-router {version} is installed; this run was checked against {VERSION} "
                        f"(pip install sglang-router=={VERSION})", "--router")


def _version_here() -> str | None:
    try:
        from sglang_router.version import __version__
    except ImportError:
        return None
    return __version__


def router_args(urls: Sequence[str], port: int, cfg: CacheAwareConfig, metrics_port: int) -> list[str]:
    """The launcher's arguments: the cache-aware policy on the run's knobs, in front of ``urls``; its Prometheus
    exporter on ``metrics_port`` (0.3.2 binds 0.0.0.0:29000 by default and panics when another router holds it)."""
    interval = cfg.eviction_interval_s
    if interval != int(interval):
        raise UserError(f"cache_aware.eviction_interval_s={interval}: sglang-router takes whole seconds",
                        "--router sglang_router")
    return ["--worker-urls", *urls, "--policy", "cache_aware", "--host", SERVER_HOST, "--port", str(port),
            "--cache-threshold", repr(cfg.cache_threshold),
            "--balance-abs-threshold", str(cfg.balance_abs_threshold),
            "--balance-rel-threshold", repr(cfg.balance_rel_threshold),
            "--eviction-interval-secs", str(int(interval)), "--max-tree-size", str(cfg.max_tree_size),
            "--prometheus-host", SERVER_HOST, "--prometheus-port", str(metrics_port), "--log-level", "warn"]


def free_port() -> int:
    """A port no one listens on now, for the router's metrics exporter."""
    with socket.socket() as s:
        s.bind((SERVER_HOST, 0))
        return s.getsockname()[1]


def write_segment_table(trace: Trace, path: Path, admission: str, eos_ids: tuple[int, ...]) -> Path:
    """rid -> what the router drops: the segment metadata and, under SGLang's admission, the EOS ban."""
    bias = length_params(1, admission, eos_ids).get("logit_bias")
    table = {}
    for r in trace.requests:
        entry = segment_meta(r)
        if bias:
            entry["prism_logit_bias"] = bias
        table[f"prism-{r.id}"] = entry
    write_atomic_text(path, json.dumps(table, separators=(",", ":")))
    return path


class RealRouter:
    """The router process (its log in the run folder), started once the servers are healthy."""

    def __init__(self, urls: Sequence[str], port: int, cfg: CacheAwareConfig, folder: Path,
                 python: str | None = None) -> None:
        self.url = f"http://{SERVER_HOST}:{port}"
        self.process = Server(router_args(urls, port, cfg, free_port()), {}, folder / "router.log", python,
                              module=MODULE, name="sglang-router")

    def wait_ready(self, timeout_s: float, workers: int) -> None:
        """Until its ``/readiness`` counts all ``workers`` healthy (``/health`` answers 200 before the router has
        health-checked them: a request sent then is refused, 503 ``no_available_workers``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if why := self.process.dead():
                raise UserError(why)
            try:
                with urllib.request.urlopen(f"{self.url}/readiness", timeout=2.0) as r:
                    if r.status == 200 and json.loads(r.read()).get("healthy_workers") == workers:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
                pass
            time.sleep(0.25)
        raise UserError(f"sglang-router at {self.url} did not count its {workers} workers healthy within "
                        f"{timeout_s:.0f} s (log: {self.process.log_path})")

    def dead(self) -> str | None:
        return self.process.dead()

    def stop(self) -> None:
        self.process.stop(grace=5.0)


def placement(rid: int, event_logs: Sequence) -> int | None:
    """The instance whose event log has request ``rid`` (it was prefilled there), or None."""
    found = [i for i, log in enumerate(event_logs) if log.get(rid) is not None]
    if len(found) > 1:
        raise RuntimeError(f"request {rid} was prefilled on instances {found}: the router sent it twice")
    return found[0] if found else None


__all__ = ["RealRouter", "REAL_ROUTER", "check_installed", "router_args", "write_segment_table", "placement"]
