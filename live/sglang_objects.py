"""SGLang's own scheduler objects built from prism's vocabulary, to run SGLang's code on prism's inputs.

``SGLangQueue`` holds a simulated SGLang ``RadixCache`` filled with given prompts and a ``SchedulePolicy``;
``order(waiting)`` turns prism requests into SGLang ``Req`` objects and lets ``calc_priority`` sort them. That is
what the parity tests compare prism's LPM and DFS-weight against, and what ``bench_control_plane`` times
beside QAS. Everything runs on the CPU; SGLang is imported only when a queue is made.
"""

from __future__ import annotations

from array import array
from typing import Iterable, Sequence

import numpy as np

from prism.core import TOKEN_DTYPE
from prism.errors import UserError


def _sglang():
    try:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.sampling.sampling_params import SamplingParams
    except ImportError as e:  # sglang, torch or one of their dependencies is missing
        raise UserError(f"SGLang is not importable ({e}); install the live extra: pip install -e '.[live]'") from e
    return Req, SchedulePolicy, InsertParams, RadixCache, RadixKey, SamplingParams


def token_array(tokens: np.ndarray | Sequence[int]) -> array:
    """Token ids as SGLang keeps them (``array('q')``)."""
    return array("q", np.asarray(tokens, dtype=np.int64).tobytes())


class SGLangQueue:
    """SGLang's ``SchedulePolicy`` over a simulated radix tree that caches ``cached`` (token arrays)."""

    def __init__(self, cached: Iterable[np.ndarray], policy: str = "lpm", page_size: int = 1) -> None:
        Req, SchedulePolicy, InsertParams, RadixCache, RadixKey, SamplingParams = _sglang()
        self._Req, self._RadixKey, self._SamplingParams = Req, RadixKey, SamplingParams
        self.tree = RadixCache.create_simulated(page_size=page_size)
        for tokens in cached:
            self.tree.insert(InsertParams(key=RadixKey(token_ids=token_array(tokens))))
        self.policy = SchedulePolicy(policy, self.tree, enable_hierarchical_cache=False,
                                     enable_priority_scheduling=False, schedule_low_priority_values_first=False)

    def requests(self, waiting: Sequence) -> list:
        """SGLang ``Req`` objects for prism waiting requests (rid = the request id, prompt = its key)."""
        return [self._Req(str(r.id), "", token_array(np.frombuffer(r.key, dtype=TOKEN_DTYPE)),
                          self._SamplingParams(max_new_tokens=1)) for r in waiting]

    def sort(self, reqs: list) -> list:
        """One ``calc_priority`` round: sorts ``reqs`` in place, as SGLang's scheduler does, and returns it."""
        self.policy.calc_priority(reqs)
        return reqs

    def order(self, waiting: Sequence) -> list[int]:
        """The ids of ``waiting`` in the order SGLang's policy puts them."""
        return [int(r.rid) for r in self.sort(self.requests(waiting))]
