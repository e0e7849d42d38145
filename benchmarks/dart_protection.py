"""What DART's protection set F does on a trace: which segments it holds at the eviction passes, how often a
node of a protected segment is an eviction candidate (an unlocked leaf), how many protected tokens are
evicted, and whether the run's ``requests.csv`` differs from the run with ``dart.f=0`` (no protection).

    python benchmarks/dart_protection.py                       # zipf at 60 QPS, prism, f = 0, 1, 2, 4, 32
    python benchmarks/dart_protection.py --qps 70 --f 0,1,32 --set engine.max_total_tokens=32768

A protected segment changes an eviction only when one of its nodes is a candidate that LRU would have taken
before some unprotected one: a segment whose nodes are always locked by running requests (the system prompt,
which every running request holds) can be in F without moving anything.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from prism.cli.sim import main as sim_main
from prism.core import PRIV
from prism.policies import dart


class Probe:
    """Counts, over a run's eviction passes, F's members and F's candidates (wrapping DART.prepare)."""

    def __init__(self) -> None:
        self.passes = 0
        self.in_f: Counter = Counter()  # segment -> passes it was in F
        self.f_size = 0
        self.passes_with_candidate = 0  # passes where some unlocked leaf belongs to a protected segment
        self.protected_candidates = 0  # such leaves, summed over passes
        self.candidates = 0  # unlocked leaves, summed over passes
        self.reusable_candidates = 0  # unlocked leaves of unprotected sys/reusable segments

    def install(self):
        original = dart.DART.prepare
        probe = self

        def prepare(policy, cache):
            original(policy, cache)
            if not policy._hinted:
                return
            probe.passes += 1
            probe.f_size += len(policy.protected)
            probe.in_f.update(policy.protected)
            leaves = cache.evictable_leaves()
            prot = sum(1 for n in leaves if n.kind != PRIV and n.seg_id in policy.protected)
            probe.candidates += len(leaves)
            probe.protected_candidates += prot
            probe.reusable_candidates += sum(1 for n in leaves if n.kind != PRIV) - prot
            probe.passes_with_candidate += prot > 0

        dart.DART.prepare = prepare
        return original


def run(args: list[str], f: int) -> tuple[dict, str, Probe]:
    probe = Probe()
    original = probe.install()
    try:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            sim_main([*args, "--set", f"dart.f={f}", "--no-progress", "--out", tmp])
            summary = json.loads((Path(tmp) / "summary.json").read_text())
            digest = hashlib.sha256((Path(tmp) / "requests.csv").read_bytes()).hexdigest()[:16]
    finally:
        dart.DART.prepare = original
    return summary, digest, probe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="zipf", help="trace spec or built-in name (default zipf)")
    p.add_argument("--method", default="prism", help="a method whose eviction is dart (default prism)")
    p.add_argument("--qps", default="60", help="arrival rate (default 60)")
    p.add_argument("--f", default="0,1,2,4,32", help="comma-separated protection set sizes (default 0,1,2,4,32)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a prism-sim setting")
    a = p.parse_args()
    base = ["--trace", a.trace, "--method", a.method, "--qps", a.qps]
    for s in a.set:
        base += ["--set", s]
    rows, ref = [], None
    for f in [int(x) for x in a.f.split(",")]:
        summary, digest, probe = run(base, f)
        ref = digest if ref is None else ref
        c = summary["counters"]
        n = max(probe.passes, 1)
        top = ", ".join(f"{s} {k / n:.0%}" for s, k in probe.in_f.most_common(3))
        rows.append([f, probe.passes, f"{probe.f_size / n:.1f}", top or "-",
                     f"{probe.passes_with_candidate / n:.1%}", f"{probe.protected_candidates / n:.2f}",
                     f"{probe.reusable_candidates / n:.1f}", f"{probe.candidates / n:.1f}",
                     c.get("evicted_tokens_protected", 0), c.get("evicted_tokens_reusable", 0),
                     f"{summary['hit_rate']:.4f}", f"{summary['ttft_s']['p99']:.3f}", digest,
                     "same" if digest == ref else "differs"])
    head = ["f", "passes", "|F|", "most in F (share of passes)", "passes with a protected candidate",
            "protected candidates/pass", "unprotected reusable candidates/pass", "candidates/pass",
            "protected tokens evicted", "reusable tokens evicted", "hit", "P99 s", "requests.csv", "vs first f"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
