"""A local Hugging Face tokenizer folder as a chat server uses it: render the chat template, then encode.

SGLang's OpenAI chat endpoint (``srt/entrypoints/openai/serving_chat.py``, ``_apply_jinja_template``) renders the
messages with ``tokenizer.apply_chat_template(..., tokenize=False, add_generation_prompt=True, tools=...)`` and
encodes the text with ``add_special_tokens=False``. ``transformers`` is not installed here, so this module does
what its ``render_jinja_template`` does (``transformers/utils/chat_template_utils.py``) with jinja2 itself: an
``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks`` and the loop-controls extension, its
``tojson`` filter (no HTML escaping, indent/separators/sort_keys), the globals ``raise_exception`` and
``strftime_now``, a ``{% generation %}`` block that renders its body, and the special tokens of
``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...) as template variables. The template is
``chat_template.jinja`` if the folder has one, else ``tokenizer_config.json``'s ``chat_template`` (a string, or
named templates: ``tool_use`` when tools are given and present, else ``default``).

Encoding memoizes: the text is split where the tokenizer itself splits first, at its added tokens
(``<|im_start|>``, ...; ``tokenizers``' ``AddedVocabulary`` cuts the input there before normalizing and
pre-tokenizing each piece), and each piece is encoded once. The tokens are then exactly those of encoding the
whole text, which a test checks on every prompt it imports; a tokenizer for which that is not guaranteed (an added
token that strips the whitespace around it or matches after normalization, a pre-tokenizer that treats the first
piece specially) is encoded whole.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from prism.config import parse_json, path_kind, read_text
from prism.core import TOKEN_DTYPE
from prism.errors import UserError
from prism.traces.tokenizer import load_fast, tokenizer_json

#: pre-tokenizers that treat every piece between added tokens alike (so that pieces encode independently)
_PIECEWISE_PRE = {"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit", "UnicodeScripts"}
MEMO_TOKENS = 4_000_000  # tokens of encoded pieces kept for reuse (about 40 MB with their keys)
TOJSON_CACHE = 4096  # objects whose JSON text is remembered


class TemplateRefused(ValueError):
    """The chat template rejected the messages (``raise_exception``, or an error while rendering)."""


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _CachedToJson:
    """transformers' ``tojson``, remembered for the last TOJSON_CACHE objects it was given (by identity, holding
    them so that an id is never reused): tool schemas a log repeats on every line are serialized once. Templates
    run sandboxed and immutable, so an object cannot change between two calls."""

    def __init__(self) -> None:
        self._seen: dict[tuple, tuple[Any, str]] = {}

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> str:
        if type(x) is not dict and type(x) is not list:
            return _tojson(x, *args, **kwargs)
        key = (id(x), args, tuple(sorted(kwargs.items())))
        hit = self._seen.get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        if len(self._seen) >= TOJSON_CACHE:
            self._seen.clear()
        text = _tojson(x, *args, **kwargs)
        self._seen[key] = (x, text)
        return text


class _Fields(dict):
    """A message as the template gets it: a plain dict, marked so that the environment can read its fields fast
    (``Sandbox.getattr`` in :func:`_environment`)."""

    __slots__ = ()


_DICT_NAMES = frozenset(dir(dict))


def _fields(value: Any) -> Any:
    if type(value) is dict:
        return _Fields({k: _fields(v) for k, v in value.items()})
    if type(value) is list:
        return [_fields(v) for v in value]
    return value


def _environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker): renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    class Sandbox(ImmutableSandboxedEnvironment):
        def getattr(self, obj: Any, attribute: str) -> Any:
            """``message.content``: for a dict Jinja first looks for an attribute of that name, fails, and returns
            the item unchecked; for a message's field that is no dict attribute, return the item at once (the same
            value, a conversation rendered about four times faster)."""
            if type(obj) is _Fields and attribute[:1] != "_" and attribute not in _DICT_NAMES:
                try:
                    return obj[attribute]
                except KeyError:
                    pass
            return super().getattr(obj, attribute)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = _CachedToJson()
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def content_format(template_source: str) -> str:
    """``"openai"`` if the template loops over a message's content (it takes a list of parts), else ``"string"``:
    SGLang's detection (``srt/parser/jinja_template_utils.py``), which decides whether text parts reach the
    template as a list or joined into one string."""
    import jinja2

    def is_content(node) -> bool:
        while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)):
            node = node.node
        if isinstance(node, jinja2.nodes.Getattr):
            base, attr = node.node, node.attr
        elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
            base, attr = node.node, node.arg.value
        else:
            return False
        return attr == "content" and isinstance(base, jinja2.nodes.Name) and base.name in ("message", "msg", "m")

    try:
        ast = _environment().parse(template_source)
    except jinja2.TemplateSyntaxError:
        return "string"
    return "openai" if any(is_content(loop.iter) for loop in ast.find_all(jinja2.nodes.For)) else "string"


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTokenizer:
    """A tokenizer folder's chat template and fast tokenizer (``--tokenizer PATH``; never the hub)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        try:
            self._tok = load_fast(self.folder)
        except ImportError:
            raise UserError("reading a tokenizer needs the 'tokenizers' package (pip install 'prism-serve[hf]')",
                            str(self.folder)) from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._config = self._read_config()
        self._templates: dict[str, Any] | None = None
        added = self._tok.get_added_tokens_decoder()
        self._added = {tok.content: tid for tid, tok in added.items() if tok.content}
        self._split = (re.compile("|".join(map(re.escape, sorted(self._added, key=len, reverse=True))))
                       if self._added else None)
        self.piecewise = self._split is not None and self._pieces_are_independent(added)
        self._special = self.special_tokens()
        self._memo: OrderedDict[tuple[str, tuple[int, ...]], tuple[np.ndarray, list[int]]] = OrderedDict()
        self._memo_tokens = 0

    # ---------------------------------------------------------------- the folder
    def _read_config(self) -> dict:
        path = self.folder / "tokenizer_config.json" if path_kind(self.folder) == "dir" else None
        if path is None or path_kind(path) != "file":
            return {}
        data = parse_json(read_text(path, "tokenizer config (JSON)"), str(path))
        if not isinstance(data, dict):
            raise UserError("expected a JSON object", str(path))
        return data

    def _pieces_are_independent(self, added: dict) -> bool:
        spec = json.loads(self._tok.to_str())
        if any(t.lstrip or t.rstrip or t.single_word or (t.normalized and spec.get("normalizer"))
               for t in added.values()):
            return False
        pre = spec.get("pre_tokenizer")
        stack = [pre] if pre else []
        while stack:
            node = stack.pop()
            kind = node.get("type")
            if kind == "Sequence":
                stack.extend(node.get("pretokenizers", []))
            elif kind == "Metaspace":
                if node.get("prepend_scheme", "always") != "always":
                    return False
            elif kind not in _PIECEWISE_PRE:
                return False
        return True

    def _load_templates(self) -> dict[str, Any]:
        """The compiled templates by name (``default``, ``tool_use``, ...); a UserError if there is none."""
        if self._templates is not None:
            return self._templates
        jinja_file = self.folder / "chat_template.jinja"
        where = str(self.folder / "tokenizer_config.json")
        if path_kind(self.folder) == "dir" and path_kind(jinja_file) == "file":
            sources, where = {"default": read_text(jinja_file, "chat template (Jinja)")}, str(jinja_file)
        else:
            raw = self._config.get("chat_template")
            if isinstance(raw, str):
                sources = {"default": raw}
            elif isinstance(raw, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                               and isinstance(t.get("template"), str) for t in raw):
                sources = {t["name"]: t["template"] for t in raw}
            elif raw is None:
                raise UserError("the tokenizer has no chat template (no 'chat_template' in tokenizer_config.json "
                                "and no chat_template.jinja), and chat messages need one", str(self.folder))
            else:
                raise UserError("field 'chat_template': must be a string or a list of {name, template}", where)
        import jinja2

        env = _environment()
        compiled = {}
        for name, source in sources.items():
            try:
                compiled[name] = (env.from_string(source), content_format(source))
            except jinja2.TemplateSyntaxError as e:
                raise UserError(f"chat template {name!r} does not compile: {e.message} (template line {e.lineno})",
                                where) from None
        self._templates = compiled
        return compiled

    def _template(self, tools: Any) -> tuple[Any, str]:
        templates = self._load_templates()
        if tools and "tool_use" in templates:
            return templates["tool_use"]
        return templates.get("default") or next(iter(templates.values()))

    def check_template(self) -> None:
        """Raise the UserError a missing or broken template gives, before any work."""
        self._load_templates()

    def content_format(self, tools: Any = None) -> str:
        return self._template(tools)[1]

    def special_tokens(self) -> dict[str, Any]:
        """The template variables transformers passes from the special tokens map (``bos_token``, ...)."""
        out: dict[str, Any] = {}
        for key, value in self._config.items():
            if key.endswith("_token") and _token_text(value) is not None:
                out[key] = _token_text(value)
        extra = self._config.get("additional_special_tokens")
        if isinstance(extra, list):
            out["additional_special_tokens"] = [t for t in map(_token_text, extra) if t is not None]
        return out

    # ---------------------------------------------------------------- rendering
    def render(self, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool) -> str:
        """The prompt text, as ``apply_chat_template(tokenize=False)`` gives it; TemplateRefused if it refuses."""
        template = self._template(tools)[0]
        try:
            return template.render(messages=_fields(list(messages)), tools=list(tools) if tools else None,
                                   documents=None, add_generation_prompt=add_generation_prompt, **self._special)
        except Exception as e:  # the template is the tokenizer's code: whatever it raises (1/0, a recursion), it refused
            raise TemplateRefused(" ".join(str(e).split()) or type(e).__name__) from None

    # ---------------------------------------------------------------- encoding
    def encode(self, text: str, add_special_tokens: bool = False) -> np.ndarray:
        """The text's token ids; without the post-processor's special tokens (BOS) unless asked, as a chat server
        encodes a rendered prompt."""
        return np.asarray(self._tok.encode(text, add_special_tokens=add_special_tokens).ids, dtype=TOKEN_DTYPE)

    def decode(self, ids) -> str:
        return self._tok.decode(list(map(int, ids)), skip_special_tokens=False)

    def tokenize(self, jobs: Sequence[tuple[str, Sequence[int]]]) -> list[tuple[np.ndarray, list[int]]]:
        """For each ``(text, cuts)`` (cuts: sorted character offsets): the text's tokens and, for each cut, the index
        of the first token of the part that starts there. A token that straddles a cut belongs to the part it ends
        in (so a word keeps its leading space), i.e. the cut falls before the token holding the cut's character."""
        plans = [self._plan(text, cuts) for text, cuts in jobs]
        values, missing = {}, []
        for key in dict.fromkeys(k for plan in plans for k in plan[1]):
            hit = self._memo.get(key)
            if hit is None:
                missing.append(key)
            else:
                self._memo.move_to_end(key)
                values[key] = hit
        if missing:
            encodings = self._tok.encode_batch([piece for piece, _ in missing], add_special_tokens=False)
            for key, enc in zip(missing, encodings):
                values[key] = (np.asarray(enc.ids, dtype=TOKEN_DTYPE), _cut_tokens(enc, key[1]))
                self._remember(key, values[key])
        return [self._assemble(plan, values) for plan in plans]

    def _pieces(self, text: str) -> list[tuple[int, int, int | None]]:
        """``(start, end, added token id or None)`` tiling ``text``: the added tokens and the text between them."""
        if not self.piecewise:
            return [(0, len(text), None)] if text else []
        out, pos = [], 0
        for m in self._split.finditer(text):
            if m.start() > pos:
                out.append((pos, m.start(), None))
            out.append((m.start(), m.end(), self._added[m.group()]))
            pos = m.end()
        if pos < len(text):
            out.append((pos, len(text), None))
        return out

    def _plan(self, text: str, cuts: Sequence[int]):
        """The pieces to encode, each with the cuts inside it, and for every cut where its token index comes from:
        steps of ``(cuts at the piece's start, added token id or None, (memo key, cuts inside))``."""
        steps, keys, i, cuts = [], [], 0, list(cuts)
        for start, end, special in self._pieces(text):
            at_start = []
            while i < len(cuts) and cuts[i] <= start:  # a cut at a piece's start falls before its first token
                at_start.append(i)
                i += 1
            first_inner = i
            while i < len(cuts) and cuts[i] < end:
                i += 1
            inner = list(range(first_inner, i))
            if special is not None:  # one token: a cut inside it falls before it
                steps.append((at_start + inner, special, None))
                continue
            key = (text[start:end], tuple(cuts[j] - start for j in inner))
            keys.append(key)
            steps.append((at_start, None, (key, inner)))
        return steps, keys, list(range(i, len(cuts)))

    def _assemble(self, plan, values) -> tuple[np.ndarray, list[int]]:
        steps, _, tail = plan
        parts, where, count = [], {}, 0
        for at_start, special, piece in steps:
            for j in at_start:
                where[j] = count
            if special is not None:
                parts.append(np.array([special], dtype=TOKEN_DTYPE))
                count += 1
                continue
            key, inner = piece
            ids, local = values[key]
            for j, k in zip(inner, local):
                where[j] = count + k
            parts.append(ids)
            count += len(ids)
        for j in tail:  # cuts at or past the end
            where[j] = count
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=TOKEN_DTYPE)
        return tokens, [where[j] for j in range(len(where))]

    def _remember(self, key, value) -> None:
        self._memo[key] = value
        self._memo_tokens += len(value[0])
        while self._memo_tokens > MEMO_TOKENS and len(self._memo) > 1:
            _, (ids, _) = self._memo.popitem(last=False)
            self._memo_tokens -= len(ids)


def _cut_tokens(enc, cuts: Sequence[int]) -> list[int]:
    """Token index of each character cut in one encoding: the token holding that character (a character no token
    holds, which some normalizers drop, moves the cut to the next one that is held)."""
    out, n = [], len(enc.ids)
    for c in cuts:
        t = enc.char_to_token(c)
        probe = c
        while t is None and probe < c + 64:
            probe += 1
            t = enc.char_to_token(probe)
        out.append(n if t is None else t)
    return out


__all__ = ["ChatTokenizer", "TemplateRefused", "content_format", "tokenizer_json"]
