"""Global placement of models on shared GPUs: the KV pressure ratio and Prism's Algorithm 1 (Prism §6.1, App. A.2).

The **KV pressure ratio** of a GPU weighs the memory demand of its models against the memory their weights leave
for KV::

    KVPR(g) = Σ_{m on g} d_m / (C_g − Σ_{m on g} w_m),   d_m = token_rate_m × kv_bytes_per_token_m / TPOT_SLO_m

``token_rate`` counts the prompt tokens of newly admitted requests plus the decode tokens of running ones, per
second, over a moving window (about 60 s, App. A.4: :class:`TokenRate`); the SLO is the TPOT SLO, "because
autoregressive decoding dominates generation latency and is especially sensitive to KV-cache memory contention".

**Algorithm 1** as the paper states it (models m_k with token rate t_k, weights w_k, token size tz_k, current GPU
g_k, SLO s_k; N GPUs of capacity C; migration threshold τ)::

    1: sort models by t_k·tz_k / s_k, descending
    2-3: for each GPU i: shared_kv_i ← C; w_token_rate_i ← 0
    4: for k = 1..M:
    6:   best_r, best_idx ← (min, argmin)_i w_token_rate_i / shared_kv_i
    7:   current_r ← w_token_rate_{g_k} / shared_kv_{g_k}
    8:   best_gpu ← best_idx if current_r − best_r > τ else g_k
    9:   assign m_k to best_gpu
    10:  w_token_rate_best_gpu += d_k;  11: shared_kv_best_gpu −= w_k

:func:`place` follows it line by line: the KVPR compared is each GPU's *before* the model is added (line 6; the
section's prose says "the GPU that minimizes the resulting KVPR", the algorithm does not), and a model stays where
it is unless moving gains more than τ (the paper publishes no value: a knob). Where the paper is silent:

* a GPU is a candidate for a model only if its memory left after the weights placed so far exceeds the model's
  weights by more than ``min_kv_bytes`` (otherwise its KVPR would be negative or infinite); a model with no
  candidate stays unplaced (the caller evicts or waits); a model's current GPU that is no longer a candidate
  does not keep it;
* a model with a KV floor (``ModelLoad.min_kv_bytes``: a fixed pool that must hold its largest request) goes only
  where the floors and weights of the models placed there and its own fit together (a static partition gives
  each resident its floor at once);
* ties go to the lowest GPU index; a model without a current GPU (new, or woken) takes the best GPU;
* **tensor parallelism** (App. A.2.2): a model of tp GPUs is tp entries with 1/tp of its weights and rate (so
  1/tp of d); an entry does not go where another entry of its model is ("we instead assign it to the GPU
  exhibiting the second-lowest KVPR"); and all entries stay on one node (TP runs over NVLink), the first
  entry's; a model whose entries cannot all be placed is unplaced as a whole.

The paper's analysis (App. A.2.1) bounds the result by KVPR_max ≤ KVPR_OPT · (1 + C / (S_gmax − w_k)); the tests
compare :func:`place` with a search over all placements and report the measured ratio.

The authors' prototype (a public copy: ``YAMY1234/prism-research``, ``python/prism/multi_model/scheduling/policy/
simple_global.py``) differs: it migrates by average memory per request over 30 s windows (and an SLO-violation
variant over 3 s), and evicts models idle for 50 s; this module follows the paper.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Container, Mapping, Sequence

from prism.errors import UserError


@dataclass(frozen=True)
class ModelLoad:
    """What placement knows of a model: its demand, size and where it is (whole-model figures; TP splits them)."""

    name: str
    token_rate: float  # tokens/s: admitted prompt tokens + decode tokens, over the window
    kv_bytes_per_token: float  # all shards together
    weight_bytes: float  # all shards together
    tpot_slo_s: float
    tp: int = 1
    current: tuple[int, ...] = ()  # the GPUs its entries are on now, in entry order (empty: not resident)
    min_kv_bytes: float = 0.0  # all shards: KV it must own beside the other residents' (a fixed pool's floor)

    def __post_init__(self) -> None:
        if self.tpot_slo_s == math.inf:  # placement packs by TPOT: a model needs one
            raise UserError("no TPOT SLO to place it by: the trace's models give it none and none could be measured "
                            "(no request of it with a second output token to run on a GPU of its own); set its "
                            "tpot_slo_s", f"model {self.name!r}")
        for field_name, positive in (("token_rate", False), ("kv_bytes_per_token", True), ("weight_bytes", False),
                                     ("tpot_slo_s", True), ("min_kv_bytes", False)):
            value = getattr(self, field_name)
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                raise UserError(f"field {field_name!r}: must be a finite number {'> 0' if positive else '>= 0'}, "
                                f"got {value!r}", f"model {self.name!r}")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise UserError(f"field 'tp': must be an integer >= 1, got {self.tp!r}", f"model {self.name!r}")
        if self.current and (len(self.current) != self.tp or len(set(self.current)) != self.tp):
            raise ValueError(f"model {self.name!r}: current GPUs {self.current} are not {self.tp} distinct GPUs")

    @property
    def demand(self) -> float:
        """d = token_rate × kv_bytes_per_token / TPOT_SLO: the SLO-weighted rate of KV growth."""
        return self.token_rate * self.kv_bytes_per_token / self.tpot_slo_s


def kvpr(demand: float, weights: float, capacity: float) -> float:
    """Σd over the memory the weights leave (infinite when they leave none)."""
    free = capacity - weights
    if free <= 0:
        return math.inf
    return demand / free


@dataclass(frozen=True)
class Placement:
    """Where each model's entries go, the models left out, and each GPU's KVPR after placement."""

    gpus: Mapping[str, tuple[int, ...]]
    unplaced: tuple[str, ...]
    kvpr: tuple[float, ...]
    moved: tuple[str, ...]  # resident models whose GPUs changed

    @property
    def max_kvpr(self) -> float:
        return max(self.kvpr)


@dataclass
class _Fleet:
    """Algorithm 1's per-GPU state: w_token_rate (Σd) and shared_kv (C − Σw), and what the models' own KV floors
    leave (C − Σ(w + floor))."""

    demand: list[float]
    shared: list[float]
    nodes: Sequence[int]
    min_kv_bytes: float

    def __post_init__(self) -> None:
        self.unfloored = list(self.shared)

    def ratio(self, i: int) -> float:
        return self.demand[i] / self.shared[i] if self.shared[i] > 0 else math.inf

    def candidates(self, weight: float, floor: float, exclude: Container[int], node: int | None) -> list[int]:
        return [i for i in range(len(self.shared)) if i not in exclude and (node is None or self.nodes[i] == node)
                and self.shared[i] - weight > self.min_kv_bytes and self.unfloored[i] - weight - floor >= 0]

    def add(self, i: int, demand: float, weight: float, floor: float = 0.0, sign: int = 1) -> None:
        self.demand[i] += sign * demand
        self.shared[i] -= sign * weight
        self.unfloored[i] -= sign * (weight + floor)


def _check(models: Sequence[ModelLoad], capacities: Sequence[float], nodes: Sequence[int]) -> None:
    if len(nodes) != len(capacities):
        raise ValueError("one node index per GPU")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise UserError(f"model {next(n for n in names if names.count(n) > 1)!r} is listed twice")
    per_node = {n: nodes.count(n) for n in set(nodes)}
    for m in models:
        if m.tp > max(per_node.values()):
            raise UserError(f"field 'tp': {m.tp} GPUs for one model, but the largest node has "
                            f"{max(per_node.values())} of the fleet's {len(capacities)}", f"model {m.name!r}")
        if m.current and any(not 0 <= g < len(capacities) for g in m.current):
            raise ValueError(f"model {m.name!r}: current GPUs {m.current} outside the fleet")


def check_fits(models: Sequence[ModelLoad], capacities: Sequence[float], min_kv_bytes: float = 0.0) -> None:
    """A model whose entry's weights leave no room for KV on the largest GPU, even alone, is bad input."""
    largest = max(capacities)
    for m in models:
        if largest - m.weight_bytes / m.tp <= min_kv_bytes:
            raise UserError(f"does not fit on any GPU: {m.weight_bytes / m.tp / 1e9:.1f} GB of weights per GPU "
                            f"leave no KV room in {largest / 1e9:.1f} GB", f"model {m.name!r}")


def place(models: Sequence[ModelLoad], capacities: Sequence[float], tau: float = 0.0,
          nodes: Sequence[int] | None = None, min_kv_bytes: float = 0.0) -> Placement:
    """Algorithm 1 over ``models`` on GPUs of ``capacities`` bytes (for KV and weights), ``nodes`` giving each
    GPU's node (default: one node). O(M·tp·N)."""
    nodes = list(nodes) if nodes is not None else [0] * len(capacities)
    _check(models, capacities, nodes)
    fleet = _Fleet([0.0] * len(capacities), [float(c) for c in capacities], nodes, min_kv_bytes)
    # line 1 over the entries (a TP model's tp entries have d/tp each, adjacent); stable: ties keep the input order
    order = sorted(range(len(models)), key=lambda k: -models[k].demand / models[k].tp)
    gpus: dict[str, tuple[int, ...]] = {}
    unplaced = []
    for k in order:
        chosen = _place_model(models[k], fleet, tau)
        if chosen is None:
            unplaced.append(models[k].name)
        else:
            gpus[models[k].name] = chosen
    moved = tuple(m.name for m in models if m.current and m.name in gpus and gpus[m.name] != m.current)
    ratios = tuple(fleet.ratio(i) for i in range(len(capacities)))
    return Placement(gpus, tuple(unplaced), ratios, moved)


def _place_model(m: ModelLoad, fleet: _Fleet, tau: float) -> tuple[int, ...] | None:
    """Lines 5-11 for each of the model's entries; None (and nothing placed) if one has no candidate."""
    d, w, floor = m.demand / m.tp, m.weight_bytes / m.tp, m.min_kv_bytes / m.tp
    chosen: list[int] = []
    for j in range(m.tp):
        node = fleet.nodes[chosen[0]] if chosen else None
        cands = fleet.candidates(w, floor, chosen, node)
        if not cands:
            for i in chosen:
                fleet.add(i, d, w, floor, -1)
            return None
        best = min(cands, key=fleet.ratio)  # the first of equal ratios: the lowest index
        current = m.current[j] if m.current else None
        if current in cands and not fleet.ratio(current) - fleet.ratio(best) > tau:
            best = current
        fleet.add(best, d, w, floor)
        chosen.append(best)
    return tuple(chosen)


def place_woken(model: ModelLoad, placement_loads: Sequence[tuple[float, float]], capacities: Sequence[float],
                nodes: Sequence[int] | None = None, min_kv_bytes: float = 0.0) -> tuple[int, ...] | None:
    """A woken model goes to the GPU(s) of lowest KVPR that fit its weights (Prism §6.1, "Model eviction and
    activation"), given each GPU's current (Σd, Σw) in ``placement_loads``; None if none fits now."""
    nodes = list(nodes) if nodes is not None else [0] * len(capacities)
    _check([model], capacities, nodes)
    fleet = _Fleet([d for d, _ in placement_loads], [c - w for (_, w), c in zip(placement_loads, capacities)],
                   nodes, min_kv_bytes)
    return _place_model(ModelLoad(model.name, model.token_rate, model.kv_bytes_per_token, model.weight_bytes,
                                  model.tpot_slo_s, model.tp), fleet, math.inf)


class TokenRate:
    """Tokens per second over a moving window: what one model adds to its KV (§6.1's token_rate).

    ``add(t, n)`` counts n tokens at time t (a request's prompt tokens when it is admitted, each decode step's
    tokens); ``rate(now)`` is the tokens of (now − window, now] over the window. Times must not go back.
    Amortized O(1) per call."""

    def __init__(self, window_s: float = 60.0) -> None:
        if not window_s > 0:
            raise UserError(f"field 'window_s': must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._last = -math.inf

    def add(self, t: float, tokens: float) -> None:
        if t < self._last:
            raise ValueError(f"token rate: time went back from {self._last} to {t}")
        self._last = t
        self._events.append((t, tokens))
        self._sum += tokens

    def rate(self, now: float) -> float:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._sum -= self._events.popleft()[1]
        if not self._events:
            self._sum = 0.0  # no rounding left behind
        return self._sum / self.window_s


def idle_models(last_active: Mapping[str, float], busy: Container[str], now: float,
                idle_s: float = 45.0) -> list[str]:
    """Models with no request for more than ``idle_s`` (Prism App. A.4: about 45 s) and none waiting or running
    (``busy``), longest idle first: the ones to evict when memory is needed."""
    idle = [(t, m) for m, t in last_active.items() if now - t > idle_s and m not in busy]
    return [m for _, m in sorted(idle)]
