"""Round robin routing: request k goes to instance k mod N, whatever the load or the caches. O(1)."""

from __future__ import annotations

from typing import Sequence

from prism.policies.base import WaitingRequest
from prism.policies.routing import InstanceView, Router


class RoundRobin(Router):
    name = "rr"

    def __init__(self) -> None:
        super().__init__()
        self.next = 0

    def route(self, request: WaitingRequest, views: Sequence[InstanceView], now: float) -> int:
        i = self.next % len(views)
        self.next = i + 1
        return i
