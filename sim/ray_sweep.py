"""A sweep's runs on a Ray cluster (``prism-sim sweep --ray ADDRESS``): the same tasks as the process pool,
each simulated by a Ray task of one CPU; the results come back to the driver, which writes every run folder,
so the nodes need prism installed (``pip install -e ".[ray]"`` on each, same version) but no shared file
system. A trace given as a file must exist at the same path on every node (built-in specs ship with the
package). The simulation is deterministic, so the results are the bytes a process pool gives.

``ADDRESS`` is what ``ray.init`` takes: ``auto`` (the cluster this machine belongs to, started with
``ray start``), ``ray://HOST:10001`` (a remote cluster's client server) or ``HOST:6379``; ``local`` starts a
private Ray instance on this machine for the sweep and stops it after.
"""

from __future__ import annotations

import contextlib
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
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            why = " ".join(str(e).split())[:200]
            raise UserError(f"cannot reach a Ray cluster: {why}", f"--ray {address}") from None
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


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
                yield pending[ref], ray.get(ref)
