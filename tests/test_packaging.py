"""The package as a user installs it: its distribution name, its wheel, its install hints.

The import name and the command are `circuits`; the distribution is `circuits-interp`, because
`circuits` on the package index is another project. Installing the wheel in a fresh environment
and running `circuits demo` needs a venv and a torch install, too heavy for the suite:
scripts/check_install.sh does it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from circuits.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = PROJECT["name"]


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_distribution_is_not_named_like_the_other_project():
    assert _normalized(NAME) == "circuits-interp"
    assert PROJECT["scripts"] == {"circuits": "circuits.cli:main"}


def test_version_is_the_installed_distributions(capsys):
    try:
        installed = metadata.version(NAME)
    except metadata.PackageNotFoundError:
        pytest.fail(f"{NAME} is not installed in this environment: pip install -e . (an older name?)")
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"circuits {installed}\n"


def test_extras_refer_to_this_distribution():
    """`circuits[hf]` in an extra would install the other project's `circuits`."""
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
            assert _normalized(name) != "circuits", (extra, requirement)


INSTALL_HINT = re.compile(r"pip install\s+(?:-e\s+)?['\"]?circuits(?![-\w])")


def test_install_hints_name_this_distribution():
    """Every `pip install circuits...` a user is told to run names this distribution."""
    texts = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("notebooks/*.ipynb")]
    texts += [*ROOT.glob("circuits/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("scripts/*")]
    wrong = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in texts
        for match in INSTALL_HINT.finditer(path.read_text())
    ]
    assert not wrong


def test_requires_python_is_the_lowest_version_the_suite_runs_on():
    """The floor is the version CI runs the suite on (3.11): a lower one would be a claim never tested.

    3.10 also lacks what the package uses (exception notes, `BaseException.add_note`, in nodes.py).
    """
    floor = tuple(int(part) for part in re.fullmatch(r">=(\d+)\.(\d+)", PROJECT["requires-python"]).groups())
    assert floor == (3, 11)
    assert sys.version_info[:2] >= floor


_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "site", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"
)


@pytest.mark.slow
def test_the_wheel_holds_every_module_the_demo_model_and_py_typed(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    subprocess.run(
        # the dev extra's setuptools, not a fresh isolated build environment (6 s of the test's 8)
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [wheel] = (tmp_path / "wheel").glob("*.whl")
    assert wheel.name.startswith(NAME.replace("-", "_") + "-" + PROJECT["version"] + "-py3-none-any")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        contents = {name: archive.read(name) for name in names}
    modules = {path.relative_to(ROOT).as_posix() for path in ROOT.glob("circuits/**/*.py")}
    assert modules and modules <= names, sorted(modules - names)
    for data in (
        "circuits/py.typed",
        *(p.relative_to(ROOT).as_posix() for p in ROOT.glob("circuits/data/**/*") if p.is_file()),
    ):
        same = contents.get(data) == (ROOT / data).read_bytes()
        assert same, f"{data}: not in the wheel, or not the same bytes"
    assert {"circuits/data/induction_2l.safetensors", "circuits/data/induction_2l.json"} <= names
    assert "circuits/data/induction_2l_sae/sae_weights.safetensors" in names  # the demo SAE
    info = wheel.name.split("-py3")[0] + ".dist-info"
    assert "circuits = circuits.cli:main" in contents[f"{info}/entry_points.txt"].decode()
    wheel_metadata = contents[f"{info}/METADATA"].decode()
    assert f"\nName: {NAME}\n" in wheel_metadata
    assert f"\nRequires-Python: {PROJECT['requires-python']}\n" in wheel_metadata
    assert not [name for name in names if name.startswith(("tests/", "bench/", "docs/", "scripts/"))]
