"""The names of the decision counters a run reports (``summary.json``'s ``counters``), in one place.

The simulator's engine, a live SGLang server's plugin and the policies count under these names, so that a
simulated and a live run of the same method compare counter for counter. A name formed from a label (an
eviction tier, a scheduler's lane) is built by its function here. :class:`Counts` is what an engine and a
front end count in.
"""

from __future__ import annotations

# iterations and eviction
PREFILL_ITERATIONS = "prefill_iterations"
DECODE_ITERATIONS = "decode_iterations"
EVICTED_NODES = "evicted_nodes"
#: the tiers an eviction policy sorts nodes into (``EvictionPolicy.tier``)
TIERS = ("private", "reusable", "protected")

# admission
SCHEDULING_ROUNDS = "scheduling_rounds"  # the engine asked its scheduler for a plan
FRONT_ALIGNMENT_MOVES = "front_alignment_moves"  # requests admitted in a new segment order
FRONTEND_WINDOWS = "frontend_windows"  # windows an admission front end released
FRONTEND_HELD = "frontend_held"  # arrivals a backlog-holding front end held (the backend was full, or others waited)
FRONTEND_PASSED = "frontend_passed"  # arrivals it sent at once (the backend had room and nothing was held)

# retraction (SGLang's admission)
RETRACTIONS = "retractions"
RETRACTED_OUTPUT_TOKENS = "retracted_output_tokens"
REPREFILLED_TOKENS = "reprefilled_tokens"  # computed again when a retracted request is prefilled again
REPREFILL_HIT_TOKENS = "reprefill_hit_tokens"  # found cached then

# pacing a live twin (live/pacing.py)
PACED_BATCHES = "paced_batches"
PACED_OVER_BUDGET = "paced_over_budget"


def paced_over_budget(kind: str) -> str:
    """Paced batches of one kind (``prefill``, ``decode``) whose real time exceeded the budget."""
    return f"{PACED_OVER_BUDGET}_{kind}"


# the policies' own
QAS_ROUNDS = "qas_rounds"
QAS_BUCKETS = "qas_buckets"
QAS_AGED = "qas_aged"  # requests served first for having waited past qas.max_wait_s
CONTEXTPILOT_REORDERED = "contextpilot_reordered"  # requests whose documents it reordered
CONTEXTPILOT_SPLITS = "contextpilot_splits"  # index nodes split
CONTEXTPILOT_EVICTED = "contextpilot_evicted_requests"  # requests dropped from its index


def evicted_tokens(tier: str) -> str:
    """Tokens evicted from nodes of an eviction tier (one of :data:`TIERS`)."""
    return f"evicted_tokens_{tier}"


def hit_tokens(tier: str) -> str:
    """Tokens a live server found cached in nodes of a tier, over first admissions."""
    return f"hit_tokens_{tier}"


def admitted_lane(lane: str) -> str:
    """Admissions a scheduler ordered in ``lane`` (``hot``, QAS's and k-LPM's FIFO ``cold``, QAS's ``aged``)."""
    return f"admitted_{lane}_lane"


class Counts(dict):
    """Counts by counter name; a name not counted yet reads 0, as in ``collections.Counter``, which an engine's
    counters were. ``Counter`` defines ``__delitem__``, and so every ``counts[name] += n`` stored through a
    Python-level slot: 100 ns against 49 here, and an engine counts each iteration."""

    def __missing__(self, name: str) -> int:
        return 0


class _Names(dict):
    """name function's results by label, made on first use (an engine counts one per admission)."""

    def __init__(self, name) -> None:
        super().__init__()
        self._name = name

    def __missing__(self, label: str) -> str:
        out = self[label] = self._name(label)
        return out


#: admitted_lane by lane, made once per lane
ADMITTED_LANE = _Names(admitted_lane)


#: the per-tier names, made once (the engine counts one per evicted node)
EVICTED_TOKENS = {tier: evicted_tokens(tier) for tier in TIERS}

#: the counters a sweep's summary.csv shows, one column each
SWEEP_COUNTERS = (*EVICTED_TOKENS.values(), admitted_lane("hot"), admitted_lane("cold"), FRONT_ALIGNMENT_MOVES,
                  RETRACTIONS, REPREFILLED_TOKENS)
