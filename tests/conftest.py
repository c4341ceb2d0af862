"""Shared test fixtures: the golden file lives in ../shared, never copied here."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden" / "attn_only_2l.circ"

settings.register_profile("default", deadline=None)
settings.load_profile("default")


@pytest.fixture(scope="session")
def golden_text() -> str:
    if not GOLDEN.exists():
        pytest.fail(f"the golden file is missing: expected it at {GOLDEN} (../shared beside the repo)")
    return GOLDEN.read_text()
