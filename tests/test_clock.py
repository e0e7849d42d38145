"""An iteration's time passing without a SimPy event (``sim/clock.py``): the clock's rule on SimPy's own heap, its
one event scheduled again as a timeout would be, and runs of every kind identical, file for file and iteration for
iteration (the timeline), to the same runs where every iteration is a new SimPy timeout and every wait for a GPU's
compute a new event."""

from __future__ import annotations

import json

import pytest
import simpy

import prism.sim.clock as clock_module
import prism.sim.fleet as fleet_module
from prism.cli.sim import main as sim_main
from prism.sim.clock import Ticker


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
    take = fleet_module.ComputeSlot.take  # and a new event for every wait for a GPU's compute
    monkeypatch.setattr(fleet_module.ComputeSlot, "take", lambda self, who, priority, wait:
                        take(self, who, priority, self.env.event()))
    assert sim_main([*args, "--out", str(tmp_path / "timeouts")]) == 0
    fast, plain = _outputs(tmp_path / "elapse"), _outputs(tmp_path / "timeouts")
    assert "requests.csv" in fast[0] and "timeline.json" in fast[0]
    assert fast == plain
