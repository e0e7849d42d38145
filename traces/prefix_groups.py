"""The ``prefix_groups`` workload: a service whose requests share one of a few long prefixes.

Each request is one group's shared prefix (``prefix_tokens``, a ``sys`` segment: a system prompt, a tenant's
instructions or few-shot examples) followed by its own private tokens (``private_tokens``), and decodes
``output_len`` tokens. Requests pick their group independently: uniformly, or with Zipf(``zipf_s``) weights
over the group ranks (group ``g0`` the most popular). This is the shape that inference simulators are
compared on (e.g. 20 groups of 640 shared + 128 private tokens at 50 QPS: ``traces/prefix20.yaml``).

With uniform popularity the infinite-cache hit rate has a closed form: a request hits its whole prefix
exactly when its group was drawn before, so over n requests and G groups the expected hit rate is
``prefix / (prefix + private) · (n − G·(1 − (1 − 1/G)^n)) / n``.

Content (groups) and arrival times use separate random streams: changing ``qps`` never changes a prompt.
Cost: O(n) numpy draws and one segment reference per request (prefix segments are shared objects). Every
group's prefix segment is made up front, so ``groups`` is bounded by MAX_GROUPS (MAX_REQUESTS: a trace draws one
group per request, so more are never all seen; at the bound the segments take about 350 MB and 4 s).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from prism.config import MAX_REQUESTS, MAX_TOKENS, MAX_ZIPF_S, choice, positive, rate, tokens
from prism.core import PRIV, SYS, Request, SegmentTable

from prism.traces.arrivals import GeneratedTraceSpec, streams
from prism.traces.trace import Trace

POPULARITY = ("uniform", "zipf")
MAX_GROUPS = MAX_REQUESTS


@dataclass
class PrefixGroupsSpec(GeneratedTraceSpec):
    kind: str = "prefix_groups"
    qps: float = rate(50.0, "mean arrival rate, requests/s")
    groups: int = positive(20, "groups, each with its own shared prefix", le=MAX_GROUPS)
    prefix_tokens: int = tokens(640, "tokens of a group's shared prefix")
    private_tokens: int = tokens(128, "private tokens of each request, after its group's prefix")
    popularity: str = choice("uniform", POPULARITY, "how requests pick their group: uniform, or zipf over ranks")
    zipf_s: float = positive(1.0, "Zipf exponent over the group ranks (popularity: zipf)", le=MAX_ZIPF_S)

    def __post_init__(self) -> None:
        if self.prefix_tokens + self.private_tokens > MAX_TOKENS:
            raise ValueError(f"field 'private_tokens': a prompt of {self.prefix_tokens} + {self.private_tokens} "
                             f"tokens is longer than {MAX_TOKENS}")

    def group_weights(self) -> np.ndarray:
        """The probability of each group, by rank."""
        if self.popularity == "uniform":
            return np.full(self.groups, 1.0 / self.groups)
        w = np.arange(1, self.groups + 1, dtype=float) ** -self.zipf_s
        return w / w.sum()


def content(spec: PrefixGroupsSpec) -> Trace:
    """The prompts, in arrival order (their arrival times: ``spec.arrive``)."""
    rng = streams(spec.seed)[0]
    if spec.popularity == "uniform":
        groups = rng.integers(0, spec.groups, spec.num_requests)
    else:
        groups = rng.choice(spec.groups, spec.num_requests, p=spec.group_weights())
    table = SegmentTable()
    prefixes = [table.segment(f"g{g}", SYS, spec.prefix_tokens) for g in range(spec.groups)]
    requests = [Request(rid, 0.0, (prefixes[g], table.segment(f"q{rid}", PRIV, spec.private_tokens)), spec.output_len)
                for rid, g in enumerate(groups.tolist())]
    return Trace(requests, table, "prefix_groups", asdict(spec))
