"""k-LPM (Dexter et al. 2025): longest-prefix-match with a guaranteed FCFS share.

Out of every k admissions, one goes to the oldest waiting request and k-1 to the requests with the longest
cached prefix (greedily, against the cache as it is at the start of the round). k=1 is FCFS; as k grows it
becomes LPM. The admission count carries across rounds, so the FCFS share holds however the engine's
budgets cut each batch: the last of every k admissions is the FCFS one.

:meth:`KLPM.plan_reference` is the definition: a prefix match per waiting request and two sorts; the picks
are made only for the requests the engine can admit this round, at most ``batch_hint`` (its free running slots)
and no more than its prefill budget covers (``token_budget``, counting each pick's uncached tokens); the rest
follow in FIFO order: the next round picks afresh from the cache as it is then. Past the knee that is thousands
of matches a round, almost all unchanged since the last. :meth:`KLPM.plan` gives the same orders from a queue kept
between rounds (:class:`_Ranked`): requests in FIFO order and by match length, the matches kept current by
:class:`~prism.policies.match_memo.MatchMemo` from the cache's changes; a round costs the requests that
arrived, left or whose match changed, plus its picks. It falls back to the definition for a cache that does
not log its changes, and rebuilds its queue whenever the waiting queue is not the one it expects (the last
order minus what the engine admitted, then arrivals).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from operator import attrgetter
from typing import Sequence

from prism.config import positive

from prism.policies.base import Part, Plan, SchedContext, Scheduler, WaitingRequest
from prism.policies.expected_queue import ExpectedQueue
from prism.policies.match_memo import MatchMemo


@dataclass
class KLPMConfig:
    k: int = positive(2, "one FCFS admission in every k (1 = FCFS; large = LPM)")


#: a k no run reaches (one FIFO pick in every k admissions): k-LPM's FIFO share switched off, pure LPM picks
NO_FIFO_SHARE = 10**12


class KLPM(Scheduler):
    name = "klpm"
    Knobs = KLPMConfig
    parts = (Part("fifo_share", "its FIFO share: one admission in every k goes to the oldest request",
                  {"klpm": {"k": NO_FIFO_SHARE}}),)

    @classmethod
    def base(cls, knobs: KLPMConfig) -> str:
        return "lpm"  # SGLang's LPM, which k-LPM modifies

    def __init__(self, config: KLPMConfig | None = None) -> None:
        self.config = config or KLPMConfig()
        self.admitted = 0  # admissions so far, across rounds
        self._ranked: _Ranked | None = None  # the queue kept between rounds (None: build it at the next round)
        self._order: list | None = None  # the last plan's order, until its dispatch

    def _slots(self, n: int, ctx: SchedContext) -> int:
        # the engine admits at most batch_hint requests this round, and the next round picks afresh: past them
        # the queue follows in FIFO order
        return min(n, ctx.batch_hint) if ctx.batch_hint > 0 else n

    @staticmethod
    def _enough(need: int, ctx: SchedContext) -> bool:
        """Whether picks whose uncached tokens sum to ``need`` use up the engine's prefill budget this round (the
        picks past them follow in FIFO order too): each request it admits takes at least its uncached tokens, so
        its admission stops by then (zipf, 20,480 requests: about 18 picks a round, where its free running slots
        allow 134)."""
        return 0 < ctx.token_budget <= need

    def _is_fcfs_slot(self, slot: int) -> bool:
        k = self.config.k
        return (self.admitted + slot) % k == k - 1

    def plan_reference(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        """The definition (module docstring): every waiting request matched afresh."""
        fifo = sorted(waiting, key=attrgetter("arrival", "id"))
        match_len = ctx.cache.match_len
        hits = [match_len(r.key) for r in fifo]
        by_hit = sorted(range(len(fifo)), key=hits.__getitem__, reverse=True)  # stable: older first among equals
        taken = [False] * len(fifo)
        order, cold = [], []
        fi = hi = 0
        need = 0
        for slot in range(self._slots(len(fifo), ctx)):
            if self._is_fcfs_slot(slot):
                while taken[fi]:
                    fi += 1
                pick = fi
                cold.append(fifo[pick].id)
            else:
                while taken[by_hit[hi]]:
                    hi += 1
                pick = by_hit[hi]
            taken[pick] = True
            order.append(fifo[pick])
            need += fifo[pick].prompt_len - hits[pick]
            if self._enough(need, ctx):
                break
        if len(order) < len(fifo):
            order += [r for r, t in zip(fifo, taken) if not t]
        return Plan(order, lanes=dict.fromkeys(cold, "cold"))

    def plan(self, waiting: Sequence[WaitingRequest], ctx: SchedContext) -> Plan:
        """The definition's order, from the queue kept between rounds (module docstring)."""
        if not getattr(ctx.cache, "logs_changes", False):
            return self.plan_reference(waiting, ctx)
        ranked = self._ranked
        if ranked is None or ranked.memo.index is not ctx.cache or not ranked.sync(waiting, ctx.kept):
            if ranked is not None:
                ranked.close()
            ranked = self._ranked = _Ranked(ctx.cache, waiting)
        ranked.refresh()
        picks, cold = [], []
        fifo, by_hit, hits = ranked.oldest(), ranked.longest(), ranked.memo.hits
        taken: set[int] = set()
        need = 0
        for slot in range(self._slots(len(ranked), ctx)):
            source = fifo if self._is_fcfs_slot(slot) else by_hit
            r = next(source)
            while r.id in taken:
                r = next(source)
            taken.add(r.id)
            picks.append(r)
            if source is fifo:
                cold.append(r.id)
            need += r.prompt_len - hits[r.id]
            if self._enough(need, ctx):
                break
        lanes = dict.fromkeys(cold, "cold")
        if ctx.kept is None:  # an engine that does not say what it kept: it compares its queue with the order
            order = list(ranked.picks_then_fifo(picks))
            ranked.queue.expect(order)
            return Plan(order, lanes=lanes)
        ranked.queue.expect(None, len(waiting))
        return Plan(ranked.picks_then_fifo(picks), lanes=lanes, keep_queue=True)

    def on_dispatch(self, admitted: Sequence[WaitingRequest], ctx: SchedContext) -> None:
        self.admitted += len(admitted)
        if self._ranked is not None:
            self._ranked.dispatched(admitted, ctx.kept)


class _Ranked:
    """The waiting requests as k-LPM ranks them, kept between rounds: in FIFO (arrival, id) order and, per match
    length, in FIFO order; the matches kept current by a :class:`MatchMemo`.

    The FIFO order is a dict's: requests come in that order but for a retracted one (it keeps its arrival), and
    leave from anywhere in it, about 18 a round from thousands, each at the cost of a deletion, where a list
    was copied whole (each copy touches every request: docs/benchmarks.md, ninth pass)."""

    def __init__(self, cache, waiting: Sequence[WaitingRequest]) -> None:
        self.memo = MatchMemo(cache)
        self._by_hit: dict[int, list[tuple]] = {}  # match length -> (arrival, id) keys of its requests, sorted
        self._levels: list[int] = []  # the match lengths present, ascending
        self._request: dict[int, WaitingRequest] = {}  # request id -> request, in FIFO order
        self.queue = ExpectedQueue()  # the waiting queue expected at the next round, before arrivals
        self._add(waiting)

    def __len__(self) -> int:
        return len(self._request)

    # ---------------------------------------------------------------- membership
    def sync(self, waiting: Sequence[WaitingRequest], kept: int | None) -> bool:
        """Take the round's waiting queue: False (rebuild) unless it starts with the expected one."""
        joined = self.queue.joined(waiting, kept)
        if joined is None:
            return False
        self._add(joined)
        return True

    def _add(self, requests: Sequence[WaitingRequest]) -> None:
        request, in_order = self._request, True
        for r in requests:
            if r.id in request:
                self._remove(r.id)
            key = (r.arrival, r.id)
            if in_order and request:
                last = request[next(reversed(request))]
                in_order = (last.arrival, last.id) < key
            request[r.id] = r
            self._place(key, self.memo.add(r.id, r.key))
        if not in_order:  # a retracted request, or a rebuild: sorted again (timsort: in one pass, mostly)
            self._request = {r.id: r for r in sorted(request.values(), key=attrgetter("arrival", "id"))}

    def _remove(self, rid: int) -> None:
        self._remove_all((rid,))

    def _remove_all(self, rids: Sequence[int]) -> None:
        """Take these requests out."""
        for rid in rids:
            r = self._request.pop(rid)
            self._unplace((r.arrival, r.id), self.memo.hits[rid])
        self.memo.forget(rids)

    def dispatched(self, admitted: Sequence[WaitingRequest], kept: int | None) -> None:
        """The engine took ``admitted``, the head of the expected order (else the next round rebuilds)."""
        if self.queue.dispatched(admitted, kept):
            self._remove_all([r.id for r in admitted])

    def close(self) -> None:
        self.memo.close()

    # ---------------------------------------------------------------- ranks
    def _place(self, key: tuple, hit: int) -> None:
        level = self._by_hit.get(hit)
        if level is None:
            level = self._by_hit[hit] = []
            insort(self._levels, hit)
        insort(level, key)

    def _unplace(self, key: tuple, hit: int) -> None:
        level = self._by_hit[hit]
        del level[bisect_left(level, key)]
        if not level:
            del self._by_hit[hit]
            del self._levels[bisect_left(self._levels, hit)]

    def refresh(self) -> None:
        """Re-rank the requests whose match the cache's changes moved."""
        memo, request = self.memo, self._request
        for rid, old in memo.refresh().items():
            r = request.get(rid)
            if r is not None:
                key = (r.arrival, r.id)
                self._unplace(key, old)
                self._place(key, memo.hits[rid])

    def oldest(self):
        """The requests, oldest first."""
        return iter(self._request.values())

    def longest(self):
        """The requests, longest match first, older first among equals."""
        request = self._request
        for hit in reversed(self._levels):
            for _, rid in self._by_hit[hit]:
                yield request[rid]

    def picks_then_fifo(self, picks: list):
        """``picks``, then the other requests in FIFO order, as the engine reads them: it admits about 18 a
        round, the picks, and reads no further."""
        yield from picks
        taken = {r.id for r in picks}
        for rid, r in self._request.items():
            if rid not in taken:
                yield r
