"""The step-time cost model of one engine iteration (DESIGN §5).

prefill: ``t = a_p + b_p·N_new + c_p·Σ new_i·(cached_i + new_i/2)``
decode:  ``t = a_d + b_d·B + c_d·Σ ctx_i``

``b_p`` is the linear layers' work per new token, ``c_p`` the causal attention work per (query, key) pair;
``a_d`` is reading the weights once per decode step, ``c_d`` reading one token's KV. Defaults come from a
roofline over the model geometry and the GPU's peak FLOP/s and bandwidth, scaled by efficiency factors;
``prism-calibrate fit`` replaces them with least-squares fits to measured iterations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from prism.config import build, fraction, nonneg
from prism.errors import UserError

from prism.calibration import profiles


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak that real kernels reach; the defaults are typical of SGLang on Ampere/Hopper."""

    prefill_mfu: float = fraction(0.55, "linear layers in prefill, fraction of peak FLOP/s")
    attention_mfu: float = fraction(0.35, "prefill attention, fraction of peak FLOP/s")
    decode_mfu: float = fraction(0.30, "linear layers per decoded token, fraction of peak FLOP/s")
    bandwidth: float = fraction(0.80, "weights and KV reads, fraction of HBM bandwidth")
    prefill_overhead_s: float = nonneg(0.003, "fixed cost of a prefill iteration (launch, scheduling)")
    decode_overhead_s: float = nonneg(0.001, "fixed cost of a decode iteration besides reading weights")
    first_token_s: float = nonneg(0.0005, "prefill end to first token at the client (sampling, streaming)")


@dataclass(frozen=True)
class CostModel:
    a_p: float = nonneg(0.0)
    b_p: float = nonneg(0.0)
    c_p: float = nonneg(0.0)
    a_d: float = nonneg(0.0)
    b_d: float = nonneg(0.0)
    c_d: float = nonneg(0.0)
    first_token_s: float = nonneg(0.0)
    name: str = "custom"

    def prefill_time(self, new: Sequence[int], cached: Sequence[int]) -> float:
        pairs = sum(n * (c + n / 2) for n, c in zip(new, cached))
        return self.a_p + self.b_p * sum(new) + self.c_p * pairs

    def decode_time(self, batch: int, context_tokens: int) -> float:
        return self.a_d + self.b_d * batch + self.c_d * context_tokens

    def coefficients(self) -> dict[str, float]:
        d = asdict(self)
        d.pop("name")
        return d


def roofline(gpu: profiles.GPU, model: profiles.Model, eff: Efficiency | None = None,
             dtype_bytes: int = 2) -> CostModel:
    eff = eff or Efficiency()
    peak, bw = gpu.peak_flops, gpu.hbm_bandwidth * eff.bandwidth
    linear_flops = 2.0 * model.matmul_params  # per token
    pair_flops = 4.0 * model.layers * model.heads * model.head_dim  # QK^T and AV per (query, key) pair
    return CostModel(
        a_p=eff.prefill_overhead_s,
        b_p=linear_flops / (peak * eff.prefill_mfu),
        c_p=pair_flops / (peak * eff.attention_mfu),
        a_d=model.weight_bytes(dtype_bytes) / bw + eff.decode_overhead_s,
        b_d=linear_flops / (peak * eff.decode_mfu),
        c_d=model.kv_bytes_per_token(dtype_bytes) / bw,
        first_token_s=eff.first_token_s,
        name=f"{gpu.key}:{model.key}",
    )


@dataclass(frozen=True)
class Profile:
    """What the simulator needs from calibration: a cost model and a default KV capacity."""

    cost: CostModel
    gpu: profiles.GPU
    model: profiles.Model
    kv_capacity_tokens: int

    @property
    def name(self) -> str:
        return self.cost.name


DEFAULT_PROFILE = "a800-80g:qwen3-4b-instruct-2507"


def profile_from(data: dict[str, Any], spec: str) -> tuple[profiles.GPU, profiles.Model, CostModel]:
    """A profile mapping (``gpu``, ``model``, optional ``efficiency``, ``coefficients``, ``fit``) as read from
    ``spec``, validated: what ``prism-calibrate fit`` writes is checked by this same function."""
    unknown = set(data) - {"gpu", "model", "efficiency", "coefficients", "fit"}
    if unknown:
        raise UserError(f"unknown field {sorted(unknown)[0]!r}", spec)
    if "gpu" not in data or "model" not in data:
        raise UserError("a profile needs 'gpu' and 'model'", spec)
    for key in ("gpu", "model"):
        if not isinstance(data[key], str):
            raise UserError(f"field {key!r}: must be a name, got {data[key]!r}", spec)
    try:
        g, m = profiles.gpu(data["gpu"]), profiles.model(data["model"])
    except UserError as e:
        raise UserError(str(e), spec) from None
    eff = build(Efficiency, data.get("efficiency"), f"{spec}: efficiency")
    cost = roofline(g, m, eff)
    coefficients = data.get("coefficients")
    if coefficients is not None and not isinstance(coefficients, dict):
        raise UserError("field 'coefficients': must be a mapping of a_p, b_p, c_p, a_d, b_d, c_d, first_token_s",
                        spec)
    if coefficients:
        if "name" in coefficients:
            raise UserError("unknown field 'name' (known: a_p, b_p, c_p, a_d, b_d, c_d, first_token_s)",
                            f"{spec}: coefficients")
        cost = build(CostModel, {**cost.coefficients(), **coefficients, "name": Path(spec).stem},
                     f"{spec}: coefficients")
    return g, m, cost


def load_profile(spec: str = DEFAULT_PROFILE, mem_fraction: float = 0.88) -> Profile:
    """``GPU:MODEL`` (roofline defaults) or a YAML file with ``gpu``, ``model`` and optional
    ``efficiency`` / ``coefficients`` (a fitted profile from ``prism-calibrate fit``)."""
    if not 0 < mem_fraction <= 1:
        raise UserError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    if Path(spec).is_dir():
        raise UserError("is a directory, expected GPU:MODEL or a profile YAML file", spec)
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        g, m, cost = profile_from(profiles.load_profile_file(spec), spec)
    else:
        if ":" not in spec:
            raise UserError(f"profile {spec!r}: expected GPU:MODEL (e.g. {DEFAULT_PROFILE}) or a YAML file")
        gname, mname = spec.split(":", 1)
        g, m = profiles.gpu(gname), profiles.model(mname)
        cost = roofline(g, m)
    return Profile(cost, g, m, profiles.kv_capacity_tokens(g, m, mem_fraction))
