"""The ``circuits`` command line: print good and bad files, help, exit codes, no tracebacks."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import circuits as cc
from circuits.cli import main

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden" / "attn_only_2l.circ"


def _run(*args: str) -> subprocess.CompletedProcess:
    """``python -m circuits ARGS`` in a subprocess, as a user would run the console script."""
    return subprocess.run(
        [sys.executable, "-m", "circuits", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def saved(tmp_path) -> tuple[Path, cc.Circuit]:
    x = cc.Array(torch.arange(6.0).reshape(2, 3), name="x")
    y = cc.Einsum.from_einsum_string("ab,->ab", x, cc.Scalar(-1.0, name="neg"), name="y")
    circuit = cc.GeneralFunction.new_by_name(cc.Add(x, y, name="z"), spec_name="softmax", name="p")
    return cc.save(circuit, tmp_path / "p.circ"), circuit


def test_print_a_saved_file_in_a_subprocess(saved):
    path, circuit = saved
    result = _run("print", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == circuit.repr() + "\n" and result.stderr == ""


def test_print_options(saved, capsys):
    path, circuit = saved
    assert main(["print", str(path), "--depth", "1", "--shapes", "--serials"]) == 0
    assert capsys.readouterr().out == circuit.repr(depth=1, shapes=True, serials=True) + "\n"


def test_print_the_golden_file_without_a_store(capsys):
    assert main(["print", str(GOLDEN)]) == 0
    assert capsys.readouterr().out == GOLDEN.read_text() + "\n"


def test_print_several_roots(tmp_path, capsys):
    a = cc.Array(torch.ones(2), name="a")
    path = cc.save([cc.Add(a, name="one"), cc.Add(a, a, name="two")], tmp_path / "two.circ")
    assert main(["print", str(path)]) == 0
    assert capsys.readouterr().out == path.read_text()


def test_bad_file_is_one_message_with_its_line(tmp_path):
    bad = tmp_path / "bad.circ"
    bad.write_text("'a' Add\n  'x' [3] Array 0123456789abcdef01234567\n  'y' Einsum ab,->ab\n")
    result = _run("print", str(bad))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    first, *rest = result.stderr.rstrip("\n").split("\n")
    assert first.startswith(f"{bad}:3: ")
    assert rest == ["      'y' Einsum ab,->ab"]  # the offending line, as written, indented


@pytest.mark.parametrize(
    "text, line",
    [
        ("'a' Add\n   'x' [2] Scalar 1", 2),  # odd indent
        ("'a' Frobnicate", 1),  # unknown variant
        ("'a' Add\n  'b'", 2),  # repeat of nothing
        ("'x' [2] Array 0123", 1),  # short hash
    ],
)
def test_parse_errors_report_file_and_line(tmp_path, capsys, text, line):
    bad = tmp_path / "bad.circ"
    bad.write_text(text)
    assert main(["print", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:{line}: ") and "Traceback" not in err


def test_missing_tensor_in_the_store_reports_its_line(saved, capsys):
    path, circuit = saved
    for tensor in (path.parent / "p.tensors").glob("*.safetensors"):
        tensor.unlink()
    assert main(["print", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:") and "no tensor with hash prefix" in err


def test_missing_file_directory_and_binary(tmp_path):
    result = _run("print", str(tmp_path / "nothing.circ"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"{tmp_path / 'nothing.circ'}: no such file"
    assert main(["print", str(tmp_path)]) == 1
    empty = tmp_path / "empty.circ"
    empty.write_text("# nothing here\n")
    assert main(["print", str(empty)]) == 1
    binary = tmp_path / "b.circ"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["print", str(binary)]) == 1


def test_stdin(saved, capsys, monkeypatch):
    path, circuit = saved
    monkeypatch.setattr(sys, "stdin", io.StringIO(path.read_text()))
    assert main(["print", "-", "--depth", "0"]) == 0
    assert capsys.readouterr().out == circuit.repr(depth=0) + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("'a' Add\n\t'b' Add"))
    assert main(["print", "-"]) == 1
    assert capsys.readouterr().err.startswith("<stdin>:2: ")


def test_help(capsys):
    result = _run("--help")
    assert result.returncode == 0
    assert "print" in result.stdout and "demo" in result.stdout
    for command, expected in [("print", "--depth"), ("demo", "--block-len")]:
        with pytest.raises(SystemExit) as caught:
            main([command, "--help"])
        assert caught.value.code == 0 and expected in capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2
    with pytest.raises(SystemExit) as caught:
        main(["print", "x.circ", "--depth", "-1"])
    assert caught.value.code == 2
    assert "expected 0 or more" in capsys.readouterr().err
