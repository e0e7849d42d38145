"""prism-live on two real SGLang servers (CPU, the 2-layer ``tiny`` geometry) behind the project's router.

For round robin and LMetric on a 40-request trace: every request is served exactly once, by the server the
router chose (the ``instance`` column of requests.csv against each server's own event log, written in its
scheduler process), the instances' shares are the router's decisions (round robin: alternating in the order
the requests were sent), the summary carries the simulator's cluster block, consistent with the records,
each server's files are in its instance folder, and no server process is left. Two server starts per run
(side by side, about 40 s on two idle cores).
"""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("sglang.srt.managers.scheduler")

from prism.cli.live import main as live_main  # noqa: E402
from test_live_server import _processes_with  # noqa: E402  (a run's server processes, by their environment)

N = 40


# one router (lmetric: it reads the client's views of both servers); rr's fixed alternation is the dispatcher's,
# tested without servers (tests/test_live_dispatch.py), and the real router has its own test (test_live_router.py)
@pytest.mark.parametrize("router,port", [("lmetric", 30161)])
def test_two_servers_behind_the_router(tmp_path, router, port, capsys):
    out = tmp_path / router
    argv = ["--trace", "zipf", "--set", f"trace.num_requests={N}", "--set", "engine.max_total_tokens=8192",
            "--model", "tiny", "--no-progress", "--method", "sglang", "--qps", "50", "--instances", "2",
            "--router", router, "--out", str(out), "--port", str(port)]
    assert live_main(argv) == 0
    assert "imbalance" in capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] and s["num_requests"] == N
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["id"]) for r in rows) == list(range(N))  # each request once
    placed = {int(r["id"]): int(r["instance"]) for r in rows}
    for i in (0, 1):  # served where the router sent it: the server's own scheduler logged it
        folder = out / f"instance-{i}"
        logged = [json.loads(ln)["id"] for ln in (folder / "events.jsonl").read_text().splitlines()]
        assert sorted(set(logged)) == sorted(k for k, v in placed.items() if v == i), i
        assert (folder / "server.log").stat().st_size > 0
        assert not _processes_with(str(folder / "plugin.json"))
    c = s["cluster"]
    assert c["instances"] == 2 and c["router"] == router
    per = c["per_instance"]
    for p in per:
        mine = [r for r in rows if int(r["instance"]) == p["instance"]]
        assert p["requests"] == len(mine)
        assert p["hit_tokens"] == sum(int(r["hit_tokens"]) for r in mine)
        assert p["prompt_tokens"] == sum(int(r["prompt_tokens"]) for r in mine)
    assert sum(p["requests"] for p in per) == N and abs(sum(p["share"] for p in per) - 1) < 1e-9
    counts = [p["requests"] for p in per]
    assert c["imbalance"] == pytest.approx(max(counts) / (N / 2))
    assert min(counts) > 0  # an idle server's P × 1 beats a busy one's P × (BS + 1) from the second request
