"""One serving instance, the unit of every simulation: an engine with its policies, cache, profile and
counters, and the read-only view a router has of it.

An :class:`Instance` is built in one place for every run: a single engine is a cluster of one instance
without a router, and a cluster (``sim/cluster.py``) puts N of them behind one. Each instance has its own
scheduler, eviction policy and ``DemandHints`` (QAS and DART work per instance), its own radix cache of its
own KV capacity, its own cost profile (``cluster.profiles``: a heterogeneous cluster), and a QAS front end of
its own where the method deploys one.

The view (:class:`~prism.policies.routing.InstanceView`): running and queued requests, the uncached prompt
tokens of its queued requests, and a peek of its cache. Queued prefill tokens are kept only for a router that
reads them (``Router.reads_queued_prefill``): when a request is routed, its uncached tokens here are recorded;
they leave the queue when the engine admits the request. A request the engine later puts back in its queue (a
retraction) is not counted again.
"""

from __future__ import annotations

from typing import Callable

import simpy

from prism.policies.registry import Policies, make_policies
from prism.settings import RunSpec

from prism.sim.engine import Engine, Seq
from prism.sim.events import EngineEvents


class Instance:
    """Instance ``index`` of ``spec``'s run, on the clock ``env``; ``on_finish`` sees each finished request."""

    def __init__(self, index: int, env: simpy.Environment, spec: RunSpec, on_finish: Callable[[Seq], None],
                 track_prefill: bool = False, events: EngineEvents | None = None, host=None,
                 on_admit: Callable[[Seq], None] | None = None, scheduler=None, capacity: int | None = None,
                 name: str | None = None) -> None:
        """``host``: the shared GPU the engine runs on (``sim/fleet.py``); ``on_admit``: told of each admission;
        ``scheduler``: the engine's scheduler in place of the method's (a fleet's per-GPU queue order);
        ``capacity``: its KV pool, where the fleet sets it (default: the run's, checked against its trace);
        ``name``: its engine's label for observers (a timeline's track)."""
        self.index = index
        profile = spec.profile_of(index)
        self.profile = profile.name
        self.capacity = capacity if capacity is not None else spec.kv_capacity_of(index)
        self.policies: Policies = make_policies(spec.scheduler, spec.eviction, spec.policy_configs, spec.deployment,
                                                requests=spec.trace.requests)
        if scheduler is not None:
            self.policies.scheduler = scheduler
        self.track_prefill = track_prefill
        self._on_admit = on_admit
        admit = self._admitted if track_prefill or on_admit is not None else None
        self.engine = Engine(env, spec.engine, profile.cost, self.policies.scheduler, self.policies.eviction,
                             self.capacity, self.policies.hints, on_finish, on_admit=admit, events=events, host=host,
                             name=name)
        self.front = None
        if self.policies.front_end is not None:
            from prism.sim.frontend import FrontEnd  # only a method with a front end imports it

            self.front = FrontEnd(env, self.engine, self.policies.front_end, spec.deployment.window_s,
                                  spec.backlog_limit())
        self.entry = self.front or self.engine
        self.queued_prefill_tokens = 0
        self._estimate: dict[int, int] = {}  # queued request id -> uncached tokens when routed
        self._peek: tuple[bytes | None, int] = (None, 0)

    # ---------------------------------------------------------------- the view
    @property
    def running(self) -> int:
        return len(self.engine.active)

    @property
    def queued(self) -> int:
        return len(self.engine.waiting) + (self.front.held if self.front is not None else 0)

    def match_len(self, key: bytes) -> int:
        """A peek of the cache, remembered for the last key (a router asks each instance once per request,
        and the chosen one is asked again for its estimate)."""
        if self._peek[0] is not key:
            self._peek = (key, self.engine.cache.match_len(key))
        return self._peek[1]

    # ---------------------------------------------------------------- traffic
    def submit(self, seq: Seq) -> None:
        if self.track_prefill:
            est = seq.prompt_len - self.match_len(seq.key)
            self._estimate[seq.id] = est
            self.queued_prefill_tokens += est
            self._peek = (None, 0)
        self.entry.submit(seq)

    def _admitted(self, seq: Seq) -> None:
        est = self._estimate.pop(seq.id, None)
        if est is not None:
            self.queued_prefill_tokens -= est
        if self._on_admit is not None:
            self._on_admit(seq)

    def counters(self) -> dict[str, int]:
        """The engine's counters, the policies' own and the front end's."""
        return {**self.engine.counters, **self.policies.stats(), **(self.front.counters if self.front else {})}
