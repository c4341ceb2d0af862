"""``ex.edge_circuit`` and ``ex.edge_attribution`` (issue 32 items 1, 2 and 5's part): the edge
rewrite against the model, one edge removed against a plain-torch reference on the Hugging Face
model (tests/edge_reference.py), EAP and EAP-IG scores against the same reference, and the typed
errors."""

from __future__ import annotations

import pytest
import torch

import circuits.experiments as ex
import circuits.models as cm
from circuits.errors import ExperimentError
from circuits.passes import split_heads

import edge_reference as ref
import factories as f

VOCAB = f.FAMILY_VOCAB


def _gpt2(dtype=torch.float64, **fields):
    """Odd sizes: 2 layers of 3 heads of 5 dims, biases and norms moved."""
    fields = dict(dict(n_layer=2, n_head=3, n_embd=15), **fields)
    return f.gpt2(perturb=f.scaled_weights, **fields).to(dtype)


def _llama(dtype=torch.float64, **fields):
    """Grouped-query attention: 2 layers of 4 query heads on 2 key/value heads of 6 dims."""
    fields = dict(
        dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=24, intermediate_size=14), **fields
    )
    return f.llama(kv_heads=fields.pop("kv_heads", 2), perturb=f.scaled_weights, **fields).to(dtype)


FAMILIES = {"gpt2": (_gpt2, ref.gpt2_forward), "llama": (_llama, ref.llama_forward)}


def _tokens(seed: int, shape=(3, 7)) -> torch.Tensor:
    return f.token_ids(VOCAB, shape, seed=seed)


def _logits(circuit) -> torch.Tensor:
    return circuit.get_unique("t.call").evaluate()


def _metric(logits: torch.Tensor) -> torch.Tensor:
    """Non-linear in the logits, reading two positions: gradients that change along an IG path."""
    return logits.log_softmax(-1)[:, -1, 3].sum() - 0.5 * logits[:, 2, 5].mean()


# ------------------------------------------------------------------ item 1: the rewrite


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("split", [False, True])
def test_masks_at_one_equal_the_model(family, dtype, tol, split):
    hf = FAMILIES[family][0](dtype)
    c = cm.from_hf(hf, _tokens(0))
    for masked in (True, False):
        edges = ex.edge_circuit(split_heads(c) if split else c, masked=masked)
        assert (_logits(edges.circuit) - _logits(c)).abs().max() <= tol
        assert (edges.circuit.evaluate() - c.evaluate()).abs().max() <= tol  # the loss too


OTHER_FAMILIES = {
    "neox_parallel": lambda: f.neox(parallel=True),  # the MLP reads the stream before the heads
    "neox_sequential": lambda: f.neox(parallel=False),
    "qwen2": f.qwen2,
    "mistral": f.mistral,
    "gemma": f.gemma,
    "opt": f.opt,
}


@pytest.mark.parametrize("family", sorted(OTHER_FAMILIES))
def test_masks_at_one_equal_the_model_in_other_families(family):
    c = cm.from_hf(OTHER_FAMILIES[family]().double(), _tokens(0, (2, 6)))
    edges = ex.edge_circuit(c)
    assert (_logits(edges.circuit) - _logits(c)).abs().max() <= 1e-10


def test_parallel_attention_mlp_reads_only_the_earlier_layers():
    edges = ex.edge_circuit(cm.from_hf(f.neox(parallel=True).double(), _tokens(0, (2, 6))))
    assert edges.receiver("b1.m").n_senders == edges.senders.index("b1.a.head0")
    sequential = ex.edge_circuit(cm.from_hf(f.neox(parallel=False).double(), _tokens(0, (2, 6))))
    assert sequential.receiver("b1.m").n_senders == sequential.senders.index("b1.m")


def test_the_shipped_attention_only_model():
    c = cm.load_demo_model(_tokens(0, (2, 6)) % 10)
    edges = ex.edge_circuit(c)
    assert edges.senders[0] == "idxed_embeds" and len(edges.receivers) == 2 * 4 * 3 + 1
    got = edges.circuit.get_unique("t.call").evaluate(dtype=torch.float64)
    assert (got - c.get_unique("t.call").evaluate(dtype=torch.float64)).abs().max() <= 1e-10


def test_a_post_norm_over_the_heads_is_refused():
    with pytest.raises(ExperimentError, match="post-norm"):
        ex.edge_circuit(cm.from_hf(f.gemma2().double(), _tokens(0, (2, 6))))


def test_edges_of_gpt2_are_every_sender_before_every_receiver():
    edges = ex.edge_circuit(cm.from_hf(_gpt2(), _tokens(0)))
    heads = [f"b{layer}.a.head{h}" for layer in range(2) for h in range(3)]
    assert edges.senders == ("embeds", *heads[:3], "b0.m", *heads[3:], "b1.m")
    receivers = [r.name for r in edges.receivers]
    assert receivers[:3] == ["b0.a.head0.q", "b0.a.head0.k", "b0.a.head0.v"]
    assert receivers[-2:] == ["b1.m", "t.call"] and len(receivers) == 2 * (3 * 3 + 1) + 1
    # 9 receivers read the embeddings alone, b0.m 4 senders, layer 1's heads 5, b1.m 8, the logits 9
    assert len(edges.edges) == 9 * 1 + 4 + 9 * 5 + 8 + 9
    assert edges.edge("b0.a.head2->b1.a.head1.k").index == 3


def test_grouped_query_attention_keeps_one_key_and_value_receiver_per_kv_head():
    edges = ex.edge_circuit(cm.from_hf(_llama(), _tokens(0)))
    layer0 = [r.name for r in edges.receivers if r.layer == 0]
    assert layer0 == [
        "b0.a.head0.q",
        "b0.a.kv0.k",
        "b0.a.kv0.v",
        "b0.a.head1.q",
        "b0.a.head2.q",
        "b0.a.kv1.k",
        "b0.a.kv1.v",
        "b0.a.head3.q",
        "b0.m",
    ]


def test_the_printed_circuit_names_masks_and_senders():
    edges = ex.edge_circuit(cm.from_hf(_gpt2(n_layer=1), _tokens(0)))
    text = edges.circuit.repr()
    assert "'edges->b0.m' Add" in text  # the attention output bias, always on, added to the masked sum
    assert "'edges.mask->b0.m' [4] Array" in text
    assert "'edges.senders<4' Concat 0" in text and "'b0.a.head2.stacked' Rearrange" in text


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_one_edge_at_zero_is_that_sender_removed_from_that_receiver(family):
    make, forward = FAMILIES[family]
    hf, tokens = make(), _tokens(1)
    edges = ex.edge_circuit(cm.from_hf(hf, tokens))
    kv = "head1" if family == "gpt2" else "kv0"
    for edge in [
        f"b0.a.head2->b1.a.{kv}.k",
        "b0.a.head0->b1.a.head1.q",
        f"{edges.senders[0]}->b1.m",
        "b1.m->t.call",
    ]:
        expected = forward(hf, tokens[:, :-1], drop={edge}).logits
        got = _logits(edges.without_edges([edge]).circuit)
        assert (got - expected).abs().max() < 1e-9, edge
        assert (got - _logits(edges.circuit)).abs().max() > 1e-4, edge  # the edge matters


def test_the_reference_is_the_model():
    for make, forward in FAMILIES.values():
        hf, tokens = make(), _tokens(2)
        tolerance = 1e-12 if forward is ref.gpt2_forward else 1e-5  # Hugging Face's RMSNorm is float32
        assert (forward(hf, tokens).logits - hf(tokens).logits).abs().max() < tolerance


def test_per_position_masks_remove_an_edge_at_one_position():
    hf, tokens = _gpt2(), _tokens(1)
    edges = ex.edge_circuit(cm.from_hf(hf, tokens), per_position=True)
    assert _logits(edges.circuit).sub(_logits(cm.from_hf(hf, tokens))).abs().max() < 1e-10
    mask = torch.ones(9, 6, dtype=torch.float64)
    mask[4, 3] = 0  # b0.m -> t.call at position 3 only
    got = _logits(edges.with_masks({"t.call": mask}).circuit)
    full = ref.gpt2_forward(hf, tokens[:, :-1], drop={"b0.m->t.call"}).logits
    clean = ref.gpt2_forward(hf, tokens[:, :-1]).logits
    assert (got[:, 3] - full[:, 3]).abs().max() < 1e-9
    assert (got[:, [0, 1, 2, 4, 5]] - clean[:, [0, 1, 2, 4, 5]]).abs().max() < 1e-9


# ------------------------------------------------------------------ item 2: EAP and EAP-IG


def _compare(scores, expected: dict[str, float]) -> float:
    assert sorted(e.name for e in scores.edges) == sorted(expected)
    return max(abs(float(scores[name]) - value) for name, value in expected.items())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_eap_equals_the_reference(family):
    make, forward = FAMILIES[family]
    hf, clean, corrupted = make(), _tokens(3), _tokens(4)
    scores = ex.edge_attribution(cm.from_hf(hf, clean), {"toks_int_var": corrupted}, _metric)
    expected = ref.eap(forward, hf, clean[:, :-1], corrupted[:, :-1], _metric)
    assert _compare(scores, expected) < 1e-9
    assert max(abs(v) for v in expected.values()) > 1e-2  # scores far from zero


@pytest.mark.slow  # the reference runs 3 steps per unit of senders
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["eap-ig-inputs", "eap-ig-activations"])
def test_eap_ig_equals_the_reference(family, method):
    make, forward = FAMILIES[family]
    hf, clean, corrupted = make(num_hidden_layers=2) if family == "llama" else make(), _tokens(5), _tokens(6)
    scores = ex.edge_attribution(
        cm.from_hf(hf, clean), {"toks_int_var": corrupted}, _metric, method=method, steps=3
    )
    reference = ref.eap_ig_inputs if method == "eap-ig-inputs" else ref.eap_ig_activations
    expected = reference(forward, hf, clean[:, :-1], corrupted[:, :-1], _metric, 3)
    assert _compare(scores, expected) < 1e-9
    eap = ref.eap(forward, hf, clean[:, :-1], corrupted[:, :-1], _metric)
    assert max(abs(expected[n] - eap[n]) for n in eap) > 1e-3  # IG is not EAP here


def test_eap_per_position_sums_to_eap_and_prints_as_comments():
    hf, clean, corrupted = _gpt2(), _tokens(3), _tokens(4)
    edges = ex.edge_circuit(cm.from_hf(hf, clean))
    total = ex.edge_attribution(edges, {"toks_int_var": corrupted}, _metric)  # the masked circuit's
    assert _compare(total, ref.eap(ref.gpt2_forward, hf, clean[:, :-1], corrupted[:, :-1], _metric)) < 1e-9
    by_pos = ex.edge_attribution(edges, {"toks_int_var": corrupted}, _metric, per_position=True)
    assert by_pos.scores.shape == (len(edges.edges), 6)
    assert (by_pos.scores.sum(-1) - total.scores).abs().max() < 1e-12
    frame = total.to_pandas()
    assert list(frame.columns) == ["edge", "sender", "receiver", "score"] and len(frame) == len(edges.edges)
    top_sender, top_score = max(
        ((e.sender, float(total[e.name])) for e in edges.edges if e.receiver == "t.call"),
        key=lambda p: abs(p[1]),
    )
    text = edges.circuit.repr(comment=total.comment)
    assert f"'edges->t.call' Add  # {top_sender} {top_score:+.4g}" in text


def test_a_logit_diff_metric_without_push_down_equals_a_function_of_the_logits():
    hf, clean, corrupted = _gpt2(), _tokens(3), _tokens(4)
    c = cm.from_hf(hf, clean)
    metric = ex.logit_diff(-1, good=3, bad=5, push_down=False)
    scores = ex.edge_attribution(c, {"toks_int_var": corrupted}, metric)
    expected = ref.eap(
        ref.gpt2_forward, hf, clean[:, :-1], corrupted[:, :-1], lambda x: (x[:, -1, 3] - x[:, -1, 5]).mean()
    )
    assert _compare(scores, expected) < 1e-9


# ------------------------------------------------------------------ bad input


def test_bad_inputs_are_typed_errors_naming_the_argument():
    c = cm.from_hf(_gpt2(), _tokens(3))
    corrupted = {"toks_int_var": _tokens(4)}
    with pytest.raises(ExperimentError, match="does not depend on the edges"):
        ex.edge_attribution(c, corrupted, lambda logits: torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ExperimentError, match="corrupted_inputs"):
        ex.edge_attribution(c, {"toks_int_var": _tokens(4, (3, 6))}, _metric)
    with pytest.raises(ExperimentError, match="change nothing"):
        ex.edge_attribution(c, {"toks_int_var": _tokens(3)}, _metric)
    with pytest.raises(ExperimentError, match="method"):
        ex.edge_attribution(c, corrupted, _metric, method="acdc")
    with pytest.raises(ExperimentError, match="steps"):
        ex.edge_attribution(c, corrupted, _metric, method="eap-ig-inputs", steps=0)
    with pytest.raises(ExperimentError, match="push_down=False"):
        ex.edge_attribution(c, corrupted, ex.logit_diff(-1, good=3, bad=5))
    edges = ex.edge_circuit(c)
    for bad in ["b1.m->b0.m", "nothing->t.call", "embeds->b9.m", "embeds"]:
        with pytest.raises(ExperimentError, match="no (edge|receiver)"):
            edges.without_edges([bad])
    with pytest.raises(ExperimentError, match="masks\\['t.call'\\]"):
        edges.with_masks({"t.call": torch.ones(3)})
    scores = ex.edge_attribution(edges, corrupted, _metric)
    with pytest.raises(ExperimentError, match="'b1.m->b0.m'"):
        scores["b1.m->b0.m"]


@pytest.mark.parametrize("targets", ["clean", "corrupted"])
def test_mean_loss_scores_the_next_tokens_its_targets_name(targets):
    hf, clean, corrupted = _gpt2(), _tokens(3), _tokens(4)
    metric = ex.mean_loss.with_targets(targets)
    scores = ex.edge_attribution(cm.from_hf(hf, clean), {"toks_int_var": corrupted}, metric)
    next_tokens = (clean if targets == "clean" else corrupted)[:, 1:]

    def loss(logits):
        return -logits.log_softmax(-1).gather(-1, next_tokens[..., None]).mean()

    assert _compare(scores, ref.eap(ref.gpt2_forward, hf, clean[:, :-1], corrupted[:, :-1], loss)) < 1e-9
