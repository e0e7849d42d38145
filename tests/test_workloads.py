"""Real workloads: τ-bench agent sessions, Mooncake replay, arrival processes, every method on every kind."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import need_data
from prism.calibration.cost_model import load_profile
from prism.cli.trace import main as trace_main
from prism.core import PRIV, REUSE, SYS
from prism.policies.registry import METHODS, resolve_method
from prism.settings import EngineConfig, RunSpec
from prism.sim.run import simulate
from prism.traces.arrivals import ArrivalSpec, arrival_times, load_azure_timestamps
from prism.traces.mooncake import MooncakeSpec, block_hit_rate, read_records
from prism.traces.spec import generate, load_trace
from prism.traces.stats import trace_stats


@pytest.fixture(scope="module")
def agent_trace():
    need_data("tau_bench", "airline", "tasks_test.json")
    return load_trace("agent", {"num_requests": 600})


def test_agent_turns_extend_the_previous_turn(agent_trace):
    by_session: dict[str, list] = {}
    for r in agent_trace.requests:
        by_session.setdefault(r.session, []).append(r)
    multi = [rs for rs in by_session.values() if len(rs) > 1]
    assert len(multi) > 20
    for rs in multi:
        for a, b in zip(rs, rs[1:]):
            ta, tb = a.tokens(), b.tokens()
            assert len(tb) > len(ta) and np.array_equal(tb[:len(ta)], ta), "turn t+1 starts with turn t's prompt"
            assert a.arrival <= b.arrival


def test_agent_policy_and_tools_shared_per_domain(agent_trace):
    heads: dict[str, set] = {}
    for r in agent_trace.requests:
        domain = r.session.split("-")[0]
        assert r.segments[0].kind == SYS and r.segments[1].kind == REUSE and r.segments[-1].kind == PRIV
        assert r.fixed_order
        heads.setdefault(domain, set()).add((r.segments[0].id, r.segments[1].id,
                                             r.segments[0].tokens.tobytes(), r.segments[1].tokens.tobytes()))
    assert set(heads) == {"airline", "retail"}
    assert all(len(v) == 1 for v in heads.values()), "one policy and one tool schema per domain"
    assert len({next(iter(v))[0] for v in heads.values()}) == 2


def _task_sessions(domain_name):
    """Every task of a domain played into its calls, with the task beside it."""
    from prism.traces.agent import Domain, _Builder, _session_turns, AgentSpec
    from prism.traces.arrivals import default_data_dir

    domain = Domain(domain_name, default_data_dir() / "tau_bench" / domain_name)
    b = _Builder(AgentSpec())
    rng = np.random.default_rng(0)
    return [(task, _session_turns(domain, task, b, rng)) for task in domain.tasks]


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_agent_sessions_play_each_task_as_tau_bench_s_agent(domain):
    """From the task data alone: one call per tool call and per text reply (tau-bench's tool-calling agent);
    the tool calls are the task's actions in order, after a get_user_details when the task makes no lookup
    (the record is never in the prompt up front); a reply answers each user message (the instruction's
    sentences, the opening two together) and lists each write before the user's confirmation; every prompt
    ends with the generation prompt and extends the one before."""
    from prism.core import stable_hash
    from prism.traces.agent import LOOKUPS, WRITES, _dump, _sentences

    def call_id(action):
        text = "tool call: " + _dump({"name": action["name"], "arguments": action.get("kwargs", {})})
        return f"call:{stable_hash(text):016x}"

    for task, turns in _task_sessions(domain):
        actions = list(task["actions"])
        if task.get("user_id") and not {a["name"] for a in actions} & LOOKUPS:
            actions = [{"name": "get_user_details", "kwargs": {"user_id": task["user_id"]}}] + actions
        messages = max(1, len(_sentences(task["instruction"])) - 1)
        writes = {call_id(a) for a in actions if a["name"] in WRITES[domain]}
        assert len(turns) == len(actions) + messages + sum(a["name"] in WRITES[domain] for a in actions)
        for t in turns:
            assert t[-1].id.startswith("gen:") and t[-1].kind == PRIV
            assert t[2].id.startswith("msg:"), "the history opens with the user's message, no record before it"
        for a, b in zip(turns, turns[1:]):
            assert b[:len(a)] == a
        # the last call's history holds every earlier call's output: the task's tool calls, in order
        hist = turns[-1]
        called = [s.id for s in hist if s.id.startswith("call:")]
        assert called == [call_id(a) for a in actions][:len(called)] and len(called) >= len(actions) - 1
        for i, s in enumerate(hist):
            if s.id in writes:  # ... [reply listing it] [user's confirmation] [gen] [this call]
                assert hist[i - 3].id.startswith("reply:") and hist[i - 2].id.startswith("msg:")


def test_agent_prompt_cap_and_determinism():
    need_data("tau_bench", "retail", "tasks_test.json")
    small = load_trace("agent", {"num_requests": 300, "max_prompt_tokens": 7000, "domain": "retail"})
    assert max(r.prompt_len for r in small.requests) <= 7000
    again = load_trace("agent", {"num_requests": 300, "max_prompt_tokens": 7000, "domain": "retail"})
    assert all(np.array_equal(a.tokens(), b.tokens()) and a.arrival == b.arrival
               for a, b in zip(small.requests, again.requests))
    other = load_trace("agent", {"num_requests": 300, "max_prompt_tokens": 7000, "domain": "retail", "qps": 10})
    assert all(np.array_equal(a.tokens(), b.tokens()) for a, b in zip(small.requests, other.requests))


def test_agent_with_a_hugging_face_tokenizer(tmp_path):
    need_data("tau_bench", "airline", "tasks_test.json")
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the user wants to book a flight", "order details returned"],
                            trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    t = load_trace("agent", {"num_requests": 50, "tokenizer": str(tmp_path), "domain": "airline"})
    ids = np.concatenate([r.tokens() for r in t.requests])
    assert ids.max() < tok.get_vocab_size()


@pytest.fixture(scope="module")
def mooncake_records():
    return read_records(need_data("mooncake", "conversation_trace.jsonl"))


def test_mooncake_block_counts(mooncake_records):
    t = generate(MooncakeSpec())
    assert len(t) == len(mooncake_records) == 12031
    for r, rec in zip(t.requests, mooncake_records):
        assert len(r.segments) == math.ceil(rec["input_length"] / 512) == len(rec["hash_ids"])
        assert r.prompt_len == rec["input_length"]
        assert [s.id for s in r.segments] == [f"b{h}" for h in rec["hash_ids"]]


def test_mooncake_infinite_cache_hit_rate(mooncake_records):
    assert block_hit_rate(mooncake_records) == pytest.approx(0.366, abs=0.001)
    st = trace_stats(generate(MooncakeSpec()))
    assert st["infinite_cache_block_hit_rate"] == pytest.approx(0.366, abs=0.001)


def test_trace_stats_on_the_raw_mooncake_file(capsys):
    path = need_data("mooncake", "conversation_trace.jsonl")
    assert trace_main(["stats", str(path), "--json"]) == 0
    import json

    st = json.loads(capsys.readouterr().out)
    assert st["kind"] == "mooncake" and st["requests"] == 12031
    assert st["infinite_cache_block_hit_rate"] == pytest.approx(0.366, abs=0.001)


def test_mooncake_time_scaling_and_remapping(mooncake_records):
    base = generate(MooncakeSpec(num_requests=3000))
    for qps in (2.0, 7.5):
        t = generate(MooncakeSpec(num_requests=3000, qps=qps))
        arr = np.array([r.arrival for r in t.requests])
        assert np.all(np.diff(arr) >= 0)
        assert [r.id for r in t.requests] == [r.id for r in base.requests]
        assert (len(arr) - 1) / (arr[-1] - arr[0]) == pytest.approx(qps, rel=0.02)
    half = generate(MooncakeSpec(num_requests=100, time_scale=0.5))
    assert half.requests[-1].arrival == pytest.approx(base.requests[99].arrival * 0.5)
    small = generate(MooncakeSpec(num_requests=100, segment_tokens=64))
    for a, b in zip(small.requests, base.requests[:100]):
        assert a.prompt_len == b.prompt_len and len(a.segments) == math.ceil(b.prompt_len / 64)


def test_gamma_cv_within_sampling_error():
    rng = np.random.default_rng(3)
    for cv in (0.5, 1.0, 3.0):
        t = arrival_times(ArrivalSpec("gamma", qps=20.0, cv=cv), 40_000, rng)
        gaps = np.diff(np.concatenate([[0.0], t]))
        assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03 * max(cv, 1))
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05 * max(cv, 1))


@pytest.mark.parametrize("which", ["code", "conv"])
def test_azure_rescaled_mean_rate(which):
    need_data("azure_llm", f"AzureLLMInferenceTrace_{which}.csv")
    t = arrival_times(ArrivalSpec(f"azure_{which}", qps=25.0), 5000, np.random.default_rng(0))
    assert len(t) == 5000 and t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(25.0, rel=0.02)
    raw = load_azure_timestamps(need_data("azure_llm", f"AzureLLMInferenceTrace_{which}.csv"), 5000)
    # the shape of the real process is kept: gaps are the real gaps, scaled
    assert np.allclose(np.diff(t) / np.diff(t).mean(), np.diff(raw) / np.diff(raw).mean())


KINDS = {
    "zipf": {"num_requests": 120, "qps": 20},
    "multihop": {"num_requests": 120, "qps": 20},
    "agent": {"num_requests": 120, "qps": 10},
    "mooncake": {"num_requests": 60, "qps": 1.0},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_method_runs_every_kind(kind):
    if kind == "multihop":
        need_data("multihop_rag", "queries.json")
    if kind == "agent":
        need_data("tau_bench", "airline", "tasks_test.json")
    if kind == "mooncake":
        need_data("mooncake", "conversation_trace.jsonl")
    trace = load_trace(kind, KINDS[kind])
    profile = load_profile()
    engine = EngineConfig(max_total_tokens=None)
    for method in METHODS:
        _, s, e = resolve_method(method, None, None)
        res = simulate(RunSpec.build(trace, s, e, engine=engine, profile=profile, label=method))
        assert len(res.records) == len(trace)
        assert 0.0 <= res.summary["hit_rate"] <= 1.0


def test_trace_cli_stats_and_sample_every_kind(capsys):
    need_data("tau_bench", "airline", "tasks_test.json")
    assert trace_main(["stats", "agent", "--set", "num_requests=100"]) == 0
    out = capsys.readouterr().out
    assert "sessions" in out and "infinite_cache_hit_rate" in out
    assert trace_main(["sample", "agent", "-n", "2", "--set", "num_requests=10"]) == 0
    assert "session=" in capsys.readouterr().out
