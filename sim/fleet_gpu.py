"""A fleet's GPUs and the engines on them, for ``sim/fleet.py``: each GPU's compute slot (one iteration at a time)
and page pool, and a *copy*, one model's engine over its GPUs, which is that engine's host (``sim/engine.py``): it
waits for its GPUs' compute and sizes its KV from their pools before each iteration, and reports its KV after.
These run at every iteration of every engine of a fleet, so they are compiled (``prism/native.py``); the fleet's
set-up, its schemes' actions and its summary stay in ``sim/fleet.py``."""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import PENDING

from prism.calibration.loading import PAGE_BYTES
from prism.policies.moore_hodgson import DeadlineQueue, prefill_seconds
from prism.policies.placement import TokenRate
from prism.policies.sharing import LOADING

from prism.sim.clock import now_of
from prism.sim.engine import Engine, Seq
from prism.sim.instance import Instance
from prism.sim.memory import GpuMemory, MemoryFull

if TYPE_CHECKING:  # the fleet builds these parts; they call back into it
    from prism.sim.fleet import Fleet, ModelServer


class ComputeSlot:
    """A GPU's compute, one engine iteration at a time: a free slot is taken at once (no event, no wait); a
    busy one queues the asker by priority (lower first, then first come) until the holder lets it go."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.holder: Any = None
        self._waiting: list[tuple[float, int, Any, simpy.Event]] = []
        self._n = 0

    def take(self, who: Any, priority: float, wait: simpy.Event) -> simpy.Event | None:
        """Take the slot for ``who``: None if it is ``who``'s now, else ``wait``, which fires when it is. ``wait`` is
        the asker's own event, made pending again here (its last use fired, and SimPy processed it, before it asks
        again): an engine waits for the slot on most of its iterations (78% of them in ``bench_fleet.py``'s shared
        fleet); reusing this event, and the engines' own timeout (``sim/clock.py``), saved 6% of that fleet's
        instructions."""
        if self.holder is None:
            self.holder = who
            return None
        event: Any = wait  # SimPy sets its callbacks to None once processed (typed as a list)
        if event.callbacks:  # a process still waits on it
            raise RuntimeError(f"{who} asks for a compute slot while it waits for one")
        event.callbacks, event._value = [], PENDING  # as simpy.Event() leaves a new one
        self._n += 1
        heapq.heappush(self._waiting, (priority, self._n, who, wait))
        return wait

    def give(self, who: Any) -> None:
        if self.holder is not who:
            return
        if self._waiting:
            _, _, nxt, ev = heapq.heappop(self._waiting)
            self.holder = nxt
            ev.succeed()
        else:
            self.holder = None


class Gpu:
    """One GPU: its page pool, its compute (one iteration at a time), its shared deadline queue, its copies."""

    def __init__(self, env: simpy.Environment, index: int, node: int, memory: GpuMemory, serial: bool) -> None:
        self.env, self.index, self.node, self.memory = env, index, node, memory
        self.slot = ComputeSlot(env) if serial else None
        self.queue = DeadlineQueue()
        self.copies: list[Copy] = []
        self._changed: list[simpy.Event] = []

    @property
    def capacity_bytes(self) -> float:
        return self.memory.total_pages * PAGE_BYTES

    def sample(self, t: Any) -> tuple[Any, int, float, float, float, float, float]:
        """Its row of the fleet's memory samples at ``t`` (``Fleet._sampler``; the clock as SimPy has it, an int 0 at
        the start): its index, bytes of weights, KV of running requests, cached prefixes, mapped but unused, free."""
        weights = live = cached = 0.0
        memory = self.memory
        for c in self.copies:
            name = c.name
            if name not in memory:
                continue  # its weights wait for pages
            weights += memory.weight_pages(name) * PAGE_BYTES
            e = c.engine
            if e is not None:
                evictable = e.cache.evictable_size
                live += (kv_used(e) - evictable) * c.kv_bytes
                cached += evictable * c.kv_bytes
        free = self.free_bytes
        unused = self.capacity_bytes - free - weights - live - cached
        return (t, self.index, weights, live, cached, unused if unused > 0.0 else 0.0, free)

    @property
    def free_bytes(self) -> float:
        return self.memory.free_pages * PAGE_BYTES

    @property
    def resident(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.copies)

    def changed(self) -> simpy.Event:
        """An event that fires when pages free on this GPU (a model shrinks, drains or leaves)."""
        ev = self.env.event()
        self._changed.append(ev)
        return ev

    def notify(self) -> None:
        waiting, self._changed = self._changed, []
        for ev in waiting:
            if not ev.triggered:
                ev.succeed()


class Copy:
    """One resident engine of a model over its GPUs, and the engine's host (see ``sim/engine.py``)."""

    def __init__(self, fleet: "Fleet", model: "ModelServer", gpus: list[Gpu]) -> None:
        self.fleet, self.model, self.gpus = fleet, model, gpus
        self.env: simpy.Environment = fleet.env
        self.kv_bytes: float = model.kv_bytes_per_token / model.tp  # a KV token's bytes on each of its GPUs
        self.state = LOADING
        self.instance: Instance | None = None
        self.engine: Engine | None = None
        self.fixed_tokens = 0  # a fixed model's KV pool
        self.squeezed = False  # its limit is lowered while another model's weights wait for pages
        self._held: list[ComputeSlot] = []  # the compute slots it holds (or waits for)
        # fixed for its life, asked at every iteration
        self.elastic, self._deadline = model.elastic, fleet.scheme.queue == "deadline"
        self.name: str = model.name  # its model's
        self._tpot_slo_s: float = model.tpot_slo_s
        self._rate: TokenRate | None = model.rate  # the tokens it adds to its KV, where its scheme reads them
        self.gpu_label = "+".join(str(g.index) for g in gpus)
        # the compute slots of the GPUs it shares, in index order (see _acquire_all)
        self._slots = [g.slot for g in sorted(gpus, key=lambda g: g.index) if g.slot is not None]
        self._pools = [g.memory for g in gpus]
        self._looked: tuple[Any, tuple[int, int]] = (None, (0, 0))  # the pools' changes at the last look, the look
        self._grant = simpy.Event(fleet.env)  # fires when a compute slot it waits for is its (ComputeSlot.take)

    # ---------------------------------------------------------------- the engine's host
    def acquire(self, engine: Engine):
        """Wait for the copy's GPUs (None: they are its now; a GPU without shared compute is never waited for)."""
        slots = self._slots
        if not slots or self._held:
            return None
        urgency = self._urgency(engine) if self._deadline else 0.0
        if len(slots) == 1:
            self._held = slots
            return slots[0].take(self, urgency, self._grant)
        self._held = []
        return self.fleet.env.process(self._acquire_all(slots, urgency))

    def _acquire_all(self, slots: list[ComputeSlot], urgency: float):
        for slot in slots:  # in GPU index order: no two copies wait for each other
            self._held.append(slot)
            ev = slot.take(self, urgency, self._grant)
            if ev is not None:
                yield ev

    def _urgency(self, engine: Engine) -> float:
        """The slot's priority behind a deadline queue (lower first; without one, 0 for all: first come first
        served): the engine's earliest on-time TTFT deadline for a prefill, now + TPOT SLO for a decode step."""
        now: float = now_of(self.env)
        decode = now + self._tpot_slo_s if engine.decoding else math.inf
        if engine.waiting and not engine.batch_is_full:
            return min(decode, self.gpus[0].queue.first_deadline([s.id for s in engine.waiting], now))
        return decode if engine.decoding else now

    def release(self, engine: Engine) -> None:
        for slot in self._held:
            slot.give(self)
        self._held = []

    def refresh(self, engine: Engine) -> None:
        """Before an iteration: the KV capacity an elastic engine may use now, what its pools hold for it (live,
        owed and cached, as last settled) plus what they may map (a lowered limit: cached prefixes above it go
        first); squeezed, it admits nothing."""
        if not self.elastic:
            return
        excess, reach = self._balloon()
        if excess > 0 and engine.cache.evictable_size:
            engine.drop_cached(excess)
            self.settle(engine)
            reach = self._balloon()[1]
        used = kv_used(engine)
        if (reach - used if reach > used else 0) + engine.cache.evictable_size < len(engine.decoding):
            for g in self.gpus:  # no token for each running request: the others' reclaimable memory first
                self.fleet.reclaim(g, self)
            reach = self._balloon()[1]
        capacity, current = max(used, reach), engine.capacity
        assert current is not None  # an elastic engine's is its pools' (0 at its start)
        if self.squeezed:
            engine.batch_is_full = True
        elif capacity > current:
            engine.batch_is_full = False  # SGLang's admission sees its pool grow
        engine.capacity = engine.cache.capacity = capacity

    def _balloon(self) -> tuple[int, int]:
        """Its pools' tightest (excess, reach) (:meth:`GpuMemory.balloon`): the most any asks it to free, the
        least any lets it hold; asked again only when a pool has changed since (``GpuMemory.changes``). A copy on
        one GPU asks its pool alone: the lists for several cost 8% of a shared fleet's run (``bench_fleet.py``)."""
        name, pools = self.name, self._pools
        if len(pools) == 1:
            m = pools[0]
            if self._looked[0] != m.changes:
                self._looked = (m.changes, m.balloon(name))
            return self._looked[1]
        stamp = tuple(m.changes for m in pools)
        if self._looked[0] != stamp:
            looks = [m.balloon(name) for m in pools]
            self._looked = (stamp, (max(e for e, _ in looks), min(r for _, r in looks)))
        return self._looked[1]

    def settle(self, engine: Engine) -> float:
        """The engine's KV changed: its pools map or release blocks for what it holds, owes and caches. Returns
        the seconds of page mapping on the engine's path (the slowest of its GPUs': kvcached's costs; a block
        from the pre-mapped buffer costs nothing)."""
        if not self.elastic:
            return 0.0
        name, cached, used = self.name, engine.cache.evictable_size, kv_used(engine)
        # what it owes is reserved up to its capacity: admission counted cached prefixes it may evict for it
        # (min/max only when it owes something: on this per-iteration path the builtins' calls, with refresh's and
        # the new-token ratio's, were 8% of a shared fleet's process, callgrind)
        capacity = engine.capacity
        assert capacity is not None  # an elastic engine's is its pools' (0 at its start)
        live = (max(used, min(used + engine.owed, capacity)) if engine.owed else used) - cached
        freed, seconds = False, 0.0
        for m in self._pools:
            # fewer blocks in use is room for others (loadable pages: all but weights and blocks in use)
            before = m.counters.blocks_released
            try:
                t = m.use(name, live, cached)
            except MemoryFull as e:
                raise RuntimeError(f"fleet memory accounting: {e}") from None
            if t > seconds:
                seconds = t
            freed |= m.counters.blocks_released != before
        if freed:
            for g in self.gpus:
                g.notify()
        return seconds

    def changed(self, engine: Engine) -> simpy.Event:
        """The engine can admit nothing: wait until pages free on one of its GPUs, asking co-located engines
        to give up their cached prefixes first."""
        events = [g.changed() for g in self.gpus]
        for g in self.gpus:
            self.fleet.reclaim(g, self)
        return self.fleet.env.any_of(events)

    # ---------------------------------------------------------------- traffic
    def submit(self, seq: Seq) -> None:
        if self._deadline:
            m = self.model
            self.gpus[0].queue.add(seq.id, seq.req.arrival + m.ttft_slo_s,
                                   prefill_seconds(seq.prompt_len, m.prefill_speed))
        instance = self.instance
        assert instance is not None, "a copy takes requests once its engine started"
        instance.entry.submit(seq)

    def admitted(self, seq: Seq) -> None:
        if self._deadline:  # only then did submit queue it
            q = self.gpus[0].queue
            if seq.id in q:
                q.remove(seq.id)
        if self._rate is not None:
            self._rate.add(now_of(self.env), seq.fill_len - seq.kv_len)

    def idle(self) -> bool:
        e, instance = self.engine, self.instance
        assert e is not None and instance is not None, "a copy is idle or busy once its engine started"
        return not (e.active or e.waiting or e.chunked) and not (instance.front and instance.front.held)


def kv_used(engine: Engine) -> int:
    """The KV tokens an engine holds: its tree, its decode allocations, the partial pages not in the tree (tails)
    and what its prefills have in flight."""
    return engine.cache.size + engine.decode_alloc + engine.tails + engine.inflight
