"""What a policy sees of an engine, and what it gives back.

Policies never import the simulator or SGLang. Both engines implement these small protocols, which is what
lets one policy object run in ``prism-sim`` and inside a real SGLang server:

* a :class:`PrefixIndex` answers "how many leading tokens of this prompt are cached?" without side effects;
* a :class:`WaitingRequest` is a request as a scheduler sees it (id, arrival, current segment order, tokens);
* a :class:`NodeView` is a radix-tree node as an eviction policy sees it.

A :class:`Scheduler` returns a :class:`Plan` (an order, plus new segment orders for the requests it
realigns); an :class:`EvictionPolicy` returns a sort key (smallest is evicted first). Neither owns engine
state. The two talk through :class:`DemandHints`, which the engine keeps up to date with the active segment
counts and which a demand-aware scheduler (QAS) fills with its published priorities.

Every policy class declares what the registry (``policies/registry.py``) needs of it (:class:`Policy`): its
name, its knob dataclass and how a run builds one; a scheduler also says how it is deployed
(:class:`Deployment`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Collection, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from prism.core import PRIV, REUSE, SYS, Segment

from prism.policies.anchors import ResidentSegments
from prism.policies.demand import DemandHints


@dataclass(frozen=True)
class Part:
    """One part of a policy and the settings that switch it off, for an ablation (``prism-sim sweep --ablate``):
    ``knobs`` (section -> knob values) set on the policy's run, or the policy ``replaced`` by another one."""

    name: str
    doc: str
    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    replaced: str | None = None


class Policy:
    """What the registry reads of a policy class.

    ``name``: the name runs use (``--scheduler NAME``, ``--eviction NAME``, ``--router NAME``); ``Knobs``: its
    knob dataclass (None: no knobs), filled from the YAML / ``--set`` section ``section`` (default: the name;
    DFS-weight reads LPM's); :meth:`build` makes a fresh policy for one run. For an ablation: ``parts``, what
    the policy adds, each switched off by its settings, and :meth:`base`, the policy it adds them to.
    ``clock_knobs``: the knobs that are durations on the engine's clock (a paced twin's clock runs D times
    slower, so its plugin multiplies them by D)."""

    # ClassVar: read from the class by the registry, and kept on the class where mypyc compiles a policy
    name: ClassVar[str] = ""
    Knobs: ClassVar[type | None] = None
    section: ClassVar[str | None] = None
    parts: ClassVar[tuple[Part, ...]] = ()
    clock_knobs: ClassVar[tuple[str, ...]] = ()  # knobs in seconds of the engine's clock, which a paced twin dilates

    @classmethod
    def base(cls, knobs: Any) -> str:
        """The registered policy a method with this policy is measured against, its *base engine*'s (with
        these knobs); the policy itself by default (it adds nothing to measure)."""
        return cls.name

    @classmethod
    def knob_section(cls) -> str | None:
        return None if cls.Knobs is None else (cls.section or cls.name)

    @classmethod
    def build(cls, knobs: Any, hints: "DemandHints", requests: Sequence[Any]) -> "Policy":
        """A policy for one run: ``knobs`` the validated dataclass (None without knobs), ``hints`` the run's
        demand hints, ``requests`` the trace (only an offline reference reads it)."""
        return cls(knobs) if cls.Knobs is not None else cls()


IN_ENGINE = "in_engine"
FRONT_END = "front_end"
#: what an admission front end holds: each window's arrivals (all released when it closes), or the backlog
#: (requests wait in its pending set while the backend is full; each window releases what the backend has room
#: for, an arrival that finds room and nothing held goes at once)
ARRIVALS, BACKLOG = "arrivals", "backlog"
FRONT_END_HOLDS = (ARRIVALS, BACKLOG)


@dataclass(frozen=True)
class Deployment:
    """How a scheduler meets the engine: ``in_engine`` (it orders the engine's waiting queue at every
    scheduling round), or ``front_end`` (a round every ``window_s`` seconds before an unmodified engine with a
    stock server's scheduler, over what the front end ``holds``: the window's arrivals, or the backlog)."""

    mode: str = IN_ENGINE
    window_s: float = 0.0
    holds: str = ARRIVALS

    @property
    def front_end(self) -> bool:
        return self.mode == FRONT_END

    @property
    def holds_backlog(self) -> bool:
        return self.front_end and self.holds == BACKLOG


@runtime_checkable
class PrefixIndex(Protocol):
    def match_len(self, key: bytes) -> int:
        """Tokens of ``key`` (int32 token bytes) that are cached, as a side-effect-free peek."""

    def match_path(self, key: bytes) -> list[tuple[int, int]]:
        """(position, end depth) of the cache nodes the cached part of ``key`` runs through (root excluded; the
        last may be matched only in part), a peek too. A position names a place in the tree (a split's upper
        part keeps it): sibling nodes sorted by position are in the order SGLang's tree keeps its children."""


class WaitingRequest(Protocol):
    id: int
    arrival: float
    segments: tuple[Segment, ...]  # the current order (after any realignment)
    prompt_len: int
    fixed_order: bool  # True: the reusable segments must keep their order (no alignment)

    @property
    def key(self) -> bytes:
        """The serialized prompt as int32 bytes."""


@runtime_checkable
class NodeView(Protocol):
    """A radix node as an eviction policy reads it. The fields SGLang's ``TreeNode`` has keep its names
    (``last_access_time``, ``hit_count``, ``parent``), so that the live cache hands SGLang's own nodes to a
    policy's ``key`` without a wrapper; ``kind``, ``seg_id`` and ``depth`` are prism's segment ownership, which
    both caches set by the rule of :mod:`prism.policies.anchors`."""

    kind: str  # "sys" | "reuse" | "priv": kind of the segment that owns the node's tokens
    seg_id: str
    last_access_time: float
    hit_count: int
    depth: int  # prompt offset of the node's end
    parent: "NodeView | None"  # None for the root (an offline reference walks a node's path with it)


class ResidentIndex(Protocol):
    """What an eviction policy may ask of the whole cache: resident nodes per segment id."""

    resident: ResidentSegments  # sys / reusable segment id -> resident nodes owned by it


@dataclass
class SchedContext:
    """One scheduling round's view of the engine."""

    now: float
    cache: PrefixIndex
    running: Sequence[WaitingRequest] = ()
    hints: DemandHints | None = None
    batch_hint: int = 0  # how many requests the engine can take this round (0: unknown)
    # the new tokens the engine can prefill this round (0: unknown): its admission stops once the requests it
    # took have used them up, each taking at least its uncached tokens
    token_budget: int = 0
    # how many requests at the head of the waiting queue were in it at the last round and not admitted then:
    # the last plan's order less its admitted head, as the engine kept it (or its own queue, under
    # ``Plan.keep_queue``); arrivals and retracted requests join after them. None: the engine does not say
    # (``policies/expected_queue.py``)
    kept: int | None = None


#: the lane of a request its plan does not label (requests.csv's ``lane``; the engine counts
#: ``admitted_<lane>_lane``): "hot", the name QAS gives to everything outside its cold lane
DEFAULT_LANE = "hot"


class LazyAlignment(Mapping):
    """A plan's ``align`` worked out on demand: the engine asks only for the requests it admits, so a
    scheduler computes a new segment order for those alone. Subclasses answer :meth:`get` (the default, None,
    for a request whose order stays) and iterate the ids of the requests they move."""

    def get(self, rid: int, default=None):
        raise NotImplementedError

    def __getitem__(self, rid: int) -> tuple[str, ...]:
        out = self.get(rid)
        if out is None:
            raise KeyError(rid)
        return out

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class Plan:
    """A scheduler's answer: the waiting requests in admission order, new reusable-segment orders, and the
    lane a request was ordered in where the scheduler has lanes (e.g. QAS's and k-LPM's FIFO "cold" picks)."""

    order: Iterable[Any]  # a list, but where ``keep_queue``
    align: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    lanes: Mapping[int, str] = field(default_factory=dict)  # request id -> lane label; absent: DEFAULT_LANE
    # True: the engine keeps its queue in its own order and only takes out what it admitted; ``order`` is the
    # order it tries the requests in, read no further than it admits (an iterator: k-LPM's picks, then its FIFO
    # order, where a list would copy the whole queue each round), and only an engine that says what it kept
    # (``SchedContext.kept``) is handed one
    keep_queue: bool = False

    def lane(self, request_id: int) -> str:
        return self.lanes.get(request_id, DEFAULT_LANE)


class Scheduler(Policy):
    """Orders the waiting queue; subclasses override :meth:`plan`."""

    @classmethod
    def deployment(cls, knobs: Any) -> Deployment:
        """How the scheduler is deployed with these knobs (default: inside the engine)."""
        return Deployment()

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        raise NotImplementedError

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        """Called with the requests the engine actually admitted this round."""

    def stats(self) -> dict[str, int]:
        return {}


def tier_of(node: NodeView) -> str:
    """The eviction tier a node falls in without protection: private suffix or reusable."""
    return "private" if node.kind == PRIV else "reusable"


class EvictionPolicy(Policy):
    """Gives each evictable node a sort key; the smallest key is evicted first.

    ``needs_anchors``: the cache must split nodes at segment boundaries so that each node belongs to one
    segment (demand-aware policies need that; plain LRU, like SGLang's, does not). ``offline``: it reads the
    trace's future (a reference, not a policy a server can run).
    """

    needs_anchors: ClassVar[bool] = False
    offline: ClassVar[bool] = False

    def __init__(self, hints: DemandHints | None = None) -> None:
        self.hints = hints or DemandHints()

    @classmethod
    def build(cls, knobs: Any, hints: DemandHints, requests: Sequence[Any]) -> "EvictionPolicy":
        return cls(knobs, hints) if cls.Knobs is not None else cls(hints)

    def prepare(self, cache: "ResidentIndex") -> None:
        """Called before each eviction pass (a policy may derive per-pass state, e.g. a protection set)."""

    def on_admit(self, request: WaitingRequest) -> None:
        """Called when the engine admits a request (an offline oracle tracks the future with it)."""

    def key(self, node: NodeView) -> tuple:
        """The node's eviction key: smaller goes first (ties: the older node). Two keys either differ before the
        shorter one ends or have the same length (a cache may lay a key's items out flat in its heap entries)."""
        raise NotImplementedError

    def lowered_keys(self) -> Collection[str] | None:
        """Called before each eviction pass, after :meth:`prepare`: the sys/reusable segment ids whose nodes'
        keys may have *decreased* since the last call (None: any node's key may have changed).

        A cache may keep its candidates ordered between passes and re-key a node lazily when it surfaces,
        which is exact as long as no key falls unreported; keys that only grow (access times, hit counts)
        need no report. The default reports everything: a policy that says nothing is re-keyed in full."""
        return None

    def tier(self, node: NodeView) -> str:
        return tier_of(node)


__all__ = ["Part", "Policy", "Deployment", "IN_ENGINE", "FRONT_END", "ARRIVALS", "BACKLOG", "FRONT_END_HOLDS",
           "PrefixIndex", "ResidentIndex", "WaitingRequest",
           "NodeView", "DemandHints", "SchedContext", "Plan", "DEFAULT_LANE", "Scheduler", "EvictionPolicy", "tier_of",
           "SYS", "REUSE", "PRIV"]
