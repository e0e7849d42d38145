"""How the engine admits a prefill batch: SGLang's budgets (:class:`PrefillAdder`) and the KV rule that
``engine.admission`` names (:data:`RULES`), with SGLang's retraction.

**The budgets** (``PrefillAdder`` in sglang 0.5.23 ``managers/schedule_policy.py``): a batch takes new tokens
while the chunk budget (``chunked_prefill_size``) and the batch's input budget (``max_prefill_tokens``) last; a
prompt longer than the chunk budget left is cut to whole pages (its next chunk goes first in the next batch);
a request whose new tokens exceed the input budget left waits, unless the batch is empty.

**The KV rule ``sglang``.** SGLang does not reserve a running request's whole decode. ``PrefillAdder`` admits a
request when ``extend + min(max_new_tokens, CLIP) + page < free + evictable − offsets``, where the offsets
are, for every running request, ``min(max_new_tokens − generated, CLIP) × new_token_ratio``, and for every
request admitted earlier in the same batch its page-rounded extend, one page and its whole
``min(max_new_tokens, CLIP)``. (A request with ``ignore_eos`` counts with ratio 1: the ``full`` rule.)

The ratio (``managers/scheduler_components/new_token_ratio_tracker.py``) starts at
``SGLANG_INIT_NEW_TOKEN_RATIO`` (0.7), falls by ``(init − floor) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` (600)
on every decode step that needs no retraction, down to ``init × SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` (0.14),
and returns to ``init`` when the scheduler goes idle. When a decode step finds no KV for one token per running
request even after evicting every unlocked leaf (``check_decode_mem``), ``retract_decode``
(``managers/schedule_batch.py``) gives up requests from the end of the order below — fewest generated tokens
first, the longest prompt first among equals — at least one, then until the step fits, always keeping one
(but on a pool shared with other models, ``Engine.shared_pool``, where one may not fit: then none).
Each retracted request frees its KV without inserting it into the tree (its prompt, inserted after prefill,
stays cached and becomes evictable), ``(kept requests) × SGLANG_RETRACT_DECODE_STEPS`` (20) tokens are made
free by evicting, and the request goes back to the waiting queue: it will be prefilled again, prompt and
generated tokens, hitting whatever of its prefix survived. The ratio becomes
``min(1, (Σ generated + 20 × kept) / (Σ max_new_tokens + 1))`` over the requests kept.

**The KV rule ``full``**: every request's whole decode is reserved at admission (prism's older rule); a
running request is never preempted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from prism.settings import EngineConfig

if TYPE_CHECKING:  # the engine drives the rules; they read and act on it
    from prism.sim.engine import Engine, Seq


class NewTokenRatio:
    """SGLang's ``NewTokenRatioTracker``: the fraction of a running request's remaining decode admission
    reserves."""

    __slots__ = ("init", "floor", "decay", "current")

    def __init__(self, init: float, min_factor: float, decay_steps: int) -> None:
        self.init = min(init, 1.0)
        self.floor = min(self.init * min_factor, 1.0)
        self.decay = (self.init - self.floor) / decay_steps
        self.current = self.init

    def decay_step(self) -> None:
        """A decode step ran without retraction."""
        c = self.current - self.decay  # max() costs a call at every decode step
        self.current = c if c > self.floor else self.floor

    def reset(self) -> None:
        """The scheduler went idle."""
        self.current = self.init

    def after_retract(self, kept_generated: int, kept_max_new: int, kept: int, retract_steps: int) -> None:
        """The estimate after a retraction, from the requests kept: what they generated so far plus
        ``retract_steps`` tokens each, over what they may generate in all."""
        self.current = min(1.0, (kept_generated + retract_steps * kept) / (kept_max_new + 1))


def retraction_key(generated: int, prompt_len: int) -> tuple[int, int]:
    """SGLang keeps requests in decreasing order of this key and retracts from the end: the request with the
    fewest generated tokens, and among those the one with the longest prompt, goes first."""
    return generated, -prompt_len


def keep_order(requests: list[Any], generated, prompt_len) -> list[Any]:
    """``requests`` from most to least preferred to keep (a stable sort, as SGLang's over batch order)."""
    return sorted(requests, key=lambda r: retraction_key(generated(r), prompt_len(r)), reverse=True)


# ---------------------------------------------------------------------------------------------- the KV rules
class SGLangRule:
    """``engine.admission: sglang``: SGLang's admission estimate and retraction (module docstring)."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.page, self.clip, self.keep_steps = cfg.page_size, cfg.clip_max_new_tokens, cfg.retract_decode_steps
        self.ratio = NewTokenRatio(cfg.init_new_token_ratio, cfg.min_new_token_ratio_factor,
                                   cfg.new_token_ratio_decay_steps)

    def max_new(self, seq: Seq) -> int:
        """The decode SGLang reserves for a request at admission: what it may still generate, clipped."""
        return min(seq.output_len - seq.retracted_output, self.clip)

    #: the engine owes an admitted request its prompt's KV only (its decode is estimated, and may retract)
    owes_decode: ClassVar[bool] = False

    def fits(self, seq: Seq, new: int, available: int | float, offset: float) -> bool:
        return new + self.max_new(seq) + self.page < available - offset

    def charge(self, seq: Seq, take: int, last: bool) -> int:
        """What the batch's offset adds for an admission beyond the ``take`` tokens the engine claims: page
        rounding and one page, and the decode once its last chunk is in."""
        return -take % self.page + self.page + (self.max_new(seq) if last else 0)

    def running_offset(self, eng: Engine) -> float:
        """The offset for running requests: remaining decode (clipped) x the new-token ratio.

        It is asked at every admission round, over a running batch of hundreds on a GPU-sized pool: while no
        running request's remaining decode can reach the clip, the sum is kept (Σ finish steps − n · step)."""
        if eng.capacity is None:
            return 0.0
        clip, step = self.clip, eng.step
        if not eng.long_decodes:
            remaining = eng.sum_finish - len(eng.decoding) * step
        else:
            remaining = sum(min(s.finish_step - step, clip) for _, s in eng.decoding)
        return remaining * self.ratio.current

    def before_decode(self, eng: Engine) -> None:
        """SGLang's ``update_running_batch``: if one token per running request does not fit after evicting
        every unlocked leaf, retract; otherwise the ratio decays."""
        if eng.capacity is None or len(eng.decoding) <= eng.reclaimable():
            self.ratio.decay_step()
            return
        step = eng.step
        order = keep_order(list(eng.active.values()), lambda s: s.generated(step), lambda s: s.prompt_len)
        retracted: list[Seq] = []
        keep = 0 if eng.shared_pool else 1  # SGLang's own pool holds any one request; a shared one may not
        while len(order) > keep and (not retracted or len(order) > eng.reclaimable()):
            seq = order.pop()
            eng.retract(seq)
            retracted.append(seq)
            # SGLang puts the freed space to use at once: evict until the kept requests have ``keep`` steps
            eng.allocate(min(len(order) * self.keep_steps, eng.reclaimable()))
        eng.requeue_retracted(retracted)
        self.ratio.after_retract(sum(s.generated(step) for s in order), sum(s.output_len for s in order),
                                 len(order), self.keep_steps)

    def decode_allocated(self, eng: Engine, n: int) -> None:
        """A decode step's ``n`` tokens were allocated (nothing was owed for them)."""

    def idle(self) -> None:
        self.ratio.reset()  # SGLang resets the estimate when it goes idle


class FullRule:
    """``engine.admission: full``: a request's whole decode is owed from its admission; nothing is retracted."""

    #: the engine owes an admitted request its prompt's KV and its whole decode
    owes_decode: ClassVar[bool] = True

    def __init__(self, cfg: EngineConfig) -> None:
        pass

    def fits(self, seq: Seq, new: int, available: int | float, offset: float) -> bool:
        return new + seq.output_len - 1 <= available  # the last token's KV is never computed

    def charge(self, seq: Seq, take: int, last: bool) -> int:
        return 0

    def running_offset(self, eng: Engine) -> float:
        return 0.0

    def before_decode(self, eng: Engine) -> None:
        pass

    def decode_allocated(self, eng: Engine, n: int) -> None:
        eng.owed -= n  # owed since admission

    def idle(self) -> None:
        pass


#: ``engine.admission`` -> its rule
RULES: dict[str, type[SGLangRule] | type[FullRule]] = {"sglang": SGLangRule, "full": FullRule}


# ---------------------------------------------------------------------------------------------- the budgets
class PrefillAdder:
    """One prefill batch being formed: its entries ``(request, new tokens, cached tokens)``, the chunk and
    input budgets left, and the KV ``offset`` the rule has charged so far (module docstring)."""

    __slots__ = ("rule", "page", "chunk", "input", "offset", "bounded", "batch", "out_of_kv")

    def __init__(self, cfg: EngineConfig, rule: SGLangRule | FullRule, bounded: bool) -> None:
        self.rule, self.page, self.bounded = rule, cfg.page_size, bounded
        self.chunk, self.input = cfg.chunked_prefill_size, cfg.max_prefill_tokens
        self.offset = 0.0
        self.batch: list[tuple[Seq, int, int]] = []
        self.out_of_kv = False  # a request was refused for lack of KV (SGLang's batch_is_full)

    def add_chunk(self, seq: Seq, left: int) -> int:
        """The next chunk of a chunked request (its KV is owed already): the tokens it takes now."""
        take = left if left <= self.chunk else self.chunk - self.chunk % self.page
        self.batch.append((seq, take, seq.kv_len))
        self.chunk -= take
        self.input -= take
        if take == left:
            self.offset += self.rule.charge(seq, take, True)
        return take

    def try_add(self, seq: Seq, new: int, cached: int, available: int | float) -> tuple[int, int]:
        """Add ``seq`` with ``new`` tokens to compute after ``cached`` ones, ``available`` KV tokens left for
        admissions: (tokens it takes now, KV tokens the engine owes it), or (0, 0) when it does not fit. A
        prompt longer than the chunk budget left is cut to the whole pages it has."""
        rule = self.rule
        if self.bounded and not rule.fits(seq, new, available, self.offset):
            self.out_of_kv = True
            return 0, 0
        if new > self.input and self.batch:
            return 0, 0
        take = new if new <= self.chunk else self.chunk - self.chunk % self.page
        if take <= 0:
            return 0, 0
        self.batch.append((seq, take, cached))
        self.chunk -= take
        self.input -= take
        self.offset += rule.charge(seq, take, take == new)
        return take, (new + seq.output_len - 1 if rule.owes_decode else new)
