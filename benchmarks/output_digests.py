"""Digests of ``requests.csv`` (and a fleet's ``memory.csv``) for a fixed set of comparison runs: a refactoring
or speed change must leave every one of them byte-identical.

    python benchmarks/output_digests.py > before.txt     # on the old commit
    python benchmarks/output_digests.py --check before.txt   # on the new one: exit 1 on any difference

The set covers every scheduler at a light and a heavy load, the real-data workloads, an anchored eviction
under a plain scheduler, QAS with a longer signature on pages of 16 tokens, a GPU-sized KV pool, and the LFU,
DART-with-a-small-protection-set and Belady eviction keys under pressure, and several models sharing GPUs
under every sharing scheme.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import sys
import tempfile
from pathlib import Path

from prism.cli.sim import main as sim_main

RUNS: dict[str, list[str]] = {
    **{f"{m}-qps{q}": ["--trace", "zipf", "--method", m, "--qps", str(q)]
       for m in ("prism", "sglang", "fcfs", "klpm", "contextpilot") for q in (25, 60)},
    "multihop-prism": ["--trace", "multihop", "--method", "prism"],
    "agent-prism": ["--trace", "agent", "--method", "prism", "--set", "trace.num_requests=300"],
    "fcfs+lru_active": ["--trace", "zipf", "--method", "fcfs+lru_active"],
    "qas-kappa2-page16": ["--trace", "zipf", "--method", "prism", "--set", "qas.kappa=2",
                          "--set", "engine.page_size=16"],
    # the default pool is GPU-sized: the profile's, where the tree holds thousands of leaves between evictions
    **{f"{m}-gpu-pool": ["--trace", "zipf", "--method", m, "--set", "engine.max_total_tokens=null"]
       for m in ("prism", "sglang")},
    # a small pool: eviction under pressure, and SGLang's retraction
    **{f"{m}-pool32k": ["--trace", "zipf", "--method", m, "--set", "engine.max_total_tokens=32768"]
       for m in ("prism", "sglang", "klpm", "contextpilot")},
    "prism-in-engine-pool32k": ["--trace", "zipf", "--method", "prism", "--set", "qas.window_s=0",
                                "--set", "engine.max_total_tokens=32768"],
    # the other eviction keys under pressure: hit counts, a small protection set that churns, the oracle
    "fcfs+lfu": ["--trace", "zipf", "--method", "fcfs+lfu", "--set", "engine.max_total_tokens=32768"],
    "prism-dart-f4": ["--trace", "zipf", "--method", "prism", "--set", "dart.f=4",
                      "--set", "engine.max_total_tokens=32768"],
    "fcfs+belady": ["--trace", "zipf", "--method", "fcfs+belady", "--set", "trace.num_requests=500",
                    "--set", "engine.max_total_tokens=32768"],
    # the oracle under the schedulers a sweep pairs it with (realigned prompts, the GPU-sized pool)
    "qas+belady-pool32k": ["--trace", "zipf", "--method", "qas+belady", "--set", "engine.max_total_tokens=32768"],
    "contextpilot+belady-qps70": ["--trace", "zipf", "--method", "contextpilot+belady", "--qps", "70"],
    "lpm+belady-qps80": ["--trace", "zipf", "--method", "lpm+belady", "--qps", "80"],
    # agent turns reuse their session's earlier private messages: the oracle's paths run through them
    "agent-lpm+belady": ["--trace", "agent", "--method", "lpm+belady", "--set", "trace.num_requests=300",
                         "--set", "engine.max_total_tokens=32768"],
    # several models sharing GPUs: every scheme (requests.csv and memory.csv), prism also with QAS in its engines
    # and with parallel compute (no compute slot: the memory host alone)
    **{f"fleet-{s}": ["--trace", "multimodel", "--sharing", s]
       for s in ("dedicated", "static", "muxserve", "timeshare", "prism")},
    "fleet-prism-method-prism": ["--trace", "multimodel", "--sharing", "prism", "--method", "prism"],
    "fleet-prism-parallel": ["--trace", "multimodel", "--sharing", "prism", "--set", "fleet.compute=parallel"],
}

#: the files a run's digest covers, those it wrote (a fleet's memory samples beside its requests)
DIGESTED = ("requests.csv", "memory.csv")


def digests(only: list[str] | None = None) -> dict[str, str]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in RUNS.items():
            if only and name not in only:
                continue
            folder = Path(tmp) / name
            with contextlib.redirect_stdout(io.StringIO()):
                sim_main([*args, "--no-progress", "--out", str(folder)])
            h = hashlib.sha256()
            for f in DIGESTED:
                if (folder / f).exists():
                    h.update((folder / f).read_bytes())
            out[name] = h.hexdigest()[:16]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", help="a file written by an earlier run: exit 1 if any digest differs")
    p.add_argument("--only", nargs="*", help="run only these names")
    args = p.parse_args()
    now = digests(args.only)
    if not args.check:
        for k, v in now.items():
            print(f"{k} {v}")
        return 0
    before = dict(line.split() for line in Path(args.check).read_text().splitlines() if line.strip())
    bad = [k for k, v in now.items() if before.get(k) != v]
    for k, v in now.items():
        print(f"{k} {v} {'OK' if k not in bad else 'DIFFERS (was ' + str(before.get(k)) + ')'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
