"""Policy names, method presets, and building policy objects from validated knob sections.

A *method* is a (scheduler, eviction) pair; ``--scheduler`` and ``--eviction`` combine them freely. Each
policy with knobs has a config dataclass, filled from the YAML/``--set`` section of the same name
(``lpm.fcfs_threshold``, ``qas.q_cold``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from prism.config import build
from prism.errors import UserError

from prism.policies.base import DemandHints, EvictionPolicy, Scheduler
from prism.policies.belady import Belady
from prism.policies.contextpilot import ContextPilot, ContextPilotConfig
from prism.policies.dart import DART, DARTConfig
from prism.policies.eviction import LFU, LRU, LRUActive
from prism.policies.fcfs import FCFS
from prism.policies.klpm import KLPM, KLPMConfig
from prism.policies.lpm import LPM, DFSWeight, LPMConfig
from prism.policies.qas import QAS, QASConfig


@dataclass(frozen=True)
class PolicyEntry:
    factory: Callable[..., Any]  # (config or None, hints, trace requests) -> policy
    config: type | None = None  # knob dataclass; its section name is the policy name
    section: str | None = None


SCHEDULERS: dict[str, PolicyEntry] = {
    "fcfs": PolicyEntry(lambda cfg, hints, reqs: FCFS()),
    "lpm": PolicyEntry(lambda cfg, hints, reqs: LPM(cfg), LPMConfig, "lpm"),
    "dfs_weight": PolicyEntry(lambda cfg, hints, reqs: DFSWeight(cfg), LPMConfig, "lpm"),
    "klpm": PolicyEntry(lambda cfg, hints, reqs: KLPM(cfg), KLPMConfig, "klpm"),
    "contextpilot": PolicyEntry(lambda cfg, hints, reqs: ContextPilot(cfg), ContextPilotConfig, "contextpilot"),
    "qas": PolicyEntry(lambda cfg, hints, reqs: QAS(cfg), QASConfig, "qas"),
}

EVICTIONS: dict[str, PolicyEntry] = {
    "lru": PolicyEntry(lambda cfg, hints, reqs: LRU(hints)),
    "lfu": PolicyEntry(lambda cfg, hints, reqs: LFU(hints)),
    "lru_active": PolicyEntry(lambda cfg, hints, reqs: LRUActive(hints)),
    "dart": PolicyEntry(lambda cfg, hints, reqs: DART(cfg, hints), DARTConfig, "dart"),
    "belady": PolicyEntry(lambda cfg, hints, reqs: Belady(reqs)),  # offline reference: knows the trace
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


def _config(entry: PolicyEntry, knobs: dict[str, Any], where: str):
    if entry.config is None:
        return None
    return build(entry.config, knobs.get(entry.section), f"{where}{entry.section}")


def make_policies(scheduler: str, eviction: str, knobs: dict[str, Any] | None = None,
                  where: str = "", requests: Sequence[Any] = ()) -> tuple[Scheduler, EvictionPolicy, DemandHints]:
    """Build a scheduler and an eviction policy that share one :class:`DemandHints`.

    ``requests`` (the trace) is only read by offline references such as ``belady``.
    """
    knobs = knobs or {}
    hints = DemandHints()
    s_entry, e_entry = SCHEDULERS[scheduler], EVICTIONS[eviction]
    sched = s_entry.factory(_config(s_entry, knobs, where), hints, requests)
    evict = e_entry.factory(_config(e_entry, knobs, where), hints, requests)
    if evict.hints is not hints:
        evict.hints = hints
    return sched, evict, hints
