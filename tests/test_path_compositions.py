"""``ex.path_terms(c, order=2+)``: each head's Q, K and V inputs as sums of named source terms.

Checked against the attention-only model written in torch (tests/experiments_reference.py) with the
norm scales frozen at their clean values: zero-ablating one composition term (head 0.1 into head
1.2's keys, the embedding into a value input, ...) gives the logits torch computes when that
source is left out of that one input.  On GPT-2 (odd dims), the demo model and a small Llama the
terms still sum to the logits, and each role's Add equals the input the head really reads.
"""

from __future__ import annotations

import factories
import pytest
import torch
from experiments_reference import CONFIG, split_circuit, tokens, weights
from test_path_terms import MODELS, TOL, gpt2, logits_at

import circuits as cc
from circuits import experiments as ex
from circuits.errors import ExperimentError
from circuits.transformer.points import Point

EPS = 1e-5


def _normed(x, scale, weight, bias):
    """Layer norm of ``x`` with its scale ``1/sqrt(var + eps)`` given (frozen)."""
    return (x - x.mean(-1, keepdim=True)) * scale * weight + bias


def _scale(x):
    return 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + EPS)


def _attend(w, layer, head, q_in, k_in, v_in):
    """One head's output ``[B, S, d]`` from its three (normed) inputs, causally masked."""
    q = q_in @ w[f"a{layer}.w.q"][head].T
    k = k_in @ w[f"a{layer}.w.k"][head].T
    v = v_in @ w[f"a{layer}.w.v"][head].T
    seq = q.shape[1]
    scores = (q @ k.transpose(-1, -2)) / CONFIG.d_head**0.5
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return (probs @ v) @ w[f"a{layer}.w.o"][head].T


def _layer0(w, toks):
    """The residual stream's sources entering layer 1 (``'embed'``, ``'L0H{h}'``) and the positions."""
    inputs = toks[:, :-1]
    embed, pos_embed = w["t.w.tok_embeds"][inputs], w["t.w.pos_embeds"][: inputs.shape[1]]
    norm0 = _normed(embed, _scale(embed), w["a0.ln.w.scale"], w["a0.ln.w.bias"])
    sources = {"embed": embed}
    for head in range(CONFIG.n_heads):
        sources[f"L0H{head}"] = _attend(w, 0, head, norm0 + pos_embed, norm0 + pos_embed, norm0)
    return sources, pos_embed


def _final_resid(w, sources, pos_embed, dropped):
    """The final residual stream, layer 1's norm scale frozen, each ``(head, role, source)`` in
    ``dropped`` left out of that head's ``role`` input."""
    resid1 = sum(sources.values())
    scale1 = _scale(resid1)
    final = resid1
    for head in range(CONFIG.n_heads):
        role_inputs = []
        for role in "qkv":
            kept = sum(x for label, x in sources.items() if (head, role, label) not in dropped)
            role_input = _normed(kept, scale1, w["a1.ln.w.scale"], 0)
            if (head, role, "ln_bias") not in dropped:
                role_input = role_input + w["a1.ln.w.bias"]
            if role != "v" and (head, role, "pos_embed") not in dropped:
                role_input = role_input + pos_embed
            role_inputs.append(role_input)
        final = final + _attend(w, 1, head, *role_inputs)
    return final


def frozen_logits(w, toks, pos, dropped=frozenset()):
    """The logits at ``pos`` with layer 1's and the final norm's scales frozen at the clean run's."""
    sources, pos_embed = _layer0(w, toks)
    final = _final_resid(w, sources, pos_embed, dropped)
    clean_scale = _scale(_final_resid(w, sources, pos_embed, frozenset()))
    normed = _normed(final, clean_scale, w["final.ln.w.scale"], w["final.ln.w.bias"])
    return (normed @ w["t.w.unembed"].T)[:, pos]


@pytest.fixture(scope="module")
def reference():
    # The random weights are small (std 0.02); scaled up, every composition visibly matters.
    w, toks = {name: 8 * value for name, value in weights(0).items()}, tokens(3)
    return w, toks, ex.path_terms(split_circuit(w, toks), pos=-1, order=2)


def test_the_frozen_reference_is_the_model(reference):
    w, toks, result = reference
    torch.testing.assert_close(result.terms.evaluate(), frozen_logits(w, toks, -1), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "dropped",
    [
        (2, "k", "L0H1"),  # K-composition: head 0.1 into head 1.2's keys
        (0, "q", "L0H2"),  # Q-composition
        (1, "v", "L0H0"),  # V-composition
        (1, "v", "embed"),
        (0, "k", "pos_embed"),  # attention-only models add positions to Q and K after the norm
        (2, "q", "ln_bias"),
    ],
)
def test_zero_ablating_a_composition_term_leaves_that_source_out_of_that_input(reference, dropped):
    w, toks, result = reference
    head, role, source = dropped
    ablated = ex.zero_ablate(result.terms, f"path.L1H{head}.{role}.{source}")
    expected = frozen_logits(w, toks, -1, {dropped})
    torch.testing.assert_close(ablated.evaluate(), expected, rtol=0, atol=1e-10)
    assert (expected - frozen_logits(w, toks, -1)).abs().max() > 1e-3, "the term must matter"


def test_composition_labels_name_every_source_of_every_role():
    result = ex.path_terms(gpt2(), order=2)  # 2 layers, 3 heads: only layer 1 reads heads
    sources = ["embed", "pos_embed", "L0H0", "L0H1", "L0H2", "0_attn_bias", "0_mlp_out", "ln_bias"]
    expected = [f"L1H{h}.{role}.{s}" for h in range(3) for role in "qkv" for s in sources]
    assert result.compositions == expected
    for label in expected:
        assert result.terms.get(f"path.{label}"), label
    assert ex.path_terms(gpt2()).compositions == []


def gpt2_three_layers() -> cc.Circuit:
    toks = factories.token_ids(17, (2, 7), seed=4)
    return factories.gpt2_circuit(toks, factories.gpt2_config(n_layers=3, n_heads=2), seed=3)


def test_third_order_expands_the_head_sources_again():
    circuit = gpt2_three_layers()
    second, third = (ex.path_terms(circuit, order=order) for order in (2, 3))
    assert "L2H1.k.L1H0.v.L0H1" in third.compositions  # 0.1 -> 1.0's values -> 2.1's keys
    assert not any(label.count(".") > 2 for label in second.compositions)
    assert set(second.compositions) < set(third.compositions)
    for result in (second, third):
        torch.testing.assert_close(result.terms.evaluate(), logits_at(circuit, -1), atol=TOL, rtol=0)
    nested = third.terms.get_unique("path.L2H1.k.L1H0")  # the expanded head 1.0, normed
    assert nested.get("path.L2H1.k.L1H0.v")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_second_order_terms_sum_to_the_logits_and_to_each_input(model):
    circuit = MODELS[model]()
    result = ex.path_terms(circuit, -1, order=2)
    torch.testing.assert_close(result.terms.evaluate(), logits_at(circuit, -1), atol=TOL, rtol=0)
    norm = result.circuit.get_unique("a1.norm").evaluate()
    layer1 = cc.IterativeMatcher("b1.a.head0").then("a.qk_input", term_early_at="a1.norm")
    qk_input = result.circuit.get(layer1)  # attention-only models: the norm plus the positions
    for role in "qkv":
        read = norm if role == "v" or not qk_input else result.circuit.get_unique(layer1).evaluate()
        summed = result.terms.get_unique(f"path.L1H0.{role}").evaluate()
        torch.testing.assert_close(summed, read.expand_as(summed), atol=TOL, rtol=0)


@pytest.mark.parametrize("order", [0, -1, 1.5, "2", True, None])
def test_bad_orders_are_refused_by_name(order):
    with pytest.raises(ExperimentError, match="order="):
        ex.path_terms(gpt2(), order=order)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("order", [1, 2])
def test_the_residual_stream_entering_a_layer_as_terms(model, order):
    circuit = MODELS[model]()
    for layer in (0, 1, 2):  # 2: the final residual stream, the final norm's input
        result = ex.path_terms(circuit, pos=-1, order=order, layer=layer)
        kind = ("resid_pre", layer) if layer < 2 else ("resid_final",)
        expected = circuit.get_unique(Point(*kind)).evaluate()[..., -1, :]
        torch.testing.assert_close(
            result.terms.evaluate(), expected.expand_as(result.terms.evaluate()), atol=TOL, rtol=0
        )
        assert all(child.shape == result.terms.shape for child in result.terms.children)
        heads = [label for label in result.labels if label.startswith("L")]
        assert {int(label[1]) for label in heads} == set(range(layer)), result.labels
    assert "bias" not in result.labels
    with pytest.raises(ExperimentError, match="layer=3"):
        ex.path_terms(circuit, layer=3)
