"""A prism trace as a real server receives it: token ids inside the model's vocabulary, and the segment
metadata the plugin reads in the scheduler.

**Token ids.** A synthetic trace's tokens lie far above any vocabulary (the bulk of a segment is drawn from
``[2^20, 2^30)``, see :mod:`prism.core`), and an out-of-vocabulary id kills SGLang's server. The client maps
every id ``t >= vocab`` to ``low + (t - vocab) mod (vocab - low)``, where ``[1, low)`` holds the segments' first
tokens. The map is a function, so equal prompts stay equal, and first tokens stay distinct and outside the
bulk range, so two prompts still agree exactly as far as their segments agree: the radix tree shares what
the simulator's tree shares. A trace with more segments than the vocabulary can keep apart is refused.

**Segment metadata** travels in ``sampling_params.custom_params`` (DESIGN §6; SGLang accepts one level of
nesting there, so each field is its own ``prism_*`` key): segment ids, kinds and token ends of the prompt in
trace order, and whether the reusable segments may be moved. The plugin
rebuilds the prompt's layout from it and applies a scheduler's realignment by permuting whole segments.

**Output length and KV admission** (:func:`length_params`). Every request must generate exactly its trace's
``output_len`` tokens (random weights stop anywhere otherwise), and how SGLang reserves decode KV depends on
how the length is forced. With ``ignore_eos`` SGLang counts a running request's whole remaining decode
(ratio 1, ``schedule_policy.py`` ``_get_running_request_total_token_offset``): ``engine.admission: full``.
Otherwise it counts the remaining decode x its decaying ``new_token_ratio`` and retracts when a decode step
runs out of KV: ``engine.admission: sglang``. ``min_new_tokens`` would force the length, but SGLang refuses it
without a tokenizer (``--skip-tokenizer-init``, ``sampling_params.py`` ``raise_if_tokenizer_required``), so
the client bans the model's EOS ids instead (``logit_bias`` -1e9, applied to the logits before sampling):
with no other stop condition, the request runs to ``max_new_tokens``. The client checks every request's
completion length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from prism.core import BULK_LOW, TOKEN_DTYPE, Request
from prism.errors import UserError
from prism.traces.trace import Trace

#: custom_params keys the plugin reads (SGLang reserves some names: ours share a prefix)
META_KEYS = ("prism_request", "prism_ids", "prism_kinds", "prism_ends", "prism_movable")
#: and the client's send time on the machine's monotonic clock (the scheduler's clock too): a front end's
#: window holds what was *sent* within it, even when the scheduler, busy in a batch, receives it later
SENT_KEY = "prism_sent"
#: the bias that keeps an EOS id from ever being sampled (a logit of the order of -1e9 loses every argmax and
#: has probability 0 in float32 softmax; JSON cannot carry -inf)
EOS_BAN = -1e9


def length_params(output_len: int, admission: str, eos_ids: tuple[int, ...]) -> dict[str, Any]:
    """The sampling parameters that make SGLang generate exactly ``output_len`` tokens under the run's
    ``engine.admission`` (``full``: ``ignore_eos``; ``sglang``: EOS banned, so SGLang applies its ratio)."""
    if admission == "full":
        return {"max_new_tokens": output_len, "ignore_eos": True}
    params: dict[str, Any] = {"max_new_tokens": output_len, "ignore_eos": False}
    if eos_ids:
        params["logit_bias"] = {str(t): EOS_BAN for t in eos_ids}
    return params


@dataclass(frozen=True)
class LiveRequest:
    id: int
    arrival: float  # seconds from the start of the trace (undilated)
    input_ids: list[int]
    output_len: int
    meta: dict[str, Any]


def first_token_ceiling(trace: Trace) -> int:
    """One past the largest first token of the trace's segments (ids below it are kept as they are)."""
    low = 1
    for r in trace.requests:
        for s in r.segments:
            if s.length and s.tokens[0] < BULK_LOW:
                low = max(low, int(s.tokens[0]) + 1)
    return low


def to_vocab(tokens: np.ndarray, vocab: int, low: int) -> np.ndarray:
    """Map ids at or above ``vocab`` into ``[low, vocab)``; smaller ids are kept."""
    t = np.asarray(tokens, dtype=np.int64)
    return np.where(t < vocab, t, low + (t - vocab) % (vocab - low))


def layout_meta(rid: int, segments: Sequence[tuple[str, str, int]], movable: bool) -> dict[str, Any]:
    """The ``custom_params`` the plugin reads: ``segments`` are ``(kind, id, end)`` in prompt order."""
    return {"prism_request": rid, "prism_ids": [s[1] for s in segments], "prism_kinds": [s[0] for s in segments],
            "prism_ends": [int(s[2]) for s in segments], "prism_movable": movable}


def segment_meta(r: Request) -> dict[str, Any]:
    ends, end = [], 0
    for s in r.segments:
        end += s.length
        ends.append(end)
    return layout_meta(r.id, [(s.kind, s.id, e) for s, e in zip(r.segments, ends)], not r.fixed_order)


def live_requests(trace: Trace, vocab: int, context_length: int, where: str = "trace") -> list[LiveRequest]:
    """The trace's requests with in-vocabulary ids; a clear error for what the server would refuse."""
    low = first_token_ceiling(trace)
    if low > vocab // 2:
        raise UserError(f"the trace has segment first tokens up to {low - 1}; a vocabulary of {vocab} ids cannot "
                        "keep them apart from the segments' other tokens (use a model with a larger vocabulary)",
                        where)
    out = []
    for r in trace.requests:
        ids = to_vocab(r.tokens(), vocab, low)
        if len(ids) and ids.min() < 0:
            raise UserError(f"request {r.id}: negative token id {int(ids.min())}", where)
        if r.prompt_len + r.output_len > context_length:
            raise UserError(f"request {r.id}: {r.prompt_len} prompt + {r.output_len} output tokens exceed the "
                            f"model's context length of {context_length}", where)
        out.append(LiveRequest(r.id, r.arrival, ids.astype(TOKEN_DTYPE).tolist(), r.output_len, segment_meta(r)))
    return out
