"""sglang-router 0.3.2 itself (the PyPI release), in front of stub workers and in front of real SGLang servers.

* Stub workers (``stub_worker.py``, which log every body they receive and hold a request ``max_new_tokens/100``
  seconds): what the router forwards (``input_ids``, ``rid``, ``ignore_eos`` kept; ``custom_params`` and
  ``logit_bias`` dropped), its start-up defaults (those of ``policies/cache_aware.py``), and its cache-aware
  choices on a sequence built to tell the rules apart, replayed through the simulator's ``CacheAware`` with the
  same loads: a shared prefix follows its worker, and below ``cache_threshold`` a request goes to the least
  loaded worker even when that worker's tree is the larger (earlier releases took the smallest tree).
* ``prism-live --instances 2 --router sglang_router``: every request is served once, on the instance whose event
  log has it; the segments reach each server's plugin through its rid table (counters), QAS realigns there.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sglang_router")

from prism.core import TOKEN_DTYPE  # noqa: E402
from prism.policies.cache_aware import CacheAware, CacheAwareConfig  # noqa: E402
from prism.live.router import free_port  # noqa: E402

HERE = Path(__file__).resolve().parent
ROUTER_PORT, WORKERS = 30181, (30182, 30183)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _wait(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


@pytest.fixture(scope="module")
def stub_router(tmp_path_factory):
    folder = tmp_path_factory.mktemp("router")
    logs = [folder / f"w{i}.log" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(HERE / "stub_worker.py"), str(p), str(log)])
             for p, log in zip(WORKERS, logs)]
    for p in WORKERS:
        _wait(f"http://127.0.0.1:{p}/health")
    router_log = folder / "router.log"
    with router_log.open("w") as f:
        procs.append(subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
                                       *(f"http://127.0.0.1:{p}" for p in WORKERS), "--policy", "cache_aware",
                                       "--host", "127.0.0.1", "--port", str(ROUTER_PORT),
                                       "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
                                      stdout=f, stderr=f))
    try:
        _wait(f"http://127.0.0.1:{ROUTER_PORT}/health")
        yield f"http://127.0.0.1:{ROUTER_PORT}", logs, router_log
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def _bodies(logs) -> list[tuple[int, dict]]:
    out = []
    for i, log in enumerate(logs):
        if log.exists():
            out += [(i, e["body"]) for e in map(json.loads, log.read_text().splitlines()) if e["path"] == "/generate"]
    return out


def _where(logs, rid: str) -> int:
    found = [i for i, body in _bodies(logs) if body.get("rid") == rid]
    assert len(found) == 1, (rid, found)
    return found[0]


def test_the_router_drops_custom_params_and_keeps_rid(stub_router):
    url, logs, router_log = stub_router
    _post(f"{url}/generate", {"input_ids": [7, 8, 9, 10], "rid": "probe-1", "stream": False,
                              "sampling_params": {"max_new_tokens": 1, "ignore_eos": True, "temperature": 0.0,
                                                  "logit_bias": {"2": -1e9}, "custom_params": {"prism_ids": ["a"]}}})
    (_, body), = [(i, b) for i, b in _bodies(logs) if b.get("rid") == "probe-1"]
    assert body["input_ids"] == [7, 8, 9, 10]
    assert body["sampling_params"] == {"max_new_tokens": 1, "ignore_eos": True, "temperature": 0.0}
    # the five cache-aware knobs it started with are ours (sglang-router 0.3.2's launcher defaults)
    text = re.sub(r"\x1b\[[0-9;]*m", "", router_log.read_text())
    m = re.search(r"CacheAware \{ cache_threshold: ([\d.]+), balance_abs_threshold: (\d+), balance_rel_threshold: "
                  r"([\d.]+), eviction_interval_secs: (\d+), max_tree_size: (\d+) \}", text)
    assert m, text[-2000:]
    d = CacheAwareConfig()
    assert (float(m[1]), int(m[2]), float(m[3]), float(m[4]), int(m[5])) == (
        d.cache_threshold, d.balance_abs_threshold, d.balance_rel_threshold, d.eviction_interval_s, d.max_tree_size)


class _View:
    def __init__(self, index: int, load: int) -> None:
        self.index, self.running, self.queued, self.queued_prefill_tokens = index, load, 0, 0

    def match_len(self, key: bytes) -> int:
        return 0


class _Req:
    def __init__(self, rid: int, ids: list[int]) -> None:
        self.id, self.arrival, self.segments, self.fixed_order = rid, 0.0, (), True
        self.key, self.prompt_len = np.asarray(ids, dtype=TOKEN_DTYPE).tobytes(), len(ids)


def test_the_router_and_the_simulators_cache_aware_choose_alike(stub_router):
    """A (long, held 3 s), B (A's prompt + one token: a hit, while A is in flight), C (new, held, while A is in
    flight: the idle worker), D (new, after A finished, while C is in flight: the least loaded worker, A's, whose
    tree is the larger). The simulator's policy, fed the same loads, must choose the same (up to naming)."""
    url, logs, _ = stub_router
    base = 50_000 + int(time.time()) % 10_000 * 10  # prompts no earlier run of this router has seen
    a = list(range(base, base + 600))
    steps = [("A", a, 300), ("B", a + [7], 1), ("C", list(range(base + 1000, base + 1010)), 300),
             ("D", list(range(base + 2000, base + 2010)), 1)]
    rid = {name: f"order-{base}-{name}" for name, _, _ in steps}
    threads = {}

    def send(name, ids, hold):
        _post(f"{url}/generate", {"input_ids": ids, "rid": rid[name], "stream": False,
                                  "sampling_params": {"max_new_tokens": hold}})

    for name, ids, hold in steps:
        if name == "D":
            threads["A"].join()
        threads[name] = threading.Thread(target=send, args=(name, ids, hold))
        threads[name].start()
        if hold > 1:
            time.sleep(0.5)  # in flight before the next one is routed
        else:
            threads[name].join()
    threads["C"].join()
    real = {name: _where(logs, rid[name]) for name in rid}
    assert real["B"] == real["A"] and real["C"] != real["A"] and real["D"] == real["A"]
    # the simulator's policy on the same sequence, with the router's loads at each decision
    policy = CacheAware()
    loads = [0, 0]
    sim = {}
    for name, ids, hold in steps:
        if name == "D":
            loads[sim["A"]] -= 1
        sim[name] = policy.route(_Req(len(sim), ids), [_View(i, loads[i]) for i in range(2)], 0.0)
        if hold > 1:
            loads[sim[name]] += 1
    same = {name: sim[name] == sim["A"] for name in sim}
    assert same == {name: real[name] == real["A"] for name in real}


def test_the_router_breaks_ties_of_load_by_worker_order(stub_router):
    """Unrelated requests one after the other (equal loads, no match): all to one worker (Rust's ``min_by_key``
    takes the first of equal minima in the router's own worker order), as the simulator's policy sends them all to
    its first instance; earlier releases spread them over the smaller trees."""
    url, logs, _ = stub_router
    base = 90_000 + int(time.time()) % 10_000 * 10
    rids = [f"tie-{base}-{k}" for k in range(6)]
    for k, rid in enumerate(rids):
        _post(f"{url}/generate", {"input_ids": [base + 100 * k + j for j in range(8)], "rid": rid, "stream": False,
                                  "sampling_params": {"max_new_tokens": 1}})
    assert len({_where(logs, rid) for rid in rids}) == 1  # which one is the router's order, not the ports'
    policy = CacheAware()
    assert {policy.route(_Req(k, [base + 100 * k + j for j in range(8)]), [_View(0, 0), _View(1, 0)], 0.0)
            for k in range(6)} == {0}


def test_prism_live_through_sglang_router(tmp_path):
    pytest.importorskip("sglang.srt.managers.scheduler")
    from prism.cli.live import main as live_main
    from prism.live.instance import EventLog

    out = tmp_path / "run"
    assert live_main(["--model", "tiny", "--instances", "2", "--router", "sglang_router", "--trace", "zipf",
                      "--set", "trace.num_requests=60", "--set", "engine.max_total_tokens=8192", "--method", "prism",
                      "--set", "qas.window_s=0", "--qps", "100", "--port", "30185", "--out", str(out),
                      "--no-progress"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] and s["num_requests"] == 60 and s["router_process"]["name"] == "sglang_router"
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["id"]) for r in rows) == list(range(60))
    logs = [EventLog(out / f"instance-{i}" / "events.jsonl") for i in range(2)]
    for r in rows:  # served once, on the instance whose event log has it
        holders = [i for i, log in enumerate(logs) if log.get(int(r["id"])) is not None]
        assert holders == [int(r["instance"])], r
    assert min(sum(int(r["instance"]) == i for r in rows) for i in range(2)) > 0
    c = s["counters"]  # the servers' plugins, summed: every request's segments arrived by rid (custom_params did not)
    assert c["segments_by_rid"] == 60 and c["segments_sys"] == 60
    assert c["qas_rounds"] > 0 and c["front_alignment_moves"] > 0 and s["hit_tokens"] > 0
