"""SGLang's token-id JSONL (``--format autobench``), the trace format of its simulator and ``bench_serving``'s
``autobench`` dataset, and the exporter that writes a trace in it.

A line is ``{"prompt": [token ids], "prompt_len": n, "output_len": m, "timestamp": ms}``, as
``tools/sglang-simulator`` reads it (``dataset/autobench.py``; its README: timestamps in milliseconds). As there,
the output length is the first of ``output_len``, ``max_tokens``, ``max_completion_tokens`` and
``completion_tokens`` given, and ``prompt`` may instead hold chat messages (or ``messages`` does), which go
through the chat template (:mod:`prism.traces.chat`), or text, which is encoded as SGLang's ``/generate``
encodes text (with the tokenizer's special tokens). Token ids carry no structure: the prompt becomes fixed-size
reusable blocks of ``--block-tokens`` keyed by a hash of the prompt up to each block's end
(:func:`prism.traces.chat.block_layout`), so two prompts share exactly the blocks of their common prefix.
With ``--tokenizer``, ids outside its vocabulary are an error (the server would crash on them); without one, any
int32 id is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from prism.config import MAX_TOKENS, read_jsonl
from prism.core import TOKEN_DTYPE
from prism.errors import UserError
from prism.output import atomic_path

from prism.traces.chat import ChatSegmenter, block_layout
from prism.traces.chat_template import ChatTokenizer
from prism.traces.importing import ImportOptions, LaidOut, Timestamps, build_trace, count, number, progress
from prism.traces.openai_log import BATCH, check_messages, flush
from prism.traces.trace import MAX_TOKEN_ID, Trace

OUTPUT_FIELDS = ("output_len", "max_tokens", "max_completion_tokens", "completion_tokens")


def token_ids(prompt: list, vocab: int | None, where: str) -> np.ndarray:
    """A non-empty list of token ids, each a valid id (of the tokenizer's vocabulary, if given)."""
    arr = np.asarray(prompt) if prompt else np.zeros(0)
    top = (vocab - 1) if vocab is not None else MAX_TOKEN_ID
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or not 1 <= len(arr) <= MAX_TOKENS:
        raise UserError(f"field 'prompt': must be a list of 1..{MAX_TOKENS} token ids (integers)", where)
    bad = np.flatnonzero((arr < 0) | (arr > top))
    if len(bad):
        what = f"outside the tokenizer's vocabulary (0..{top})" if vocab is not None else f"not in 0..{top}"
        raise UserError(f"field 'prompt': token id {int(arr[bad[0]])} at position {int(bad[0])} is {what}", where)
    return arr.astype(TOKEN_DTYPE)


def _output(row: dict, where: str) -> int | None:
    for name in OUTPUT_FIELDS:
        value = count(row.get(name), name, where)
        if value is not None:
            return value
    return None


def read(path: Path, options: ImportOptions) -> Trace:
    tok = ChatTokenizer(options.tokenizer) if options.tokenizer else None
    seg = None
    out, stamps, batch = LaidOut(), Timestamps(options.qps is None), []
    with progress(options) as bar:
        for where, row in read_jsonl(path, "autobench trace (JSONL)"):
            if not isinstance(row, dict):
                raise UserError(f"expected a JSON object, got {type(row).__name__}", where)
            ms = number(row.get("timestamp"), "timestamp", where) if options.qps is None else None
            seconds = None if ms is None else ms / 1000.0
            stamps.add(seconds, where)
            logged = options.output_len.check(_output(row, where), where)
            prompt = row.get("messages", row.get("prompt"))
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
                if seg is None:
                    if tok is None:
                        raise UserError("--tokenizer: chat messages need the model's tokenizer folder", where)
                    tok.check_template()
                    seg = ChatSegmenter(tok)
                batch.append(((check_messages(prompt, where, "prompt"), None, None), logged, None, seconds, where))
                if len(batch) >= BATCH:
                    flush(seg, batch, out)
                    bar.update(BATCH)
                continue
            flush(seg, batch, out)  # keep the file's order
            ids = _prompt_ids(prompt, tok, where)
            n = count(row.get("prompt_len"), "prompt_len", where, low=1)
            if n is not None and n != len(ids):
                raise UserError(f"field 'prompt_len': {n}, but 'prompt' holds {len(ids)} tokens", where)
            out.add(block_layout(ids, options.block_tokens), logged, None, seconds, where)
            bar.update(1)
        flush(seg, batch, out)
    return build_trace(path, options, [out])


def _prompt_ids(prompt: Any, tok: ChatTokenizer | None, where: str) -> np.ndarray:
    if isinstance(prompt, str):
        if tok is None:
            raise UserError("--tokenizer: a text prompt needs the model's tokenizer folder", where)
        ids = tok.encode(prompt, add_special_tokens=True)
        if not len(ids):
            raise UserError("field 'prompt': the text encodes to no tokens", where)
        return ids
    if not isinstance(prompt, list):
        raise UserError("field 'prompt': must be a list of token ids, a text or chat messages", where)
    return token_ids(prompt, tok.vocab_size if tok is not None else None, where)


def export(trace: Trace, path: str | Path) -> dict[str, int]:
    """Write ``trace`` as autobench JSONL: each prompt's token ids, its output length, its arrival in ms."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(Path(path)) as tmp, tmp.open("w") as f:
        for r in trace.requests:
            ids = r.tokens().tolist()
            f.write(json.dumps({"prompt": ids, "prompt_len": len(ids), "output_len": r.output_len,
                                "timestamp": r.arrival * 1000.0}) + "\n")
    return {"requests": len(trace)}
