"""``prism-live serve``: a long-running SGLang server with prism's plugin, for an operator's own traffic.

No trace, no replay, no pacing: SGLang 0.5.23 serves its usual endpoints (``/generate``, ``/v1/chat/completions``,
``/metrics`` with ``--enable-metrics``) and the plugin runs the method's policies in its scheduler. Chat requests
get their segments from their messages in the server (:mod:`prism.live.chat`), so clients change nothing.

:func:`launch` is the one description of that server: ``python -m sglang.launch_server`` arguments and the
environment, the same whether prism starts the process (:func:`serve`) or prints the command for an operator who
starts SGLang themselves (``--print-command``). Everything that can be checked before a server starts is checked
first, each failure one line (:func:`check_host`, :func:`check_own_args`, :func:`check_serve`): an unknown method
(the settings), a host no server can listen on, an argument after ``--`` that prism sets itself (the printed
command too), a port in use, a model folder without the tokenizer the chat path needs.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from prism.config import is_host
from prism.errors import UserError
from prism.output import prepare_out_dir
from prism.settings import Settings

from prism.live.hooks import BACKEND, CONFIG_ENV, NATIVE_SCHEDULERS, PluginConfig
from prism.live.instance import ServerInstance
from prism.live.model import ServedModel
from prism.live.server import Server, admission_env, check_port, wait_healthy

#: SGLang arguments that prism sets from its own flags (after ``--`` they would contradict the plugin)
OWN_ARGS = {"--model-path": "--model", "--model": "--model",
            "--radix-cache-backend": "the method (prism's cache backend)", "--schedule-policy": "the method",
            "--device": "--device"}
#: SGLang arguments that may come after ``--`` instead of prism's flag of the same name
SHARED_ARGS = ("--port", "--host")
#: EngineConfig field -> SGLang server argument (passed when the settings give the field)
ENGINE_ARGS = {"max_total_tokens": "--max-total-tokens", "page_size": "--page-size",
               "chunked_prefill_size": "--chunked-prefill-size", "max_prefill_tokens": "--max-prefill-tokens",
               "max_running_requests": "--max-running-requests"}


@dataclass
class ServeOptions:
    """Where and how the server runs; ``sglang_args``: everything after ``--``, passed through."""

    host: str = "127.0.0.1"
    port: int = 30000
    device: str = "cpu"
    out: Path = Path("runs/serve")
    startup_timeout_s: float = 300.0
    sglang_args: list[str] = field(default_factory=list)
    python: str | None = None


def _given(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in an argument list (``--flag V`` or ``--flag=V``), '' for a bare switch."""
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def take_shared(opts: "ServeOptions", given: dict[str, str | None]) -> None:
    """``--port``/``--host`` after ``--`` (as for ``python -m sglang.launch_server``) are the server's; given both
    ways they must agree. ``given``: prism's own flags as the command line gave them (None: left out)."""
    rest = list(opts.sglang_args)
    for flag in SHARED_ARGS:
        value = _given(rest, flag)
        if value is None:
            continue
        i = next(i for i, a in enumerate(rest) if a == flag or a.startswith(flag + "="))
        del rest[i:i + (1 if "=" in rest[i] else 2)]
        own = given.get(flag)
        if own is not None and own != value:
            raise UserError(f"{flag} {own} and {flag} {value} after -- disagree (give one)", flag)
        if flag == "--port":
            if not value.isdigit() or not 0 < int(value) < 65536:
                raise UserError(f"expected a port in 1..65535 after --, got {value!r}", flag)
            opts.port = int(value)
        else:
            opts.host = check_host(value)
    opts.sglang_args = rest


def check_host(host: str, flag: str = "--host") -> str:
    """A host the server can listen on (:func:`~prism.config.is_host`), not an empty or a shell word."""
    if not is_host(host):
        raise UserError(f"expected a host name or an IP address, got {host!r}", flag)
    return host


def tokenizer_folder(model: ServedModel, args: list[str]) -> Path | None:
    """The tokenizer SGLang will load (``--tokenizer-path`` after ``--``, else the model folder), or None with
    ``--skip-tokenizer-init`` (the server then takes token ids only, and has no chat endpoint)."""
    if _given(args, "--skip-tokenizer-init") is not None:
        return None
    given = _given(args, "--tokenizer-path")
    return Path(given).expanduser() if given else model.path


def check_tokenizer(model: ServedModel, args: list[str]) -> None:
    """The chat path needs the tokenizer and its chat template; both are read as the plugin will read them."""
    folder = tokenizer_folder(model, args)
    if folder is None:
        return
    from prism.traces.chat_template import ChatTokenizer

    if not (folder / "tokenizer.json").is_file():
        how = ("give a model folder with its tokenizer, -- --tokenizer-path DIR, or -- --skip-tokenizer-init "
               "(token ids on /generate only)")
        raise UserError(f"no tokenizer.json: the chat endpoint needs the model's tokenizer; {how}", str(folder))
    ChatTokenizer(folder).check_template()


def check_own_args(opts: ServeOptions) -> None:
    """No argument after ``--`` that prism sets itself (the printed command would hold it twice, the last
    winning: ``--radix-cache-backend radix`` would turn the plugin off)."""
    for arg in opts.sglang_args:
        name = arg.split("=", 1)[0]
        if name in OWN_ARGS:
            raise UserError(f"{name} is set by prism-live serve ({OWN_ARGS[name]}); drop it after --", name)


def check_serve(model: ServedModel, opts: ServeOptions) -> None:
    """What a server needs before it starts (the arguments were checked first: :func:`check_own_args`)."""
    check_tokenizer(model, opts.sglang_args)
    check_port(opts.host, opts.port)


def launch(settings: Settings, model: ServedModel, opts: ServeOptions, plugin_path: Path
           ) -> tuple[list[str], dict[str, str]]:
    """``python -m sglang.launch_server``'s arguments and the environment of the server (the plugin's settings
    file ``plugin_path`` named by ``PRISM_LIVE_CONFIG``)."""
    from prism.policies.registry import engine_scheduler, deployment_of

    deploy = deployment_of(settings.scheduler, settings.policy_configs)
    native = NATIVE_SCHEDULERS.get(engine_scheduler(settings.scheduler, deploy), "fcfs")
    args = ["--model-path", str(model.path), "--host", opts.host, "--port", str(opts.port),
            "--schedule-policy", native, "--radix-cache-backend", BACKEND, "--disable-overlap-schedule"]
    if model.load_format != "auto":
        args += ["--load-format", model.load_format]
    for name, flag in ENGINE_ARGS.items():
        # a front end holding the backlog bounds it by SGLang's running slots: both read the same number
        bound = name == "max_running_requests" and deploy.holds_backlog and _given(opts.sglang_args, flag) is None
        if name in settings.engine_settings or bound:
            args += [flag, str(getattr(settings.engine, name))]
    if opts.device == "cpu":
        if "--max-total-tokens" not in args and _given(opts.sglang_args, "--max-total-tokens") is None:
            raise UserError("a CPU server needs its KV pool size (else SGLang sizes it from host memory): "
                            "--set engine.max_total_tokens=N or -- --max-total-tokens N", "--device cpu")
        args += ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
    args += opts.sglang_args
    env = {CONFIG_ENV: str(plugin_path.resolve()), "SGLANG_ENABLE_WAITING_PREFIX_REFRESH": "0",
           **{k: v for k, v in admission_env(settings.engine).items() if _admission_set(settings, k)}}
    if opts.device == "cpu":
        env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return args, env


def _admission_set(settings: Settings, var: str) -> bool:
    from prism.live.server import ADMISSION_ENV

    return any(v == var and name in settings.engine_settings for name, v in ADMISSION_ENV.items())


def running_slots(settings: Settings, opts: ServeOptions) -> int:
    """SGLang's ``--max-running-requests`` as the server gets it: after ``--``, else the settings' (which
    :func:`launch` passes when a front end holds the backlog)."""
    given = _given(opts.sglang_args, "--max-running-requests")
    if given is None:
        return settings.engine.max_running_requests
    try:
        slots = int(given)
    except ValueError:
        slots = 0
    if slots < 1:
        raise UserError(f"expected a positive whole number, got {given!r}", "--max-running-requests")
    return slots


def write_plugin(settings: Settings, opts: ServeOptions) -> Path:
    from prism.policies.registry import deployment_of

    deploy = deployment_of(settings.scheduler, settings.policy_configs)
    bound = running_slots(settings, opts) if deploy.holds_backlog else None
    out = prepare_out_dir(opts.out)
    path = out / "plugin.json"
    PluginConfig.serving(settings.scheduler, settings.eviction, settings.policy_configs, deploy, out,
                         bound).write(path)
    return path


def prepared(settings: Settings, model: ServedModel, opts: ServeOptions) -> tuple[list[str], dict[str, str]]:
    """:func:`launch`'s arguments and environment, then the plugin's settings file they name: a refusal of the
    arguments (a CPU server without its pool size) comes before anything is written."""
    args, env = launch(settings, model, opts, opts.out / "plugin.json")
    write_plugin(settings, opts)
    return args, env


def command_line(args: list[str], env: dict[str, str], python: str = "python") -> str:
    """The shell command an operator runs to start the same server themselves."""
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), python, "-m", "sglang.launch_server",
                     *map(shlex.quote, args)])


def serve(settings: Settings, model: ServedModel, opts: ServeOptions,
          on_ready: Callable[[str, ServerInstance], None] | None = None) -> int:
    """Start the server, check that the plugin runs in its scheduler, and keep it running until it exits
    (status 1, with its last error) or this process is interrupted (the server is stopped with it)."""
    check_serve(model, opts)
    args, env = prepared(settings, model, opts)
    for stale in ("events.jsonl", "counters.json"):
        (opts.out / stale).unlink(missing_ok=True)
    server = Server(args, env, opts.out / "server.log", opts.python)
    try:
        url = f"http://{opts.host}:{opts.port}"
        wait_healthy(url, opts.startup_timeout_s, server)
        instance = ServerInstance(0, url, opts.out, server)
        if instance.counters() is None:
            raise UserError(f"the prism plugin is not active in the server's scheduler (is prism-serve installed in "
                            f"its environment? see {server.log_path})")
        if on_ready is not None:
            on_ready(url, instance)
        while (why := server.dead()) is None:
            time.sleep(0.5)
        print(f"prism-live serve: {why}", file=sys.stderr)
        return 1
    finally:
        server.stop()


__all__ = ["ServeOptions", "serve", "launch", "prepared", "command_line", "check_host", "check_own_args", "check_serve",
           "write_plugin"]
