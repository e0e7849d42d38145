"""OpenAI chat-completions request logs: one request body per line (``--format openai``), and the exporter that
writes a trace as such a log.

A line is the JSON body a client sends to ``/v1/chat/completions`` — ``messages`` (roles ``system``,
``developer``, ``user``, ``assistant`` with optional ``tool_calls``, ``tool``; content a string or a list of text
parts), optional ``tools`` — plus what a log adds: ``timestamp`` (seconds, any origin) and the output length
(``output_tokens``, or ``usage.completion_tokens``). Other fields (``model``, ``max_tokens``, ``stream``, ...) are
read past. The prompt and its segments come from :mod:`prism.traces.chat` with the log's tokenizer folder; the
optional ``prism`` field (``{"segments": [...], "movable": true, "session": "..."}``) overrides the automatic
reading and names the request's session.

The exporter writes a trace as such a log for round-trip checks. A trace holds token structure, not words, so
each segment becomes text made of whole-word tokens of the tokenizer (one token a word, so the text encodes back
to exactly as many tokens), its first word distinct across segments (different segments then share no first
token, as the synthetic traces' segments do not), and the ``prism`` field lists the segments with their kinds and
whether they may move. The chat template adds tokens of its own (ChatML: the role tags); the exporter shortens
the text of the segments they fall into by as many tokens, so that a re-imported segment is as long as the
original (a segment shorter than the template's tokens cannot be, and the exporter says how many are not).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from prism.config import jsonl_parts, read_jsonl
from prism.core import KINDS, SYS, stable_hash
from prism.errors import UserError
from prism.output import atomic_path

from prism.traces.chat import ChatError, ChatSegmenter, Declared
from prism.traces.chat_template import ChatTokenizer
from prism.traces.importing import ImportOptions, LaidOut, Timestamps, build_trace, count, number, progress
from prism.traces.trace import Trace

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
BATCH = 512  # requests whose new pieces are encoded together
PARALLEL_BYTES = 8 << 20  # a smaller log is read by one process (starting one costs about a second)
WHAT = "OpenAI request log (JSONL)"
_WORD = re.compile(r"^ [A-Za-z]+$")


def chat_tokenizer(options: ImportOptions) -> ChatTokenizer:
    if not options.tokenizer:
        raise UserError(f"--tokenizer: --format {options.format} needs the model's tokenizer folder (its chat "
                        "template and vocabulary make the prompt)")
    tok = ChatTokenizer(options.tokenizer)
    tok.check_template()
    return tok


# ---------------------------------------------------------------- reading a body
def check_messages(messages: Any, where: str, name: str = "messages") -> list[dict]:
    """A non-empty list of chat messages, each with a known role and content (text or text parts)."""
    if not isinstance(messages, list) or not messages:
        raise UserError(f"field '{name}': must be a non-empty list of messages", where)
    for k, m in enumerate(messages, start=1):
        if not isinstance(m, dict):
            raise UserError(f"field '{name}': message {k} is not a JSON object", where)
        role = m.get("role")
        if role not in ROLES:
            raise UserError(f"field '{name}': message {k} has role {role!r} (expected {', '.join(ROLES)})", where)
        _check_content(m, f"field '{name}': message {k} ({role})", where)
        calls = m.get("tool_calls")
        if calls is not None and (not isinstance(calls, list) or not all(_is_call(c) for c in calls)):
            raise UserError(f"field '{name}': message {k}: 'tool_calls' must be a list of "
                            "{function: {name, arguments}}", where)
    return messages


def _check_content(m: dict, what: str, where: str) -> None:
    content = m.get("content")
    if content is None or content == []:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            return
        raise UserError(f"{what} has no content", where)
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise UserError(f"{what}: 'content' must be a string or a list of text parts", where)
    for j, part in enumerate(content, start=1):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            got = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise UserError(f"{what}, part {j}: only text parts ({{type: text, text}}) are read, got {got!r}", where)


def _is_call(call: Any) -> bool:
    fn = call.get("function") if isinstance(call, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), (str, dict))


def check_tools(tools: Any, where: str) -> list[dict] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise UserError("field 'tools': must be a list of tool schemas (JSON objects)", where)
    return tools


def declared(field: Any, where: str) -> tuple[Declared | None, str | None]:
    """The ``prism`` field: explicit segments (or None), and the session name."""
    if field is None:
        return None, None
    if not isinstance(field, dict):
        raise UserError("field 'prism': must be a JSON object", where)
    unknown = sorted(set(field) - {"segments", "movable", "session"})
    if unknown:
        raise UserError(f"field 'prism': unknown key {unknown[0]!r} (known: movable, segments, session)", where)
    session = field.get("session")
    if session is not None and (isinstance(session, bool) or not isinstance(session, (str, int))):
        raise UserError("field 'prism.session': must be a string or an integer", where)
    movable = field.get("movable", False)
    if not isinstance(movable, bool):
        raise UserError("field 'prism.movable': must be true or false", where)
    items = field.get("segments")
    if items is None:
        if movable:
            raise UserError("field 'prism.movable': needs 'segments' (which segments may move)", where)
        return None, None if session is None else str(session)
    if not isinstance(items, list) or not items:
        raise UserError("field 'prism.segments': must be a non-empty list", where)
    segments = []
    for j, item in enumerate(items, start=1):
        kind, text = ("reuse", item) if isinstance(item, str) else (
            (item.get("kind", "reuse"), item.get("text")) if isinstance(item, dict) else (None, None))
        if not isinstance(text, str) or not text or kind not in KINDS:
            raise UserError(f"field 'prism.segments': item {j} must be a non-empty text or {{text, kind}} with kind "
                            f"one of {', '.join(KINDS)}", where)
        if kind == SYS and j > 1:
            raise UserError(f"field 'prism.segments': item {j} is 'sys', which only the first may be", where)
        segments.append((kind, text))
    return Declared(tuple(segments), movable), None if session is None else str(session)


def output_tokens(body: dict, where: str) -> int | None:
    logged = count(body.get("output_tokens"), "output_tokens", where)
    usage = body.get("usage")
    if logged is None and usage is not None:
        if not isinstance(usage, dict):
            raise UserError("field 'usage': must be a JSON object", where)
        logged = count(usage.get("completion_tokens"), "usage.completion_tokens", where)
    return logged


def read(path: Path, options: ImportOptions) -> Trace:
    """The log's requests; a large log is read in parts by ``options.workers`` processes (its first bad line is
    then found again by one process, so that the message names the line a single reader would)."""
    chat_tokenizer(options)  # a bad folder or template: one line before any work
    workers = options.workers or os.cpu_count() or 1
    size = os.path.getsize(path) if os.path.isfile(path) else 0
    parts = jsonl_parts(path, workers, WHAT) if workers > 1 and size >= PARALLEL_BYTES else [(0, None, 1)]
    if len(parts) == 1:
        return build_trace(path, options, [read_part(path, parts[0], options)])
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(read_part, path, part, replace(options, progress=False)) for part in parts]
        try:
            laid_out = [f.result() for f in futures]
        except UserError:
            laid_out = None
    if laid_out is None:
        laid_out = [read_part(path, (0, None, 1), options)]
    return build_trace(path, options, laid_out)


def read_part(path: Path, part: tuple[int, int | None, int], options: ImportOptions) -> LaidOut:
    """One part of the log, laid out (:func:`prism.config.jsonl_parts`; a worker process's task)."""
    seg = ChatSegmenter(chat_tokenizer(options))
    out, stamps, batch = LaidOut(), Timestamps(options.qps is None), []
    with progress(options) as bar:
        for where, body in read_jsonl(path, WHAT, part):
            if not isinstance(body, dict):
                raise UserError(f"expected a JSON object (a request body), got {type(body).__name__}", where)
            messages = check_messages(body.get("messages"), where)
            tools = check_tools(body.get("tools"), where)
            explicit, session = declared(body.get("prism"), where)
            seconds = number(body.get("timestamp"), "timestamp", where) if options.qps is None else None
            stamps.add(seconds, where)
            logged = options.output_len.check(output_tokens(body, where), where)
            batch.append(((messages, tools, explicit), logged, session, seconds, where))
            if len(batch) >= BATCH:
                flush(seg, batch, out)
                bar.update(BATCH)
        flush(seg, batch, out)
    return out


def flush(seg: ChatSegmenter, batch: list[tuple], out: LaidOut) -> None:
    """Lay out a batch of ``((messages, tools, declared), logged output, session, seconds, where)``."""
    if not batch:
        return
    try:
        layouts = seg.layouts([item[0] for item in batch])
    except ChatError as e:
        raise UserError(str(e), batch[e.index][4]) from None
    for layout, (_, logged, session, seconds, where) in zip(layouts, batch):
        out.add(layout, logged, session, seconds, where)
    batch.clear()


# ---------------------------------------------------------------- writing a trace as a log
class Words:
    """The tokenizer's whole-word tokens (`` word``: a space and letters, one token whichever word precedes it)."""

    def __init__(self, tok: ChatTokenizer) -> None:
        pool = []
        for tid in range(tok.vocab_size):
            text = tok.decode([tid])
            if text and _WORD.match(text) and tok.encode(text).tolist() == [tid]:
                pool.append(text)
        if len(pool) < 2:
            raise UserError("the tokenizer has too few whole-word tokens to write text of a given length",
                            str(tok.folder))
        self.pool = pool
        self.first: dict[str, int] = {}

    def text(self, seg_id: str, n: int) -> str:
        """``n`` words for a segment: its own first word, then words drawn by its id (a prefix for a shorter n)."""
        head = self.first.setdefault(seg_id, len(self.first)) % len(self.pool)
        rest = np.random.default_rng(stable_hash(seg_id)).integers(len(self.pool), size=max(0, n - 1))
        return self.pool[head] + "".join(self.pool[i] for i in rest)

    @property
    def shared_first_words(self) -> int:
        return max(0, len(self.first) - len(self.pool))


def export(trace: Trace, path: str | Path, tokenizer: str) -> dict[str, int]:
    """Write ``trace`` as an OpenAI request log (module docstring). Returns counts for the summary line."""
    tok = ChatTokenizer(tokenizer)
    tok.check_template()
    seg, words = ChatSegmenter(tok), Words(tok)
    unmatched = 0
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(Path(path)) as tmp, tmp.open("w") as f:
        for r in trace.requests:
            body, missed = _body(r, seg, words)
            unmatched += missed
            f.write(json.dumps(body) + "\n")
    return {"requests": len(trace), "unmatched_segments": unmatched, "shared_first_words": words.shared_first_words}


def _body(r, seg: ChatSegmenter, words: Words) -> tuple[dict, int]:
    targets = [s.length for s in r.segments]
    content = list(targets)
    for _ in range(3):  # measure the template's tokens, then take them off the text
        body = _as_messages(r, [words.text(s.id, n) for s, n in zip(r.segments, content)])
        layout = seg.layout(body["messages"], None, _declared(body))
        got = np.diff([0, *[end for _, _, end in layout.segments]]).tolist()
        if got == targets or len(got) != len(targets):
            break
        content = [max(1, c - (g - t)) for c, g, t in zip(content, got, targets)]
    missed = sum(g != t for g, t in zip(got, targets)) if len(got) == len(targets) else len(targets)
    return body, missed


def _as_messages(r, texts: list[str]) -> dict:
    parts = list(zip(r.segments, texts))
    messages = []
    if parts[0][0].kind == SYS:
        messages.append({"role": "system", "content": parts[0][1]})
        parts = parts[1:]
    if parts:
        messages.append({"role": "user", "content": [{"type": "text", "text": t} for _, t in parts]})
    prism: dict[str, Any] = {"segments": [{"kind": s.kind, "text": t} for s, t in zip(r.segments, texts)],
                             "movable": not r.fixed_order}
    if r.session is not None:
        prism["session"] = r.session
    return {"messages": messages, "timestamp": r.arrival, "output_tokens": r.output_len, "prism": prism}


def _declared(body: dict) -> Declared:
    p = body["prism"]
    return Declared(tuple((s["kind"], s["text"]) for s in p["segments"]), p["movable"])
