"""Lint runs with the tests: ruff with the rules pinned in pyproject.toml, and ruff's formatter, over the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*arguments: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff is not None, "ruff is not installed: it is in the dev extra (pip install -e '.[dev]')"
    return subprocess.run(
        [ruff, *arguments, "--no-cache", str(ROOT)], capture_output=True, text=True, check=False
    )


def test_ruff_is_clean():
    result = _ruff("check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    result = _ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr
