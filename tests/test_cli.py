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

GOLDEN = Path(__file__).resolve().parent / "data" / "attn_only_2l.circ"


def _run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``python -m circuits ARGS`` in a subprocess, as a user would run the console script."""
    return subprocess.run(
        [sys.executable, "-m", "circuits", *args], input=stdin, capture_output=True, timeout=120, check=False
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
    assert result.stdout.decode() == circuit.repr() + "\n" and result.stderr == b""


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


def test_bad_file_is_one_message_with_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.circ"
    bad.write_text("'a' Add\n  'x' [3] Array 0123456789abcdef01234567\n  'y' Einsum ab,->ab\n")
    assert main(["print", str(bad)]) == 1  # in-process (a subprocess costs an import of torch)
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    first, *rest = err.rstrip("\n").split("\n")
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
    path, _ = saved
    for tensor in (path.parent / "p.tensors").glob("*.safetensors"):
        tensor.unlink()
    assert main(["print", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:") and "no tensor with hash prefix" in err


def test_missing_file_directory_and_binary(tmp_path, capsys):
    result = _run("print", str(tmp_path / "nothing.circ"))
    assert result.returncode == 1 and b"Traceback" not in result.stderr
    assert result.stderr.decode().strip() == f"{tmp_path / 'nothing.circ'}: no such file"
    assert main(["print", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"{tmp_path}: is a directory, not a circuit file\n"
    empty = tmp_path / "empty.circ"
    empty.write_text("# nothing here\n")
    assert main(["print", str(empty)]) == 1
    assert capsys.readouterr().err.startswith(f"{empty}: no circuit in it")
    binary = tmp_path / "b.circ"
    binary.write_bytes(b"'a' Add\n\xff\xfe\x00garbage")
    assert main(["print", str(binary)]) == 1
    assert capsys.readouterr().err == f"{binary}:2: not UTF-8 text (invalid start byte at column 1)\n"


def _stdin(data: bytes) -> io.TextIOWrapper:
    """Standard input as Python gives it: text over a binary buffer, which ``print -`` reads."""
    return io.TextIOWrapper(io.BytesIO(data))


def test_stdin(saved, capsys, monkeypatch):
    path, circuit = saved
    monkeypatch.setattr(sys, "stdin", _stdin(path.read_bytes()))
    assert main(["print", "-", "--depth", "0"]) == 0
    assert capsys.readouterr().out == circuit.repr(depth=0) + "\n"
    monkeypatch.setattr(sys, "stdin", _stdin(b"'a' Add\n\t'b' Add"))
    assert main(["print", "-"]) == 1
    assert capsys.readouterr().err.startswith("<stdin>:2: ")
    monkeypatch.setattr(sys, "stdin", io.StringIO(path.read_text()))  # a text stream will do too
    assert main(["print", "-"]) == 0
    assert capsys.readouterr().out == circuit.repr() + "\n"


def test_byte_order_mark_and_crlf_in_a_file_and_on_stdin(saved, capsys, monkeypatch):
    path, circuit = saved
    windows = b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n")
    path.write_bytes(windows)
    assert main(["print", str(path)]) == 0
    assert capsys.readouterr().out == circuit.repr() + "\n"
    monkeypatch.setattr(sys, "stdin", _stdin(windows))
    assert main(["print", "-"]) == 0
    assert capsys.readouterr().out == circuit.repr() + "\n"


# ------------------------------------------------------------ nothing raw or huge reaches the terminal


def test_dev_zero_is_refused_at_its_first_line(capsys, monkeypatch):
    assert main(["print", "/dev/zero"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "/dev/zero:1: the line is longer than 1048576 characters: not a circuit file? "
        "(the limit is circuits.text.saving.MAX_LINE_CHARACTERS)\n"
    )
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bytes(3 << 20))))
    assert main(["print", "-"]) == 1
    assert capsys.readouterr().err.startswith("<stdin>:1: the line is longer")


def test_terminal_escapes_in_a_file_are_shown_escaped(tmp_path, capsys):
    bad = tmp_path / "ansi.circ"
    bad.write_bytes(b"'a' Add\n  '\x1b[2J\x1b]0;owned\x07' Frobnicate\n")
    assert main(["print", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert err.startswith(f"{bad}:2: unknown variant 'Frobnicate'")
    assert err.endswith("\n      '\\x1b[2J\\x1b]0;owned\\x07' Frobnicate\n")


@pytest.mark.parametrize(
    "line", ["x" * 1_000_000, "'a' " + "X" * 1_000_000, "'a' Add\n  '" + "é" * 1_000_000]
)
def test_a_megabyte_line_is_cut_in_the_message(tmp_path, capsys, line):
    bad = tmp_path / "big.circ"
    bad.write_text(line)  # no newline at the end
    assert main(["print", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:") and len(err) < 2000 and "more characters)" in err


def test_a_file_name_with_escapes_is_shown_escaped(tmp_path, capsys):
    assert main(["print", str(tmp_path / "\x1b[31mred.circ")]) == 1
    assert capsys.readouterr().err == f"{tmp_path}/\\x1b[31mred.circ: no such file\n"


def test_help(capsys):
    result = _run("--help")
    assert result.returncode == 0
    assert b"print" in result.stdout and b"demo" in result.stdout
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


# ------------------------------------------------------------------ cost


def test_cost_of_the_golden_file_without_its_tensors(capsys):
    assert main(["cost", str(GOLDEN)]) == 0
    out = capsys.readouterr().out
    golden = cc.parse(GOLDEN.read_text())
    assert out == golden.cost().table(depth=2) + "\n"
    assert out.startswith("Peak memory: ") and "matmul" in out


def test_cost_by_layer_head_and_node(capsys):
    from circuits.experiments.cost_groups import cost_table

    golden = cc.parse(GOLDEN.read_text())
    for by in ("layer", "head", "node"):
        assert main(["cost", str(GOLDEN), "--by", by, "--depth", "1"]) == 0
        assert capsys.readouterr().out == cost_table(golden, by=by) + "\n"


def test_cost_by_module_of_an_import(tmp_path, capsys):
    from circuits import models
    from circuits.experiments.cost_groups import cost_table

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    path = cc.save(models.from_torch(net, (torch.randn(3, 4),)), tmp_path / "net.circ")
    assert main(["cost", str(path), "--by", "module", "--depth", "3"]) == 0
    out = capsys.readouterr().out
    assert out == cost_table(cc.load(path), by="module", depth=3) + "\n"
    assert "├── 0 " in out and "├── 2 " in out  # the two Linear modules, by their paths


def test_cost_in_a_subprocess_and_its_errors(tmp_path):
    result = _run("cost", str(GOLDEN), "--by", "head")
    assert result.returncode == 0, result.stderr
    assert "layer 1 head 7" in result.stdout.decode()  # (--by block: test_usage_mistakes_are_one_line...)


def test_cost_of_a_bad_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.circ"
    bad.write_text("'x' Einsum ab->\n")
    assert main(["cost", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:1: Einsum 'x'") and "Traceback" not in err


def test_profile_prints_a_table_and_the_circuit_with_times(saved, capsys, tmp_path):
    path, circuit = saved
    trace = tmp_path / "trace.json"
    assert main(["profile", str(path), "--depth", "1", "--top", "2", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Node") and "Self CPU total" in out[0]
    table = out[: out.index("")]
    assert len([line for line in table if line.startswith(("p ", "z ", "y "))]) == 2  # --top 2
    assert any(line.startswith("3 nodes ran in") for line in out)
    tree = out[out.index("") + 1 :]
    assert tree[0].startswith("Node") and tree[2].startswith("p ") and tree[3].startswith("└── z ")
    assert '"traceEvents"' in trace.read_text()


def test_profile_of_a_file_without_tensors_says_so(capsys):
    assert main(["profile", str(GOLDEN)]) == 1
    assert "attn_only_2l.circ" in capsys.readouterr().err


# ------------------------------------------------------------ every failure is one line


def _one_line(err: str, prefix: str) -> str:
    """The message, checked to be one line starting with ``prefix``, no traceback."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(prefix) and "Traceback" not in err, err
    return err


TOO_BIG_SEED = str(2**64)  # torch's seeds end at 2**64 - 1


@pytest.mark.parametrize(
    "args, status, words",
    [
        (["profile", "{circ}", "--trace", "/no/dir/x.json"], 2, "no directory /no/dir"),
        (["parity", "--seed", "99999999999999999999"], 2, "argument --seed: expected a whole number"),
    ],
    ids=["profile-trace-in-no-directory", "parity-seed"],
)
def test_the_reported_failures_are_one_line_in_a_subprocess(saved, args, status, words):
    """The two commands of issue 28 that printed tracebacks, as a user runs them."""
    path, _ = saved
    result = _run(*(a.format(circ=path) for a in args))
    assert result.returncode == status and result.stdout == b""
    err = _one_line(result.stderr.decode(), f"circuits {args[0]}: ")
    assert words in err


@pytest.mark.parametrize(
    "args, words",
    [
        ([], "the following arguments are required: COMMAND"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["print"], "the following arguments are required: FILE"),
        (["print", "{circ}", "--depth", "x"], "argument --depth: expected a whole number, got 'x'"),
        (["cost", "{circ}", "--by", "block"], "argument --by: invalid choice: 'block'"),
        (["profile", "{circ}", "--top", "-1"], "argument --top: expected 0 or more, got -1"),
        (["profile", "{circ}", "--trace", "{tmp}"], "is a directory; expected a file name"),
        (["profile", "{circ}", "--trace", "{circ}/x.json"], "no directory"),  # the parent is a file
        (["demo", "--batch-size", "10000000000"], "argument --batch-size: expected at most 4096"),
        (["demo", "--block-len", "0"], "argument --block-len: expected 1 or more, got 0"),
        (["demo", "--seed", "1.5"], "argument --seed: expected a whole number from -2**63 to 2**64 - 1"),
        (["demo", "--seed", TOO_BIG_SEED], "argument --seed: expected a whole number"),
        (["demo", "--seed", str(-(2**63) - 1)], "argument --seed: expected a whole number"),
        (["parity", "--seed", TOO_BIG_SEED], "argument --seed: expected a whole number"),
        (["parity", "--family", "gpt3"], "argument --family: invalid choice: 'gpt3'"),
        (["parity", "--size", "huge"], "argument --size: invalid choice: 'huge'"),
        (["parity", "--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    ],
)
def test_usage_mistakes_are_one_line_with_status_2(saved, tmp_path, capsys, args, words):
    path, _ = saved
    with pytest.raises(SystemExit) as caught:
        main([a.format(circ=path, tmp=tmp_path) for a in args])
    assert caught.value.code == 2
    command = f"circuits {args[0]}: " if args and args[0] != "frobnicate" else "circuits: "
    err = _one_line(capsys.readouterr().err, command)
    assert words in err and err.endswith("--help)\n")


@pytest.mark.parametrize(
    "args, prefix, words",
    [
        (["demo", "--block-len", "40"], "circuits demo: ", "block_len 40"),
        (
            ["profile", "{circ}", "--trace", "/dev/full"],
            "circuits profile: /dev/full: ",
            "cannot write the trace",
        ),
        (["cost", "{tmp}/missing.circ"], "{tmp}/missing.circ: ", "no such file"),
    ],
    ids=["demo-block-len", "profile-trace-unwritable", "cost-missing-file"],
)
def test_command_failures_are_one_line_with_status_1(saved, tmp_path, capsys, args, prefix, words):
    path, _ = saved
    if "/dev/full" in args and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")  # a device that refuses every write (Linux, BSDs)
    assert main([a.format(circ=path, tmp=tmp_path) for a in args]) == 1
    err = _one_line(capsys.readouterr().err, prefix.format(tmp=tmp_path))
    assert words in err


def test_the_seeds_torch_takes_are_taken():
    """The range torch's generators take, and a ModelError naming the seed beyond it (torch's own
    refusal is a ValueError about 'long long'), from the functions under the commands too."""
    from circuits.models.common import check_seed
    from circuits.models.demo_model import repeated_tokens
    from circuits.cli.parity import hf_model, parity_tokens

    for seed in (-(2**63), 0, 2**64 - 1):
        assert check_seed(seed) == seed
        torch.Generator().manual_seed(seed)  # torch agrees
    assert torch.equal(repeated_tokens(2, 3, seed=2**64 - 1), repeated_tokens(2, 3, seed=2**64 - 1))
    for bad in (2**64, -(2**63) - 1, 1.0, True, "3"):
        with pytest.raises(cc.errors.ModelError, match="is not a seed"):
            check_seed(bad)
    for make in (lambda: repeated_tokens(2, 3, seed=2**64), lambda: parity_tokens(seed=2**64)):
        with pytest.raises(cc.errors.ModelError, match="seed=18446744073709551616 is not a seed"):
            make()
    with pytest.raises(cc.errors.ModelError, match="seed=-9223372036854775809 is not a seed"):
        hf_model("gpt2", seed=-(2**63) - 1)
