"""The theory-check notebooks run top to bottom (small sizes) and are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), \
        "notebooks are stored without outputs"
    monkeypatch.setenv("PRISM_NB_REQUESTS", "300")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_there_are_two_notebooks():
    assert {p.name for p in NOTEBOOKS} == {"theorem1.ipynb", "bottleneck.ipynb"}
