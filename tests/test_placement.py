"""KVPR placement (policies/placement.py): by hand, against a search over all placements, TP, τ, rates, idling."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from prism.errors import UserError
from prism.policies.placement import (ModelLoad, TokenRate, check_fits, idle_models, kvpr, place, place_woken)

GB = 1e9


def model(name, rate, weights_gb, kv=131072.0, slo=0.05, tp=1, current=()):
    return ModelLoad(name, rate, kv, weights_gb * GB, slo, tp, tuple(current))


def test_kvpr_by_hand():
    a, b = model("a", 1000, 16), model("b", 500, 6, kv=114688, slo=0.02)
    da, db = 1000 * 131072 / 0.05, 500 * 114688 / 0.02
    assert a.demand == pytest.approx(da) and b.demand == pytest.approx(db)
    assert kvpr(da + db, 22 * GB, 80 * GB) == pytest.approx((da + db) / (58 * GB))
    assert kvpr(1.0, 80 * GB, 80 * GB) == math.inf


def test_algorithm_1_by_hand():
    """Sorted by demand: c (d=4), a (3), b (2), d (1), all 10 GB, two GPUs of 100 GB. c -> GPU 0 (both 0, the
    first); a -> GPU 1 (0 < 4/90); b: GPU 0 at 4/90 = 0.0444 vs GPU 1 at 3/90 = 0.0333 -> GPU 1; d: GPU 0 at
    4/90 vs GPU 1 at 5/80 -> GPU 0."""
    unit = 1.0 / (131072 / 0.05)  # a token rate of `unit` makes d = 1
    ms = [model("a", 3 * unit, 10), model("b", 2 * unit, 10), model("c", 4 * unit, 10), model("d", unit, 10)]
    p = place(ms, [100 * GB] * 2)
    assert dict(p.gpus) == {"c": (0,), "a": (1,), "b": (1,), "d": (0,)}
    assert p.kvpr == pytest.approx((5 / (80 * GB), 5 / (80 * GB)))
    assert p.unplaced == () and p.moved == ()


def test_tau_keeps_a_model_unless_moving_gains_more():
    """Line 8: stay on g_k unless current_r − best_r > τ, compared before the model is added."""
    unit = 1.0 / (131072 / 0.05)
    big = model("big", 10 * unit, 10, current=(0,))
    small = model("small", unit, 10, current=(0,))  # placed after big: GPU 0 at 10/90, GPU 1 at 0
    gain = 10 / (90 * GB)
    assert place([big, small], [100 * GB] * 2, tau=gain * 1.01).gpus["small"] == (0,)
    moved = place([big, small], [100 * GB] * 2, tau=gain * 0.99)
    assert moved.gpus["small"] == (1,) and moved.moved == ("small",)


def test_a_model_whose_gpu_no_longer_fits_it_moves_and_one_that_fits_nowhere_is_unplaced():
    # a keeps GPU 0 (60 of 100 GB); b's 45 GB no longer fit beside it: b moves whatever τ; c's 70 GB fit nowhere
    ms = [model("a", 100, 60, current=(0,)), model("b", 10, 45, current=(0,)), model("c", 1, 70)]
    p = place(ms, [100 * GB] * 2, tau=math.inf)
    assert p.gpus == {"a": (0,), "b": (1,)} and p.moved == ("b",)
    assert p.unplaced == ("c",)
    # with room beside a and τ = 0, b still moves: GPU 1's KVPR (0) is below GPU 0's
    assert place([ms[0], model("b", 10, 30, current=(0,))], [100 * GB] * 2).gpus["b"] == (1,)


def test_kv_floors_keep_room_for_every_residents_own_kv():
    """A model with a KV floor (a static pool that must hold its largest request) goes only where its weights and
    floor fit beside those already placed: by hand, then on random fleets (no GPU over its capacity, and floors
    of 0 place exactly as none)."""
    # a takes 50 GB + a 20 GB floor; b's 25 + 10 beside it make 105 GB: not on one GPU of 100, on one of 105
    a = ModelLoad("a", 100, 131072.0, 50 * GB, 0.05, min_kv_bytes=20 * GB)
    b = ModelLoad("b", 10, 131072.0, 25 * GB, 0.05, min_kv_bytes=10 * GB)
    assert place([a, b], [100 * GB]).unplaced == ("b",)
    assert place([a, b], [100 * GB]).gpus == {"a": (0,)}
    assert place([a, b], [105 * GB]).gpus == {"a": (0,), "b": (0,)}
    assert place([a, b], [100 * GB, 100 * GB]).gpus == {"a": (0,), "b": (1,)}
    rng = np.random.default_rng(3)
    for _ in range(300):
        n_gpu = int(rng.integers(1, 4))
        ms = small_models(rng, int(rng.integers(1, 7)), 2, 30)
        floors = [ModelLoad(m.name, m.token_rate, m.kv_bytes_per_token, m.weight_bytes, m.tpot_slo_s,
                            min_kv_bytes=float(rng.uniform(0, 20)) * GB) for m in ms]
        caps = [80 * GB] * n_gpu
        p = place(floors, caps, min_kv_bytes=1 * GB)
        for g in range(n_gpu):
            assert sum(m.weight_bytes + m.min_kv_bytes for m in floors if p.gpus.get(m.name) == (g,)) <= caps[g]
        for name in p.unplaced:  # left out only where no GPU had its weights and floor free
            m = next(x for x in floors if x.name == name)
            assert all(sum(x.weight_bytes + x.min_kv_bytes for x in floors if p.gpus.get(x.name) == (g,))
                       + m.weight_bytes + m.min_kv_bytes > caps[g]
                       or caps[g] - sum(x.weight_bytes for x in floors if p.gpus.get(x.name) == (g,))
                       - m.weight_bytes <= 1 * GB for g in range(n_gpu))
        assert place(ms, caps, min_kv_bytes=1 * GB) == place([ModelLoad(m.name, m.token_rate, m.kv_bytes_per_token,
                                                                         m.weight_bytes, m.tpot_slo_s, min_kv_bytes=0.0)
                                                              for m in ms], caps, min_kv_bytes=1 * GB)


def test_tensor_parallel_entries_go_to_distinct_gpus_of_one_node():
    ms = [model("tp4", 4000, 40, tp=4), model("x", 3000, 8), model("y", 10, 8)]
    p = place(ms, [80 * GB] * 8, nodes=[0] * 4 + [1] * 4)
    assert len(set(p.gpus["tp4"])) == 4 and len({g // 4 for g in p.gpus["tp4"]}) == 1
    # App. A.2.2: each entry carries 1/tp of the weights and of d
    share = ms[0].demand / 4
    for g in p.gpus["tp4"]:
        others = sum(m.demand for m in ms[1:] if p.gpus[m.name] == (g,))
        w = 10 * GB + sum(8 * GB for m in ms[1:] if p.gpus[m.name] == (g,))
        assert p.kvpr[g] == pytest.approx((share + others) / (80 * GB - w))
    # a node too small for the model's entries: unplaced as a whole, nothing of it left behind
    full = place([model("a", 1, 70, current=(0,)), model("tp2", 0.5, 40, tp=2)], [80 * GB] * 2)
    assert full.unplaced == ("tp2",) and full.kvpr[1] == 0.0


def test_woken_model_goes_to_the_lowest_kvpr_that_fits():
    loads = [(5.0, 20 * GB), (1.0, 70 * GB), (2.0, 10 * GB)]  # (Σd, Σw) per GPU
    assert place_woken(model("w", 1, 8), loads, [80 * GB] * 3) == (2,)  # 2/70 GB < 5/60 < 1/10
    assert place_woken(model("w", 1, 8), [(5.0, 20 * GB), (0.1, 70 * GB)], [80 * GB] * 2) == (1,)  # 0.1/10 wins
    assert place_woken(model("w", 1, 75), loads, [80 * GB] * 3) is None


def brute_force(models, caps):
    """The least max-KVPR over every placement of tp-1 models whose weights leave KV room on every GPU."""
    best = math.inf
    for a in itertools.product(range(len(caps)), repeat=len(models)):
        d, w = [0.0] * len(caps), [0.0] * len(caps)
        for m, g in zip(models, a):
            d[g] += m.demand
            w[g] += m.weight_bytes
        if all(c - x > 0 for c, x in zip(caps, w)):
            best = min(best, max(kvpr(x, y, c) for x, y, c in zip(d, w, caps)))
    return best


def small_models(rng, n, gb_low, gb_high):
    return [ModelLoad(f"m{i}", float(rng.lognormal(7, 1.0)), float(rng.choice([32768, 114688, 131072])),
                      float(rng.uniform(gb_low, gb_high)) * GB, float(rng.uniform(0.01, 0.05))) for i in range(n)]


def measured(gb_low, gb_high, cases=300, seed=1):
    """(worst ratio to the optimum, placements left incomplete, incomplete although guaranteed, the paper's
    bound broken) over random fleets of 2-3 GPUs of 80 GB and 2-7 models."""
    rng = np.random.default_rng(seed)
    worst, incomplete, guaranteed_failed, bound_broken = 1.0, 0, 0, 0
    for _ in range(cases):
        n_gpu = int(rng.integers(2, 4))
        ms = small_models(rng, int(rng.integers(2, 8 if n_gpu == 2 else 6)), gb_low, gb_high)
        caps = [80 * GB] * n_gpu
        p = place(ms, caps)
        # Σw < N·(C − max w): every model finds a GPU with room, whatever came before
        guaranteed = sum(m.weight_bytes for m in ms) < n_gpu * (80 * GB - max(m.weight_bytes for m in ms))
        if p.unplaced:
            incomplete += 1
            guaranteed_failed += guaranteed
            continue
        opt = brute_force(ms, caps)
        assert p.max_kvpr >= opt * (1 - 1e-12)  # nothing beats the search
        worst = max(worst, p.max_kvpr / opt)
        g = max(range(n_gpu), key=lambda i: p.kvpr[i])
        left = 80 * GB - sum(m.weight_bytes for m in ms if p.gpus[m.name] == (g,))
        bound_broken += p.max_kvpr > opt * (1 + 80 * GB / left) * (1 + 1e-12)  # App. A.2.1
    return worst, incomplete, guaranteed_failed, bound_broken


def test_against_all_placements_for_1_to_8b_models():
    """Weights of 2-16 GB (the 1-8 B models) on 80 GB GPUs: every placement complete; over 300 random fleets the
    greedy max-KVPR is the optimum's in 86% of them, within 1.08x in 95%, and at most 1.264x (measured); the
    paper's bound holds."""
    worst, incomplete, guaranteed_failed, bound_broken = measured(2, 16)
    assert incomplete == 0 and bound_broken == 0
    assert worst <= 1.265


def test_against_all_placements_when_weights_crowd_the_gpus():
    """Weights of 10-35 GB: greedy by demand packs weights badly at times. Measured over 300 fleets: 19
    placements leave a model out (never where Σw < N·(C − max w) guarantees room), and of the 281 complete ones
    75% are optimal, 95% within 1.89x, the worst 28.6x the optimum's max-KVPR: a GPU left with little KV memory
    under a high-demand model. The paper's bound (which grows as that memory shrinks) still holds."""
    worst, incomplete, guaranteed_failed, bound_broken = measured(10, 35)
    assert guaranteed_failed == 0 and bound_broken == 0
    assert incomplete <= 19 and worst <= 28.7


def test_token_rate_over_a_moving_window():
    r = TokenRate(60.0)
    r.add(0.0, 600)
    r.add(30.0, 1200)
    assert r.rate(30.0) == pytest.approx(1800 / 60)
    assert r.rate(60.0) == pytest.approx(1200 / 60)  # the first fell out at t = 60 (window (0, 60])
    assert r.rate(90.0) == 0.0
    with pytest.raises(ValueError):
        r.add(10.0, 1)


def test_idle_models_longest_idle_first_never_a_busy_one():
    last = {"a": 0.0, "b": 50.0, "c": 10.0, "d": 100.0}
    assert idle_models(last, busy={"c"}, now=100.0) == ["a", "b"]  # idle 100 s and 50 s; c is busy
    assert idle_models(last, busy=set(), now=100.0, idle_s=45.0) == ["a", "c", "b"]


def test_bad_input_names_the_field():
    with pytest.raises(UserError, match=r"model 'a': field 'tpot_slo_s': must be a finite number > 0"):
        model("a", 1, 1, slo=0)
    with pytest.raises(UserError, match=r"model 'a': no TPOT SLO to place it by"):
        model("a", 1, 1, slo=math.inf)
    with pytest.raises(UserError, match=r"model 'a': field 'token_rate'"):
        model("a", -1, 1)
    with pytest.raises(UserError, match=r"model 'big': field 'tp': 16 GPUs"):
        place([model("big", 1, 10, tp=16)], [80 * GB] * 8)
    with pytest.raises(UserError, match=r"model 'huge': does not fit on any GPU"):
        check_fits([model("huge", 1, 141)], [80 * GB] * 2)
    check_fits([model("huge", 1, 141, tp=2)], [80 * GB] * 2)
    with pytest.raises(UserError, match="listed twice"):
        place([model("a", 1, 1), model("a", 2, 1)], [80 * GB])
