"""Settings of a simulation run, from a YAML file, ``--set`` overrides and flags, validated at load.

The YAML mapping has these sections (all optional)::

    method: sglang            # a preset, or give scheduler / eviction
    scheduler: lpm
    eviction: lru
    profile: a800-80g:qwen3-4b-instruct-2507   # GPU:MODEL, or a profile YAML
    engine: {max_total_tokens: 32768, chunked_prefill_size: 8192, ...}
    trace: {qps: 60, num_requests: 2048, seed: 0, ...}   # overrides of the trace spec
    lpm: {fcfs_threshold: 128}                            # one section per policy with knobs
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prism.calibration.cost_model import DEFAULT_PROFILE, Profile, load_profile
from prism.config import apply_overrides, build, load_yaml
from prism.errors import UserError
from prism.policies.registry import knob_sections, make_policies, resolve_method
from prism.traces.spec import load_trace
from prism.traces.trace import Trace

from prism.sim.engine import EngineConfig


@dataclass
class SimSettings:
    label: str
    scheduler: str
    eviction: str
    profile: str = DEFAULT_PROFILE
    engine: EngineConfig = field(default_factory=EngineConfig)
    knobs: dict[str, Any] = field(default_factory=dict)
    trace_overrides: dict[str, Any] = field(default_factory=dict)

    def load_profile(self) -> Profile:
        return load_profile(self.profile)

    def load_trace(self, source: str) -> Trace:
        return load_trace(source, self.trace_overrides)

    def qps(self, trace: Trace) -> float | None:
        return self.trace_overrides.get("qps", trace.spec.get("qps"))


def read_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError("a simulation config must be a mapping of sections", path)
    return data


def settings_from(data: dict[str, Any], where: str = "config") -> SimSettings:
    """Validate the whole mapping once; every error names its section and field."""
    allowed = {"method", "scheduler", "eviction", "profile", "engine", "trace"} | knob_sections()
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise UserError(f"unknown section {unknown[0]!r} (known: {', '.join(sorted(allowed))})", where)
    for key in ("method", "scheduler", "eviction", "profile"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise UserError(f"field {key!r}: must be a string", where)
    label, sched, evict = resolve_method(data.get("method"), data.get("scheduler"), data.get("eviction"))
    engine = build(EngineConfig, data.get("engine"), f"{where}: engine")
    trace = data.get("trace") or {}
    if not isinstance(trace, dict):
        raise UserError("section 'trace': must be a mapping of trace-spec fields", where)
    knobs = {k: data[k] for k in knob_sections() if k in data}
    make_policies(sched, evict, knobs, where=f"{where}: ")  # a typo in a knob fails before a long run
    return SimSettings(label, sched, evict, str(data.get("profile") or DEFAULT_PROFILE), engine, knobs, trace)


def merge_flags(data: dict[str, Any], overrides: list[str], **flags: Any) -> dict[str, Any]:
    """Apply ``--set`` overrides, then explicit flags (``qps``/``seed`` go to the trace section)."""
    data = apply_overrides(data, overrides)
    for key in ("method", "scheduler", "eviction", "profile"):
        if flags.get(key) is not None:
            data[key] = flags[key]
    for key in ("qps", "seed", "num_requests"):
        if flags.get(key) is not None:
            data.setdefault("trace", {})
            if not isinstance(data["trace"], dict):
                raise UserError("section 'trace': must be a mapping")
            data["trace"][key] = flags[key]
    return data
