"""The ``multi_model`` workload: the requests of several models, interleaved, for models sharing GPUs (DESIGN §9).

Each entry of ``models:`` is a model the trace's requests go to (:class:`ModelEntry`: a name, its profile
model, tensor-parallel size, optional TTFT and TPOT SLOs); every request carries its model's name. How requests
arrive (``arrival``):

* ``onoff`` (the default): Zipf(``zipf_s``) popularity over the models' ranks in the list (or each entry's
  ``weight``), and per model a Markov on/off process: exponential ON and OFF periods (means ``on_mean_s``,
  ``off_mean_s``), Gamma arrivals of coefficient of variation ``burst_cv`` inside ON periods at the rate that
  gives the model its share of ``qps``. The defaults reproduce what is known of the Chatbot-Arena trace of 27
  models over 600 s that the Prism prototype uses (``../shared/data/README.md``): inter-arrival CV 1.1, the top 3
  models 50% of the requests and the top 5 63%, 14-20 of 27 models active in any minute, idle gaps over 10 s
  (249 in all), prompts p50/p90/max 40/432/1021 tokens and outputs 211/513/977. Measured over 40 seeds of 27
  models: CV 1.10, top 3 51% and top 5 62%, 14.6/17.6/21.2 models active per minute (min/median/max), 232 idle
  gaps (tests/test_multimodel.py checks each; ON 15 s, OFF 12 s, Poisson inside bursts, Zipf 1.08, 1.1 req/s
  were chosen by a search over these knobs against those facts). The ON/OFF periods come from their own stream: changing ``qps`` multiplies
  the requests inside the same bursts, as the paper scales its traces;
* ``servegen``: each model follows a model class of ServeGen's per-model rates
  (``../shared/data/servegen/model_rates.csv``: 5 classes' summed rate per 600 s window and its rate-weighted
  inter-arrival CV) from a random window of the class's series, scaled to the model's share of ``qps``, with Gamma
  arrivals at each window's rate and CV (clipped to the Gamma process's bounds, see :mod:`traces.arrivals`);
  ``servegen_class`` picks the class (default: m-large, m-mid, m-small by rank, in turn);
* ``azure``: the two Azure 2023 services (code and conversation) as two models, at their real timestamps scaled
  together to ``qps`` (``azure: code|conv`` per entry; default the first is code), and their real prompt and output
  lengths unless the model has its own ``trace``.

Prompts: a model's requests are private prompts of lengths drawn from a log-normal cut at ``prompt_max``
(its parameters solved so that the cut distribution has the p50 and p90 asked; outputs likewise), after an
optional system prompt of ``sys_tokens`` shared by the model's requests; or the prompts of any other trace spec
(``trace:`` on the entry, e.g. a ``zipf_hotspot`` RAG model and an ``agent`` model on the same GPUs, each with its
own prefix reuse), whose arrival fields are ignored. Segment ids and sessions are namespaced by model
(``MODEL/ID``): models never share KV. A model's k-th prompt does not depend on ``qps`` (its own stream), except
for a sub-trace whose kind draws prompts as a whole.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy import optimize, special

from prism.config import (MAX_REQUESTS, MAX_TOKENS, MAX_ZIPF_S, build, choice, count, nonneg, path_kind, positive,
                          rate, read_text, tokens)
from prism.core import PRIV, SYS, Request, SegmentTable
from prism.errors import UserError

from prism.traces.arrivals import MAX_CV, MIN_CV, default_data_dir, load_azure_records, variation
from prism.traces.trace import ServedModel, Trace

ARRIVALS = ("onoff", "servegen", "azure")
SERVEGEN_CLASSES = ("m-large", "m-mid", "m-small", "deepseek-r1", "mm-image")
AZURE_SERVICES = ("code", "conv")
MAX_MODELS = 1000
MAX_DURATION_S = 30 * 86400.0


@dataclass
class ModelEntry(ServedModel):
    """One entry of a ``multi_model`` spec's ``models``: the served model and where its requests come from."""

    weight: float | None = positive(None, "popularity weight (null: Zipf(zipf_s) by rank in the list)")
    servegen_class: str | None = None  # arrival servegen: one of SERVEGEN_CLASSES (default by rank)
    azure: str | None = None  # arrival azure: code or conv (default by rank)
    trace: dict | None = None  # a trace spec (any other kind) for this model's prompts

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.servegen_class is not None and self.servegen_class not in SERVEGEN_CLASSES:
            raise ValueError(f"field 'servegen_class': must be one of {', '.join(SERVEGEN_CLASSES)}, "
                             f"got {self.servegen_class!r}")
        if self.azure is not None and self.azure not in AZURE_SERVICES:
            raise ValueError(f"field 'azure': must be one of {', '.join(AZURE_SERVICES)}, got {self.azure!r}")

    def served(self) -> ServedModel:
        return ServedModel(self.name, self.profile, self.tp, self.ttft_slo_s, self.tpot_slo_s)


@dataclass
class MultiModelSpec:
    kind: str = "multi_model"
    seed: int = nonneg(0, "seed of the content and arrival streams")
    duration_s: float = positive(600.0, "seconds of traffic", le=MAX_DURATION_S)
    qps: float = rate(1.1, "mean arrival rate of all models together, requests/s")
    num_requests: int | None = count(None, "keep the first N requests (null: all of duration_s)")
    arrival: str = choice("onoff", ARRIVALS, "how requests arrive: onoff (Zipf popularity, bursts), servegen "
                                             "(ServeGen's per-class rates), azure (the two Azure 2023 services)")
    zipf_s: float = positive(1.08, "onoff/servegen: Zipf exponent of popularity over the models' ranks",
                             le=MAX_ZIPF_S)
    on_mean_s: float = positive(15.0, "onoff: mean length of a model's bursts, seconds", le=MAX_DURATION_S)
    off_mean_s: float = positive(12.0, "onoff: mean idle time between a model's bursts, seconds",
                                 le=MAX_DURATION_S)
    burst_cv: float = variation(1.0, "onoff: coefficient of variation of arrivals inside a burst (1 = Poisson)")
    servegen_path: str | None = None  # model_rates.csv; default ../shared/data/servegen/model_rates.csv
    azure_path: str | None = None  # folder of AzureLLMInferenceTrace_{code,conv}.csv; default ../shared/data
    prompt_p50: int = tokens(40, "median prompt tokens")
    prompt_p90: int = tokens(432, "90th percentile of prompt tokens")
    prompt_max: int = tokens(1021, "longest prompt (the draw is cut there)")
    output_p50: int = tokens(211, "median output tokens")
    output_p90: int = tokens(513, "90th percentile of output tokens")
    output_max: int = tokens(977, "longest output")
    sys_tokens: int = nonneg(0, "a system prompt each model's requests share, before the drawn prompt (0: none)",
                             le=MAX_TOKENS)
    models: list[dict] = field(default_factory=list)

    #: every field shapes which model a request goes to, so none is an arrival field only
    ARRIVAL_FIELDS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("field 'models': list the models (name, profile, ...) the requests go to")
        if len(self.models) > MAX_MODELS:
            raise ValueError(f"field 'models': at most {MAX_MODELS} models, got {len(self.models)}")
        entries = []
        for i, data in enumerate(self.models):
            try:
                entries.append(build(ModelEntry, data, f"models[{i}]"))
            except UserError as e:
                raise ValueError(str(e)) from None
        names = [e.name for e in entries]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise ValueError(f"models[{i}]: field 'name': model {n!r} is listed twice")
        for what in ("prompt", "output"):
            p50, p90, top = (getattr(self, f"{what}_{q}") for q in ("p50", "p90", "max"))
            if not p50 < p90 < top:
                raise ValueError(f"field '{what}_p90': needs {what}_p50 < {what}_p90 < {what}_max, got "
                                 f"{p50}, {p90}, {top}")
        if self.sys_tokens + self.prompt_max > MAX_TOKENS:
            raise ValueError(f"field 'sys_tokens': prompts of {self.sys_tokens} + {self.prompt_max} tokens are "
                             f"longer than {MAX_TOKENS}")
        if self.qps * self.duration_s > MAX_REQUESTS:
            raise ValueError(f"field 'duration_s': {self.qps:g} requests/s for {self.duration_s:g} s is more than "
                             f"{MAX_REQUESTS} requests")
        if self.arrival == "azure" and len(entries) > len(AZURE_SERVICES):
            raise ValueError(f"field 'models': arrival azure has two services for two models, got {len(entries)}")
        self._entries = entries
        self._traces = [_sub_spec(e.trace, i) if e.trace is not None else None for i, e in enumerate(entries)]

    @property
    def entries(self) -> list[ModelEntry]:
        return self._entries

    def shares(self) -> np.ndarray:
        """Each model's share of the requests: its ``weight``, else Zipf(zipf_s) by rank, normalized."""
        zipf = np.arange(1, len(self._entries) + 1, dtype=float) ** -self.zipf_s
        w = np.array([e.weight if e.weight is not None else z for e, z in zip(self._entries, zipf)])
        return w / w.sum()

    def arrive(self, content: Trace) -> Trace:
        """The content is made with its arrival times (no field is an arrival field only)."""
        return content


def _sub_spec(data: Any, i: int) -> Any:
    from prism.traces.spec import parse_spec

    where = f"models[{i}].trace"
    if not isinstance(data, dict) or data.get("kind") == "multi_model":
        raise ValueError(f"{where}: must be a trace spec of another kind (a mapping with its 'kind')")
    try:
        return parse_spec(data, where)
    except UserError as e:
        raise ValueError(str(e)) from None


# ---------------------------------------------------------------- lengths
@functools.lru_cache(maxsize=16)
def cut_lognormal(p50: int, p90: int, top: int) -> tuple[float, float]:
    """(mu, sigma) of a log-normal that, cut at ``top``, has median ``p50`` and 90th percentile ``p90``:
    Φ((ln q − mu)/sigma) = p · Φ((ln top − mu)/sigma) for (q, p) = (p50, 0.5), (p90, 0.9)."""
    x50, x90, xt = np.log([p50, p90, top])

    def gap(v):
        mu, log_sigma = v
        s = np.exp(log_sigma)
        cut = special.ndtr((xt - mu) / s)
        return [special.ndtr((x50 - mu) / s) - 0.5 * cut, special.ndtr((x90 - mu) / s) - 0.9 * cut]

    start = [x50, np.log((x90 - x50) / 1.2816)]
    (mu, log_sigma), info, ok, _ = optimize.fsolve(gap, start, full_output=True, xtol=1e-12)
    if ok != 1 or max(abs(g) for g in info["fvec"]) > 1e-9:
        raise UserError(f"no log-normal cut at {top} has median {p50} and 90th percentile {p90}")
    return float(mu), float(np.exp(log_sigma))


def draw_lengths(rng: np.random.Generator, n: int, p50: int, p90: int, top: int) -> np.ndarray:
    """``n`` token counts in 1..top from the cut log-normal (inverse CDF: one uniform per draw)."""
    mu, sigma = cut_lognormal(p50, p90, top)
    u = rng.random(n) * special.ndtr((np.log(top) - mu) / sigma)
    x = np.exp(mu + sigma * special.ndtri(u))
    return np.clip(np.rint(x), 1, top).astype(int)


# ---------------------------------------------------------------- arrivals
def _gamma_times(rng: np.random.Generator, start: float, end: float, rate_rps: float, cv: float) -> np.ndarray:
    """Gamma renewal arrivals of mean rate ``rate_rps`` and CV ``cv`` in [start, end)."""
    if rate_rps <= 0 or end <= start:
        return np.empty(0)
    shape = 1.0 / cv**2
    scale = 1.0 / (rate_rps * shape)
    out, t = [], start
    chunk = max(16, int((end - start) * rate_rps * 1.2) + 16)
    while True:
        times = t + np.cumsum(rng.gamma(shape, scale, chunk))
        inside = times[times < end]
        out.append(inside)
        if len(inside) < chunk:
            return np.concatenate(out)
        t = times[-1]


def on_periods(spec: MultiModelSpec, states: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of one model's ON periods in [0, duration_s): exponential ON and OFF lengths, starting ON
    with the duty cycle's probability. They depend on the seed only, never on ``qps``."""
    duty = spec.on_mean_s / (spec.on_mean_s + spec.off_mean_s)
    starts, ends = [], []
    t, on = 0.0, bool(states.random() < duty)
    while t < spec.duration_s:
        length = states.exponential(spec.on_mean_s if on else spec.off_mean_s)
        if on:
            starts.append(t)
            ends.append(min(t + length, spec.duration_s))
        t += length
        on = not on
    return np.array(starts), np.array(ends)


def _onoff(spec: MultiModelSpec, share: float, states: np.random.Generator, gaps: np.random.Generator) -> np.ndarray:
    """One model's arrivals: one Gamma renewal process run on the model's ON time (from ``gaps``), so that a burst
    continues the process rather than restarting it (a restart would bias the mean rate by (cv² − 1)/2 arrivals
    per burst)."""
    begin, end = on_periods(spec, states)
    if not len(begin):
        return np.empty(0)
    duty = spec.on_mean_s / (spec.on_mean_s + spec.off_mean_s)
    on_clock = np.concatenate([[0.0], np.cumsum(end - begin)])  # ON time at each burst's start
    s = _gamma_times(gaps, 0.0, on_clock[-1], spec.qps * share / duty, spec.burst_cv)
    burst = np.searchsorted(on_clock, s, side="right") - 1
    return begin[burst] + (s - on_clock[burst])


@functools.lru_cache(maxsize=4)
def servegen_rates(path: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """class -> (window starts, rates, CVs) of ``model_rates.csv``, windows in time order."""
    if path_kind(path) != "file":
        raise UserError("ServeGen rates not found (pass servegen_path)", path)
    reader = csv.DictReader(io.StringIO(read_text(path, "CSV file"), newline=""))
    for column in ("model", "window_start_s", "rate_rps", "rate_weighted_cv"):
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise UserError(f"missing column {column}", path)
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for i, row in enumerate(reader, start=2):
        try:
            start, r, cv = float(row["window_start_s"]), float(row["rate_rps"]), float(row["rate_weighted_cv"])
        except (TypeError, ValueError):
            raise UserError("window_start_s, rate_rps and rate_weighted_cv must be numbers", f"{path}:{i}") from None
        if not (np.isfinite([start, r, cv]).all() and r >= 0 and cv >= 0):
            raise UserError("rates and CVs must be finite and >= 0", f"{path}:{i}")
        rows.setdefault(str(row["model"]), []).append((start, r, cv))
    return {k: tuple(np.array(col) for col in zip(*sorted(v))) for k, v in rows.items()}  # type: ignore[misc]


WINDOW_S = 600.0  # model_rates.csv: one row per class and 600 s window


def _servegen(spec: MultiModelSpec, rank: int, share: float, states: np.random.Generator,
              gaps: np.random.Generator) -> np.ndarray:
    path = spec.servegen_path or str(default_data_dir() / "servegen" / "model_rates.csv")
    table = servegen_rates(path)
    cls = spec.entries[rank].servegen_class or SERVEGEN_CLASSES[rank % 3]
    if cls not in table:
        raise UserError(f"no rows for model class {cls!r}", path)
    _, rates, cvs = table[cls]
    windows = int(np.ceil(spec.duration_s / WINDOW_S))
    idx = (int(states.integers(0, len(rates))) + np.arange(windows)) % len(rates)
    lengths = np.minimum(WINDOW_S, spec.duration_s - WINDOW_S * np.arange(windows))
    volume = float((rates[idx] * lengths).sum())
    if volume <= 0:
        return np.empty(0)  # the class was idle all along this stretch
    scale = spec.qps * share * spec.duration_s / volume
    return np.concatenate([_gamma_times(gaps, j * WINDOW_S, j * WINDOW_S + lengths[j], rates[k] * scale,
                                        float(np.clip(cvs[k], MIN_CV, MAX_CV)))
                           for j, k in enumerate(idx)])


def _azure(spec: MultiModelSpec) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per model (times, prompt tokens, output tokens) of its Azure service, scaled together to ``qps``."""
    folder = Path(spec.azure_path) if spec.azure_path else default_data_dir() / "azure_llm"
    services = [e.azure or AZURE_SERVICES[i] for i, e in enumerate(spec.entries)]
    records = [load_azure_records(folder / f"AzureLLMInferenceTrace_{s}.csv") for s in services]
    span = max(t[-1] - t[0] for t, _, _ in records)
    raw_rate = sum(len(t) for t, _, _ in records) / span if span > 0 else 0.0
    if raw_rate <= 0:
        raise UserError("the Azure traces span no time", str(folder))
    out = []
    for t, ctx, gen in records:
        times = (t - t[0]) * (raw_rate / spec.qps)
        keep = times < spec.duration_s
        out.append((times[keep], np.clip(ctx[keep], 1, MAX_TOKENS), np.clip(gen[keep], 1, MAX_TOKENS)))
    return out


def arrival_times(spec: MultiModelSpec) -> list[np.ndarray]:
    """Each model's arrival times, in order."""
    if spec.arrival == "azure":
        return [t for t, _, _ in _azure(spec)]
    out = []
    for m, share in enumerate(spec.shares()):
        states, gaps = model_streams(spec.seed, m)
        out.append(_onoff(spec, share, states, gaps) if spec.arrival == "onoff"
                   else _servegen(spec, m, share, states, gaps))
    return out


def model_streams(seed: int, m: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(states, gaps): model m's two arrival streams, the bursts' (or ServeGen offset's) and the arrivals'."""
    states, gaps = np.random.SeedSequence([seed, 1, m]).spawn(2)
    return np.random.default_rng(states), np.random.default_rng(gaps)


# ---------------------------------------------------------------- prompts
def _own_prompts(spec: MultiModelSpec, m: int, n: int, table: SegmentTable, lengths=None) -> list[tuple]:
    """(segments, output_len, session, fixed) of the model's first ``n`` default prompts."""
    name = spec.entries[m].name
    if lengths is None:  # one stream each: the k-th prompt and output never depend on how many there are
        prompt_rng, out_rng = (np.random.default_rng(s) for s in np.random.SeedSequence([spec.seed, 2, m]).spawn(2))
        prompt = draw_lengths(prompt_rng, n, spec.prompt_p50, spec.prompt_p90, spec.prompt_max)
        out = draw_lengths(out_rng, n, spec.output_p50, spec.output_p90, spec.output_max)
    else:
        prompt, out = lengths
    head = (table.segment(f"{name}/sys", SYS, spec.sys_tokens),) if spec.sys_tokens else ()
    return [((*head, table.segment(f"{name}/q{k}", PRIV, int(prompt[k]))), int(out[k]), None, False)
            for k in range(n)]


def _sub_prompts(spec: MultiModelSpec, m: int, n: int, table: SegmentTable) -> list[tuple]:
    """The model's first ``n`` prompts of its own trace spec, segment ids and sessions namespaced by model."""
    from prism.traces.spec import trace_kind

    sub = spec._traces[m]
    if any(f.name == "num_requests" for f in dataclasses.fields(sub)):
        sub = dataclasses.replace(sub, num_requests=n)
    made = trace_kind(sub.kind)[1](sub)
    name = spec.entries[m].name
    out = []
    for r in made.requests[:n]:
        segs = []
        for s in r.segments:
            sid = f"{name}/{s.id}"
            if sid not in table:
                table.declare(sid, s.kind, tokens=made.table.explicit_tokens(s.id))
            segs.append(table.segment(sid, s.kind, s.length))
        out.append((tuple(segs), r.output_len, None if r.session is None else f"{name}/{r.session}", r.fixed_order))
    return out


def content(spec: MultiModelSpec) -> Trace:
    """The requests of every model, merged in arrival order (ties: the model listed first)."""
    azure = _azure(spec) if spec.arrival == "azure" else None
    times = [t for t, _, _ in azure] if azure else arrival_times(spec)
    if spec.num_requests is not None:  # the first N overall: cut every model at the N-th arrival
        merged = np.sort(np.concatenate(times), kind="stable")
        if len(merged) > spec.num_requests:
            cut = merged[spec.num_requests - 1]
            times = [t[t <= cut] for t in times]
    table = SegmentTable()
    events = []
    for m, t in enumerate(times):
        n = len(t)
        if spec._traces[m] is not None:
            prompts = _sub_prompts(spec, m, n, table) if n else []
        else:
            prompts = _own_prompts(spec, m, n, table, (azure[m][1], azure[m][2]) if azure else None)
        events.extend((float(t[k]), m, k, prompts[k]) for k in range(min(n, len(prompts))))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    if spec.num_requests is not None:
        events = events[:spec.num_requests]
    if not events:
        raise UserError("the spec makes no requests (raise qps or duration_s)")
    names = [e.name for e in spec.entries]
    requests = [Request(rid, t, segs, out, session, fixed, names[m])
                for rid, (t, m, _, (segs, out, session, fixed)) in enumerate(events)]
    meta = {"models": [asdict(e.served()) for e in spec.entries]}
    return Trace(requests, table, "multi_model", asdict(spec), meta)
