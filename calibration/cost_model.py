"""The step-time cost model of one engine iteration (DESIGN §5).

prefill: ``t = a_p + b_p·N_new + d_p·B + c_p·Σ new_i·(cached_i + new_i/2)``
decode:  ``t = a_d + max(w_d + c_d·Σ ctx_i, b_d·B)``

Prefill: ``b_p`` is the linear layers' work per new token, ``d_p`` the LM head once per sequence of the batch
(B sequences), ``c_p`` the causal attention work per (query, key) pair and ``a_p`` the fixed cost of an
iteration. SGLang's prefill prunes the hidden states to each sequence's last position before the LM head, so a
new token costs only the *non-embedding* parameters' matmuls (2 FLOPs each); charging the full parameter
count per token overcounts by the LM head's share (11% for Qwen3-4B, whose 151,936 × 2,560 head is 0.39 B of
its 4.02 B parameters).

Decode: a step reads every matmul weight once (``w_d``) and each running request's KV (``c_d`` per context
token) — the memory bound — and computes 2 FLOPs per matmul parameter for each of its B tokens (``b_d`` per
request) — the compute bound; the step takes the larger of the two plus a fixed overhead ``a_d``. Small
batches are memory-bound; a step becomes compute-bound only at large batches of short contexts (Qwen3-4B on an
A800 PCIe: about 200 requests at 200 tokens of context each). Attention's own FLOPs in decode are
heads/kv_heads per KV byte read (1-8), far below the ridge point (about 150 FLOP/byte), so they sit under the
memory bound and are not charged.

Defaults come from a roofline over the model geometry (calibration/profiles/models.yaml) and the GPU's
data-sheet peak FLOP/s and bandwidth (gpus.yaml), scaled by efficiency factors measured on A100-SXM by Vidur's
public per-operator profiles (calibration/profiles/efficiency.yaml cites the file and rows; Meta-Llama-3-8B,
one GPU):

* ``prefill_mfu`` 0.66: the linear operators at 2,048-16,384 tokens reach 0.69-0.74 of peak, 0.63-0.68 with the
  norms, RoPE, activation and residual add of the same rows (mean 0.66); the cost model charges only matmul
  FLOPs, so the other operators' time belongs in the factor;
* ``bandwidth`` 0.77: at 1 token the linear operators read their weights at 0.77 of HBM bandwidth;
* ``decode_mfu`` 0.61: at 240 tokens (a large decode batch) the linear operators reach 0.61 of peak;
* ``attention_mfu`` 0.35 and the fixed overheads are not derived from measurements (the profiles' attention
  file does not give prefill attention at our shapes): ``prism-calibrate fit`` replaces every coefficient.

PCIe boards (A800/A100 80GB PCIe: 300 W) sustain about 90% of the SXM part's compute (``sustained_compute`` in
gpus.yaml); the factors apply to ``peak × sustained_compute``. ``prism-calibrate fit`` replaces the defaults
with fits to measured iterations (calibration/fit.py).

Profiles written before ``d_p`` existed load (their prefill gains the roofline's ``d_p``, a few microseconds
per sequence); profiles with the additive decode form of earlier versions (``a_d + b_d·B + c_d·Σctx``: they name
``a_d``, ``b_d`` and ``c_d`` but not ``w_d``) are refused with a message asking for a refit, because their
``a_d`` included the weight read that ``w_d`` now carries.

Any coefficient may be 0 (a fit may find no fixed cost, or no LM head term), but not all of a phase's: every
prefill iteration has at least one new token and every decode step one request with one token of context, so a
phase takes a positive time exactly when one of its coefficients is positive. A profile whose phase would take
no time is refused at load: rates (tokens/s, the queueing model's service rate) divide by these times.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from prism.config import build, nonneg, path_kind, share, unknown_keys
from prism.errors import UserError

from prism.calibration import profiles


#: the most any coefficient or overhead may be (s): an hour for one token or one iteration is a typo, and a value
#: near the float's range (1e308) would turn times into inf and the summary's figures into NaN
MAX_COST_S = 3600.0


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak that real kernels reach; the defaults are measured on A100-SXM (module docstring)."""

    prefill_mfu: float = share(0.66, "prefill: linear layers with norms, RoPE, activations, fraction of peak")
    attention_mfu: float = share(0.35, "prefill attention, fraction of peak FLOP/s")
    decode_mfu: float = share(0.61, "decode at large batches: linear layers, fraction of peak FLOP/s")
    bandwidth: float = share(0.77, "weights and KV reads, fraction of HBM bandwidth")
    prefill_overhead_s: float = nonneg(0.003, "fixed cost of a prefill iteration (launch, scheduling)",
                                       le=MAX_COST_S)
    decode_overhead_s: float = nonneg(0.001, "fixed cost of a decode iteration besides its memory or compute",
                                      le=MAX_COST_S)
    first_token_s: float = nonneg(0.0005, "prefill end to first token at the client (sampling, streaming)",
                                  le=MAX_COST_S)


#: the coefficients of each phase, in the order of the formulas
PREFILL = ("a_p", "b_p", "d_p", "c_p")
DECODE = ("a_d", "w_d", "c_d", "b_d")


@dataclass(frozen=True)
class CostModel:
    a_p: float = nonneg(0.0, "prefill: fixed cost of an iteration (s)", le=MAX_COST_S)
    b_p: float = nonneg(0.0, "prefill: per new token (s)", le=MAX_COST_S)
    d_p: float = nonneg(0.0, "prefill: per sequence in the batch, its last token's LM head (s)", le=MAX_COST_S)
    c_p: float = nonneg(0.0, "prefill: per (query, key) attention pair (s)", le=MAX_COST_S)
    a_d: float = nonneg(0.0, "decode: fixed overhead of a step (s)", le=MAX_COST_S)
    w_d: float = nonneg(0.0, "decode: reading the weights once (s)", le=MAX_COST_S)
    c_d: float = nonneg(0.0, "decode: reading one context token's KV (s)", le=MAX_COST_S)
    b_d: float = nonneg(0.0, "decode: computing one request's token (s)", le=MAX_COST_S)
    first_token_s: float = nonneg(0.0, le=MAX_COST_S)
    name: str = "custom"

    def prefill_time(self, new: Sequence[int], cached: Sequence[int]) -> float:
        pairs = sum(n * (c + n / 2) for n, c in zip(new, cached))
        return self.a_p + self.b_p * sum(new) + self.d_p * len(new) + self.c_p * pairs

    def decode_memory_time(self, context_tokens: float) -> float:
        """The memory bound of a step: weights once plus every context token's KV."""
        return self.w_d + self.c_d * context_tokens

    def decode_compute_time(self, batch: float) -> float:
        """The compute bound of a step: the matmuls of its B tokens."""
        return self.b_d * batch

    def decode_time(self, batch: int, context_tokens: int) -> float:
        return self.a_d + max(self.decode_memory_time(context_tokens), self.decode_compute_time(batch))

    def coefficients(self) -> dict[str, float]:
        d = asdict(self)
        d.pop("name")
        return d


def roofline(gpu: profiles.GPU, model: profiles.Model, eff: Efficiency | None = None,
             dtype_bytes: int = 2) -> CostModel:
    eff = eff or Efficiency()
    flops, bw = gpu.compute_flops, gpu.hbm_bandwidth * eff.bandwidth
    pair_flops = 4.0 * model.layers * model.heads * model.head_dim  # QK^T and AV per (query, key) pair
    return CostModel(
        a_p=eff.prefill_overhead_s,
        b_p=2.0 * model.non_embedding_params / (flops * eff.prefill_mfu),
        d_p=2.0 * model.lm_head_params / (flops * eff.prefill_mfu),
        c_p=pair_flops / (flops * eff.attention_mfu),
        a_d=eff.decode_overhead_s,
        w_d=model.matmul_params * dtype_bytes / bw,
        c_d=model.kv_bytes_per_token(dtype_bytes) / bw,
        b_d=2.0 * model.matmul_params / (flops * eff.decode_mfu),
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


#: the paper's machine: Qwen3-4B-Instruct-2507 on an A800 80GB PCIe
DEFAULT_PROFILE = "a800-80g-pcie:qwen3-4b-instruct-2507"


def profile_from(data: dict[str, Any], spec: str) -> tuple[profiles.GPU, profiles.Model, CostModel]:
    """A profile mapping (``gpu``, ``model``, optional ``efficiency``, ``coefficients``, ``fit``) as read from
    ``spec``, validated: what ``prism-calibrate fit`` writes is checked by this same function."""
    unknown = unknown_keys(data, ("gpu", "model", "efficiency", "coefficients", "fit"))
    if unknown:
        raise UserError(f"unknown field {unknown[0]}", spec)
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
    known = ", ".join(PREFILL + DECODE + ("first_token_s",))
    if coefficients is not None and not isinstance(coefficients, dict):
        raise UserError(f"field 'coefficients': must be a mapping of {known}", spec)
    if coefficients:
        if "name" in coefficients:
            raise UserError(f"unknown field 'name' (known: {known})", f"{spec}: coefficients")
        if {"a_d", "b_d", "c_d"} <= set(coefficients) and "w_d" not in coefficients:
            raise UserError("a_d, b_d, c_d without w_d: coefficients of the additive decode form "
                            "(a_d + b_d·B + c_d·ctx) of earlier versions, whose a_d included the weight read; "
                            "decode is now a_d + max(w_d + c_d·ctx, b_d·B): refit with prism-calibrate fit",
                            f"{spec}: coefficients")
        cost = build(CostModel, {**cost.coefficients(), **coefficients, "name": Path(spec).stem},
                     f"{spec}: coefficients")
        for phase, names in (("prefill", PREFILL), ("decode", DECODE)):
            if not any(getattr(cost, n) > 0 for n in names):
                raise UserError(f"{', '.join(names)} are all 0: a {phase} iteration would take no time (at least "
                                "one must be > 0)", f"{spec}: coefficients")
    return g, m, cost


def load_profile(spec: str = DEFAULT_PROFILE, mem_fraction: float = 0.88) -> Profile:
    """``GPU:MODEL`` (roofline defaults) or a YAML file with ``gpu``, ``model`` and optional
    ``efficiency`` / ``coefficients`` (a fitted profile from ``prism-calibrate fit``)."""
    if not 0 < mem_fraction <= 1:
        raise UserError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    if not spec:
        raise UserError(f"empty profile: expected GPU:MODEL (e.g. {DEFAULT_PROFILE}) or a profile YAML file")
    kind = path_kind(spec)
    if kind == "dir":
        raise UserError("is a directory, expected GPU:MODEL or a profile YAML file", spec)
    if spec.endswith((".yaml", ".yml")) or kind == "file":
        g, m, cost = profile_from(profiles.load_profile_file(spec), spec)
    else:
        if ":" not in spec:
            raise UserError(f"profile {spec!r}: expected GPU:MODEL (e.g. {DEFAULT_PROFILE}) or a YAML file")
        gname, mname = spec.split(":", 1)
        g, m = profiles.gpu(gname), profiles.model(mname)
        cost = roofline(g, m)
    return Profile(cost, g, m, profiles.kv_capacity_tokens(g, m, mem_fraction))


def served_profile(gpu: profiles.GPU, model: profiles.Model, tp: int = 1, mem_fraction: float = 0.88,
                   activation_reserve_gib: float = 2.0) -> Profile:
    """The profile of one engine of ``model`` over ``tp`` GPUs of one kind (a fleet's model, DESIGN §9).

    At tp = 1 it is ``load_profile("GPU:MODEL")``'s. Over tp GPUs each does 1/tp of every matmul and reads 1/tp
    of the weights and of the KV (SGLang's tensor parallelism), so the roofline takes tp times the GPU's FLOP/s
    and bandwidth; the all-reduces between the GPUs are not modelled (NVLink: small against the step at the
    batch sizes here). The KV pool is one GPU's: its memory after 1/tp of the weights, over its shard's bytes
    per token."""
    model.check_tp(tp)
    if tp == 1:
        return Profile(roofline(gpu, model), gpu, model, profiles.kv_capacity_tokens(gpu, model, mem_fraction))
    scaled = replace(gpu, peak_flops=gpu.peak_flops * tp, hbm_bandwidth=gpu.hbm_bandwidth * tp)
    cost = replace(roofline(scaled, model), name=f"{gpu.key}x{tp}:{model.key}")
    free = gpu.memory_bytes * mem_fraction - model.weight_bytes(tp=tp) - activation_reserve_gib * profiles.GIB
    if free <= 0:
        raise UserError(f"{model.key} over {tp} GPUs does not fit on {gpu.key} at mem_fraction={mem_fraction}")
    return Profile(cost, gpu, model, int(free // model.kv_bytes_per_token(tp=tp)))
