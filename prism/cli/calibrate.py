"""``prism-calibrate``: show hardware/model profiles, measure iterations on a live server, and fit the cost model
to measured iterations."""

from __future__ import annotations

import argparse
import sys

import yaml

from prism.calibration import fit as fitting
from prism.calibration import measure as measuring
from prism.calibration import profiles
from prism.calibration.cost_model import DEFAULT_PROFILE, CostModel, Efficiency, load_profile, profile_from, roofline
from prism.cli.common import entry_point, Parser, table
from prism.errors import UserError
from prism.interrupts import InterruptsHeld, exit_status, received
from prism.output import check_out_file, write_atomic_text

GIB = 1 << 30
DEFAULT_GPU, DEFAULT_MODEL = DEFAULT_PROFILE.split(":")
PREFILL_BATCHES = (2048, 8192)  # new tokens per prefill batch shown by 'show'
PROMPT = 1024  # ... as prompts of this many tokens, no cache
DECODE_BATCHES = (1, 64, 256)  # decode batch sizes shown by 'show'
DECODE_CONTEXT = 1024  # ... each request with this many tokens of context


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-calibrate", description=__doc__.split(":", 1)[1].strip())
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="GPU and model specs, KV bytes per token, KV capacity, roofline coefficients")
    s.add_argument("--gpu", default=DEFAULT_GPU, help=f"one of {', '.join(profiles.gpus())}")
    s.add_argument("--model", default=DEFAULT_MODEL, help=f"one of {', '.join(profiles.models())}")
    s.add_argument("--mem-fraction", type=float, default=0.88, help="share of GPU memory for weights + KV")
    s.add_argument("--profile", help="or a profile YAML (e.g. a fitted one)")
    f = sub.add_parser("fit", help="least-squares fit of the cost model to a measurements CSV")
    f.add_argument("measurements", help="CSV: kind,batch_size,new_tokens,cached_tokens,context_tokens,seconds")
    f.add_argument("-o", "--out", required=True, help="profile YAML to write (residual plot beside it)")
    f.add_argument("--gpu", default=DEFAULT_GPU, help="with --model: the roofline that supplies coefficients the "
                   "rows cannot identify")
    f.add_argument("--model", default=DEFAULT_MODEL, help=f"with --gpu: the model of that roofline (one of "
                   f"{', '.join(profiles.models())})")
    f.add_argument("--first-token-s", type=float, default=0.0005, help="prefill end to first token (s)")
    me = sub.add_parser("measure", help="time prefill and decode iterations on a live SGLang server, write the "
                        "CSV that 'fit' reads")
    me.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    me.add_argument("-o", "--out", default="measurements.csv", help="CSV to write (atomically)")
    me.add_argument("--prefill-sizes", default="128,512,2048", help="new tokens per prefill point")
    me.add_argument("--cached", default="0,1024", help="cached-prefix lengths of the prefill points")
    me.add_argument("--batch-sizes", default="1,8,32", help="decode batch sizes")
    me.add_argument("--decode-context", default="512,2048",
                    help="prompt lengths of the decode requests (two or more: the fit separates the KV read from "
                    "the work per request by them)")
    me.add_argument("--decode-steps", type=int, default=32, help="max_new_tokens of each decode request")
    me.add_argument("--repeat", type=int, default=3, help="runs per point (the median is kept)")
    me.add_argument("--vocab", type=int, help="vocabulary size (default: the server model's config.json, else "
                    f"{measuring.DEFAULT_VOCAB})")
    me.add_argument("--timing", choices=("auto", "metrics", "latency"), default="auto",
                    help="prefill time from the server's --enable-metrics time stamps, or from client latency "
                    "minus the fixed path (auto: metrics when present)")
    me.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    me.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    me.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    t = sub.add_parser("synth", help="write synthetic measurements from a profile (to try 'fit')")
    t.add_argument("-o", "--out", required=True, help="measurements CSV to write")
    t.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"GPU:MODEL or a profile YAML (default {DEFAULT_PROFILE})")
    t.add_argument("--rows", type=int, default=400, help="measurement rows (default 400)")
    t.add_argument("--noise", type=float, default=0.03, help="relative Gaussian noise")
    t.add_argument("--seed", type=int, default=0, help="seed of the rows and their noise")
    return p


def implied_rates(cost: CostModel, g: profiles.GPU, m: profiles.Model, measured: bool, capacity: int
                  ) -> list[list[str]]:
    """Prefill tokens/s and decode step times at a few batch shapes, each with what it derives from: the
    efficiency factors' measurements when ``measured`` (the default roofline), else the profile's coefficients.
    A decode shape whose KV exceeds ``capacity`` tokens is still timed, and marked."""
    eff = Efficiency()
    flops = g.compute_flops
    rows = []
    for n in PREFILL_BATCHES:
        k = n // PROMPT
        t = cost.prefill_time([PROMPT] * k, [0] * k)
        why = (f"{2 * m.non_embedding_params / 1e9:.2f} GFLOP/token (non-embedding) at {eff.prefill_mfu:g} × "
               f"{flops / 1e12:.0f} TFLOP/s: Vidur A100 rows at 2k-16k tokens, 0.63-0.68 of peak with norms, "
               "RoPE, activations" if measured else "the profile's a_p, b_p, d_p, c_p")
        rows.append([f"prefill {n:,} new tokens ({k} × {PROMPT:,}-token prompts, no cache)",
                     f"{t * 1e3:.1f} ms = {n / t:,.0f} tokens/s", why])
    for b in DECODE_BATCHES:
        ctx = b * DECODE_CONTEXT
        t = cost.decode_time(b, ctx)
        mem, comp = cost.decode_memory_time(ctx), cost.decode_compute_time(b)
        bound = "memory" if mem >= comp else "compute"
        if not measured:
            why = (f"{bound}-bound (memory {mem * 1e3:.2f} ms, compute {comp * 1e3:.2f} ms): the profile's "
                   "a_d, w_d, c_d, b_d")
        elif bound == "memory":
            why = (f"memory-bound: {m.matmul_params * 2 / 1e9:.2f} GB weights + "
                   f"{ctx * m.kv_bytes_per_token() / 1e9:.2f} GB KV at {eff.bandwidth:g} × "
                   f"{g.hbm_bandwidth / 1e12:.3f} TB/s (Vidur A100 1-token rows: 0.77 of HBM); "
                   f"compute {comp * 1e3:.2f} ms")
        else:
            why = (f"compute-bound: {b} × {2 * m.matmul_params / 1e9:.2f} GFLOP at {eff.decode_mfu:g} × "
                   f"{flops / 1e12:.0f} TFLOP/s (Vidur A100 240-token rows: 0.61 of peak); memory {mem * 1e3:.2f} ms")
        if ctx > capacity:
            why = f"(KV {ctx:,} tokens exceeds the capacity {capacity:,}) {why}"
        rows.append([f"decode step, batch {b} × {DECODE_CONTEXT:,} context", f"{t * 1e3:.2f} ms", why])
    return rows


def show(args) -> None:
    if not 0 < args.mem_fraction <= 1:
        raise UserError(f"--mem-fraction must be in (0, 1], got {args.mem_fraction}")
    if args.profile is not None:
        prof = load_profile(args.profile, args.mem_fraction)
        g, m, cost = prof.gpu, prof.model, prof.cost
    else:
        g, m = profiles.gpu(args.gpu), profiles.model(args.model)
        cost = roofline(g, m)
    measured = cost.coefficients() == roofline(g, m).coefficients()
    kvb = m.kv_bytes_per_token()
    cap = profiles.kv_capacity_tokens(g, m, args.mem_fraction)
    sustained = f" (sustains {g.sustained_compute:.0%} under its power limit)" if g.sustained_compute < 1 else ""
    print(f"GPU    {g.key}: {g.name}; {g.peak_flops / 1e12:.0f} TFLOP/s dense bf16{sustained}, "
          f"{g.hbm_bandwidth / 1e12:.3f} TB/s HBM, {g.memory_gib:g} GiB")
    print(f"model  {m.key}: {m.layers} layers, hidden {m.hidden}, {m.heads} heads / {m.kv_heads} KV heads × "
          f"{m.head_dim}, vocab {m.vocab}, {m.params / 1e9:.2f} B parameters "
          f"({m.non_embedding_params / 1e9:.2f} B non-embedding)")
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
            ["d_p", f"{c.d_p * 1e6:.3f} us/sequence", "LM head at each sequence's last token"],
            ["c_p", f"{c.c_p * 1e9:.3f} ns/pair", "causal attention per (query, key) pair"],
            ["a_d", f"{c.a_d * 1e3:.3f} ms", "decode fixed overhead"],
            ["w_d", f"{c.w_d * 1e3:.3f} ms", "decode: weights read once (memory bound)"],
            ["c_d", f"{c.c_d * 1e9:.3f} ns/token", "decode: KV read per context token (memory bound)"],
            ["b_d", f"{c.b_d * 1e6:.3f} us/request", "decode: matmuls per request (compute bound)"]]
    print(table(coef, [f"cost model ({c.name})", "value", "meaning"]))
    print("prefill t = a_p + b_p·N_new + d_p·B + c_p·Σ new·(cached + new/2); "
          "decode t = a_d + max(w_d + c_d·Σctx, b_d·B)")
    print(table(implied_rates(c, g, m, measured, cap), ["at a glance", "time", "derived from"]))


def do_fit(args) -> None:
    profiles.gpu(args.gpu), profiles.model(args.model)  # validate names first
    if not 0 <= args.first_token_s < float("inf"):
        raise UserError(f"--first-token-s must be a finite number >= 0, got {args.first_token_s}")
    out = check_out_file(args.out, "-o", inputs=[args.measurements])
    check_out_file(out.with_suffix(".residuals.png"), "-o", inputs=[args.measurements])
    m = fitting.read_measurements(args.measurements)
    prior = roofline(profiles.gpu(args.gpu), profiles.model(args.model))
    report = fitting.fit(m, args.first_token_s, name=out.stem, where=str(args.measurements), prior=prior)
    c = report.cost
    doc = {"gpu": args.gpu, "model": args.model,
           "coefficients": {k: float(v) for k, v in c.coefficients().items()},
           "fit": {"measurements": str(args.measurements), "rows_prefill": report.rows_prefill,
                   "rows_decode": report.rows_decode, "mape_prefill": report.mape_prefill,
                   "mape_decode": report.mape_decode, "held": report.held}}
    profile_from(doc, str(out))  # what prism-sim will read back: the same rules, before anything is written
    write_atomic_text(out, yaml.safe_dump(doc, sort_keys=False))
    plot = fitting.residual_plot(report, m, out.with_suffix(".residuals.png"))
    print(table([[k, f"{v:.6g}"] for k, v in c.coefficients().items()], ["coefficient", "value"]))
    print(f"MAPE prefill {report.mape_prefill * 100:.2f}% ({report.rows_prefill} iterations), "
          f"decode {report.mape_decode * 100:.2f}% ({report.rows_decode} iterations)")
    for note in report.held:
        print(f"held: {note}")
    print(f"wrote {out} and {plot}; use it with: prism-sim --profile {out}")


def do_measure(args) -> int:
    plan = measuring.Plan(
        prefill_sizes=measuring.parse_sizes(args.prefill_sizes, "--prefill-sizes", 1),
        cached=measuring.parse_sizes(args.cached, "--cached", 0),
        batch_sizes=measuring.parse_sizes(args.batch_sizes, "--batch-sizes", 1),
        decode_context=measuring.parse_sizes(args.decode_context, "--decode-context", 1),
        decode_steps=args.decode_steps, repeat=args.repeat,
        timing=args.timing, timeout_s=args.timeout)
    measuring.check_url(args.url)
    if not 0 < args.timeout < float("inf"):
        raise UserError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    if args.vocab is not None and args.vocab <= measuring.FIRST_ID + 1:
        raise UserError(f"--vocab must be > {measuring.FIRST_ID + 1}, got {args.vocab}")
    measuring.check_plan(plan, {})
    check_out_file(args.out, "-o")  # before minutes of measuring
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    rows: list = []
    try:
        rows, summary = measuring.measure(args.url, plan, args.vocab, args.seed, log, rows)
    except (KeyboardInterrupt, measuring.ServerLost) as e:
        lost = isinstance(e, measuring.ServerLost)
        with InterruptsHeld():
            kept = (f"the {len(rows)} points measured are in {measuring.write_rows(rows, args.out)} (fit them "
                    f"with: prism-calibrate fit {args.out} -o PROFILE.yaml)" if rows else "no point was measured: "
                    "nothing written")
        print(f"prism-calibrate: {e if lost else 'interrupted'}; {kept}", file=sys.stderr)
        return 1 if lost else exit_status()
    with InterruptsHeld():
        out = measuring.write_rows(rows, args.out)
    if received():
        print(f"prism-calibrate: interrupted after the last point; the {len(rows)} points are in {out}",
              file=sys.stderr)
        return exit_status()
    print(table([[r.kind, r.batch_size, "" if r.new_tokens is None else r.new_tokens,
                  "" if r.cached_tokens is None else r.cached_tokens,
                  "" if r.context_tokens is None else r.context_tokens, f"{r.seconds * 1e3:.3f}",
                  f"{(max(r.samples) - min(r.samples)) * 1e3:.3f}"] for r in rows],
                ["kind", "batch", "new", "cached", "context", "ms (median)", "range ms"]))
    how = ("scheduler time stamps (--enable-metrics)" if summary["timing"] == "metrics" else
           f"latency − fixed path {summary['fixed_path_s'] * 1e3:.2f} ms")
    print(f"prefill timing: {how}; vocab {summary['vocab']} ({summary['vocab_source']})")
    print(f"wrote {len(rows)} rows to {out}; fit with: prism-calibrate fit {out} -o PROFILE.yaml")
    return 0


@entry_point("prism-calibrate")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "show":
        show(args)
    elif args.cmd == "fit":
        do_fit(args)
    elif args.cmd == "measure":
        return do_measure(args)
    else:
        if not 6 <= args.rows <= fitting.MAX_ROWS:
            raise UserError(f"--rows must be in 6..{fitting.MAX_ROWS}, got {args.rows}")
        if not 0 <= args.noise < 1:  # NaN fails too; noise >= 1 makes negative times
            raise UserError(f"--noise must be a relative noise in [0, 1), got {args.noise}")
        if args.seed < 0:
            raise UserError(f"--seed must be >= 0, got {args.seed}")
        out = check_out_file(args.out, "-o")
        cost = load_profile(args.profile).cost
        fitting.write_measurements(fitting.synthetic_measurements(cost, args.rows, args.noise, args.seed), out)
        print(f"wrote {args.rows} synthetic iterations of {cost.name} to {out}")
    return 0
