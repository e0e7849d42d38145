"""Least outstanding requests: send to the instance with the fewest requests running or queued (BS); ties
rotate (the first tied instance after the previous choice), so idle instances take turns. O(N) per request."""

from __future__ import annotations

from typing import Sequence

from prism.policies.base import WaitingRequest
from prism.policies.routing import InstanceView, Router, argmin_from, outstanding


class LeastLoad(Router):
    name = "least_load"

    def __init__(self) -> None:
        super().__init__()
        self.last = -1

    def route(self, request: WaitingRequest, views: Sequence[InstanceView], now: float) -> int:
        self.last = argmin_from([outstanding(v) for v in views], self.last + 1)
        return self.last
