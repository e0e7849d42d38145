"""What moving a model costs: GPU page operations and loading weights from host memory (DESIGN §9).

**Pages** (kvcached, the Prism paper's balloon driver, ``ovg-project/kvcached``): a GPU's memory is handed out in
physical pages of 2 MiB (``kvcached/utils.py`` ``PAGE_SIZE``), each created, mapped into an engine's reserved
virtual range and given access rights before use, and unmapped when freed. Their costs, measured on an A100
with one thread over 4,096 pages of 2 MB (``benchmarks/bench_vmm/README.md``, averages): ``cuMemCreate``
193.32 us, ``cuMemMap`` 1.45 us, ``cuMemSetAccess`` 35.99 us, ``cuMemUnmap`` 25.63 us (:class:`VmmCosts`; a
simulator charges them where kvcached pays them, see ``sim/memory.py``). Weights are mapped in large
allocations at load, not page by page: a page's fixed cost would add 1.8 s to an 8 B model's 7,660 pages, far
above the paper's measured activation (0.7 s), so the per-page costs apply to KV growth and to unmapping.

**Activation** (Prism §5.3, Fig. 10; paper text: ``meojun/Prism``
``exp/analysis/estimator_correction/paper_osdi26_extracted.txt``): the time to start serving an evicted model is
the engine start (none when an engine comes from the pre-initialized pool; a cold SGLang start with CUDA-graph
capture takes 10-60 s) plus its weights over the path from host memory (:func:`load_seconds`). The path is the
target GPU's own PCIe link, or k links of the node in parallel whose pieces are gathered into the target over
NVLink (the paper's parallel loading). A tensor-parallel model loads each shard onto its own GPU, over that
GPU's link at least.

**Against the paper's H100 figures** (PCIe Gen5, 8 GPUs per node; 1-8 B within 0.7 s from the pool with parallel
loading, 14 B in 1.3 s, 70 B TP 8 in 1.5 s, about 7 s naively): the link arithmetic alone, at the measured
50 GB/s per Gen5 link and 380 GB/s NVLink, is far faster (8 B: 0.04 s over 8 links; 14 B: 0.07 s; 70 B TP 8:
0.35 s), so the paper's loads are not link-bound. They were measured from *pageable* host memory, which a
process must stage through pinned buffers on the CPU: two caps on the host side reproduce them,
:data:`PAPER_H100_PAGEABLE`, fitted to the 14 B and 70 B figures: one loading process stages about 22.7 GB/s
(29.5 GB in 1.3 s) and the node's host memory gives about 94 GB/s to all loads together (141 GB in 1.5 s with 8
processes). With them, 1 B, 3 B and 8 B load in 0.11, 0.28 and 0.71 s (the paper: within 0.7 s). The paper's
naive 7 s is its own engine start (about 6.3 s) plus a one-link load; a full SGLang cold start (10-60 s) is
slower. :data:`PINNED` (the default) keeps weights in pinned host memory (SGLang's
``--enable-weights-cpu-backup``), where the links are the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from prism.calibration.profiles import GPU, Model
from prism.config import positive
from prism.errors import UserError

PAGE_BYTES = 2 * 1024 * 1024  # kvcached/utils.py PAGE_SIZE (default 2 MB)


@dataclass(frozen=True)
class VmmCosts:
    """Seconds per 2 MiB page of each CUDA virtual-memory call (kvcached's A100 measurement, module docstring)."""

    create_s: float = positive(193.32e-6, "cuMemCreate: allocate one physical page")
    map_s: float = positive(1.45e-6, "cuMemMap: map it into an engine's virtual range")
    set_access_s: float = positive(35.99e-6, "cuMemSetAccess: make the mapping readable and writable")
    unmap_s: float = positive(25.63e-6, "cuMemUnmap: unmap (and free) one page")

    def map_seconds(self, pages: int) -> float:
        """Create, map and enable ``pages`` fresh pages."""
        return pages * (self.create_s + self.map_s + self.set_access_s)

    def unmap_seconds(self, pages: int) -> float:
        return pages * self.unmap_s


def pages_for_bytes(nbytes: float) -> int:
    """Whole pages that hold ``nbytes``."""
    return -int(-nbytes // PAGE_BYTES)


@dataclass(frozen=True)
class LoadingConfig:
    """How a model is brought onto GPUs (the knobs of :func:`activation_seconds`)."""

    engine_pool: bool = True  # an engine from the pre-initialized pool: no start cost
    cold_start_s: float = positive(30.0, "seconds to start an engine outside the pool (SGLang process and CUDA "
                                         "graphs: 10-60 s)")
    parallel_links: int = positive(1, "host links one load uses at once (1: the target's own; up to the GPUs of "
                                      "a node, gathered over NVLink)")
    host_copy_bandwidth: float | None = positive(None, "bytes/s one loading process stages from pageable host "
                                                       "memory (null: pinned memory, the links are the limit)")
    node_host_bandwidth: float | None = positive(None, "bytes/s the node's host memory gives all loads at once "
                                                       "(null: no limit)")


#: Weights in pinned host memory, one link (the plain reading of DESIGN §9).
PINNED = LoadingConfig()
#: The paper's measured H100 node (module docstring): pageable host memory, all 8 links in parallel.
PAPER_H100_PAGEABLE = LoadingConfig(parallel_links=8, host_copy_bandwidth=22.7e9, node_host_bandwidth=94e9)


def links_used(gpu: GPU, tp: int, links: int) -> int:
    """Links a load of a ``tp``-way model uses: one per shard at least; more only where NVLink can gather the
    pieces (a PCIe card without NVLink loads each shard over its own link)."""
    if tp > gpu.gpus_per_node:
        raise UserError(f"field 'tp': {tp} GPUs for one model, but a {gpu.key or gpu.name} node has "
                        f"{gpu.gpus_per_node}")
    if links > gpu.gpus_per_node:
        raise UserError(f"field 'parallel_links': {links} links, but a {gpu.key or gpu.name} node has "
                        f"{gpu.gpus_per_node} GPUs")
    return max(tp, links) if gpu.nvlink_bandwidth > 0 else tp


def load_seconds(weight_bytes: float, gpu: GPU, tp: int = 1, config: LoadingConfig = PINNED) -> float:
    """Seconds to copy a model's weights (``weight_bytes``, all shards) from host memory onto ``tp`` GPUs.

    k links carry W/k each; each target receives its shard W/tp, W/k of it over its own link and the rest over
    NVLink; the load takes the slowest of: a link, a target's NVLink ingress, a loading process's staging of its
    shard (``host_copy_bandwidth``), the node's host memory for all of W (``node_host_bandwidth``)."""
    k = links_used(gpu, tp, config.parallel_links)
    shard = weight_bytes / tp
    times = [weight_bytes / k / gpu.pcie_bandwidth]
    if k > tp:
        times.append((shard - weight_bytes / k) / gpu.nvlink_bandwidth)
    if config.host_copy_bandwidth is not None:
        times.append(shard / config.host_copy_bandwidth)
    if config.node_host_bandwidth is not None:
        times.append(weight_bytes / config.node_host_bandwidth)
    return max(times)


def activation_seconds(model: Model, gpu: GPU, tp: int = 1, config: LoadingConfig = PINNED,
                       dtype_bytes: int = 2) -> float:
    """Engine start (0 from the pool) plus the weights' load: an evicted model's time to serve again."""
    model.check_tp(tp)
    start = 0.0 if config.engine_pool else config.cold_start_s
    return start + load_seconds(model.weight_bytes(dtype_bytes), gpu, tp, config)


def deactivation_seconds(pages: int, costs: VmmCosts = VmmCosts()) -> float:
    """Unmapping a model's pages when it is evicted (its weights stay in host memory, its engine returns to the
    pool): the paper's "terminating the engine and releasing all memory"."""
    return costs.unmap_seconds(pages)
