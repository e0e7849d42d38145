"""A QAS round as compiled loops: counters and priorities, signatures, then buckets, scores and lanes; the
front alignment of one request; and what changed between two publications of P̂.

Why compiled: a round reads every queued segment occurrence once (O(S)), but written as numpy array
operations it took about fifty of them, and at the queue sizes an engine sees (hundreds of requests) their
fixed costs, not the work, set the round's time; in the simulator those rounds were most of what QAS cost.
Here each pass is plain loops that numba compiles on first use and caches on disk. The loops also replace
sorts by counting where the data allows: the FIFO order and the buckets come from counting sorts, distinct
(bucket, segment) pairs from a marker per segment, and the lanes are read off the buckets in score order.

The inputs are QAS's request matrix (``policies.qas._Rows``): one row per request, column 0 its system
segment, then its reusable segments in prompt order, -1 padded; segments are numbered in first-seen order.
Every float is computed with the same operations, in the same order per element, as the formulas in
``policies.qas`` state them; sums of distinct terms (bucket utilities) may add in another order, which is
exact for the default integer weights."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def segment_counts(mat, rows, width, size):
    """Per segment (``size`` of them): how many of these rows contain it, system and reusable segments."""
    count = np.zeros(size)
    for i in range(rows.shape[0]):
        r = rows[i]
        for c in range(width):
            s = mat[r, c]
            if s >= 0:
                count[s] += 1
    return count


@njit(cache=True)
def priorities(mat, rows, width, active, nxt, w_a, w_n, w_g):
    """Counters and priorities of every known segment: ``(base, prio)``, base = w_a·a + w_g·g (the part of
    P that does not depend on the reference batch) and prio = base + w_n·n over the predicted next batch."""
    base = w_a * active + w_g * segment_counts(mat, rows, width, active.shape[0])
    return base, base + w_n * nxt


@njit(cache=True)
def _before(prio, a, b):
    """Whether segment a ranks before b: higher priority, ties to the segment seen first (lower index)."""
    return prio[a] > prio[b] or (prio[a] == prio[b] and a < b)


@njit(cache=True)
def _align(mat, r, m, fixed, prio, f, top, out):
    """Row r's aligned order into ``out[:m]``: its top-f reusable segments first, best first, the others in
    prompt order (``fixed`` rows, and rows with fewer than two segments, keep theirs). ``top[:m]`` gets the
    row's segments best first. Returns whether the order changed."""
    for j in range(m):  # insertion sort: rows are short
        s = mat[r, 1 + j]
        k = j
        while k > 0 and _before(prio, s, top[k - 1]):
            top[k] = top[k - 1]
            k -= 1
        top[k] = s
    t = 0 if fixed or m < 2 else min(f, m)
    for j in range(t):
        out[j] = top[j]
    k = t
    for j in range(m):
        s = mat[r, 1 + j]
        lead = False
        for x in range(t):
            if top[x] == s:
                lead = True
        if not lead:
            out[k] = s
            k += 1
    moved = False
    for j in range(m):
        if out[j] != mat[r, 1 + j]:
            moved = True
    return moved


@njit(cache=True)
def aligned_row(mat, r, lengths, fixed, prio, f):
    """Row r's aligned order (segment indices) and whether it differs from the prompt's: the engine asks
    only for the requests it admits."""
    m = lengths[r]
    top = np.empty(m, np.int64)
    out = np.empty(m, np.int64)
    moved = _align(mat, r, m, fixed[r], prio, f, top, out)
    return out, moved


@njit(cache=True)
def signatures(mat, rows, lengths, fixed, prio, f, kappa):
    """Each queued request's top-kappa reusable segments, listed in its aligned order (-1 padded, ``kappa``
    columns; kappa = 1: the best segment, -1 without any)."""
    n = rows.shape[0]
    sig = np.full((n, kappa), -1, np.int64)
    cols = mat.shape[1]
    top = np.empty(cols, np.int64)
    out = np.empty(cols, np.int64)
    for i in range(n):
        r = rows[i]
        m = lengths[r]
        if kappa == 1:
            for j in range(m):
                s = mat[r, 1 + j]
                if j == 0 or _before(prio, s, sig[i, 0]):
                    sig[i, 0] = s
            continue
        _align(mat, r, m, fixed[r], prio, f, top, out)
        q = 0
        for j in range(m):
            for x in range(min(kappa, m)):
                if top[x] == out[j]:
                    sig[i, q] = out[j]
                    q += 1
    return sig


@njit(cache=True)
def order_queue(mat, rows, width, fifo, lengths, sig, base, w_n, alpha, beta, hint, q_cold):
    """Buckets, their scores and the admission order of one round.

    Requests with the same signature form a bucket, FIFO inside (by ``fifo``, a unique age key). A bucket's
    provisional batch is its first ``hint`` requests; U(b) is the mean over the bucket's distinct reusable
    segments of base + w_n·n(r; batch), and Score(b) = alpha·|b| + beta·U(b). The order is the ``q_cold``
    oldest requests (FIFO), then the buckets by descending score (ties: older head), FIFO inside.

    Returns ``(order, cold, grouped, starts, size, score)``: queue positions in admission order, the cold
    lane's positions, the positions grouped by bucket, and per bucket its start in ``grouped``, size and score.
    """
    n = rows.shape[0]
    V = base.shape[0]
    # the queue in FIFO order; fifo keys are unique, and dense for an engine's queue: a counting sort
    low = fifo.min()
    spread = fifo.max() - low + 1
    if spread <= 4 * n + 64:
        slot = np.full(spread, -1, np.int64)
        for p in range(n):
            slot[fifo[p] - low] = p
        by_age = slot[slot >= 0]
    else:
        by_age = np.argsort(fifo)
    # buckets, numbered in the order of their heads' age; members in FIFO order (a stable counting sort)
    low = sig.min()
    bucket_of = np.full(sig.max() - low + 1, -1, np.int64)
    bucket = np.empty(n, np.int64)
    count = np.zeros(n + 1, np.int64)
    nb = 0
    for p in by_age:
        k = sig[p] - low
        if bucket_of[k] < 0:
            bucket_of[k] = nb
            nb += 1
        bucket[p] = bucket_of[k]
        count[bucket[p] + 1] += 1
    starts = np.cumsum(count[:nb + 1])  # bucket b is grouped[starts[b]:starts[b + 1]]
    grouped = np.empty(n, np.int64)
    fill = starts[:nb].copy()
    for p in by_age:
        grouped[fill[bucket[p]]] = p
        fill[bucket[p]] += 1
    starts = starts[:nb]
    size = np.empty(nb, np.int64)
    score = np.empty(nb)
    seen = np.full(V, -1, np.int64)  # the last bucket that counted each segment
    for b in range(nb):
        lo = starts[b]
        hi = starts[b + 1] if b + 1 < nb else n
        size[b] = hi - lo
        in_batch = 0  # n(r; batch) summed over the bucket's segments: the batch's segment occurrences
        total = 0.0
        distinct = 0
        for j in range(lo, hi):
            r = rows[grouped[j]]
            if j - lo < hint:
                in_batch += lengths[r]
            for c in range(1, width):
                s = mat[r, c]
                if s < 0:
                    break
                if seen[s] != b:
                    seen[s] = b
                    distinct += 1
                    total += base[s]
        util = total + w_n * float(in_batch)
        if distinct > 0:
            util /= distinct
        score[b] = alpha * size[b] + beta * util

    # lanes: the q oldest first, then buckets by (descending score, older head), FIFO inside
    q = min(q_cold, n)
    cold = by_age[:q]
    is_cold = np.zeros(n, np.bool_)
    order = np.empty(n, np.int64)
    for j in range(q):
        is_cold[cold[j]] = True
        order[j] = cold[j]
    by_score = np.argsort(-score, kind="mergesort")  # stable: buckets are numbered by their heads' age
    k = q
    for b in by_score:
        lo = starts[b]
        hi = starts[b + 1] if b + 1 < nb else n
        for j in range(lo, hi):
            p = grouped[j]
            if not is_cold[p]:
                order[k] = p
                k += 1
    return order, cold, grouped, starts, size, score


@njit(cache=True)
def changes(new, old):
    """Where a publication differs from the last (``old`` is shorter when segments were added since; its
    missing entries are zero): ``(set, dropped)``, the indices now positive and those now zero."""
    n = new.shape[0]
    up = np.empty(n, np.int64)
    gone = np.empty(n, np.int64)
    a = b = 0
    for i in range(n):
        was = old[i] if i < old.shape[0] else 0.0
        if new[i] != was:
            if new[i] > 0:
                up[a] = i
                a += 1
            else:
                gone[b] = i
                b += 1
    return up[:a], gone[:b]
