"""Habits that keep the layout: the layer contract and the function-length limit run with the tests.

The layer contract is import-linter's, configured in pyproject.toml ``[tool.importlinter]``: errors <
core < evaluation < rewriting < text < transformer < models | passes < experiments | causal_scrubbing <
cli, and models never import passes (docs/architecture.md). Imports inside functions count: a lazy
import is still a dependency.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "circuits"
MAX_FUNCTION_LINES = 80


def test_layer_contract_is_kept():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports"
    )
    assert lint_imports is not None, (
        "import-linter is not installed: it is in the dev extra (pip install -e '.[dev]')"
    )
    # The package checked is the one beside this file, whichever `circuits` is installed.
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [lint_imports, "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path, "COLUMNS": "120"},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            "lint-imports (pyproject.toml [tool.importlinter]):\n" + result.stdout + result.stderr,
            pytrace=False,
        )


def _long_functions(package: Path, limit: int) -> list[str]:
    """``file:line name (N lines)`` for every function or method over ``limit`` lines, decorators excluded."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # lineno is the `def` line, after decorators
                if length > limit:
                    where = path.relative_to(package.parent).as_posix()
                    found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_over_80_lines():
    assert any(PACKAGE.rglob("*.py")), f"no Python file under {PACKAGE}"
    offenders = _long_functions(PACKAGE, MAX_FUNCTION_LINES)
    if offenders:
        pytest.fail(
            f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(offenders), pytrace=False
        )


def test_the_length_check_counts_from_def_to_the_last_line(tmp_path):
    (tmp_path / "m.py").write_text(
        "@staticmethod\n@staticmethod\ndef f():\n"
        + "    x = 1\n" * 3
        + "class C:\n    def g(self):\n        pass\n"
    )
    assert _long_functions(tmp_path, 3) == [f"{tmp_path.name}/m.py:3 f (4 lines)"]
    assert _long_functions(tmp_path, 4) == []


def _private_imports(path: Path) -> list[str]:
    """``from circuits.x import _name`` and ``circuits.x._name`` in ``path``: reaching into another module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("circuits"):
            found += [
                f"{path}:{node.lineno} from {node.module} import {a.name}"
                for a in node.names
                if a.name.startswith("_")
            ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in ("circuits", "cc"):
                found.append(f"{path}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_imports_another_modules_private_names():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in _private_imports(path)]
    assert not found, "private names used across modules (make them public or move them):\n" + "\n".join(
        found
    )


def test_the_private_import_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from circuits.evaluation.plan import _PATH_HEAD\nimport circuits\ncircuits.evaluation._x\n"
    )
    assert len(_private_imports(bad)) == 2
