"""One SGLang-like serving instance as a SimPy process.

The story of one iteration, as in SGLang's scheduler loop (prefill has priority over decode):

1. If requests wait (or a chunked prefill is under way), the scheduling policy orders the waiting queue and
   the engine admits in that order while the chunked-prefill budget, ``max_prefill_tokens``,
   ``max_running_requests`` and KV space allow. KV space counts evictable cache and the prompt chunks
   promised to admitted requests; for their decode, ``engine.admission`` chooses SGLang's rule (``sglang``,
   the default: the remaining decode of running requests x a new-token ratio that decays while memory is
   plentiful, see :mod:`prism.sim.admission`) or the whole decode of every request (``full``: a running
   request is never preempted). A prompt longer than the remaining chunk budget is cut; its next chunk goes
   first in the next prefill batch. The tree holds whole pages: a prompt's last partial page is the
   request's own KV, in use until it finishes (then inserted with the generated tokens, or freed).
2. Otherwise, if requests are running, one decode step generates one token for each of them. Under
   ``sglang`` admission a step that finds no KV for its tokens, after evicting every unlocked leaf, first
   retracts running requests as SGLang does: their KV is freed (their prompt stays cached, evictable),
   they go back to the waiting queue and are prefilled again later (prompt and generated tokens), hitting
   what survived of their prefix. Retractions and re-prefilled tokens are counted.
3. Otherwise the engine sleeps until a request arrives.

Each iteration lasts what the calibrated cost model says (its time passes without a SimPy event when no
other event is due before it ends: ``sim/clock.py``). An engine that shares its GPU with other models'
engines (``sim/fleet.py``) has a *host*: before an iteration it waits for the GPU's compute (``acquire``) and
learns its current KV capacity (``refresh``: the pages it may map now), after allocating it reports its KV
(``settle``, which returns the seconds the page mapping adds to the iteration), and after the iteration it lets
the GPU go (``release``). A pool shared with other models' (``shared_pool``: elastic KV) may not have a token
left even for one running request, which SGLang's own pool always has: then every running request is retracted
and the engine waits for pages. Without a host (a single engine, a cluster, a dedicated GPU) none of this runs.
The prompt (or its processed part) is inserted into the radix cache after each prefill chunk and stays locked
while the request runs; the full sequence (prompt and generated tokens) is inserted when the request finishes,
and then unlocked.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Generator, cast

import simpy

from prism.calibration.cost_model import CostModel
from prism.core import TOKEN_BYTES, Request, SegmentedPrompt, output_token_bytes, realigned
from prism.counters import DECODE_ITERATIONS, EVICTED_NODES, EVICTED_TOKENS, PREFILL_ITERATIONS, \
    RETRACTED_OUTPUT_TOKENS, RETRACTIONS, SCHEDULING_ROUNDS, Counts
from prism.policies.base import DemandHints, EvictionPolicy, SchedContext, Scheduler
from prism.policies.bookkeeping import Bookkeeper
from prism.settings import EngineConfig  # the engine's limits, named after SGLang's server arguments

from prism.sim.admission import RULES, PrefillAdder
from prism.sim.clock import Ticker, now_of
from prism.sim.events import EngineEvents
from prism.sim.radix_cache import RadixCache


class Seq(SegmentedPrompt):
    """A request inside the engine: the trace request plus its current prompt order and timestamps."""

    __slots__ = ("req", "id", "arrival", "output_len", "fixed_order", "prompt_len",
                 "sent", "prefill_start", "prefill_end", "first_token", "finish", "hit", "kv_len", "node",
                 "finish_step", "lane", "realigned", "retracted_output", "admitted_in")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.id = req.id
        self.arrival = req.arrival  # when this engine received it (set on submit); the trace's is req.arrival
        self.output_len = req.output_len
        self.fixed_order = req.fixed_order
        self.prompt_len = req.prompt_len  # the same in any segment order
        self.set_segments(req.segments)
        self.sent = self.prefill_start = self.prefill_end = self.first_token = self.finish = -1.0
        self.hit = 0  # prompt tokens cached at its first admission (its record's)
        self.kv_len = 0  # tokens of its fill whose KV exists (cached or computed so far)
        self.node: Any = None  # the cache node its lock holds while it runs
        self.finish_step = 0
        self.lane = ""
        self.realigned = False
        self.retracted_output = 0  # tokens generated before its last retraction: prefilled again with the prompt
        self.admitted_in = 0  # the engine's scheduling round that last admitted it (0: none)

    @property
    def fill_len(self) -> int:
        """Tokens its (next) prefill covers: the prompt, and after a retraction the tokens generated so far."""
        return self.prompt_len + self.retracted_output

    def fill_key(self) -> bytes:
        return self.key + output_token_bytes(self.retracted_output) if self.retracted_output else self.key

    def generated(self, step: int) -> int:
        """Output tokens so far of a decoding request at decode step ``step`` (the first comes with prefill)."""
        return self.output_len - (self.finish_step - step)

    def realign(self, skeleton: tuple[str, ...] | None) -> bool:
        """Put the reusable segments in ``skeleton`` order (same multiset; None: keep the order, as a plan
        says for requests it does not move); True if the order changed.

        The system prompt stays first and private segments last; ``fixed_order`` prompts never move, nor a
        retracted one (its KV order is settled)."""
        if skeleton is None or self.fixed_order or self.retracted_output:
            return False
        segments = realigned(self.segments, skeleton, self.id)
        if segments is None:
            return False
        self.set_segments(segments)
        self.realigned = True
        return True

    def __lt__(self, other: "Seq") -> bool:  # heap tie-break
        return self.id < other.id


class Engine:
    """One instance: a clock (the SimPy environment), a waiting queue, a running batch and a radix cache."""

    def __init__(self, env: simpy.Environment, config: EngineConfig, cost: CostModel, scheduler: Scheduler,
                 eviction: EvictionPolicy, capacity: int | None, hints: DemandHints | None = None,
                 on_finish: Callable[[Seq], None] | None = None, on_admit: Callable[[Seq], None] | None = None,
                 events: EngineEvents | None = None, host=None, name: str | None = None) -> None:
        self.env = env
        self.name = name  # how observers label it where a run has several (a fleet's "MODEL on GPU g")
        self.cfg = config
        self.cost = cost
        self.scheduler = scheduler
        self.eviction = eviction
        self.hints = hints if hints is not None else eviction.hints
        self.capacity = capacity
        self.cache = RadixCache(capacity, config.page_size, anchors=eviction.needs_anchors)
        self.on_finish, self.on_admit = on_finish, on_admit
        # told of the tokens each iteration samples, and when (a fleet's token rate)
        self.on_tokens: Callable[[float, int], None] | None = None
        self.events = events
        self.host = host  # the shared GPU it runs on, where it has one (module docstring)
        self.shared_pool = False  # its KV pages come from a pool other models map from too (module docstring)
        self.counters = Counts()
        self.books = Bookkeeper(scheduler, eviction, self.hints, self.counters)
        self.rule = RULES[config.admission](config)  # the KV admission rule (sim/admission.py)
        self.waiting: list[Seq] = []
        self.kept = 0  # the head of ``waiting`` that was in it at the last round and not admitted (SchedContext)
        self.rounds = 0  # scheduling rounds so far (a request's ``admitted_in``)
        self.active: dict[int, Seq] = {}  # admitted, not finished
        self.decoding: list[tuple[int, Seq]] = []  # heap by finish step
        self.chunked: Seq | None = None
        self.decode_alloc = 0  # KV tokens of generated tokens, not yet in the tree
        # KV tokens of running requests' prompts outside the tree: the tree holds whole pages, so a prompt's
        # last partial page stays the request's own until it finishes (inserted with its output, or freed)
        self.tails = 0
        self.inflight = 0  # KV tokens of prefill chunks being computed, not yet in the tree
        self.owed = 0  # KV tokens owed to admitted requests, not yet allocated (prompt chunks; full rule: decode)
        self.step = 0  # decode steps so far
        self.sum_ctx = 0  # Σ context tokens of the decoding requests
        self.sum_finish = 0  # Σ finish steps of the decoding requests (see SGLangRule.running_offset)
        self.long_decodes = 0  # decoding requests whose remaining decode may exceed clip_max_new_tokens
        # SGLang's ``batch_is_full``: set when admission stops for lack of KV space or running slots, so
        # the queue is not re-planned every decode step; cleared when a request leaves the running batch
        self.batch_is_full = False
        self._wake: simpy.Event | None = None
        self.ticker = Ticker(env)  # its iterations' time (sim/clock.py)
        self.process = env.process(self._loop())
        if events is not None:
            events.attached(self)

    # ------------------------------------------------------------------ arrivals
    def submit(self, seq: Seq) -> None:
        """A request reaches the engine: schedulers see this time as its arrival (FIFO order is the order
        requests reach the engine, as in SGLang's waiting queue)."""
        seq.sent = seq.arrival = now_of(self.env)
        self.waiting.append(seq)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ------------------------------------------------------------------ the loop
    def has_work(self) -> bool:
        """Whether the next iteration runs a batch (admission may still find nothing to admit)."""
        return bool((self.waiting and not self.batch_is_full) or self.chunked or self.decoding)

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        env, cost, ev, host, ticker = self.env, self.cost, self.events, self.host, self.ticker
        while True:
            if host is not None and self.has_work():
                slot = host.acquire(self)
                if slot is not None:
                    yield slot
                host.refresh(self)
            batch = self._prefill_batch() if ((self.waiting and not self.batch_is_full) or self.chunked) else None
            if batch:
                extra = host.settle(self) if host is not None else 0.0
                start = now_of(env)
                for seq, _, _ in batch:
                    if seq.prefill_start < 0:
                        seq.prefill_start = start
                if ev is not None:
                    ev.prefill_started(self, batch)
                wait = ticker.elapse(cost.prefill_time([b[1] for b in batch], [b[2] for b in batch]) + extra)
                if wait is not None:
                    yield wait
                self.counters[PREFILL_ITERATIONS] += 1
                sampled = self._end_prefill(batch)
                if sampled and self.on_tokens is not None:
                    self.on_tokens(now_of(env), sampled)
                if ev is not None:
                    ev.prefill_ended(self, batch)
                if host is not None:
                    host.release(self)
            elif self.decoding:
                if ev is not None:
                    ev.decode_checking(self)
                self.rule.before_decode(self)  # SGLang: retract if one token each does not fit
                if ev is not None:
                    ev.decode_checked(self)
                if not self.decoding:  # a shared pool had no token left for any: all went back to the queue
                    host.settle(self)
                    host.release(self)
                    self.batch_is_full = True  # until pages free (the idle branch waits for them)
                    continue
                n = len(self.decoding)
                self.allocate(n)
                self.decode_alloc += n
                self.rule.decode_allocated(self, n)
                extra = host.settle(self) if host is not None else 0.0
                if ev is not None:
                    ev.decode_started(self, n)
                wait = ticker.elapse(cost.decode_time(n, self.sum_ctx) + extra)
                if wait is not None:
                    yield wait
                self.counters[DECODE_ITERATIONS] += 1
                self.step += 1
                self.sum_ctx += n
                if self.on_tokens is not None:
                    self.on_tokens(now_of(env), n)
                if ev is not None:
                    ev.decode_ended(self, n)
                while self.decoding and self.decoding[0][0] <= self.step:
                    self._finish(self._pop_decoding())
                if host is not None:
                    host.release(self)
            else:
                if host is not None:
                    host.release(self)
                    if self.waiting:  # nothing running and no room to admit: wait for the GPU's memory
                        yield host.changed(self)
                        self.batch_is_full = False
                        continue
                if self.waiting:
                    raise RuntimeError("engine stalled: a waiting request can never be admitted")
                self.rule.idle()
                if ev is not None:
                    ev.idle(self)
                if self.ticker.fed:  # its clock sends the arrivals (sim/clock.py)
                    yield self.ticker.next_arrival()
                    self.ticker.arrived()
                else:  # arrivals come as events: a submit wakes it
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None

    # ------------------------------------------------------------------ KV space
    def free(self) -> int | float:
        """KV tokens neither in the tree nor held by a running request."""
        if self.capacity is None:
            return float("inf")
        return self.capacity - self.cache.size - self.decode_alloc - self.tails - self.inflight

    def reclaimable(self) -> int | float:
        """KV tokens that could be made free: free + evictable."""
        return self.free() + self.cache.evictable_size

    def _available(self) -> int | float:
        """Tokens a new admission may claim: free + evictable − owed."""
        return self.free() + self.cache.evictable_size - self.owed

    def allocate(self, n: int | float) -> None:
        """Make ``n`` tokens free, evicting unlocked leaves as needed (n may be 0: settle a deficit)."""
        short = n - self.free()
        if short > 0:
            self.eviction.prepare(self.cache)
            self.cache.evict(short, self.eviction.key, self._evicting, self.eviction.lowered_keys())
            if self.free() < n:
                raise RuntimeError("KV accounting error: eviction could not make room")

    def drop_cached(self, n: int) -> int:
        """Evict up to ``n`` tokens of unlocked cached prefixes (the engine's host reclaims their memory);
        returns the tokens evicted."""
        if n <= 0 or not self.cache.evictable_size:
            return 0
        self.eviction.prepare(self.cache)
        return self.cache.evict(n, self.eviction.key, self._evicting, self.eviction.lowered_keys())

    def _evicting(self, node) -> None:
        self.counters[EVICTED_TOKENS[self.eviction.tier(node)]] += node.length
        self.counters[EVICTED_NODES] += 1
        if self.events is not None:
            self.events.evicting(self, node)

    # ------------------------------------------------------------------ prefill
    def _prefill_batch(self) -> list[tuple[Seq, int, int]]:
        batch = self._admit()
        if batch:  # as SGLang does, evict once for the whole batch, after every admitted prefix is locked
            self.allocate(0)
        return batch

    def _admit(self) -> list[tuple[Seq, int, int]]:
        """Admit in the policy's order while the budgets and KV space allow (SGLang's ``PrefillAdder``, see
        :mod:`prism.sim.admission`); the batch: [(request, new tokens, cached tokens)]."""
        cfg = self.cfg
        adder = PrefillAdder(cfg, self.rule, self.capacity is not None)
        if self.chunked is not None and not self._continue_chunk(adder):
            return adder.batch
        if not self.waiting or self.batch_is_full:
            return adder.batch
        if len(self.active) >= cfg.max_running_requests:
            self.batch_is_full = True
            return adder.batch
        adder.offset += self.rule.running_offset(self)
        ctx = SchedContext(now_of(self.env), self.cache, tuple(self.active.values()), self.hints,
                           batch_hint=cfg.max_running_requests - len(self.active),
                           token_budget=min(adder.chunk, adder.input), kept=self.kept)
        plan = self.scheduler.plan(self.waiting, ctx)
        self.counters[SCHEDULING_ROUNDS] += 1
        self.rounds += 1
        admitted: list[Seq] = []
        now = now_of(self.env)
        for seq in plan.order:
            if len(self.active) >= cfg.max_running_requests:
                self.batch_is_full = True
                break
            if adder.chunk <= 0 or adder.input <= 0:  # no budget left
                break
            seq.realign(plan.align.get(seq.id))  # it matters once the request reaches the cache: applied here
            key = seq.fill_key()
            hit, node = self.cache.match(key, now, seq.layout, end=len(key) - TOKEN_BYTES)
            self.cache.lock(node)
            new = seq.fill_len - hit
            take, owed = adder.try_add(seq, new, hit, self._available())
            if not take:
                self.cache.unlock(node)
                self.batch_is_full = self.batch_is_full or adder.out_of_kv
                break
            self._start(seq, hit, new, node, take, owed, plan.lane(seq.id))
            seq.admitted_in = self.rounds
            admitted.append(seq)
            if take < new:
                self.chunked = seq
                break
        # admission follows the plan's order and stops at the first refusal; a plan that keeps the queue as it
        # is (FCFS) hands back the queue itself, which loses its admitted head in place
        if plan.order is self.waiting:
            del self.waiting[:len(admitted)]
        elif plan.keep_queue:  # the queue stays in its order, less what this round admitted
            if admitted:
                round_ = self.rounds
                self.waiting = [seq for seq in self.waiting if seq.admitted_in != round_]
        else:
            self.waiting = cast(list, plan.order)[len(admitted):]  # a new list
        self.kept = len(self.waiting)
        self.books.dispatched(admitted, ctx)
        return adder.batch

    def _continue_chunk(self, adder: PrefillAdder) -> bool:
        """The chunked request's next chunk goes first; True if it is its last (admission may go on)."""
        seq = self.chunked
        assert seq is not None
        left = seq.fill_len - seq.kv_len
        take = adder.add_chunk(seq, left)
        self.inflight += take  # owed since its admission
        self.owed -= take
        if take < left:
            return False
        self.chunked = None
        return True

    def _start(self, seq: Seq, hit: int, new: int, node, take: int, owed: int, lane: str) -> None:
        """``seq`` joins the running batch with ``hit`` tokens cached (``node`` locked) and ``new`` to compute,
        the first ``take`` of them in this batch; the engine owes it ``owed`` KV tokens."""
        again = seq.retracted_output > 0
        seq.kv_len = hit
        if not again:
            seq.hit = hit
        seq.node = node
        self.owed += owed - take  # the batch computes its first take tokens
        self.inflight += take
        self.active[seq.id] = seq
        self.books.admit(seq, lane, hit, new, again)
        if self.on_admit is not None:
            self.on_admit(seq)
        if self.events is not None:
            self.events.admitted(self, seq, hit)

    def _push_decoding(self, seq: Seq) -> None:
        heapq.heappush(self.decoding, (seq.finish_step, seq))
        self.sum_finish += seq.finish_step
        self.long_decodes += seq.output_len > self.cfg.clip_max_new_tokens  # its remaining decode is shorter

    def _pop_decoding(self) -> Seq:
        seq = heapq.heappop(self.decoding)[1]
        self.sum_finish -= seq.finish_step
        self.long_decodes -= seq.output_len > self.cfg.clip_max_new_tokens
        return seq

    def _end_prefill(self, batch: list[tuple[Seq, int, int]]) -> int:
        """The batch's chunks are in the tree; a request whose prompt is done samples its token. Returns how many
        did."""
        now = now_of(self.env)
        sampled = 0
        for seq, take, _ in batch:
            tail = seq.kv_len - seq.node.depth  # computed before this chunk, not in the tree
            seq.kv_len += take
            self.inflight -= take
            _, node = self.cache.insert(seq.fill_key(), now, seq.layout, start=seq.node, end=seq.kv_len * TOKEN_BYTES)
            self.tails += seq.kv_len - node.depth - tail
            self.cache.relock(seq.node, node)
            seq.node = node
            if seq.kv_len < seq.fill_len:
                continue
            if not seq.retracted_output:
                seq.prefill_end = now
                seq.first_token = now + self.cost.first_token_s
            generated = seq.retracted_output + 1  # a prefill samples one token
            sampled += 1
            if generated == seq.output_len:
                self._finish(seq)
            else:
                seq.finish_step = self.step + seq.output_len - generated
                self.sum_ctx += seq.prompt_len + generated
                self._push_decoding(seq)
        return sampled

    # ------------------------------------------------------------------ finish
    def _finish(self, seq: Seq) -> None:
        now = now_of(self.env)
        generated = seq.output_len - 1  # the last token's KV is never computed
        if generated:
            full = seq.key + output_token_bytes(generated)
            self.cache.insert(full, now, seq.layout, start=seq.node)
            self.decode_alloc -= generated - seq.retracted_output  # the retracted output came with its last prefill
        if seq.finish_step:  # it decoded (finish_step is 0 when its prefill made its last token)
            self.sum_ctx -= seq.prompt_len + seq.output_len
        self._release(seq)
        seq.finish = max(now, seq.first_token)
        if self.events is not None:
            self.events.finished(self, seq)
        if self.on_finish is not None:
            self.on_finish(seq)

    def _release(self, seq: Seq) -> None:
        """A request leaves the running batch (finished or retracted): its partial page and its lock go."""
        self.tails -= seq.fill_len - seq.node.depth  # its partial page: in the tree now, or freed
        self.cache.unlock(seq.node)
        seq.node = None
        self.batch_is_full = False
        del self.active[seq.id]
        self.books.release(seq)

    # ------------------------------------------------------------------ retraction (sglang admission)
    def retract(self, seq: Seq) -> None:
        """Free a running request's KV without inserting it (its prompt stays in the tree, unlocked); it
        will be prefilled again with the tokens it generated (:meth:`requeue_retracted`)."""
        generated = seq.generated(self.step)
        self.decode_alloc -= generated - 1 - seq.retracted_output
        self.sum_ctx -= seq.prompt_len + generated
        self._release(seq)
        self.counters[RETRACTIONS] += 1
        self.counters[RETRACTED_OUTPUT_TOKENS] += generated
        seq.retracted_output = generated
        seq.kv_len = 0
        seq.finish_step = 0
        if self.events is not None:
            self.events.retracted(self, seq)

    def requeue_retracted(self, retracted: list[Seq]) -> None:
        """After a retraction: the decoding heap keeps the others; the retracted go to the back of the queue,
        as SGLang appends them to its waiting queue."""
        gone = {s.id for s in retracted}
        kept = [s for _, s in self.decoding if s.id not in gone]
        self.decoding, self.sum_finish, self.long_decodes = [], 0, 0
        for s in kept:
            self._push_decoding(s)
        self.waiting.extend(retracted)
