"""The queueing model of an engine with prefix reuse (DESIGN §7).

A *wave* of M̄ requests (the requests that run together) is served in::

    S_wave ≈ M̄·L·(1−h)/R_pf + overhead

where L is the prompt length, h the exact-prefix hit rate and R_pf the prefill rate (tokens/s); overhead is
what the wave spends besides computing uncached prompt tokens (prefill launches and the decode steps).
Requests are served at ``μ = M̄ / E[S_wave]``. For two policies with equal M̄, L, R_pf and no overhead,
``μ1/μ0 = (1−h0)/(1−h1)``; with any fixed overhead, μ still grows strictly with h.

**Theorem 1.** With M̄, L, R_pf and the overhead fixed, ``μ_1 ≥ μ_0`` iff ``h_1 ≥ h_0``, with equality iff
``h_1 = h_0``. (S_wave is strictly decreasing in h because M̄·L/R_pf > 0.)

Admission delay below the knee is approximated by an M/G/1 queue (Pollaczek–Khinchine) whose per-request
service time is the request's share of its wave, with moments from the cost model and the trace's prompt
lengths; TTFT ≈ wait + the request's own prefill + first-token latency. The largest stable arrival rate (the
*knee*) is μ.

**Past the knee** (ρ = λ/μ ≥ 1) there is no steady state: a finite replay of N requests is a transient. The
fluid approximation treats arrivals and service as continuous flows: request i arrives at i/λ and the server,
busy from the first arrival on, starts it at about i/μ, so its wait is i·(1/μ − 1/λ): the backlog grows at
λ − μ, the waits are spread evenly over [0, N·(1/μ − 1/λ)], their mean is ``N·(1/μ − 1/λ)/2`` and their
q-quantile ``q·N·(1/μ − 1/λ)`` (the tail is the last arrivals'). It ignores the randomness of arrivals and
service, which adds a spread of order √N/λ to the waits (the relative error of the mean is about
2/(√(3N)·(ρ − 1)) for Poisson arrivals), so it is good well past the knee and poor near it, where the
randomness dominates (at ρ = 1 it predicts no wait at all).

The engine model therefore uses the **diffusion** (Brownian) refinement of the fluid for a replay: the work in
the system, started empty, moves like a Brownian motion with drift ρ − 1 and variance λ·E[S²] per second,
reflected at zero; the wait of the request arriving at t is its running maximum over [0, t], whose mean and
distribution have closed forms (:func:`brownian_max_mean`, :func:`brownian_max_sf`); the replay's waits are
the mixture over the arrival times i/λ of its N requests. Well past the knee it is the fluid plus
λ·E[S²]/(2(ρ − 1)); at the knee it gives (2/3)·σ·√(2T/π) for a replay of T seconds; below the knee and over a
long replay it tends to the P-K mean λ·E[S²]/(2(1 − ρ)). A replay started empty waits no more than the steady
state (its work is stochastically smaller at every time), so :meth:`EngineQueue.wait` takes the smaller of the
P-K figure and the replay's: P-K at low load, the replay's near and past the knee.

Only plain numbers come in: the step-cost coefficients (``a_p, b_p, d_p, c_p, a_d, w_d, c_d, b_d``, e.g. a
:class:`~prism.calibration.cost_model.CostModel`) and arrays of prompt lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
from scipy.special import log_ndtr, ndtr


class StepCosts(Protocol):
    a_p: float
    b_p: float
    d_p: float
    c_p: float
    a_d: float
    w_d: float
    c_d: float
    b_d: float
    first_token_s: float


# ---------------------------------------------------------------- the wave model and Theorem 1
def wave_service_time(m: float, length: float, h: float, r_pf: float, overhead: float = 0.0) -> float:
    """S_wave = M̄·L·(1−h)/R_pf + overhead."""
    return m * length * (1.0 - h) / r_pf + overhead


def service_rate(m: float, length: float, h: float, r_pf: float, overhead: float = 0.0) -> float:
    """μ = M̄ / S_wave (requests per second)."""
    return m / wave_service_time(m, length, h, r_pf, overhead)


def rate_ratio(h0: float, h1: float) -> float:
    """μ1/μ0 = (1−h0)/(1−h1) for equal M̄, L, R_pf and no overhead."""
    return (1.0 - h0) / (1.0 - h1)


def theorem1(h0: float, h1: float, m: float, length: float, r_pf: float, overhead: float = 0.0) -> tuple[float, float, bool]:
    """(μ0, μ1, whether the theorem's statement holds for these numbers)."""
    mu0 = service_rate(m, length, h0, r_pf, overhead)
    mu1 = service_rate(m, length, h1, r_pf, overhead)
    holds = ((mu1 >= mu0) == (h1 >= h0)) and ((mu1 == mu0) == (h1 == h0))
    return mu0, mu1, holds


# ---------------------------------------------------------------- M/G/1
def mg1_wait(lam: float, es: float, es2: float) -> float:
    """Pollaczek–Khinchine mean wait in queue: λ·E[S²] / (2(1−ρ)); infinite when ρ ≥ 1."""
    rho = lam * es
    if rho >= 1.0:
        return math.inf
    return lam * es2 / (2.0 * (1.0 - rho))


def mg1_wait_quantile(lam: float, es: float, es2: float, q: float) -> float:
    """q-quantile of the wait, with the usual approximation: an atom of 1−ρ at zero and an exponential tail
    whose mean makes the overall mean the P-K value."""
    rho = lam * es
    if rho >= 1.0:
        return math.inf
    if q <= 1.0 - rho or rho == 0.0:
        return 0.0
    tail_mean = mg1_wait(lam, es, es2) / rho
    return -tail_mean * math.log((1.0 - q) / rho)


# ---------------------------------------------------------------- past the knee: the fluid transient
def fluid_wait(lam: float, mu: float, n: int) -> float:
    """Mean wait of a finite replay of n requests arriving at λ to a server of rate μ: n·(1/μ − 1/λ)/2
    (0 below the knee, where the fluid never queues)."""
    return max(0.0, n * (1.0 / mu - 1.0 / lam) / 2.0)


def fluid_wait_quantile(lam: float, mu: float, n: int, q: float) -> float:
    """q-quantile of the fluid waits, which are spread evenly over [0, n·(1/μ − 1/λ)]: q·n·(1/μ − 1/λ)."""
    return max(0.0, q * n * (1.0 / mu - 1.0 / lam))


def brownian_max_mean(drift: float, sigma: float, t: np.ndarray) -> np.ndarray:
    """E[max over [0, t] of drift·s + σ·B(s)]: σ²/(2m)·(2Φ(z) − 1) + m·t·Φ(z) + σ√t·φ(z), z = m√t/σ."""
    t = np.asarray(t, dtype=float)
    root = np.sqrt(t)
    z = drift * root / sigma
    density = np.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi)
    # σ²(2Φ(z) − 1)/(2m) = σ√t·(2Φ(z) − 1)/(2z), which tends to σ√t·φ(0) as z → 0
    small = np.abs(z) < 1e-8
    ratio = np.where(small, 1.0 / math.sqrt(2.0 * math.pi), (2.0 * ndtr(z) - 1.0) / (2.0 * np.where(small, 1.0, z)))
    return sigma * root * ratio + drift * t * ndtr(z) + sigma * root * density


def brownian_max_sf(x: float, drift: float, sigma: float, t: np.ndarray) -> np.ndarray:
    """P(max over [0, t] of drift·s + σ·B(s) > x) for x > 0, t > 0:
    1 − Φ((x − m·t)/(σ√t)) + exp(2·m·x/σ²)·Φ((−x − m·t)/(σ√t))."""
    root = np.sqrt(np.asarray(t, dtype=float))
    upper = 1.0 - ndtr((x - drift * t) / (sigma * root))
    reflected = np.exp(2.0 * drift * x / sigma**2 + log_ndtr((-x - drift * t) / (sigma * root)))
    return np.clip(upper + reflected, 0.0, 1.0)


def replay_wait(lam: float, es: float, es2: float, n: int, q: float | None = None) -> float:
    """Mean (q=None) or q-quantile of the waits of n requests arriving at λ (at i/λ) to an empty server whose
    service times have moments E[S], E[S²]: the diffusion approximation (module docstring)."""
    drift, sigma = lam * es - 1.0, math.sqrt(lam * es2)
    t = np.arange(1, n) / lam  # the first request (t = 0) finds the server empty
    if q is None:
        return float(brownian_max_mean(drift, sigma, t).sum() / n)
    if q <= 1.0 / n:
        return 0.0
    tail = lambda x: float(brownian_max_sf(x, drift, sigma, t).sum() / n)  # noqa: E731
    hi = sigma * math.sqrt(t[-1]) + max(drift, 0.0) * t[-1] + es
    while tail(hi) > 1.0 - q:
        hi *= 2.0
    lo = 0.0
    for _ in range(60):  # bisection to 1e-18 of hi
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if tail(mid) > 1.0 - q else (lo, mid)
    return hi


# ---------------------------------------------------------------- an engine as a queue
@dataclass
class EngineQueue:
    """The engine as one server whose customers are requests, each costing its share of a wave.

    ``wave``: M̄, requests that run together (at saturation: the running-request limit or what the KV cache
    holds); ``chunk``: new tokens per prefill iteration; ``requests``: N, the size of the replay, for the
    transient near and past the knee (None: the steady-state M/G/1 only, infinite past the knee).
    """

    costs: StepCosts
    prompt_lengths: np.ndarray
    output_len: float
    hit_rate: float
    wave: float
    chunk: float = 8192.0
    requests: int | None = None

    def __post_init__(self) -> None:
        self.prompt_lengths = np.asarray(self.prompt_lengths, dtype=float)
        if not 0.0 <= self.hit_rate < 1.0:
            raise ValueError("hit_rate must be in [0, 1)")
        if self.wave < 1:
            raise ValueError("wave must be >= 1")

    @property
    def mean_length(self) -> float:
        return float(self.prompt_lengths.mean())

    def prefill_rate(self) -> float:
        """R_pf: new prompt tokens per second, attention included (cached share h at the front)."""
        c, h, length = self.costs, self.hit_rate, self.mean_length
        per_token = c.b_p + c.c_p * (h * length + (1.0 - h) * length / 2.0)
        return 1.0 / per_token

    def wave_overhead(self) -> float:
        """Prefill launches of the wave, its M̄ LM heads, and its decode steps (output_len − 1 of them), each
        the larger of reading weights and KV and computing M̄ tokens."""
        c, m, length, o = self.costs, self.wave, self.mean_length, self.output_len
        batches = max(1.0, m * length * (1.0 - self.hit_rate) / self.chunk)
        step = c.a_d + max(c.w_d + c.c_d * m * (length + o / 2.0), c.b_d * m)
        return c.a_p * batches + c.d_p * m + (o - 1.0) * step

    def service_times(self) -> np.ndarray:
        """Per-request service: own uncached tokens at R_pf plus a 1/M̄ share of the wave's overhead."""
        new = self.prompt_lengths * (1.0 - self.hit_rate)
        c, h = self.costs, self.hit_rate
        own = new * c.b_p + c.c_p * new * (h * self.prompt_lengths + new / 2.0)
        return own + self.wave_overhead() / self.wave

    def moments(self) -> tuple[float, float]:
        s = self.service_times()
        return float(s.mean()), float((s ** 2).mean())

    def service_rate(self) -> float:
        """μ = M̄ / E[S_wave] = 1 / E[s]: the knee, the largest stable arrival rate."""
        return 1.0 / self.moments()[0]

    def utilisation(self, lam: float) -> float:
        return lam / self.service_rate()

    def own_prefill(self) -> float:
        """The request's own prefill iteration at low load (alone in its batch)."""
        c, h, length = self.costs, self.hit_rate, self.mean_length
        new = length * (1.0 - h)
        return c.a_p + c.b_p * new + c.d_p + c.c_p * new * (h * length + new / 2.0)

    def transient(self, lam: float) -> bool:
        """Whether λ is past the knee and the replay is finite: no steady state, the wait is the transient's."""
        return self.requests is not None and self.utilisation(lam) >= 1.0

    def wait(self, lam: float, q: float | None = None) -> float:
        """Mean admission wait (q=None) or its q-quantile: the M/G/1 steady state, or for a replay of known size
        the smaller of that and the replay's diffusion transient (module docstring); infinite past the knee
        when the replay's size is unknown."""
        es, es2 = self.moments()
        steady = mg1_wait(lam, es, es2) if q is None else mg1_wait_quantile(lam, es, es2, q)
        if self.requests is None:
            return steady
        return min(steady, replay_wait(lam, es, es2, self.requests, q))

    def ttft(self, lam: float, q: float | None = None) -> float:
        """Mean TTFT (q=None) or its q-quantile: wait + own prefill + first-token latency."""
        return self.wait(lam, q) + self.own_prefill() + self.costs.first_token_s

    def throughput(self, lam: float) -> float:
        return min(lam, self.service_rate())


def wave_size(max_running: int, kv_capacity: float, prompt_len: float, output_len: float) -> float:
    """M̄ at saturation: the running-request limit, or as many requests as the KV cache holds."""
    return float(max(1.0, min(max_running, kv_capacity // (prompt_len + output_len))))


def theorem1_grid(h_values: Sequence[float], m_values: Sequence[float], l_values: Sequence[float],
                  r_values: Sequence[float], overheads: Sequence[float] = (0.0,)) -> dict[str, int]:
    """Check Theorem 1 on every combination; counts of cases, holds, and exact ratio matches (no overhead)."""
    cases = holds = ratio_ok = 0
    for h0 in h_values:
        for h1 in h_values:
            for m in m_values:
                for length in l_values:
                    for r in r_values:
                        for ov in overheads:
                            mu0, mu1, ok = theorem1(h0, h1, m, length, r, ov)
                            cases += 1
                            holds += ok
                            if ov == 0.0:
                                ratio_ok += math.isclose(mu1 / mu0, rate_ratio(h0, h1), rel_tol=1e-12)
    return {"cases": cases, "holds": holds, "ratio_matches": ratio_ok}
