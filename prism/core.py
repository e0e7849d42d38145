"""The shared vocabulary: segments, requests and their serialized prompts.

A prompt is a sequence of *segments*: one system prompt (``sys``), m reusable pieces (``reuse``: retrieved
passages, policies, tool schemas, Mooncake blocks) and one private suffix (``priv``). KV reuse in a radix
cache needs exact token-prefix equality, so every segment has a fixed token array. Two rules make the radix
tree share exactly what is meant to be shared:

* the same segment id always yields the same tokens (a truncated segment is a prefix of the full one);
* two different segments never share their first token.

The tokens themselves carry no meaning in the simulator; :class:`SegmentTable` gives every new id the next
free *first token* and fills the rest from a fixed pseudo-random stream at an offset hashed from the id, so a
trace file only has to store ids, lengths and first tokens (or explicit tokens, when a real tokenizer produced
them).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Final, Iterable, Sequence

import numpy as np
from mypy_extensions import mypyc_attr

#: the segment kinds (Final: compiled code compares a segment's kind with the string itself, not a global's lookup)
SYS: Final = "sys"
REUSE: Final = "reuse"
PRIV: Final = "priv"
KINDS = (SYS, REUSE, PRIV)

#: Token ids are int32; a prompt travels as their bytes (``key``), so that comparing prefixes is a memcmp.
TOKEN_DTYPE = np.int32
TOKEN_BYTES = np.dtype(TOKEN_DTYPE).itemsize

#: First tokens are handed out from here upwards, one per segment id; the bulk of a segment's tokens lie
#: in ``[BULK_LOW, vocab_size)``. Keeping the ranges apart guarantees distinct first tokens.
FIRST_TOKEN_BASE = 1
BULK_LOW = 1 << 20
BULK_HIGH = 1 << 30

_POOL_SIZE = 1 << 20
_pool: list[bytes] = []  # the pool's token bytes, made on first use
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BLOCK = 1 << 14


def stable_hash(text: str) -> int:
    """A 64-bit hash that, unlike ``hash()``, is the same in every process and run."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def hashed_tokens(seed: int, start: int, count: int, low: int = BULK_LOW, high: int = BULK_HIGH) -> np.ndarray:
    """``count`` deterministic pseudo-random tokens: token ``i`` is ``low + splitmix64(seed + (start + i + 1) *
    golden) % (high - low)``.

    Made a block of 16,384 at a time, in place: the temporaries stay in the CPU's cache, and no array of the whole
    count is made but the result (whole-array steps faulted in eight arrays of 8 MB for the pool's million tokens:
    docs/benchmarks.md)."""
    out = np.empty(count, dtype=TOKEN_DTYPE)
    block_buffer = np.empty(min(count, _BLOCK), dtype=np.uint64)
    scratch_buffer = np.empty_like(block_buffer)
    span = np.uint64(high - low)
    with np.errstate(over="ignore"):
        for at in range(0, count, _BLOCK):
            n = min(_BLOCK, count - at)
            block, scratch = block_buffer[:n], scratch_buffer[:n]
            block[:] = np.arange(start + at + 1, start + at + n + 1, dtype=np.uint64)
            block *= _GOLDEN
            block += np.uint64(seed)
            block ^= np.right_shift(block, np.uint64(30), out=scratch)
            block *= _M1
            block ^= np.right_shift(block, np.uint64(27), out=scratch)
            block *= _M2
            block ^= np.right_shift(block, np.uint64(31), out=scratch)
            # block % span as block - (block // span) * span: numpy's floor_divide by one scalar divisor takes a
            # fast path (libdivide) that its remainder does not
            np.floor_divide(block, span, out=scratch)
            scratch *= span
            block -= scratch
            block += np.uint64(low)
            out[at:at + n] = block
    return out


def _bulk_bytes(seed: int, count: int) -> bytes:
    """A segment's tokens after the first, as token bytes: a window of a fixed pseudo-random pool, placed by the
    id's hash (cheap for traces with 10^5 segments; windows may overlap, harmlessly, since first tokens differ)."""
    if count > _POOL_SIZE // 2:
        return hashed_tokens(seed, 1, count).tobytes()
    if not _pool:
        _pool.append(hashed_tokens(0x5EED, 0, _POOL_SIZE).tobytes())
    start = (seed % (_POOL_SIZE - count)) * TOKEN_BYTES
    return _pool[0][start:start + count * TOKEN_BYTES]


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    """One piece of a prompt. ``tokens`` is fixed for the id; equality is by (kind, id, length).

    A segment holds either explicit tokens (``Segment(kind, id, tokens)``: a real tokenizer's) or, as a
    :class:`SegmentTable` makes them, only its length, first token and the hash of its id: its ``tokens``
    are then made when asked (the first token, then a window of a shared pseudo-random pool), so that a
    trace holds no token array per segment or request, only these references."""

    kind: str
    id: str
    explicit: np.ndarray | None = field(default=None, repr=False)
    length: int = field(default=0, repr=False)
    first: int = field(default=0, repr=False)  # the first token
    seed: int = field(default=0, repr=False)  # places the bulk of the tokens in the pool

    def __post_init__(self) -> None:
        if self.explicit is not None:
            object.__setattr__(self, "length", len(self.explicit))
            object.__setattr__(self, "first", int(self.explicit[0]) if len(self.explicit) else 0)

    @property
    def tokens(self) -> np.ndarray:
        if self.explicit is not None:
            return self.explicit
        return np.frombuffer(self.token_bytes(), dtype=TOKEN_DTYPE)  # read-only, as a segment's tokens are

    def token_bytes(self) -> bytes:
        """The tokens as token bytes (a prompt's ``key`` joins them)."""
        if self.explicit is not None:
            return self.explicit.tobytes()
        if not self.length:
            return b""
        return self.first.to_bytes(TOKEN_BYTES, sys.byteorder, signed=True) + _bulk_bytes(self.seed, self.length - 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Segment) and (self.kind, self.id, self.length) == (
            other.kind, other.id, other.length)

    def __hash__(self) -> int:
        return hash((self.kind, self.id, self.length))


class SegmentTable:
    """Hands out segments: a unique first token per id, hashed tokens after it (made when asked for)."""

    def __init__(self) -> None:
        self._first: dict[str, int] = {}
        self._kind: dict[str, str] = {}
        self._explicit: dict[str, np.ndarray] = {}
        self._made: dict[str, Segment] = {}  # each id at the length first asked for
        self._cut: dict[tuple[str, int], Segment] = {}  # at other lengths

    def __len__(self) -> int:
        return len(self._first)

    def __contains__(self, seg_id: str) -> bool:
        return seg_id in self._first

    def declare(self, seg_id: str, kind: str, first_token: int | None = None,
                tokens: Sequence[int] | None = None) -> None:
        """Register ``seg_id``; a fresh id gets the next free first token unless one is given."""
        if kind not in KINDS:
            raise ValueError(f"segment {seg_id!r}: kind must be one of {KINDS}, got {kind!r}")
        if seg_id in self._first:
            if self._kind[seg_id] != kind:
                raise ValueError(f"segment {seg_id!r} declared as {self._kind[seg_id]!r} and {kind!r}")
            return
        if tokens is not None:
            arr = np.asarray(tokens, dtype=TOKEN_DTYPE)
            first = int(arr[0]) if len(arr) else FIRST_TOKEN_BASE + len(self._first)
            self._explicit[seg_id] = arr
        else:
            first = FIRST_TOKEN_BASE + len(self._first) if first_token is None else int(first_token)
        self._first[seg_id] = first
        self._kind[seg_id] = kind

    def segment(self, seg_id: str, kind: str, length: int) -> Segment:
        """The segment ``seg_id`` cut to ``length`` tokens (declared on first use)."""
        seg = self._made.get(seg_id)
        if seg is not None and seg.length == length:
            return seg
        seg = self._cut.get((seg_id, length)) if seg is not None else None
        if seg is not None:
            return seg
        self.declare(seg_id, kind)
        if seg_id in self._explicit:
            full = self._explicit[seg_id]
            if length > len(full):
                raise ValueError(f"segment {seg_id!r} has {len(full)} tokens, {length} asked")
            tokens = full[:length]
            tokens.flags.writeable = False
            seg = Segment(self._kind[seg_id], seg_id, tokens)
        else:
            seg = Segment(self._kind[seg_id], seg_id, None, length, self._first[seg_id], stable_hash(seg_id))
        if seg_id in self._made:
            self._cut[(seg_id, length)] = seg
        else:
            self._made[seg_id] = seg
        return seg

    def first_token(self, seg_id: str) -> int:
        return self._first[seg_id]

    def kind(self, seg_id: str) -> str:
        return self._kind[seg_id]

    def explicit_tokens(self, seg_id: str) -> np.ndarray | None:
        return self._explicit.get(seg_id)

    def ids(self) -> list[str]:
        return list(self._first)


@dataclass(slots=True, eq=False)
class Request:
    """One request of a trace: what the client sends, never changed by a run.

    ``segments`` is the trace's own order: at most one ``sys`` (first), reusable segments, and a private
    suffix last (an agent turn's history also holds the earlier, private messages of its session).
    ``session`` groups the turns of an agent conversation. ``fixed_order`` marks prompts whose reusable
    segments must not be reordered (conversation history, contiguous document blocks): schedulers that align
    prompts leave them as they are. ``model`` names the model that serves the request in a trace of several
    models (None: the one model of a single-model trace).
    """

    id: int
    arrival: float
    segments: tuple[Segment, ...]
    output_len: int
    session: str | None = None
    fixed_order: bool = False
    model: str | None = None

    @property
    def prompt_len(self) -> int:
        n = 0
        for s in self.segments:  # compiled: each length read from the segment's slot, no call
            n += s.length
        return n

    @property
    def skeleton(self) -> tuple[str, ...]:
        """The ordered ids of the reusable segments."""
        return tuple(s.id for s in self.segments if s.kind == REUSE)

    def tokens(self) -> np.ndarray:
        return serialize(self.segments)


@mypyc_attr(allow_interpreted_subclasses=True)  # the live plugin's and ContextPilot's prompts (prism/native.py)
class SegmentedPrompt:
    """A prompt held as its segments in their current order; the serialized token bytes (``key``) and the
    layout are made when first needed, so a scheduler that realigns a request before admission has its prompt
    serialized once, not once per order. The simulator's requests and the live plugin's views share it."""

    __slots__ = ("segments", "_key", "_layout")

    def set_segments(self, segments: tuple[Segment, ...]) -> None:
        self.segments = segments
        self._key: bytes | None = None
        self._layout: tuple[tuple[int, str, str], ...] | None = None

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = serialize_bytes(self.segments)
        return self._key

    @property
    def layout(self) -> tuple[tuple[int, str, str], ...]:
        if self._layout is None:
            self._layout = layout(self.segments)
        return self._layout

    def shared_ids(self) -> list[str]:
        """Ids of the segments other requests may share (system and reusable), as the demand counters see them."""
        return [s.id for s in self.segments if s.kind != PRIV]


def realigned(segments: Sequence[Segment], skeleton: Sequence[str], request_id: int) -> tuple[Segment, ...] | None:
    """The prompt with its reusable segments in ``skeleton`` order (the system prompt stays first, private
    segments last), or None if that is the order it has. Both engines apply a scheduler's realignment so."""
    head: list[Segment] = []
    tail: list[Segment] = []
    reuse: dict[str, Segment] = {}
    for s in segments:
        if s.kind == REUSE:
            reuse[s.id] = s
        else:
            (head if s.kind == SYS else tail).append(s)
    if tuple(reuse) == tuple(skeleton):
        return None
    if len(skeleton) != len(reuse) or reuse.keys() != set(skeleton):
        raise ValueError(f"request {request_id}: realignment must permute its reusable segments")
    return (*head, *map(reuse.__getitem__, skeleton), *tail)


def serialize(segments: Iterable[Segment]) -> np.ndarray:
    """The prompt's token ids (read-only): segment tokens concatenated in the given order."""
    return np.frombuffer(serialize_bytes(segments), dtype=TOKEN_DTYPE)


def serialize_bytes(segments: Iterable[Segment]) -> bytes:
    """The prompt as token bytes, its radix key."""
    return b"".join([s.token_bytes() for s in segments])


_OUTPUT_SEED = stable_hash("output")


_output_stream: list[bytes] = [b""]  # the shared stream's first tokens made so far


def output_token_bytes(count: int) -> bytes:
    """Stand-ins for the tokens a request generates, as token bytes.

    They follow the request's private suffix, so their radix path is private whatever their values; one
    shared stream (cut to ``count``: each token depends on its position alone) keeps the simulator from hashing
    per request, or per length: most traces' output lengths vary. It is made once and doubled when a longer cut
    is asked for."""
    stream, n = _output_stream[0], count * TOKEN_BYTES
    if len(stream) < n:
        longer = max(count, 2 * len(stream) // TOKEN_BYTES)
        stream = _output_stream[0] = hashed_tokens(_OUTPUT_SEED, 0, longer).tobytes()
    return stream[:n]


def layout(segments: Sequence[Segment]) -> tuple[tuple[int, str, str], ...]:
    """``(end offset, kind, id)`` of each segment in prompt order: where DART places its anchors."""
    out, end = [], 0
    for s in segments:
        end += s.length
        out.append((end, s.kind, s.id))
    return tuple(out)
