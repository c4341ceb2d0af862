"""The documentation builds without a warning (mkdocs --strict), API pages included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in (
        "circuits.core.nodes.Einsum",
        "circuits.transformer.attention.split_heads",
        "circuits.evaluation.evaluate",
    ):
        assert name in api, f"{name} missing from the API reference"
