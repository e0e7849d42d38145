"""The multi_model trace kind: its statistics against the data README's facts, determinism, the arrival
readings (ServeGen rates, Azure services), per-model trace specs, the JSONL format and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as sps

from conftest import need_data
from prism.cli.trace import main as trace_main
from prism.errors import UserError
from prism.traces import trace as fmt
from prism.traces.multimodel import MultiModelSpec, content, cut_lognormal, model_streams, on_periods
from prism.traces.spec import load_trace
from prism.traces.stats import model_stats, trace_stats

ARENA = [{"name": f"m{i}", "profile": "llama-3.2-1b"} for i in range(27)]
SEEDS = range(8)


@pytest.fixture(scope="module")
def arena():
    """27 models over 600 s with every default: the Chatbot-Arena trace the README describes."""
    return [content(MultiModelSpec(seed=s, models=ARENA)) for s in SEEDS]


def test_arena_statistics_match_the_readme(arena):
    """README: inter-arrival CV 1.1; top 3 of 27 models 50% of the requests, top 5 63%; 14-20 of 27 models
    active in any minute; 249 idle gaps over 10 s. Means over 8 seeds (about 660 requests each). Over 40 seeds
    the defaults give CV 1.103 (standard deviation per trace 0.048), top-3 0.508 (0.029), top-5 0.623 (0.024),
    per-minute active models min/median/max 14.6/17.6/21.2 and 232 idle gaps (13): the tolerances are those
    offsets plus about 2.5 standard errors of an 8-seed mean."""
    st = [model_stats(t.requests) for t in arena]
    mean = {k: float(np.mean([s[k] for s in st])) for k in
            ("interarrival_cv", "top3_models_share", "top5_models_share", "idle_gaps_over_10s")}
    assert mean["interarrival_cv"] == pytest.approx(1.1, abs=0.06)
    assert mean["top3_models_share"] == pytest.approx(0.50, abs=0.035)
    assert mean["top5_models_share"] == pytest.approx(0.63, abs=0.03)
    assert mean["idle_gaps_over_10s"] == pytest.approx(249, abs=30)
    active = [s["active_models_per_minute"] for s in st]
    assert 14 <= np.mean([a["p50"] for a in active]) <= 20
    assert np.mean([a["min"] for a in active]) >= 13 and np.mean([a["max"] for a in active]) <= 22
    assert all(len(s["requests_per_model"]) >= 20 for s in st)


def test_arena_lengths_match_the_readme(arena):
    """Prompts p50/p90/max 40/432/1021 tokens, outputs 211/513/977, pooled over the 8 traces (about 5,300
    requests: the sample quantiles' standard errors are about 3% at the median and 5% at the 90th percentile)."""
    prompt = np.array([r.prompt_len for t in arena for r in t.requests])
    out = np.array([r.output_len for t in arena for r in t.requests])
    for x, (p50, p90, top) in ((prompt, (40, 432, 1021)), (out, (211, 513, 977))):
        assert np.percentile(x, 50) == pytest.approx(p50, rel=0.08)
        assert np.percentile(x, 90) == pytest.approx(p90, rel=0.10)
        assert top * 0.9 <= x.max() <= top and x.min() >= 1


def test_cut_lognormal_has_the_quantiles_asked():
    """Checked with scipy's log-normal: F(p50) / F(max) = 0.5 and F(p90) / F(max) = 0.9."""
    for p50, p90, top in ((40, 432, 1021), (211, 513, 977)):
        mu, sigma = cut_lognormal(p50, p90, top)
        dist = sps.lognorm(sigma, scale=np.exp(mu))
        assert dist.cdf(p50) / dist.cdf(top) == pytest.approx(0.5, abs=1e-9)
        assert dist.cdf(p90) / dist.cdf(top) == pytest.approx(0.9, abs=1e-9)


def test_same_seed_same_trace_other_seed_other_trace():
    a, b = content(MultiModelSpec(seed=3, models=ARENA)), content(MultiModelSpec(seed=3, models=ARENA))
    key = lambda t: [(r.id, r.arrival, r.model, r.output_len, tuple((s.id, s.length) for s in r.segments))
                     for r in t.requests]
    assert key(a) == key(b)
    assert key(a) != key(content(MultiModelSpec(seed=4, models=ARENA)))


def test_a_higher_rate_fills_the_same_bursts_with_the_same_prompts():
    """The paper scales a trace by its number of requests, keeping the pattern: at 3x the rate each model has
    about 3x the requests, its k-th prompt is the same, and all its requests fall in the same ON periods."""
    specs = [MultiModelSpec(seed=1, qps=q, models=ARENA) for q in (1.1, 3.3)]
    slow, fast = (content(s) for s in specs)
    assert len(fast) / len(slow) == pytest.approx(3, rel=0.12)
    for m, name in enumerate(m["name"] for m in ARENA):
        a = [r for r in slow.requests if r.model == name]
        b = [r for r in fast.requests if r.model == name]
        assert [(r.prompt_len, r.output_len) for r in a] == [(r.prompt_len, r.output_len) for r in b[:len(a)]]
        begin, end = on_periods(specs[0], model_streams(1, m)[0])
        for r in a + b:
            k = np.searchsorted(begin, r.arrival, side="right") - 1
            assert k >= 0 and r.arrival < end[k]


def test_servegen_rates_shape_each_window(tmp_path):
    """A class whose rate per 600 s window is 1, 0, 3 req/s: a model of it gets no request in the idle window
    and three times the first window's in the third, scaled to its share of qps."""
    csv = tmp_path / "rates.csv"
    csv.write_text("model,window_start_s,rate_rps,active_clients,rate_weighted_cv\n"
                   "m-large,0,1.0,4,1.0\nm-large,600,0.0,0,0\nm-large,1200,3.0,8,1.0\n")
    # one model: the series is read from a random window on; over 1800 s (three windows) it sees all three
    spec = MultiModelSpec(arrival="servegen", servegen_path=str(csv), duration_s=1800, qps=2.0, seed=0,
                          models=[{"name": "a", "profile": "llama-3.2-1b", "servegen_class": "m-large"}])
    t = np.array([r.arrival for r in content(spec).requests])
    per_window = np.bincount((t // 600).astype(int), minlength=3)
    assert sorted(per_window)[0] == 0  # the idle window
    busy = sorted(per_window)[1:]
    assert busy[1] / busy[0] == pytest.approx(3, rel=0.25)
    assert per_window.sum() == pytest.approx(2.0 * 1800, rel=0.06)


def test_servegen_reading_of_the_real_rates():
    need_data("servegen", "model_rates.csv")
    spec = MultiModelSpec(arrival="servegen", duration_s=3600, qps=5.0, models=ARENA[:6])
    tr = content(spec)
    assert len(tr) == pytest.approx(5.0 * 3600, rel=0.1)
    assert {r.model for r in tr.requests} <= {m["name"] for m in ARENA[:6]}


def test_azure_services_as_two_models():
    need_data("azure_llm", "AzureLLMInferenceTrace_conv.csv")
    spec = MultiModelSpec(arrival="azure", duration_s=600, qps=4.0, models=[
        {"name": "coder", "profile": "qwen2.5-7b"}, {"name": "chat", "profile": "llama-3.1-8b"}])
    tr = content(spec)
    counts = model_stats(tr.requests)["requests_per_model"]
    # the code trace has 8,819 requests and the conversation trace 19,366 over about an hour
    assert counts["chat"] / counts["coder"] == pytest.approx(19366 / 8819, rel=0.35)
    assert trace_stats(tr)["mean_qps"] == pytest.approx(4.0, rel=0.25)
    from prism.traces.arrivals import default_data_dir, load_azure_records
    _, ctx, gen = load_azure_records(default_data_dir() / "azure_llm" / "AzureLLMInferenceTrace_code.csv")
    first = next(r for r in tr.requests if r.model == "coder")
    assert (first.prompt_len, first.output_len) == (ctx[0], gen[0])  # the real lengths, in time order


def test_each_model_may_bring_its_own_trace_spec():
    need_data("tau_bench", "airline", "policy.md")
    tr = load_trace("multimodel-mixed.yaml")
    by_model = {}
    for r in tr.requests:
        by_model.setdefault(r.model, []).append(r)
        assert all(s.id.startswith(f"{r.model}/") for s in r.segments)  # namespaced: never shared
        assert r.session is None or r.session.startswith(f"{r.model}/")
    assert set(by_model) == {"rag-8b", "agent-7b", "chat-3b", "chat-1b"}
    assert any(len(r.segments) > 3 for r in by_model["rag-8b"])  # sys + passages + question
    assert all(r.fixed_order for r in by_model["agent-7b"])
    # prefix reuse inside each model, none across: per-model infinite-cache hits add up to the trace's
    st = trace_stats(tr)
    per = sum(trace_stats(fmt.Trace(rs, tr.table))["infinite_cache_hit_rate"] * sum(r.prompt_len for r in rs)
              for rs in by_model.values())
    assert st["infinite_cache_hit_rate"] == pytest.approx(per / sum(r.prompt_len for r in tr.requests))
    assert st["infinite_cache_hit_rate"] > 0.3


def test_jsonl_round_trip_keeps_models(tmp_path):
    tr = content(MultiModelSpec(seed=2, duration_s=120, models=ARENA[:5]))
    fmt.save(tr, tmp_path / "t.jsonl")
    back = fmt.load(tmp_path / "t.jsonl")
    assert [r.model for r in back.requests] == [r.model for r in tr.requests]
    assert [m.name for m in fmt.served_models(back.meta)] == [m["name"] for m in ARENA[:5]]
    rescaled = back.rescaled(10.0)
    assert [r.model for r in rescaled.requests] == [r.model for r in tr.requests]
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    bad = [json.loads(x) for x in lines]
    req = next(i for i, o in enumerate(bad) if "out" in o)
    bad[req]["model"] = "nobody"
    (tmp_path / "bad.jsonl").write_text("\n".join(json.dumps(o) for o in bad) + "\n")
    with pytest.raises(UserError, match=rf"bad.jsonl:{req + 1}: field 'model': 'nobody' is not one of"):
        fmt.load(tmp_path / "bad.jsonl")


def run(argv, capsys):
    code = trace_main(argv)
    return code, capsys.readouterr()


@pytest.mark.parametrize("name", ["multimodel", "multimodel-18"])
def test_prism_trace_stats_on_the_shipped_specs(name, capsys):
    code, out = run(["stats", name, "--json"], capsys)
    assert code == 0, out.err
    st = json.loads(out.out)
    assert st["kind"] == "multi_model" and len(st["requests_per_model"]) == (8 if name == "multimodel" else 18)
    assert sum(st["requests_per_model"].values()) == st["requests"]
    assert st["requests"] == pytest.approx((2.0 if name == "multimodel" else 4.0) * 600, rel=0.15)  # qps x 600 s
    assert st["top3_models_share"] > st["top5_models_share"] * 0.5 and st["interarrival_cv"] > 1


def write(tmp_path, models, **kw):
    p = tmp_path / "mm.yaml"
    p.write_text(json.dumps({"kind": "multi_model", "models": models, **kw}))
    return str(p)


@pytest.mark.parametrize("models,kw,fragment", [
    ([{"name": "a", "profile": "llama-9b"}], {}, "field 'models[0].profile': unknown model 'llama-9b'"),
    ([{"name": "a", "profile": "llama-3.2-1b", "ttft_slo_s": 0}], {}, "models[0]: field 'ttft_slo_s': must be > 0"),
    ([{"name": "a", "profile": "llama-3.2-1b", "tpot_slo_s": -1}], {}, "field 'tpot_slo_s': must be > 0"),
    ([{"name": "a", "profile": "llama-3.1-8b", "tp": 3}], {}, "models[0]: field 'tp'"),
    ([{"name": "a", "profile": "llama-3.2-1b"}, {"name": "a", "profile": "qwen2.5-3b"}], {}, "listed twice"),
    ([], {}, "field 'models'"),
    ([{"name": "a/b", "profile": "llama-3.2-1b"}], {}, "without '/'"),
    ([{"name": "a"}], {}, "field 'profile'"),
    ([{"name": "a", "profile": "llama-3.2-1b", "color": 1}], {}, "unknown field 'color'"),
    ([{"name": "a", "profile": "llama-3.2-1b", "trace": {"kind": "multi_model"}}], {}, "models[0].trace"),
    ([{"name": "a", "profile": "llama-3.2-1b", "trace": {"kind": "zipf_hotspot", "k": 0}}], {},
     "models[0].trace: field 'k'"),
    ([{"name": f"m{i}", "profile": "llama-3.2-1b"} for i in range(3)], {"arrival": "azure"}, "two services"),
    ([{"name": "a", "profile": "llama-3.2-1b", "servegen_class": "m-huge"}], {}, "servegen_class"),
    ([{"name": "a", "profile": "llama-3.2-1b"}], {"prompt_p90": 20}, "prompt_p50 < prompt_p90"),
    ([{"name": "a", "profile": "llama-3.2-1b"}], {"qps": 1000, "duration_s": 2000000}, "more than 1000000"),
])
def test_bad_multi_model_input_is_one_line(tmp_path, capsys, models, kw, fragment):
    code, out = run(["stats", write(tmp_path, models, **kw)], capsys)
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in out.err, out.err
    assert lines[0].startswith("prism-trace: error: ") and "mm.yaml" in lines[0] and fragment in lines[0], lines
