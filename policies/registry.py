"""Policy names, method presets, and building policy objects from validated knob sections.

A *method* is a (scheduler, eviction) pair; ``--scheduler`` and ``--eviction`` combine them freely. Each
policy with knobs has a config dataclass, filled from the YAML/``--set`` section of the same name
(``lpm.fcfs_threshold``, ``qas.q_cold``, ...).

The registry also says how a scheduler is *deployed* (:class:`Deployment`): inside the engine, ordering its
waiting queue, or as an admission front end that orders each window of arrivals before an unmodified FCFS
engine. An engine runs whatever :func:`make_policies` hands it and never asks which policy that is.

Entries name their classes as ``module:Class`` of ``prism.policies`` and import them on first use, so that a
run imports only the policies it runs: QAS's compiled kernels (numba) and ContextPilot's clustering (scipy)
cost a few hundred milliseconds to import, several times the start of a whole FCFS run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from prism.config import build
from prism.errors import UserError

from prism.policies.base import DemandHints, EvictionPolicy, Scheduler
from prism.policies.routing import Router


IN_ENGINE = "in_engine"
FRONT_END = "front_end"


@dataclass(frozen=True)
class Deployment:
    """How a scheduler meets the engine: ``in_engine`` (it orders the engine's waiting queue at every
    scheduling round), or ``front_end`` (it orders each window of ``window_s`` seconds of arrivals, which then
    reach an unmodified engine whose own scheduler is :data:`FRONT_END_ENGINE_SCHEDULER`)."""

    mode: str = IN_ENGINE
    window_s: float = 0.0

    @property
    def front_end(self) -> bool:
        return self.mode == FRONT_END


#: what a stock server's scheduler is behind an admission front end: it serves requests in arrival order
FRONT_END_ENGINE_SCHEDULER = "fcfs"


def _lazy(path: str) -> Any:
    """The object ``module:name`` names in ``prism.policies``, importing its module on first use."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(f"prism.policies.{module}"), name)


@dataclass(frozen=True)
class PolicyEntry:
    factory: Callable[..., Any]  # (config or None, hints, trace requests) -> policy
    config_ref: type | str | None = None  # knob dataclass, or its "module:Class"; its section name is the policy name
    section: str | None = None
    deployment: Callable[[Any], Deployment] | None = None  # (config) -> deployment; None: in the engine

    @property
    def config(self) -> type | None:
        return _lazy(self.config_ref) if isinstance(self.config_ref, str) else self.config_ref


def _qas_deployment(cfg: Any) -> Deployment:  # cfg: a QASConfig
    return Deployment(FRONT_END, cfg.window_s) if cfg.window_s > 0 else Deployment()


SCHEDULERS: dict[str, PolicyEntry] = {
    "fcfs": PolicyEntry(lambda cfg, hints, reqs: _lazy("fcfs:FCFS")()),
    "lpm": PolicyEntry(lambda cfg, hints, reqs: _lazy("lpm:LPM")(cfg), "lpm:LPMConfig", "lpm"),
    "dfs_weight": PolicyEntry(lambda cfg, hints, reqs: _lazy("lpm:DFSWeight")(cfg), "lpm:LPMConfig", "lpm"),
    "klpm": PolicyEntry(lambda cfg, hints, reqs: _lazy("klpm:KLPM")(cfg), "klpm:KLPMConfig", "klpm"),
    "contextpilot": PolicyEntry(lambda cfg, hints, reqs: _lazy("contextpilot:ContextPilot")(cfg),
                                "contextpilot:ContextPilotConfig", "contextpilot"),
    "qas": PolicyEntry(lambda cfg, hints, reqs: _lazy("qas:QAS")(cfg), "qas:QASConfig", "qas", _qas_deployment),
}

EVICTIONS: dict[str, PolicyEntry] = {
    "lru": PolicyEntry(lambda cfg, hints, reqs: _lazy("eviction:LRU")(hints)),
    "lfu": PolicyEntry(lambda cfg, hints, reqs: _lazy("eviction:LFU")(hints)),
    "lru_active": PolicyEntry(lambda cfg, hints, reqs: _lazy("eviction:LRUActive")(hints)),
    "dart": PolicyEntry(lambda cfg, hints, reqs: _lazy("dart:DART")(cfg, hints), "dart:DARTConfig", "dart"),
    # offline reference: knows the trace
    "belady": PolicyEntry(lambda cfg, hints, reqs: _lazy("belady:Belady")(reqs)),
}

#: routing policies of a cluster (``cluster.router``); factories take (config or None, None, ())
ROUTERS: dict[str, PolicyEntry] = {
    "rr": PolicyEntry(lambda cfg, hints, reqs: _lazy("round_robin:RoundRobin")()),
    "least_load": PolicyEntry(lambda cfg, hints, reqs: _lazy("least_load:LeastLoad")()),
    "cache_aware": PolicyEntry(lambda cfg, hints, reqs: _lazy("cache_aware:CacheAware")(cfg),
                               "cache_aware:CacheAwareConfig", "cache_aware"),
    "lmetric": PolicyEntry(lambda cfg, hints, reqs: _lazy("lmetric:LMetric")(cfg), "lmetric:LMetricConfig", "lmetric"),
}

#: method preset -> (scheduler, eviction)
METHODS: dict[str, tuple[str, str]] = {
    "sglang": ("lpm", "lru"),
    "fcfs": ("fcfs", "lru"),
    "dfs_weight": ("dfs_weight", "lru"),
    "klpm": ("klpm", "lru"),
    "contextpilot": ("contextpilot", "lru"),
    "prism": ("qas", "dart"),
}


def knob_sections() -> set[str]:
    """Names of the YAML / ``--set`` sections that hold policy knobs."""
    return {e.section for e in (*SCHEDULERS.values(), *EVICTIONS.values()) if e.section}


def router_sections() -> set[str]:
    """Names of the sections that hold routing-policy knobs."""
    return {e.section for e in ROUTERS.values() if e.section}


def check_router(name: str) -> str:
    if name not in ROUTERS:
        raise UserError(f"unknown router {name!r} (known: {', '.join(ROUTERS)})")
    return name


def router_config(name: str, knobs: Mapping[str, Any] | None = None, where: str = "") -> dict[str, Any]:
    """The validated knob dataclass of the router's section ({} for a router without knobs)."""
    entry = ROUTERS[check_router(name)]
    if entry.config is None:
        return {}
    return {entry.section: build(entry.config, (knobs or {}).get(entry.section), f"{where}{entry.section}")}


def make_router(name: str, configs: Mapping[str, Any]) -> Router:
    """A fresh routing policy from validated knobs (:func:`router_config`; a missing section: the defaults)."""
    entry = ROUTERS[check_router(name)]
    return entry.factory(configs.get(entry.section) if entry.section else None, None, ())


def resolve_method(method: str | None, scheduler: str | None = None,
                   eviction: str | None = None) -> tuple[str, str, str]:
    """(label, scheduler, eviction) for a preset or a ``SCHEDULER+EVICTION`` pair; an explicit scheduler or
    eviction overrides that half of the method. The label is the method's name as given, else the pair."""
    if method is not None and "+" in method:
        base_s, base_e = method.split("+", 1)
    elif method is not None and method not in METHODS:
        raise UserError(f"unknown method {method!r} (known: {', '.join(METHODS)}, or SCHEDULER+EVICTION)")
    else:
        base_s, base_e = METHODS[method or "sglang"]
    s, e = scheduler or base_s, eviction or base_e
    if s not in SCHEDULERS:
        raise UserError(f"unknown scheduler {s!r} (known: {', '.join(SCHEDULERS)})")
    if e not in EVICTIONS:
        raise UserError(f"unknown eviction {e!r} (known: {', '.join(EVICTIONS)})")
    if method and (s, e) == (base_s, base_e):
        return method, s, e
    preset = next((k for k, v in METHODS.items() if v == (s, e)), None)
    return (preset if preset and not method else f"{s}+{e}"), s, e


def policy_configs(scheduler: str, eviction: str, knobs: Mapping[str, Any] | None = None,
                   where: str = "") -> dict[str, Any]:
    """The validated knob dataclass of each section the scheduler and the eviction policy read (a typo in a
    knob fails here, before a long run); errors name ``where`` and the section."""
    knobs = knobs or {}
    configs = {}
    for entry in (SCHEDULERS[scheduler], EVICTIONS[eviction]):
        if entry.config is not None and entry.section not in configs:
            configs[entry.section] = build(entry.config, knobs.get(entry.section), f"{where}{entry.section}")
    return configs


def deployment_of(scheduler: str, configs: Mapping[str, Any]) -> Deployment:
    """How ``scheduler``, with its validated knobs (from :func:`policy_configs`), is deployed."""
    entry = SCHEDULERS[scheduler]
    if entry.deployment is None:
        return Deployment()
    return entry.deployment(configs[entry.section])


def engine_scheduler(scheduler: str, deployment: Deployment) -> str:
    """The scheduler the engine itself runs: ``scheduler``, or behind a front end the stock server's."""
    return FRONT_END_ENGINE_SCHEDULER if deployment.front_end else scheduler


@dataclass
class Policies:
    """The policy objects of one run, sharing one :class:`DemandHints`."""

    scheduler: Scheduler  # orders the engine's waiting queue
    eviction: EvictionPolicy
    hints: DemandHints
    front_end: Scheduler | None = None  # orders each window of arrivals before the engine (front-end deployment)

    def stats(self) -> dict[str, int]:
        """The schedulers' own counters."""
        return {**self.scheduler.stats(), **(self.front_end.stats() if self.front_end is not None else {})}


def _policy(entry: PolicyEntry, configs: Mapping[str, Any], hints: DemandHints, requests: Sequence[Any]):
    return entry.factory(configs[entry.section] if entry.config is not None else None, hints, requests)


def make_policies(scheduler: str, eviction: str, configs: Mapping[str, Any], deployment: Deployment = Deployment(),
                  requests: Sequence[Any] = ()) -> Policies:
    """Fresh policy objects for one run, from validated knobs (:func:`policy_configs`), placed as
    ``deployment`` says (:func:`deployment_of`). ``requests`` (the trace) is only read by offline references
    such as ``belady``."""
    hints = DemandHints()
    sched = _policy(SCHEDULERS[scheduler], configs, hints, requests)
    evict = _policy(EVICTIONS[eviction], configs, hints, requests)
    if evict.hints is not hints:
        evict.hints = hints
    if deployment.front_end:
        return Policies(_policy(SCHEDULERS[engine_scheduler(scheduler, deployment)], configs, hints, requests),
                        evict, hints, front_end=sched)
    return Policies(sched, evict, hints)
