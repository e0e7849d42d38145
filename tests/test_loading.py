"""Activation arithmetic by hand, and against the Prism paper's H100 figures (§7.5, Fig. 10)."""

from __future__ import annotations

import pytest

from prism.calibration import loading, profiles
from prism.calibration.loading import PAGE_BYTES, LoadingConfig, VmmCosts, activation_seconds, load_seconds
from prism.calibration.profiles import Model
from prism.errors import UserError

H100 = profiles.gpu("h100-sxm-80g")  # Gen5 50 GB/s per link, NVLink 380 GB/s one way, 8 per node
A800_PCIE = profiles.gpu("a800-80g-pcie")  # Gen4 26 GB/s, no NVLink
# Llama-3.3-70B-Instruct's geometry (its config.json: Llama-3.1-70B's): 70.55 B parameters, too large for one
# 80 GB GPU, so not a profile of its own here.
LLAMA_70B = Model(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256,
                  params=70.553706496e9, key="llama-3.3-70b")


def test_one_link_is_weights_over_pcie():
    m = profiles.model("llama-3.1-8b")
    w = 8.030e9 * 2
    assert load_seconds(w, H100) == pytest.approx(w / 50e9)
    assert activation_seconds(m, A800_PCIE) == pytest.approx(w / 26e9)
    assert activation_seconds(m, A800_PCIE, config=LoadingConfig(engine_pool=False, cold_start_s=20)) == \
        pytest.approx(20 + w / 26e9)


def test_parallel_links_are_gathered_over_nvlink_by_hand():
    w = 16e9
    # 4 links carry 4 GB each (0.08 s at 50 GB/s); the target gets 12 GB over NVLink (0.0316 s at 380 GB/s)
    assert load_seconds(w, H100, config=LoadingConfig(parallel_links=4)) == pytest.approx(4e9 / 50e9)
    # with a slow NVLink the gather is the limit: 12 GB at 100 GB/s
    slow = profiles.GPU(name="x", pcie_bandwidth=50e9, nvlink_bandwidth=100e9, gpus_per_node=8)
    assert load_seconds(w, slow, config=LoadingConfig(parallel_links=4)) == pytest.approx(12e9 / 100e9)
    # 8 links: 2 GB each (0.04 s); NVLink 14 GB (0.0368 s)
    assert load_seconds(w, H100, config=LoadingConfig(parallel_links=8)) == pytest.approx(2e9 / 50e9)


def test_no_nvlink_no_parallel_loading():
    w = 16e9
    assert load_seconds(w, A800_PCIE, config=LoadingConfig(parallel_links=8)) == pytest.approx(w / 26e9)


def test_tensor_parallel_shards_load_over_their_own_links():
    w = 140e9
    # TP 8 over 8 links: 17.5 GB per link, nothing to gather
    assert load_seconds(w, H100, tp=8, config=LoadingConfig(parallel_links=8)) == pytest.approx(17.5e9 / 50e9)
    # TP 2 with 8 links: 17.5 GB per link (0.35 s); each target gets 70 GB, 17.5 of it over its own link and
    # 52.5 over NVLink (0.138 s at 380 GB/s, 0.525 s at 100 GB/s)
    assert load_seconds(w, H100, tp=2, config=LoadingConfig(parallel_links=8)) == pytest.approx(17.5e9 / 50e9)
    slow = profiles.GPU(name="x", pcie_bandwidth=50e9, nvlink_bandwidth=100e9, gpus_per_node=8)
    assert load_seconds(w, slow, tp=2, config=LoadingConfig(parallel_links=8)) == pytest.approx(52.5e9 / 100e9)
    # TP 2 asking for 1 link still uses one per shard
    assert load_seconds(w, H100, tp=2) == pytest.approx(70e9 / 50e9)


def test_host_side_caps_by_hand():
    w = 16e9
    cfg = LoadingConfig(parallel_links=8, host_copy_bandwidth=20e9, node_host_bandwidth=30e9)
    assert load_seconds(w, H100, config=cfg) == pytest.approx(16e9 / 20e9)  # one process stages all 16 GB
    assert load_seconds(w * 8, H100, tp=8, config=cfg) == pytest.approx(128e9 / 30e9)  # the node: 128 GB


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"])
def test_paper_small_models_within_0_7_s_from_the_pool_with_parallel_loading(name):
    """Prism §7.5: 1-8 B within 0.7 s. From pinned memory the links allow far less (0.04 s for 8 B). With the
    paper's pageable host memory (:data:`PAPER_H100_PAGEABLE`, fitted to the 14 B figure) 1 B and 3 B take 0.11 and
    0.28 s and 8 B 0.707 s: 1% over 0.7, inside what the 14 B figure's rounding allows (1.25-1.35 s gives the cap
    21.9-23.6 GB/s, so 8 B in 0.68-0.73 s)."""
    m = profiles.model(name)
    assert activation_seconds(m, H100, config=LoadingConfig(parallel_links=8)) < 0.05
    t = activation_seconds(m, H100, config=loading.PAPER_H100_PAGEABLE)
    w = m.weight_bytes()
    assert t == pytest.approx(w / 22.7e9)  # the one-process staging is the limit for one target
    assert t < 0.7 if m.params < 5e9 else w / (29.54e9 / 1.25) <= 0.7 <= w / (29.54e9 / 1.35)


def test_paper_14b_and_70b_figures_are_what_the_host_caps_were_fitted_to():
    """14 B in 1.3 s and 70 B TP 8 in 1.5 s: the links alone give 0.074 s and 0.35 s (the paper's loads are not
    link-bound); the two host-side caps of :data:`PAPER_H100_PAGEABLE` are fitted to these two figures."""
    q14 = profiles.model("qwen2.5-14b")
    assert activation_seconds(q14, H100, config=LoadingConfig(parallel_links=8)) == pytest.approx(0.0739, abs=1e-3)
    assert activation_seconds(LLAMA_70B, H100, tp=8, config=LoadingConfig(parallel_links=8)) == \
        pytest.approx(0.3528, abs=1e-3)
    assert activation_seconds(q14, H100, config=loading.PAPER_H100_PAGEABLE) == pytest.approx(1.3, rel=0.01)
    assert activation_seconds(LLAMA_70B, H100, tp=8, config=loading.PAPER_H100_PAGEABLE) == \
        pytest.approx(1.5, rel=0.01)


def test_paper_naive_seven_seconds_is_mostly_the_engine_start():
    """About 7 s naively for 8 B (no pool, one link): the one-link load from pinned memory is 0.32 s, so the
    rest is the engine start; DESIGN's SGLang cold start (10-60 s) is slower than the paper's."""
    m = profiles.model("llama-3.1-8b")
    load = activation_seconds(m, H100)
    assert load == pytest.approx(0.321, abs=1e-3)
    naive = LoadingConfig(engine_pool=False, cold_start_s=10.0)
    assert activation_seconds(m, H100, config=naive) > 7.0


def test_vmm_costs_by_hand():
    c = VmmCosts()
    assert c.map_seconds(1000) == pytest.approx(1000 * (193.32 + 1.45 + 35.99) * 1e-6)
    assert loading.deactivation_seconds(7660) == pytest.approx(7660 * 25.63e-6)
    assert PAGE_BYTES == 2 * 1024 * 1024
    assert loading.pages_for_bytes(1) == 1 and loading.pages_for_bytes(PAGE_BYTES) == 1
    assert loading.pages_for_bytes(PAGE_BYTES + 1) == 2


def test_bad_loads_name_the_field():
    with pytest.raises(UserError, match="field 'tp': 16 GPUs"):
        load_seconds(1e9, H100, tp=16)
    with pytest.raises(UserError, match="field 'parallel_links'"):
        load_seconds(1e9, H100, config=LoadingConfig(parallel_links=9))
    with pytest.raises(UserError, match="field 'tp'"):
        activation_seconds(profiles.model("llama-3.1-8b"), H100, tp=3)
