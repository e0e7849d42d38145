"""Segments of OpenAI chat requests, read in the SGLang server's HTTP process (the chat path of DESIGN §6).

An operator's clients send ``/v1/chat/completions`` and nothing prism-specific. SGLang applies the chat template
in the process that runs its HTTP server and tokenizer manager (``srt/entrypoints/openai/serving_chat.py``,
``OpenAIServingChat._convert_to_internal_request``: the messages become a ``GenerateReqInput`` with the prompt's
token ids). The plugin wraps that method (:func:`around_convert`): once SGLang has built the request, the chat
segmentation rule of the trace importer (:mod:`prism.traces.chat`, one implementation for both) reads the
messages and tools with the server's own tokenizer folder, and the layout travels to the scheduler in
``sampling_params.custom_params`` under the same ``prism_*`` keys a replay's ``/generate`` request carries
(:mod:`prism.live.requests`), so the scheduler's hooks cannot tell the two apart.

* A request that already carries ``prism_ids`` (a full layout, as ``/generate`` sends it) is left as it is.
* An explicit hint overrides the reading: ``custom_params.prism_segments`` lists the segments' texts in prompt
  order (each a reusable document unless ``prism_segment_kinds`` gives ``sys``/``reuse``/``priv`` per text) and
  ``prism_movable: true`` lets a scheduler reorder the reusable ones (:class:`~prism.traces.chat.Declared`).
  ChatCompletionRequest keeps ``custom_params`` and drops unknown top-level fields, so the hint lives there.
* The layout is attached only if its tokens are exactly the prompt SGLang built (its ``input_ids``): a template or
  tokenizer the rule reads differently leaves the request unsegmented (counted), never mislabelled.

The rule does not render and encode the prompt a second time: the text SGLang rendered is taken where SGLang
encodes it (``parallel_prompt_encode``, wrapped by :func:`around_encode`), and the parts between the rule's cuts
are encoded one by one and remembered (:meth:`~prism.traces.chat.ChatSegmenter.server_layout`), so a system prompt
or a document seen before costs a lookup; their concatenation must equal SGLang's ids, else the whole text is
encoded as the importer does.

The hook is registered in the launcher only (the process without a multiprocessing parent, where SGLang runs its
HTTP server by default); with ``--tokenizer-worker-num`` above 1 SGLang serves HTTP from worker processes, which
this release does not hook (their chat requests arrive unsegmented: ``chat_*`` stays at zero; not checked here).

Each annotated request also carries the CPU time the rule took and SGLang's own conversion time
(``prism_chat_layout_ms``, ``prism_chat_sglang_ms``); the scheduler's counters sum them (``chat_*`` in
``/server_info``), DESIGN §6's overhead budget on the chat path.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from prism.core import KINDS
from prism.errors import UserError

from prism.live.requests import layout_meta

HINT_TEXTS, HINT_KINDS, HINT_MOVABLE = "prism_segments", "prism_segment_kinds", "prism_movable"
LAYOUT_MS, SGLANG_MS = "prism_chat_layout_ms", "prism_chat_sglang_ms"
#: chat requests' ids start here, far above any trace's request ids (a server may see both)
CHAT_ID_BASE = 1 << 40


class ChatAnnotator:
    """The segmenter over the server's tokenizer folder (built on the first chat request) and the request ids."""

    def __init__(self) -> None:
        self._segmenter = None
        self._folder: str | None = None
        self._ids = itertools.count(CHAT_ID_BASE)

    def segmenter(self, folder: str):
        if self._segmenter is None or self._folder != folder:
            from prism.traces.chat import ChatSegmenter
            from prism.traces.chat_template import ChatTokenizer

            tokenizer = ChatTokenizer(folder)
            tokenizer.check_template()  # compiled now, not in a request
            self._segmenter, self._folder = ChatSegmenter(tokenizer), folder
        return self._segmenter

    def annotate(self, adapted, request, folder: str, rendered: str | None = None) -> str:
        """Attach the layout of chat ``request`` to SGLang's ``adapted`` GenerateReqInput; returns what happened
        (``segmented``, ``explicit``, ``declared``, or why not: ``refused``, ``unmatched``, ``no_ids``)."""
        from prism.traces.chat import ChatError

        params = adapted.sampling_params if isinstance(adapted.sampling_params, dict) else None
        if params is None:
            return "no_ids"
        custom = dict(params.get("custom_params") or {})
        if "prism_ids" in custom:
            return "explicit"
        ids = adapted.input_ids
        if not isinstance(ids, list) or not ids or not isinstance(ids[0], int):
            return "no_ids"  # a text prompt (multimodal models) or a batch: SGLang tokenizes later
        declared = _declared(custom)
        messages = [_plain(m) for m in request.messages]
        tools = [_plain(t) for t in request.tools] if request.tools else None
        try:
            layout = self.segmenter(folder).server_layout(messages, tools, declared, rendered, ids)
        except (ChatError, UserError):
            return "refused"
        if layout is None:
            return "unmatched"
        custom.update(layout_meta(next(self._ids), layout.segments, not layout.fixed_order))
        params["custom_params"] = custom
        return "declared" if declared is not None else "segmented"


def _plain(item: Any) -> Any:
    """A pydantic message or tool as the JSON the client sent (None fields left out)."""
    dump = getattr(item, "model_dump", None)
    return dump(exclude_none=True) if dump is not None else item


def _declared(custom: dict) -> Any:
    """The explicit hint of ``custom_params``, or None (a malformed hint is ignored: counted as refused later)."""
    from prism.traces.chat import Declared

    texts = custom.pop(HINT_TEXTS, None)
    kinds = custom.pop(HINT_KINDS, None)
    movable = bool(custom.pop(HINT_MOVABLE, False))
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        return None
    if not isinstance(kinds, list) or len(kinds) != len(texts) or not all(k in KINDS for k in kinds):
        kinds = ["reuse"] * len(texts)
    return Declared(tuple(zip(kinds, texts)), movable)


_annotator = ChatAnnotator()
_seen = threading.local()  # the text SGLang rendered for the request being converted on this thread


def around_encode(orig, tokenizer, text, *args, **kwargs):
    """``parallel_prompt_encode`` (``serving_chat.py`` encodes the rendered chat prompt with it): note the text."""
    _seen.text = text
    return orig(tokenizer, text, *args, **kwargs)


def around_convert(orig, serving, request, *args, **kwargs):
    """``OpenAIServingChat._convert_to_internal_request``: SGLang's own conversion, then the layout."""
    _seen.text = None
    t0 = time.thread_time()  # CPU time of this thread: the machine's other load is not the rule's cost
    result = orig(serving, request, *args, **kwargs)
    t1 = time.thread_time()
    adapted = result[0] if isinstance(result, tuple) else result
    folder = serving.tokenizer_manager.server_args.tokenizer_path
    rendered, _seen.text = getattr(_seen, "text", None), None
    if folder:
        _annotator.segmenter(folder)  # once per server (about 0.15 s): not a request's cost
    t2 = time.thread_time()
    outcome = _annotator.annotate(adapted, request, folder, rendered) if folder else "no_ids"
    params = adapted.sampling_params if isinstance(adapted.sampling_params, dict) else None
    if params is not None:
        custom = dict(params.get("custom_params") or {})
        custom["prism_chat"] = outcome
        custom["prism_chat_text"] = rendered is not None
        custom[LAYOUT_MS] = (time.thread_time() - t2) * 1e3
        custom[SGLANG_MS] = (t1 - t0) * 1e3
        params["custom_params"] = custom
    return result


__all__ = ["ChatAnnotator", "around_convert", "around_encode", "CHAT_ID_BASE"]
