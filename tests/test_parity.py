"""The gradient parity report (circuits.cli.parity): every parameter listed and within target, and a
wrong circuit reported as a miss (run ``pytest -s`` to see the measured figures)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

import circuits as cc
from circuits.cli import parity
from circuits.errors import ModelError
from circuits.passes import split_heads

pytest.importorskip("transformers")

MEASURED: dict[str, tuple[float, float, float]] = {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_parameter_within_target(family, dtype):
    report = parity.gradient_parity(family, "tiny", dtype, seed=0)
    names = [name for name, _ in parity.hf_model(family, "tiny", dtype).named_parameters()]
    assert [row.name for row in report.rows] == names
    if family == "llama":
        assert any("k_proj" in n for n in names) and report.rows[0].name == "model.embed_tokens.weight"
    misses = [row for row in report.rows if not row.ok]
    assert not misses and report.loss_ok and report.ok, misses
    limit = 1e-9 if dtype == torch.float64 else 1e-5
    if dtype == torch.float64:
        assert max(row.max_abs_diff for row in report.rows) <= limit
        assert report.loss_diff <= limit
    else:
        assert max(row.rel_diff for row in report.rows) <= limit
    worst_abs, worst_rel = report.worst("max_abs_diff"), report.worst("rel_diff")
    MEASURED[f"{family} {dtype}"] = (worst_abs.max_abs_diff, worst_rel.rel_diff, report.loss_diff)


def test_report_measured():
    """Not a check: the figures measured above (pytest -s)."""
    for key, (abs_diff, rel_diff, loss_diff) in sorted(MEASURED.items()):
        print(f"{key}: max_abs_diff {abs_diff:.3e}, rel_diff {rel_diff:.3e}, loss diff {loss_diff:.3e}")


def perturb(name: str, factor: float):
    def edit(circuit: cc.Circuit) -> cc.Circuit:
        return circuit.update(name, lambda n: cc.Array(n.value * factor, name=n.name))

    return edit


def ablate_head(name: str):
    def edit(circuit: cc.Circuit) -> cc.Circuit:
        return split_heads(circuit).update(name, lambda n: cc.Scalar(0.0, shape=n.shape))

    return edit


@pytest.mark.parametrize(
    "family, dtype, edit, missed",
    [
        ("gpt2", torch.float64, perturb("a0.w.q", 1.0 + 1e-6), "transformer.h.0.attn.c_attn.weight"),
        ("llama", torch.float32, perturb("m1.w.up", 1.001), "model.layers.1.mlp.up_proj.weight"),
        ("gpt2", torch.float32, ablate_head("b1.a.head0"), "transformer.h.1.attn.c_attn.weight"),
        ("llama", torch.float64, ablate_head("b0.a.head3"), "model.layers.0.self_attn.q_proj.weight"),
    ],
    ids=["gpt2-f64-perturbed", "llama-f32-perturbed", "gpt2-f32-ablated", "llama-f64-ablated"],
)
def test_a_wrong_circuit_is_a_miss(family, dtype, edit, missed):
    report = parity.gradient_parity(family, "tiny", dtype, edit=edit)
    assert not report.ok
    rows = {row.name: row for row in report.rows}
    assert not rows[missed].ok


def test_a_missing_gradient_is_an_infinite_difference():
    assert parity._differences(None, torch.ones(2)) == (math.inf, math.inf)
    assert parity._differences(None, None) == (0.0, 0.0)
    assert parity._differences(torch.ones(2), torch.zeros(2)) == (1.0, math.inf)


def args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parity.add_arguments(parser)
    return parser.parse_args([f"--{k}={v}" for k, v in overrides.items()])


def test_run_prints_a_line_per_parameter_and_a_summary():
    lines: list[str] = []
    assert parity.run(args(family="llama", dtype="float64"), out=lines.append) == 0
    text = "\n".join(lines)
    names = [name for name, _ in parity.hf_model("llama", "tiny", torch.float64).named_parameters()]
    assert all(any(line.strip().startswith(name + " ") for line in lines) for name in names)
    assert "llama tiny float64: 21 parameters, target max_abs_diff <= 1e-09" in text
    assert lines[-1].startswith("All 1 within target")


def test_run_exits_1_on_a_miss(monkeypatch):
    monkeypatch.setitem(parity.TARGETS, torch.float32, ("rel_diff", -1.0))
    lines: list[str] = []
    assert parity.run(args(family="gpt2", dtype="float32"), out=lines.append) == 1
    assert "<- miss" in "\n".join(lines) and lines[-1].startswith("MISSED: gpt2 float32")


def test_arguments():
    parsed = args(family="gpt2", size="small", dtype="float64", seed=3)
    assert (parsed.family, parsed.size, parsed.dtype, parsed.seed) == ("gpt2", "small", "float64", 3)
    assert (args().family, args().size, args().dtype, args().seed) == ("all", "tiny", "all", 0)
    with pytest.raises(SystemExit):
        args(family="opt")


def test_bad_choices_and_random_state():
    with pytest.raises(ModelError, match="family 'opt'"):
        parity.hf_model("opt")
    with pytest.raises(ModelError, match="size 'huge'"):
        parity.hf_model("gpt2", "huge")
    state = torch.random.get_rng_state()
    parity.hf_model("gpt2")
    assert torch.equal(state, torch.random.get_rng_state())


def test_the_command_line_runs_it(capsys):
    from circuits.cli import main

    assert main(["parity", "--family", "gpt2", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "gpt2 tiny float64" in out and "transformer.wte.weight" in out
    assert out.strip().splitlines()[-1].startswith("All 1 within target")
