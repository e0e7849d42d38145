"""Several models sharing GPUs (``sim/fleet.py``): the single engine's equivalence, hand-computed activations
and balloon shrinks, invariants over random fleets (hypothesis), SLO attainment by its definition."""

from __future__ import annotations

import dataclasses
import io
import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.calibration import profiles
from prism.calibration.loading import PAGE_BYTES, LoadingConfig, activation_seconds
from prism.core import PRIV, SYS, Request, SegmentTable
from prism.metrics import write_requests_csv
from prism.policies.registry import METHODS, SHARING
from prism.policies.sharing import ACTIVE, DRAINING
from prism.settings import EngineConfig, FleetConfig, RunSpec, _fleet_spec, merge_flags, settings_from
from prism.sim.events import EngineEvents
from prism.sim.run import simulate
from prism.traces.spec import load_trace
from prism.traces.trace import Trace

GPU = "h100-sxm-80g"


def fleet_run(trace: Trace, sharing: str, gpus: int, method: str = "sglang", **fleet) -> RunSpec:
    """A RunSpec of ``trace`` on a fleet (its models from ``trace.meta``)."""
    from prism.policies.registry import resolve_method

    label, s, e = resolve_method(method)
    spec = RunSpec.build(trace, s, e, profile=f"{GPU}:llama-3.1-8b", label=label)
    return _fleet_spec(spec, FleetConfig(gpus=gpus, gpu=GPU, sharing=sharing, **fleet), {})


def multi_trace(specs, models) -> Trace:
    """specs: (arrival, model, prompt tokens, output tokens); models: (name, profile[, tp]) in order."""
    table = SegmentTable()
    reqs = [Request(i, t, (table.segment(f"{m}/sys", SYS, 16), table.segment(f"{m}/q{i}", PRIV, p)), out, model=m)
            for i, (t, m, p, out) in enumerate(specs)]
    meta = {"models": [{"name": n, "profile": p, "tp": tp[0] if tp else 1, "ttft_slo_s": 10.0, "tpot_slo_s": 1.0}
                       for n, p, *tp in models]}
    return Trace(reqs, table, "multi_model", {"qps": None, "seed": 0}, meta)


def csv_bytes(records, **kw) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        write_requests_csv(records, Path(d) / "r.csv", **kw)
        return (Path(d) / "r.csv").read_bytes()


# ---------------------------------------------------------------------------------------------- the single engine
@pytest.mark.parametrize("method", list(METHODS))
def test_one_model_on_a_dedicated_gpu_is_the_single_engine(method):
    """A single-model trace on the dedicated scheme's one GPU: the same requests.csv, byte for byte."""
    from prism.policies.registry import resolve_method

    trace = load_trace("zipf", {"num_requests": 300, "qps": 70})
    label, s, e = resolve_method(method)
    single = RunSpec.build(trace, s, e, profile=f"{GPU}:qwen3-4b-instruct-2507", label=label,
                           engine=EngineConfig(max_total_tokens=32768))
    fleet = _fleet_spec(single, FleetConfig(sharing="dedicated", gpu=GPU), {})
    assert fleet.fleet.gpus == 1 and fleet.served_models[0].profile == "qwen3-4b-instruct-2507"
    a, b = simulate(single), simulate(fleet)
    assert a.records == b.records
    assert csv_bytes(a.records) == csv_bytes(b.records)
    assert b.summary["fleet"]["per_model"]["model"]["requests"] == 300


# ---------------------------------------------------------------------------------------------- models apart
def _together_and_apart(spec: RunSpec):
    """The run on one clock and with each model on its own (``Fleet.parts``): requests.csv, the summary without its
    wall time (as JSON: a model without requests has NaN percentiles), counters and memory samples of each."""
    import json

    from prism.sim.fleet import Fleet

    out = []
    for apart in (False, True):
        Fleet.run_apart = apart
        try:
            res = simulate(spec)
        finally:
            Fleet.run_apart = True
        summary = json.dumps({k: v for k, v in res.summary.items() if k != "wall_s"}, sort_keys=True)
        out.append((csv_bytes(sorted(res.records, key=lambda r: r.id), fleet=True), summary, res.counters,
                    res.memory))
    return out


def _parts(spec: RunSpec) -> int:
    from prism.sim.fleet import Fleet, with_slos
    from prism.sim.run import Replay

    spec = with_slos(spec)
    return len(Fleet(spec, Replay(spec, False, None, False)).parts())


@st.composite
def apart_fleets(draw):
    """Dedicated fleets: 1-4 models, two of them on 2 GPUs where drawn, up to 2 GPUs no model uses, arrivals
    that fall together and on the memory samples' times."""
    tp = 2 if draw(st.booleans()) else 1
    models = [("m0", "llama-3.2-1b"), ("m1", "qwen2.5-0.5b", tp), ("m2", "llama-3.2-3b"), ("m3", "qwen2.5-1.5b", tp)]
    m = draw(st.integers(1, 4))
    t, specs = 0.0, []
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 3.0, 20.0]))
        specs.append((t, models[draw(st.integers(0, m - 1))][0], draw(st.integers(1, 3000)),
                      draw(st.integers(1, 200))))
    used = models[:m]
    gpus = sum(x[2] if len(x) > 2 else 1 for x in used) + draw(st.integers(0, 2))
    return fleet_run(multi_trace(specs, used), "dedicated", gpus, draw(st.sampled_from(["sglang", "fcfs", "prism"])),
                     sample_s=draw(st.sampled_from([0.5, 1.0, 7.0])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=apart_fleets())
def test_a_fleet_of_models_apart_runs_each_on_its_own_clock_as_on_one(spec):
    """Dedicated GPUs share nothing: each model's part of the fleet on a clock of its own gives the run on one
    clock, every record, summary figure, counter and memory sample alike (GPUs no model uses included)."""
    assert _parts(spec) == len(spec.served_models) + (spec.fleet.gpus > sum(m.tp for m in spec.served_models))
    together, apart = _together_and_apart(spec)
    assert apart == together


def test_the_multimodel_trace_on_dedicated_gpus_runs_apart_as_on_one_clock():
    """The built-in multi-model trace (its models' own profiles, ON/OFF arrivals, realistic costs)."""
    spec = settings_from({"fleet": {"sharing": "dedicated"}, "trace": {"num_requests": 400}}, "t").resolve("multimodel")
    assert _parts(spec) > 1
    together, apart = _together_and_apart(spec)
    assert apart == together and apart[0].count(b"\n") == 401 and apart[3]


@pytest.mark.parametrize("model", [None, "m9"])
def test_a_request_for_no_model_of_the_fleet_is_refused_before_the_run(model):
    """A request whose model the trace does not serve (none named in a multi-model trace, or another) is refused
    with the request and the models; it used to fail mid-run (a KeyError on one clock) or, with the models run
    apart, never to be sent (a run waiting for it for ever)."""
    from prism.errors import UserError

    specs = [(0.1 * i, f"m{i % 2}", 500, 20) for i in range(6)]
    specs[3] = (0.3, model, 500, 20)
    trace = multi_trace(specs, [("m0", "llama-3.2-1b"), ("m1", "qwen2.5-0.5b")])
    with pytest.raises(UserError, match=rf"request 3 is for {'no model' if model is None else repr(model)}; the "
                                        r"trace serves 'm0', 'm1'"):
        fleet_run(trace, "dedicated", 2)


def test_models_held_together_by_a_client_limit_or_an_observer_share_one_clock():
    """A client limit makes one model's requests wait for another's to finish, and an observer sees every engine
    in time order: such a fleet runs on one clock."""
    from prism.sim.fleet import Fleet, with_slos
    from prism.sim.run import Replay

    trace = multi_trace([(0.1 * i, f"m{i % 2}", 500, 20) for i in range(20)],
                        [("m0", "llama-3.2-1b"), ("m1", "qwen2.5-0.5b")])
    spec = fleet_run(trace, "dedicated", 2)
    assert _parts(spec) == 2
    limited = dataclasses.replace(spec, engine=EngineConfig(max_concurrency=3))
    assert _parts(limited) == 0
    assert len(simulate(limited).records) == 20

    class Counting(EngineEvents):
        iterations = 0

        def decode_started(self, eng, n) -> None:
            Counting.iterations += 1

    assert len(simulate(spec, events=Counting()).records) == 20 and Counting.iterations > 0


def test_a_scheme_that_keeps_its_models_apart_has_no_ticks(monkeypatch):
    """Each part of such a fleet holds one model: a tick there could not move it, so a scheme that says its
    models stay apart and ticks is a contradiction, refused rather than run with its ticks split among the parts."""
    from prism.policies.sharing_dedicated import Dedicated

    class Ticking(Dedicated):
        interval_s = 5.0

    monkeypatch.setattr("prism.sim.fleet.make_sharing", lambda name, configs: Ticking())
    trace = multi_trace([(0.0, "a", 100, 4)], [("a", "llama-3.2-1b")])
    with pytest.raises(ValueError, match="keeps its models apart: it has no ticks"):
        simulate(fleet_run(trace, "dedicated", 1))


def test_an_interrupted_fleet_of_models_apart_keeps_what_finished(monkeypatch):
    """Ctrl-C while the parts run: the records that finished and the memory samples up to where every part got,
    the summary marked incomplete."""
    from prism.sim import fleet as fleet_mod
    from prism.sim.run import SimInterrupted

    trace = multi_trace([(0.5 * i, f"m{i % 3}", 800, 40) for i in range(60)],
                        [("m0", "llama-3.2-1b"), ("m1", "qwen2.5-0.5b"), ("m2", "llama-3.2-3b")])
    spec = fleet_run(trace, "dedicated", 3)
    taken = []
    original = fleet_mod.Replay.take

    def take(self, record):
        original(self, record)
        if self.client is None:  # the whole run's (its parts' have clients)
            taken.append(record)
            if len(taken) == 25:
                raise KeyboardInterrupt

    monkeypatch.setattr(fleet_mod.Replay, "take", take)
    with pytest.raises(SimInterrupted) as e:
        simulate(spec)
    res = e.value.result
    assert len(res.records) == 25 and res.summary["complete"] is False
    times = [t for t, *_ in res.memory]
    assert times and times == sorted(times)
    assert set(Counter(times).values()) == {3}  # every GPU at every time kept: one cut for all parts


# ---------------------------------------------------------------------------------------------- hand-computed cases
def test_a_swapped_in_model_serves_after_exactly_its_activation():
    """Time sharing on one GPU: model b's request arrives while a (the more demanded, active from the start) is
    idle; a is evicted and b loaded from the engine pool over one PCIe link: its prefill starts exactly the
    activation's time after its arrival."""
    trace = multi_trace([(0.0, "a", 100, 4), (5.0, "b", 100, 4)], [("a", "llama-3.1-8b"), ("b", "qwen2.5-7b")])
    res = simulate(fleet_run(trace, "timeshare", 1))
    gpu, model = profiles.gpu(GPU), profiles.model("qwen2.5-7b")
    load = activation_seconds(model, gpu, 1, LoadingConfig(parallel_links=1))
    assert load == pytest.approx(model.params * 2 / gpu.pcie_bandwidth)  # 15 GB over a 50 GB/s link: 0.30 s
    b = next(r for r in res.records if r.model == "b")
    assert b.prefill_start - b.arrival == pytest.approx(load, rel=1e-12)
    f = res.summary["fleet"]
    assert (f["activations"], f["evictions"]) == (1, 1) and f["bytes_moved"] == model.weight_bytes()


def test_a_cold_start_adds_the_engine_start():
    trace = multi_trace([(0.0, "a", 100, 4), (5.0, "b", 100, 4)], [("a", "llama-3.1-8b"), ("b", "qwen2.5-7b")])
    spec = fleet_run(trace, "timeshare", 1, cold_start_s=12.5)
    from dataclasses import replace

    spec = replace(spec, sharing_configs={"timeshare": type(spec.sharing_configs["timeshare"])(cold_start=True)})
    b = next(r for r in simulate(spec).records if r.model == "b")
    load = profiles.model("qwen2.5-7b").params * 2 / profiles.gpu(GPU).pcie_bandwidth
    assert b.prefill_start - b.arrival == pytest.approx(12.5 + load, rel=1e-12)


def test_a_balloon_shrink_waits_for_the_running_requests_to_free_their_pages():
    """Prism on two GPUs, each so small that models a and x (one per GPU, placed at start) running six requests
    each leave no room for the weights of b (tensor parallel over both, placed at its first request): b's
    activation squeezes a and x and waits until their requests have finished (their KV freed), then loads, and
    its engine runs on both GPUs."""
    specs = [(0.0, m, 3000, 400) for m in ("a", "x") for _ in range(6)] + [(0.5, "b", 100, 4)]
    trace = multi_trace(specs, [("a", "llama-3.2-1b"), ("x", "llama-3.2-1b"), ("b", "qwen2.5-0.5b", 2)])
    gpu, small, big = profiles.gpu(GPU), profiles.model("llama-3.2-1b"), profiles.model("qwen2.5-0.5b")
    six = 6 * 3400 * small.kv_bytes_per_token()
    room = small.weight_bytes() + big.weight_bytes() / 2 + 0.5e9  # six requests' KV or b's shard, not both
    assert six < room - small.weight_bytes() and six + big.weight_bytes() / 2 > room - small.weight_bytes()
    res = simulate(fleet_run(trace, "prism", 2, utilization=room / gpu.memory_bytes))
    others = [r for r in res.records if r.model != "b"]
    b = next(r for r in res.records if r.model == "b")
    assert {r.gpu for r in others if r.model == "a"} != {r.gpu for r in others if r.model == "x"}
    assert all(r.prefill_start < 0.5 for r in others)  # running when b arrived
    assert b.gpu == "0+1" and b.prefill_start >= max(r.finish for r in others)
    load = activation_seconds(big, gpu, 2, LoadingConfig(parallel_links=8))
    assert b.prefill_start - max(r.finish for r in others) <= load + 0.05
    assert res.summary["fleet"]["activations"] == 1 and res.summary["fleet"]["evictions"] == 0


def test_a_fleet_that_cannot_make_room_is_an_error_not_a_hang(monkeypatch):
    """A scheme that never activates a model: its requests wait with nothing running; the run stops with a
    clear error after STALL_S simulated seconds instead of sampling memory forever."""
    from prism.errors import UserError
    from prism.policies.sharing_timeshare import TimeShare

    class Never(TimeShare):
        def wake(self, fleet, model):
            return []

        def idle(self, fleet, model):
            return []

    monkeypatch.setattr("prism.sim.fleet.make_sharing", lambda name, configs: Never(configs.get("timeshare")))
    trace = multi_trace([(0.0, "a", 100, 4), (5.0, "b", 100, 4)], [("a", "llama-3.1-8b"), ("b", "qwen2.5-7b")])
    with pytest.raises(UserError, match=r"stalled at t=36\d\d s: requests of b \(1\) wait"):
        simulate(fleet_run(trace, "timeshare", 1))


def test_a_compute_slot_serves_waiters_by_priority_then_arrival_with_each_waiters_one_event():
    """Three engines share a GPU's compute, each iteration taking the slot (priority: lower first, then first come)
    and letting it go. Each waits on its one event again and again: the same turns, at the same times, as with a
    new event for every wait."""
    import simpy

    from prism.sim.fleet_gpu import ComputeSlot

    def turns(fresh: bool):
        env = simpy.Environment()
        slot, log = ComputeSlot(env), []

        def engine(name, priority, start, iterations, d):
            own = env.event()
            yield env.timeout(start)
            for _ in range(iterations):
                wait = slot.take(name, priority, env.event() if fresh else own)
                if wait is not None:
                    yield wait
                log.append((name, env.now))
                yield env.timeout(d)
                slot.give(name)

        for args in (("a", 2.0, 0.0, 3, 1.0), ("b", 1.0, 0.5, 3, 0.5), ("c", 2.0, 0.25, 2, 0.25)):
            env.process(engine(*args))
        env.run()
        return log

    # a holds it first; b (the lower priority number) goes before c (waiting longer) each time the slot frees
    expected = [("a", 0.0), ("b", 1.0), ("c", 1.5), ("b", 1.75), ("a", 2.25), ("b", 3.25), ("c", 3.75),
                ("a", 4.0)]
    assert turns(fresh=False) == turns(fresh=True) == expected
    env = simpy.Environment()
    slot, own = ComputeSlot(env), env.event()
    slot.take("a", 0.0, env.event())

    def waiting():
        yield slot.take("b", 0.0, own)

    env.process(waiting())
    env.step()  # b waits on its event
    with pytest.raises(RuntimeError, match="while it waits"):
        slot.take("b", 0.0, own)  # its one event, asked for again meanwhile


# ---------------------------------------------------------------------------------------------- invariants
class FleetAudit(EngineEvents):
    """At every iteration of every engine: its copy is active or draining, every resident model's weights are
    on its GPUs, no GPU maps more pages than it has, and each GPU's memory sample is its pages: the weights its
    models' weight pages, the free bytes its free pages, and the KV of its engines (running and cached) within
    what it maps besides weights, the rest unused."""

    def __init__(self) -> None:
        self.fleet = None
        self.iterations = 0
        self.by_engine: dict[int, object] = {}

    def attached_fleet(self, fleet) -> None:
        self.fleet = fleet

    def _check(self, eng) -> None:
        copy = next(c for m in self.fleet.models.values() for c in m.copies if c.engine is eng)
        assert copy.state in (ACTIVE, DRAINING), "an inactive model served a request"
        for g in copy.gpus:
            assert copy.model.name in g.memory, "an active model's weights are not resident"
        for g in self.fleet.gpus:
            assert g.memory.used_pages <= g.memory.total_pages
            assert g.memory.used_pages == sum(
                g.memory.weight_pages(n) + g.memory.kv_pages(n) + g.memory.buffer_pages(n) for n in g.memory.models)
            t, index, weights, live, cached, unused, free = g.sample(self.fleet.env.now)
            assert index == g.index and weights == sum(g.memory.weight_pages(n) for n in g.memory.models) * PAGE_BYTES
            assert free == g.memory.free_pages * PAGE_BYTES and live >= 0 and cached >= 0
            mapped_kv = (g.memory.total_pages - g.memory.free_pages) * PAGE_BYTES - weights
            assert live + cached <= mapped_kv * (1 + 1e-12)
            assert unused == pytest.approx(mapped_kv - live - cached, abs=1e-3 * PAGE_BYTES)
            if copy.model.elastic and g in copy.gpus:  # the engine's KV fits what its pool maps for it
                looks = [p.balloon(copy.model.name) for p in copy._pools]  # the balloon it keeps is the pools'
                assert copy._balloon() == (max(e for e, _ in looks), min(r for _, r in looks))
                assert g.memory.used_tokens(copy.model.name)[0] + g.memory.used_tokens(copy.model.name)[1] <= \
                    copy.model.layout.tokens(g.memory.kv_pages(copy.model.name) // copy.model.layout.pages_per_block)
        self.iterations += 1

    def prefill_started(self, eng, batch) -> None:
        self._check(eng)

    def decode_started(self, eng, n) -> None:
        self._check(eng)


@st.composite
def fleets(draw):
    models = [("m0", "llama-3.2-1b"), ("m1", "qwen2.5-0.5b"), ("m2", "llama-3.2-3b"), ("m3", "qwen2.5-1.5b")]
    m = draw(st.integers(1, 4))
    n = draw(st.integers(3, 40))
    t, specs = 0.0, []
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 3.0, 20.0]))
        specs.append((t, models[draw(st.integers(0, m - 1))][0], draw(st.integers(1, 3000)),
                      draw(st.integers(1, 200))))
    trace = multi_trace(specs, models[:m])
    sharing = draw(st.sampled_from(sorted(SHARING)))
    gpus = m if sharing == "dedicated" else draw(st.integers(1, 3))
    utilization = draw(st.sampled_from([0.95, 0.2, 0.12]))
    compute = draw(st.sampled_from(["serial", "parallel"]))
    return fleet_run(trace, sharing, gpus, draw(st.sampled_from(["sglang", "fcfs", "prism"])),
                     utilization=utilization, compute=compute)


class RateAudit(EngineEvents):
    """Keeps its own log of what each model adds to its KV, from the engines' events: a request's uncached prompt
    tokens when admitted, a token for each request a prefill completes and for each one a decode step runs; at
    every iteration, each model's token rate is that log's tokens in the last window (DESIGN §9)."""

    def __init__(self) -> None:
        self.fleet = None
        self.log: dict[str, list[tuple[float, int]]] = {}
        self.checks = 0

    def attached_fleet(self, fleet) -> None:
        self.fleet = fleet

    def _model(self, eng):
        return next(m for m in self.fleet.models.values() for c in m.copies if c.engine is eng)

    def _add(self, eng, tokens: int) -> None:
        self.log.setdefault(self._model(eng).name, []).append((self.fleet.now, tokens))

    def admitted(self, eng, seq, hit) -> None:
        self._add(eng, seq.fill_len - hit)

    def prefill_ended(self, eng, batch) -> None:
        self._add(eng, sum(1 for seq, _, _ in batch if seq.kv_len >= seq.fill_len))

    def decode_ended(self, eng, n) -> None:
        self._add(eng, n)

    def _check(self, eng) -> None:
        now, window = self.fleet.now, self.fleet.spec.fleet.rate_window_s
        for m in self.fleet.models.values():
            tokens = sum(n for t, n in self.log.get(m.name, ()) if t > now - window)
            assert m.token_rate == pytest.approx(tokens / window, rel=1e-9, abs=1e-12), m.name
        self.checks += 1

    def prefill_started(self, eng, batch) -> None:
        self._check(eng)

    def decode_started(self, eng, n) -> None:
        self._check(eng)


def test_a_models_token_rate_counts_its_decode_tokens_as_they_are_made():
    """Long outputs: the decode tokens of a running request count from the step that makes them, not from its
    finish (which once added them all at once, and nothing while it ran)."""
    specs = [(0.5 * i, m, 400, 1500) for i in range(6) for m in ("a", "b")]
    trace = multi_trace(specs, [("a", "llama-3.2-1b"), ("b", "qwen2.5-0.5b")])
    audit = RateAudit()
    res = simulate(fleet_run(trace, "prism", 1, rate_window_s=5.0), events=audit)
    assert len(res.records) == 12 and audit.checks > 1000


def test_a_scheme_that_reads_token_rates_must_say_so(monkeypatch):
    """The fleet counts each iteration's tokens only for a scheme that reads the rates (measures_rates): one that
    reads them without saying so is told, never handed a rate of zero."""
    from prism.policies.sharing_timeshare import TimeShare

    class Reads(TimeShare):
        def start(self, fleet):
            [m.token_rate for m in fleet.models.values()]
            return super().start(fleet)

    monkeypatch.setattr("prism.sim.fleet.make_sharing", lambda name, configs: Reads(configs.get("timeshare")))
    trace = multi_trace([(0.0, "a", 100, 4)], [("a", "llama-3.1-8b")])
    with pytest.raises(RuntimeError, match="reads token rates: it must say so"):
        simulate(fleet_run(trace, "timeshare", 1))
    Reads.measures_rates = True
    assert len(simulate(fleet_run(trace, "timeshare", 1)).records) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=fleets())
def test_fleet_invariants(spec):
    """Every request finishes once; an engine serves only while its copy is active or draining, with its model's
    weights resident; no GPU maps more pages than it has; TTFT parts add up."""
    from prism.policies.sharing_static import FleetTooSmall

    audit = FleetAudit()
    try:
        res = simulate(spec, events=audit)
    except FleetTooSmall:
        return  # the scheme cannot place every model on this fleet: refused, not run
    assert sorted(r.id for r in res.records) == [r.id for r in spec.trace.requests]
    assert audit.iterations > 0
    for r in res.records:
        assert r.arrival <= r.prefill_start <= r.prefill_end <= r.first_token <= r.finish
        assert r.model is not None and r.gpu is not None
    f = res.summary["fleet"]
    assert 0 <= f["attainment"] <= min(f["attainment_ttft"], f["attainment_tpot"]) <= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=fleets(), sample_s=st.sampled_from([0.5, 1.0, 7.0]))
def test_memory_samples_of_a_quiet_stretch_taken_at_once_are_those_taken_in_turn(spec, sample_s):
    """The sampler takes the samples due before the run's next event at once (``Fleet._sampler``): the same samples,
    records and summary as a sampler that wakes for each (the run's next event said to be due now), under every
    scheme; arrivals fall on the samples' times."""
    import json

    import simpy

    from prism.policies.sharing_static import FleetTooSmall

    spec = dataclasses.replace(spec, fleet=dataclasses.replace(spec.fleet, sample_s=sample_s))
    out = []
    for each in (False, True):
        peek = simpy.Environment.peek
        if each:
            simpy.Environment.peek = lambda env: env.now
        try:
            res = simulate(spec)
        except FleetTooSmall:
            return
        finally:
            simpy.Environment.peek = peek
        summary = json.dumps({k: v for k, v in res.summary.items() if k != "wall_s"}, sort_keys=True)
        out.append((csv_bytes(sorted(res.records, key=lambda r: r.id), fleet=True), summary, res.memory))
    assert out[0] == out[1]


#: fleets the invariants above once failed on (found by a longer search of the same space, and of one whose
#: second and fourth models run on 2 GPUs: ``TP``), each with what was wrong: (sharing, GPUs,
#: fleet.utilization, compute, method, models, [(arrival, model, prompt, output)], tensor parallel)
TP = True
FOUND = [
    # static: shares of what the weights leave, with no room for every model's floor: a pool past the GPU
    ("static", 3, 0.95, "serial", "prism", 4,
     [(0.5, 0, 2454, 139), (0.5, 0, 791, 94), (0.51, 0, 191, 106), (1.01, 1, 1766, 54), (21.01, 2, 2345, 122)]),
    # a model's load squeezes the others and waits: the squeeze itself freed the pages (the wait missed it)
    ("prism", 1, 0.12, "parallel", "fcfs", 4,
     [(0.01, 3, 1167, 56), (0.11, 1, 1489, 36), (0.12, 1, 2498, 15), (20.12, 0, 1392, 39), (20.12, 0, 1906, 139),
      (20.12, 2, 1817, 41), (20.22, 1, 2837, 17), (20.32, 2, 1987, 114), (20.42, 1, 750, 149), (23.42, 0, 2730, 94),
      (26.42, 0, 2428, 144), (46.42, 0, 1008, 43), (46.43, 0, 957, 60), (66.43, 0, 2015, 101), (86.43, 0, 2247, 93),
      (86.44, 2, 1450, 37), (106.44, 2, 1869, 190), (126.44, 2, 2789, 80), (146.44, 2, 2190, 9),
      (146.94, 1, 897, 39), (146.95, 0, 1063, 105)]),
    # two models trade GPUs: each move waits for the other's weights to leave
    ("prism", 2, 0.12, "serial", "fcfs", 4,
     [(20.0, 0, 2948, 17), (20.0, 0, 1504, 118), (20.01, 0, 1458, 86), (23.01, 0, 2440, 132), (23.11, 3, 1033, 34),
      (43.11, 1, 92, 17), (43.12, 2, 2890, 95), (43.13, 2, 1343, 40), (43.23, 0, 109, 31), (43.33, 1, 1161, 90),
      (43.43, 1, 76, 117), (43.43, 1, 1495, 90), (63.43, 0, 1022, 162), (63.53, 1, 1302, 2), (63.53, 1, 2737, 40),
      (63.63, 3, 1347, 101), (63.64, 2, 63, 184), (64.14, 3, 126, 83), (84.14, 1, 2932, 192), (84.14, 0, 1002, 169),
      (84.64, 3, 2865, 102), (84.65, 3, 2231, 153), (84.66, 2, 1802, 29), (84.76, 2, 244, 133), (85.26, 3, 2558, 55)]),
    # two models woken in one tick count the same evicted model's memory
    ("prism", 1, 0.12, "parallel", "fcfs", 4,
     [(0.01, 0, 687, 25), (0.01, 0, 760, 73), (3.01, 2, 2352, 61), (3.01, 2, 1328, 182), (23.01, 1, 168, 87),
      (23.02, 2, 2806, 135), (23.12, 0, 2223, 191), (26.12, 2, 2377, 115), (29.12, 3, 2122, 64), (29.22, 3, 1396, 103),
      (32.22, 2, 2955, 119), (32.22, 3, 813, 173), (52.22, 0, 1862, 122), (52.22, 0, 1773, 162), (52.72, 2, 1620, 111),
      (52.73, 3, 992, 146)]),
    # muxserve: a shared pool has no token left for its one running request (SGLang keeps one: its own pool
    # always holds it)
    ("muxserve", 1, 0.12, "parallel", "sglang", 3,
     [(0.5, 1, 1057, 186), (0.6, 0, 1789, 179), (0.61, 2, 1888, 149), (0.61, 0, 2903, 25), (3.61, 0, 1721, 28),
      (23.61, 0, 982, 103), (24.11, 2, 893, 14), (44.11, 0, 2790, 108), (47.11, 2, 1500, 147), (50.11, 2, 1647, 89),
      (50.11, 1, 2167, 116), (50.11, 2, 2194, 32), (50.11, 0, 1474, 165), (53.11, 2, 1367, 26), (56.11, 2, 1393, 141),
      (76.11, 0, 1833, 97), (79.11, 2, 2675, 169), (79.12, 0, 2794, 5), (79.13, 2, 1103, 82), (79.14, 2, 1568, 189)]),
    # static, a model of 2 GPUs: its pool sized by its first GPU's share alone (the second has other residents)
    ("static", 3, 0.12, "serial", "fcfs", 3,
     [(0.5, 1, 1708, 59), (1.0, 0, 1678, 169), (21.0, 1, 975, 163), (21.01, 0, 1215, 78), (21.11, 2, 582, 191),
      (24.11, 1, 91, 57), (27.11, 1, 84, 40), (30.11, 2, 2585, 8), (30.61, 1, 2453, 161), (50.61, 1, 919, 80),
      (50.71, 1, 1722, 23), (50.81, 1, 1734, 133), (70.81, 0, 2305, 76), (73.81, 0, 1159, 22), (73.81, 2, 1529, 61),
      (74.31, 0, 1266, 78), (74.41, 1, 1858, 17), (74.42, 2, 1976, 187)], TP),
    # two models of 2 GPUs each take one GPU's compute and wait for the other's (GPUs taken out of index order)
    ("muxserve", 3, 0.12, "serial", "sglang", 4,
     [(20.0, 3, 1001, 133), (20.01, 1, 84, 193), (40.01, 3, 1554, 9), (40.11, 3, 899, 122), (40.61, 2, 1330, 170),
      (40.71, 2, 984, 7), (60.71, 1, 1639, 128), (61.21, 0, 374, 197)], TP),
    # timeshare: a model of 2 GPUs leaves; a model waiting on the other GPU alone was never swapped in
    ("timeshare", 4, 0.2, "parallel", "sglang", 4,
     [(0.1, 2, 716, 197), (20.1, 2, 452, 7), (20.11, 3, 1719, 65), (23.11, 2, 2624, 176), (43.11, 3, 564, 142),
      (43.11, 1, 806, 39), (63.11, 1, 1356, 139), (63.11, 0, 1267, 105), (63.11, 3, 2623, 154), (63.12, 3, 2073, 87),
      (63.12, 3, 1525, 147), (63.12, 2, 207, 123)], TP),
]


@pytest.mark.parametrize("case", FOUND, ids=[f"{c[0]}-{i}{'-tp' if c[7:] else ''}" for i, c in enumerate(FOUND)])
def test_fleets_the_invariants_once_failed_on(case):
    sharing, gpus, utilization, compute, method, m, specs, *tp = case
    tp = 2 if tp else 1
    models = [("m0", "llama-3.2-1b"), ("m1", "qwen2.5-0.5b", tp), ("m2", "llama-3.2-3b"), ("m3", "qwen2.5-1.5b", tp)][:m]
    trace = multi_trace([(t, models[k][0], p, o) for t, k, p, o in specs], models)
    audit = FleetAudit()
    res = simulate(fleet_run(trace, sharing, gpus, method, utilization=utilization, compute=compute), events=audit)
    assert sorted(r.id for r in res.records) == list(range(len(specs))) and audit.iterations > 0


def test_a_static_partition_without_room_for_every_floor_is_refused_up_front():
    """Three models' weights fill all but 200 pages of a GPU; Llama-3.2-3B's largest request (1,913 + 134
    tokens) needs a pool of 2,049 tokens, as SGLang admits only below its pool (prompt + output + a page <
    free): three blocks of 1,024 beside the others' floors do not fit. Static refuses at once (it once gave the
    model 2,048 tokens, and the engine waited forever); muxserve's elastic pools take turns and serve all."""
    from prism.policies.sharing_static import FleetTooSmall

    models = [("m0", "llama-3.2-1b"), ("m1", "qwen2.5-0.5b"), ("m2", "llama-3.2-3b")]
    trace = multi_trace([(0.01, "m1", 2157, 67), (0.11, "m1", 2210, 191), (0.61, "m0", 1911, 88),
                         (1.11, "m2", 1897, 134)], models)
    with pytest.raises(FleetTooSmall, match=r"static: 1 GPUs cannot hold every model .*left out"):
        simulate(fleet_run(trace, "static", 1, "sglang", utilization=0.12))
    res = simulate(fleet_run(trace, "muxserve", 1, "sglang", utilization=0.12))
    assert len(res.records) == 4


def test_one_model_under_memory_pressure_on_the_elastic_pool():
    """The zipf trace's 2,048 requests on prism's elastic pool (its KV fills the GPU; cached prefixes are
    evicted to admit): every request served, the pool never maps more than it has and the engine never holds
    more than its pool maps for it (once: the engine's capacity counted its usage twice and asked 173 tokens
    past its pages)."""
    from prism.policies.registry import resolve_method

    label, s, e = resolve_method("prism")
    gpu = "a800-80g-pcie"  # prism-sim's default GPU (H100's pool did not meet the case)
    single = RunSpec.build(load_trace("zipf", {}), s, e, profile=f"{gpu}:qwen3-4b-instruct-2507", label=label)
    spec = _fleet_spec(single, FleetConfig(gpus=2, gpu=gpu, sharing="prism"), {})
    audit = FleetAudit()
    res = simulate(spec, events=audit)
    assert len(res.records) == 2048 and audit.iterations > 0
    assert res.summary["counters"]["evicted_nodes"] > 0  # under pressure indeed


# ---------------------------------------------------------------------------------------------- attainment
def test_attainment_is_the_share_of_requests_within_both_slos():
    from prism.metrics import RequestRecord, fleet_summary

    def rec(i, ttft, tpot, model):
        return RequestRecord(i, 0.0, 0.0, 0.0, 0.0, ttft, ttft + tpot * 9, 10, 0, 10, "", False, None, model, "0")

    records = [rec(0, 0.1, 0.01, "a"), rec(1, 0.3, 0.01, "a"), rec(2, 0.1, 0.05, "b"), rec(3, 0.1, 0.01, "b")]
    s = fleet_summary(records, {0: "a", 1: "a", 2: "b", 3: "b"}, {"a": (0.2, 0.02), "b": (0.2, 0.02)})
    assert (s["attainment_ttft"], s["attainment_tpot"], s["attainment"]) == (0.75, 0.75, 0.5)
    assert s["per_model"]["a"]["attainment"] == 0.5 and s["per_model"]["b"]["attainment"] == 0.5
    span = max(r.finish for r in records)
    assert s["goodput_rps"] == pytest.approx(2 / span)


def test_a_model_whose_tpot_slo_cannot_be_measured_is_one_line(tmp_path, capsys):
    """30 requests of multimodel leave a model without a request of two output tokens: no TPOT SLO can be
    measured for it, which a placement needs (a dedicated GPU each does not)."""
    from prism.cli.sim import main

    argv = ["--trace", "multimodel", "--set", "trace.num_requests=30", "--no-progress", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prism-sim: error: model '") and "no TPOT SLO to place it by" in err, err
    assert len(err.splitlines()) == 1
    assert main([*argv, "--sharing", "dedicated"]) == 0


def test_slos_default_to_the_dedicated_p95_times_the_scale():
    from prism.sim.fleet import with_slos

    trace = load_trace("multimodel.yaml", {"num_requests": 150})
    spec = settings_from(merge_flags({}, [], gpus=2, sharing="muxserve")).resolve("multimodel.yaml")
    spec = with_slos(spec)
    one = spec.served_models[0]
    assert one.ttft_slo_s > 0 and one.tpot_slo_s > 0
    # the same model alone on a dedicated GPU with its first slo_requests requests: P95 x 5
    import numpy as np

    from prism.calibration.cost_model import served_profile
    from prism.sim.fleet import model_spec

    gpu = profiles.gpu(spec.fleet.gpu)
    mine = [r for r in spec.trace.requests if r.model == one.name][:spec.fleet.slo_requests]
    alone = simulate(model_spec(spec, one, served_profile(gpu, profiles.model(one.profile)), mine))
    assert one.ttft_slo_s == pytest.approx(5 * np.percentile([r.ttft for r in alone.records], 95))
    assert trace is not None
