"""The shipped induction model and the demo's ablation table, checked against its attention patterns."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

import circuits as cc
from circuits.cli import demo
from circuits.cli import main
from circuits.models import load_demo_model
from circuits.models.demo_model import demo_config, load_demo_weights, repeated_tokens
from circuits.passes import layer_of

BLOCK = 32


@pytest.fixture(scope="module")
def result() -> demo.DemoResult:
    return demo.head_effects(batch_size=16, block_len=BLOCK, seed=0)


@pytest.fixture(scope="module")
def patterns(result) -> dict[int, torch.Tensor]:
    """Each layer's attention probabilities [B, head, query, key], from the circuit's 'a.attn_probs'."""
    masked = cc.passes.causal_mask(load_demo_model(result.tokens))
    nodes = {layer_of(node): node for node in masked.get("a.attn_probs")}
    return {layer: node.evaluate() for layer, node in nodes.items()}


def _induction_score(probs: torch.Tensor, inputs: torch.Tensor) -> float:
    """Mean attention, over second-copy queries, on the token after the query token's previous occurrence."""
    total, count = 0.0, 0
    for row in range(inputs.shape[0]):
        for query in range(inputs.shape[1]):
            earlier = [j for j in range(query) if inputs[row, j] == inputs[row, query]]
            if earlier:
                total += sum(probs[row, query, j + 1].item() for j in earlier)
                count += 1
    return total / count


def test_shipped_files_are_package_data_and_small():
    data = resources.files("circuits").joinpath("data")
    weights = data.joinpath("induction_2l.safetensors")
    assert len(weights.read_bytes()) < 5_000_000
    info = json.loads(data.joinpath("induction_2l.json").read_text())
    assert info["seed"] == 0 and "scripts/train_induction.py" in info["training"]["command"]
    config = demo_config()
    assert (config.n_layers, config.n_heads) == (2, 4)
    shapes = {name: tuple(t.shape) for name, t in load_demo_weights().items()}
    expected = {n: s for n, s in config.weight_shapes().items() if n != "t.w.unembed_bias"}
    assert shapes == expected


def test_tokens_are_bos_block_block():
    tokens = repeated_tokens(3, 5, seed=1)
    assert tokens.shape == (3, 11)
    assert (tokens[:, 0] == 0).all()
    assert torch.equal(tokens[:, 1:6], tokens[:, 6:])
    assert all(len(set(row[1:6].tolist())) == 5 for row in tokens)


def test_loss_halves(result):
    assert result.first_half_loss > 3.5  # random tokens: about ln 63
    assert result.second_half_loss < 0.1  # repeats
    assert result.circuit.are_any_found("b1.a.head0")  # split into heads


def test_top_head_by_ablation_is_an_induction_head(result, patterns):
    top = result.ranked()[0]
    assert top.layer == 1
    assert top.increase > 1.0
    inputs = result.tokens[:, :-1]
    score = _induction_score(patterns[1][:, top.head], inputs)
    assert score > 0.8, f"{top.name} puts only {score:.2f} of its attention on induction targets"
    assert score == pytest.approx(top.induction, abs=1e-4)  # the demo's own score agrees
    # it stands out: no other head comes close
    assert top.increase > 3 * result.ranked()[1].increase


def test_layer0_head_it_needs_most_is_a_previous_token_head(result, patterns):
    needed = max((h for h in result.heads if h.layer == 0), key=lambda h: h.increase)
    assert needed.increase > 0.1
    probs = patterns[0][:, needed.head]  # [B, q, k]
    first_copy = torch.arange(1, BLOCK + 1)  # queries whose token is new
    to_previous = probs[:, first_copy, first_copy - 1]
    assert to_previous.mean().item() > 0.5
    assert to_previous.mean().item() == pytest.approx(needed.prev_token, abs=1e-4)
    # and it is the position before, more than any other offset
    for offset in (0, 2, 3):
        keys = (first_copy - offset).clamp(min=0)
        assert probs[:, first_copy, keys].mean() < to_previous.mean()


def test_demo_command_prints_the_table(capsys):
    assert main(["demo", "--batch-size", "4", "--depth", "2"]) == 0
    out = capsys.readouterr().out
    assert "'t.loss' Einsum a,->a" in out
    assert "first half" in out and "second half" in out
    assert out.count(".a.head") >= 8 and "most needed" in out
