"""``prism-trace``: generate, import, export, inspect and sample traces."""

from __future__ import annotations

import argparse
import json
import sys

from prism.calibration.profiles import check_served
from prism.cli.common import add_set_flag, entry_point, Parser
from prism.cli.trace_io import add_import_parsers, run_import_command
from prism.config import apply_overrides
from prism.errors import UserError
from prism.output import check_out_file
from prism.traces import trace as trace_format
from prism.traces.spec import load_trace, resolve
from prism.traces.stats import trace_stats
from prism.traces.trace import Trace, served_models


def parser() -> argparse.ArgumentParser:
    from prism.traces.spec import BUILTIN

    p = Parser(prog="prism-trace", description="Generate, inspect and sample PRISM traces.")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="materialize a trace spec into a JSONL trace file")
    g.add_argument("spec", help=f"trace spec YAML or a built-in spec: {', '.join(BUILTIN)}")
    g.add_argument("-o", "--out", required=True, help="output JSONL file")
    add_set_flag(g, "a spec field", "qps=40, num_requests=200")
    s = sub.add_parser("stats", help="requests, segments, reuse, prompt lengths, infinite-cache hit rate")
    s.add_argument("trace", help=f"trace spec YAML, JSONL trace or a built-in spec: {', '.join(BUILTIN)}")
    s.add_argument("--json", action="store_true", help="print JSON")
    add_set_flag(s, "a spec field", "qps=40, num_requests=200")
    m = sub.add_parser("sample", help="print a few requests with their segment structure")
    m.add_argument("trace", help=f"trace spec YAML, JSONL trace or a built-in spec: {', '.join(BUILTIN)}")
    m.add_argument("-n", type=int, default=5, help="requests to print (default 5)")
    add_set_flag(m, "a spec field", "qps=40, num_requests=200")
    add_import_parsers(sub)
    return p


def _overrides(items: list[str]) -> dict:
    data = apply_overrides({}, items)
    nested = [k for k, v in data.items() if isinstance(v, dict)]
    if nested:
        raise UserError(f"--set {nested[0]}.…: trace fields are flat (e.g. --set qps=40)")
    return data


def _inline(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_inline(v)}" for k, v in value.items())
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _print_stats(st: dict) -> None:
    for key, value in st.items():
        if isinstance(value, dict) and any(isinstance(v, dict) for v in value.values()):
            print(key)
            for k, v in value.items():
                print(f"  {k:26s} {_inline(v)}")
        elif isinstance(value, dict):
            print(f"{key:28s} {_inline(value)}")
        elif isinstance(value, list):
            print(f"{key} (id, requests, tokens)" if key == "most_shared" else key)
            for item in value:
                print("  " + "  ".join(map(str, item)))
        elif isinstance(value, float):
            print(f"{key:28s} {value:.4f}")
        else:
            print(f"{key:28s} {value}")


def _load(source: str, overrides: list[str]) -> Trace:
    """The trace, with a multi-model trace's profile models checked (a trace cannot know the profiles)."""
    t = load_trace(source, _overrides(overrides))
    check_served(served_models(t.meta), source)
    return t


@entry_point("prism-trace")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "gen":
        check_out_file(args.out, "-o", inputs=[resolve(args.spec)])
        t = _load(args.spec, args.overrides)
        trace_format.save(t, args.out)
        print(f"wrote {len(t)} requests, {len(t.table)} segments to {args.out}")
    elif args.cmd == "stats":
        st = trace_stats(_load(args.trace, args.overrides))
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            _print_stats(st)
    elif args.cmd in ("import", "export", "make-tokenizer"):
        run_import_command(args)
    elif args.cmd == "sample":
        if args.n < 1:
            raise UserError(f"-n must be >= 1, got {args.n}")
        t = _load(args.trace, args.overrides)
        for r in t.requests[:args.n]:
            parts = " | ".join(f"{s.kind}:{s.id}({s.length})" for s in r.segments)
            sess = f" session={r.session}" if r.session else ""
            model = f" model={r.model}" if r.model is not None else ""
            print(f"#{r.id} t={r.arrival:.3f}s prompt={r.prompt_len} out={r.output_len}{sess}{model}\n    {parts}")
    return 0
