"""SGLang's KV admission estimate and retraction rule (sglang 0.5.23), as the engine applies them.

SGLang does not reserve a running request's whole decode. ``PrefillAdder`` (``managers/schedule_policy.py``)
admits a request when ``extend + min(max_new_tokens, CLIP) + page < free + evictable − offsets``, where the
offsets are, for every running request, ``min(max_new_tokens − generated, CLIP) × new_token_ratio``, and for
every request admitted earlier in the same batch its page-rounded extend, one page and its whole
``min(max_new_tokens, CLIP)``. (A request with ``ignore_eos`` counts with ratio 1: the ``full`` admission.)

The ratio (``managers/scheduler_components/new_token_ratio_tracker.py``) starts at
``SGLANG_INIT_NEW_TOKEN_RATIO`` (0.7), falls by ``(init − floor) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` (600)
on every decode step that needs no retraction, down to ``init × SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` (0.14),
and returns to ``init`` when the scheduler goes idle. When a decode step finds no KV for one token per running
request even after evicting every unlocked leaf (``check_decode_mem``), ``retract_decode``
(``managers/schedule_batch.py``) gives up requests from the end of the order below — fewest generated tokens
first, the longest prompt first among equals — at least one, then until the step fits, always keeping one.
Each retracted request frees its KV without inserting it into the tree (its prompt, inserted after prefill,
stays cached and becomes evictable), ``(kept requests) × SGLANG_RETRACT_DECODE_STEPS`` (20) tokens are made
free by evicting, and the request goes back to the waiting queue: it will be prefilled again, prompt and
generated tokens, hitting whatever of its prefix survived. The ratio becomes
``min(1, (Σ generated + 20 × kept) / (Σ max_new_tokens + 1))`` over the requests kept.
"""

from __future__ import annotations

from typing import Any


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
        self.current = max(self.current - self.decay, self.floor)

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
