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


GPU_SKIP = "marked gpu: needs CUDA, and torch.cuda.is_available() is False here"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where CUDA is, and are skipped elsewhere with ``GPU_SKIP``."""
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
