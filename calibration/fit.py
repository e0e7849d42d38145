"""Fit the cost model's coefficients to measured engine iterations.

Measurements CSV (one row per engine iteration; header required, extra columns ignored)::

    kind,batch_size,new_tokens,cached_tokens,context_tokens,seconds
    prefill,2,640;512,128;0,,0.0412
    decode,32,,,26112,0.0135

* ``kind``: ``prefill`` or ``decode``;
* ``batch_size``: requests in the iteration;
* ``new_tokens`` / ``cached_tokens`` (prefill): per-request values separated by ``;`` (exact), or batch totals
  (then the attention term assumes the batch's requests are alike: ``N·(C + N/2) / B``); an optional
  ``attention_pairs`` column gives ``Σ new_i·(cached_i + new_i/2)`` directly;
* ``context_tokens`` (decode): Σ of the requests' context lengths;
* ``seconds``: the iteration's measured time.

SGLang's live mode (and any engine that logs per-iteration batch shapes) writes exactly this. The fit minimises
*relative* residuals (iteration times span orders of magnitude), separately for each phase; the report gives
each phase's MAPE.

* prefill ``t = a_p + b_p·N_new + d_p·B + c_p·pairs`` is linear: a non-negative least squares over the four
  coefficients. ``d_p`` (the LM head once per sequence) needs batch sizes that vary apart from the other
  columns; otherwise (``prism-calibrate measure`` times single requests) ``d_p`` is held at the prior's value
  (the roofline of ``--gpu``/``--model``) and the rest is fitted to what remains;
* decode ``t = a_d + max(w_d + c_d·Σctx, b_d·B)`` is piecewise linear: the memory line ``K + c_d·Σctx`` is
  fitted first (non-negative least squares), then all four coefficients by nonlinear least squares
  (scipy ``least_squares``, bounds ≥ 0) from ``a_d`` = the prior's, ``w_d = K − a_d``, ``b_d`` = the prior's.
  Telling the overhead ``a_d`` from the weight read ``w_d``, and finding ``b_d``, needs compute-bound rows (large
  batches of short contexts) at two batch sizes at least; without them the memory line is kept, ``a_d`` and
  ``b_d`` are held at the prior's (``b_d`` capped so that no measured row is predicted compute-bound) and the
  report says so.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares, lsq_linear

from prism.config import check_csv_header, read_text
from prism.errors import UserError
from prism.output import save_figure, write_csv

from prism.calibration.cost_model import DEFAULT_PROFILE, CostModel, load_profile

MAX_ROWS = 1_000_000  # synthetic measurements at most
REQUIRED = ("kind", "batch_size", "new_tokens", "cached_tokens", "context_tokens", "seconds")


@dataclass
class Measurements:
    prefill_x: np.ndarray  # rows of (1, N_new, B, pairs)
    prefill_y: np.ndarray
    decode_x: np.ndarray  # rows of (B, Σctx)
    decode_y: np.ndarray


def _numbers(text: str, where: str, field: str) -> list[float]:
    text = (text or "").strip()
    if not text:
        return []
    try:
        vals = [float(x) for x in text.split(";")]
    except ValueError:
        raise UserError(f"field {field!r}: not a number or ;-separated numbers: {text!r}", where) from None
    if any(v < 0 or not np.isfinite(v) for v in vals):
        raise UserError(f"field {field!r}: values must be finite and >= 0, got {text!r}", where)
    return vals


def read_measurements(path: str | Path) -> Measurements:
    p = Path(path)
    px, py, dx, dy = [], [], [], []
    reader = csv.DictReader(io.StringIO(read_text(p, "measurements CSV"), newline=""))
    try:
        check_csv_header(reader.fieldnames, f"{p}:1", REQUIRED)
        for row in reader:
            where = f"{p}:{reader.line_num}"
            if None in row or any(v is None for v in row.values()):
                raise UserError(f"{len(reader.fieldnames)} columns in the header, a different number here", where)
            kind = (row["kind"] or "").strip()
            if kind not in ("prefill", "decode"):
                raise UserError(f"field 'kind': must be prefill or decode, got {kind!r}", where)
            secs = _numbers(row["seconds"], where, "seconds")
            bs = _numbers(row["batch_size"], where, "batch_size")
            if len(secs) != 1 or secs[0] <= 0:
                raise UserError("field 'seconds': must be one number > 0", where)
            if len(bs) != 1 or bs[0] < 1:
                raise UserError("field 'batch_size': must be one number >= 1", where)
            b = bs[0]
            if kind == "prefill":
                new = _numbers(row["new_tokens"], where, "new_tokens")
                cached = _numbers(row["cached_tokens"], where, "cached_tokens") or [0.0] * len(new)
                if not new:
                    raise UserError("field 'new_tokens': required for prefill rows", where)
                if len(cached) != len(new):
                    raise UserError("fields 'new_tokens' and 'cached_tokens' list different request counts", where)
                pairs_col = _numbers(row.get("attention_pairs") or "", where, "attention_pairs")
                if pairs_col:
                    pairs = pairs_col[0]
                elif len(new) > 1:
                    pairs = sum(n * (c + n / 2) for n, c in zip(new, cached))
                else:  # batch totals: assume alike requests
                    pairs = new[0] * (cached[0] + new[0] / 2) / b
                px.append((1.0, sum(new), b, pairs))
                py.append(secs[0])
            else:
                ctx = _numbers(row["context_tokens"], where, "context_tokens")
                if len(ctx) != 1:
                    raise UserError("field 'context_tokens': required (one number) for decode rows", where)
                dx.append((b, ctx[0]))
                dy.append(secs[0])
    except csv.Error as e:
        raise UserError(f"invalid CSV ({e})", f"{p}:{reader.line_num}") from None
    if len(py) < 3 or len(dy) < 3:
        raise UserError(f"needs at least 3 prefill and 3 decode rows, found {len(py)} and {len(dy)}", str(p))
    return Measurements(np.array(px), np.array(py), np.array(dx), np.array(dy))


@dataclass
class FitReport:
    cost: CostModel
    mape_prefill: float
    mape_decode: float
    rows_prefill: int
    rows_decode: int
    pred_prefill: np.ndarray
    pred_decode: np.ndarray
    held: list[str]  # coefficients the rows could not identify, kept from the prior, and why


def _relative_nnls(x: np.ndarray, target: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative x·c ≈ target, each row weighted by 1/y (relative error of the measured time y)."""
    w = 1.0 / y
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    res = lsq_linear((x / scale) * w[:, None], target * w, bounds=(0, np.inf), method="bvls")
    return res.x / scale


def check_identifiable(x: np.ndarray, kind: str, names: Sequence[str], columns: Sequence[str],
                       where: str) -> None:
    """Each coefficient needs a column of the design that the others do not explain: name the first that
    does not (identical rows, or a column proportional to another, leave a coefficient arbitrary)."""
    scaled = x / np.where(np.abs(x).max(axis=0) > 0, np.abs(x).max(axis=0), 1.0)
    kept: list[int] = []
    for j in range(x.shape[1]):
        if np.linalg.matrix_rank(scaled[:, kept + [j]], tol=1e-9 * len(x)) == len(kept) + 1:
            kept.append(j)
            continue
        raise UserError(f"the {kind} rows cannot identify {names[j]} ({columns[j]}): it is a combination of "
                        f"{', '.join(columns[i] for i in kept) or 'nothing'} in every row; vary it across rows",
                        where)


def _rank_grows(x: np.ndarray, column: np.ndarray) -> bool:
    """Whether ``column`` is not a combination of the columns of ``x`` (scaled as in check_identifiable)."""
    both = np.column_stack([x, column])
    both = both / np.where(np.abs(both).max(axis=0) > 0, np.abs(both).max(axis=0), 1.0)
    return int(np.linalg.matrix_rank(both, tol=1e-9 * len(x))) == both.shape[1]


def fit_prefill(x: np.ndarray, y: np.ndarray, prior: CostModel, where: str) -> tuple[dict[str, float], list[str]]:
    """(a_p, b_p, d_p, c_p) from rows of (1, N_new, B, pairs); d_p from the prior when the batch sizes do not
    vary apart from the other columns (e.g. every row one request)."""
    base = x[:, [0, 1, 3]]
    check_identifiable(base, "prefill", ("a_p", "b_p", "c_p"),
                       ("the fixed cost", "new_tokens", "attention pairs (new_tokens x cached_tokens)"), where)
    if not _rank_grows(base, x[:, 2]):
        c = _relative_nnls(base, y - prior.d_p * x[:, 2], y)
        sizes = ", ".join(f"{b:g}" for b in np.unique(x[:, 2]))
        held = [f"d_p = {prior.d_p:.4g} s from the prior: the prefill rows' batch sizes ({sizes}) do not vary "
                "apart from the other columns"]
        return {"a_p": float(c[0]), "b_p": float(c[1]), "d_p": prior.d_p, "c_p": float(c[2])}, held
    c = _relative_nnls(x, y, y)
    return {"a_p": float(c[0]), "b_p": float(c[1]), "d_p": float(c[2]), "c_p": float(c[3])}, []


def decode_model(p: np.ndarray, batch: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """a_d + max(w_d + c_d·ctx, b_d·B) for p = (a_d, w_d, c_d, b_d): CostModel.decode_time over arrays."""
    return p[0] + np.maximum(p[1] + p[2] * ctx, p[3] * batch)


def fit_decode(x: np.ndarray, y: np.ndarray, prior: CostModel, where: str) -> tuple[dict[str, float], list[str]]:
    """(a_d, w_d, c_d, b_d) from rows of (B, Σctx): the memory line first, then the max form (module docstring)."""
    batch, ctx = x[:, 0], x[:, 1]
    # memory (∝ Σctx) and compute (∝ B) are told apart only if the context per request varies across rows
    check_identifiable(np.column_stack([np.ones(len(y)), batch, ctx]), "decode", ("w_d", "b_d", "c_d"),
                       ("the fixed cost", "batch_size", "context_tokens"), where)
    line = np.column_stack([np.ones(len(y)), ctx])
    k, c_d = _relative_nnls(line, y, y)
    a_d = min(prior.a_d, k)
    start = np.array([a_d, k - a_d, c_d, prior.b_d])
    scale = np.array([y.max(), y.max(), y.max() / max(ctx.max(), 1.0), y.max() / batch.max()])
    fitted = least_squares(lambda q: (decode_model(q * scale, batch, ctx) - y) / y, start / scale,
                           bounds=(0.0, np.inf), method="trf", x_scale="jac").x * scale
    compute_bound = fitted[3] * batch > fitted[1] + fitted[2] * ctx
    if len(np.unique(batch[compute_bound])) >= 2:
        return dict(zip(("a_d", "w_d", "c_d", "b_d"), map(float, fitted))), []
    b_d = float(min(prior.b_d, np.min((k - a_d + c_d * ctx) / batch)))
    held = [f"a_d = {a_d:.4g} s and b_d = {b_d:.4g} s from the prior (b_d capped so that no measured row is "
            "compute-bound): no decode row is compute-bound at two batch sizes (add large batches of short "
            "contexts to identify them)"]
    return {"a_d": a_d, "w_d": float(k - a_d), "c_d": float(c_d), "b_d": b_d}, held


def fit(m: Measurements, first_token_s: float = 0.0, name: str = "fitted", where: str = "measurements",
        prior: CostModel | None = None) -> FitReport:
    """Fit both phases; coefficients the rows cannot identify come from ``prior`` (default: the roofline of
    the default profile; ``prism-calibrate fit`` passes the roofline of its ``--gpu``/``--model``)."""
    prior = prior or load_profile(DEFAULT_PROFILE).cost
    cp, held_p = fit_prefill(m.prefill_x, m.prefill_y, prior, where)
    cd, held_d = fit_decode(m.decode_x, m.decode_y, prior, where)
    cost = CostModel(**cp, **cd, first_token_s=first_token_s, name=name)
    pp = np.array([cost.a_p + cost.b_p * n + cost.d_p * b + cost.c_p * pairs for _, n, b, pairs in m.prefill_x])
    pd = decode_model(np.array([cost.a_d, cost.w_d, cost.c_d, cost.b_d]), m.decode_x[:, 0], m.decode_x[:, 1])
    mape = lambda pred, y: float(np.mean(np.abs(pred - y) / y))  # noqa: E731
    return FitReport(cost, mape(pp, m.prefill_y), mape(pd, m.decode_y), len(m.prefill_y), len(m.decode_y), pp, pd,
                     held_p + held_d)


def synthetic_measurements(cost: CostModel, rows: int, noise: float, seed: int = 0) -> list[dict[str, str]]:
    """Iterations drawn like a serving run's, timed by ``cost`` with multiplicative Gaussian noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        if i % 2 == 0:
            b = int(rng.integers(1, 9))
            new = np.exp(rng.uniform(0.0, np.log(2048), b)).astype(int) + 1  # log-uniform: short chunks too
            cached = rng.integers(0, 2048, b) * (rng.random(b) < 0.6)
            t = cost.prefill_time(new.tolist(), cached.tolist())
            out.append({"kind": "prefill", "batch_size": str(b), "new_tokens": ";".join(map(str, new)),
                        "cached_tokens": ";".join(map(str, cached)), "context_tokens": "",
                        "seconds": repr(t * (1 + noise * rng.standard_normal()))})
        else:  # short contexts at large batches reach the compute bound
            b = int(np.exp(rng.uniform(0.0, np.log(256))))
            ctx = int(b * np.exp(rng.uniform(np.log(16), np.log(4096))))
            t = cost.decode_time(b, ctx)
            out.append({"kind": "decode", "batch_size": str(b), "new_tokens": "", "cached_tokens": "",
                        "context_tokens": str(ctx), "seconds": repr(t * (1 + noise * rng.standard_normal()))})
    return out


def write_measurements(rows: list[dict[str, str]], path: Path) -> None:
    write_csv(path, list(REQUIRED), rows)


def residual_plot(report: FitReport, m: Measurements, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, pred, y, title in ((axes[0], report.pred_prefill, m.prefill_y, "prefill"),
                               (axes[1], report.pred_decode, m.decode_y, "decode")):
        ax.scatter(y * 1e3, (pred - y) / y * 100, s=8)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("measured iteration time (ms)")
        ax.set_ylabel("relative residual (%)")
        mape = report.mape_prefill if title == "prefill" else report.mape_decode
        ax.set_title(f"{title}: MAPE {mape * 100:.2f}% over {len(y)} iterations")
        ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=110)
