"""SGLang router's cache-aware routing policy (sglang-router, the Rust router on PyPI; ``cache_aware``, its
default policy), over the simulator's token prompts.

The rule, as sglang-router 0.3.2 (the PyPI release) implements it (``src/policies/cache_aware.rs``; read off the
installed wheel's behaviour, see below):

1. **Imbalance check** on the workers' loads (requests the router has in flight there): the system is
   imbalanced iff ``max_load - min_load > balance_abs_threshold`` **and**
   ``max_load > balance_rel_threshold * min_load``. Then the request goes to the least loaded worker
   (shortest queue), and its prompt is still recorded in that worker's approximate tree.
2. Otherwise **cache affinity**: find the worker whose approximate tree (:mod:`prism.policies.approx_tree`:
   the prompts the router sent there) shares the longest prefix with the prompt. If
   ``match_rate = matched / prompt length > cache_threshold`` the request goes there; else to the least
   loaded worker. (Earlier releases sent it to the worker whose tree was smallest; 0.3.2 does not: in front of
   two stub workers, a prompt sharing nothing went to the idle worker with the large tree, not to the busy one
   with the small tree, ``tests/live/test_live_router.py``.) The prompt is inserted into the chosen worker's
   tree.
3. Every ``eviction_interval_s`` each tree is cut back to ``max_tree_size`` by dropping least recently used
   leaves.

Published defaults (sglang-router's launcher, ``sglang_router/router_args.py``, and the ``--help`` of
``python -m sglang_router.launch_router``): ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64,
``balance_rel_threshold`` 1.5, ``eviction_interval_secs`` 60 (``router_args.py`` line 36 of 0.3.2; the router
logs the same five values at start, ``src/server.rs`` line 794), ``max_tree_size`` 2**26 (the Rust library's own
``CacheAwareConfig::default()`` differs: 0.5 / 32 / 1.1 / 30 / 10000; a router started from the command line
uses the launcher's, and so do we).

Choices where the router is not exact about its own behaviour or works on other units:

* prompts are token ids, so match rates and tree sizes count tokens, not characters;
* ties of load (below the threshold, and when imbalanced) go to the first worker, as Rust's ``min_by_key`` does
  (the first of equal minima): 0.3.2 sent six unrelated requests in a row, each finished before the next, all to
  one worker (``tests/live/test_live_router.py``); which one is the router's own worker order (not the ports'),
  here always instance 0, so live and simulated placements compare up to a renaming of the instances; several
  workers with the same longest match: the router takes whichever tenant its tree node holds; we take the least
  loaded of them, then the first;
* the load is the instance's outstanding requests (running + queued) as the cluster's view reports them,
  which the router tracks itself (incremented on routing, decremented on completion).

Cost per request: one walk of each worker's tree (N memcmp descents) and one insert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from prism.config import fraction, nonneg, positive
from prism.policies.approx_tree import ApproxTree
from prism.policies.base import WaitingRequest
from prism.policies.routing import InstanceView, Router, outstanding


@dataclass
class CacheAwareConfig:
    cache_threshold: float = fraction(0.3, "match rate above which the longest-match worker is chosen")
    balance_abs_threshold: int = nonneg(64, "imbalanced if max load - min load exceeds this (and ...)")
    balance_rel_threshold: float = positive(1.5, "... max load exceeds this times min load")
    eviction_interval_s: float = positive(60.0, "seconds between evictions of the approximate trees")
    max_tree_size: int = positive(2 ** 26, "tokens each approximate tree keeps after an eviction")


def _first_min(scores: Sequence[float]) -> int:
    """The first index of the smallest score (Rust's ``min_by_key``)."""
    return min(range(len(scores)), key=scores.__getitem__)


def imbalanced(loads: Sequence[int], cfg: CacheAwareConfig) -> bool:
    """The router's imbalance test: both thresholds exceeded."""
    hi, lo = max(loads), min(loads)
    return hi - lo > cfg.balance_abs_threshold and hi > cfg.balance_rel_threshold * lo


class CacheAware(Router):
    name = "cache_aware"
    Knobs = CacheAwareConfig

    def __init__(self, cfg: CacheAwareConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or CacheAwareConfig()
        self.trees: list[ApproxTree] = []
        self.next_eviction = self.cfg.eviction_interval_s

    def route(self, request: WaitingRequest, views: Sequence[InstanceView], now: float) -> int:
        cfg, n = self.cfg, len(views)
        if not self.trees:
            self.trees = [ApproxTree() for _ in range(n)]
        if now >= self.next_eviction:
            for tree in self.trees:
                tree.evict_to(cfg.max_tree_size)
            self.next_eviction = now + cfg.eviction_interval_s
        loads = [outstanding(v) for v in views]
        key = request.key
        if imbalanced(loads, cfg):
            choice = _first_min(loads)
            self.count("route_balance")
        else:
            matched = [t.match_len(key) for t in self.trees]
            best = max(matched)
            if request.prompt_len and best / request.prompt_len > cfg.cache_threshold:
                tied = [i for i in range(n) if matched[i] == best]
                choice = _first_min([loads[i] if i in tied else float("inf") for i in range(n)])
                self.count("route_cache_hit")
            else:  # 0.3.2: the least loaded worker (not the smallest tree)
                choice = _first_min(loads)
                self.count("route_cache_miss")
        self.trees[choice].insert(key, now)
        return choice
