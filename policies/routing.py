"""What a routing policy sees of a cluster's instances, and what it gives back.

A router stands in front of N engine instances and sends each arriving request to one of them. Like the
schedulers, a routing policy never imports an engine: it sees each instance through :class:`InstanceView`, a
small read-only protocol that the simulator's cluster (``sim/cluster.py``) implements and that a live
dispatcher in front of SGLang servers can implement from their load reports:

* ``running``: requests admitted and not finished; ``queued``: requests routed there and not yet admitted
  (BS = running + queued is the instance's outstanding load);
* ``queued_prefill_tokens``: the uncached prompt tokens of its queued requests (each estimated when it was
  routed, as LMetric's P counts them);
* ``match_len(key)``: a side-effect-free peek of that instance's prefix cache (tokens of ``key`` cached).

A view may be exact or stale (the cluster refreshes its load figures every ``view_interval_s``); a policy
cannot tell and must not care. :meth:`Router.route` returns the index of the chosen instance. A router keeps
only its own state (a round-robin cursor, an approximate tree, LMetric's hot-instance streaks).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from prism.policies.base import Policy, WaitingRequest


@runtime_checkable
class InstanceView(Protocol):
    index: int  # position in the cluster, 0..N-1
    running: int
    queued: int
    queued_prefill_tokens: int

    def match_len(self, key: bytes) -> int:
        """Tokens of ``key`` (int32 token bytes) cached on this instance: a peek, no side effects."""


def outstanding(view: InstanceView) -> int:
    """BS: requests on the instance, running or queued."""
    return view.running + view.queued


def argmin_from(scores: Sequence[float], start: int) -> int:
    """Index of the smallest score; ties go to the first one at or after ``start`` (cyclically), so that equal
    instances take turns instead of the lowest index taking every tie."""
    n = len(scores)
    best, best_i = None, -1
    for k in range(n):
        i = (start + k) % n
        if best is None or scores[i] < best:
            best, best_i = scores[i], i
    return best_i


class Router(Policy):
    """Chooses an instance for each request; subclasses override :meth:`route`.

    ``reads_queued_prefill``: the policy reads ``queued_prefill_tokens`` (the cluster then peeks the chosen
    instance's cache once per request to keep that figure; other policies spare it)."""

    reads_queued_prefill = False

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}

    def route(self, request: WaitingRequest, views: Sequence[InstanceView], now: float) -> int:
        raise NotImplementedError

    def count(self, name: str, by: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + by

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


__all__ = ["InstanceView", "Router", "outstanding", "argmin_from"]
