"""``prism-live serve``: a real, long-running SGLang server with prism's policies, for any client."""

from __future__ import annotations

import argparse
from pathlib import Path

from prism.cli.common import add_set_flag, Parser
from prism.errors import UserError
from prism.policies.registry import METHODS

EPILOG = """\
examples:
  prism-live serve --model ./my-model --method prism -- --port 30000 --tp 1
  prism-live serve --model ./my-model --method prism --port 30000 -- --enable-metrics
  prism-live serve --model tiny --device cpu --method prism --set engine.max_total_tokens=16384 \\
      -- --tokenizer-path ./tokenizer
  prism-live serve --model ./my-model --method prism --print-command     # the same server, started by you

Clients need nothing prism-specific: /v1/chat/completions requests get their segments from their messages
inside the server (system prompt, tool schemas, tool results and documents, history, the last user message),
/generate requests may carry them in sampling_params.custom_params, and a chat request may list its documents
in custom_params.prism_segments (with prism_movable: true to let QAS reorder them). The plugin's counters are
in GET /server_info (internal_states[0].prism) and, with -- --enable-metrics, on /metrics as prism:* gauges.
Arguments after -- go to python -m sglang.launch_server unchanged (--port and --host may be given there or as
prism's flags); prism sets --model-path, --schedule-policy and --radix-cache-backend itself. The server stops
with this command (Ctrl-C, SIGTERM).
"""


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="prism-live serve", description=__doc__.split(":", 1)[1].strip(), epilog=EPILOG)
    p.add_argument("--model", required=True, help="a local model folder (config.json, weights, tokenizer) or a "
                                                  "profile model name (dummy weights, no tokenizer)")
    p.add_argument("--config", help="YAML file with the method's settings (method, knobs, engine)")
    p.add_argument("--method", help=f"method preset: {', '.join(METHODS)} (default sglang)")
    p.add_argument("--scheduler", help="scheduler (instead of a method preset)")
    p.add_argument("--eviction", help="eviction policy (instead of a method preset)")
    add_set_flag(p)
    p.add_argument("--host", help="address the server listens on (default 127.0.0.1; or --host after --)")
    p.add_argument("--port", type=int, help="server port (default 30000; or --port after --)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the server runs (auto: cuda when nvidia-smi exists)")
    p.add_argument("--out", default="runs/serve", help="folder of the server's log, plugin settings, counters and "
                                                       "event log (default runs/serve)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for the server's health")
    p.add_argument("--print-command", action="store_true",
                   help="write the plugin settings and print the equivalent python -m sglang.launch_server "
                        "command with its environment, without starting anything")
    return p


def settings_of(args: argparse.Namespace):
    from prism.settings import merge_flags, read_config, settings_from

    data = merge_flags(read_config(args.config), args.overrides, method=args.method, scheduler=args.scheduler,
                       eviction=args.eviction)
    for section, why in (("trace", "replays no trace"), ("cluster", "starts one server"),
                         ("fleet", "serves one model")):
        if data.get(section):
            raise UserError(f"section {section!r}: prism-live serve {why}", args.config or "--set")
    return settings_from(data, args.config or "settings")


def main(argv: list[str]) -> int:
    own, sglang_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser().parse_args(own)
    given = {"--port": None if args.port is None else str(args.port), "--host": args.host}
    args.port = 30000 if args.port is None else args.port
    args.host = "127.0.0.1" if args.host is None else args.host
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be in 1..65535, got {args.port}")
    if not 0 < args.startup_timeout < float("inf"):
        raise UserError(f"--startup-timeout must be a positive number of seconds, got {args.startup_timeout}")
    settings = settings_of(args)
    from prism.live.instance import device_of
    from prism.live.model import resolve_model
    from prism.live.serve import ServeOptions, check_host, check_own_args, command_line, prepared, serve, take_shared

    model = resolve_model(args.model)
    opts = ServeOptions(host=args.host, port=args.port, device=device_of(args.device), out=Path(args.out),
                        startup_timeout_s=args.startup_timeout, sglang_args=sglang_args)
    check_host(opts.host)
    take_shared(opts, given)
    check_own_args(opts)
    if args.print_command:
        print(command_line(*prepared(settings, model, opts)))
        return 0

    def ready(url: str, instance) -> None:
        print(f"prism-live serve: {settings.label} at {url} (OpenAI chat: {url}/v1/chat/completions; plugin "
              f"counters: {url}/server_info; log: {instance.folder / 'server.log'}); Ctrl-C stops it", flush=True)

    return serve(settings, model, opts, ready)
