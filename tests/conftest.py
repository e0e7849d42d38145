from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prism.core import PRIV, REUSE, SYS, Request, SegmentTable
from prism.traces.arrivals import default_data_dir
from prism.traces.trace import Trace

ROOT = Path(__file__).resolve().parent.parent
DATA = default_data_dir()


def need_data(*parts: str) -> Path:
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"public data set not found at {path} (../shared/data is not laid beside the checkout)")
    return path


def make_trace(specs, table: SegmentTable | None = None) -> Trace:
    """specs: list of (arrival, [(kind, id, length), ...], output_len)."""
    table = table or SegmentTable()
    reqs = []
    for i, (t, segs, out) in enumerate(specs):
        reqs.append(Request(i, t, tuple(table.segment(sid, kind, n) for kind, sid, n in segs), out))
    return Trace(reqs, table, "custom", {"qps": None, "seed": 0})


def brute_force_hits(requests) -> list[int]:
    """Infinite-cache hits by comparing every prompt's tokens with every earlier one's (at least one token left)."""
    out, seen = [], []
    for r in requests:
        t = r.tokens()
        best = 0
        for e in seen:
            n = min(len(t), len(e))
            diff = np.flatnonzero(t[:n] != e[:n])
            best = max(best, int(diff[0]) if len(diff) else n)
        out.append(min(best, len(t) - 1))
        seen.append(t)
    return out


@pytest.fixture
def tiny_zipf():
    from prism.traces.spec import generate
    from prism.traces.zipf import ZipfHotspotSpec

    return generate(ZipfHotspotSpec(num_requests=200, qps=20.0))


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory) -> Path:
    """The small BPE tokenizer with a ChatML template (prism.traces.demo_tokenizer), built once per session."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    need_data("multihop_rag")
    need_data("tau_bench")
    from prism.traces.demo_tokenizer import build

    return build(tmp_path_factory.mktemp("tokenizer"))


def cyclic_garbage_during(spec, every: int = 25) -> list[tuple[int, list]]:
    """Simulate ``spec``, collecting on purpose at every ``every``-th finish: the (objects, commonest kinds) of each
    collection that found any. Mid-run, what the run still uses is reachable, so whatever is found is garbage that
    only the (paused) cyclic collector could free."""
    import collections
    import gc

    from prism.sim.run import simulate

    found: list[tuple[int, list]] = []

    def on_record(rec):
        if rec.id % every == 0:
            debug, kept = gc.get_debug(), len(gc.garbage)
            gc.set_debug(debug | gc.DEBUG_SAVEALL)  # keep what it finds, to name it
            try:
                n = gc.collect()
                kinds = collections.Counter(type(o).__name__ for o in gc.garbage[kept:]).most_common(4)
            finally:
                gc.set_debug(debug)
                del gc.garbage[kept:]
                gc.collect()  # freed now, not found again by the next check
            if n:
                found.append((n, kinds))

    gc.collect()
    try:
        assert len(simulate(spec, on_record=on_record).records) == len(spec.trace.requests)
    finally:
        gc.collect()  # the run's own cycles (its tree), freed now
    return found


__all__ = ["SYS", "REUSE", "PRIV", "make_trace", "need_data", "ROOT", "brute_force_hits",
           "cyclic_garbage_during"]

