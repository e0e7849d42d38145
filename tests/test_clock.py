"""An iteration's time passing without a SimPy event (``sim/clock.py``): the clock's rule on SimPy's own heap, its
one event scheduled again as a timeout would be, a lone engine's arrivals sent by its clock as a client's process
sends them (ties with an iteration's end included), and runs of every kind identical, file for file and iteration for
iteration (the timeline), to the same runs where every iteration is a new SimPy timeout, every arrival a client's
process's, and every wait for a GPU's compute a new event."""

from __future__ import annotations

import dataclasses
import json

import pytest
import simpy

from conftest import SYS, make_trace

import prism.sim.clock as clock_module
import prism.sim.fleet_gpu as fleet_gpu
import prism.sim.run as run_module
from prism.calibration.cost_model import load_profile
from prism.cli.sim import main as sim_main
from prism.settings import EngineConfig, RunSpec
from prism.sim.client import Client, part_times, send_times
from prism.sim.clock import Ticker
from prism.sim.events import EngineEvents
from prism.traces.spec import generate
from prism.traces.zipf import ZipfHotspotSpec


def test_the_clock_moves_on_only_when_no_event_is_due_by_then():
    env = simpy.Environment(initial_time=1.0)
    elapse = Ticker(env).elapse
    assert elapse(0.25) is None and env.now == 1.25  # nothing scheduled
    env.timeout(0.5)  # due at 1.75
    assert elapse(0.25) is None and env.now == 1.5
    wait = elapse(0.25)  # ends at 1.75, with the other event: that one was scheduled first
    assert wait is not None and env.now == 1.5
    real = env.timeout(0.25)  # a real timeout of the same delay, scheduled next: the same entry but its serial
    (end, priority, serial, event), (t_end, t_priority, t_serial, _) = sorted(env._queue, key=lambda e: e[2])[-2:]
    assert (end, priority, serial + 1, event) == (t_end, t_priority, t_serial, wait) and end == 1.75
    env.run()
    assert env.now == 1.75 and wait.processed and wait.ok and wait.value is None and real.processed
    assert elapse(0.0) is None

    def process():
        yield env.timeout(1.0)

    env.process(process())  # an event due now (an urgent one: the process starting) goes first too
    assert elapse(0.0) is wait and env.now == 1.75  # the same event, scheduled again


@pytest.mark.parametrize("start", [0, 2.5])
def test_now_of_is_simpys_clock_itself(start):
    """``now_of`` (the clock as compiled code reads it) is ``env.now``'s very object: SimPy's int 0 at the start
    stays an int (records and memory samples write it so), and it follows the clock."""
    env = simpy.Environment(initial_time=start)
    assert clock_module.now_of(env) is env.now
    env.run(until=start + 1.25)
    assert clock_module.now_of(env) is env.now and clock_module.now_of(env) == start + 1.25


def test_a_wait_scheduled_again_while_a_process_waits_on_it_is_an_error():
    """The reused event is safe only once SimPy has processed its last use (an interrupted wait would leave it on the
    heap, to wake the engine early): asked again before that, it refuses."""
    env = simpy.Environment()
    ticker = Ticker(env)
    env.timeout(0.1)  # due first: the wait is an event

    def engine():
        yield ticker.elapse(1.0)

    env.process(engine())
    env.step()  # the process starts and waits
    with pytest.raises(RuntimeError, match="scheduled again"):
        ticker.elapse(0.5)


def test_a_clock_fed_arrivals_refuses_other_events_among_them():
    """Fed arrivals are sent as its iterations pass them, which is right only while no other process's event can
    fall in between (a router's, a front end's): one due first is an error, not a silent reordering."""
    env = simpy.Environment()
    ticker = Ticker(env)
    sent = []
    ticker.feed([0.5, 2.0], sent.append)
    assert ticker.elapse(1.0) is None and sent == [0] and env.now == 1.0
    env.timeout(0.5)  # another process's event, due at 1.5, before the arrival at 2.0
    assert ticker.elapse(0.25) is None and env.now == 1.25
    with pytest.raises(RuntimeError, match="only process"):
        ticker.elapse(1.0)


def test_a_process_sees_the_same_times_as_with_timeouts():
    """Two processes, one moving its clock itself: the interleaving and every time as with timeouts only."""

    def run(use_elapse):
        env, seen = simpy.Environment(), []

        def engine():
            ticker = Ticker(env)
            for d in (0.3, 0.1, 0.1, 0.7, 0.2, 0.1):
                wait = ticker.elapse(d) if use_elapse else env.timeout(d)
                if wait is not None:
                    yield wait
                seen.append(("engine", env.now))

        def arrivals():
            for d in (0.4, 0.1, 0.65, 0.05):
                yield env.timeout(d)
                seen.append(("arrival", env.now))

        env.process(engine())
        env.process(arrivals())
        env.run()
        return seen

    assert run(True) == run(False)


RUNS = {
    "zipf-sglang-small-pool": ["--trace", "zipf", "--method", "sglang", "--set", "trace.num_requests=400",
                               "--set", "engine.max_total_tokens=12000"],  # a retraction
    "zipf-prism-in-engine": ["--trace", "zipf", "--method", "prism", "--set", "trace.num_requests=400",
                             "--set", "qas.window_s=0", "--qps", "20"],
    "zipf-prism-windows": ["--trace", "zipf", "--method", "prism", "--set", "trace.num_requests=300",
                           "--set", "qas.front_end=arrivals", "--set", "qas.window_s=0.05"],
    "zipf-prism-backlog-held": ["--trace", "zipf", "--method", "prism", "--set", "trace.num_requests=300",
                                "--set", "engine.max_running_requests=4"],
    "agent-fcfs": ["--trace", "agent", "--method", "fcfs", "--set", "trace.num_requests=120"],
    "zipf-contextpilot-limit": ["--trace", "zipf", "--method", "contextpilot", "--set", "trace.num_requests=300",
                                "--set", "engine.max_concurrency=6"],  # a lone engine, its client holding some
    "cluster-lmetric": ["--trace", "zipf", "--method", "prism", "--set", "trace.num_requests=400",
                        "--instances", "3", "--router", "lmetric"],
    "fleet-prism": ["--trace", "multimodel", "--sharing", "prism", "--gpus", "2", "--set", "fleet.rate_scale=0.3"],
    "fleet-timeshare": ["--trace", "multimodel", "--sharing", "timeshare", "--set", "fleet.rate_scale=0.3"],
}


def _outputs(folder):
    out = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".csv", ".json")}
    summary = json.loads(out.pop("summary.json"))
    summary.pop("wall_s", None)
    return out, summary


@pytest.mark.parametrize("name", list(RUNS))
def test_runs_are_the_same_as_with_a_timeout_per_iteration(tmp_path, monkeypatch, name, capsys):
    args = [*RUNS[name], "--no-progress", "--timeline"]
    assert sim_main([*args, "--out", str(tmp_path / "elapse")]) == 0
    monkeypatch.setattr(clock_module.Ticker, "elapse", lambda self, delay: self.env.timeout(delay))
    _arrivals_by_process(monkeypatch)
    acquire = fleet_gpu.Copy.acquire  # and a new event for every wait for a GPU's compute (the engine calls its
    # host's acquire through Python, where the compiled copy calls its slots' take directly)

    def fresh_grant(copy, engine):
        copy._grant = copy.fleet.env.event()
        return acquire(copy, engine)

    monkeypatch.setattr(fleet_gpu.Copy, "acquire", fresh_grant)
    assert sim_main([*args, "--out", str(tmp_path / "timeouts")]) == 0
    fast, plain = _outputs(tmp_path / "elapse"), _outputs(tmp_path / "timeouts")
    assert "requests.csv" in fast[0] and "timeline.json" in fast[0]
    assert fast == plain


def _arrivals_by_process(monkeypatch) -> None:
    """Every run's arrivals sent by a client's process, as for an engine that is not alone."""
    monkeypatch.setattr(run_module, "Client", lambda *args, clock=None, **kw: Client(*args, **kw))


class _Toy:
    """An engine reduced to its clock, as ``Engine._loop`` keeps it: iterations of 0.25 s while requests wait or
    the last one taken is still busy (two iterations), else idle. Logs the requests each iteration takes (where it
    takes any) with its start, and each arrival's time."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env, self.ticker, self.left = env, Ticker(env), 0
        self.waiting, self.starts, self.arrivals, self._wake = [], [], [], None
        env.process(self._loop())

    def submit(self, seq) -> None:
        self.waiting.append(seq.id)
        self.arrivals.append((seq.id, self.env.now))
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self):
        while True:
            if self.waiting or self.left:
                if self.waiting:
                    self.starts.append((self.env.now, tuple(self.waiting)))
                    self.waiting, self.left = [], 2
                self.left -= 1
                wait = self.ticker.elapse(0.25)
                if wait is not None:
                    yield wait
                continue
            if self.ticker.fed:
                yield self.ticker.next_arrival()
                self.ticker.arrived()
            else:
                self._wake = self.env.event()
                yield self._wake
                self._wake = None


def _toy_run(arrivals, fed: bool):
    trace = make_trace([(t, [(SYS, "s", 4)], 1) for t in arrivals])
    env = simpy.Environment()
    toy = _Toy(env)
    Client(env, toy, trace.requests, clock=toy.ticker if fed else None)
    env.run(until=10)
    return toy.starts, toy.arrivals


def test_a_lone_engines_clock_sends_arrivals_as_a_process_would():
    """Arrivals 2 and 10 fall on an iteration's end and were pending when it started: they
    go first (their timeouts were on the heap before the iteration's). Arrivals 4 and 5 fall on the end of the
    iteration that arrival 3 fell in: their timeout would be scheduled only when 3 was sent, after the
    iteration's, so the engine takes 3 alone and them (with 6) at the next start. Arrivals due together go
    together (0 and 1), an idle engine waits for the next (7; 8 and 9), and 7 comes at the clock plus the gap,
    which is not its arrival in the last bit."""
    arrivals = [0.0, 0.0, 0.25, 0.3, 0.5, 0.5, 0.7, 3.03, 4.0, 4.0, 4.25]
    fed, plain = _toy_run(arrivals, True), _toy_run(arrivals, False)
    assert fed == plain
    late = 0.7 + (3.03 - 0.7)
    assert late != 3.03
    assert fed[0] == [(0.0, (0, 1)), (0.25, (2,)), (0.5, (3,)), (0.75, (4, 5, 6)), (late, (7,)), (4.0, (8, 9)),
                      (4.25, (10,))]
    assert [t for _, t in fed[1]] == list(send_times(make_trace([(t, [(SYS, "s", 4)], 1) for t in arrivals]).requests))


def test_one_models_part_of_a_replay_is_sent_as_the_whole_replay_sends_it():
    """A fleet's part (``sim/fleet.py``) replays one model's requests on a clock of its own, at the whole replay's
    times (``part_times``). A tie with an iteration's end must go as on the whole replay's clock, where a
    request's timeout is scheduled when the request before it, of any model, is sent: request 2 (model a) arrives
    at 0.25, when a's first iteration ends; on one clock its timeout was scheduled at 0.1 (when b's request 1 was
    sent), after that iteration's end (scheduled at 0), so the engine ends the iteration first, runs another and
    takes request 2 at 0.5. Scheduled at 0, when a's own request before it was sent, it would go first and be
    taken at 0.25. Requests 4 and 5 fall together at 0.75, with b's 6 between them in the trace."""
    arrivals = [(0.0, "a"), (0.1, "b"), (0.25, "a"), (0.3, "b"), (0.75, "a"), (0.75, "a"), (0.75, "b"), (0.9, "a"),
                (3.0, "b"), (3.25, "a")]
    trace = make_trace([(t, [(SYS, "s", 4)], 1) for t, _ in arrivals])
    mine = [i for i, (_, m) in enumerate(arrivals) if m == "a"]

    class Route:
        def __init__(self, env) -> None:
            self.a, self.b = _Toy(env), _Toy(env)

        def submit(self, seq) -> None:
            (self.a if seq.id in mine else self.b).submit(seq)

    env = simpy.Environment()
    whole = Route(env)
    Client(env, whole, trace.requests)
    env.run(until=10)
    env = simpy.Environment()
    part = _Toy(env)
    Client(env, part, [trace.requests[i] for i in mine], times=part_times(list(send_times(trace.requests)), mine))
    env.run(until=10)
    assert (part.starts, part.arrivals) == (whole.a.starts, whole.a.arrivals)
    assert part.starts[:2] == [(0.0, (0,)), (0.5, (2,))]


class _Iterations(EngineEvents):
    """Each iteration's start and end."""

    def __init__(self) -> None:
        self.spans, self._start = [], 0.0

    def prefill_started(self, eng, batch) -> None:
        self._start = eng.env.now

    def decode_started(self, eng, n) -> None:
        self._start = eng.env.now

    def prefill_ended(self, eng, batch) -> None:
        self.spans.append((self._start, eng.env.now))

    def decode_ended(self, eng, n) -> None:
        self.spans.append((self._start, eng.env.now))


def _records(trace, events=None):
    cfg = EngineConfig(max_total_tokens=30000, max_running_requests=32)
    spec = RunSpec.build(trace, "fcfs", "lru", engine=cfg, profile=load_profile())
    return [dataclasses.astuple(r) for r in run_module.simulate(spec, events=events).records]


def _quiet_span(trace, after: float):
    """An iteration starting after ``after`` with no arrival during it and another right after it (the engine
    stays busy), and the first request arriving after it."""
    ends = _Iterations()
    _records(trace, events=ends)
    times = [r.arrival for r in trace.requests]
    starts = {s for s, _ in ends.spans}
    for s, e in ends.spans:
        k = next((i for i, t in enumerate(times) if t > s), None)
        if s > after and e in starts and k is not None and times[k] > e and k + 2 < len(times):
            return s, e, k
    raise AssertionError("no quiet iteration")


def test_arrivals_at_an_iterations_end_on_the_engine_are_as_a_process_sends_them(monkeypatch):
    """A real engine, decoding, on arrivals moved onto iteration ends (moving an arrival earlier changes nothing
    before it): one that was pending when its iteration started, which the engine admits at that end, and one at
    the end of an iteration another arrival fell in, which comes after the engine resumed there: the other is
    admitted at the end, it at the next. The records are the same as with a client's process."""
    trace = generate(ZipfHotspotSpec(num_requests=120, qps=4.0, seed=5))
    times = [r.arrival for r in trace.requests]
    s, e, k = _quiet_span(trace, 1.0)
    times[k], times[k + 1] = (s + e) / 2, e  # k falls in the iteration, k + 1 on its end
    trace = trace.with_arrivals(times)
    s2, e2, k2 = _quiet_span(trace, e)
    times[k2] = e2  # pending when the iteration started, on its end
    trace = trace.with_arrivals(times)
    fed = _records(trace)
    _arrivals_by_process(monkeypatch)
    assert fed == _records(trace)
    by_id = {r[0]: r for r in fed}
    first, later, pending = (by_id[trace.requests[i].id] for i in (k, k + 1, k2))
    assert (first[2], first[3]) == ((s + e) / 2, e) and later[2] == e < later[3] and pending[2:4] == (e2, e2)
