"""A sweep's runs on a Ray cluster (``prism-sim sweep --ray ADDRESS``): the same tasks as the process pool,
each simulated by a Ray task of one CPU; the results come back to the driver, which writes every run folder,
so the nodes need prism installed (``pip install -e ".[ray]"`` on each, same version) but no shared file
system. A trace given as a file must exist at the same path on every node (built-in specs ship with the
package). The simulation is deterministic, so the results are the bytes a process pool gives.

``ADDRESS`` is what ``ray.init`` takes: ``auto`` (the cluster this machine belongs to, started with
``ray start``), ``ray://HOST:10001`` (a remote cluster's client server) or ``HOST:6379``; ``local`` starts a
private Ray instance on this machine for the sweep and stops it after (even where ``RAY_ADDRESS`` or an
earlier ``ray start`` names a cluster, which ``ray.init()`` without an address would join). An address is
probed with one TCP connection first (:func:`check_reachable`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.parse
import warnings
from typing import Any, Iterator

from prism.errors import UserError


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError('--ray needs Ray, which is not installed: pip install -e ".[ray]"') from None
    return ray


@contextlib.contextmanager
def ray_session(address: str) -> Iterator[Any]:
    """Ray, connected to ``address`` for the block; a session this call starts is shut down after it, one
    already open is used as it is. ``prism-sim sweep --ray`` opens it before it writes anything, so that a
    missing Ray or an unreachable cluster leaves the output folder untouched."""
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        target = _bootstrap_address(ray, address)
        check_reachable(target, address)
        try:
            with warnings.catch_warnings():  # Ray's own warning of a client timeout: the error below says it
                warnings.filterwarnings("ignore", "Ray Client connection timed out", UserWarning)
                ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            why = " ".join(str(e).split())[:200]
            if (target or "").startswith("ray://") and os.environ.get("RAY_AUTH_MODE") != "token":
                # a client server that wants a token times out a client that sends none
                why += (" (a cluster with token authentication, the default since Ray 2.59, needs"
                        " RAY_AUTH_MODE=token and its token here: RAY_AUTH_TOKEN from `ray get-auth-token` on the"
                        " head node)")
            raise UserError(f"cannot reach a Ray cluster: {why}", f"--ray {address}") from None
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


PROBE_TIMEOUT_S = 5.0


def _bootstrap_address(ray, address: str) -> str | None:
    """The ``HOST:PORT`` or ``ray://HOST:PORT`` that ``ray.init(address)`` will connect to; None where it
    starts its own instance (``local``) or Ray finds no cluster to name (``ray.init`` then says so at once).
    ``auto`` is resolved as Ray resolves it (``RAY_ADDRESS``, then the cluster ``ray start`` last started
    here), by Ray's own function; should a Ray release move it, the probe is skipped, not the sweep."""
    if address == "local":
        return None
    if address != "auto":
        return address
    try:
        found = ray._private.services.get_ray_address_from_environment("auto", None)
    except Exception:  # noqa: BLE001 (Ray's own error for no cluster comes from ray.init, in one line)
        return None
    return found if isinstance(found, str) and found not in ("", "auto", "local") else None


def check_reachable(target: str | None, address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse a cluster address that does not accept a TCP connection within ``timeout_s``.

    ``ray.init`` retries an unreachable GCS (a mistyped port, a head node that died and left its address
    file behind) for about ten minutes, printing its own log lines, before it fails; a connection is all the
    GCS or the client server needs to be reached at all, so one attempt here gives the user a line instead."""
    if target is None:
        return
    where = f"--ray {address}"
    # an address auto found (RAY_ADDRESS, or the last `ray start`'s file) says where it came from
    found = " (found by Ray: RAY_ADDRESS or the cluster `ray start` last started here)" if address == "auto" else ""
    rest = target.split("://", 1)[1] if "://" in target else target
    try:
        parts = urllib.parse.urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None:
        raise UserError(f"expected auto, local, HOST:PORT or ray://HOST:PORT, got {target!r}{found}", where)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise UserError(f"cannot reach a Ray cluster at {host}:{port}{found}: {why}", where) from None


def execute_on_ray(tasks: list, address: str) -> Iterator[tuple[Any, Any]]:
    """(task, simulate_task(task)) for every task, in the order they finish."""
    from prism.sim.sweep import simulate_task

    if not tasks:
        return
    with ray_session(address) as ray:
        remote = ray.remote(num_cpus=1, max_retries=0)(simulate_task)
        pending = {remote.remote(t): t for t in tasks}
        waiting = list(pending)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            for ref in ready:
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise _failed_on_ray(ray, e, address) from None
                yield pending[ref], result


def _failed_on_ray(ray, err: Exception, address: str) -> Exception:
    """The error a sweep stops with when a run fails on the cluster (the runs finished so far are written, and
    a rerun does the rest). A run's own error (a trace file missing on that node) is its one line, as in a
    process pool; a node that cannot load the task (prism missing there, or another version: the task's
    arguments do not unpickle) or that died under it is one line that says so; any other exception is a bug
    in the run and keeps its traceback."""
    where = f"--ray {address}"
    cause = getattr(err, "cause", None)
    if isinstance(cause, UserError):
        return UserError(str(cause))
    if isinstance(err, ray.exceptions.RayTaskError) and cause is not None and not isinstance(
            cause, (ray.exceptions.RayError, ImportError)):
        return err
    text = str(cause if cause is not None else err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    why = " ".join((lines[-1] if lines else type(err).__name__).split())[:200]
    hint = ("; every node needs the same prism installed (pip install -e \".[ray]\")"
            if isinstance(cause, (ray.exceptions.RaySystemError, ImportError)) else "")
    return UserError(f"a run failed on the Ray cluster: {why}{hint}", where)
