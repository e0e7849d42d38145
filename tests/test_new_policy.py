"""A new scheduler is one file plus one registry line: a throwaway last-in-first-out policy, kept outside the
package as a user's would be, runs in the simulator and passes the engine's invariant suite."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.cli.sim import main as sim_main
from prism.policies import registry

from test_invariants import check_run, runs

LIFO = '''
    """Last in, first out: the newest waiting request first (an example of a new scheduler)."""

    from prism.policies.base import Plan, Scheduler


    class LIFO(Scheduler):
        name = "lifo"

        def plan(self, waiting, ctx):
            return Plan(sorted(waiting, key=lambda r: (r.arrival, r.id), reverse=True))
'''


@pytest.fixture
def lifo(tmp_path, monkeypatch):
    (tmp_path / "my_policies").mkdir()
    (tmp_path / "my_policies" / "__init__.py").write_text("")
    (tmp_path / "my_policies" / "lifo.py").write_text(textwrap.dedent(LIFO))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.SCHEDULERS, "lifo", "my_policies.lifo:LIFO")  # the one registry line
    return "lifo"


def test_a_new_scheduler_runs_from_the_command_line(lifo, tmp_path, capsys):
    out = tmp_path / "run"
    assert sim_main(["--trace", "zipf", "--scheduler", lifo, "--set", "trace.num_requests=200", "--qps", "200",
                     "--no-progress", "--out", str(out)]) == 0
    rows = (out / "requests.csv").read_text().splitlines()[1:]
    assert len(rows) == 200
    # overloaded (200 req/s), so the queue is long: LIFO serves late arrivals before early ones
    starts = {int(r.split(",")[0]): float(r.split(",")[3]) for r in rows}
    assert sum(starts[i] > starts[j] for i, j in zip(range(100), range(100, 200))) > 50


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_new_scheduler_passes_the_invariant_suite(lifo, data):
    check_run(data.draw(runs(lifo)))
