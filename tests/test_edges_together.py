"""``edge_circuit(masked=False)`` keeps each layer's heads one attention (issue 32 item 6, EAP's
speed): its query, key and value projections read the receivers' views stacked on the head axis
(``'edges.heads->b0.a.q'``), as TransformerLens's ``use_split_qkv_input``.  EAP over that form and
over the split-head form both equal the plain-torch reference on the Hugging Face model
(tests/edge_reference.py); the receivers, their names and order, are the split form's."""

from __future__ import annotations

import pytest
import torch

import circuits.experiments as ex
import circuits.models as cm
from circuits.passes import split_heads

import edge_reference as ref
import factories as f

REFERENCES = {"gpt2": ref.gpt2_forward, "llama": ref.llama_forward}


def _model(family: str):
    if family == "gpt2":  # odd sizes: 2 layers of 3 heads of 5 dims
        return f.gpt2(perturb=f.scaled_weights, n_layer=2, n_head=3, n_embd=15).double()
    return f.llama(  # grouped-query attention: 4 query heads on 2 key/value heads
        kv_heads=2,
        perturb=f.scaled_weights,
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_size=24,
        intermediate_size=14,
    ).double()


def _tokens(seed: int, shape=(3, 7)) -> torch.Tensor:
    return f.token_ids(f.FAMILY_VOCAB, shape, seed=seed)


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1)[:, -1, 3].sum() - 0.5 * logits[:, 2, 5].mean()


def _named(circuit) -> dict:
    from circuits.core.traversal import unique_nodes

    return {node.name: node for node in unique_nodes([circuit]) if node.name}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_unmasked_form_stacks_each_layers_receivers_on_the_head_axis(family):
    hf = _model(family)
    c = cm.from_hf(hf, _tokens(0))
    together = ex.edge_circuit(c, masked=False)
    apart = ex.edge_circuit(split_heads(c), masked=False)
    assert [r.name for r in together.receivers] == [r.name for r in apart.receivers]
    assert [(r.kind, r.layer, r.head, r.n_senders) for r in together.receivers] == [
        (r.kind, r.layer, r.head, r.n_senders) for r in apart.receivers
    ]
    assert together.senders == apart.senders
    named = _named(together.circuit)
    heads, kv_heads = hf.config.num_attention_heads, getattr(hf.config, "num_key_value_heads", None)
    kv_heads = kv_heads or heads
    for layer in range(2):
        assert named[f"edges.heads->b{layer}.a.q"].shape[0] == heads
        assert named[f"edges.heads->b{layer}.a.k"].shape[0] == kv_heads  # GQA stays grouped
        assert named[f"edges.heads->b{layer}.a.v"].shape[0] == kv_heads
    assert not any(name.startswith("a0.w.q.head") for name in named)  # no weight per head
    for receiver in together.receivers:  # every receiver's view is in the circuit, by its name
        assert named[receiver.input.name] == receiver.input
    logits = together.circuit.get_unique("t.call").evaluate()
    assert (logits - c.get_unique("t.call").evaluate()).abs().max() < 1e-10
    model_logits = together.model.get_unique("t.call").evaluate()  # the senders' model: heads apart
    assert (model_logits - c.get_unique("t.call").evaluate()).abs().max() < 1e-10
    assert "b1.a.head0" in _named(together.model)


@pytest.mark.slow  # the reference and two attributions (the fast suite has tests/test_edges.py's)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_eap_with_heads_together_or_split_equals_the_reference(family):
    hf, clean, corrupted = _model(family), _tokens(3), _tokens(4)
    expected = ref.eap(REFERENCES[family], hf, clean[:, :-1], corrupted[:, :-1], _metric)
    c = cm.from_hf(hf, clean)
    for circuit in (c, split_heads(c)):
        scores = ex.edge_attribution(circuit, {"toks_int_var": corrupted}, _metric)
        assert sorted(e.name for e in scores.edges) == sorted(expected)
        assert max(abs(float(scores[name]) - value) for name, value in expected.items()) < 1e-9
    assert max(abs(v) for v in expected.values()) > 1e-2


def test_the_attention_only_model_stacks_its_norm_plus_positions():
    """The shipped model's queries and keys read the norm plus the position embeddings: each
    receiver's copy of that sum is stacked; the circuit computes the model."""
    c = cm.load_demo_model(_tokens(0, (2, 6)) % 10)
    together = ex.edge_circuit(c, masked=False)
    assert "edges.heads->b0.a.q" in _named(together.circuit)
    got = together.circuit.get_unique("t.call").evaluate(dtype=torch.float64)
    assert (got - c.get_unique("t.call").evaluate(dtype=torch.float64)).abs().max() <= 1e-10


@pytest.mark.slow  # the reference's EAP
def test_the_comments_name_each_receiver_of_the_stacked_form():
    hf, clean, corrupted = _model("gpt2"), _tokens(3), _tokens(4)
    edges = ex.edge_circuit(cm.from_hf(hf, clean), masked=False)
    scores = ex.edge_attribution(edges, {"toks_int_var": corrupted}, _metric)
    expected = ref.eap(ref.gpt2_forward, hf, clean[:, :-1], corrupted[:, :-1], _metric)
    top = max(
        (
            (s, v)
            for s, v in ((n.split("->")[0], v) for n, v in expected.items() if n.endswith("->b1.a.head2.q"))
        ),
        key=lambda p: abs(p[1]),
    )
    text = edges.circuit.repr(comment=scores.comment)
    assert f"'edges.normed->b1.a.head2.q' Einsum bpd->bpd  # {top[0]} {top[1]:+.4g}" in text
