"""QAS compiled: the rounds of :class:`~prism.policies.qas.QAS` (the readable definition, DESIGN §3) as
compiled passes over a request matrix, the implementation the registry runs.

A plain-Python round is 49-69x slower (4.7 ms at 128 waiting requests, against SGLang's own 1.5 ms for
LPM), which is why this exists; ``tests/test_qas.py`` holds it equal to :class:`~prism.policies.qas.QAS`,
round after round, on random queues. Change the definition there first.

Cost per round: O(S) in queued segment occurrences S (times kappa for the signatures), in one compiled call
(``policies.qas_round.plan_round``) of three passes over the queue: counters and priorities; signatures;
buckets, scores and lanes; the starvation bound and the front alignment of the order's head (the
``batch_hint`` requests the engine is about to take) end the same call. Buckets and the FIFO order come from
counting sorts (rows are numbered in FIFO order), bucket ranking from a sort of the buckets; no all-pairs
work. Front alignment (a sort of one request's few segments) runs only for that head and, on demand, for other
requests the engine admits. Each kernel call costs a live server 35-60 us with SGLang's work in the CPU's
caches (``benchmarks/bench_plugin_round.py``), so a plan makes one and a dispatch one; a round of one request
(a backlog front end's arrival that finds room, a lone waiting request) makes none: it is a few lines of Python,
and its dispatch publishes only the segments whose P̂ may have changed (``_plan_one``, ``_publish_changes``), as
does the dispatch of a short round (an engine's, below the knee) that the engine took whole.
Its dispatch costs the round's segments, the taken rows' and those whose P̂ may have moved since the last
publication (a(r) changed; a queue or batch term then). The kernels keep an entry per segment numbered (P(r; ∅),
the segment's place among a round's, the last P̂) and read only those the round writes (a sparse set), so no
round pays for every segment QAS has seen (DESIGN §3; ``docs/live.md``, *A server that runs for days*).
Per request, QAS keeps its segment indices in a matrix row registered once, on the request's first round.
Finding the rows of a queue is a lookup per request, which at hundreds of requests costs as much as the
compiled round; so QAS notes the queue it expects next (its last order minus what the engine admitted) and
looks up only the requests past the part of the queue that matches it.

Loading numba's compiled kernels costs a process about 0.3-0.4 s (``policies.qas_round``: *Start*). So a
simulation starts with the same kernels compiled ahead of time where the install built them
(``policies.qas_aot``: a C extension that imports in milliseconds, its calls about 6 us dearer than numba's),
else interpreted (about 0.2 ms a round of a few requests), until its rounds have cost about twice what loading
numba's would have over numba's own; then numba's. A round of one request almost never calls a kernel (its
dispatch does where it cannot publish in Python: the first, or after a(r) was read afresh), so how long a run is
says little of how many kernel rounds it makes (prefix20 at 204,800 requests below the knee: one); only a live
server, which warms them before it serves, takes numba's from its first round. Which kernels run changes no
result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from operator import is_
from types import SimpleNamespace
from typing import Collection, Iterator, NamedTuple, Sequence

import numpy as np

from prism.core import PRIV, REUSE
from prism.counters import QAS_AGED, QAS_BUCKETS, QAS_ROUNDS

from prism.policies import qas_aot
from prism.policies.base import DemandHints, LazyAlignment, Plan, SchedContext, WaitingRequest
from prism.policies.qas import QAS, QASConfig
from prism.policies.qas_round import INTERPRETED, Dispatch, Params, Prompts, Round, compiled


class RequestTable:
    """Each request's segment indices in a growing matrix, registered on first sight.

    Column 0 holds the request's system segment (-1 without one), the rest its reusable segments in prompt
    order (-1 padded): the counters read the whole row, signatures and utilities only the reusable part.
    Rows are numbered in registration order; while requests are first seen in FIFO (arrival, id) order, as
    an engine's queue shows them, the row number *is* the FIFO position and no round sorts by age.
    """

    def __init__(self) -> None:
        self.segment_index: dict[str, int] = {}  # segment id -> index, in first-seen order
        self.segment_names: list[str] = []  # index -> segment id
        self.row_of: dict[int, int] = {}  # request id -> row
        self.n_rows = 0
        self.segments = np.full((64, 9), -1, dtype=np.int64)
        self.n_reusable = np.zeros(64, dtype=np.int64)
        self.fixed_order = np.zeros(64, dtype=bool)
        self.arrival = np.zeros(64)
        self.request_id = np.zeros(64, dtype=np.int64)
        self.width = 1  # columns in use: 1 + the most reusable segments of a row
        self.prompts = self._prompts()
        self.rows_in_fifo_order = True  # rows were registered in (arrival, id) order
        self._expected: tuple[Sequence[WaitingRequest], np.ndarray] = ((), np.zeros(0, dtype=np.int64))
        self._last_registered = (-np.inf, -1)  # (arrival, id) of the last registered request

    def _index(self, name: str) -> int:
        i = self.segment_index.get(name)
        if i is None:
            i = self.segment_index[name] = len(self.segment_names)
            self.segment_names.append(name)
        return i

    def _reshape(self, capacity: int, cols: int, kept: np.ndarray | slice) -> None:
        """The table's arrays made ``capacity`` rows by ``cols`` columns, holding the rows ``kept`` (in order)
        first."""
        old = self.segments[kept]
        n = len(old)
        self.segments = np.full((capacity, cols), -1, dtype=np.int64)
        self.segments[:n, :old.shape[1]] = old
        for name in ("n_reusable", "fixed_order", "arrival", "request_id"):
            column = getattr(self, name)
            new = np.zeros(capacity, dtype=column.dtype)
            new[:n] = column[kept]
            setattr(self, name, new)

    def cells(self, r: WaitingRequest) -> list[int]:
        """The request's row as a list: its system segment's index (-1: none), then its reusable segments' in
        prompt order. Segments are numbered as first seen: a request's reusable ones, then its system one."""
        index, row, system = self._index, [-1], None
        for s in r.segments:
            kind = s.kind
            if kind == REUSE:
                row.append(index(s.id))
            elif kind != PRIV and system is None:
                system = s.id
        if system is not None:
            row[0] = index(system)
        return row

    def add(self, requests: Sequence[WaitingRequest]) -> None:
        """Register requests not seen before, in the given order (one block write for all of them)."""
        block, n_reusable = [], []
        last = self._last_registered
        for r in requests:
            row = self.cells(r)
            block.append(row)
            n_reusable.append(len(row) - 1)
            age = (r.arrival, r.id)
            if age < last:
                self.rows_in_fifo_order = False
            last = age
        self._last_registered = last
        n0, n1 = self.n_rows, self.n_rows + len(block)
        width = max(self.width, 1 + max(n_reusable))
        capacity, cols = self.segments.shape
        grown = n1 > capacity or width > cols
        if grown:
            self._reshape(max(n1, 2 * capacity), max(cols, width), slice(0, n0))
        for i, row in enumerate(block, n0):  # rows are -1 beyond their length already
            self.segments[i, :len(row)] = row
        self.n_reusable[n0:n1] = n_reusable
        self.fixed_order[n0:n1] = [r.fixed_order for r in requests]
        self.arrival[n0:n1] = [r.arrival for r in requests]
        ids = [r.id for r in requests]
        self.request_id[n0:n1] = ids
        self.row_of.update(zip(ids, range(n0, n1)))
        self.n_rows = n1
        if grown or width != self.width:  # what the kernels read changed
            self.width = width
            self.prompts = self._prompts()

    #: past this many times the rows of the queue, plus ``compact_slack``, the table drops the rows of requests no
    #: longer queued (:meth:`compact`): a live server's table is bounded by its queue, not by the requests it
    #: ever served (a row and its dict entry are about 200 bytes: 1.7 GB a day at 100 requests a second)
    compact_factor = 2
    compact_slack = 4096

    def outgrown(self, queued: int) -> bool:
        return self.n_rows > self.compact_factor * queued + self.compact_slack

    def compact(self, keep: np.ndarray) -> np.ndarray:
        """Keep only the rows ``keep`` (ascending, unique), renumbered in that order, so rows registered in FIFO
        order stay in it; return each old row's new number (-1: dropped). Segments keep their numbers: their
        first-seen order is QAS's tie-break. Costs O(rows held), once at least ``kept + compact_slack`` rows are
        dead: O(1) a dropped row."""
        n = len(keep)
        new_of = np.full(self.n_rows, -1, dtype=np.int64)
        new_of[keep] = np.arange(n)
        self._reshape(max(64, 2 * n), self.segments.shape[1], keep)
        ids, arrival = self.request_id[:n].tolist(), self.arrival[:n].tolist()
        self.row_of = dict(zip(ids, range(n)))
        self.n_rows = n
        ages = list(zip(arrival, ids))
        self.rows_in_fifo_order = all(a < b for a, b in zip(ages, ages[1:]))  # maybe again, dropped rows gone
        self._last_registered = ages[-1] if ages else (-np.inf, -1)
        self.prompts = self._prompts()
        self._expected = ((), np.zeros(0, dtype=np.int64))
        return new_of

    def _prompts(self) -> tuple:
        """What the kernels read: the table as a plain tuple of Prompts' fields (see ``policies.qas_round``)."""
        return tuple(Prompts(self.segments, self.n_reusable, self.fixed_order, self.width))

    def expect(self, requests: Sequence[WaitingRequest], rows: np.ndarray) -> None:
        """Note the queue expected next (and its rows): the last order, minus what a dispatch took."""
        self._expected = (requests, rows)

    def rows(self, requests: Sequence[WaitingRequest]) -> np.ndarray:
        """The requests' rows, registering those not seen before. A queue that starts with the expected one
        (an engine's queue: the requests it did not admit, in the order QAS gave, then arrivals) is looked
        up only past it: a comparison of the same objects costs a fraction of a lookup."""
        expected, rows = self._expected
        m = len(expected)
        if m and len(requests) >= m and requests[:m] == expected:
            return rows if len(requests) == m else np.concatenate((rows, self._lookup(requests[m:])))
        return self._lookup(requests)

    def _lookup(self, requests: Sequence[WaitingRequest]) -> np.ndarray:
        get = self.row_of.get
        rows = [get(r.id, -1) for r in requests]
        if -1 in rows:
            self.add([r for r, i in zip(requests, rows) if i < 0])
            rows = [get(r.id, -1) for r in requests]
        return np.fromiter(rows, np.int64, len(rows))

    def age_key(self, rows: np.ndarray) -> np.ndarray:
        """A key that sorts these rows in FIFO (arrival, id) order: the row itself when rows were registered
        in that order, else each row's position in the sorted queue."""
        if self.rows_in_fifo_order:
            return rows
        pos = np.empty(len(rows), dtype=np.int64)
        pos[np.lexsort((self.request_id[rows], self.arrival[rows]))] = np.arange(len(rows))
        return pos


class _One(NamedTuple):
    """A round of one request (:meth:`CompiledQAS._plan_one`): what its dispatch and ``last`` need."""

    cells: list[int]  # its row (RequestTable.cells); the table registers it only where a later round needs it
    segments: dict[int, int]  # its segments (system and reusable) -> occurrences in its row
    inputs: tuple  # plan_round's batch_hint, arrival (of its row), now, max_wait, n_align: for ``last``


class _Planned(NamedTuple):
    """What a plan leaves for its dispatch."""

    order: list  # the queued requests in the plan's order
    order_rows: np.ndarray  # their rows
    touched: np.ndarray | None  # the round's segments (Round.touched; None: made from ``one`` where a dispatch
    base: np.ndarray | None  # needs them) and theirs w_a·a + w_g·g, P without the batch term
    active: np.ndarray  # a(r) by segment index as the round read it
    hinted: bool  # from hints (else zeros)
    one: _One | None = None  # a round of one request


_NO_ROWS = np.zeros(0, dtype=np.int64)  # shared, never written: what a round of one request leaves


def _took_whole(admitted: Sequence[WaitingRequest], order: list) -> bool:
    """Whether the engine took the round's whole order and nothing else: in the plan's order, as engines admit
    (compared pairwise, in C), or in any other."""
    return admitted is order or (len(admitted) == len(order) and (
        all(map(is_, admitted, order)) or {id(r) for r in admitted} == {id(r) for r in order}))


class EarlyKernels(NamedTuple):
    """Kernels a simulation runs before it loads numba's (module docstring), with what a round of them costs
    over a round of numba's: ``round_s`` plus ``per_request_s`` for each queued request."""

    kernels: SimpleNamespace
    round_s: float
    per_request_s: float

    def cost(self, queued: int) -> float:
        return self.round_s + self.per_request_s * queued


#: interpreted: about 0.2 ms a round of a few requests, growing with the queue
INTERPRETED_ROUNDS = EarlyKernels(INTERPRETED, 2e-4, 2e-4 / 16)
#: compiled ahead of time (``policies.qas_aot``): the same loops at about 6 us more a kernel call, two a round
AOT_ROUND_S = 1.2e-5
#: what a simulation's early rounds may cost in all over numba's before it loads them: about twice their load
#: time (0.3-0.4 s), so that an interpreted 2,048-request run never loads them (prefix20: 0.71 s whole,
#: against 0.93 s with 0.3 s), nor does a run of the ahead-of-time kernels below about 65,000 kernel rounds;
#: a run of more pays at most this over numba's from the start
EARLY_BUDGET_S = 0.8
_early: list[EarlyKernels] = []  # made at the first run that asks


def early_kernels() -> EarlyKernels:
    """The kernels a simulation starts with: compiled ahead of time where the install built them, else
    interpreted."""
    if not _early:
        aot = qas_aot.load()
        _early.append(INTERPRETED_ROUNDS if aot is None else EarlyKernels(aot, AOT_ROUND_S, 0.0))
    return _early[0]


class CompiledQAS(QAS):
    """:class:`~prism.policies.qas.QAS`'s rounds, compiled (module docstring)."""

    @classmethod
    def build(cls, knobs: QASConfig | None, hints: DemandHints, requests: Sequence) -> "CompiledQAS":
        """The registry's QAS for a run of ``requests`` (a live server passes none: compiled at once)."""
        qas = cls(knobs)
        if len(requests):
            qas.early, qas.early_budget_s = early_kernels(), EARLY_BUDGET_S
        return qas

    def __init__(self, config: QASConfig | None = None) -> None:
        self.config = cfg = config or QASConfig()
        self.params = Params(cfg.w_a, cfg.w_n, cfg.w_g, cfg.f_front, cfg.kappa, cfg.alpha_size, cfg.beta_util,
                             cfg.q_cold, cfg.buckets)
        self._kernel_params = tuple(self.params)  # a plain tuple, as the kernels take it
        self.table = RequestTable()
        self._next_rows = _NO_ROWS  # the predicted next batch's rows
        self._planned: _Planned | None = None  # the last plan, until its dispatch
        # the queue it ordered, the result, the a(r) it read
        self._last_round: tuple[Sequence[WaitingRequest], Round | _One, np.ndarray] | None = None
        self._p_hat = np.zeros(64)  # the last published P̂, by segment index (zeros past the segments in use)
        # the kernels' own entries per segment, kept between rounds, written and read at a round's segments only
        # (qas_round.plan_round): P(r; ∅), and each segment's place among the round's
        self._prio = np.zeros(64)
        self._local_of = np.full(64, -1, dtype=np.int64)
        self._no_active = np.zeros(64)  # a(r) of a round without hints
        self._published_by_name: dict[str, float] = {}  # the same, as the mapping DART reads
        self._a = np.zeros(0)  # a(r) by segment index, for the first _a_known segments (see _active)
        self._a_known = 0
        self._a_hints: DemandHints | None = None  # the hints it mirrors
        # what a dispatch needs to publish only what changed (_publish_changes, the kernels' dispatch): the
        # segments whose a(r) changed or that were first seen since the last publication (None: unknown), and
        # those that carried a queue or batch term in it (None: no publication yet)
        self._a_moved: set[int] | None = None
        self._pub_terms: list[int] | np.ndarray | None = None  # as its publisher made it (Python or a kernel)
        self.counters: Counter = Counter()
        self.early = INTERPRETED_ROUNDS  # the kernels of the rounds before numba's (module docstring)
        self.early_budget_s = 0.0  # what they may still cost over numba's; 0: numba's from the next round
        self._k = INTERPRETED  # the kernels of the last round (its dispatch and alignments use them too)

    def _kernels(self, queued: int):
        """The kernels for a round of ``queued`` requests: the early ones while their budget lasts, then numba's."""
        if self.early_budget_s > 0:
            self.early_budget_s -= self.early.cost(queued)
            return self.early.kernels
        return compiled()

    @property
    def last(self) -> dict | None:  # type: ignore[override]  # QAS's attribute, built on demand here
        """The last round's priorities (segment -> P) and buckets ((request ids...), score), built on demand
        for inspection and tests, so that rounds pay nothing for it."""
        if self._last_round is None:
            return None
        waiting, rnd, active = self._last_round
        if isinstance(rnd, _One):  # the round the kernel would have made, on a table of its request alone
            cells = rnd.cells
            prompts = Prompts(np.array([cells]), np.array([len(cells) - 1]), np.array([waiting[0].fixed_order]),
                              len(cells))
            one_row = np.zeros(1, dtype=np.int64)
            hint, arrival, now, wait, n_align = rnd.inputs
            size = max(len(active), max(cells) + 1)
            rnd = Round(*INTERPRETED.plan_round(tuple(prompts), self._kernel_params, one_row, one_row, active,
                                                hint, np.array([arrival]), now, wait, n_align, np.zeros(size),
                                                np.full(size, -1, dtype=np.int64)))
        base = np.array([self._p0(active, s, 0) for s in range(len(active))])  # of a segment not in the queue
        base[rnd.touched] = rnd.base
        names = self.table.segment_names
        return {"priority": {names[i]: float(base[i]) for i in np.flatnonzero(base)},  # P(r; ∅)
                "buckets": [(tuple(waiting[i].id for i in rnd.grouped[s:s + k]), float(score))
                            for s, k, score in zip(rnd.bucket_start.tolist(), rnd.bucket_size.tolist(),
                                                   rnd.bucket_score.tolist())]}

    @property
    def next_counter(self) -> Counter:  # type: ignore[override]  # QAS's attribute, built on demand here
        t, names = self.table, self.table.segment_names
        return Counter(names[s] for r in self._next_rows.tolist()
                       for s in t.segments[r, :1 + t.n_reusable[r]].tolist() if s >= 0)

    def _active(self, ctx: SchedContext, n_segments: int) -> np.ndarray:
        """a(r) by segment index. Kept between rounds and brought up to date from the changes the engine noted
        (``DemandHints.take_active_changes``): a round's window sees a few dozen changes among the hundreds
        of segments in use. Read whole the first time, or from hints other than the last round's."""
        hints = ctx.hints
        if hints is None:
            if len(self._no_active) < n_segments:
                self._no_active = np.zeros(2 * n_segments)
            return self._no_active[:n_segments]
        active, index, names = hints.active, self.table.segment_index, self.table.segment_names
        changed: Collection[str] | None = hints.take_active_changes()
        a, known = self._a, self._a_known
        if changed is None or hints is not self._a_hints:
            self._a_hints, known = hints, 0
            a = self._a = np.zeros(max(64, 2 * n_segments))
            changed = ()
            self._a_moved = None
        elif n_segments > len(a):
            a = self._a = np.concatenate((a, np.zeros(max(n_segments, len(a)))))
        moved = self._a_moved
        for i in range(known, n_segments):  # segments registered since the last round
            a[i] = active.get(names[i], 0)
        if moved is not None:
            moved.update(range(known, n_segments))
        for r in changed:
            j = index.get(r)
            if j is not None and j < known:
                a[j] = active.get(r, 0)
                if moved is not None:
                    moved.add(j)
        self._a_known = n_segments
        return a[:n_segments]

    # ------------------------------------------------------------------ a round
    #: a round of one request runs without the kernels (:meth:`_plan_one`), and a dispatch of a short round's whole
    #: order publishes without them (:meth:`_publish_changes`); False: through them (tests)
    small_rounds_in_python = True

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        if not waiting:
            return Plan([])
        if len(waiting) == 1 and self.small_rounds_in_python:
            return self._plan_one(waiting, ctx)
        cfg, table = self.config, self.table
        queued = table.rows(waiting)
        if table.outgrown(len(queued)):
            queued = self._compact(queued)
        n_segments = len(table.segment_names)
        age = table.age_key(queued)
        self._k = k = self._kernels(len(queued))
        wait = cfg.max_wait_s if cfg.replans_backlog else np.inf  # the starvation bound
        active = self._active(ctx, n_segments)
        self._scratch(n_segments)
        rnd = Round(*k.plan_round(table.prompts, self._kernel_params, queued, age, active,
                                  ctx.batch_hint or len(waiting), table.arrival, ctx.now, wait,
                                  min(ctx.batch_hint, len(waiting)), self._prio, self._local_of))
        if (rnd.order == np.arange(len(waiting))).all():  # the queue's own order: past the knee, all aged (FIFO)
            order = list(waiting)
        else:
            order = [waiting[p] for p in rnd.order.tolist()]
        self._planned = _Planned(order, rnd.order_rows, rnd.touched, rnd.base, active, ctx.hints is not None)
        table.expect(order, rnd.order_rows)
        self._last_round = (waiting, rnd, active)  # references only: `last` builds views
        self.counters[QAS_ROUNDS] += 1
        self.counters[QAS_BUCKETS] += len(rnd.bucket_size)
        cold = dict.fromkeys([waiting[p].id for p in rnd.cold.tolist()], "cold")  # q_cold requests at most
        lanes: Mapping[int, str] = cold
        if rnd.n_aged:
            self.counters[QAS_AGED] += rnd.n_aged
            lanes = _AgedLanes(table, rnd.order_rows[:rnd.n_aged], cold)
        return Plan(order, _Alignment(self, queued, rnd, k.aligned_row), lanes=lanes)

    def _scratch(self, n_segments: int) -> None:
        """The kernels' entries per segment for ``n_segments`` segments, grown by doubling (what is there is kept:
        the last publication, and entries a round reads only after writing them)."""
        if len(self._prio) < n_segments:
            grow = max(n_segments, len(self._prio))
            self._prio = np.concatenate((self._prio, np.zeros(grow)))
            self._local_of = np.concatenate((self._local_of, np.full(grow, -1, dtype=np.int64)))
        if len(self._p_hat) < n_segments:
            self._p_hat = np.concatenate((self._p_hat, np.zeros(max(n_segments, len(self._p_hat)))))

    def _compact(self, queued: np.ndarray) -> np.ndarray:
        """Drop the table's rows but the queue's and the predicted next batch's; the queue's rows renumbered."""
        new_of = self.table.compact(np.unique(np.concatenate((queued, self._next_rows))))
        self._next_rows = new_of[self._next_rows]
        return new_of[queued]

    def _plan_one(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        """:func:`~prism.policies.qas_round.plan_round` on a queue of one request, in Python: no kernel call, no
        array over every segment. A front end that holds the backlog makes such a round for each arrival that
        finds room (every request, below the knee), and an engine for each lone waiting request; a kernel
        call and its boxing cost more than the round (prefix20, 20,480 requests: the front end's rounds were a
        third of the run). The order is the request, its lane cold (or aged); its alignment is its reusable
        segments ranked by P(r; ∅) = w_a·a + w_g·g, g its own occurrences, as ``_aligned_top`` ranks them:
        higher first, ties to the lower index, equal segments by position. Its segments are numbered (the
        tie-break's order) but its row is not stored: only a later round of several needs it (``rows``
        registers it then), and the block write costs a live server more than the rest of the round.
        ``tests/test_qas.py`` holds it equal to the kernels' round and dispatch."""
        r, cfg, table = waiting[0], self.config, self.table
        cells = table.cells(r)
        n_segments = len(table.segment_names)
        a = self._active(ctx, n_segments)
        m = len(cells) - 1
        counts: dict[int, int] = {}
        for s in cells:
            if s >= 0:
                counts[s] = counts.get(s, 0) + 1
        reusable = cells[1:]
        lead = 0 if r.fixed_order or m < 2 else min(cfg.f_front, m)
        align = {}
        if lead:
            base = {s: self._p0(a, s, c) for s, c in counts.items()}
            top = sorted(range(m), key=lambda j: (-base[reusable[j]], reusable[j], j))[:lead]
            aligned = [reusable[j] for j in top] + [s for j, s in enumerate(reusable) if j not in top]
            if aligned != reusable:
                names = table.segment_names
                align[r.id] = tuple([names[s] for s in aligned])
        wait = cfg.max_wait_s if cfg.replans_backlog else np.inf
        arrival = float(r.arrival)
        if ctx.now - arrival > wait:
            self.counters[QAS_AGED] += 1
            lanes = {r.id: "aged"}
        else:
            lanes = {r.id: "cold"} if cfg.q_cold else {}
        self.counters[QAS_ROUNDS] += 1
        self.counters[QAS_BUCKETS] += 1
        order = [r]
        table.expect((), _NO_ROWS)
        one = _One(cells, counts, (ctx.batch_hint or 1, arrival, ctx.now, wait, min(ctx.batch_hint, 1)))
        self._planned = _Planned(order, _NO_ROWS, None, None, a, ctx.hints is not None, one)
        self._last_round = (waiting, one, a)
        return Plan(order, align, lanes)

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        """5. predict the next batch (the requests that now head the order); 6. publish P̂ to eviction."""
        planned, self._planned = self._planned, None
        if planned is None:
            return
        one = planned.one
        whole = len(planned.order) <= self.PYTHON_ROWS and _took_whole(admitted, planned.order)
        if one is not None:  # a round of one request: what the kernels' round would have left
            if whole and self._publish_changes(one.segments, planned.active, planned.hinted, ctx):
                return
            rows = self.table.rows(planned.order)  # registered now: the kernel's dispatch reads its row
            touched = np.fromiter(one.segments, np.int64, len(one.segments))
            base = np.array([self._p0(planned.active, s, c) for s, c in one.segments.items()])
            planned, self._k = planned._replace(order_rows=rows, touched=touched, base=base), self._kernels(1)
        elif whole and self.small_rounds_in_python:
            counts = self._segment_counts(planned.order_rows)  # a whole order is at most PYTHON_ROWS
            if counts is not None and self._publish_changes(counts, planned.active, planned.hinted, ctx):
                return
        # a front end dispatches the whole order it was given
        taken = planned.order_rows if admitted is planned.order else self.table.rows(admitted)
        hints = ctx.hints
        n_segments = len(self.table.segment_names)
        if self._a_moved is None or self._pub_terms is None:  # unknown: every segment may have changed
            moved, terms = np.arange(n_segments, dtype=np.int64), _NO_ROWS
        else:
            moved = np.fromiter(self._a_moved, np.int64, len(self._a_moved)) if self._a_moved else _NO_ROWS
            terms = np.array(self._pub_terms, dtype=np.int64) if isinstance(self._pub_terms, list) else self._pub_terms
        self._scratch(n_segments)
        w = self.params
        out = Dispatch(*self._k.dispatch(self.table.prompts, planned.order_rows, taken, planned.touched,
                                         planned.base, planned.active, w.w_a, w.w_g, w.w_n, moved, terms,
                                         self._p_hat, self._local_of, hints is not None))
        self._next_rows = out.next_rows
        remaining = list(planned.order)
        for p in reversed(out.taken_positions.tolist()):
            del remaining[p]
        self.table.expect(remaining, out.remaining_rows)
        if hints is not None:
            self._publish(hints, out)
            self._pub_terms = out.terms
            self._a_moved = set()

    #: the most rows a dispatch reads in Python (_segment_counts): an engine's queue below the knee
    PYTHON_ROWS = 16

    def _segment_counts(self, rows: np.ndarray) -> dict[int, int] | None:
        """Occurrences of each segment in these rows (system and reusable), for at most ``PYTHON_ROWS`` rows;
        None past that (a front end's window: walking hundreds of segments in Python costs more than a kernel
        call). A dispatch that took a short round whole publishes by them."""
        if len(rows) > self.PYTHON_ROWS:
            return None
        counts: dict[int, int] = {}
        for row in self.table.segments[rows, :self.table.width].tolist():
            for s in row:
                if s >= 0:
                    counts[s] = counts.get(s, 0) + 1
        return counts

    def _publish_changes(self, counts: dict[int, int], active: np.ndarray, hinted: bool, ctx: SchedContext) -> bool:
        """The kernel's dispatch of a round whose whole queue the engine took (nothing remains: no next batch),
        publishing only the segments whose P̂ may have changed since the last publication: the queue's
        (``counts``: their occurrences, g = n), those the last publication gave a queue or batch term, and those
        whose a(r) changed or that were first seen since (``_active`` notes both). P̂ = (w_a·a + w_g·g) + w_n·n,
        added as the kernel adds it, ``active`` the a(r) the round read. False where that set is unknown (no
        publication yet, or a(r) was read afresh): the kernel publishes."""
        hints, table = ctx.hints, self.table
        if hints is None:
            self._next_rows = _NO_ROWS
            table.expect((), _NO_ROWS)
            return True
        if not hinted or self._a_moved is None or self._pub_terms is None:
            return False
        w_n = self.params.w_n
        names, n_segments, n_round = table.segment_names, len(table.segment_names), len(active)
        self._scratch(n_segments)
        published = self._p_hat
        terms = self._pub_terms
        maybe = self._a_moved.union(counts, terms if isinstance(terms, list) else terms.tolist())
        out, fell = self._published_by_name, []
        for s in sorted(maybe):
            if s < n_round:
                c = counts.get(s, 0)
                new = self._p0(active, s, c) + w_n * c
            else:  # first seen after the round: no base, and not in its queue
                new = 0.0
            was = float(published[s])
            if new == was:
                continue
            published[s] = new
            if new > 0:
                out[names[s]] = new
            else:
                del out[names[s]]
            if new < was:
                fell.append(names[s])
        self._pub_terms, self._a_moved = list(counts), set()
        self._next_rows = _NO_ROWS
        table.expect((), _NO_ROWS)
        hints.publish(out, fell)
        return True

    def _p0(self, active: np.ndarray, s: int, occurrences: int) -> float:
        """P(r; ∅) = w_a·a + w_g·g of segment ``s``, as the kernels compute it (``active``: a(r) by index; g its
        occurrences in the queue), for the rounds and publications made in Python."""
        return self.params.w_a * float(active[s]) + self.params.w_g * occurrences

    def _publish(self, hints: DemandHints, dispatched) -> None:
        """Publish P̂ (segments with P̂ > 0). One dict is kept up to date: only the segments whose P̂ changed
        since the last publication are written, a small part of the hundreds with demand."""
        up, gone, fell = dispatched.changed, dispatched.dropped, dispatched.fell
        out, names = self._published_by_name, self.table.segment_names
        out.update(zip([names[i] for i in up.tolist()], self._p_hat[up].tolist()))
        for i in gone.tolist():
            del out[names[i]]
        hints.publish(out, [names[i] for i in fell.tolist()])

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


class _Alignment(LazyAlignment):
    """Plan.align for QAS: request id -> aligned reusable order, for the queued requests whose order changes.
    The round aligned the head of its order (the requests the engine is about to take); others are aligned
    on demand with the round's priorities, should the engine take them."""

    def __init__(self, qas: CompiledQAS, queued: np.ndarray, rnd: Round, aligned_row) -> None:
        self._qas, self._table, self._queued, self._rnd = qas, qas.table, queued, rnd
        self._aligned_row = aligned_row  # the round's kernel
        # the aligned head's rows, then all queued rows, as dicts and sets made at the first call that needs
        # them: O(queue) per round that admits (an array over every row ever registered would make a front
        # end's rounds of a few arrivals cost O(requests so far) each)
        self._head: dict[int, int] | None = None
        self._rows: set[int] | None = None

    def get(self, rid: int, default=None):
        """The engine's call, once per admitted request (no exception for the many that keep their order)."""
        table, rnd = self._table, self._rnd
        row = table.row_of.get(rid, -1)  # -1: registered after this round, not queued
        if self._head is None:
            self._head = {r: i for i, r in enumerate(rnd.order_rows[:len(rnd.moved)].tolist())}
        i = self._head.get(row)
        if i is not None:
            if not rnd.moved[i]:
                return default
            out = rnd.aligned[i, :table.n_reusable[row]]
        else:
            if self._rows is None:
                self._rows = set(self._queued.tolist())
            if row not in self._rows:
                return default
            prio = self._qas._prio  # P(r; ∅) of the round's segments there, as the round left them
            prio[rnd.touched] = rnd.base
            out, moved = self._aligned_row(table.prompts, row, prio, self._qas.config.f_front)
            if not moved:
                return default
        names = table.segment_names
        return tuple([names[i] for i in out.tolist()])

    def __iter__(self) -> Iterator[int]:
        return (rid for rid in self._table.request_id[self._queued].tolist() if rid in self)


class _AgedLanes(Mapping):
    """Plan.lanes of a round with aged requests: the cold lane's few as a dict, the aged ones (past the knee,
    much of a backlog of thousands) by row, as a set made when first asked: an engine asks for the few it admits,
    a front end for each of the hundreds a window releases (an array scan per question cost 2% of a prism run on
    zipf at 20,480 requests)."""

    def __init__(self, table: RequestTable, aged_rows: np.ndarray, cold: dict[int, str]) -> None:
        self._table, self._aged_rows, self._cold = table, aged_rows, cold
        self._aged: set[int] | None = None

    def get(self, rid: int, default=None):
        row = self._table.row_of.get(rid)
        if row is not None:
            if self._aged is None:
                self._aged = set(self._aged_rows.tolist())
            if row in self._aged:
                return "aged"
        return self._cold.get(rid, default)

    def __getitem__(self, rid: int) -> str:
        out = self.get(rid)
        if out is None:
            raise KeyError(rid)
        return out

    def __iter__(self) -> Iterator[int]:
        aged = self._table.request_id[self._aged_rows].tolist()
        return iter(dict.fromkeys([*self._cold, *aged]))

    def __len__(self) -> int:
        return sum(1 for _ in self)
