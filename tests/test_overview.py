"""``overview``: one line per component, read off the names; checked against the config that built it."""

from __future__ import annotations

import re

import factories
import pytest
import torch

import circuits as cc
from circuits.experiments.overview import overview
from circuits.models.llama import LlamaConfig, build_llama, llama_random_weights


@pytest.fixture(scope="module")
def gpt2():
    config = factories.gpt2_config(n_heads=4, d_model=16, vocab_size=23)
    return config, factories.gpt2_circuit(torch.randint(0, 23, (2, 9)), config)


def test_gpt2_overview_lists_each_layer_with_the_configs_shapes(gpt2):
    config, circuit = gpt2
    text = overview(circuit)
    lines = text.splitlines()
    assert lines[0].startswith("Einsum 't.loss' [2,8]: 2 layers")
    for layer in range(config.n_layers):
        assert f"  ({layer})" in lines
        assert f"    attention: 'b{layer}.a' [2,8,16] Einsum  (4 heads, unsplit" in text
        assert f"    MLP: 'b{layer}.m' [2,8,16] Add" in lines
    d_head = config.d_model // config.n_heads
    assert f"q [{config.n_heads},{d_head},{config.d_model}]" in text
    assert f"proj_in [{4 * config.d_model},{config.d_model}]" in text
    assert f"  logits: 't.call' [2,8,{config.vocab_size}] Einsum" in lines
    assert "(0 outside the model naming convention)" in lines[0]


def test_split_heads_show_as_branches(gpt2):
    _, circuit = gpt2
    text = overview(cc.passes.split_heads(circuit, layers=[1]))
    assert (
        "attention: 'b1.a' [2,8,16] Add  (4 heads split into 4 branches: head0, head1, head2, head3)" in text
    )
    assert "attention: 'b0.a' [2,8,16] Einsum  (4 heads, unsplit" in text


def test_llama_and_unnamed_nodes():
    config = LlamaConfig(n_layers=1, n_heads=4, n_kv_heads=2, d_model=16, d_mlp=24, vocab_size=11)
    circuit = build_llama(config, llama_random_weights(config), torch.randint(0, 11, (5,)))
    wrapped = cc.Add(circuit, cc.Scalar(1.0, shape=circuit.shape))  # one node outside the convention
    text = overview(wrapped)
    outside = int(re.search(r"\((\d+) outside", overview(circuit)).group(1))
    assert (
        "1 layers" in text and f"({outside + 2} outside the model naming convention)" in text
    )  # Add, Scalar
    assert "  (0)" in text and "MLP: 'b0.m'" in text
    with pytest.raises(cc.errors.NodeTypeError, match="overview: the circuit is a str"):
        overview("t.loss")


def test_a_circuit_without_layer_names_says_why_it_finds_no_layers():
    x = cc.Array(torch.randn(2, 3), name="x")
    text = overview(cc.Einsum.from_einsum_string("ab,ab->a", x, x, name="sq"))
    assert text.startswith("Einsum 'sq' [2]: 0 layers: no node is named in the model naming convention")
    assert "nor after a module (from_torch)" in text
    # nodes named after modules, none of them numbered (a model without a list of layers)
    named = cc.Add(cc.Add(x, name="encoder"), name="head")
    assert "nor after a numbered module ('transformer.h.0')" in overview(named)
