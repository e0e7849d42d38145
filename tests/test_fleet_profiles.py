"""The profiles several models sharing GPUs need: model geometry against independent counts, tensor-parallel
arithmetic by hand, and the GPUs' links."""

from __future__ import annotations

import pytest

from prism.calibration import profiles
from prism.errors import UserError

GIB = 1 << 30


def count_params(m: profiles.Model) -> int:
    """Parameters from the geometry alone: embedding, per layer Q/K/V/O (+ Qwen2's QKV biases, Qwen3's Q/K
    norms, Gemma2's two extra norms), the gated MLP and two norms, the final norm, an untied LM head."""
    h, d = m.hidden, m.head_dim
    layer = h * m.heads * d + 2 * h * m.kv_heads * d + m.heads * d * h + 3 * h * m.intermediate + 2 * h
    layer += {"Qwen2ForCausalLM": m.heads * d + 2 * m.kv_heads * d, "Qwen3ForCausalLM": 2 * d,
              "Gemma2ForCausalLM": 2 * h}.get(m.architecture, 0)
    return m.vocab * h * (1 if m.tie_embeddings else 2) + m.layers * layer + h


# Each model card's published total (billions), as written there (rounded or cut to its last digit).
PUBLISHED_B = {"llama-3.2-1b": 1.23, "llama-3.2-3b": 3.21, "qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54,
               "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.61, "qwen2.5-14b": 14.7, "qwen3-1.7b": 1.7,
               "mistral-7b-instruct-v0.2": 7.24, "gemma-2-2b": 2.61, "llama-3.1-8b": 8.03, "qwen3-8b": 8.2,
               "qwen3-4b-instruct-2507": 4.02}


@pytest.mark.parametrize("name,published", PUBLISHED_B.items())
def test_parameter_count_is_the_geometrys_and_the_model_cards(name, published):
    m = profiles.model(name)
    assert m.params == pytest.approx(count_params(m), rel=2e-4)
    last_digit = 10.0 ** -len(repr(published).partition(".")[2])
    assert abs(m.params / 1e9 - published) < last_digit


# The Prism prototype's measured table (Multi-LLM/prism-research python/sglang/multi_model/utils/model_info.json):
# model_size in GiB (weights resident on the GPU), cell_size in KV bytes per token.
MODEL_INFO = {"llama-3.2-1b": (2.279296875, 32768), "llama-3.2-3b": (6.0, 114688),
              "llama-3.1-8b": (15.080078125, 131072), "mistral-7b-instruct-v0.2": (13.490234375, 131072),
              "llama-2-13b": (24.376953125, 819200)}


@pytest.mark.parametrize("name,info", MODEL_INFO.items())
def test_weights_and_kv_bytes_match_the_prototypes_measurements(name, info):
    size_gib, cell = info
    m = profiles.model(name)
    assert m.kv_bytes_per_token() == cell
    assert m.weight_bytes() / GIB == pytest.approx(size_gib, rel=0.015)


def test_tensor_parallel_splits_weights_and_kv_heads_by_hand():
    m = profiles.model("llama-3.1-8b")  # 32 heads, 8 KV heads of 128, 32 layers
    assert m.kv_bytes_per_token(tp=2) == 2 * 32 * 4 * 128 * 2
    assert m.kv_bytes_per_token(tp=8) == 2 * 32 * 1 * 128 * 2
    assert m.weight_bytes(tp=4) == pytest.approx(8.030e9 * 2 / 4)
    q = profiles.model("qwen2.5-7b")  # 28 heads, 4 KV heads: at tp 4 one each; 28 heads do not split 8 ways
    assert q.kv_heads_per_gpu(4) == 1 and q.kv_bytes_per_token(tp=4) == 2 * 28 * 1 * 128 * 2
    g = profiles.model("qwen2.5-0.5b")  # 14 heads, 2 KV heads: tp 2 splits both; 7 heads per GPU
    assert g.kv_heads_per_gpu(2) == 1
    s = profiles.model("qwen3-8b")  # 8 KV heads over 16 GPUs: replicated, one head each (SGLang's max(1, 8 // 16))
    assert s.kv_heads_per_gpu(16) == 1 and s.kv_bytes_per_token(tp=16) == 2 * 36 * 1 * 128 * 2


@pytest.mark.parametrize("name,tp,fragment", [
    ("llama-3.1-8b", 3, "32 attention heads"),
    ("qwen2.5-7b", 8, "28 attention heads"),
    ("qwen2.5-0.5b", 7, "2 KV heads"),   # 14 heads split 7 ways, but 2 KV heads neither split nor divide 7
    ("llama-3.1-8b", 0, "must be an integer >= 1"),
])
def test_a_tensor_parallel_degree_sglang_cannot_split_is_refused(name, tp, fragment):
    with pytest.raises(UserError, match=fragment) as e:
        profiles.model(name).kv_bytes_per_token(tp=tp)
    assert "field 'tp'" in str(e.value)


def test_gpus_carry_their_links():
    h100 = profiles.gpu("h100-sxm-80g")
    assert (h100.pcie_gen, h100.pcie_bandwidth, h100.nvlink_bandwidth, h100.gpus_per_node) == (5, 50e9, 380e9, 8)
    for key in ("a800-80g-pcie", "a100-80g-pcie"):
        g = profiles.gpu(key)
        assert (g.pcie_gen, g.pcie_bandwidth, g.nvlink_bandwidth) == (4, 26e9, 0.0)
    # one way is half the data sheets' bidirectional NVLink: A100 600 GB/s, A800 400 GB/s
    assert profiles.gpu("a100-80g").nvlink_bandwidth == 300e9 and profiles.gpu("a800-80g").nvlink_bandwidth == 200e9


def test_check_served_names_the_field():
    from types import SimpleNamespace as M

    profiles.check_served([M(profile="llama-3.2-1b", tp=1), M(profile="llama-3.1-8b", tp=8)])
    with pytest.raises(UserError, match=r"t.yaml: field 'models\[1\].profile': unknown model 'llama-9b'"):
        profiles.check_served([M(profile="qwen2.5-3b", tp=1), M(profile="llama-9b", tp=1)], "t.yaml")
    with pytest.raises(UserError, match=r"t.yaml: models\[0\]: field 'tp': .* 32 attention heads"):
        profiles.check_served([M(profile="llama-3.1-8b", tp=3)], "t.yaml")
