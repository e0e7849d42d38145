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
from prism.core import TOKEN_BYTES, Request, SegmentedPrompt, output_token_bytes, realigned
from prism.policies.base import DemandHints, EvictionPolicy, SchedContext, Scheduler
from prism.settings import EngineConfig  # the engine's limits, named after SGLang's server arguments

from prism.sim.admission import NewTokenRatio, keep_order
from prism.sim.radix_cache import RadixCache


class Seq(SegmentedPrompt):
    """A request inside the engine: the trace request plus its current prompt order and timestamps."""

    __slots__ = ("req", "id", "arrival", "output_len", "fixed_order", "prompt_len",
                 "sent", "prefill_start", "prefill_end", "first_token", "finish", "hit", "done", "node",
                 "finish_step", "lane", "realigned", "resumed")

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
        self.resumed = 0  # tokens generated before its last retraction: prefilled again with the prompt

    @property
    def fill_len(self) -> int:
        """Tokens its (next) prefill covers: the prompt, and after a retraction the tokens generated so far."""
        return self.prompt_len + self.resumed

    def fill_key(self) -> bytes:
        return self.key + output_token_bytes(self.resumed) if self.resumed else self.key

    def generated(self, step: int) -> int:
        """Output tokens so far of a decoding request at decode step ``step`` (the first comes with prefill)."""
        return self.output_len - (self.finish_step - step)

    def realign(self, skeleton: tuple[str, ...] | None) -> bool:
        """Put the reusable segments in ``skeleton`` order (same multiset; None: keep the order, as a plan
        says for requests it does not move); True if the order changed.

        The system prompt stays first and private segments last; ``fixed_order`` prompts never move."""
        if skeleton is None or self.fixed_order or self.resumed:  # a resumed request's KV order is settled
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
        self.reserved = 0  # KV tokens promised to admitted requests, not yet allocated (full admission: decode too)
        self.sglang_admission = config.admission == "sglang"
        self.ratio = NewTokenRatio(config.init_new_token_ratio, config.min_new_token_ratio_factor,
                                   config.new_token_ratio_decay_steps)
        self.step = 0  # decode steps so far
        self.sum_ctx = 0  # Σ context tokens of the decoding requests
        self.sum_finish = 0  # Σ finish steps of the decoding requests (see _running_estimate)
        self.long_decodes = 0  # decoding requests whose remaining decode may exceed clip_max_new_tokens
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
                if self.sglang_admission:
                    self._check_decode_memory()
                n = len(self.decoding)
                self._allocate(n)
                self.decode_alloc += n
                if not self.sglang_admission:
                    self.reserved -= n
                yield env.timeout(cost.decode_time(n, self.sum_ctx))
                self.counters["decode_iterations"] += 1
                self.step += 1
                self.sum_ctx += n
                while self.decoding and self.decoding[0][0] <= self.step:
                    self._finish(self._pop_decoding())
            else:
                if self.waiting:
                    raise RuntimeError("engine stalled: a waiting request can never be admitted")
                self.ratio.reset()  # SGLang resets the estimate when it goes idle
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
        promised = 0.0  # sglang admission: decode estimates of running requests and of this batch's
        if self.chunked is not None:
            seq = self.chunked
            left = seq.fill_len - seq.done
            take = left if left <= rem_chunk else rem_chunk - rem_chunk % page
            self._take(seq, take)
            batch.append((seq, take, seq.done))
            rem_chunk -= take
            rem_input -= take
            if take < left:
                return batch
            self.chunked = None
            promised += self._batch_charge(seq, take, last=True)
        if not self.waiting or self.full:
            return batch
        if len(self.active) >= cfg.max_running_requests:
            self.full = True
            return batch
        if self.sglang_admission and self.capacity is not None:
            promised += self._running_estimate()
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
            hit, node = self.cache.match(seq.fill_key()[:-TOKEN_BYTES], now, seq.layout)
            new = seq.fill_len - hit
            self.cache.lock(node)
            if self.sglang_admission:  # SGLang's check: extend + decode + one page < free + evictable − promised
                need = new
                fits = new + self._max_new(seq) + page < self._available() - promised
            else:
                need = new + seq.output_len - 1
                fits = need <= self._available()
            if self.capacity is not None and not fits:
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
            if seq.resumed:
                self.counters["reprefill_hit_tokens"] += hit
                self.counters["reprefilled_tokens"] += new
                seq.done = hit
            else:
                seq.hit = seq.done = hit
            seq.node = node
            if not seq.lane:  # a front end may have set it already
                seq.lane = plan.lane(seq.id)
            self.counters["front_alignment_moves"] += seq.realigned  # admitted in a new segment order
            self.reserved += need
            self._take(seq, take)
            promised += self._batch_charge(seq, take, last=take == new)
            batch.append((seq, take, hit))
            admitted.append(seq)
            self.active[seq.id] = seq
            self.eviction.on_admit(seq)
            self.hints.admit(seq.shared_ids())
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

    def _max_new(self, seq: Seq) -> int:
        """SGLang's decode reservation of a request at admission: what it may still generate, clipped."""
        return min(seq.output_len - seq.resumed, self.cfg.clip_max_new_tokens)

    def _batch_charge(self, seq: Seq, take: int, last: bool) -> int:
        """What SGLang's prefill budget charges an admission beyond the ``take`` tokens the engine claims
        (sglang admission): page rounding and one page, and the decode once its last chunk is in."""
        if not self.sglang_admission:
            return 0
        page = self.cfg.page_size
        return -take % page + page + (self._max_new(seq) if last else 0)

    def _running_estimate(self) -> float:
        """SGLang's offset for running requests: remaining decode (clipped) x the new-token ratio.

        It is asked at every admission round, over a running batch of hundreds on a GPU-sized pool: while no
        running request's remaining decode can reach the clip, the sum is kept (Σ finish steps − n · step)."""
        clip, step = self.cfg.clip_max_new_tokens, self.step
        if not self.long_decodes:
            remaining = self.sum_finish - len(self.decoding) * step
        else:
            remaining = sum(min(s.finish_step - step, clip) for _, s in self.decoding)
        return remaining * self.ratio.current

    def _push_decoding(self, seq: Seq) -> None:
        heapq.heappush(self.decoding, (seq.finish_step, seq))
        self.sum_finish += seq.finish_step
        self.long_decodes += seq.output_len > self.cfg.clip_max_new_tokens  # its remaining decode is shorter

    def _pop_decoding(self) -> Seq:
        seq = heapq.heappop(self.decoding)[1]
        self.sum_finish -= seq.finish_step
        self.long_decodes -= seq.output_len > self.cfg.clip_max_new_tokens
        return seq

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
            _, node = self.cache.insert(seq.fill_key()[:seq.done * TOKEN_BYTES], now, seq.layout, start=seq.node)
            self.tails += seq.done - node.depth - tail
            self.cache.relock(seq.node, node)
            seq.node = node
            if seq.done < seq.fill_len:
                continue
            if not seq.resumed:
                seq.prefill_end = now
                seq.first_token = now + self.cost.first_token_s
            generated = seq.resumed + 1  # a prefill samples one token
            if generated == seq.output_len:
                self._finish(seq)
            else:
                seq.finish_step = self.step + seq.output_len - generated
                self.sum_ctx += seq.prompt_len + generated
                self._push_decoding(seq)

    # ------------------------------------------------------------------ finish
    def _finish(self, seq: Seq) -> None:
        now = self.env.now
        generated = seq.output_len - 1  # the last token's KV is never computed
        if generated:
            full = seq.key + output_token_bytes(generated)
            self.cache.insert(full, now, seq.layout, start=seq.node)
            self.decode_alloc -= generated - seq.resumed  # the resumed tokens came with its last prefill
        if seq.finish_step:  # it decoded (finish_step is 0 when its prefill made its last token)
            self.sum_ctx -= seq.prompt_len + seq.output_len
        self._release(seq)
        seq.finish = max(now, seq.first_token)
        if self.on_finish is not None:
            self.on_finish(seq)

    def _release(self, seq: Seq) -> None:
        """A request leaves the running batch (finished or retracted): its partial page and its lock go."""
        self.tails -= seq.fill_len - seq.node.depth  # its partial page: in the tree now, or freed
        self.cache.unlock(seq.node)
        seq.node = None
        self.full = False
        del self.active[seq.id]
        self.hints.release(seq.shared_ids())

    # ------------------------------------------------------------------ retraction (sglang admission)
    def _check_decode_memory(self) -> None:
        """Before a decode step: SGLang's ``update_running_batch``. If one token per running request does
        not fit after evicting every unlocked leaf, retract (see :mod:`prism.sim.admission`); otherwise the
        new-token ratio decays."""
        if self.capacity is None or len(self.decoding) <= self._free() + self.cache.evictable_size:
            self.ratio.decay_step()
            return
        step, keep = self.step, self.cfg.retract_decode_steps
        order = keep_order(list(self.active.values()), lambda s: s.generated(step), lambda s: s.prompt_len)
        retracted = []
        while len(order) > 1 and (not retracted or len(order) > self._free() + self.cache.evictable_size):
            seq = order.pop()
            self._retract(seq)
            retracted.append(seq)
            # SGLang puts the freed space to use at once: evict until the kept requests have ``keep`` steps
            self._allocate(min(len(order) * keep, self._free() + self.cache.evictable_size))
        gone = {s.id for s in retracted}
        kept = [s for _, s in self.decoding if s.id not in gone]
        self.decoding, self.sum_finish, self.long_decodes = [], 0, 0
        for s in kept:
            self._push_decoding(s)
        self.ratio.after_retract(sum(s.generated(step) for s in order), sum(s.output_len for s in order),
                                 len(order), keep)
        self.waiting.extend(retracted)  # SGLang appends a retracted request to its waiting queue

    def _retract(self, seq: Seq) -> None:
        """Free a running request's KV without inserting it (its prompt stays in the tree, unlocked); it
        will be prefilled again with the tokens it generated."""
        generated = seq.generated(self.step)
        self.decode_alloc -= generated - 1 - seq.resumed
        self.sum_ctx -= seq.prompt_len + generated
        self._release(seq)
        self.counters["retractions"] += 1
        self.counters["retracted_output_tokens"] += generated
        seq.resumed = generated
        seq.done = 0
        seq.finish_step = 0
