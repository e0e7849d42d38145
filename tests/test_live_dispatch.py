"""The live cluster's client-side view of each server (``live/dispatch.py``), without SGLang.

Against a brute-force reference: after any sequence of sends, first tokens and stream ends, a
:class:`ClientView` reports the requests in flight before and after their first token, the sum of the queued
requests' uncached-token estimates (each the prompt minus its longest common prefix with the prompts sent
there before), and ``match_len`` as that longest common prefix; with a capacity, its tree never holds more and
never claims more than the reference. The :class:`Dispatcher` hands the registry's routers these views.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.core import TOKEN_DTYPE
from prism.live.dispatch import ClientView, Dispatcher
from prism.live.requests import LiveRequest
from prism.policies.registry import make_router, router_config


def key(tokens) -> bytes:
    return np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes()


def lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# prompts from a small alphabet, so that they share prefixes often
prompts = st.lists(st.integers(1, 3), min_size=1, max_size=12)
ops = st.lists(st.tuples(st.sampled_from(["send", "first", "done"]), prompts, st.integers(0, 50)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_client_view_matches_a_brute_force_reference(seq):
    view = ClientView(0, capacity_tokens=10 ** 9)
    sent: list[list[int]] = []
    queued: dict[int, int] = {}  # id -> estimate
    running: set[int] = set()
    next_id = 0
    for op, prompt, pick in seq:
        if op == "send":
            est = len(prompt) - max((lcp(prompt, p) for p in sent), default=0)
            assert view.sent(next_id, key(prompt), float(next_id)) == est
            queued[next_id] = est
            sent.append(prompt)
            next_id += 1
        elif op == "first" and queued:
            rid = sorted(queued)[pick % len(queued)]
            view.first_token(rid)
            del queued[rid]
            running.add(rid)
        elif op == "done" and next_id:
            rid = pick % next_id  # any request, also one already done (a no-op)
            view.done(rid)
            queued.pop(rid, None)
            running.discard(rid)
        assert view.queued == len(queued) and view.running == len(running)
        assert view.queued_prefill_tokens == sum(queued.values())
        assert view.match_len(key(prompt)) == max((lcp(prompt, p) for p in sent), default=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(prompts, min_size=1, max_size=30), st.integers(1, 20))
def test_the_tree_is_cut_to_the_servers_capacity(seq, capacity):
    view = ClientView(0, capacity_tokens=capacity)
    for i, prompt in enumerate(seq):
        view.sent(i, key(prompt), float(i))
        assert view.tree.size <= capacity
        assert view.match_len(key(prompt)) <= max(lcp(prompt, p) for p in seq[:i + 1])
        view.done(i)
    assert view.queued == view.running == view.queued_prefill_tokens == 0


def test_sending_a_request_twice_to_one_instance_is_refused():
    view = ClientView(0, 100)
    view.sent(7, key([1, 2]), 0.0)
    with pytest.raises(ValueError):
        view.sent(7, key([1, 2]), 0.0)


def _req(i: int, tokens) -> LiveRequest:
    return LiveRequest(i, 0.01 * i, list(tokens), 4, {})


def _dispatcher(router: str, n: int = 2, capacity: int = 10 ** 6) -> Dispatcher:
    return Dispatcher(make_router(router, router_config(router)), [f"http://h:{i}/" for i in range(n)],
                      [capacity] * n, clock=lambda: 0.0)


def test_round_robin_through_the_dispatcher():
    d = _dispatcher("rr", 3)
    urls = [d.pick(_req(i, [i + 1, 5, 6])) for i in range(7)]
    assert urls == [f"http://h:{i % 3}" for i in range(7)]
    assert d.placed == {i: i % 3 for i in range(7)}
    assert [v.queued for v in d.views] == [3, 2, 2]
    d.first_token(0)
    d.done(1)
    assert (d.views[0].queued, d.views[0].running, d.views[1].queued) == (2, 1, 1)
    d.done(99)  # never placed: ignored


def test_least_load_reads_the_client_side_counts():
    d = _dispatcher("least_load")
    assert d.route(_req(0, [1])) == 0 and d.route(_req(1, [2])) == 1
    d.done(1)  # instance 1 is empty again
    assert d.route(_req(2, [3])) == 1


def test_lmetric_follows_the_estimated_cache_and_the_queued_prefill():
    d = _dispatcher("lmetric")
    shared = list(range(10, 110))  # 100 tokens
    assert d.route(_req(0, shared + [1])) == 0
    d.done(0)
    # the same prefix again: instance 0 holds it (P = 1 + 0 queued) and beats the empty instance 1 (P = 101)
    assert d.route(_req(1, shared + [2])) == 0
    assert d.views[0].queued_prefill_tokens == 1
    # a fresh prompt: instance 1 is idle with nothing queued, instance 0 has one request in flight
    assert d.route(_req(2, [7] * 50)) == 1
    assert d.views[1].queued_prefill_tokens == 50


def test_cache_aware_sends_a_shared_prefix_to_the_same_instance():
    d = _dispatcher("cache_aware")
    shared = list(range(10, 60))
    first = d.route(_req(0, shared + [1, 2]))
    assert d.route(_req(1, [9] * 40)) != first  # no match, request 0 in flight: the least loaded (sglang-router 0.3.2)
    d.done(0)
    d.done(1)
    assert d.route(_req(2, shared + [3, 4])) == first  # match rate 50/52 > 0.3
    d.done(2)
    assert d.route(_req(3, [5] * 40)) == 0  # no match, equal loads: the first, as the router's min_by_key
