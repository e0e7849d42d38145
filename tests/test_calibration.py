"""Profile arithmetic by hand, the fit's recovery of known coefficients, and bad profiles/CSVs."""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.calibration import fit as fitting
from prism.calibration import profiles
from prism.calibration.cost_model import DEFAULT_PROFILE, CostModel, Efficiency, load_profile, roofline
from prism.cli.calibrate import main as calibrate_main
from prism.cli.sim import main as sim_main

GIB = 1 << 30

# (model, layers, kv_heads, head_dim) -> 2 * layers * kv_heads * head_dim * 2 bytes
HAND = {
    "qwen3-4b-instruct-2507": 2 * 36 * 8 * 128 * 2,  # 147,456
    "llama-2-13b": 2 * 40 * 40 * 128 * 2,  # 819,200
    "llama-3.1-8b": 2 * 32 * 8 * 128 * 2,  # 131,072
    "qwen3-8b": 2 * 36 * 8 * 128 * 2,  # 147,456
}


@pytest.mark.parametrize("name,kv", HAND.items())
def test_kv_bytes_per_token_by_hand(name, kv):
    assert profiles.model(name).kv_bytes_per_token() == kv


def test_llama2_13b_payload_and_capacity():
    m = profiles.model("llama2-13b")  # alias
    assert m.kv_bytes_per_token() == 819_200
    assert 640 * m.kv_bytes_per_token() / GIB == pytest.approx(0.488, abs=0.001)
    g = profiles.gpu("a800-80g")
    # (80 GiB * 0.9 - 13.016e9 * 2 - 2 GiB) / 819200
    expected = int((80 * GIB * 0.9 - 13.016e9 * 2 - 2 * GIB) // 819_200)
    assert profiles.kv_capacity_tokens(g, m, 0.9) == expected


def test_every_gpu_model_pair_has_a_positive_capacity_or_a_clear_error():
    for g in profiles.gpus().values():
        for m in profiles.models().values():
            cap = profiles.kv_capacity_tokens(g, m, 0.88)
            assert cap > 10_000


def test_roofline_coefficients_by_hand():
    g, m = profiles.gpu("h100-sxm-80g"), profiles.model("llama-3.1-8b")
    c = roofline(g, m)
    head = 128256 * 4096  # untied: an embedding matrix and an LM head of this size
    body = 8.030e9 - 2 * head  # the non-embedding parameters
    assert c.b_p == pytest.approx(2 * body / (989e12 * 0.66))
    assert c.d_p == pytest.approx(2 * head / (989e12 * 0.66))
    assert c.c_p == pytest.approx(4 * 32 * 32 * 128 / (989e12 * 0.35))
    assert c.a_d == pytest.approx(0.001)
    assert c.w_d == pytest.approx((body + head) * 2 / (3.35e12 * 0.77))  # the embedding lookup reads B rows only
    assert c.c_d == pytest.approx(131_072 / (3.35e12 * 0.77))
    assert c.b_d == pytest.approx(2 * (body + head) / (989e12 * 0.61))


@pytest.mark.parametrize("name,body,head", [
    # Qwen3-4B ties its embedding and LM head: one 151,936 x 2,560 matrix inside the 4.022 B parameters
    ("qwen3-4b-instruct-2507", 4.022e9 - 151936 * 2560, 151936 * 2560),
    # Llama-2-13B does not: the embedding and the LM head are two 32,000 x 5,120 matrices
    ("llama-2-13b", 13.016e9 - 2 * 32000 * 5120, 32000 * 5120),
])
def test_prefill_charges_non_embedding_parameters_per_token(name, body, head):
    """On the default A800 PCIe: 312 TFLOP/s x 0.9 sustained x 0.66; a batch of prompts costs 2 FLOPs per
    non-embedding parameter per new token, plus the LM head once per prompt."""
    c = load_profile(f"a800-80g-pcie:{name}").cost
    flops = 312e12 * 0.9 * 0.66
    new = [1000, 24]
    pairs = 1000 * 500 + 24 * 12
    expected = 0.003 + 2 * body * 1024 / flops + 2 * head * 2 / flops + pairs * c.c_p
    assert c.prefill_time(new, [0, 0]) == pytest.approx(expected, rel=1e-12)
    if name.startswith("qwen3-4b"):  # the full parameter count per token overcounts by about 11%
        assert 4.022e9 / body == pytest.approx(1.107, abs=0.001)


def test_decode_is_the_larger_of_memory_and_compute_by_hand():
    """Qwen3-4B on an A800 PCIe: a step reads 4.022 B parameters (tied: the head is the embedding) and 147,456
    bytes of KV per context token at 0.77 of 1.935 TB/s, or computes 2 FLOPs per parameter per request at 0.61
    of 0.9 x 312 TFLOP/s; plus 1 ms."""
    c = load_profile("a800-80g-pcie:qwen3-4b").cost
    bw, flops = 1.935e12 * 0.77, 312e12 * 0.9 * 0.61
    memory = lambda ctx: (4.022e9 * 2 + 147_456 * ctx) / bw  # noqa: E731
    compute = lambda b: b * 2 * 4.022e9 / flops  # noqa: E731
    # batch 64 at 1,024 tokens each: memory-bound (16.9 GB to read, 0.51 TFLOP to compute)
    assert memory(64 * 1024) > compute(64)
    assert c.decode_time(64, 64 * 1024) == pytest.approx(0.001 + memory(64 * 1024), rel=1e-12)
    # batch 256 at 16 tokens each: compute-bound (12.0 ms of matmuls, 5.8 ms of reads)
    assert compute(256) > memory(256 * 16)
    assert c.decode_time(256, 256 * 16) == pytest.approx(0.001 + compute(256), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 4096), per=st.integers(1, 32768))
def test_decode_time_is_overhead_plus_the_binding_bound(b, per):
    c = load_profile().cost
    t, mem, comp = c.decode_time(b, b * per), c.decode_memory_time(b * per), c.decode_compute_time(b)
    assert t >= c.a_d + mem and t >= c.a_d + comp and t in (c.a_d + mem, c.a_d + comp)
    assert c.decode_time(b + 1, (b + 1) * per) >= t  # one more request never makes a step faster


def test_pcie_gpus_and_the_default_profile():
    """NVIDIA's A100 data sheet: the 80GB PCIe card has the SXM part's 312 TFLOP/s peak but 1,935 GB/s (not 2,039)
    and 300 W (not 400), sustaining about 90% of its compute; the paper ran an A800 80GB PCIe."""
    for key in ("a800-80g-pcie", "a100-80g-pcie"):
        g = profiles.gpu(key)
        assert (g.peak_flops, g.hbm_bandwidth, g.sustained_compute, g.memory_gib) == (312e12, 1.935e12, 0.9, 80)
        assert g.compute_flops == pytest.approx(280.8e12)
    assert profiles.gpu("a800-80g").sustained_compute == 1.0  # the SXM parts
    assert DEFAULT_PROFILE == "a800-80g-pcie:qwen3-4b-instruct-2507"
    assert load_profile().gpu.key == "a800-80g-pcie"


def test_efficiency_defaults_follow_the_cited_vidur_rows():
    """Recompute prefill_mfu, bandwidth and decode_mfu from the A100 rows cited in efficiency.yaml."""
    data = yaml.safe_load(resources.files("prism.calibration").joinpath("profiles", "efficiency.yaml").read_text())
    shapes, peak, bw = data["weights"], data["peak_flops"], data["hbm_bandwidth"]
    weights = sum(k * n for k, n in shapes.values())
    linear, whole = [], []
    for row in data["prefill_rows"]:
        flops = 2 * row["num_tokens"] * weights
        t_linear = sum(row[op] for op in shapes) * 1e-3
        t_whole = t_linear + sum(row[op] for op in data["other_operators"]) * 1e-3
        linear.append(flops / t_linear / peak)
        whole.append(flops / t_whole / peak)
    assert 0.68 <= min(linear) and max(linear) <= 0.75  # the linear layers alone
    assert 0.62 <= min(whole) and max(whole) <= 0.69  # with norms, RoPE, activation, add
    eff = Efficiency()
    assert eff.prefill_mfu == pytest.approx(np.mean(whole), abs=0.005)
    decode = {r["num_tokens"]: sum(r[op] for op in shapes) * 1e-3 for r in data["decode_rows"]}
    assert eff.bandwidth == pytest.approx(weights * 2 / decode[1] / bw, abs=0.005)
    assert eff.decode_mfu == pytest.approx(2 * 240 * weights / decode[240] / peak, abs=0.005)


def test_old_profiles_load_or_fail_clearly(tmp_path, capsys):
    old = tmp_path / "old.yaml"
    # prefill coefficients without d_p load (the roofline's d_p is added)
    old.write_text("gpu: a800-80g\nmodel: qwen3-4b\ncoefficients: {a_p: 0.004, b_p: 5.0e-5, c_p: 6.0e-9}\n")
    cost = load_profile(str(old)).cost
    assert (cost.a_p, cost.b_p, cost.d_p) == (0.004, 5e-5, roofline(profiles.gpu("a800-80g"),
                                                                    profiles.model("qwen3-4b")).d_p)
    # the additive decode form: a_d included the weight read; refused with a line that says what to do
    old.write_text("gpu: a800-80g\nmodel: qwen3-4b\n"
                   "coefficients: {a_p: 0.003, b_p: 4.7e-5, c_p: 6.0e-9, a_d: 0.006, b_d: 8.6e-5, c_d: 9.0e-8}\n")
    assert sim_main(["--trace", "zipf", "--profile", str(old), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "without w_d" in err and "refit with prism-calibrate fit" in err


TRUTH = CostModel(a_p=0.004, b_p=5e-5, d_p=2e-4, c_p=6e-9, a_d=0.002, w_d=0.006, c_d=1e-7, b_d=6e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_coefficients(tmp_path, seed):
    """2,000 synthetic iterations with 2% noise. The coefficients that carry the time (b_p, c_p, w_d, c_d, b_d)
    come back within 3%; a_d (2 ms inside 8-20 ms compute-bound steps, told apart from w_d only there) and d_p
    (0.2 ms a sequence) within 10%; the fit explains the data to the noise level."""
    rows = fitting.synthetic_measurements(TRUTH, 2000, noise=0.02, seed=seed)
    path = tmp_path / "m.csv"
    fitting.write_measurements(rows, path)
    report = fitting.fit(fitting.read_measurements(path))
    for k in ("a_p", "b_p", "c_p", "w_d", "c_d", "b_d"):
        assert getattr(report.cost, k) == pytest.approx(getattr(TRUTH, k), rel=0.03), k
    for k in ("d_p", "a_d"):
        assert getattr(report.cost, k) == pytest.approx(getattr(TRUTH, k), rel=0.10), k
    assert report.mape_prefill < 0.02 and report.mape_decode < 0.02 and report.held == []


def test_fit_holds_what_the_rows_cannot_identify(tmp_path):
    """Single-request prefills (what prism-calibrate measure writes) leave d_p to the prior; memory-bound decode
    rows leave the overhead / weight-read split and b_d to it, b_d capped below every row's memory time."""
    prior = load_profile().cost
    rows = []
    for n in (128, 512, 2048):
        for cached in (0, 1024):
            t = TRUTH.prefill_time([n], [cached])
            rows.append({"kind": "prefill", "batch_size": "1", "new_tokens": str(n), "cached_tokens": str(cached),
                         "context_tokens": "", "seconds": repr(t)})
    for b, per in ((1, 300), (8, 600), (32, 900)):
        ctx = b * per
        rows.append({"kind": "decode", "batch_size": str(b), "new_tokens": "", "cached_tokens": "",
                     "context_tokens": str(ctx), "seconds": repr(TRUTH.decode_time(b, ctx))})
    path = tmp_path / "m.csv"
    fitting.write_measurements(rows, path)
    report = fitting.fit(fitting.read_measurements(path), prior=prior)
    c = report.cost
    assert c.d_p == prior.d_p and c.a_d == prior.a_d
    # what the rows do say is fitted exactly: a_p + d_p and a_d + w_d, b_p, c_p, c_d
    assert c.a_p + c.d_p == pytest.approx(TRUTH.a_p + TRUTH.d_p, rel=1e-6)
    assert (c.b_p, c.c_p, c.c_d) == pytest.approx((TRUTH.b_p, TRUTH.c_p, TRUTH.c_d), rel=1e-6)
    assert c.a_d + c.w_d == pytest.approx(TRUTH.a_d + TRUTH.w_d, rel=1e-6)
    assert c.b_d <= prior.b_d
    assert all(c.b_d * b <= c.w_d + c.c_d * b * per for b, per in ((1, 300), (8, 600), (32, 900)))
    assert report.mape_prefill < 1e-6 and report.mape_decode < 1e-6
    assert len(report.held) == 2 and "batch sizes (1)" in report.held[0] and "compute-bound" in report.held[1]


def test_fit_cli_writes_a_profile_the_simulator_loads(tmp_path, capsys):
    m, out = tmp_path / "m.csv", tmp_path / "prof" / "mine.yaml"
    assert calibrate_main(["synth", "-o", str(m), "--rows", "300"]) == 0
    assert calibrate_main(["fit", str(m), "-o", str(out)]) == 0
    assert out.is_file() and out.with_suffix(".residuals.png").is_file()
    prof = load_profile(str(out))
    base = load_profile()
    assert prof.cost.b_p == pytest.approx(base.cost.b_p, rel=0.05)
    assert sim_main(["--trace", "zipf", "--profile", str(out), "--set", "trace.num_requests=50",
                     "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert calibrate_main(["show", "--gpu", "a800-80g", "--model", "llama2-13b"]) == 0
    assert "819,200" in capsys.readouterr().out


def test_show_prints_the_implied_rates(capsys):
    """Prefill tokens/s at 2k and 8k new tokens and decode steps at batch 1/64/256, each as the cost model gives
    them, with the bound that sets it and the measurement behind it."""
    assert calibrate_main(["show", "--gpu", "a800-80g-pcie", "--model", "qwen3-4b"]) == 0
    out = capsys.readouterr().out
    c = load_profile("a800-80g-pcie:qwen3-4b").cost
    for n in (2048, 8192):
        k = n // 1024
        assert f"{n / c.prefill_time([1024] * k, [0] * k):,.0f} tokens/s" in out
    for b in (1, 64, 256):
        assert f"batch {b} × 1,024 context" in out and f"{c.decode_time(b, b * 1024) * 1e3:.2f} ms" in out
    assert "Vidur A100 rows at 2k-16k tokens" in out and "1-token rows: 0.77 of HBM" in out
    assert "memory-bound" in out and "exceeds the capacity" not in out
    assert calibrate_main(["show", "--model", "llama-2-13b"]) == 0  # 256 x 1,024 tokens of KV do not fit
    assert "exceeds the capacity" in capsys.readouterr().out


def _csv(tmp_path, rows, header=fitting.REQUIRED):
    p = tmp_path / "bad.csv"
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(p)


GOOD = [["prefill", "1", "100", "0", "", "0.01"]] * 3 + [["decode", "4", "", "", "400", "0.01"]] * 3


@pytest.mark.parametrize("rows,header,fragment", [
    (GOOD, ("kind", "batch_size", "new_tokens", "cached_tokens", "seconds"), "missing column 'context_tokens'"),
    (GOOD + [["prefill", "1", "-5", "0", "", "0.01"]], fitting.REQUIRED, "bad.csv:8: field 'new_tokens'"),
    (GOOD + [["warmup", "1", "5", "0", "", "0.01"]], fitting.REQUIRED, "field 'kind'"),
    (GOOD + [["decode", "1", "", "", "10", "-1"]], fitting.REQUIRED, "field 'seconds'"),
    (GOOD[:2], fitting.REQUIRED, "at least 3 prefill"),
])
def test_bad_measurements_one_line(tmp_path, capsys, rows, header, fragment):
    path = _csv(tmp_path, rows, header)
    assert calibrate_main(["fit", path, "-o", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err


def test_bad_profiles_one_line(tmp_path, capsys):
    assert calibrate_main(["show", "--gpu", "tpu-v9"]) == 2
    assert "unknown GPU 'tpu-v9'" in capsys.readouterr().err
    assert calibrate_main(["show", "--model", "gpt-17"]) == 2
    assert "unknown model 'gpt-17'" in capsys.readouterr().err
    bad = tmp_path / "p.yaml"
    bad.write_text("gpu: a800-80g\nmodel: qwen3-4b\ncoefficients: {a_p: -1}\n")
    assert sim_main(["--trace", "zipf", "--profile", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "field 'a_p': must be >= 0" in capsys.readouterr().err
    bad.write_text("gpu: a800-80g\n")
    assert sim_main(["--trace", "zipf", "--profile", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "needs 'gpu' and 'model'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpus.yaml", "models.yaml", "efficiency.yaml"])
def test_packaged_tables_read_alike_by_the_fast_and_the_strict_loader(name):
    """The packaged tables are read at start-up by libyaml's parser (``parse_packaged_yaml``); each holds to the
    strict loader's rules (no key twice, no bad value) and gives the same data, numbers of the same types."""
    from prism.config import parse_packaged_yaml, parse_yaml

    text = profiles.table_text(name)
    strict, fast = parse_yaml(text, name), parse_packaged_yaml(text)
    assert fast == strict and repr(fast) == repr(strict)  # repr: 1e-3 read as the float both ways, not a string
    assert parse_packaged_yaml("a: 1e-3\nb: 2E5\nc: -.5\n") == parse_yaml("a: 1e-3\nb: 2E5\nc: -.5\n", "t") \
        == {"a": 0.001, "b": 200000.0, "c": -0.5}
