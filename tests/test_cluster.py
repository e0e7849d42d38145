"""The simulated cluster: one instance is the single engine, byte for byte; N instances share one clock, each
with its own policies; routing delay, stale views and heterogeneous profiles; results and the CLI."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import socket

import pytest

from conftest import PRIV, REUSE, SYS, cyclic_garbage_during, make_trace
from prism.cli.sim import main as sim_main
from prism.metrics import write_requests_csv
from prism.settings import ClusterConfig, EngineConfig, RunSpec, settings_from
from prism.sim.run import simulate_cluster
from prism.sim.run import simulate
from prism.traces.spec import generate
from prism.traces.zipf import ZipfHotspotSpec


def _csv(tmp_path, name, records, cluster=False):
    path = tmp_path / f"{name}.csv"
    write_requests_csv(records, path, cluster=cluster)
    return path.read_bytes()


@pytest.mark.parametrize("method,knobs", [
    ("sglang", {}), ("prism", {}), ("prism", {"qas": {"window_s": 0.03}}), ("klpm", {}), ("fcfs+dart", {}),
    # the backlog front end holds the run's concurrency limit on one instance, behind its router too
    ("prism", {"engine": {"max_total_tokens": 20000, "max_concurrency": 12}}),
    ("prism", {"engine": {"max_total_tokens": 20000, "max_concurrency": 12}, "qas": {"front_end": "arrivals"}}),
])
@pytest.mark.parametrize("router", ["lmetric", "cache_aware"])
def test_cluster_of_one_is_the_single_engine(tmp_path, method, knobs, router):
    data = {"method": method, "engine": {"max_total_tokens": 20000}, "trace": {"num_requests": 300, "qps": 45},
            **knobs}
    single = settings_from(data).resolve("zipf")
    one = dataclasses.replace(single, cluster=ClusterConfig(instances=1, router=router))
    a, b = simulate(single, served_reference=True), simulate_cluster(one, served_reference=True)
    assert _csv(tmp_path, "single", a.records) == _csv(tmp_path, "cluster", b.records)
    sa, sb = dict(a.summary), dict(b.summary)
    sa.pop("wall_s"), sb.pop("wall_s")
    assert sb.pop("cluster", None) is None
    sb["counters"] = {k: v for k, v in sb["counters"].items() if not k.startswith("route_")}  # the router's own
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)


def _spec(instances, router, method="prism", **cluster):
    data = {"method": method, "engine": {"max_total_tokens": 20000}, "trace": {"num_requests": 400, "qps": 120},
            "cluster": {"instances": instances, "router": router, **cluster}}
    return settings_from(data).resolve("zipf")


@pytest.mark.parametrize("router", ["rr", "least_load", "cache_aware", "lmetric"])
def test_every_request_served_once_on_its_instance(router):
    spec = _spec(3, router)
    res = simulate(spec)
    assert sorted(r.id for r in res.records) == list(range(400))
    per = res.summary["cluster"]["per_instance"]
    assert sum(p["requests"] for p in per) == 400 and {r.instance for r in res.records} <= {0, 1, 2}
    assert sum(p["hit_tokens"] for p in per) == res.summary["hit_tokens"]
    assert res.summary["cluster"]["imbalance"] >= 1.0
    assert all(r.first_token >= r.prefill_end >= r.prefill_start >= r.sent >= r.arrival for r in res.records)
    if router == "rr":  # request k on instance k mod 3
        assert all(r.instance == r.id % 3 for r in res.records)
    again = simulate(spec)  # deterministic
    assert [dataclasses.astuple(r) for r in sorted(res.records, key=lambda r: r.id)] == \
        [dataclasses.astuple(r) for r in sorted(again.records, key=lambda r: r.id)]


@pytest.mark.parametrize("router", ["rr", "least_load", "cache_aware", "lmetric"])
def test_a_routed_run_makes_no_cyclic_garbage(router):
    """As a single engine's (tests/test_engine.py): the router's rounds leave no cycle for the paused collector."""
    assert cyclic_garbage_during(_spec(3, router)) == []


def test_router_delay_adds_to_every_wait():
    """A serial router with delay d: request k reaches its instance at max(arrival, previous dispatch) + d
    (an engine that takes requests as they come: no front end's window after the router)."""
    spec = _spec(2, "rr", "sglang", router_delay_s=0.004)
    res = simulate(spec)
    prev = float("-inf")
    for r in sorted(res.records, key=lambda r: (r.arrival, r.id)):
        expect = max(r.arrival, prev) + 0.004
        assert r.sent == pytest.approx(expect, abs=1e-9)
        prev = r.sent


def test_stale_view_is_not_refreshed_within_its_interval():
    """Least-load on a view refreshed every 1000 s sees the initial, empty load for every request of the run
    (it lasts a few seconds), so every decision is a tie and ties rotate like round robin; an exact view
    follows the real queues."""
    spec = _spec(4, "least_load", view_interval_s=1000.0)
    res = simulate(spec)
    assert all(r.instance == r.id % 4 for r in res.records)  # every tie rotates: never a fresh view
    exact = simulate(_spec(4, "least_load"))
    assert any(r.instance != r.id % 4 for r in exact.records)


def test_heterogeneous_profiles_run_each_instance_on_its_own():
    spec = _spec(2, "rr", profiles=["h200-141g:qwen3-4b-instruct-2507", "a800-80g:qwen3-4b-instruct-2507"])
    res = simulate(spec)
    fast, slow = res.summary["cluster"]["per_instance"]
    assert fast["profile"].startswith("h200") and slow["profile"].startswith("a800")
    assert fast["ttft_p50_s"] < slow["ttft_p50_s"]  # same traffic (round robin), faster GPU


def test_lmetric_guard_bounds_a_hot_instance_end_to_end():
    """Every request shares a long prefix and has a 1-token private suffix and a long decode; the first one
    warms instance 0 alone. From then on instance 0's P is about 0 and pure LMetric keeps sending it everything;
    the guard bounds it (and the instance it then picks caches the prefix too: the hot prefix is replicated)."""
    n = 240
    tr = make_trace([(0.0 if i == 0 else 1.0 + 0.002 * i, [(SYS, "s", 2000), (PRIV, f"p{i}", 1)], 200)
                     for i in range(n)])
    tr.spec["qps"] = 500.0

    def run(guard):
        knobs = {"lmetric": {"guard": guard}}
        spec = RunSpec.build(tr, "lpm", "lru", engine=EngineConfig(max_total_tokens=200_000))
        cluster = {"instances": 4, "router": "lmetric"}
        spec = dataclasses.replace(spec, cluster=ClusterConfig(**cluster),
                                   router_configs=settings_from({"cluster": cluster, **knobs}).router_configs)
        return simulate(spec).summary

    pure, guarded = run(False), run(True)
    assert pure["cluster"]["per_instance"][0]["share"] > 0.9  # the hot instance takes nearly everything
    assert guarded["cluster"]["imbalance"] < pure["cluster"]["imbalance"]
    assert max(p["share"] for p in guarded["cluster"]["per_instance"]) < 0.6
    assert guarded["counters"]["route_hot_exclusions"] > 0


def test_cli_cluster_run_and_columns(tmp_path, capsys):
    out = tmp_path / "c"
    assert sim_main(["--trace", "zipf", "--set", "trace.num_requests=200", "--instances", "3", "--router", "lmetric",
                     "--set", "lmetric.hot_streak=2", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "imbalance" in text and "instance" in text
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == 200 and {r["instance"] for r in rows} <= {"0", "1", "2"}
    s = json.loads((out / "summary.json").read_text())
    assert s["cluster"]["router"] == "lmetric" and len(s["cluster"]["per_instance"]) == 3
    single = tmp_path / "s"
    assert sim_main(["--trace", "zipf", "--set", "trace.num_requests=200", "--out", str(single),
                     "--no-progress"]) == 0
    assert "instance" not in (single / "requests.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("argv,needle", [
    (["--instances", "0"], "instances"),
    (["--router", "nope", "--instances", "2"], "router"),
    (["--instances", "2", "--router", "rr", "--set", "lmetric.hot_streak=2"], "lmetric"),
    (["--instances", "2", "--set", "cluster.profiles=[a800-80g:qwen3-4b-instruct-2507]"], "profiles"),
    (["--instances", "2", "--set", "cluster.router_delay_s=-1"], "router_delay_s"),
])
def test_bad_cluster_input_is_one_line(argv, needle, capsys):
    assert sim_main(["--trace", "zipf", "--set", "trace.num_requests=50", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def _sweep_argv(out, *extra):
    return ["sweep", "--trace", "zipf", "--methods", "sglang,prism", "--qps", "40", "--set",
            "trace.num_requests=100", "--instances", "1,2", "--routers", "lmetric,cache_aware", "--no-progress",
            "--out", str(out), *extra]


def _runs(out):
    """Every run folder's requests.csv and summary (wall time and the sweep's digest aside)."""
    got = {}
    for folder in sorted((out / "runs").glob("*/*")):
        s = json.loads((folder / "summary.json").read_text())
        s.pop("wall_s")
        got[str(folder.relative_to(out))] = ((folder / "requests.csv").read_bytes(), s)
    return got


def test_cluster_sweep_has_a_series_per_router(tmp_path, capsys):
    out = tmp_path / "sw"
    assert sim_main(_sweep_argv(out, "--workers", "2")) == 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert sorted(r["series"] for r in rows) == sorted(
        ["sglang", "prism", "sglang@lmetricx2", "sglang@cache_awarex2", "prism@lmetricx2", "prism@cache_awarex2"])
    for r in rows:
        assert (r["imbalance"] == "") == (r["instances"] == "1")
        assert (r["belady_hit_rate"] == "") == (r["instances"] == "2")  # no Belady reference on a cluster
    assert (out / "imbalance_vs_qps.png").stat().st_size > 1000
    head = (out / "runs" / "prism@lmetricx2" / "qps40-seed0" / "requests.csv").read_text().splitlines()[0]
    assert head.endswith(",instance")
    assert sim_main(_sweep_argv(out, "--workers", "1")) == 0  # a rerun finds every run finished
    assert "12 runs" not in capsys.readouterr().out


def test_ray_sweep_without_ray_writes_nothing(tmp_path, capsys):
    """A sweep asked to run on Ray where Ray is not installed stops with one line before it writes anything
    (it had left a sweep.json that refused the next sweep into the folder)."""
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here")
    out = tmp_path / "sw"
    assert sim_main(_sweep_argv(out, "--ray", "auto")) == 2
    assert "--ray needs Ray, which is not installed" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.ray
def test_ray_sweep_equals_the_process_pool(tmp_path, monkeypatch):
    """``--ray local`` starts a private instance even where Ray would find another cluster's address (here
    RAY_ADDRESS names a port nothing listens on, as a ``ray start`` that died leaves its address file): it
    had joined that address, and ray.init retried it for minutes."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{_closed_port()}")
    pool, on_ray = tmp_path / "pool", tmp_path / "ray"
    assert sim_main(_sweep_argv(pool, "--workers", "2")) == 0
    assert sim_main(_sweep_argv(on_ray, "--ray", "local")) == 0
    a, b = _runs(pool), _runs(on_ray)
    assert len(a) == 6 and a == b


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_is_probed_before_ray_init():
    """An address that refuses connections, cannot be resolved or is no address is one line at once; ray.init
    would retry it for minutes. A listening port passes (any TCP server: the probe only connects)."""
    from prism.errors import UserError
    from prism.sim.ray_sweep import check_reachable

    port = _closed_port()
    for target, said in [(f"127.0.0.1:{port}", f"cannot reach a Ray cluster at 127.0.0.1:{port}: "),
                         (f"ray://127.0.0.1:{port}", f"cannot reach a Ray cluster at 127.0.0.1:{port}: "),
                         ("garbage", "expected auto, local, HOST:PORT or ray://HOST:PORT, got 'garbage'"),
                         ("host:notaport", "expected auto, local, HOST:PORT or ray://HOST:PORT")]:
        with pytest.raises(UserError) as e:
            check_reachable(target, "X", timeout_s=2.0)
        assert said in str(e.value) and e.value.where == "--ray X", (target, str(e.value))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", "X")
        check_reachable(f"ray://127.0.0.1:{server.getsockname()[1]}", "X")
    check_reachable(None, "local")  # nothing to probe: Ray starts its own instance
    with pytest.raises(UserError, match=r"^--ray auto: expected .*, got 'garbage' \(found by Ray: RAY_ADDRESS"):
        check_reachable("garbage", "auto")  # what auto found, not what the user typed


@pytest.mark.ray
def test_ray_sweep_to_an_unreachable_cluster_writes_nothing(tmp_path, capsys):
    pytest.importorskip("ray")
    out = tmp_path / "sw"
    assert sim_main(_sweep_argv(out, "--ray", f"127.0.0.1:{_closed_port()}")) == 2
    err = capsys.readouterr().err
    assert "cannot reach a Ray cluster at 127.0.0.1:" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.ray
def test_a_run_failing_on_ray_is_one_line_unless_it_is_a_bug():
    """What a sweep on Ray stops with when a run fails there: the run's own one-line error; a node that cannot
    load the task (prism missing: seen on a cluster started from a venv without it) or that died, one line
    with the cause; any other exception (a bug) unchanged, with its traceback."""
    ray = pytest.importorskip("ray")
    from prism.errors import UserError
    from prism.sim.ray_sweep import _failed_on_ray

    def failed(cause):
        return ray.exceptions.RayTaskError("simulate_task", "Traceback ...", cause)

    own = _failed_on_ray(ray, failed(UserError("no such file", "trace t.yaml")), "auto")
    assert isinstance(own, UserError) and str(own) == "trace t.yaml: no such file"
    missing = _failed_on_ray(ray, failed(ray.exceptions.RaySystemError("System error: No module named 'prism'\n"
                                                                        "traceback: ...\nModuleNotFoundError: "
                                                                        "No module named 'prism'")), "auto")
    assert str(missing) == ("--ray auto: a run failed on the Ray cluster: ModuleNotFoundError: No module named "
                            "'prism'; every node needs the same prism installed (pip install -e \".[ray]\")")
    died = _failed_on_ray(ray, ray.exceptions.WorkerCrashedError(), "ray://h:10001")
    assert isinstance(died, UserError) and str(died).startswith("--ray ray://h:10001: a run failed on the Ray "
                                                                "cluster: ")
    assert "\n" not in str(died) and "prism installed" not in str(died)
    bug = failed(ZeroDivisionError("division by zero"))
    assert _failed_on_ray(ray, bug, "auto") is bug
