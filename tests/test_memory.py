"""The GPU page pool (sim/memory.py): hand-computed cases of kvcached's layout, the balloon, and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.calibration import profiles
from prism.calibration.loading import PAGE_BYTES, VmmCosts
from prism.errors import UserError
from prism.sim.memory import GpuMemory, KvLayout, MemoryFull

LLAMA8 = KvLayout.of(profiles.model("llama-3.1-8b"))  # 131,072 B/token over 32 layers
MAP_PAGE = (193.32 + 1.45 + 35.99) * 1e-6
UNMAP_PAGE = 25.63e-6


def test_kv_layout_by_hand():
    # one layer's K per token: 8 KV heads x 128 x 2 bytes = 2,048 B, so a 2 MiB page holds 1,024 tokens of it;
    # a block is one page in each of the 64 K/V tensors
    assert (LLAMA8.tokens_per_block, LLAMA8.pages_per_block) == (1024, 64)
    assert LLAMA8.pages(1) == 64 and LLAMA8.pages(1024) == 64 and LLAMA8.pages(1025) == 128
    # the same bytes per token as 2 MiB pages: 1,024 tokens x 131,072 B = 64 pages
    assert LLAMA8.pages(1024) * PAGE_BYTES == 1024 * 131072
    tp2 = KvLayout.of(profiles.model("llama-3.1-8b"), tp=2)  # 4 heads per GPU: 2,048 tokens per block
    assert (tp2.tokens_per_block, tp2.pages_per_block) == (2048, 64)
    small = KvLayout.of(profiles.model("qwen2.5-0.5b"))  # 2 KV heads of 64, 24 layers: 256 B -> 8,192 tokens
    assert (small.tokens_per_block, small.pages_per_block) == (8192, 48)


def test_pool_of_a_profile_gpu():
    assert GpuMemory.for_gpu(profiles.gpu("h100-sxm-80g")).total_pages == int(80 * 2**30 * 0.95 // PAGE_BYTES)
    with pytest.raises(UserError, match="utilization"):
        GpuMemory.for_gpu(profiles.gpu("h100-sxm-80g"), utilization=0)


def loaded(total=20_000, weights=16.06e9, limit=None) -> GpuMemory:
    g = GpuMemory(total)
    g.load("m", weights, LLAMA8, limit)
    return g


def test_load_maps_weights_and_prefills_the_buffer_off_the_path():
    g = loaded()
    wpages = -int(-16.06e9 // PAGE_BYTES)  # 7,659
    assert g.weight_pages("m") == wpages
    assert g.buffer_pages("m") == 5 * 64  # refilled to 5 blocks in the background
    assert g.free_pages == 20_000 - wpages - 320
    assert g.counters.path_s == 0 and g.counters.background_s == pytest.approx(320 * MAP_PAGE)


def test_blocks_come_from_the_buffer_first_then_fresh_pages_on_the_path():
    g = loaded()
    assert g.use("m", 5 * 1024, 0) == 0.0  # five blocks, all from the buffer
    assert g.kv_pages("m") == 320 and g.buffer_pages("m") == 320  # and the buffer refilled behind them
    # six more: five from the refilled buffer, one block of 64 fresh pages created, mapped and enabled
    assert g.use("m", 11 * 1024, 0) == pytest.approx(64 * MAP_PAGE)
    # a GPU with no free pages beyond what is asked: no refill behind the allocation
    tight = GpuMemory(64 * 7)
    tight.load("m", 0, LLAMA8)  # no weights; buffer refills to 5 blocks (320 pages), 128 pages free
    assert tight.use("m", 7 * 1024, 0) == pytest.approx(2 * 64 * MAP_PAGE)  # 5 from the buffer, 2 fresh
    assert tight.free_pages == 0 and tight.room_tokens("m") == 0


def test_the_same_blocks_again_still_refill_the_buffer_from_pages_freed_meanwhile():
    g = GpuMemory(64 * 20)
    g.load("m", 0, LLAMA8)  # its buffer: 5 blocks
    g.load("o", 15 * 64 * PAGE_BYTES, LLAMA8)  # the other 15 blocks' pages: none left for o's buffer
    assert g.use("m", 5 * 1024, 0) == 0.0 and g.buffer_pages("m") == 0  # taken from its buffer, none to refill
    g.unload("o")
    before = g.counters.background_s
    assert g.use("m", 5 * 1024 - 100, 0) == 0.0  # the same five blocks: nothing mapped on the path
    assert g.kv_pages("m") == 5 * 64 and g.used_tokens("m") == (5 * 1024 - 100, 0)
    assert g.buffer_pages("m") == 5 * 64 and g.counters.background_s == pytest.approx(before + 320 * MAP_PAGE)
    assert g.free_pages == 64 * 20 - 10 * 64


def test_freed_blocks_return_to_the_buffer_up_to_its_bound_the_rest_unmapped():
    g = loaded()
    g.use("m", 40 * 1024, 0)
    assert g.buffer_pages("m") == 5 * 64
    t = g.use("m", 10 * 1024, 0)  # 30 blocks freed: 5 fill the buffer to 10, 25 are unmapped on the path
    assert g.buffer_pages("m") == 10 * 64
    assert t == pytest.approx(25 * 64 * UNMAP_PAGE)


def test_balloon_grows_at_once_and_shrinks_only_as_blocks_free():
    g = loaded(limit=8 * 1024)
    assert g.limit_tokens("m") == 8 * 1024 and g.buffer_pages("m") == 5 * 64
    g.use("m", 6 * 1024, 2 * 1024)  # 6 blocks live, 2 cached: at the limit
    assert g.room_tokens("m") == 0
    with pytest.raises(MemoryFull):
        g.use("m", 9 * 1024, 0)
    g.set_limit("m", 20 * 1024)  # grow: at once
    assert g.limit_tokens("m") == 20 * 1024 and g.room_tokens("m") == 12 * 1024
    g.set_limit("m", 3 * 1024)  # shrink below the 8 blocks held: the buffer goes now, no KV is dropped
    assert g.kv_pages("m") == 8 * 64 and g.buffer_pages("m") == 0
    assert g.limit_tokens("m") == 8 * 1024 and g.target_tokens("m") == 3 * 1024
    assert g.excess_tokens("m") == 5 * 1024 and g.room_tokens("m") == 0
    g.use("m", 6 * 1024, 0)  # the cache gave up its 2 blocks: the limit follows them down
    assert g.limit_tokens("m") == 6 * 1024 and g.buffer_pages("m") == 0
    g.use("m", 1024, 0)  # requests finished: down to the target, never below it
    assert g.limit_tokens("m") == 3 * 1024 and g.buffer_pages("m") == 2 * 64
    assert g.excess_tokens("m") == 0


def test_a_woken_model_takes_other_models_buffers_first():
    g = GpuMemory(64 * 12)  # 768 pages
    g.load("a", 0, LLAMA8)  # buffer: 5 blocks = 320 pages
    g.load("b", 0, LLAMA8)  # buffer: 5 more
    assert g.free_pages == 128
    t = g.load("c", 300 * PAGE_BYTES, LLAMA8)  # 300 pages: 128 free, 172 from the buffers (3 blocks unmapped)
    assert t == pytest.approx(3 * 64 * UNMAP_PAGE)
    assert g.used_pages <= g.total_pages
    with pytest.raises(MemoryFull):
        g.load("d", 10**12, LLAMA8)


def test_unload_frees_everything_but_not_running_requests():
    g = loaded()
    g.use("m", 2048, 4096)
    with pytest.raises(ValueError, match="running requests"):
        g.unload("m")
    g.use("m", 0, 4096)
    t = g.unload("m")
    assert g.free_pages == g.total_pages and "m" not in g
    # the weights, 4 blocks of cached prefixes, and a buffer of 7 (5 refilled, 2 freed by the cache)
    assert t == pytest.approx((7659 + 64 * (4 + 7)) * UNMAP_PAGE)


def test_sample_adds_up_and_splits_live_from_cached():
    g = loaded()
    g.use("m", 1500, 3000)  # live needs 2 blocks, live + cached 5
    s = g.sample(1.0)
    assert s.weights + s.kv_live + s.kv_cached + s.buffer + s.free == g.total_pages * PAGE_BYTES
    assert (s.kv_live, s.kv_cached) == (2 * 64 * PAGE_BYTES, 3 * 64 * PAGE_BYTES)


def test_a_balloon_moves_only_with_the_pools_changes():
    """An elastic engine keeps its balloon until the pool's ``changes`` moves: the two ways a balloon moves
    without a block of the model changing hands move it too."""
    g = GpuMemory(300 + 64 * 15)
    for m in "abc":
        g.load(m, 100 * PAGE_BYTES, LLAMA8)
    g.use("b", 5 * 1024, 0)  # b's buffer is all in use, and no page is free to refill it
    g.use("a", 0, 0)
    g.unload("a")
    seen = g.changes, g.balloon("c")
    g.use("b", 5 * 1024 - 10, 0)  # in the blocks b holds; its buffer refills from the free pages c could reach
    assert g.balloon("c") != seen[1] and g.changes != seen[0]
    g.set_limit("b", 1024)  # a shrink waits for b's blocks: what it should free moves with its tokens
    seen = g.changes, g.balloon("b")
    g.use("b", 5 * 1024 - 20, 0)
    assert g.balloon("b") == (seen[1][0] - 10, seen[1][1]) and g.changes != seen[0]


# ---------------------------------------------------------------- invariants
LAYOUTS = [LLAMA8, KvLayout.of(profiles.model("qwen2.5-0.5b")), KvLayout.of(profiles.model("llama-3.2-1b"))]
op = st.one_of(
    st.tuples(st.just("load"), st.integers(0, 3), st.integers(0, 2), st.integers(0, 600),
              st.none() | st.integers(0, 80_000)),
    st.tuples(st.just("unload"), st.integers(0, 3)),
    st.tuples(st.just("use"), st.integers(0, 3), st.integers(0, 60_000), st.integers(0, 60_000)),
    st.tuples(st.just("limit"), st.integers(0, 3), st.integers(0, 80_000)),
    st.tuples(st.just("nudge"), st.integers(0, 3), st.integers(-50, 50)),  # a use in the blocks it holds
)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(200, 3000), ops=st.lists(op, max_size=40))
def test_invariants(total, ops):
    """Pages never exceed the GPU's; a shrink never takes blocks in use; a grow is immediate when pages are free;
    a use within room_tokens always succeeds and one beyond it never does."""
    g = GpuMemory(total)
    layouts: dict[str, KvLayout] = {}
    looked: dict[str, tuple[int, tuple[int, int]]] = {}  # a model's balloon as an engine keeps it (GpuMemory.changes)
    for o in ops:
        name = f"m{o[1]}"
        if o[0] == "load" and name not in g:
            layout, pages, limit = LAYOUTS[o[2]], o[3], o[4]
            if g.can_load(pages * PAGE_BYTES):
                g.load(name, pages * PAGE_BYTES, layout, limit)
                layouts[name] = layout
                assert g.weight_pages(name) == pages
            else:
                with pytest.raises(MemoryFull):
                    g.load(name, pages * PAGE_BYTES, layout, limit)
        elif o[0] == "unload" and name in g:
            g.use(name, 0, g.used_tokens(name)[1])
            g.unload(name)
        elif o[0] == "use" and name in g:
            live, cached = o[2], o[3]
            held = sum(g.used_tokens(name))
            if live + cached - held <= g.room_tokens(name):
                pages, released = g.kv_pages(name), g.counters.blocks_released
                g.use(name, live, cached)
                assert g.used_tokens(name) == (live, cached)
                # the fleet wakes engines waiting for pages when blocks in use fall: this count says so
                ppb = layouts[name].pages_per_block
                assert g.counters.blocks_released - released == max(0, pages - g.kv_pages(name)) // ppb
            else:
                with pytest.raises(MemoryFull):
                    g.use(name, live, cached)
        elif o[0] == "nudge" and name in g:
            live, cached = g.used_tokens(name)
            if live + o[2] >= 0 and o[2] <= g.room_tokens(name):
                g.use(name, live + o[2], cached)
        elif o[0] == "limit" and name in g:
            lay = layouts[name]
            ppb = lay.pages_per_block
            used, blocks = g.used_tokens(name), g.kv_pages(name) // ppb
            reachable = blocks + g.buffer_pages(name) // ppb + g.free_pages // ppb  # blocks it could hold now
            g.set_limit(name, o[2])
            assert g.kv_pages(name) == blocks * ppb and g.used_tokens(name) == used  # nothing in use is taken
            assert g.limit_tokens(name) == lay.tokens(max(lay.blocks(o[2]), blocks))
            if lay.blocks(o[2]) >= blocks:  # a grow (or no change): all of it usable at once, as pages allow
                assert g.room_tokens(name) == lay.tokens(min(lay.blocks(o[2]), reachable)) - sum(used)
        assert 0 <= g.used_pages <= g.total_pages
        for m in g.models:  # a balloon moves only with the pool's changes
            if m in looked and looked[m][0] == g.changes:
                assert g.balloon(m) == looked[m][1], o
            looked[m] = (g.changes, g.balloon(m))
            ppb = layouts[m].pages_per_block
            assert g.kv_pages(m) + g.buffer_pages(m) <= g.limit_tokens(m) // layouts[m].tokens_per_block * ppb
            assert g.kv_pages(m) == layouts[m].pages(sum(g.used_tokens(m)))
            assert g.limit_tokens(m) >= g.target_tokens(m) and g.room_tokens(m) >= 0
