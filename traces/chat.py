"""The chat segmentation rule: which tokens of a chat request's prompt form which segment.

One implementation for every reader of chat traffic: ``prism-trace import`` calls it on logged request bodies,
and the live plugin can call it inside the SGLang server with the server's tokenizer folder
(``ChatSegmenter(ChatTokenizer(path)).layout(messages, tools)``, the messages as the client sent them: SGLang
joins a ``string`` template's text parts, and the parts are what marks documents).

The prompt is what the server would see: the messages as SGLang's chat endpoint hands them to the template
(:func:`server_view`), rendered by the model's chat template with the generation prompt, and encoded whole
(:mod:`prism.traces.chat_template`). Segments tile that token sequence, every token exactly once:

* a message's segment is its whole block, as the template renders it: what the template adds when the message
  is appended (its opening tag, content, closing tag), found by rendering the conversation up to each message
  (a template that renders earlier messages differently once later ones follow falls back to finding the
  message's text: its opening tag then stays with the segment before);
* text the template writes before the first message (a BOS token, a default system prompt) belongs to the first
  segment; the generation prompt (``<|im_start|>assistant\\n``) to the last;
* the system message (first) is ``sys``; tool schemas rendered inside it (where the rendering with tools first
  differs from the one without) are one reusable segment, ``tools``, running to the end of that block;
* a user message whose content is a list of text parts holds documents: every part but the last is a
  reusable ``doc`` segment (the block's opening tag goes with the first part, a separator with the part before
  it), the last part is the user's own text;
* a tool result (role ``tool``) is a reusable ``tool`` segment; user and assistant messages are private
  (``user``, ``asst``), as the agent trace keeps its earlier turns; the last user message is the private suffix;
* where a cut falls inside a token (a BPE token spanning two parts), the token belongs to the part it ends in.

Ids are ``LABEL:HASH`` with a hash of the segment's tokens, so equal content in equal context is one segment
across requests (a tool result repeated across sessions, a shared system prompt) and different content of the
same length is two. Prompts keep their order (``fixed_order``): the rule never says a document may move.

An explicit field of a request overrides the reading (:class:`Declared`): ``"prism": {"segments": [...],
"movable": true}`` lists the segments' texts in prompt order (a string is a reusable document, or ``{"text":
..., "kind": "sys" | "reuse" | "priv"}``); each runs from where its text starts to where the next one's starts
(the first from the prompt's start, the last to its end), and ``movable`` lets a scheduler reorder the reusable
ones. Separate movable documents with a newline inside their texts: a reordered prompt is their tokens
permuted, not the text re-encoded.

Logs with token ids and no structure fall back to fixed-size blocks (:func:`block_layout`), keyed by a hash of
the prompt up to each block's end, as Mooncake's 512-token hash ids are.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from prism.core import PRIV, REUSE, SYS, TOKEN_DTYPE

from prism.traces.chat_template import ChatTokenizer, TemplateRefused

#: segment labels (the id's prefix) and their kinds
LABELS = {"sys": SYS, "tools": REUSE, "doc": REUSE, "tool": REUSE, "blk": REUSE, "user": PRIV, "asst": PRIV,
          "msg": PRIV}
KIND_LABEL = {SYS: "sys", REUSE: "doc", PRIV: "user"}
SYSTEM_ROLES = ("system", "developer")
TOOL_ROLES = ("tool", "function", "ipython")
PREFIX_MEMO = 1_000_000  # rendered prefixes remembered (their length and hash: about 150 MB at the bound)


class ChatError(ValueError):
    """A request the rule cannot read (the template refuses it, a declared text is not in the prompt)."""

    def __init__(self, message: str, index: int = 0) -> None:
        super().__init__(message)
        self.index = index


@dataclass(frozen=True, slots=True)
class ChatLayout:
    """A prompt and its segments: ``(kind, id, end)`` in prompt order, the last ending at ``len(tokens)``."""

    tokens: np.ndarray
    segments: tuple[tuple[str, str, int], ...]
    fixed_order: bool = True
    unplaced: int = 0  # messages or parts whose text was not found: they stay in the segment before


@dataclass(frozen=True, slots=True)
class Declared:
    """The explicit segmentation of one request: ``(kind, text)`` in prompt order, and whether the reusable
    segments may be reordered."""

    segments: tuple[tuple[str, str], ...]
    movable: bool = False


def segment_id(label: str, tokens: np.ndarray) -> str:
    return f"{label}:{hashlib.blake2b(tokens.astype('<i4').tobytes(), digest_size=8).hexdigest()}"


def from_cuts(tokens: np.ndarray, starts: Sequence[int], labels: Sequence[str], fixed_order: bool = True,
              unplaced: int = 0) -> ChatLayout:
    """The layout of ``tokens`` cut at token ``starts`` (the first 0), each part labelled; empty parts vanish."""
    segments, n = [], len(tokens)
    bounds = [*starts, n]
    for i, label in enumerate(labels):
        lo, hi = bounds[i], bounds[i + 1]
        if hi > lo:
            segments.append((LABELS[label], segment_id(label, tokens[lo:hi]), hi))
    return ChatLayout(tokens, tuple(segments), fixed_order, unplaced)


def block_layout(tokens: np.ndarray, block_tokens: int) -> ChatLayout:
    """Fixed-size reusable blocks, each keyed by a hash of the prompt up to its end (a chain over the blocks)."""
    tokens = np.asarray(tokens, dtype=TOKEN_DTYPE)
    segments, chain = [], b""
    for lo in range(0, len(tokens), block_tokens):
        hi = min(lo + block_tokens, len(tokens))
        chain = hashlib.blake2b(chain + tokens[lo:hi].astype("<i4").tobytes(), digest_size=8).digest()
        segments.append((REUSE, f"blk:{chain.hex()}", hi))
    return ChatLayout(tokens, tuple(segments), True, 0)


def _texts(message: dict) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content] if content else []
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"]]
    return []


def server_view(messages: Sequence[dict], content_format: str) -> list[dict]:
    """The messages as SGLang's chat endpoint hands them to the template (``serving_chat.py``,
    ``_apply_jinja_template``, and ``jinja_template_utils.process_content_for_template_format``): fields that are
    null dropped and a null content made empty; text parts joined by a space for a ``string`` template (and
    always for a tool result); tool-call arguments parsed from their JSON text; a final assistant message read
    as a user message (without ``continue_final_message``). Raises ChatError for arguments that are not a JSON
    object, as the server answers 400."""
    out = []
    for k, message in enumerate(messages):
        m = {key: value for key, value in message.items() if value is not None}
        content = m.get("content", "")
        if isinstance(content, list) and (content_format == "string" or m.get("role") == "tool"):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        m["content"] = content
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            m["tool_calls"] = [_parsed_call(call, k) for call in m["tool_calls"]]
        out.append(m)
    if out and out[-1].get("role") == "assistant" and isinstance(out[-1]["content"], str):
        out[-1] = {"role": "user", "content": out[-1]["content"]}
    return out


def _parsed_call(call: Any, k: int) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        args = json.loads(function["arguments"])
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise ChatError(f"message {k + 1}: tool call arguments must be a JSON object")
    return {**call, "function": {**function, "arguments": args}}


def _digest(previous: bytes, item: Any) -> bytes:
    """A chained key of the messages so far (in their keys' order, which a template's ``tojson`` sees too)."""
    text = json.dumps(item, ensure_ascii=False, default=str)
    return hashlib.blake2b(previous + text.encode(), digest_size=16).digest()


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


class ChatSegmenter:
    """The rule over one tokenizer. Remembers what it rendered and encoded, so that requests sharing a
    conversation's beginning (a system prompt, tools, history) pay for it once."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tok = tokenizer
        self._prefix: dict[bytes, tuple[int, int]] = {}
        self._tools_cut: dict[bytes, int | None] = {}
        self._tools: dict[tuple, list[tuple[list, bytes]]] = {}
        self._tools_count = 0

    def layout(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
               declared: Declared | None = None) -> ChatLayout:
        """One request's layout."""
        return self.layouts([(messages, tools, declared)])[0]

    def server_layout(self, messages: Sequence[dict], tools: Sequence[dict] | None, declared: Declared | None,
                      rendered: str | None, expected: Sequence[int]) -> ChatLayout | None:
        """The live plugin's call, inside a server that already rendered the prompt (``rendered``, None if it was
        not seen) and encoded it (``expected``): the rule's cuts over that text, each part between two cuts
        encoded on its own (remembered, so a document or system prompt seen before costs a lookup), kept if the
        parts' tokens are exactly ``expected`` (a cut on a pre-token boundary, the usual case); else the whole
        text encoded as :meth:`layout` does. None if neither gives the server's tokens."""
        text, cuts, fixed, unplaced = self._plan(messages, tools or None, declared, rendered)
        starts = [pos for pos, _ in cuts]
        labels = [label for _, label in cuts]
        bounds = [*starts, len(text)]
        parts = self.tok.tokenize([(text[a:b], ()) for a, b in zip(bounds, bounds[1:])])
        n, token_starts = 0, []
        for ids, _ in parts:
            token_starts.append(n)
            n += len(ids)
        expected = expected if isinstance(expected, list) else list(expected)
        if n == len(expected):
            tokens = np.concatenate([ids for ids, _ in parts]) if parts else np.zeros(0, dtype=TOKEN_DTYPE)
            if tokens.tolist() == expected:
                return from_cuts(tokens, token_starts, labels, fixed, unplaced)
        tokens, token_starts = self.tok.tokenize([(text, starts)])[0]
        if tokens.tolist() != expected:
            return None
        return from_cuts(tokens, token_starts, labels, fixed, unplaced)

    def layouts(self, requests: Sequence[tuple[Sequence[dict], Sequence[dict] | None, Declared | None]]
                ) -> list[ChatLayout]:
        """The layouts of many requests, their new pieces encoded in one batch. ChatError names the index."""
        plans = []
        for i, (messages, tools, declared) in enumerate(requests):
            try:
                plans.append(self._plan(messages, tools or None, declared))
            except (ChatError, TemplateRefused) as e:
                raise ChatError(str(e), i) from None
        tokenized = self.tok.tokenize([(text, [pos for pos, _ in cuts]) for text, cuts, _, _ in plans])
        return [from_cuts(tokens, starts, [label for _, label in cuts], fixed, unplaced)
                for (tokens, starts), (_, cuts, fixed, unplaced) in zip(tokenized, plans)]

    # ---------------------------------------------------------------- where the cuts go
    def _shared_tools(self, tools) -> tuple[list | None, bytes]:
        """One object (and key) for equal tool lists: a log repeats its schemas on every line, and the template's
        ``tojson`` (:mod:`prism.traces.chat_template` caches it by object) and the memo keys then see them once.
        Found by the tools' names, confirmed by equality."""
        if not tools:
            return None, b"no tools"
        names = tuple(t.get("function", t).get("name") if isinstance(t.get("function", t), dict) else None
                      for t in tools)
        for known, key in self._tools.get(names, ()):
            if known is tools or known == tools:
                return known, key
        if self._tools_count >= PREFIX_MEMO // 100:
            self._tools.clear()
        self._tools_count += 1
        key = _digest(b"tools", tools)
        self._tools.setdefault(names, []).append((tools, key))
        return tools, key

    def _plan(self, messages, tools, declared, rendered: str | None = None):
        tools, tools_key = self._shared_tools(tools)
        view = server_view(messages, self.tok.content_format(tools))
        try:
            text = rendered if rendered is not None else self.tok.render(view, tools, True)
        except TemplateRefused as e:
            raise ChatError(f"the chat template refuses the request: {e}") from None
        if declared is not None:
            return text, _declared_cuts(text, declared), not declared.movable, 0
        starts = self._block_starts(view, tools, tools_key, text)
        cuts: list[tuple[int, str]] = []
        unplaced, cursor = 0, 0
        for k, m in enumerate(view):
            limit = next((s for s in starts[k + 1:] if s is not None), len(text))
            texts = _texts(messages[k])  # the parts as sent: a "string" template sees them joined
            start = starts[k]
            if start is None or start < cursor:
                start = _find(text, texts[:1], cursor, limit)
            if start is None:
                unplaced += 1
                continue
            role = m.get("role")
            if k == 0 and role in SYSTEM_ROLES:
                cuts.append((start, "sys"))
                at = self._tools_at(view[0], tools, tools_key, text) if tools else None
                if at is not None and start < at < limit:
                    cuts.append((at, "tools"))
                cursor = max(start, at or 0)
                continue
            if role == "user" and isinstance(messages[k].get("content"), list) and len(texts) > 1:
                cursor, missed = _part_cuts(text, texts, start, limit, cuts)
                unplaced += missed
                continue
            cuts.append((start, "tool" if role in TOOL_ROLES else "user" if role == "user" else
                         "asst" if role == "assistant" else "msg"))
            cursor = start
        return text, _increasing(cuts), True, unplaced

    def _block_starts(self, view: list[dict], tools, tools_key: bytes, text: str) -> list[int | None]:
        """Where each message's block starts in ``text``: the length of the rendering of the messages before it,
        if that rendering is how ``text`` begins (None where it is not)."""
        starts: list[int | None] = [0]
        key = tools_key
        last = 0
        for k in range(1, len(view)):
            key = _digest(key, view[k - 1])
            entry = self._prefix.get(key)
            if entry is None:
                try:
                    r = self.tok.render(view[:k], tools, False)
                    entry = (len(r), hash(r))
                except TemplateRefused:
                    entry = (-1, 0)
                if len(self._prefix) >= PREFIX_MEMO:
                    self._prefix.clear()
                self._prefix[key] = entry
            length, h = entry
            ok = last < length <= len(text) and hash(text[:length]) == h
            starts.append(length if ok else None)
            last = length if ok else last
        return starts

    def _tools_at(self, system: dict, tools, tools_key: bytes, text: str) -> int | None:
        """Where the tool schemas start in the system block: the first character at which that block rendered with
        the tools differs from it rendered without them (None if the block with tools does not begin ``text``)."""
        key = _digest(tools_key, system)
        if key not in self._tools_cut:
            try:
                with_tools = self.tok.render([system], tools, False)
                without = self.tok.render([system], None, False)
                at = _common_prefix(with_tools, without)
                at = at if 0 < at < len(with_tools) and text.startswith(with_tools) else None
            except TemplateRefused:
                at = None
            if len(self._tools_cut) >= PREFIX_MEMO:
                self._tools_cut.clear()
            self._tools_cut[key] = at
        return self._tools_cut[key]


def _find(text: str, needles: list[str], start: int, limit: int) -> int | None:
    if not needles:
        return None
    p = text.find(needles[0], start, limit)
    return p if p >= 0 else None


def _part_cuts(text: str, texts: list[str], start: int, limit: int, cuts: list) -> tuple[int, int]:
    """Cuts for a user message's text parts: documents, then the user's own text. Returns (cursor, missed)."""
    cuts.append((start, "doc"))
    first = text.find(texts[0], start, limit)
    cursor = first + len(texts[0]) if first >= 0 else start
    missed = 0
    for j, part in enumerate(texts[1:], start=1):
        p = text.find(part, cursor, limit)
        if p < 0:
            missed += 1
            continue
        cuts.append((p, "doc" if j < len(texts) - 1 else "user"))
        cursor = p + len(part)
    return cursor, missed


def _declared_cuts(text: str, declared: Declared) -> list[tuple[int, str]]:
    cuts, cursor = [], 0
    for j, (kind, part) in enumerate(declared.segments):
        p = text.find(part, cursor)
        if p < 0:
            after = f" after segment {j}'s" if j else ""
            raise ChatError(f"field 'prism.segments': segment {j + 1}'s text is not in the rendered prompt{after}")
        cuts.append((p if j else 0, KIND_LABEL[kind]))
        cursor = p + len(part)
    return _increasing(cuts)


def _increasing(cuts: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The cuts at increasing positions, the first at 0 (text before it joins the first segment); a cut at the
    position of the one before replaces it only if that one's segment would be empty."""
    out: list[tuple[int, str]] = []
    for pos, label in cuts:
        if out and pos <= out[-1][0]:
            if pos == out[-1][0]:
                out[-1] = (pos, label)
            continue
        out.append((pos, label))
    if out:
        out[0] = (0, out[0][1])
    return out
