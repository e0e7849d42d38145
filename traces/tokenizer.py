"""Text to token ids for traces built from real text (agent traces).

Machines here reach no model hub, so the default is a deterministic local tokenizer: text is cut into
words and punctuation (words longer than 6 characters into 4-character pieces, roughly a BPE's token count)
and each piece maps to a token id by a stable hash. The same text always gives the same tokens, which is all
exact-prefix KV reuse needs. A user may instead pass a Hugging Face tokenizer directory (``tokenizer.json``
read with the ``tokenizers`` library, else ``transformers.AutoTokenizer``) to get the model's own token ids.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from prism.config import path_kind
from prism.core import stable_hash
from prism.errors import UserError

_PIECES = re.compile(r"\w+|[^\w\s]")
RESERVED = 256  # ids below are left to special tokens


class LocalTokenizer:
    def __init__(self, vocab_size: int = 32000) -> None:
        if vocab_size <= RESERVED:
            raise UserError(f"vocab_size must be > {RESERVED}, got {vocab_size}")
        self.vocab_size = vocab_size
        self._ids: dict[str, int] = {}

    def _id(self, piece: str) -> int:
        tid = self._ids.get(piece)
        if tid is None:
            tid = RESERVED + stable_hash(piece) % (self.vocab_size - RESERVED)
            self._ids[piece] = tid
        return tid

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in _PIECES.findall(text):
            if len(piece) > 6:
                out.extend(self._id(piece[i:i + 4]) for i in range(0, len(piece), 4))
            else:
                out.append(self._id(piece))
        return out


def tokenizer_json(path: str | Path) -> Path:
    """The ``tokenizer.json`` of a Hugging Face tokenizer folder (or the file itself); one line naming the path if
    there is none."""
    p = Path(path)
    kind = path_kind(p)
    if kind is None:
        raise UserError("tokenizer folder not found", str(p))
    tj = p / "tokenizer.json" if kind == "dir" else p
    if path_kind(tj) != "file":
        raise UserError("no tokenizer.json in the tokenizer folder (a Hugging Face fast tokenizer is needed)", str(p))
    return tj


def load_fast(path: str | Path):
    """A ``tokenizers.Tokenizer`` from a local folder or ``tokenizer.json`` (ImportError if the package is missing)."""
    from tokenizers import Tokenizer  # type: ignore

    tj = tokenizer_json(path)
    try:
        tok = Tokenizer.from_file(str(tj))
    except Exception as e:  # a malformed tokenizer.json: the library raises a bare Exception
        raise UserError(f"cannot load tokenizer: {' '.join(str(e).split())}", str(tj)) from None
    tok.no_truncation()  # as transformers encodes unless asked to cut: a file's truncation or padding never applies
    tok.no_padding()
    return tok


class HFTokenizer:
    """A local Hugging Face tokenizer directory (no hub access)."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        try:
            self._tok = load_fast(p)
            self._encode = lambda text: self._tok.encode(text, add_special_tokens=False).ids
            self.vocab_size = self._tok.get_vocab_size()
            return
        except ImportError:
            pass
        try:
            from transformers import AutoTokenizer  # type: ignore
        except ImportError:
            raise UserError("reading a tokenizer needs the 'tokenizers' or 'transformers' package "
                            "(pip install tokenizers)", str(p)) from None
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        self._encode = lambda text: tok.encode(text, add_special_tokens=False)
        self.vocab_size = tok.vocab_size

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))


@functools.lru_cache(maxsize=8)
def get_tokenizer(path: str | None, vocab_size: int = 32000):
    return HFTokenizer(path) if path else LocalTokenizer(vocab_size)
