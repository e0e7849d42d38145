"""The paced twin: every forward pass lasts what the cost model predicts for its batch, times a dilation D.

A tiny CPU model then stands in for the profile's GPU: SGLang's scheduler, radix cache, admission,
retraction and prism's policies are the real ones, and only the step times are modelled (DESIGN §6).

Anchoring: a batch's budget runs from the previous batch's *target* end while batches run back to back, so
the scheduler's own CPU time between batches (about 1.5 ms real) is absorbed instead of leaking into every
step; after an idle spell it runs from the start of the loop iteration that picked the work up. The pacer
sleeps to half a millisecond before the target and busy-waits the rest. A batch whose real forward already
overran its budget is counted (``paced_over_budget``) and ends when it ends: the twin is then slower than the
profile, and the run says so.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Sequence

from prism.calibration.cost_model import CostModel
from prism.counters import PACED_BATCHES, PACED_OVER_BUDGET, paced_over_budget

SPIN_S = 0.0005


class Pacer:
    def __init__(self, cost: CostModel, dilation: float, counters: Counter | None = None) -> None:
        if dilation <= 0:
            raise ValueError("dilation must be positive")
        self.cost = cost
        self.dilation = dilation
        self.counters = counters if counters is not None else Counter()
        self._target_end = 0.0
        self.max_overrun_s = 0.0
        self._kind = "decode"

    def budget(self, extend: bool, new: Sequence[int], cached: Sequence[int], context: int, batch: int) -> float:
        """Real seconds this batch should last."""
        self._kind = "prefill" if extend else "decode"
        t = self.cost.prefill_time(new, cached) if extend else self.cost.decode_time(batch, context)
        return t * self.dilation

    def reset(self) -> None:
        """Forget what came before (the server's cache was flushed: a new run starts)."""
        self._target_end = 0.0
        self.max_overrun_s = 0.0

    def start(self, now: float, after_idle: bool, iteration_start: float) -> float:
        """Where this batch's budget starts: the previous target end, or the iteration start after idling."""
        if after_idle or self._target_end <= 0.0:
            return iteration_start
        return self._target_end

    def finish(self, anchor: float, budget: float) -> float:
        """Wait out the rest of the budget from ``anchor``; returns the batch's end (real clock). After an
        overrun, ``overrun_s`` says by how much (else 0)."""
        self.overrun_s = 0.0
        target = anchor + budget
        self._target_end = target
        now = time.monotonic()
        self.counters[PACED_BATCHES] += 1
        if now > target:
            over = self.overrun_s = now - target
            self.counters[PACED_OVER_BUDGET] += 1
            self.counters[paced_over_budget(self._kind)] += 1
            self.max_overrun_s = max(self.max_overrun_s, over)
            self._target_end = now
            return now
        if target - now > SPIN_S:
            time.sleep(target - now - SPIN_S)
        while time.monotonic() < target:
            pass
        return target
