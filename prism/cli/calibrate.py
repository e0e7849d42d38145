"""``prism-calibrate``: show hardware/model profiles, and fit the cost model to measured iterations."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from prism.calibration import fit as fitting
from prism.calibration import profiles
from prism.calibration.cost_model import load_profile, roofline
from prism.cli.common import entry_point, table
from prism.errors import UserError

GIB = 1 << 30


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prism-calibrate", description=__doc__.split(":", 1)[1].strip())
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="GPU and model specs, KV bytes per token, KV capacity, roofline coefficients")
    s.add_argument("--gpu", default="a800-80g", help=f"one of {', '.join(profiles.gpus())}")
    s.add_argument("--model", default="qwen3-4b-instruct-2507", help=f"one of {', '.join(profiles.models())}")
    s.add_argument("--mem-fraction", type=float, default=0.88, help="share of GPU memory for weights + KV")
    s.add_argument("--profile", help="or a profile YAML (e.g. a fitted one)")
    f = sub.add_parser("fit", help="least-squares fit of the cost model to a measurements CSV")
    f.add_argument("measurements", help="CSV: kind,batch_size,new_tokens,cached_tokens,context_tokens,seconds")
    f.add_argument("-o", "--out", required=True, help="profile YAML to write (residual plot beside it)")
    f.add_argument("--gpu", default="a800-80g")
    f.add_argument("--model", default="qwen3-4b-instruct-2507")
    f.add_argument("--first-token-s", type=float, default=0.0005, help="prefill end to first token (s)")
    t = sub.add_parser("synth", help="write synthetic measurements from a profile (to try 'fit')")
    t.add_argument("-o", "--out", required=True)
    t.add_argument("--profile", default="a800-80g:qwen3-4b-instruct-2507")
    t.add_argument("--rows", type=int, default=400)
    t.add_argument("--noise", type=float, default=0.03, help="relative Gaussian noise")
    t.add_argument("--seed", type=int, default=0)
    return p


def show(args) -> None:
    if args.profile:
        prof = load_profile(args.profile, args.mem_fraction)
        g, m, cost = prof.gpu, prof.model, prof.cost
    else:
        if not 0 < args.mem_fraction <= 1:
            raise UserError(f"--mem-fraction must be in (0, 1], got {args.mem_fraction}")
        g, m = profiles.gpu(args.gpu), profiles.model(args.model)
        cost = roofline(g, m)
    kvb = m.kv_bytes_per_token()
    cap = profiles.kv_capacity_tokens(g, m, args.mem_fraction)
    print(f"GPU    {g.key}: {g.name}; {g.peak_flops / 1e12:.0f} TFLOP/s dense bf16, "
          f"{g.hbm_bandwidth / 1e12:.2f} TB/s HBM, {g.memory_gib:g} GiB")
    print(f"model  {m.key}: {m.layers} layers, hidden {m.hidden}, {m.heads} heads / {m.kv_heads} KV heads × "
          f"{m.head_dim}, vocab {m.vocab}, {m.params / 1e9:.2f} B parameters")
    rows = [
        ["KV bytes per token (fp16/bf16)", f"{kvb:,}", "2 · layers · kv_heads · head_dim · 2"],
        ["KV of a 640-token payload", f"{640 * kvb / GIB:.3f} GiB", ""],
        ["weights", f"{m.weight_bytes() / GIB:.2f} GiB", "params · 2 bytes"],
        [f"KV capacity at mem_fraction {args.mem_fraction:g}", f"{cap:,} tokens",
         "(memory · fraction − weights − 2 GiB) / KV bytes"],
    ]
    print(table(rows, ["quantity", "value", "how"]))
    c = cost
    coef = [["a_p", f"{c.a_p * 1e3:.3f} ms", "prefill fixed cost"],
            ["b_p", f"{c.b_p * 1e6:.3f} us/token", f"linear layers ({1 / c.b_p:,.0f} tokens/s)" if c.b_p else ""],
            ["c_p", f"{c.c_p * 1e9:.3f} ns/pair", "causal attention per (query, key) pair"],
            ["a_d", f"{c.a_d * 1e3:.3f} ms", "decode fixed cost (weights read once)"],
            ["b_d", f"{c.b_d * 1e6:.3f} us/request", "per decoded token"],
            ["c_d", f"{c.c_d * 1e9:.3f} ns/token", "KV read per context token"]]
    print(table(coef, [f"cost model ({c.name})", "value", "meaning"]))
    print(f"e.g. prefill of one 768-token prompt: {c.prefill_time([768], [0]) * 1e3:.1f} ms; "
          f"decode step at batch 32 × 1,024 context: {c.decode_time(32, 32 * 1024) * 1e3:.1f} ms")


def do_fit(args) -> None:
    profiles.gpu(args.gpu), profiles.model(args.model)  # validate names first
    m = fitting.read_measurements(args.measurements)
    out = Path(args.out)
    report = fitting.fit(m, args.first_token_s, name=out.stem)
    c = report.cost
    doc = {"gpu": args.gpu, "model": args.model,
           "coefficients": {k: float(v) for k, v in c.coefficients().items()},
           "fit": {"measurements": str(args.measurements), "rows_prefill": report.rows_prefill,
                   "rows_decode": report.rows_decode, "mape_prefill": report.mape_prefill,
                   "mape_decode": report.mape_decode}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    plot = fitting.residual_plot(report, m, out.with_suffix(".residuals.png"))
    print(table([[k, f"{v:.6g}"] for k, v in c.coefficients().items()], ["coefficient", "value"]))
    print(f"MAPE prefill {report.mape_prefill * 100:.2f}% ({report.rows_prefill} iterations), "
          f"decode {report.mape_decode * 100:.2f}% ({report.rows_decode} iterations)")
    print(f"wrote {out} and {plot}; use it with: prism-sim --profile {out}")


@entry_point("prism-calibrate")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "show":
        show(args)
    elif args.cmd == "fit":
        do_fit(args)
    else:
        if args.rows < 6 or args.noise < 0:
            raise UserError("--rows must be >= 6 and --noise >= 0")
        cost = load_profile(args.profile).cost
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fitting.write_measurements(fitting.synthetic_measurements(cost, args.rows, args.noise, args.seed), out)
        print(f"wrote {args.rows} synthetic iterations of {cost.name} to {out}")
    return 0
