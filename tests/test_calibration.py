"""Profile arithmetic by hand, the fit's recovery of known coefficients, and bad profiles/CSVs."""

from __future__ import annotations

import csv

import pytest

from prism.calibration import fit as fitting
from prism.calibration import profiles
from prism.calibration.cost_model import CostModel, load_profile, roofline
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
    linear = 2 * (8.030e9 - 128256 * 4096)  # untied embedding: the lookup is not a matmul
    assert c.b_p == pytest.approx(linear / (989e12 * 0.55))
    assert c.c_p == pytest.approx(4 * 32 * 32 * 128 / (989e12 * 0.35))
    assert c.a_d == pytest.approx(8.030e9 * 2 / (3.35e12 * 0.8) + 0.001)
    assert c.c_d == pytest.approx(131_072 / (3.35e12 * 0.8))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_coefficients_within_2_percent(tmp_path, seed):
    truth = CostModel(a_p=0.004, b_p=5e-5, c_p=6e-9, a_d=0.007, b_d=9e-5, c_d=1e-7)
    rows = fitting.synthetic_measurements(truth, 2000, noise=0.02, seed=seed)
    path = tmp_path / "m.csv"
    fitting.write_measurements(rows, path)
    report = fitting.fit(fitting.read_measurements(path))
    for k in ("a_p", "b_p", "c_p", "a_d", "b_d", "c_d"):
        assert getattr(report.cost, k) == pytest.approx(getattr(truth, k), rel=0.02), k
    assert report.mape_prefill < 0.03 and report.mape_decode < 0.03


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
