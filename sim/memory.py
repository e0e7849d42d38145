"""One GPU's memory as kvcached hands it to the models resident on it: 2 MiB physical pages (DESIGN §9).

Pure bookkeeping, engine-independent: it counts pages and returns the seconds of virtual-memory work an
operation costs on the engine's path (:class:`~prism.calibration.loading.VmmCosts`); the simulator decides when
to charge them. The layout is kvcached's (``ovg-project/kvcached``, ``kvcached/page_allocator.py``,
``kvcached/utils.py``):

* **weights**: a resident model's weights (its tensor-parallel shard, plus ``extra_bytes`` for the engine's own
  buffers) take whole pages from activation to eviction;
* **KV blocks**: a model's KV pool is 2·L tensors (K and V of each layer), and kvcached's page id is one 2 MiB
  page in each of them (its physical memory is ``pages × num_layers × 2 × PAGE_SIZE``), so a model's KV grows and
  shrinks in *blocks* of 2·L pages, each holding 2 MiB ÷ (bytes per token of one layer's K) tokens
  (:class:`KvLayout`: 1,024 tokens in 64 pages for Llama-3.1-8B). Pages are never shared across models;
* **the pre-mapped buffer**: each model keeps up to ``buffer_max`` (10) blocks mapped but unused. A block taken
  from it costs nothing on the engine's path; with the buffer empty, fresh pages are created, mapped and enabled
  on the path. A freed block returns to the buffer while it holds fewer than ``buffer_max``, else is unmapped on
  the path; a background thread refills the buffer to ``buffer_min`` (5) from free pages
  (``MIN_RESERVED_PAGES`` / ``MAX_RESERVED_PAGES``; its time is counted apart, off the path);
* **the balloon**: each model's KV limit, in blocks, covering its blocks in use and its buffer. Raising it is
  immediate; lowering it below what the model holds takes effect only as the model frees blocks (kvcached's
  ``resize`` refuses a size below the pages in use), never by dropping live KV: the buffer is unmapped at once,
  and :meth:`GpuMemory.excess_tokens` tells the engine how much it should free (cached prefixes first; live KV
  when its requests finish).

A model's KV use is given in tokens, the engine's unit: those of its running requests (live) and of the
prefixes its radix cache keeps (cached). The pool maps whole blocks for them and packs tokens densely: kvcached
fills partly used pages first, but a block whose tokens are partly freed stays mapped there, so this page count
is a lower bound on kvcached's (fragmentation inside blocks is not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from prism.calibration.loading import PAGE_BYTES, VmmCosts, pages_for_bytes
from prism.calibration.profiles import GPU, Model
from prism.errors import UserError

#: kvcached's defaults: GPU_UTILIZATION (the share of memory it hands out), MIN/MAX_RESERVED_PAGES
UTILIZATION, BUFFER_MIN, BUFFER_MAX = 0.95, 5, 10


class MemoryFull(Exception):
    """An operation needs pages the GPU (or the model's limit) does not have now: the caller asks first
    (:meth:`GpuMemory.room_tokens`, :meth:`GpuMemory.can_load`)."""


@dataclass(frozen=True)
class KvLayout:
    """How one model's KV lands on one GPU's pages: ``bytes_per_token`` of this GPU's shard, over ``layers``."""

    bytes_per_token: int
    layers: int

    def __post_init__(self) -> None:
        if self.layers < 1 or self.bytes_per_token < 1 or self.bytes_per_token % (2 * self.layers):
            raise ValueError(f"KV of {self.bytes_per_token} bytes per token is not K and V of {self.layers} layers")
        if self.bytes_per_token // (2 * self.layers) > PAGE_BYTES:
            raise ValueError("one token of one layer's K is larger than a page")

    @classmethod
    def of(cls, model: Model, tp: int = 1, dtype_bytes: int = 2) -> "KvLayout":
        return cls(model.kv_bytes_per_token(dtype_bytes, tp), model.layers)

    @cached_property  # read on every iteration of an elastic engine (its pool's reach and blocks)
    def pages_per_block(self) -> int:
        return 2 * self.layers

    @cached_property
    def tokens_per_block(self) -> int:
        return PAGE_BYTES // (self.bytes_per_token // (2 * self.layers))

    def blocks(self, tokens: int) -> int:
        """Blocks that hold ``tokens``."""
        return -(-tokens // self.tokens_per_block)

    def pages(self, tokens: int) -> int:
        return self.blocks(tokens) * self.pages_per_block

    def tokens(self, blocks: int) -> int:
        """Tokens ``blocks`` hold."""
        return blocks * self.tokens_per_block


@dataclass
class _Resident:
    layout: KvLayout
    weight_pages: int
    limit: int  # blocks: in use + buffer never exceed it
    target: int  # blocks asked for; limit == max(target, blocks) while a shrink waits
    blocks: int = 0
    buffer: int = 0
    live: int = 0
    cached: int = 0


@dataclass(frozen=True)
class MemorySample:
    """One GPU's memory at time ``t``, in bytes: the parts add up to the pool's size."""

    t: float
    weights: int
    kv_live: int  # blocks for running requests' KV
    kv_cached: int  # the rest of the blocks in use: cached prefixes (and the free end of the last block)
    buffer: int  # pre-mapped, unused
    free: int


@dataclass
class VmmCounters:
    """Seconds of VMM work (on the engine's path, and the background refill's) and pages moved."""

    path_s: float = 0.0
    background_s: float = 0.0
    pages_mapped: int = 0
    pages_unmapped: int = 0
    blocks_released: int = 0  # blocks models stopped using (to their buffers or unmapped): room for others


@dataclass
class GpuMemory:
    """One GPU's page pool and the models resident on it (module docstring). Sizes in pages, KV in tokens."""

    total_pages: int
    costs: VmmCosts = field(default_factory=VmmCosts)
    buffer_min: int = BUFFER_MIN
    buffer_max: int = BUFFER_MAX
    name: str = "gpu"
    counters: VmmCounters = field(default_factory=VmmCounters)

    def __post_init__(self) -> None:
        if self.total_pages < 1 or not 0 <= self.buffer_min <= self.buffer_max:
            raise ValueError(f"{self.name}: needs pages and 0 <= buffer_min <= buffer_max")
        self._models: dict[str, _Resident] = {}
        self._used: int | None = 0  # pages in use, kept up to date by use() (the hot path), else recounted
        # moves whenever a model's balloon may have: its blocks, buffer, limit or target, the free pages, or
        # its tokens while a shrink waits (else they cannot exceed its target). An elastic engine asks for its
        # balloon before every iteration and gets the same answer 99.5% of the time (bench_fleet.py's prism
        # fleet): it asks the pool again only when this moved
        self.changes = 0

    @classmethod
    def for_gpu(cls, gpu: GPU, utilization: float = UTILIZATION, **kw) -> "GpuMemory":
        """The pool of a profile GPU: ``utilization`` of its memory, as kvcached hands it out."""
        if not 0 < utilization <= 1:
            raise UserError(f"field 'utilization': must be in (0, 1], got {utilization!r}")
        return cls(int(gpu.memory_bytes * utilization // PAGE_BYTES), name=kw.pop("name", gpu.key or gpu.name), **kw)

    # ---------------------------------------------------------------- queries
    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._models)

    def __contains__(self, model: str) -> bool:
        return model in self._models

    @property
    def used_pages(self) -> int:
        if self._used is None:
            self._used = sum(r.weight_pages + (r.blocks + r.buffer) * r.layout.pages_per_block
                             for r in self._models.values())
        return self._used

    @property
    def free_pages(self) -> int:
        return self.total_pages - self.used_pages

    @property
    def loadable_pages(self) -> int:
        """Pages weights may take now: the free ones and the models' buffers (unmapped first when needed), that is
        every page but weights and blocks in use."""
        return self.free_pages + self._buffers()

    def weight_pages(self, model: str) -> int:
        return self._get(model).weight_pages

    def kv_pages(self, model: str) -> int:
        """Pages of the model's blocks in use (live and cached KV)."""
        r = self._get(model)
        return r.blocks * r.layout.pages_per_block

    def buffer_pages(self, model: str) -> int:
        r = self._get(model)
        return r.buffer * r.layout.pages_per_block

    def used_tokens(self, model: str) -> tuple[int, int]:
        """(live, cached) tokens the model holds."""
        r = self._get(model)
        return r.live, r.cached

    def limit_tokens(self, model: str) -> int:
        """The balloon now: the tokens the model's blocks may hold (above its target while a shrink waits)."""
        r = self._get(model)
        return r.layout.tokens(r.limit)

    def target_tokens(self, model: str) -> int:
        r = self._get(model)
        return r.layout.tokens(r.target)

    def excess_tokens(self, model: str) -> int:
        """Tokens held above the target: what the model should free (cached prefixes first) for a shrink."""
        return self.balloon(model)[0]

    def reach_tokens(self, model: str) -> int:
        """Tokens the model may hold now: its blocks in use, its buffer and fresh blocks from free pages, up to
        its limit (an elastic engine's capacity)."""
        return self.balloon(model)[1]

    def balloon(self, model: str) -> tuple[int, int]:
        """:meth:`excess_tokens` and :meth:`reach_tokens` together: an elastic engine asks both before every
        iteration, so one lookup serves both."""
        r = self._get(model)
        layout = r.layout
        fresh = self.free_pages // layout.pages_per_block
        return (max(0, r.live + r.cached - layout.tokens(r.target)),
                layout.tokens(r.blocks + min(r.limit - r.blocks, r.buffer + fresh)))

    def room_tokens(self, model: str) -> int:
        """Tokens the model may add now: its reach beyond what it holds (the free end of its last block
        included)."""
        r = self._get(model)
        return self.reach_tokens(model) - r.live - r.cached

    def can_load(self, weight_bytes: float, extra_bytes: float = 0.0) -> bool:
        """Whether weights fit now, counting the other models' buffers (unmapped first when needed)."""
        return pages_for_bytes(weight_bytes + extra_bytes) <= self.loadable_pages

    def sample(self, t: float) -> MemorySample:
        weights = live = cached = buffer = 0
        for r in self._models.values():
            ppb = r.layout.pages_per_block
            weights += r.weight_pages
            in_use = min(r.layout.blocks(r.live), r.blocks) * ppb
            live += in_use
            cached += r.blocks * ppb - in_use
            buffer += r.buffer * ppb
        return MemorySample(t, weights * PAGE_BYTES, live * PAGE_BYTES, cached * PAGE_BYTES, buffer * PAGE_BYTES,
                            self.free_pages * PAGE_BYTES)

    # ---------------------------------------------------------------- residency
    def load(self, model: str, weight_bytes: float, layout: KvLayout, limit_tokens: int | None = None,
             extra_bytes: float = 0.0) -> float:
        """Map a model's weights (activation); its KV limit starts at ``limit_tokens`` (None: the whole GPU).
        Other models' buffers are unmapped first if the free pages do not suffice. Returns seconds on the path."""
        if model in self._models:
            raise ValueError(f"{self.name}: {model} is already resident")
        pages = pages_for_bytes(weight_bytes + extra_bytes)
        if pages > self.loadable_pages:
            raise MemoryFull(f"{self.name}: {model}'s weights need {pages} pages, {self.free_pages} are free")
        t = self._trim_buffers(pages - self.free_pages)
        limit = self.total_pages // layout.pages_per_block if limit_tokens is None else layout.blocks(limit_tokens)
        self._models[model] = _Resident(layout, pages, limit, limit)
        self._used = None
        self.changes += 1
        self._refill(self._models[model])
        return t

    def unload(self, model: str) -> float:
        """Evict a model: every page it holds is unmapped (its cached prefixes go with it). Its running requests
        must have finished (no live KV). Returns seconds on the path."""
        r = self._get(model)
        if r.live:
            raise ValueError(f"{self.name}: {model} still holds {r.live} tokens of running requests")
        del self._models[model]
        self._used = None
        self.changes += 1
        return self._unmap(r.weight_pages + (r.blocks + r.buffer) * r.layout.pages_per_block)

    # ---------------------------------------------------------------- KV
    def use(self, model: str, live: int, cached: int) -> float:
        """The model now holds ``live`` + ``cached`` tokens: map the blocks that needs beyond what it holds (its
        buffer first, then fresh pages on the path), or release the blocks it no longer needs (to its buffer, the
        rest unmapped on the path). Raises :class:`MemoryFull` past :meth:`room_tokens`. Returns seconds on the
        path."""
        r = self._get(model)
        if live < 0 or cached < 0:
            raise ValueError(f"{self.name}: {model}: negative tokens")
        need = r.layout.blocks(live + cached)
        if need == r.blocks:  # most iterations: the same blocks, nothing to map or release
            r.live, r.cached = live, cached
            if r.limit != r.target:  # a shrink waits: its excess moved
                self.changes += 1
            if r.buffer < self.buffer_min:
                self._refill(r)
            return 0.0
        held = r.blocks + r.buffer
        used = self.used_pages
        t = 0.0
        if need > r.blocks:
            grow = need - r.blocks
            fresh = max(0, grow - r.buffer)
            if need > r.limit or fresh * r.layout.pages_per_block > self.free_pages:
                raise MemoryFull(f"{self.name}: {model} asks {live + cached} tokens, "
                                 f"{self.room_tokens(model) + r.live + r.cached} fit")
            r.buffer -= grow - fresh
            t = self._map(fresh * r.layout.pages_per_block)
        elif need < r.blocks:
            freed = r.blocks - need
            self.counters.blocks_released += freed
            r.limit = max(r.target, need)  # a waiting shrink follows the freed blocks down
            keep = max(0, min(freed, self.buffer_max - r.buffer, r.limit - need - r.buffer))
            r.buffer += keep
            t = self._unmap((freed - keep) * r.layout.pages_per_block)
        r.blocks, r.live, r.cached = need, live, cached
        self._used = used + (r.blocks + r.buffer - held) * r.layout.pages_per_block
        self.changes += 1
        self._refill(r)
        return t

    def set_limit(self, model: str, tokens: int) -> float:
        """The balloon: the model's KV limit becomes ``tokens`` (in whole blocks). Raising it takes effect at once;
        lowering it below what the model holds waits for the model to free blocks (its buffer is unmapped now).
        Returns seconds on the path (the buffer's unmapping)."""
        r = self._get(model)
        r.target = r.layout.blocks(tokens)
        r.limit = max(r.target, r.blocks)
        trim = max(0, r.blocks + r.buffer - r.limit)
        r.buffer -= trim
        self._used = None
        self.changes += 1
        t = self._unmap(trim * r.layout.pages_per_block)
        self._refill(r)
        return t

    # ---------------------------------------------------------------- internals
    def _get(self, model: str) -> _Resident:
        try:
            return self._models[model]
        except KeyError:
            raise ValueError(f"{self.name}: {model} is not resident") from None

    def _buffers(self) -> int:
        return sum(r.buffer * r.layout.pages_per_block for r in self._models.values())

    def _map(self, pages: int) -> float:
        self.counters.pages_mapped += pages
        t = self.costs.map_seconds(pages)
        self.counters.path_s += t
        return t

    def _unmap(self, pages: int) -> float:
        self.counters.pages_unmapped += pages
        t = self.costs.unmap_seconds(pages)
        self.counters.path_s += t
        return t

    def _refill(self, r: _Resident) -> None:
        """The background thread: the buffer back to ``buffer_min`` blocks, within the limit and free pages."""
        add = min(self.buffer_min - r.buffer, r.limit - r.blocks - r.buffer,
                  self.free_pages // r.layout.pages_per_block)
        if add > 0:
            r.buffer += add
            self.changes += 1
            pages = add * r.layout.pages_per_block
            if self._used is not None:
                self._used += pages
            self.counters.pages_mapped += pages
            self.counters.background_s += self.costs.map_seconds(pages)

    def release_buffers(self, keep: str) -> float:
        """Unmap every buffer but ``keep``'s (a model that cannot map a block takes the others' idle pages).
        Returns seconds of unmapping."""
        return self._trim_buffers(sum(r.buffer * r.layout.pages_per_block for n, r in self._models.items()
                                      if n != keep), keep)

    def _trim_buffers(self, pages: int, keep: str | None = None) -> float:
        """Unmap other models' buffers, largest first, until ``pages`` more pages are free."""
        t = 0.0
        for n, r in sorted(self._models.items(), key=lambda nr: -nr[1].buffer * nr[1].layout.pages_per_block):
            if pages <= 0:
                break
            if n == keep:
                continue
            blocks = min(r.buffer, -(-pages // r.layout.pages_per_block))
            r.buffer -= blocks
            self._used = None
            self.changes += 1
            pages -= blocks * r.layout.pages_per_block
            t += self._unmap(blocks * r.layout.pages_per_block)
        return t
