"""One SGLang-like serving instance as a SimPy process.

The story of one iteration, as in SGLang's scheduler loop (prefill has priority over decode):

1. If requests wait (or a chunked prefill is under way), the scheduling policy orders the waiting queue and
   the engine admits in that order while the chunked-prefill budget, ``max_prefill_tokens``,
   ``max_running_requests`` and KV space allow. KV space counts evictable cache and reserves every admitted
   request's remaining prompt chunks and decode tokens, so a running request is never preempted. A prompt
   longer than the remaining chunk budget is cut; its next chunk goes first in the next prefill batch.
   The tree holds whole pages: a prompt's last partial page is the request's own KV, in use until it
   finishes (then inserted with the generated tokens, or freed).
2. Otherwise, if requests are running, one decode step generates one token for each of them.
3. Otherwise the engine sleeps until a request arrives.

Each iteration lasts what the calibrated cost model says. The prompt (or its processed part) is inserted
into the radix cache after each prefill chunk and stays locked while the request runs; the full sequence
(prompt and generated tokens) is inserted when the request finishes, and then unlocked.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Callable

import simpy

from prism.calibration.cost_model import CostModel
from prism.core import SegmentedPrompt, realigned, PRIV, REUSE, SYS, TOKEN_BYTES, Request, Segment, layout, output_token_bytes, serialize
from prism.policies.base import DemandHints, EvictionPolicy, SchedContext, Scheduler
from prism.settings import EngineConfig  # the engine's limits, named after SGLang's server arguments

from prism.sim.radix_cache import RadixCache


class Seq(SegmentedPrompt):
    """A request inside the engine: the trace request plus its current prompt order and timestamps."""

    __slots__ = ("req", "id", "arrival", "output_len", "fixed_order", "prompt_len",
                 "sent", "prefill_start", "prefill_end", "first_token", "finish", "hit", "done", "node",
                 "finish_step", "lane", "realigned")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.id = req.id
        self.arrival = req.arrival  # when this engine received it (set on submit); the trace's is req.arrival
        self.output_len = req.output_len
        self.fixed_order = req.fixed_order
        self.prompt_len = req.prompt_len  # the same in any segment order
        self.set_segments(req.segments)
        self.sent = self.prefill_start = self.prefill_end = self.first_token = self.finish = -1.0
        self.hit = 0
        self.done = 0  # prompt tokens whose KV exists (cached or computed)
        self.node = None
        self.finish_step = 0
        self.lane = ""
        self.realigned = False

    def realign(self, skeleton: tuple[str, ...] | None) -> bool:
        """Put the reusable segments in ``skeleton`` order (same multiset; None: keep the order, as a plan
        says for requests it does not move); True if the order changed.

        The system prompt stays first and private segments last; ``fixed_order`` prompts never move."""
        if skeleton is None or self.fixed_order:
            return False
        segments = realigned(self.segments, skeleton, self.id)
        if segments is None:
            return False
        self.set_segments(segments)
        self.realigned = True
        return True

    def shared_ids(self):
        """Ids of the segments other requests may share (system and reusable), as the demand counters see them."""
        return (s.id for s in self.segments if s.kind != PRIV)

    def __lt__(self, other: "Seq") -> bool:  # heap tie-break
        return self.id < other.id


class Engine:
    """One instance: a clock (the SimPy environment), a waiting queue, a running batch and a radix cache."""

    def __init__(self, env: simpy.Environment, config: EngineConfig, cost: CostModel, scheduler: Scheduler,
                 eviction: EvictionPolicy, capacity: int | None, hints: DemandHints | None = None,
                 on_finish: Callable[[Seq], None] | None = None) -> None:
        self.env = env
        self.cfg = config
        self.cost = cost
        self.scheduler = scheduler
        self.eviction = eviction
        self.hints = hints if hints is not None else eviction.hints
        self.capacity = capacity
        self.cache = RadixCache(capacity, config.page_size, anchors=eviction.needs_anchors)
        self.on_finish = on_finish
        self.waiting: list[Seq] = []
        self.active: dict[int, Seq] = {}  # admitted, not finished
        self.decoding: list[tuple[int, Seq]] = []  # heap by finish step
        self.chunked: Seq | None = None
        self.decode_alloc = 0  # KV tokens of generated tokens, not yet in the tree
        # KV tokens of running requests' prompts outside the tree: the tree holds whole pages, so a prompt's
        # last partial page stays the request's own until it finishes (inserted with its output, or freed)
        self.tails = 0
        self.inflight = 0  # KV tokens of prefill chunks being computed, not yet in the tree
        self.reserved = 0  # KV tokens promised to admitted requests, not yet allocated
        self.step = 0  # decode steps so far
        self.sum_ctx = 0  # Σ context tokens of the decoding requests
        self.counters: Counter = Counter()
        # SGLang's ``batch_is_full``: set when admission stops for lack of KV space or running slots, so
        # the queue is not re-planned every decode step; cleared when a request finishes.
        self.full = False
        self._wake: simpy.Event | None = None
        self.process = env.process(self._loop())

    # ------------------------------------------------------------------ arrivals
    def submit(self, seq: Seq) -> None:
        """A request reaches the engine: schedulers see this time as its arrival (FIFO order is the order
        requests reach the engine, as in SGLang's waiting queue)."""
        seq.sent = seq.arrival = self.env.now
        self.waiting.append(seq)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ------------------------------------------------------------------ the loop
    def _loop(self):
        env, cost = self.env, self.cost
        while True:
            batch = self._form_prefill_batch() if ((self.waiting and not self.full) or self.chunked) else None
            if batch:
                start = env.now
                for seq, _, _ in batch:
                    if seq.prefill_start < 0:
                        seq.prefill_start = start
                yield env.timeout(cost.prefill_time([b[1] for b in batch], [b[2] for b in batch]))
                self.counters["prefill_iterations"] += 1
                self._end_prefill(batch)
            elif self.decoding:
                n = len(self.decoding)
                self._allocate(n)
                self.decode_alloc += n
                self.reserved -= n
                yield env.timeout(cost.decode_time(n, self.sum_ctx))
                self.counters["decode_iterations"] += 1
                self.step += 1
                self.sum_ctx += n
                while self.decoding and self.decoding[0][0] <= self.step:
                    self._finish(heapq.heappop(self.decoding)[1])
            else:
                if self.waiting:
                    raise RuntimeError("engine stalled: a waiting request can never be admitted")
                self._wake = env.event()
                yield self._wake
                self._wake = None

    # ------------------------------------------------------------------ KV space
    def _free(self) -> float:
        if self.capacity is None:
            return float("inf")
        return self.capacity - self.cache.size - self.decode_alloc - self.tails - self.inflight

    def _available(self) -> float:
        """Tokens a new admission may claim: free + evictable − promised."""
        return self._free() + self.cache.evictable_size - self.reserved

    def _allocate(self, n: int) -> None:
        """Make ``n`` tokens free, evicting unlocked leaves as needed (n may be 0: settle a deficit)."""
        short = n - self._free()
        if short > 0:
            self.eviction.prepare(self.cache)
            self.cache.evict(short, self.eviction.key, self._count_eviction, self.eviction.lowered_keys())
            if self._free() < n:
                raise RuntimeError("KV accounting error: eviction could not make room")

    def _count_eviction(self, node) -> None:
        self.counters[f"evicted_tokens_{self.eviction.tier(node)}"] += node.length
        self.counters["evicted_nodes"] += 1

    # ------------------------------------------------------------------ prefill
    def _form_prefill_batch(self) -> list[tuple[Seq, int, int]]:
        batch = self._admit()
        if batch:  # as SGLang does, evict once for the whole batch, after every admitted prefix is locked
            self._allocate(0)
        return batch

    def _admit(self) -> list[tuple[Seq, int, int]]:
        """Admit in the policy's order while budgets and KV space allow; [(request, new tokens, cached)]."""
        cfg, now, page = self.cfg, self.env.now, self.cfg.page_size
        batch: list[tuple[Seq, int, int]] = []
        rem_chunk, rem_input = cfg.chunked_prefill_size, cfg.max_prefill_tokens
        if self.chunked is not None:
            seq = self.chunked
            left = seq.prompt_len - seq.done
            take = left if left <= rem_chunk else rem_chunk - rem_chunk % page
            self._take(seq, take)
            batch.append((seq, take, seq.done))
            rem_chunk -= take
            rem_input -= take
            if take < left:
                return batch
            self.chunked = None
        if not self.waiting or self.full:
            return batch
        if len(self.active) >= cfg.max_running_requests:
            self.full = True
            return batch
        ctx = SchedContext(now, self.cache, tuple(self.active.values()), self.hints,
                           batch_hint=cfg.max_running_requests - len(self.active))
        plan = self.scheduler.plan(self.waiting, ctx)
        admitted: list[Seq] = []
        for seq in plan.order:
            if len(self.active) >= cfg.max_running_requests:
                self.full = True
                break
            if rem_chunk <= 0 or rem_input <= 0:
                break
            seq.realign(plan.align.get(seq.id))  # it matters once the request reaches the cache: applied here
            hit, node = self.cache.match(seq.key[:-TOKEN_BYTES], now, seq.layout)
            new = seq.prompt_len - hit
            self.cache.lock(node)
            need = new + seq.output_len - 1
            if self.capacity is not None and need > self._available():
                self.cache.unlock(node)
                self.full = True
                break
            if new > rem_input and batch:
                self.cache.unlock(node)
                break
            take = new if new <= rem_chunk else rem_chunk - rem_chunk % page
            if take <= 0:
                self.cache.unlock(node)
                break
            seq.hit = seq.done = hit
            seq.node = node
            if not seq.lane:  # a front end may have set it already
                seq.lane = plan.lane(seq.id)
            self.counters["front_alignment_moves"] += seq.realigned  # admitted in a new segment order
            self.reserved += need
            self._take(seq, take)
            batch.append((seq, take, hit))
            admitted.append(seq)
            self.active[seq.id] = seq
            self.eviction.on_admit(seq)
            for r in seq.shared_ids():
                self.hints.active[r] += 1
            rem_chunk -= take
            rem_input -= take
            if take < new:
                self.chunked = seq
                break
        # admission follows the plan's order and stops at the first refusal; a plan that keeps the queue as it
        # is (FCFS) hands back the queue itself, which loses its admitted head in place
        if plan.order is self.waiting:
            del self.waiting[:len(admitted)]
        else:
            self.waiting = list(plan.order[len(admitted):])
        if admitted:
            for seq in admitted:
                self.counters[f"admitted_{seq.lane}_lane"] += 1
            self.scheduler.on_dispatch(admitted, ctx)
        return batch

    def _take(self, seq: Seq, take: int) -> None:
        """Claim KV for the next ``take`` prompt tokens of ``seq`` (already reserved); the batch's eviction
        settles the space before the iteration runs."""
        self.inflight += take
        self.reserved -= take

    def _end_prefill(self, batch: list[tuple[Seq, int, int]]) -> None:
        now = self.env.now
        for seq, take, _ in batch:
            tail = seq.done - seq.node.depth  # computed before this chunk, not in the tree
            seq.done += take
            self.inflight -= take
            _, node = self.cache.insert(seq.key[:seq.done * TOKEN_BYTES], now, seq.layout, start=seq.node)
            self.tails += seq.done - node.depth - tail
            self.cache.relock(seq.node, node)
            seq.node = node
            if seq.done < seq.prompt_len:
                continue
            seq.prefill_end = now
            seq.first_token = now + self.cost.first_token_s
            if seq.output_len == 1:
                self._finish(seq)
            else:
                seq.finish_step = self.step + seq.output_len - 1
                self.sum_ctx += seq.prompt_len + 1
                heapq.heappush(self.decoding, (seq.finish_step, seq))

    # ------------------------------------------------------------------ finish
    def _finish(self, seq: Seq) -> None:
        now = self.env.now
        generated = seq.output_len - 1  # the last token's KV is never computed
        if generated:
            full = seq.key + output_token_bytes(generated)
            self.cache.insert(full, now, seq.layout, start=seq.node)
            self.decode_alloc -= generated
            self.sum_ctx -= seq.prompt_len + seq.output_len
        self.tails -= seq.prompt_len - seq.node.depth  # its partial page: in the tree now, or freed
        self.cache.unlock(seq.node)
        seq.node = None
        self.full = False
        seq.finish = max(now, seq.first_token)
        del self.active[seq.id]
        for r in seq.shared_ids():
            c = self.hints.active[r] - 1
            if c:
                self.hints.active[r] = c
            else:
                del self.hints.active[r]
        if self.on_finish is not None:
            self.on_finish(seq)
