"""Policy names, method presets, and building policy objects from validated knob sections.

A *method* is a (scheduler, eviction) pair; ``--scheduler`` and ``--eviction`` combine them freely. The
registry lists each policy as ``module:Class`` (a module of ``prism.policies``, or a dotted module path for
a policy kept elsewhere); the class declares the rest (:class:`~prism.policies.base.Policy`): its name, its
knob dataclass, filled from the YAML/``--set`` section of that name (``lpm.fcfs_threshold``, ``qas.q_cold``,
...), how a run builds it, and for a scheduler how it is deployed (inside the engine, ordering its waiting
queue, or as an admission front end that orders each window of arrivals before an unmodified FCFS engine).
An engine runs whatever :func:`make_policies` hands it and never asks which policy that is.

A new scheduler is one file in ``policies/`` (a :class:`~prism.policies.base.Scheduler` subclass with a
``name``) and one line in :data:`SCHEDULERS`.

Classes are imported on first use, so that a run imports only the policies it runs: QAS's compiled kernels
(numba) cost a few hundred milliseconds to import, several times the
start of a whole FCFS run. So the registry's names are the knob sections too: a policy's section is its name,
unless it declares another (DFS-weight reads LPM's).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from prism.config import build
from prism.errors import UserError

from prism.policies.base import Deployment, DemandHints, EvictionPolicy, Part, Policy, Scheduler
from prism.policies.routing import Router

SCHEDULERS: dict[str, str] = {
    "fcfs": "fcfs:FCFS",
    "lpm": "lpm:LPM",
    "dfs_weight": "lpm:DFSWeight",
    "klpm": "klpm:KLPM",
    "contextpilot": "contextpilot:ContextPilot",
    "qas": "qas_compiled:CompiledQAS",
}

EVICTIONS: dict[str, str] = {
    "lru": "eviction:LRU",
    "lfu": "eviction:LFU",
    "lru_active": "eviction:LRUActive",
    "dart": "dart:DART",
    "belady": "belady:Belady",  # an offline reference: it knows the trace
}

#: routing policies of a cluster (``cluster.router``)
ROUTERS: dict[str, str] = {
    "rr": "round_robin:RoundRobin",
    "least_load": "least_load:LeastLoad",
    "cache_aware": "cache_aware:CacheAware",
    "lmetric": "lmetric:LMetric",
}

#: how several models share a fleet of GPUs (``fleet.sharing``; ``policies/sharing.py``)
SHARING: dict[str, str] = {
    "dedicated": "sharing_dedicated:Dedicated",
    "static": "sharing_static:Static",
    "muxserve": "sharing_muxserve:MuxServe",
    "timeshare": "sharing_timeshare:TimeShare",
    "prism": "sharing_prism:PrismSharing",
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

#: what a stock server's scheduler is behind an admission front end: it serves requests in arrival order
FRONT_END_ENGINE_SCHEDULER = "fcfs"


def policy_class(table: Mapping[str, str], name: str) -> type[Policy]:
    """The class ``table[name]`` names, its module imported on first use."""
    module, _, cls = table[name].partition(":")
    return getattr(importlib.import_module(module if "." in module else f"prism.policies.{module}"), cls)


def knob_sections() -> set[str]:
    """Names of the YAML / ``--set`` sections that may hold policy knobs (a section of a policy without
    knobs is refused where a run reads it, :func:`policy_configs`)."""
    return set(SCHEDULERS) | set(EVICTIONS)


def router_sections() -> set[str]:
    """Names of the sections that may hold routing-policy knobs."""
    return set(ROUTERS)


def sharing_sections() -> set[str]:
    """Names of the sections that may hold a sharing scheme's knobs."""
    return set(SHARING)


def check_sharing(name: str, where: str | None = None) -> str:
    if name not in SHARING:
        raise UserError(f"unknown sharing scheme {name!r} (known: {', '.join(SHARING)})", where)
    return name


def sharing_config(name: str, knobs: Mapping[str, Any] | None = None, where: str = "") -> dict[str, Any]:
    """The validated knob dataclass of the scheme's section ({} for a scheme without knobs)."""
    return _knobs(policy_class(SHARING, check_sharing(name)), knobs, where)


def make_sharing(name: str, configs: Mapping[str, Any]):
    """A fresh sharing scheme from validated knobs (:func:`sharing_config`)."""
    cls = policy_class(SHARING, check_sharing(name))
    section = cls.knob_section()
    return cls.build(configs.get(section) if section else None, DemandHints(), ())


def _knobs(cls: type[Policy], knobs: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """{section: validated knob dataclass} of one policy class ({} without knobs)."""
    section = cls.knob_section()
    if section is None:
        return {}
    return {section: build(cls.Knobs, (knobs or {}).get(section), f"{where}{section}")}


def check_router(name: str) -> str:
    if name not in ROUTERS:
        raise UserError(f"unknown router {name!r} (known: {', '.join(ROUTERS)})")
    return name


def router_config(name: str, knobs: Mapping[str, Any] | None = None, where: str = "") -> dict[str, Any]:
    """The validated knob dataclass of the router's section ({} for a router without knobs)."""
    return _knobs(policy_class(ROUTERS, check_router(name)), knobs, where)


def router_section(name: str) -> str | None:
    """The knob section the router reads (None: it has no knobs)."""
    return policy_class(ROUTERS, check_router(name)).knob_section()


def make_router(name: str, configs: Mapping[str, Any]) -> Router:
    """A fresh routing policy from validated knobs (:func:`router_config`; a missing section: the defaults)."""
    cls = policy_class(ROUTERS, check_router(name))
    section = cls.knob_section()
    return cls.build(configs.get(section) if section else None, DemandHints(), ())


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


@dataclass(frozen=True)
class Ablation:
    """A method's ablation: the method, its base engine's method (what its policies add their parts to, see
    :class:`~prism.policies.base.Policy`) and, per part, the method whose run has the part switched off (the
    method itself, or the method with the policy the part names in place of its own) and the part's knobs."""

    method: str
    base: str
    parts: tuple[tuple[Part, str], ...]


def ablation(method: str, knobs: Mapping[str, Any] | None = None, where: str = "") -> Ablation:
    """The ablation of ``method`` with these knob sections (its policies' parts, scheduler first)."""
    label, sched, evict = resolve_method(method)
    configs = policy_configs(sched, evict, knobs, where)
    parts: list[tuple[Part, str]] = []
    bases = []
    for table, name in ((SCHEDULERS, sched), (EVICTIONS, evict)):
        cls = policy_class(table, name)
        bases.append(cls.base(configs.get(cls.knob_section()) if cls.Knobs is not None else None))
        for part in cls.parts:
            pair = (part.replaced or sched, evict) if table is SCHEDULERS else (sched, part.replaced or evict)
            parts.append((part, resolve_method(None, *pair)[0]))
    if not parts:
        raise UserError(f"method {method!r} has no parts to switch off (methods with parts: "
                        f"{', '.join(m for m in METHODS if _has_parts(m))}, or pairs of their policies)")
    return Ablation(label, resolve_method(None, *bases)[0], tuple(parts))


def _has_parts(method: str) -> bool:
    sched, evict = METHODS[method]
    return bool(policy_class(SCHEDULERS, sched).parts or policy_class(EVICTIONS, evict).parts)


def policy_configs(scheduler: str, eviction: str, knobs: Mapping[str, Any] | None = None,
                   where: str = "") -> dict[str, Any]:
    """The validated knob dataclass of each section the scheduler and the eviction policy read (a typo in a
    knob fails here, before a long run); errors name ``where`` and the section."""
    configs: dict[str, Any] = {}
    for cls in (policy_class(SCHEDULERS, scheduler), policy_class(EVICTIONS, eviction)):
        if cls.knob_section() not in configs:
            configs.update(_knobs(cls, knobs, where))
    return configs


def dilated(scheduler: str, eviction: str, configs: Mapping[str, Any], dilation: float) -> dict[str, Any]:
    """The knobs as a clock ``dilation`` times slower reads them (a paced twin's): each policy's
    ``clock_knobs`` multiplied by ``dilation``, the other knobs as they are."""
    out = dict(configs)
    for table, name in ((SCHEDULERS, scheduler), (EVICTIONS, eviction)):
        cls = policy_class(table, name)
        section = cls.knob_section()
        if cls.clock_knobs and section in out and dilation != 1:
            knobs = out[section]
            out[section] = replace(knobs, **{k: getattr(knobs, k) * dilation for k in cls.clock_knobs})
    return out


def deployment_of(scheduler: str, configs: Mapping[str, Any]) -> Deployment:
    """How ``scheduler``, with its validated knobs (from :func:`policy_configs`), is deployed."""
    cls = policy_class(SCHEDULERS, scheduler)
    return cls.deployment(configs.get(cls.knob_section()) if cls.Knobs is not None else None)


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


def _build(cls: type[Policy], configs: Mapping[str, Any], hints: DemandHints, requests: Sequence[Any]) -> Any:
    section = cls.knob_section()
    return cls.build(configs[section] if section is not None else None, hints, requests)


def make_policies(scheduler: str, eviction: str, configs: Mapping[str, Any], deployment: Deployment = Deployment(),
                  requests: Sequence[Any] = ()) -> Policies:
    """Fresh policy objects for one run, from validated knobs (:func:`policy_configs`), placed as
    ``deployment`` says (:func:`deployment_of`). ``requests`` (the trace) is only read by offline references
    such as ``belady``."""
    hints = DemandHints()
    sched = _build(policy_class(SCHEDULERS, scheduler), configs, hints, requests)
    evict = _build(policy_class(EVICTIONS, eviction), configs, hints, requests)
    if evict.hints is not hints:  # a policy built without the run's hints (the oracle) shares them
        evict.hints = hints
    if deployment.front_end:
        engine = _build(policy_class(SCHEDULERS, engine_scheduler(scheduler, deployment)), configs, hints, requests)
        return Policies(engine, evict, hints, front_end=sched)
    return Policies(sched, evict, hints)
