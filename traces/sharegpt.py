"""ShareGPT conversations (``--format sharegpt``): one request per user turn, the history growing.

A file is a JSON array (or JSON lines) of conversations ``{"id": ..., "conversations": [{"from": "human" |
"gpt" | "system", "value": "..."}, ...]}`` (``messages`` with ``role``/``content`` is read too). The request of a
user turn is the conversation up to and with that turn, rendered by the chat template
(:mod:`prism.traces.chat`: the earlier turns are its history); its output length is the token count of the reply
that follows (``--output-len log``), so a last user turn without a reply is left out unless a distribution
stands in (``log:DIST``).

Conversations have no timestamps: arrivals are Poisson at ``--qps``. Turns of ``--sessions`` conversations
interleave, as users talk at once: each request is the next turn of a conversation drawn at random among the
live ones (the seed's content stream), a finished conversation replaced by the next in the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prism.config import read_json_records
from prism.errors import UserError

from prism.traces.chat import ChatSegmenter
from prism.traces.importing import ImportOptions, LaidOut, build_trace, progress
from prism.traces.openai_log import BATCH, chat_tokenizer, flush
from prism.traces.trace import Trace

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


def conversation(record: object, where: str) -> tuple[str | None, list[dict]]:
    """A record's id and messages."""
    if not isinstance(record, dict):
        raise UserError(f"expected a conversation (a JSON object), got {type(record).__name__}", where)
    turns = next((record[k] for k in ("conversations", "conversation", "messages") if k in record), None)
    if not isinstance(turns, list):
        raise UserError("expected 'conversations': a list of {from, value}", where)
    messages = []
    for k, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise UserError(f"field 'conversations': turn {k} is not a JSON object", where)
        who = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        if who not in ROLES:
            raise UserError(f"field 'conversations': turn {k} is from {who!r} (expected {', '.join(ROLES)})", where)
        if not isinstance(text, str):
            raise UserError(f"field 'conversations': turn {k} ({who}) has no content (a string 'value')", where)
        messages.append({"role": ROLES[who], "content": text})
    name = record.get("id")
    return None if name is None else str(name), messages


def turns(messages: list[dict]) -> list[tuple[int, str | None]]:
    """``(end, reply)`` per user turn: the request is ``messages[:end]``, the reply the assistant's text after it."""
    out = []
    for k, m in enumerate(messages):
        if m["role"] == "user":
            after = messages[k + 1] if k + 1 < len(messages) else None
            out.append((k + 1, after["content"] if after is not None and after["role"] == "assistant" else None))
    return out


def read(path: Path, options: ImportOptions) -> Trace:
    if options.qps is None:
        raise UserError("--qps: ShareGPT conversations have no timestamps: give --qps for Poisson arrivals")
    tok = chat_tokenizer(options)
    seg, out = ChatSegmenter(tok), LaidOut()
    rng = np.random.default_rng(np.random.SeedSequence(options.seed).spawn(3)[2])  # the order of turns
    pending = iter(read_json_records(path, "ShareGPT conversations (JSON)"))
    live: list[list] = []  # [session, where, messages, turns, next turn]
    skipped, started, batch = 0, 0, []

    def next_conversation() -> list | None:
        nonlocal started
        for where, record in pending:
            name, messages = conversation(record, where)
            mine = turns(messages)
            if mine:
                started += 1
                return [name if name is not None else str(started - 1), where, messages, mine, 0]
        return None

    while len(live) < options.sessions and (conv := next_conversation()) is not None:
        live.append(conv)
    with progress(options) as bar:
        while live:
            i = int(rng.integers(len(live)))
            name, where, messages, mine, k = live[i]
            end, reply = mine[k]
            if reply is None and options.output_len.dist is None:
                skipped += 1
            else:
                logged = len(tok.encode(reply)) if reply is not None else None
                batch.append(((messages[:end], None, None), logged, name, None, where))
            live[i][4] = k + 1
            if k + 1 >= len(mine):
                conv = next_conversation()
                if conv is None:
                    live.pop(i)
                else:
                    live[i] = conv
            if len(batch) >= BATCH:
                flush(seg, batch, out)
                bar.update(BATCH)
        flush(seg, batch, out)
    return build_trace(path, options, [out], {"conversations": started, "turns_without_reply": skipped})
