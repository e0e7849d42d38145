"""Hardware and model profiles: GPU specs × model geometry, and the quantities derived from them.

Tensor parallelism (a model split over ``tp`` GPUs, as SGLang splits it): each GPU holds 1/tp of the weights
(the embedding and LM head are split by vocabulary rows as well, the norms are replicated and negligible) and
kv_heads/tp of the KV heads; with fewer KV heads than GPUs each GPU holds one replicated head (SGLang's
``ModelConfig.get_num_kv_heads``: ``max(1, kv_heads // tp)``). The attention heads must divide among the GPUs,
and the KV heads must too, or the GPUs must divide among the KV heads (SGLang's ``QKVParallelLinear``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from prism.config import build, load_yaml, nonneg, parse_packaged_yaml, positive, share
from prism.errors import UserError

GIB = 1 << 30


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float = positive(1.0, "dense bf16 FLOP/s (data sheet)")
    hbm_bandwidth: float = positive(1.0, "HBM bytes/s")
    memory_gib: float = positive(1.0, "device memory, GiB")
    sustained_compute: float = share(1.0, "share of the SXM part's sustained FLOP/s under the board's power "
                                     "limit (PCIe cards: about 0.9)")
    pcie_gen: int = positive(4, "PCIe generation of the host link")
    pcie_bandwidth: float = positive(26e9, "host-to-device bytes/s one way, as measured (Gen4 ~26e9, Gen5 ~50e9)")
    nvlink_bandwidth: float = nonneg(0.0, "GPU-to-GPU NVLink bytes/s one way (0: no NVLink)")
    gpus_per_node: int = positive(8, "GPUs in one server (tensor parallelism and parallel loading stay in one)")
    key: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def compute_flops(self) -> float:
        """The FLOP/s the efficiency factors apply to: peak × sustained share."""
        return self.peak_flops * self.sustained_compute


@dataclass(frozen=True)
class Model:
    layers: int = positive(1)
    hidden: int = positive(1)
    heads: int = positive(1)
    kv_heads: int = positive(1)
    head_dim: int = positive(1)
    intermediate: int = positive(1)
    vocab: int = positive(1)
    params: float = positive(1.0, "total parameter count")
    tie_embeddings: bool = False
    architecture: str = "LlamaForCausalLM"  # Hugging Face class name, for a generated config.json
    context_length: int = positive(4096, "longest sequence the model accepts")
    rope_theta: float = positive(10000.0)
    rms_norm_eps: float = positive(1e-5)
    aliases: tuple[str, ...] = field(default=())
    key: str = ""

    def check_tp(self, tp: int, where: str | None = None) -> None:
        """Refuse a tensor-parallel degree that SGLang cannot split this model into (module docstring)."""
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise UserError(f"field 'tp': must be an integer >= 1, got {tp!r}", where)
        if self.heads % tp:
            raise UserError(f"field 'tp': {self.key or 'the model'} has {self.heads} attention heads, which do "
                            f"not divide among {tp} GPUs", where)
        if (self.kv_heads % tp) if self.kv_heads >= tp else (tp % self.kv_heads):
            raise UserError(f"field 'tp': {self.key or 'the model'} has {self.kv_heads} KV heads, which do not "
                            f"split over {tp} GPUs", where)

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads each of ``tp`` GPUs holds: kv_heads / tp, at least one (replicated)."""
        self.check_tp(tp)
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tp: int = 1) -> int:
        """K and V for every layer on one GPU: 2 · layers · kv_heads_per_gpu(tp) · head_dim · dtype bytes."""
        heads = self.kv_heads if tp == 1 else self.kv_heads_per_gpu(tp)
        return 2 * self.layers * heads * self.head_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = 2, tp: int = 1) -> float:
        """The weights one of ``tp`` GPUs holds (all of them at tp = 1)."""
        if tp != 1:
            self.check_tp(tp)
        return self.params * dtype_bytes / tp

    @property
    def lm_head_params(self) -> float:
        """vocab × hidden: the LM head's matrix (the embedding's, when tied)."""
        return float(self.vocab * self.hidden)

    @property
    def non_embedding_params(self) -> float:
        """The transformer layers' parameters: all but the embedding and the LM head (one matrix when tied)."""
        return self.params - self.lm_head_params * (1 if self.tie_embeddings else 2)

    @property
    def matmul_params(self) -> float:
        """Parameters in a matmul for a token whose logits are computed (every decoded token): the layers and the
        LM head; the embedding lookup is not a matmul. They are also the bytes each decode step reads (÷ dtype)."""
        return self.non_embedding_params + self.lm_head_params


def _table(name: str) -> dict[str, Any]:
    """A packaged table (tests/test_calibration.py holds each to the strict loader's rules and result)."""
    return parse_packaged_yaml(table_text(name))


def table_text(name: str) -> str:
    return resources.files("prism.calibration").joinpath("profiles", name).read_text()


# The built-in tables are package data, read once per process (a sweep's worker resolves a profile per run).
@functools.cache
def gpus() -> Mapping[str, GPU]:
    return MappingProxyType({k: build(GPU, {**v, "key": k}, f"gpus.yaml: {k}")
                             for k, v in _table("gpus.yaml").items()})


@functools.cache
def models() -> Mapping[str, Model]:
    return MappingProxyType({k: build(Model, {**v, "key": k}, f"models.yaml: {k}")
                             for k, v in _table("models.yaml").items()})


def _lookup(table: Mapping, name: str, what: str):
    key = name.lower()
    if key in table:
        return table[key]
    for item in table.values():
        if key in getattr(item, "aliases", ()):
            return item
    raise UserError(f"unknown {what} {name!r} (known: {', '.join(sorted(table))})")


def gpu(name: str) -> GPU:
    return _lookup(gpus(), name, "GPU")


def model(name: str) -> Model:
    return _lookup(models(), name, "model")


def kv_capacity_tokens(g: GPU, m: Model, mem_fraction: float = 0.88, activation_reserve_gib: float = 2.0,
                       dtype_bytes: int = 2) -> int:
    """KV tokens that fit: GPU memory · mem_fraction − weights − activation reserve, over KV bytes/token."""
    free = g.memory_bytes * mem_fraction - m.weight_bytes(dtype_bytes) - activation_reserve_gib * GIB
    if free <= 0:
        raise UserError(f"{m.key} does not fit on {g.key} at mem_fraction={mem_fraction}")
    return int(free // m.kv_bytes_per_token(dtype_bytes))


def check_served(models: Sequence[Any], where: str | None = None) -> None:
    """Every served model of a multi-model trace (objects with ``profile`` and ``tp``: its ``meta.models``) names
    a known profile model and a tensor-parallel degree that model splits into; else one line naming the field."""
    for i, m in enumerate(models):
        try:
            served = model(m.profile)
        except UserError as e:
            raise UserError(f"field 'models[{i}].profile': {e}", where) from None
        served.check_tp(m.tp, f"{where}: models[{i}]" if where else f"models[{i}]")


def load_profile_file(path: str | Path) -> dict[str, Any]:
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise UserError("a profile must be a mapping with 'gpu', 'model' and optionally 'coefficients'", str(path))
    return data
