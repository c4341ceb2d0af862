"""Lint runs with the tests: ruff with the rules pinned in pyproject.toml, over the whole repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff is not None, "ruff is not installed: it is in the dev extra (pip install -e '.[dev]')"
    result = subprocess.run([ruff, "check", "--no-cache", str(ROOT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
