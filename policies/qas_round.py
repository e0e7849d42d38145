"""A QAS round as compiled loops (numba, cached on disk): the round itself, what a dispatch publishes, and the
front alignment of one request. The same loops also run interpreted (:data:`INTERPRETED`), which a short run
prefers: see *Start* below.

Model. The kernels read QAS's request table as a :class:`Prompts`: one row per registered request, column 0
its system segment, then its reusable segments in prompt order, -1 padded; segments are numbered in
first-seen order, which is also the tie-break between equal priorities. A round (:func:`plan_round`) is
three passes over the queued rows, O(S) in queued segment occurrences S (a round numbers its segments by their
place among its own, :func:`segment_counts`, so that no pass is over every segment QAS has numbered):

1. counters and priorities: g(r) counted over the queue; ``base`` = w_a·a + w_g·g, the part of P that no
   batch changes, which is P(r; ∅), by which a round ranks segments (:func:`priority` adds a batch's term);
2. signatures: each request's top-kappa reusable segments in its aligned order; requests with equal
   signatures share a bucket;
3. buckets, their scores and the admission order: the cold lane, then the buckets by descending score.

Inputs and outputs are named tuples (:class:`Prompts`, :class:`Params`, :class:`Round`, :class:`Dispatch`),
which numba passes as structs. Python calls a kernel once per round and once per dispatch (the round aligns
the head of its order; an admitted request past it costs an alignment call), and a call's fixed cost is most
of a small round: so the entry points take Prompts and Params as plain tuples of their fields
(``tuple(Prompts(...))``) and name them first thing, and return a Round's or a Dispatch's fields as a plain
tuple that the caller names, because numba types and boxes a plain tuple in C but a named one in Python
(``benchmarks/bench_plugin_round.py``: 6.6 against 7.5-12 us a plan_round call in a hot loop; between an
engine's iterations, with its work in the caches, a call costs 35-60 us either way, and a round of a few
requests 110-250 us).

Choices. The FIFO order and the buckets come from counting sorts (age keys and bucket numbers are small
dense integers for an engine's queue), distinct (bucket, segment) pairs from a marker per segment of the round
(by its place among the round's: :func:`_place`), the lanes
are read off the buckets in score order, and a request's top-kappa segments from kappa passes over the
queue, each picking every request's next best segment with a plain scan of its row (a handful of segments;
such a scan compiles to tight code where an insertion sort per request branches on every comparison). No
all-pairs work. Kernels take whole arrays and loop over rows inside: a compiled call per row would pay for
passing its arrays each time.

Cost. Compiled, a round's time is its O(S) work. Loops, not numpy array operations: at the queue sizes an
engine sees (hundreds of requests) an array operation's fixed cost exceeds its work, and a round needs
dozens of them. A round also pays a few microseconds to call its kernel and box its result.

Every float is computed with the same operations, in the same order per element, as the formulas state them;
sums of distinct terms (bucket utilities) may add in another order, which is exact for the default integer
weights.

Start. Loading the compiled loops costs a process about 0.4 s even from numba's cache (0.16-0.25 s to import
numba, the rest its typing set-up and the cache), which is most of a 2,048-request run: :func:`compiled` keeps
numba from importing scipy.linalg (another 0.2 s) to probe for a BLAS that no kernel calls (see
:func:`_numba_without_blas`). An interpreted round of a few requests costs about 0.2 ms. So the kernels are plain
functions: :data:`INTERPRETED` holds them as Python runs them (their calls to each other stay interpreted),
and :func:`compiled` compiles them all, once per process, on first use (numba resolves a kernel's calls to
the others at compile time from this module's names, which then are the compiled ones). Both run the same
code on the same arrays; the tests hold their results equal.
"""

from __future__ import annotations

import sys
from types import FunctionType, SimpleNamespace
from typing import Callable, NamedTuple

import numpy as np


_KERNELS: dict[str, Callable] = {}  # name -> the plain function, in definition order


def kernel(fn: Callable) -> Callable:
    """Register ``fn`` as a kernel: a plain function that :func:`compiled` turns into a numba one."""
    _KERNELS[fn.__name__] = fn
    return fn


class Prompts(NamedTuple):
    """The registered requests' segments (``policies.qas.RequestTable`` keeps them)."""

    segments: np.ndarray  # int64 (rows, columns): system segment, then reusable ones in prompt order; -1 pads
    n_reusable: np.ndarray  # int64 per row: its reusable segments, columns 1..n_reusable
    fixed_order: np.ndarray  # bool per row: the reusable segments keep their order
    width: int  # columns in use


class Params(NamedTuple):
    """QASConfig's numbers, as the kernels read them."""

    w_a: float
    w_n: float
    w_g: float
    f_front: int
    kappa: int
    alpha_size: float
    beta_util: float
    q_cold: int
    buckets: bool  # False: one bucket of every queued request (the hot lane in FIFO order)


class Round(NamedTuple):
    """One round's result. Positions index the queue as the round was given it."""

    touched: np.ndarray  # the segments of the queued rows (system and reusable), in the order first met
    base: np.ndarray  # per touched segment: w_a·a + w_g·g, which is P(r; ∅), by which the round ranks segments
    order: np.ndarray  # queue positions in admission order
    cold: np.ndarray  # the cold lane's queue positions, oldest first
    grouped: np.ndarray  # queue positions grouped by bucket, FIFO inside
    bucket_start: np.ndarray  # per bucket: where its members start in ``grouped``
    bucket_size: np.ndarray
    bucket_score: np.ndarray
    n_aged: int  # the order's first n_aged waited past max_wait (oldest first)
    order_rows: np.ndarray  # the rows of ``order``
    aligned: np.ndarray  # the aligned order (segment indices, -1 padded) of the order's first n_align rows
    moved: np.ndarray  # per such row: whether its aligned order differs from its prompt's


class Dispatch(NamedTuple):
    """What a dispatch leaves for the next round and for eviction."""

    taken_positions: np.ndarray  # where the order was taken, ascending
    remaining_rows: np.ndarray  # the order's other rows, in order
    next_rows: np.ndarray  # the rows that now head the order: the predicted next batch
    changed: np.ndarray  # segments whose P̂ is positive and differs from the last publication's, ascending
    dropped: np.ndarray  # segments whose P̂ fell to zero
    fell: np.ndarray  # segments whose P̂ fell (the dropped ones included)
    terms: np.ndarray  # segments the publication gave a queue or batch term (the round's and the taken rows')


@kernel
def priority(base, in_batch, w_n):
    """P(r; B) = w_a·a(r) + w_n·n(r; B) + w_g·g(r), given ``base`` = w_a·a + w_g·g and ``in_batch`` = n(r; B).
    Linear, so it also gives a sum of priorities from the sums of the counters."""
    return base + w_n * in_batch


@kernel
def _place(s, listed, n, local_of):
    """Segment ``s``'s place in ``listed[:n]``, appended there if absent; returns (place, new n). A sparse set:
    ``local_of`` (an entry per segment numbered, never cleared) holds the place, which counts only where the
    list holds ``s`` there, so a round touches its own segments, not every segment QAS has numbered."""
    i = local_of[s]
    if i < 0 or i >= n or listed[i] != s:
        i = n
        local_of[s] = n
        listed[n] = s
        n += 1
    return i, n


@kernel
def segment_counts(prompts, rows, local_of):
    """The segments of these rows (system and reusable), in the order first met, and how many times the rows
    hold each; ``local_of`` gets each one's place in that list (:func:`_place`)."""
    segments = prompts.segments
    total = 0
    for r in rows:
        total += 1 + prompts.n_reusable[r]
    touched = np.empty(total, np.int64)
    count = np.zeros(total)
    k = 0
    for r in rows:
        for c in range(1 + prompts.n_reusable[r]):  # its system segment, then its reusable ones
            s = segments[r, c]
            if s >= 0:
                i, k = _place(s, touched, k, local_of)
                count[i] += 1
    return touched[:k], count[:k]


@kernel
def _before(prio, a, b):
    """Whether segment a ranks before b: higher priority, ties to the segment seen first (lower index)."""
    return prio[a] > prio[b] or (prio[a] == prio[b] and a < b)


@kernel
def _best_positions(prompts, rows, prio, need):
    """Where each row's ``need[i]`` best reusable segments stand in it (0: its first), best first; -1 pads.
    Pass t picks, for every row that needs a t-th, the best segment that ranks after its pick of pass t-1
    (equal segments by position): a plain scan of the row."""
    segments = prompts.segments
    k = 0
    for i in range(rows.shape[0]):
        k = max(k, need[i])
    pos = np.full((rows.shape[0], k), -1, np.int64)
    for t in range(k):
        for i in range(rows.shape[0]):
            if t >= need[i]:
                continue
            r = rows[i]
            m = prompts.n_reusable[r]
            last = pos[i, t - 1] if t > 0 else -1
            best = -1
            for j in range(m):
                s = segments[r, 1 + j]
                if last >= 0:
                    p = segments[r, 1 + last]
                    if not (_before(prio, p, s) or (p == s and last < j)):
                        continue
                if best < 0 or _before(prio, s, segments[r, 1 + best]):
                    best = j
            pos[i, t] = best
    return pos


@kernel
def _aligned_top(prompts, rows, prio, k, f_front):
    """Each row's ``k`` best reusable segments (all, when it has fewer), listed in its aligned order: -1
    padded, ``k`` columns. Front alignment moves a row's ``f_front`` best segments to the front, best first,
    and the others keep their prompt order (fixed-order rows, and rows with fewer than two segments, keep
    theirs). A row listed whole needs only its lead ranked (a pass of the row each), not all of its segments."""
    segments = prompts.segments
    n = rows.shape[0]
    picked = np.empty(n, np.int64)
    lead = np.empty(n, np.int64)
    need = np.empty(n, np.int64)  # best positions to find: the picks, or the lead where every segment is picked
    for i in range(n):
        r = rows[i]
        m = prompts.n_reusable[r]
        picked[i] = min(k, m)
        lead[i] = 0 if prompts.fixed_order[r] or m < 2 else min(f_front, picked[i])
        need[i] = lead[i] if picked[i] == m else picked[i]
    pos = _best_positions(prompts, rows, prio, need)
    out = np.full((n, k), -1, np.int64)
    for i in range(n):
        r = rows[i]
        m = prompts.n_reusable[r]
        for x in range(lead[i]):
            out[i, x] = segments[r, 1 + pos[i, x]]
        q = lead[i]
        if picked[i] < m:  # the other picks, in prompt order: each the next position after the last
            last = -1
            for _ in range(lead[i], picked[i]):
                j = m
                for x in range(lead[i], picked[i]):
                    if last < pos[i, x] < j:
                        j = pos[i, x]
                out[i, q] = segments[r, 1 + j]
                q += 1
                last = j
        else:  # every segment but the lead's, in prompt order
            for j in range(m):
                other = True
                for x in range(lead[i]):
                    if pos[i, x] == j:
                        other = False
                if other:
                    out[i, q] = segments[r, 1 + j]
                    q += 1
    return out


@kernel
def aligned_row(prompts, r, prio, f_front):
    """Row r's aligned order (segment indices) and whether it differs from the prompt's."""
    prompts = Prompts(*prompts)
    m = prompts.n_reusable[r]
    out = _aligned_top(prompts, np.array([r]), prio, m, f_front)[0]
    moved = False
    for j in range(m):
        if out[j] != prompts.segments[r, 1 + j]:
            moved = True
    return out, moved


@kernel
def _counting_sort(key, n_keys, members):
    """``members`` ordered by ``key`` (small non-negative integers), stably; and where each key starts."""
    start = np.zeros(n_keys + 1, np.int64)
    for p in members:
        start[key[p] + 1] += 1
    start = np.cumsum(start)
    out = np.empty(members.shape[0], np.int64)
    fill = start[:n_keys].copy()
    for p in members:
        out[fill[key[p]]] = p
        fill[key[p]] += 1
    return out, start


@kernel
def _bucket_keys(signatures, n_segments):
    """A key per request, equal for equal signature rows (keys < number of requests). Refines a partition
    column by column: (key so far, segment in this column) -> new key, with a marker per segment (numbered
    below ``n_segments``: a round passes each segment's place among its own); each
    key's requests are visited together, so a marker tells whether it has seen a segment."""
    n, kappa = signatures.shape
    key = np.zeros(n, np.int64)
    members, start = np.arange(n), np.array([0, n])
    seen = np.full(n_segments + 1, -1, np.int64)  # per segment + 1: the (column, key) that last met it
    new_key = np.empty(n_segments + 1, np.int64)
    for c in range(kappa):
        keys = 0
        for k in range(start.shape[0] - 1):
            stamp = c * n + k
            for x in range(start[k], start[k + 1]):
                p = members[x]
                s = signatures[p, c] + 1
                if seen[s] != stamp:
                    seen[s] = stamp
                    new_key[s] = keys
                    keys += 1
                key[p] = new_key[s]
        if c + 1 < kappa:
            members, start = _counting_sort(key, keys, np.arange(n))
    return key


@kernel
def _fifo(age):
    """Queue positions oldest first, by a unique age key: a counting sort when the keys are dense, as an
    engine's queue has them."""
    n = age.shape[0]
    low = age.min()
    spread = age.max() - low + 1
    if spread > 4 * n + 64:
        return np.argsort(age)
    slot = np.full(spread, -1, np.int64)
    for p in range(n):
        slot[age[p] - low] = p
    return slot[slot >= 0]


@kernel
def order_queue(prompts, queued, age, bucket_key, prio, local_of, n_touched, params, batch_hint):
    """Buckets, their scores and the admission order (step 3 of :func:`plan_round`). Requests with equal
    ``bucket_key`` (integers from 0 to the queue's length) share a bucket; ``prio`` is P(r; ∅) by segment,
    ``local_of`` each of the ``n_touched`` queued segments' place (:func:`segment_counts`)."""
    n = queued.shape[0]
    by_age = _fifo(age)
    # buckets numbered by their heads' age; members in FIFO order
    number = np.full(n, -1, np.int64)
    bucket = np.empty(n, np.int64)
    n_buckets = 0
    for p in by_age:
        k = bucket_key[p]
        if number[k] < 0:
            number[k] = n_buckets
            n_buckets += 1
        bucket[p] = number[k]
    grouped, start = _counting_sort(bucket, n_buckets, by_age)
    size = start[1:] - start[:-1]
    score = np.empty(n_buckets)
    seen = np.full(n_touched, -1, np.int64)  # the last bucket that counted each segment (by its place)
    segments = prompts.segments
    for b in range(n_buckets):
        in_batch = 0  # n(r; batch) summed over the bucket's segments: the batch's segment occurrences
        total_base = 0.0
        distinct = 0
        for j in range(start[b], start[b + 1]):
            r = queued[grouped[j]]
            if j - start[b] < batch_hint:
                in_batch += prompts.n_reusable[r]
            for c in range(1, prompts.width):
                s = segments[r, c]
                if s < 0:
                    break
                if seen[local_of[s]] != b:
                    seen[local_of[s]] = b
                    distinct += 1
                    total_base += prio[s]
        util = priority(total_base, in_batch, params.w_n)
        if distinct > 0:
            util /= distinct
        score[b] = params.alpha_size * size[b] + params.beta_util * util
    # lanes: the q_cold oldest first, then buckets by (descending score, older head), FIFO inside
    cold = by_age[:min(params.q_cold, n)]
    is_cold = np.zeros(n, np.bool_)
    order = np.empty(n, np.int64)
    order[:cold.shape[0]] = cold
    is_cold[cold] = True
    k = cold.shape[0]
    for b in np.argsort(-score, kind="mergesort"):  # stable: buckets are numbered by their heads' age
        for j in range(start[b], start[b + 1]):
            p = grouped[j]
            if not is_cold[p]:
                order[k] = p
                k += 1
    return order, cold, grouped, start[:n_buckets], size, score


@kernel
def _aged_first(order, queued, age, arrival, now, max_wait):
    """The order with the requests that waited more than ``max_wait`` by ``now`` (``arrival`` by row) moved
    to its head, oldest first; and how many moved."""
    over = np.empty(order.shape[0], np.int64)
    rest = np.empty(order.shape[0], np.int64)
    a = b = 0
    for p in order:
        if now - arrival[queued[p]] > max_wait:
            over[a] = p
            a += 1
        else:
            rest[b] = p
            b += 1
    if a == 0:
        return order, 0
    over = over[:a]
    over = over[np.argsort(age[over])]  # age keys are unique
    return np.concatenate((over, rest[:b])), a


@kernel
def plan_round(prompts, params, queued, age, active, batch_hint, arrival, now, max_wait, n_align, prio, local_of):
    """One QAS round over the ``queued`` rows (in queue order), segments ranked by P(r; ∅) = w_a·a + w_g·g.

    ``age``: a unique key per queued request that sorts it in FIFO (arrival, id) order; ``active``: a(r) per
    segment; ``batch_hint``: how many requests form a bucket's provisional batch. A bucket's utility U(b) is
    the mean over its distinct reusable segments of P(r; its provisional batch), its score alpha_size·|b| +
    beta_util·U(b). Requests that waited more than ``max_wait`` (``arrival`` by row) go first, oldest first
    (the starvation bound; inf: none). The first ``n_align`` requests of the order are aligned too, the ones an
    engine is about to take (a call of :func:`aligned_row` each would cost more than the round).

    ``prio`` and ``local_of`` are the caller's, an entry per segment numbered, kept between rounds: the round
    writes P(r; ∅) and the place of each queued segment there and reads nothing else of them, so that it costs
    its queue, not every segment QAS has numbered (DESIGN §3: O(S)).
    """
    prompts, params = Prompts(*prompts), Params(*params)
    touched, base = segment_counts(prompts, queued, local_of)  # g, made w_a·a + w_g·g in place: one array
    for i in range(touched.shape[0]):
        s = touched[i]
        base[i] = params.w_a * active[s] + params.w_g * base[i]
        prio[s] = base[i]
    if params.buckets:
        signatures = _aligned_top(prompts, queued, prio, params.kappa, params.f_front)  # top-kappa, aligned order
        for p in range(signatures.shape[0]):  # segments by their place among the touched: keys by equality
            for c in range(signatures.shape[1]):
                if signatures[p, c] >= 0:
                    signatures[p, c] = local_of[signatures[p, c]]
        bucket_key = _bucket_keys(signatures, touched.shape[0])
    else:
        bucket_key = np.zeros(queued.shape[0], np.int64)
    order, cold, grouped, start, size, score = order_queue(prompts, queued, age, bucket_key, prio, local_of,
                                                           touched.shape[0], params, batch_hint)
    order, n_aged = _aged_first(order, queued, age, arrival, now, max_wait)
    order_rows = queued[order]
    head = order_rows[:n_align]
    aligned = _aligned_top(prompts, head, prio, max(prompts.width - 1, 1), params.f_front)
    moved = np.zeros(head.shape[0], np.bool_)
    for i in range(head.shape[0]):
        for j in range(prompts.n_reusable[head[i]]):
            if aligned[i, j] != prompts.segments[head[i], 1 + j]:
                moved[i] = True
    return (touched, base, order, cold, grouped, start, size, score,  # a Round's fields (module docstring: Cost)
            n_aged, order_rows, aligned, moved)


@kernel
def dispatch(prompts, order_rows, taken, touched, base, active, w_a, w_g, w_n, moved, terms, published, local_of,
             publish):
    """After the engine took the rows ``taken`` of a round ordered as ``order_rows``: where the order was
    taken, the rows that remain, the next batch (the first ``len(taken)`` of them: rows, which only an
    inspection counts); with ``publish``, the publication P̂ = P(r; taken), written into ``published`` (an entry
    per segment numbered: the last publication, zero where none), and how it differs from the last: the
    segments now positive and changed (ascending: the order a publication lists them), those now zero, those
    lower than before; and the segments this publication gives a queue or batch term, for the next.

    P̂ of a segment the round met (``touched``) is its ``base`` plus w_n·n(r; taken); of one it did not meet,
    w_a·a + w_g·0 as a round computes it (``active``, a(r) as the round read it; 0 for one numbered after the
    round), plus the batch term. Only the segments whose P̂ may differ from the last publication are
    computed: the round's, the taken rows', those whose a(r) changed or that were numbered since (``moved``)
    and those the last publication gave a term (``terms``); every other one keeps its last P̂, w_a·a then and
    now. ``local_of`` notes each one's place among them (:func:`_place`)."""
    prompts = Prompts(*prompts)
    sorted_taken = np.sort(taken)  # membership by binary search: O(queue · log taken), not O(rows registered)
    taken_positions = np.empty(order_rows.shape[0], np.int64)
    remaining_rows = np.empty(order_rows.shape[0], np.int64)
    t = k = 0
    for p in range(order_rows.shape[0]):
        j = np.searchsorted(sorted_taken, order_rows[p])
        if j < sorted_taken.shape[0] and sorted_taken[j] == order_rows[p]:
            taken_positions[t] = p
            t += 1
        else:
            remaining_rows[k] = order_rows[p]
            k += 1
    remaining_rows = remaining_rows[:k]
    none = np.zeros(0, np.int64)
    if not publish:
        return (taken_positions[:t], remaining_rows, remaining_rows[:taken.shape[0]], none, none, none, none)
    n_cells = 0
    for r in taken:
        n_cells += 1 + prompts.n_reusable[r]
    domain = np.empty(touched.shape[0] + n_cells + moved.shape[0] + terms.shape[0], np.int64)
    in_batch = np.zeros(domain.shape[0])
    n_touched = touched.shape[0]
    for i in range(n_touched):  # the round's segments first, at their places
        domain[i] = touched[i]
        local_of[touched[i]] = i
    d = n_touched
    for r in taken:  # the taken rows' segments, counted; then the others that may have changed
        for c in range(1 + prompts.n_reusable[r]):
            s = prompts.segments[r, c]
            if s >= 0:
                i, d = _place(s, domain, d, local_of)
                in_batch[i] += 1
    for others in (moved, terms):
        for s in others:
            d = _place(s, domain, d, local_of)[1]
    up = np.empty(d, np.int64)
    gone = np.empty(d, np.int64)
    fell = np.empty(d, np.int64)
    term = np.empty(d, np.int64)
    a = b = c = e = 0
    for j in range(d):
        s = domain[j]
        if j < n_touched:
            p = base[j]
        elif s < active.shape[0]:
            p = w_a * active[s] + w_g * 0.0
        else:  # first seen after the round: no base, and not in its queue
            p = 0.0
        new = priority(p, in_batch[j], w_n)
        if j < n_touched or in_batch[j] > 0:
            term[e] = s
            e += 1
        was = published[s]
        if new != was:
            if new > 0:
                up[a] = s
                a += 1
            else:
                gone[b] = s
                b += 1
            if new < was:
                fell[c] = s
                c += 1
            published[s] = new
    return (taken_positions[:t], remaining_rows,  # a Dispatch's fields
            remaining_rows[:taken.shape[0]], np.sort(up[:a]), gone[:b], np.sort(fell[:c]), term[:e])


def _interpreted() -> SimpleNamespace:
    """The kernels as Python runs them, each a copy of the plain function whose calls to the other kernels go
    to the plain copies too (this module's names become the compiled ones once :func:`compiled` ran)."""
    scope = dict(globals())
    scope.update({name: FunctionType(fn.__code__, scope, name, fn.__defaults__, fn.__closure__)
                  for name, fn in _KERNELS.items()})
    return SimpleNamespace(**{name: scope[name] for name in _KERNELS})


#: the kernels, interpreted
INTERPRETED = _interpreted()
_compiled: SimpleNamespace | None = None


def _numba_without_blas() -> None:
    """Import numba's array functions with its BLAS probe answered "none": numba looks for BLAS (for ``np.dot``
    and ``np.linalg``) by importing ``scipy.linalg.cython_blas`` when those functions load, at the first call of
    any compiled function, and scipy.linalg costs a process 0.2 s to import. No kernel here calls BLAS. Where
    scipy.linalg is loaded already the probe is cheap and runs as numba wrote it. (In a process that then
    compiles numba code of its own calling ``np.dot``, numba would use its BLAS-free loops or refuse
    ``np.linalg``: import scipy.linalg before the first round to keep BLAS.)"""
    probe = "scipy.linalg.cython_blas"
    if probe in sys.modules:
        import numba.np.arraymath  # noqa: F401
        return
    sys.modules[probe] = None  # the import in numba's probe fails at once (ImportError), as without scipy
    try:
        import numba.np.arraymath  # noqa: F401  its import runs the probe
    finally:
        del sys.modules[probe]


def compiled(cache: bool = True) -> SimpleNamespace:
    """The kernels compiled by numba (cached on disk), compiling them on the first call in this process.
    ``cache=False``: not on disk (the install's ahead-of-time build, ``policies.qas_aot``, loads this file under
    another module's name, which a cache entry would record and a run could then not load)."""
    global _compiled
    if _compiled is None:
        _numba_without_blas()  # a run that never compiles never imports numba
        from numba import njit

        scope = globals()
        for name, fn in _KERNELS.items():
            scope[name] = njit(cache=cache)(fn)
        _compiled = SimpleNamespace(**{name: scope[name] for name in _KERNELS})
    return _compiled
