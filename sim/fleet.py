"""Several models sharing a fleet of GPUs (DESIGN §9; Prism, OSDI'26): the fleet simulator.

A fleet is ``fleet.gpus`` GPUs of one kind (``fleet.gpu``), ``gpus_per_node`` to a node, serving the models a
multi-model trace names (``meta.models``: each its profile model, tensor-parallel size and SLOs). A sharing
scheme (``policies/sharing*.py``, behind the registry) decides where models are resident, when one is
activated, evicted or moved, and how much KV each may hold; this module carries that out on one SimPy clock:

* **Engines.** A resident model is a *copy*: one engine (``sim/instance.py``: the run's method, its radix cache,
  admission and retraction) over the model's tp GPUs, with the model's cost profile (``served_profile``). A model
  that moves has two copies for a while: the new one serves new requests, the old one drains.
* **Compute** (``fleet.compute``): ``serial`` (the default): co-located engines' iterations do not overlap; each
  iteration waits for its GPUs (a copy over several GPUs takes them in index order), first come first served,
  or, behind a deadline-ordered queue, the engine with the most urgent work first (a prefill's urgency is its
  earliest on-time TTFT deadline, a decode step's now + the model's TPOT SLO: earliest deadline first).
  ``parallel``: no interference (each engine as if alone), an upper bound.
* **Memory** (``sim/memory.py``: kvcached's pages). Weights are mapped at activation. An *elastic* model maps KV
  pages as its requests need them, up to its balloon limit: before each iteration its engine's KV capacity is
  what it holds plus what it may map now (:meth:`Copy.refresh`), after allocating it reports its KV
  (:meth:`Copy.settle`). Waking a model whose weights do not fit shrinks the other elastic models' limits on its
  GPUs to what they hold for running requests (their cached prefixes go at once, their live KV as requests
  finish: never dropped) until the weights fit, then gives them back the GPU. An engine that cannot admit for
  lack of pages while others hold cached prefixes makes them give those up (cached KV is reclaimable memory).
  A *fixed* model (``dedicated``, ``static``, ``timeshare``) keeps a KV pool of fixed size, mapped at
  activation: SGLang's own sizing on a GPU of its own, or the scheme's share.
* **Activation** (``calibration/loading.py``): evicted -> loading (weights mapped, then engine start: none from
  the engine pool, ``cold_start_s`` otherwise, plus the weights over the host links) -> active; eviction drains
  the model's queued and running requests, then unmaps its pages; a migration loads the new copy (over NVLink
  from the old GPU where the node has it, else from host memory) while the old one serves. Requests for a model
  without an active copy wait for its activation; their wait counts in their TTFT.

Results: every request's record carries its model and GPU(s); the summary's ``fleet`` block has per model and
overall TTFT and TPOT percentiles, SLO attainment (TTFT, TPOT, both) and goodput, the SLOs used, activations,
evictions, migrations, bytes moved and time loading; per GPU memory over time (weights, KV of running requests,
cached prefixes, mapped but unused, free) every ``fleet.sample_s``.

A single-model trace on the ``dedicated`` scheme is served exactly as the single engine serves it: one copy, no
host (no shared compute, no page pool), the same requests.csv byte for byte (tests/test_fleet.py).

Where the models share nothing (``dedicated``: each on GPUs of its own, nothing ever moves) and no client limit
holds their requests together, each model runs on a clock of its own (:meth:`Fleet.parts`): the same records,
summary and memory samples as on one clock (tests/test_fleet.py), at about 1.3 times the models' single engines'
cost a request instead of 2.4 times it (benchmarks/bench_fleet.py: what is left is a memory sample's wake while a
model is busy, and an arrival's event or two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Sequence

import numpy as np

from prism.calibration import profiles
from prism.calibration.cost_model import Profile, served_profile
from prism.calibration.loading import PAGE_BYTES, LoadingConfig, activation_seconds, load_seconds, pages_for_bytes
from prism.core import Request
from prism.counters import DECODE_ITERATIONS, PREFILL_ITERATIONS
from prism.errors import UserError
from prism.metrics import RequestRecord, fleet_summary
from prism.policies.moore_hodgson import DeadlineOrder
from prism.policies.placement import TokenRate
from prism.policies.registry import make_sharing
from prism.policies.sharing import ACTIVE, DRAINING, EVICTED, Action, SharingScheme
from prism.policies.sharing_static import FleetTooSmall
from prism.settings import ONLY_MODEL, RunSpec
from prism.traces.trace import ServedModel, Trace

from prism.sim.clock import due_at
from prism.sim.engine import Seq
from prism.sim.events import EngineEvents
from prism.sim.fleet_gpu import Copy, Gpu, kv_used
from prism.sim.instance import Instance
from prism.sim.memory import GpuMemory, KvLayout
from prism.sim.run import Replay, SimResult



#: simulated seconds of no progress while requests wait after which a fleet is stuck (longer than any idle
#: timeout a scheme waits out before evicting)
STALL_S = 3600.0


class ModelServer:
    """A model of the fleet: its profile, SLOs and demand (the scheme's :class:`~prism.policies.sharing
    .ModelView`), its copies and the requests waiting for it to be activated."""

    def __init__(self, fleet: "Fleet", served: ServedModel, profile: Profile, spec: RunSpec, requests: list[Request],
                 elastic: bool, window_s: float, span: float) -> None:
        self.fleet, self.served, self.profile, self.spec = fleet, served, profile, spec
        self.name, self.tp = served.name, served.tp
        m = profile.model
        self.weight_bytes = m.weight_bytes()
        self.mapped_weight_bytes = pages_for_bytes(self.weight_bytes / self.tp) * PAGE_BYTES
        self.kv_bytes_per_token = m.kv_bytes_per_token(tp=self.tp) * self.tp  # all shards
        self.layout = KvLayout.of(m, self.tp)
        self.elastic = elastic
        self.ttft_slo_s = served.ttft_slo_s if served.ttft_slo_s is not None else math.inf
        self.tpot_slo_s = served.tpot_slo_s if served.tpot_slo_s is not None else math.inf
        self.prefill_speed = 1.0 / profile.cost.b_p  # tokens/s of a large chunked prefill
        self.expected_rate = len(requests) / span
        sizes = [r.prompt_len + r.output_len for r in requests]  # a prompt's length sums its segments'
        self.expected_tokens = sum(sizes) / len(sizes) if sizes else 0.0
        biggest = max(sizes, default=1)
        # SGLang admits only if prompt + max_new + one page < what is free (sim/admission.py): strictly less
        self.min_kv_tokens = biggest + spec.engine.page_size + 1
        # its KV pool on GPUs of its own, as SGLang sizes it (checked against its requests, where it has any)
        self.pool_tokens = (spec.kv_capacity_of() if requests
                            else spec.engine.max_total_tokens or profile.kv_capacity_tokens)
        self.min_kv_bytes = self.layout.pages(self.min_kv_tokens) * PAGE_BYTES * self.tp  # whole blocks
        self.copies: list[Copy] = []
        self.pending: list[Seq] = []
        # the tokens it adds to its KV over the window, where the scheme reads them (SharingScheme.measures_rates)
        self.rate = TokenRate(window_s) if fleet.scheme.measures_rates else None
        self.last_active = -math.inf
        self.running = 0  # requests sent to its copies and not finished

    # ---------------------------------------------------------------- the scheme's view
    @property
    def state(self) -> str:
        return self.copies[-1].state if self.copies else EVICTED

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.copies[-1].gpus) if self.copies else ()

    @property
    def token_rate(self) -> float:
        if self.rate is None:
            raise RuntimeError(f"the {self.fleet.scheme.name} scheme reads token rates: it must say so "
                               "(SharingScheme.measures_rates)")
        return self.rate.rate(self.fleet.env.now)

    @property
    def busy(self) -> bool:
        return self.running > 0

    @property
    def oldest_pending(self) -> float:
        return self.pending[0].req.arrival if self.pending else math.inf

    def serving(self) -> Copy | None:
        """The copy that takes new requests (the newest active one)."""
        for c in reversed(self.copies):
            if c.state == ACTIVE:
                return c
        return None


@dataclass
class FleetCounters:
    activations: int = 0
    evictions: int = 0
    migrations: int = 0
    bytes_moved: float = 0.0  # weights loaded onto GPUs
    loading_s: float = 0.0  # summed time models spent loading


class Fleet:
    """The fleet of one run (module docstring); ``submit`` is what the client sends requests to."""

    def __init__(self, spec: RunSpec, replay: Replay, events: EngineEvents | None = None,
                 gpus: Sequence[int] | None = None) -> None:
        self.spec, self.replay, self.env, self.events = spec, replay, replay.env, events
        cfg = spec.fleet
        self.scheme: SharingScheme = make_sharing(cfg.sharing, spec.sharing_configs)
        gpu = self.gpu_profile = profiles.gpu(cfg.gpu)
        self.loading = LoadingConfig(engine_pool=self.scheme.engine_pool, cold_start_s=cfg.cold_start_s,
                                     parallel_links=self.scheme.parallel_links or gpu.gpus_per_node)
        serial = cfg.compute == "serial" and not self.scheme.models_apart  # no GPU has two models' engines
        self.gpus = [Gpu(self.env, i, i // gpu.gpus_per_node, GpuMemory.for_gpu(gpu, cfg.utilization, name=f"gpu{i}"),
                         serial) for i in (range(cfg.gpus) if gpus is None else gpus)]
        self._gpu = {g.index: g for g in self.gpus}  # by index (a part holds some of the fleet's, sim/fleet.py)
        self.counters = FleetCounters()
        self.multi = bool(spec.trace.meta.get("models"))
        span = spec.trace.last_arrival() or 1.0  # each model's expected rate is over the trace's span
        self.models: dict[str, ModelServer] = {}
        for served in spec.served_models:
            profile = served_profile(gpu, profiles.model(served.profile), served.tp)
            mine = [spec.trace.requests[i] for i in positions_of(spec.trace, served.name)]
            self.models[served.name] = ModelServer(self, served, profile, model_spec(spec, served, profile, mine),
                                                   mine, self.scheme.elastic, cfg.rate_window_s, span)
        self.samples: list[tuple] = []
        self.retired: dict[str, float] = {}  # the counters of copies no longer resident

    @property
    def now(self) -> float:
        return self.env.now

    def apply(self, actions: list[Action]) -> None:
        """Carry out a scheme's actions, in order."""
        for a in actions:
            m = self.models[a.model]
            gpus = [self._gpu[i] for i in a.gpus]
            free = not any(m.name in g.memory for g in gpus)  # one copy of a model per GPU
            if a.kind == "activate":
                if m.state == EVICTED and free:
                    self._activate(m, gpus)
            elif a.kind == "evict":
                self._evict(m)
            elif a.kind == "migrate":
                if m.state == ACTIVE and free:
                    self._migrate(m, gpus)
            else:
                raise ValueError(f"unknown action {a.kind!r}")

    def start(self, resident: list[Action] | None = None) -> None:
        """Activate the models resident from time 0 (no load): the scheme's start, or ``resident``."""
        for a in self.scheme.start(self) if resident is None else resident:
            if a.kind != "activate":
                raise ValueError(f"a scheme starts by activating models, not {a.kind!r}")
            self._activate(self.models[a.model], [self._gpu[i] for i in a.gpus], resident=True)
        if self.scheme.interval_s:
            self.env.process(self._ticks(self.scheme.interval_s))
        self.env.process(self._sampler(self.spec.fleet.sample_s))

    def _ticks(self, interval: float):
        while True:
            yield self.env.timeout(interval)
            self.apply(self.scheme.tick(self))

    def _sampler(self, every: float):
        """Memory samples every ``every`` s (a row per GPU, :meth:`Gpu.sample`); a fleet whose waiting requests see
        no iteration, load or finish for :data:`STALL_S` simulated seconds is stuck (a scheme that cannot make room),
        an error, not a hang.

        The samples due before the run's next event are taken at once, each as the last: nothing changes in
        between (only an event changes the fleet), and as no other event runs meanwhile, the wait for the next
        sample is scheduled as it would be at the last of them (an idle model's part of a fleet, ``parts``, would
        otherwise wake its clock every sample)."""
        env = self.env
        mark, since = None, env.now
        while True:
            t = env.now
            rows = [g.sample(t) for g in self.gpus]  # one row per GPU
            self.samples += rows
            progress, waiting = self._progress(), bool(self._waiting())
            quiet = min(env.peek(), t + STALL_S)  # nothing happens before (bounded, should nothing ever come)
            while True:
                if progress != mark or not waiting:
                    mark, since = progress, t
                elif t - since > STALL_S:
                    waiting_for = ", ".join(f"{n} ({k})" for n, k in self._waiting().items())
                    raise UserError(f"the fleet stalled at t={t:.0f} s: requests of {waiting_for} wait and no "
                                    f"engine ran, loaded or finished a request for {STALL_S:.0f} simulated seconds "
                                    f"(the {self.spec.fleet.sharing} scheme finds no room for them: give more GPUs "
                                    f"or a larger fleet.utilization)", "fleet")
                following = t + every  # as SimPy times a timeout of `every` at t
                if not following < quiet:
                    break
                t = following
                self.samples += [(t, *row[1:]) for row in rows]
            yield due_at(env, following)

    def _progress(self) -> tuple:
        c = self.counters
        steps = sum(cp.engine.counters[PREFILL_ITERATIONS] + cp.engine.counters[DECODE_ITERATIONS]
                    for m in self.models.values() for cp in m.copies if cp.engine is not None)
        return len(self.replay.records), c.activations, c.migrations, c.bytes_moved, steps

    def _waiting(self) -> dict[str, int]:
        """Requests waiting per model: for its activation or in its engines' queues."""
        out = {}
        for m in self.models.values():
            n = len(m.pending) + sum(len(cp.engine.waiting) for cp in m.copies if cp.engine is not None)
            if n:
                out[m.name] = n
        return out

    # ---------------------------------------------------------------- traffic
    def submit(self, seq: Seq) -> None:
        m = self.models[seq.req.model or ONLY_MODEL]
        m.last_active = self.env.now
        copy = m.serving()
        if copy is None:
            m.pending.append(seq)
            if m.state == EVICTED:
                self.apply(self.scheme.wake(self, m.name))
            return
        self._send(m, copy, seq)

    def _send(self, m: ModelServer, copy: Copy, seq: Seq) -> None:
        m.running += 1
        copy.submit(seq)

    def _finished(self, copy: Copy, seq: Seq) -> None:
        m = copy.model
        m.running -= 1
        m.last_active = self.env.now
        record = RequestRecord(seq.id, seq.req.arrival, seq.sent, seq.prefill_start, seq.prefill_end, seq.first_token,
                               seq.finish, seq.prompt_len, seq.hit, seq.output_len, seq.lane, seq.realigned, None,
                               m.name if self.multi else None, copy.gpu_label if self.multi else None)
        self.replay.finished(seq, record=record)
        if m.elastic and (copy.squeezed or any(g._changed for g in copy.gpus)):
            copy.engine.drop_cached(copy.engine.cache.evictable_size)  # another model waits for these pages
            copy.settle(copy.engine)
        if copy.idle() and not self.scheme.models_apart:  # such a scheme never acts on idle, and never drains
            self.env.process(self._on_idle(copy))

    def _on_idle(self, copy: Copy):
        yield self.env.timeout(0)  # after the engine's own bookkeeping of this instant
        if not copy.idle():
            return
        if copy.state == DRAINING:
            self._unload(copy)
        self.apply(self.scheme.idle(self, copy.model.name))

    def reclaim(self, gpu: Gpu, starving: Copy | None) -> None:
        """Engines on ``gpu`` other than ``starving`` give up their cached prefixes and, for ``starving``, their
        buffers (reclaimable memory: a model that cannot admit for lack of pages takes them)."""
        for c in gpu.copies:
            if c is starving or c.engine is None or not c.model.elastic or not c.engine.cache.evictable_size:
                continue
            c.engine.drop_cached(c.engine.cache.evictable_size)
            c.settle(c.engine)
        if starving is not None:  # and their idle buffers
            before = gpu.memory.free_pages
            gpu.memory.release_buffers(starving.model.name)
            if gpu.memory.free_pages > before:
                gpu.notify()

    # ---------------------------------------------------------------- residency
    def _activate(self, m: ModelServer, gpus: list[Gpu], source: Copy | None = None,
                  resident: bool = False) -> None:
        """Load ``m`` onto ``gpus`` (``source``: the copy it migrates from; ``resident``: there from time 0,
        no load)."""
        copy = Copy(self, m, gpus)
        m.copies.append(copy)
        for g in gpus:
            g.copies.append(copy)
        if resident:
            self._map(copy)
            self._start_engine(copy)
            copy.state = ACTIVE
            return
        self.counters.activations += source is None
        self.env.process(self._load(copy, source))

    def _map(self, copy: Copy) -> None:
        """Map the copy's weights (and a fixed model's whole KV pool)."""
        m = copy.model
        kv = self._fixed_tokens(copy) if not m.elastic else 0
        for g in copy.gpus:
            g.memory.load(m.name, m.weight_bytes / m.tp, m.layout, kv or None)
            if kv:
                g.memory.use(m.name, 0, kv)
        copy.fixed_tokens = kv

    def _fits(self, copy: Copy) -> bool:
        m = copy.model
        kv = m.layout.pages(self._fixed_tokens(copy)) * PAGE_BYTES if not m.elastic else 0
        return all(g.memory.can_load(m.weight_bytes / m.tp, kv) for g in copy.gpus)

    def _load(self, copy: Copy, source: Copy | None):
        """Map the weights once they fit (the others' KV squeezed meanwhile), then load them and start."""
        m, t0 = copy.model, self.env.now
        while not self._fits(copy):
            changed = self.env.any_of([g.changed() for g in copy.gpus])  # before the squeeze: it may free pages
            self._squeeze(copy)
            yield changed
        self._map(copy)
        self._unsqueeze(copy)
        gpu = self.gpu_profile
        if source is not None and source.gpus[0].node == copy.gpus[0].node and gpu.nvlink_bandwidth > 0:
            seconds = m.weight_bytes / m.tp / gpu.nvlink_bandwidth  # GPU to GPU over NVLink
        elif source is not None:
            seconds = load_seconds(m.weight_bytes, gpu, m.tp, self.loading)
        else:
            seconds = activation_seconds(m.profile.model, gpu, m.tp, self.loading)
        yield self.env.timeout(seconds)
        self.counters.bytes_moved += m.weight_bytes
        self.counters.loading_s += self.env.now - t0
        self._start_engine(copy)
        copy.state = ACTIVE
        if source is not None and source.state == ACTIVE:
            self._drain(source)
        pending, m.pending = m.pending, []
        for seq in pending:
            self._send(m, copy, seq)

    def _fixed_tokens(self, copy: Copy) -> int:
        """A fixed model's KV pool: the scheme's share, else SGLang's own sizing on these GPUs."""
        m = copy.model
        shares = [self.scheme.kv_limit(self, g.index, m.name) for g in copy.gpus]
        share = None if shares[0] is None else min(shares)  # a TP copy's pools are alike: the tightest GPU's
        block = m.layout.pages_per_block * PAGE_BYTES
        room = min(g.capacity_bytes for g in copy.gpus) - m.mapped_weight_bytes
        if share is None:  # SGLang's sizing, within what the pool has after the weights
            tokens = min(m.pool_tokens, m.layout.tokens(int(room // block)))
        else:  # whole blocks of pages within the share
            tokens = m.layout.tokens(int(min(share, room) // block))
        if tokens < m.min_kv_tokens:
            raise FleetTooSmall(f"{self.spec.fleet.sharing}: {m.name}'s KV pool of {tokens} tokens cannot hold its "
                                f"largest request ({m.min_kv_tokens} tokens)", "fleet")
        return tokens

    def _start_engine(self, copy: Copy) -> None:
        m = copy.model
        host = copy if (m.elastic or any(g.slot is not None for g in copy.gpus)) else None
        scheduler = DeadlineOrder(copy.gpus[0].queue) if self.scheme.queue == "deadline" else None
        inst = Instance(0, self.env, m.spec, lambda seq, c=copy: self._finished(c, seq), events=self.events,
                        host=host, on_admit=copy.admitted, scheduler=scheduler, capacity=m.pool_tokens,
                        name=f"{m.name} on GPU {copy.gpu_label}")
        copy.instance, copy.engine = inst, inst.engine
        if m.rate is not None:  # the tokens its iterations sample: decode tokens, whose KV comes next
            inst.engine.on_tokens = m.rate.add
        if m.elastic:
            inst.engine.capacity = inst.engine.cache.capacity = 0  # refreshed from its pools before each iteration
            inst.engine.shared_pool = True
        elif copy.fixed_tokens != inst.engine.capacity:
            inst.engine.capacity = inst.engine.cache.capacity = copy.fixed_tokens

    def _squeeze(self, copy: Copy) -> None:
        """The balloon: the other elastic models on ``copy``'s GPUs shrink to what their running requests hold
        and will decode (their cached prefixes go now; they admit nothing until the weights are mapped)."""
        for g in copy.gpus:
            for c in g.copies:
                if c is copy or c.engine is None or not c.model.elastic:
                    continue
                e = c.engine
                remaining = sum(s.output_len - s.generated(e.step) for _, s in e.decoding)
                c.squeezed = True
                e.drop_cached(e.cache.evictable_size)
                g.memory.set_limit(c.model.name, kv_used(e) + e.owed + remaining)
                c.settle(e)

    def _unsqueeze(self, copy: Copy) -> None:
        for g in copy.gpus:
            for c in g.copies:
                if c is not copy and c.squeezed:
                    c.squeezed = False
                    g.memory.set_limit(c.model.name, c.model.layout.tokens(g.memory.total_pages
                                                                           // c.model.layout.pages_per_block))

    def _evict(self, m: ModelServer) -> None:
        for copy in list(m.copies):
            if copy.state == ACTIVE:
                self.counters.evictions += 1
                self._drain(copy)

    def _drain(self, copy: Copy) -> None:
        copy.state = DRAINING
        if copy.engine is None or copy.idle():
            self._unload(copy)

    def _migrate(self, m: ModelServer, gpus: list[Gpu]) -> None:
        self.counters.migrations += 1
        self._activate(m, gpus, source=m.serving())

    def _unload(self, copy: Copy) -> None:
        m = copy.model
        if copy not in m.copies:
            return
        m.copies.remove(copy)
        if copy.instance is not None:
            for k, v in copy.instance.counters().items():
                self.retired[k] = self.retired.get(k, 0) + v
        for g in copy.gpus:
            g.copies.remove(copy)
            g.memory.use(m.name, 0, 0)
            g.memory.unload(m.name)
            g.notify()
        if m.pending and m.state == EVICTED:
            self.apply(self.scheme.wake(self, m.name))

    # ---------------------------------------------------------------- models apart
    #: False: every fleet runs on one clock (tests hold the two ways alike)
    run_apart = True

    def parts(self) -> list["Fleet"]:
        """The fleet as one fleet per model, each on a clock of its own, where its models share nothing (the
        scheme's ``models_apart``) and no client limit holds their requests together; [] where they may not.

        Why: one clock makes each model's engine wait for every other model's iterations (a SimPy event each:
        on 18 models, 2.4 times a lone engine's cost a request), where alone on its clock an engine passes most
        of its iterations without one (``sim/clock.py``). A part is this fleet with one model and its GPUs (the
        GPUs no model uses make a part of their own): the same engine, memory samples and stall check, its
        requests sent at the whole replay's times (``Client``'s ``times``), its records handed to the whole run
        as they finish. :func:`simulate_fleet` runs the parts a slice of simulated time at a time, so the
        records come about in time order, and an interrupted run stops at about one time everywhere;
        :meth:`gather` then makes this fleet's results of theirs."""
        from prism.sim.client import Client, part_times, send_times

        spec = self.spec
        if not (self.run_apart and self.scheme.models_apart) or spec.engine.max_concurrency is not None:
            return []
        if self.scheme.interval_s:  # its ticks could move a model: each part would tick a fleet of its own
            raise ValueError(f"the {self.scheme.name} scheme keeps its models apart: it has no ticks")
        requests = spec.trace.requests
        sent = list(send_times(requests))
        out: list[Fleet] = []
        held: set[int] = set()
        for a in self.scheme.start(self):
            mine = positions_of(spec.trace, a.model)
            part = Fleet(replace(spec, served_models=(self.models[a.model].served,)),
                         Replay(spec, False, self.replay.take, False), gpus=a.gpus)
            part.start([a])
            part.replay.client = Client(part.env, part, [requests[i] for i in mine], times=part_times(sent, mine))
            out.append(part)
            held.update(a.gpus)
        if sum(len(p.replay.client.requests) for p in out) != len(requests):  # a request no part would send
            raise RuntimeError("a fleet's parts do not send every request of its trace")
        idle = [g.index for g in self.gpus if g.index not in held]
        if idle:
            part = Fleet(replace(spec, served_models=()), Replay(spec, False, None, False), gpus=idle)
            part.start([])
            out.append(part)
        return out

    def gather(self, parts: list["Fleet"], complete: bool) -> None:
        """This fleet's state made of its parts' (:meth:`parts`), as if it had run them: their models, GPUs,
        counters, and memory samples up to the last finish (up to where every part got, if interrupted)."""
        self.models = {n: p.models[n] for p in parts for n in p.models}
        self.gpus = sorted((g for p in parts for g in p.gpus), key=lambda g: g.index)
        self.counters = FleetCounters(*(sum(getattr(p.counters, f.name) for p in parts) for f in fields(FleetCounters)))
        self.retired = {}
        for p in parts:
            for k, v in p.retired.items():
                self.retired[k] = self.retired.get(k, 0) + v
        records = self.replay.records
        end = max(r.finish for r in records) if complete and records else min(p.env.now for p in parts)
        self.samples = sorted((x for p in parts for x in p.samples if x[0] <= end), key=lambda x: (x[0], x[1]))

    # ---------------------------------------------------------------- results
    def counters_of(self) -> dict[str, float]:
        out = dict(self.retired)
        for m in self.models.values():
            for c in m.copies:
                if c.instance is not None:
                    for k, v in c.instance.counters().items():
                        out[k] = out.get(k, 0) + v
        return out

    def summary(self, records: list[RequestRecord]) -> dict[str, Any]:
        c, cfg = self.counters, self.spec.fleet
        slos = {n: (m.served.ttft_slo_s, m.served.tpot_slo_s) for n, m in self.models.items()}
        names = {r.id: (r.model or ONLY_MODEL) for r in self.spec.trace.requests}
        return fleet_summary(records, names, slos, warmup=self.spec.engine.warmup_requests,
                             extra={"sharing": cfg.sharing, "gpus": len(self.gpus), "gpu": cfg.gpu,
                                    "compute": cfg.compute, "slo_scale": cfg.slo_scale, "rate_scale": cfg.rate_scale,
                                    "activations": c.activations, "evictions": c.evictions,
                                    "migrations": c.migrations, "bytes_moved": c.bytes_moved,
                                    "loading_s": c.loading_s,
                                    "vmm_path_s": sum(g.memory.counters.path_s for g in self.gpus)})


def positions_of(trace: Trace, model: str) -> list[int]:
    """Where the requests of ``model`` stand in ``trace`` (requests without a model go to :data:`ONLY_MODEL`)."""
    positions = trace.positions_of_models()
    if model != ONLY_MODEL:
        return positions.get(model, [])
    return sorted(positions.get(ONLY_MODEL, []) + positions.get(None, []))


def model_spec(spec: RunSpec, served: ServedModel, profile: Profile, requests: list[Request]) -> RunSpec:
    """A model's run as its engines see it: the fleet's method and engine settings on the model's profile and
    its own requests."""
    trace = Trace(requests, spec.trace.table, spec.trace.kind, spec.trace.spec, {})
    return replace(spec, profile=profile, trace=trace, instance_profiles=(), fleet=None, served_models=(),
                   slo_trace=None)


# ---------------------------------------------------------------------------------------------- a run
def simulate_fleet(spec: RunSpec, *, progress: bool = False, on_record: Callable[[RequestRecord], None] | None = None,
                   events: EngineEvents | None = None) -> SimResult:
    """Replay ``spec.trace`` on ``spec.fleet``; as :func:`prism.sim.run.simulate` (its records carry their model
    and GPU, its summary a ``fleet`` block, and :attr:`SimResult.memory` the memory samples)."""
    from prism.sim.client import Client
    from prism.sim.run import _collector_paused

    spec = with_slos(spec)
    with _collector_paused():
        run = Replay(spec, progress, on_record, False)
        fleet = Fleet(spec, run, events)
        if events is not None and hasattr(events, "attached_fleet"):
            events.attached_fleet(fleet)  # an observer of the fleet as well as of its engines (tests)
        parts = fleet.parts() if events is None else []  # an observer sees one clock
        if not parts:
            fleet.start()  # models resident from time 0 are there before the first request
            run.client = Client(run.env, fleet, spec.trace.requests, spec.engine.max_concurrency)

        def result(complete: bool) -> SimResult:
            if parts:
                fleet.gather(parts, complete)
            res = run.result(fleet.counters_of(), sum(c.fixed_tokens for m in fleet.models.values() for c in m.copies),
                             complete, fleet=fleet.summary(run.records))
            res.memory = fleet.samples
            return res

        return run.run(result, (lambda: _run_apart(run, parts)) if parts else None)


#: the slices of simulated time the parts of a fleet run in turn (:meth:`Fleet.parts`): the trace's span over this
#: many, at least one memory sample apart (a slice costs each part a few SimPy events)
APART_SLICES = 16


def _run_apart(run: Replay, parts: list[Fleet]) -> None:
    """Run the parts of a fleet to the whole run's last finish, a slice of simulated time at a time."""
    spec = run.spec
    step = max(spec.fleet.sample_s, spec.trace.last_arrival() / APART_SLICES)
    until = 0.0
    while len(run.records) < run.total:
        until += step
        for p in parts:
            p.env.run(until=until)


def memory_rows(samples: list[tuple]) -> tuple[list[str], list[list]]:
    """The memory samples as CSV: (columns, rows) in GiB."""
    cols = ["t", "gpu", "weights_gib", "kv_live_gib", "kv_cached_gib", "kv_unused_gib", "free_gib"]
    return cols, [[t, g, *(round(x / 2**30, 4) for x in rest)] for t, g, *rest in samples]


__all__ = ["simulate_fleet", "Fleet", "memory_rows", "ONLY_MODEL"]



# ---------------------------------------------------------------------------------------------- SLOs
_SLO_MEMO: dict[tuple, tuple[float | None, float | None]] = {}


def with_slos(spec: RunSpec) -> RunSpec:
    """The run with every model's SLOs: a model without them gets its dedicated-GPU P95 TTFT and P95 TPOT times
    ``fleet.slo_scale``, from a run of its first ``fleet.slo_requests`` requests alone on its GPUs (the run's
    method and engine settings, the trace at rate scale 1: ``spec.slo_trace``). Remembered per process, so a
    sweep's runs measure each model once."""
    cfg = spec.fleet
    trace = spec.slo_trace or spec.trace
    by_model: dict[str, list[Request]] = {}
    for r in trace.requests:
        by_model.setdefault(r.model or ONLY_MODEL, []).append(r)
    gpu = profiles.gpu(cfg.gpu)
    out = []
    for m in spec.served_models:
        if m.ttft_slo_s is not None and m.tpot_slo_s is not None:
            out.append(m)
            continue
        requests = by_model.get(m.name, [])[:cfg.slo_requests]
        key = (spec.trace_source, json_key(trace.spec), m.name, m.profile, m.tp, cfg.gpu, spec.scheduler, spec.eviction,
               repr(spec.engine), repr(sorted(spec.policy_configs.items())), cfg.slo_requests)
        if key not in _SLO_MEMO:
            _SLO_MEMO[key] = _dedicated_p95(spec, m, gpu, requests)
        ttft, tpot = _SLO_MEMO[key]
        scale = cfg.slo_scale
        out.append(replace(m, ttft_slo_s=m.ttft_slo_s or (ttft * scale if ttft is not None else None),
                           tpot_slo_s=m.tpot_slo_s or (tpot * scale if tpot is not None else None)))
    return replace(spec, served_models=tuple(out))


def json_key(obj: Any) -> str:
    import json

    return json.dumps(obj, sort_keys=True, default=str)


def _dedicated_p95(spec: RunSpec, served: ServedModel, gpu, requests: list[Request]) -> tuple[float | None, float | None]:
    """P95 TTFT and TPOT of ``requests`` served by ``served`` alone on its GPUs (None: no request)."""
    from prism.sim.run import simulate

    if not requests:
        return None, None
    profile = served_profile(gpu, profiles.model(served.profile), served.tp)
    res = simulate(model_spec(spec, served, profile, requests))
    ttft = [r.ttft for r in res.records]
    tpot = [r.tpot for r in res.records if r.output_tokens > 1]
    return float(np.percentile(ttft, 95)), (float(np.percentile(tpot, 95)) if tpot else None)
