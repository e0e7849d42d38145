"""SGLang's admission estimate and retraction (``engine.admission: sglang``), on scenarios computed by hand.

Every iteration costs exactly 1 s (a_p = a_d = 1, no other cost), page size 1, and the new-token ratio is held
fixed (floor = init), so each number below follows from the rules in :mod:`prism.sim.admission`.
"""

from __future__ import annotations

import pytest

from conftest import PRIV, make_trace
from prism.calibration.cost_model import CostModel, Profile, load_profile
from prism.settings import EngineConfig, RunSpec
from prism.sim.admission import NewTokenRatio, keep_order
from prism.sim.run import simulate


def _run(requests, admission="sglang", capacity=40, ratio=0.25):
    base = load_profile()
    profile = Profile(CostModel(a_p=1.0, a_d=1.0), base.gpu, base.model, 10_000)
    cfg = EngineConfig(max_total_tokens=capacity, admission=admission, init_new_token_ratio=ratio,
                       min_new_token_ratio_factor=1.0)
    res = simulate(RunSpec.build(make_trace(requests), "fcfs", "lru", engine=cfg, profile=profile))
    return sorted(res.records, key=lambda r: r.id), res.summary["counters"]


# A: 4 private prompt tokens, 30 output tokens, at t=0; B: 4 private tokens, 20 output tokens, at t=2.5
TWO = [(0.0, [(PRIV, "a", 4)], 30), (2.5, [(PRIV, "b", 4)], 20)]


def test_kv_runs_out_mid_decode_the_newest_request_is_retracted_and_prefilled_again():
    (a, b), counters = _run(TWO)
    # t=0: A fits (4 + 30 + 1 page = 35 < 40); prefill [0, 1], first token at 1; decode steps from t=1.
    assert (a.prefill_start, a.first_token) == (0.0, 1.0)
    # t=3, two decode steps done: A holds 4 + 2 tokens and may still decode 27 x ratio 0.25 = 6.75;
    # B needs 4 + 20 + 1 = 25 < 40 - 6 - 6.75 = 27.25: admitted; prefill [3, 4].
    assert (b.prefill_start, b.first_token, b.hit_tokens) == (3.0, 4.0, 0)
    # Two tokens per step from 10 in use: the pool is full after 15 steps (step 17, t=19). A has generated
    # 18 tokens, B 16: B (fewest) is retracted. Its 15 decode tokens are freed, its prompt is unlocked and
    # evicted at once (SGLang frees 20 tokens per kept request). The ratio becomes min(1, (18+20)/(30+1)) = 1:
    # at t=20 B's re-prefill (4 + 16 = 20 tokens, no hit, 4 more to generate: 25) does not fit beside A
    # (40 - 22 in use - 11 x 1.0 = 7), so B waits for A, which decodes its last 12 tokens to t=31.
    assert a.finish == 31.0
    assert counters["retractions"] == 1 and counters["retracted_output_tokens"] == 16
    # t=31: B is prefilled again (20 tokens, nothing cached: [31, 32], its 17th token), then 3 decode steps.
    assert counters["reprefilled_tokens"] == 20 and counters["reprefill_hit_tokens"] == 0
    assert b.finish == 35.0
    # its TTFT and hit are those of its first prefill
    assert b.first_token == 4.0 and b.hit_tokens == 0


def test_full_reservation_never_retracts():
    (a, b), counters = _run(TWO, admission="full")
    # A reserves 4 + 29 = 33 of 40: B (4 + 19) waits for A: [1, 30] decode, so A finishes at 30
    assert a.finish == 30.0 and b.prefill_start == 30.0
    assert "retractions" not in counters
    # B: prefill [30, 31], 19 decode steps
    assert b.finish == 50.0


def test_a_retracted_request_hits_its_surviving_prompt():
    # A: 4 + 60 at t=0; B: 24 + 50 at t=2.5; capacity 100, ratio 0.1. B fits at t=3 (75 < 100 - 6 - 57 x 0.1);
    # 30 tokens in use, two a step: the pool is full at step 37, where A has generated 38 and B 36 tokens. B's
    # 35 decode tokens freed cover the 20 SGLang frees for A, so B's prompt (inserted after its prefill)
    # stays cached; B's re-prefill (24 + 36 tokens) waits for A and hits those 24.
    (a, b), counters = _run([(0.0, [(PRIV, "a", 4)], 60), (2.5, [(PRIV, "b", 24)], 50)], capacity=100, ratio=0.1)
    assert counters["retractions"] == 1 and counters["retracted_output_tokens"] == 36
    assert counters["reprefill_hit_tokens"] == 24 and counters["reprefilled_tokens"] == 36
    assert b.hit_tokens == 0  # the record keeps its first admission's hit
    assert b.finish > a.finish


def test_new_token_ratio_follows_sglang():
    r = NewTokenRatio(0.7, 0.14, 600)
    assert (r.init, r.floor) == (0.7, pytest.approx(0.098))
    for _ in range(600):
        r.decay_step()
    assert r.current == pytest.approx(0.098)
    r.decay_step()
    assert r.current == pytest.approx(0.098)  # never below the floor
    r.after_retract(kept_generated=100, kept_max_new=1000, kept=5, retract_steps=20)
    assert r.current == pytest.approx(200 / 1001)
    r.reset()
    assert r.current == 0.7


def test_retraction_order_fewest_generated_then_longest_prompt():
    reqs = [("a", 5, 10), ("b", 3, 10), ("c", 3, 50), ("d", 9, 1)]  # (name, generated, prompt)
    kept = keep_order(reqs, lambda r: r[1], lambda r: r[2])
    assert [r[0] for r in kept] == ["d", "a", "b", "c"]  # retracted from the end: c first
