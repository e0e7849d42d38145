"""``prism-trace import``, ``export`` and ``make-tokenizer``: request logs in and out of PRISM's trace format."""

from __future__ import annotations

import argparse

from prism.cli.common import add_no_progress_flag
from prism.errors import UserError
from prism.output import check_out_dir, check_out_file


def add_import_parsers(sub) -> None:
    from prism.traces.importing import FORMATS

    i = sub.add_parser("import", help="read a request log (chat, ShareGPT, token ids, CSV) into a JSONL trace")
    i.add_argument("log", help="the request log")
    i.add_argument("--format", required=True, choices=tuple(FORMATS),
                   help="openai: chat-completions request bodies, one per line; sharegpt: conversations; "
                        "autobench: SGLang's token-id JSONL; csv: timestamp,prompt_tokens,output_tokens")
    i.add_argument("--tokenizer", metavar="PATH",
                   help="the model's Hugging Face tokenizer folder (needed for chat messages; never downloaded)")
    i.add_argument("--qps", type=float, help="Poisson arrivals at this rate (seeded) instead of the log's timestamps")
    i.add_argument("--seed", type=int, default=0, help="seed of Poisson arrivals, drawn lengths and ShareGPT's "
                                                       "interleaving (default 0)")
    i.add_argument("--output-len", default="log", metavar="SPEC",
                   help="output lengths: log (the default), log:DIST (the log's, else drawn) or DIST for all, where "
                        "DIST is N, uniform:A,B, exponential:MEAN or lognormal:MEDIAN,SIGMA")
    i.add_argument("--block-tokens", type=int, default=512,
                   help="token-id prompts: tokens per reusable block, keyed by content hash (default 512)")
    i.add_argument("--sessions", type=int, default=16,
                   help="sharegpt: conversations whose turns interleave (default 16)")
    i.add_argument("-o", "--out", required=True, help="output JSONL trace")
    i.add_argument("--workers", type=int, default=0,
                   help="openai: processes that read a large log in parts (default 0: one per CPU)")
    add_no_progress_flag(i)
    e = sub.add_parser("export", help="write a trace as a request log (for round-trip checks)")
    e.add_argument("trace", help="trace spec YAML, built-in name or JSONL trace")
    e.add_argument("--format", required=True, choices=("openai", "autobench"),
                   help="openai: chat bodies with synthetic text of the segments' lengths (needs --tokenizer); "
                        "autobench: the prompts' token ids")
    e.add_argument("--tokenizer", metavar="PATH", help="tokenizer folder whose words and template write the text")
    e.add_argument("-o", "--out", required=True, help="output JSONL log")
    t = sub.add_parser("make-tokenizer", help="train the small BPE tokenizer with a ChatML template that tests and "
                                              "examples use (from ../shared/data)")
    t.add_argument("-o", "--out", required=True, help="output folder")
    t.add_argument("--data", metavar="DIR", help="public data folder (default ../shared/data or $PRISM_DATA_DIR)")


def run_import_command(args: argparse.Namespace) -> None:
    if args.cmd == "import":
        _import(args)
    elif args.cmd == "export":
        _export(args)
    else:
        from prism.traces.demo_tokenizer import build

        check_out_dir(args.out, "-o")
        folder = build(args.out, args.data)
        print(f"wrote a tokenizer to {folder}")


def _import(args: argparse.Namespace) -> None:
    from prism.traces import trace as trace_format
    from prism.traces.importing import ImportOptions, OutputLengths, import_trace

    options = ImportOptions(args.format, args.tokenizer, args.qps, args.seed, OutputLengths.parse(args.output_len),
                            args.block_tokens, args.sessions, not args.no_progress, args.workers)
    out = check_out_file(args.out, "-o")
    trace = import_trace(args.log, options)
    trace_format.save(trace, out)
    note = trace.meta.get("unplaced_messages", 0)
    extra = f"; {note} message texts not found in the prompt (kept in the segment before)" if note else ""
    skipped = trace.meta.get("turns_without_reply", 0)
    extra += f"; {skipped} turns without a reply left out (give --output-len log:N to keep them)" if skipped else ""
    print(f"wrote {len(trace)} requests, {len(trace.table)} segments to {out}{extra}")


def _export(args: argparse.Namespace) -> None:
    from prism.traces.spec import load_trace

    out = check_out_file(args.out, "-o")
    if args.format == "openai" and not args.tokenizer:
        raise UserError("--tokenizer: --format openai writes text, which needs a tokenizer folder")
    trace = load_trace(args.trace)
    if args.format == "autobench":
        from prism.traces.autobench import export

        counts = export(trace, out)
    else:
        from prism.traces.openai_log import export

        counts = export(trace, out, args.tokenizer)
    extra = ""
    if counts.get("unmatched_segments"):
        extra += f"; {counts['unmatched_segments']} segments shorter than the template's own tokens are longer"
    if counts.get("shared_first_words"):
        extra += f"; {counts['shared_first_words']} segments share a first word with another"
    print(f"wrote {counts['requests']} requests to {out}{extra}")
