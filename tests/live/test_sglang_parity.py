"""prism's LPM and DFS-weight against SGLang's own ``SchedulePolicy.calc_priority`` on the same queues.

Needs the ``live`` extra (sglang with torch); skipped where SGLang does not import.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("sglang.srt.managers.schedule_policy", exc_type=ImportError)

from prism.core import PRIV, REUSE, SYS, SegmentTable, serialize  # noqa: E402
from prism.live.sglang_objects import SGLangQueue  # noqa: E402
from prism.policies.base import SchedContext  # noqa: E402
from prism.policies.lpm import LPM, DFSWeight  # noqa: E402
from prism.sim.radix_cache import RadixCache  # noqa: E402

TABLE = SegmentTable()


class W:
    """A waiting request: a system prompt, reusable passages and a private question of `priv` tokens."""

    def __init__(self, rid, skeleton, priv, sys_len):
        self.id, self.arrival, self.fixed_order = rid, float(rid), False
        self.segments = (TABLE.segment(f"sys{sys_len}", SYS, sys_len), *(TABLE.segment(s, REUSE, 24) for s in skeleton),
                         TABLE.segment(f"q{rid}", PRIV, priv))
        self.key = serialize(self.segments).tobytes()
        self.prompt_len = len(self.key) // 4


passages = st.lists(st.sampled_from("abcdefgh"), max_size=3, unique=True)
# system prompts of 8 and 40 tokens: below and above SGLang's 32-token in-batch thresholds
requests = st.tuples(passages, st.integers(1, 40), st.sampled_from([8, 40]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queue=st.lists(requests, min_size=1, max_size=40), cached=st.lists(requests, max_size=8),
       policy=st.sampled_from(["lpm", "dfs-weight"]), page=st.sampled_from([1, 4]))
def test_orders_match_sglang(queue, cached, policy, page):
    cached_reqs = [W(-1 - i, *spec) for i, spec in enumerate(cached)]
    waiting = [W(i, *spec) for i, spec in enumerate(queue)]
    cache = RadixCache(None, page)
    for r in cached_reqs:
        cache.insert(r.key, 0.0)
    ours = (LPM() if policy == "lpm" else DFSWeight()).plan(waiting, SchedContext(0.0, cache))
    sglang = SGLangQueue([serialize(r.segments) for r in cached_reqs], policy, page)
    assert [r.id for r in ours.order] == sglang.order(waiting)
