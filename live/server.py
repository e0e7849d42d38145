"""Starting, watching and stopping an SGLang server process.

The server's KV admission knobs are environment variables read by SGLang at start
(:func:`admission_env`, from the run's :class:`~prism.settings.EngineConfig`): a server that prism did not
start keeps its own (:func:`check_attachable` refuses a run that sets them).

The server runs in its own process group (``python -m sglang.launch_server`` starts a tokenizer manager, a
scheduler and a detokenizer), with its output in a log file. Stopping sends SIGTERM to the whole group, waits,
then SIGKILL: no orphan process survives a finished, failed or interrupted run.
"""

from __future__ import annotations

import atexit
import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Sequence

from prism.errors import UserError
from prism.interrupts import InterruptsHeld, parent_death_signal
from prism.settings import EngineConfig

#: EngineConfig field -> the environment variable of SGLang 0.5.23 (``srt/environ.py``) that sets it
ADMISSION_ENV = {
    "init_new_token_ratio": "SGLANG_INIT_NEW_TOKEN_RATIO",
    "min_new_token_ratio_factor": "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR",
    "new_token_ratio_decay_steps": "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS",
    "retract_decode_steps": "SGLANG_RETRACT_DECODE_STEPS",
    "clip_max_new_tokens": "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION",
}


def admission_env(engine: EngineConfig) -> dict[str, str]:
    """SGLang's admission and retraction knobs of a run as the server's environment (``repr`` keeps a float
    exact; ``schedule_conservativeness`` stays 1, so the initial ratio is the knob itself)."""
    return {var: repr(getattr(engine, name)) for name, var in ADMISSION_ENV.items()}


def check_attachable(engine: EngineConfig, where: str = "settings") -> None:
    """A server given by ``--url`` was started with its own environment: refuse a run that changes an
    admission knob from SGLang's default (the server would silently not honour it)."""
    default = EngineConfig()
    for name, var in ADMISSION_ENV.items():
        if getattr(engine, name) != getattr(default, name):
            raise UserError(f"engine.{name}: a server given by --url keeps its own {var}; start that server with "
                            f"{var}={getattr(engine, name)!r} and leave the setting at its default", where)


def http_json(url: str, payload: dict | None = None, timeout: float = 10.0) -> object:
    """GET (or POST ``payload``) and decode the JSON answer; '' for an empty body."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    try:
        return json.loads(body) if body else ""
    except json.JSONDecodeError:
        return body.decode(errors="replace")


DEFAULT_PORTS = {"http": 80, "https": 443}  # where a URL without a port connects


def _unreachable(url: str, error: BaseException) -> str | None:
    """Why nothing can ever answer at ``url`` (a refused connection, a host name that does not resolve), or
    None for a failure that waiting may cure (a timeout, a server still starting that answers 503)."""
    reason = getattr(error, "reason", error)
    parts = urllib.parse.urlsplit(url)
    if isinstance(reason, ConnectionRefusedError):
        port = "" if parts.port else f" (the URL names no port: {parts.scheme}'s {DEFAULT_PORTS[parts.scheme]})"
        return f"nothing listens at {url}{port}: connection refused"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host {parts.hostname!r} of {url}: {reason.strerror or reason}"
    return None


def wait_healthy(url: str, timeout: float, proc: "Server | None" = None) -> None:
    """Poll ``/health`` until it answers 200; raise with the reason if the process dies or time runs out. A
    server given by URL (no ``proc``) is one line at once where nothing that waiting could cure answers: it
    refuses the connection or its host does not resolve (nothing is starting there: a server prism starts
    refuses connections until it listens), it answers in something other than HTTP, or it answers that it has
    no ``/health`` (404 and the like: not an SGLang server, which answers 200, or 503 while it starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and (why := proc.dead()):
            raise UserError(why)
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2.0) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            if proc is None and 400 <= e.code < 500 and e.code not in (408, 429):
                raise UserError(f"the server at {url} answers HTTP {e.code} to /health: not an SGLang server?",
                                "--url") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            if proc is None and (why := _unreachable(url, e)):
                raise UserError(why, "--url") from None
        except http.client.HTTPException as e:  # bytes that are not HTTP
            if proc is None:
                raise UserError(f"the server at {url} does not answer HTTP ({type(e).__name__}: "
                                f"{str(e)[:80]!r})", "--url") from None
        time.sleep(0.25)
    raise UserError(f"the server at {url} did not become healthy within {timeout:.0f} s"
                    + (f" (log: {proc.log_path})" if proc else ""))


def flush_cache(url: str, attempts: int = 20) -> None:
    """Empty the server's radix cache (SGLang refuses while requests run: retry briefly)."""
    for _ in range(attempts):
        try:
            http_json(f"{url}/flush_cache", {})
            return
        except urllib.error.HTTPError:
            time.sleep(0.25)
    raise UserError(f"the server at {url} refused /flush_cache")


def check_port(host: str, port: int) -> None:
    """A port something already listens on, or a host that is not an address of this machine, is one line now,
    not a server that dies after its start-up (or a run that talks to whatever holds the port)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise UserError(f"cannot resolve {host!r}: {e.strerror or e}", "--host") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is in use: pick another with --port", "--port") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise UserError(f"cannot listen on {host} ({e.strerror}): not an address of this machine",
                                "--host") from None
            raise UserError(f"cannot listen on {host} port {port} ({e.strerror or e})", "--port") from None


#: where the servers prism starts listen
SERVER_HOST = "127.0.0.1"

_RUNNING: set["Server"] = set()  # servers started and not yet stopped, stopped at exit whatever happened


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop(grace=2.0)


#: a watchdog beside each server: once the process that started it is gone (its parent changes: killed by
#: SIGKILL, which runs no code of its own), it kills the server's whole process group. The kernel's
#: parent-death signal kills the launcher anyway, but SGLang's scheduler and detokenizer arm theirs only once
#: their imports are done (``kill_itself_when_parent_died``, ``srt/utils/common.py``): one still importing
#: would outlive a launcher killed meanwhile. Signals meant for prism-live (Ctrl-C at the terminal) are its.
_WATCHDOG = """
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
parent, group = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == parent:
    time.sleep(0.2)
try:
    os.killpg(group, signal.SIGKILL)
except OSError:
    pass
"""


class Server:
    """``python -m sglang.launch_server ARGS`` (or another ``module``: sglang-router's launcher) in its own process
    group, which never outlives this process: it is stopped by :meth:`stop` (a run's every way out), else at this
    interpreter's exit, and should this process die without either (SIGKILL), the kernel kills the launcher and a
    watchdog the rest of the group."""

    def __init__(self, args: Sequence[str], env: dict[str, str], log_path: Path, python: str | None = None,
                 module: str = "sglang.launch_server", name: str = "SGLang server"):
        self.args = list(args)
        self.log_path = log_path
        self.name = name
        self._log = log_path.open("ab")
        with InterruptsHeld():  # started and known, or neither
            self.proc = subprocess.Popen([python or sys.executable, "-m", module, *self.args],
                                         env={**os.environ, **env}, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=parent_death_signal())
            _RUNNING.add(self)
            self._watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self.proc.pid)],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL)

    def dead(self) -> str | None:
        """Why the server is gone, or None while it runs."""
        rc = self.proc.poll()
        if rc is None:
            return None
        how = f"exited with status {rc}"
        if rc < 0:
            try:
                how = f"was killed by {signal.Signals(-rc).name}"
            except ValueError:  # a real-time signal: no name
                how = f"was killed by signal {-rc}"
        why = self.last_error()
        return f"the {self.name} {how}" + (f": {why}" if why else "") + f" (log: {self.log_path})"

    def last_error(self) -> str:
        """The exception its log ends with (the line after its last traceback's frames), or '' where the log
        holds no traceback: a line that merely mentions an error (a start-up warning) says nothing of why the
        server went, and a server killed by a signal writes nothing."""
        try:
            lines = [ln.rstrip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        # SGLang logs a crashed process's traceback inside a line of its own ("[time TP0] Scheduler hit an
        # exception: Traceback (most recent call last):"), its frames and exception on the lines after
        starts = [i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln]
        if not starts:
            return ""
        for ln in lines[starts[-1] + 1:]:
            if not ln.startswith((" ", "\t")):  # frames are indented; the exception is not
                return ln.strip()[-240:]
        return ""

    def stop(self, grace: float = 10.0) -> None:
        with InterruptsHeld():  # a second Ctrl-C or SIGTERM must not cut the stop short
            self._stop(grace)
        _RUNNING.discard(self)

    def _stop(self, grace: float) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # children that outlived the leader (the scheduler, the detokenizer) share its process group
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._watchdog.kill()
        self._watchdog.wait()
        self._log.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
