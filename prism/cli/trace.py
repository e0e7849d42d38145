"""``prism-trace``: generate, inspect and sample traces."""

from __future__ import annotations

import argparse
import json
import sys

from prism.cli.common import add_set_flag, entry_point
from prism.config import apply_overrides
from prism.errors import UserError
from prism.output import check_out_file
from prism.traces import trace as trace_format
from prism.traces.spec import load_trace, resolve
from prism.traces.stats import trace_stats


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prism-trace", description="Generate, inspect and sample PRISM traces.")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="materialize a trace spec into a JSONL trace file")
    g.add_argument("spec", help="trace spec YAML (or built-in name 'zipf')")
    g.add_argument("-o", "--out", required=True, help="output JSONL file")
    add_set_flag(g, "a spec field", "qps=40, num_requests=200")
    s = sub.add_parser("stats", help="requests, segments, reuse, prompt lengths, infinite-cache hit rate")
    s.add_argument("trace", help="trace spec YAML or JSONL file")
    s.add_argument("--json", action="store_true", help="print JSON")
    add_set_flag(s, "a spec field", "qps=40, num_requests=200")
    m = sub.add_parser("sample", help="print a few requests with their segment structure")
    m.add_argument("trace", help="trace spec YAML or JSONL file")
    m.add_argument("-n", type=int, default=5, help="requests to print (default 5)")
    add_set_flag(m, "a spec field", "qps=40, num_requests=200")
    return p


def _overrides(items: list[str]) -> dict:
    data = apply_overrides({}, items)
    nested = [k for k, v in data.items() if isinstance(v, dict)]
    if nested:
        raise UserError(f"--set {nested[0]}.…: trace fields are flat (e.g. --set qps=40)")
    return data


def _print_stats(st: dict) -> None:
    for key, value in st.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
            print(f"{key:28s} {inner}")
        elif isinstance(value, float):
            print(f"{key:28s} {value:.4f}")
        else:
            print(f"{key:28s} {value}")


@entry_point("prism-trace")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "gen":
        check_out_file(args.out, "-o", inputs=[resolve(args.spec)])
        t = load_trace(args.spec, _overrides(args.overrides))
        trace_format.save(t, args.out)
        print(f"wrote {len(t)} requests, {len(t.table)} segments to {args.out}")
    elif args.cmd == "stats":
        st = trace_stats(load_trace(args.trace, _overrides(args.overrides)))
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            _print_stats(st)
    elif args.cmd == "sample":
        if args.n < 1:
            raise UserError(f"-n must be >= 1, got {args.n}")
        t = load_trace(args.trace, _overrides(args.overrides))
        for r in t.requests[:args.n]:
            parts = " | ".join(f"{s.kind}:{s.id}({s.length})" for s in r.segments)
            sess = f" session={r.session}" if r.session else ""
            print(f"#{r.id} t={r.arrival:.3f}s prompt={r.prompt_len} out={r.output_len}{sess}\n    {parts}")
    return 0
