"""Shared test fixtures: the golden file (the format's reference, tests/data/attn_only_2l.circ).

Hypothesis profiles, chosen by the environment variable CIRCUITS_HYPOTHESIS_PROFILE:
``default`` (random exploration, so every local run tries new examples) and
``ci`` (derandomized: the same examples on every run, no example database, and
the blob to reproduce any failure printed, and any skipped test failing the run), which ``.ci/run`` selects.  Neither
has a deadline or the timing health check, so a slow or loaded machine fails
nothing.  Torch's global generator is seeded before every test, so tests that
draw unseeded random tensors are reproducible too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

GOLDEN = Path(__file__).resolve().parent / "data" / "attn_only_2l.circ"

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("CIRCUITS_HYPOTHESIS_PROFILE", "default"))

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # pytest -n N: the cores shared among the workers
    _SHARE = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_SHARE)
    os.environ.setdefault("OMP_NUM_THREADS", str(_SHARE))  # the subprocesses a test starts, likewise


GPU_SKIP = "marked gpu: needs CUDA, and torch.cuda.is_available() is False here"


#: The longest test files (minutes of the suite), run first: with ``pytest -n auto`` each file runs on
#: one worker (``--dist loadfile --no-loadscope-reorder`` in pyproject.toml), so a long file started
#: last would leave the other workers idle at the end.
LONGEST_FIRST = (
    "test_notebooks.py",
    "test_models_tl_families.py",
    "test_models_conformance.py",
    "test_real_model.py",
    "test_patching_grids.py",
    "test_models_tl_bridge.py",
    "test_analyses_every_family.py",
    "test_models_families_2026.py",
    "test_edges.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (``LONGEST_FIRST``); tests marked ``gpu`` run where CUDA is, and are
    skipped elsewhere with ``GPU_SKIP``."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=GPU_SKIP)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def golden_text() -> str:
    if not GOLDEN.exists():
        pytest.fail(f"the golden file is missing: expected it at {GOLDEN}")
    return GOLDEN.read_text()


def pytest_sessionfinish(session, exitstatus):
    """In CI a skipped test fails the run: a skip counted as a pass would hide a test that never ran.
    The one exception is a ``gpu`` test where there is no GPU (CI has none): it says so, and
    ``bench/gpu.py`` and a GPU session run it."""
    if os.environ.get("CIRCUITS_HYPOTHESIS_PROFILE") != "ci" or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    skipped = [report for report in skipped if GPU_SKIP not in str(report.longrepr)]
    if skipped:
        reasons = sorted(
            {
                str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
                for report in skipped
            }
        )
        reporter.write_line(
            f"CI: {len(skipped)} tests were skipped, which CI counts as a failure: " + "; ".join(reasons),
            red=True,
        )
        session.exitstatus = 1
