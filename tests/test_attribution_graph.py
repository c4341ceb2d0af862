"""Attribution graphs (circuit-tracer's method): the frozen replacement model against the model, and
each adjacency column against the intervention it stands for, done here by rewriting the frozen
circuit (a source's value set to zero) and evaluating the targets: feature pre-activations and
demeaned logits, computed in this file with torch from the frozen circuit's own values; and the
whole graph against circuit-tracer's own (tests/data/circuit_tracer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import circuits.models as cm

from circuits.core.nodes import Array
from circuits.errors import ExperimentError
from circuits.evaluation import evaluate_many
from circuits.experiments import sae as sae_analyses
from circuits import experiments as ex
from circuits.experiments.attribution_freeze import freeze_attention_and_norms, frozen_replacement
from circuits.experiments.attribution_graph import attribution_graph
from circuits.models.sae import SAE, load_sae
from circuits.transformer import names
from factories import gpt2_circuit, llama_circuit, llama_config, token_ids

F = 40  # features per transcoder


def transcoder(
    layer: int,
    d: int,
    seed: int = 0,
    read: str = "ln2.hook_normalized",
    out: str = "hook_mlp_out",
    width: int = F,
):
    """A random JumpReLU transcoder of layer ``layer`` (thresholds in [0, 0.3): some features off)."""
    g = torch.Generator().manual_seed(seed + 100 * layer)
    return SAE(
        "jumprelu_transcoder",
        W_enc=torch.randn(d, width, generator=g) / d**0.5,
        b_enc=torch.randn(width, generator=g) * 0.1,
        W_dec=torch.randn(width, d, generator=g) / width**0.5,
        b_dec=torch.randn(d, generator=g) * 0.1,
        threshold=torch.rand(width, generator=g) * 0.3,
        apply_b_dec_to_input=False,
        hook_name=f"blocks.{layer}.{read}",
        hook_name_out=f"blocks.{layer}.{out}",
    )


def transcoders(n_layers: int, d: int, **kwargs) -> list[SAE]:
    return [transcoder(layer, d, **kwargs) for layer in range(n_layers)]


TOKENS = token_ids(17, (1, 7), seed=5)


def gpt2_model():
    return gpt2_circuit(TOKENS), transcoders(2, 12)


def llama_model():
    return llama_circuit(token_ids(13, (1, 7), seed=6)), transcoders(2, 12)


def gemma2_circuit():
    """Gemma 2's changes on a tiny Llama: sandwich norms, attention and logit soft-caps, (1 + w)
    norm weights, scaled embeddings, a windowed layer."""
    config = llama_config(
        d_model=16,
        rms_unit_offset=True,
        embed_scale=True,
        sandwich_norms=True,
        attn_softcap=2.0,
        final_softcap=3.0,
        sliding_window=3,
        sliding_layers=(0,),
        act="gelu_new",
    )
    return llama_circuit(token_ids(13, (1, 8), seed=7), config)


def targets(frozen, graph, mapping=None) -> torch.Tensor:
    """The graph's targets in the frozen circuit (``mapping``: a rewrite first): each active
    feature's pre-activation, then each logit node's logit minus the mean logit, before the cap."""
    roots = [frozen.readout_input, *frozen.pre_activations]
    if mapping:
        roots = [root.replace(mapping, assert_all_found=False) for root in roots]
    final, *pres = evaluate_many(roots, dtype=torch.float64)
    features = [pres[layer][0, pos, feature] for layer, pos, feature in graph.active_features.tolist()]
    unembed = frozen.unembed.evaluate(dtype=torch.float64)
    logits = unembed @ final[0, -1]
    demeaned = logits[graph.logit_tokens] - logits.mean()
    return torch.cat([torch.stack(features), demeaned])


def zeroed(node: Array, index: tuple) -> dict:
    """``{node: the same Array with the entry (or row) at index set to 0}``."""
    value = node.value.clone()
    value[index] = 0
    return {node: Array(value, name=node.name)}


def check_columns(graph, columns: list[int]) -> None:
    """Each column ``j``: zeroing source ``j`` moves the targets by ``-A[targets, j]``."""
    frozen = graph.replacement
    clean = targets(frozen, graph)
    rows = list(range(graph.n_features)) + list(range(graph.logit_offset, graph.adjacency_matrix.shape[0]))
    tokens_value = frozen.token_embeds.evaluate(dtype=torch.float64).detach()
    for j in columns:
        if j < graph.n_features:
            layer, pos, feature = graph.active_features[j].tolist()
            mapping = zeroed(frozen.acts[layer], (0, pos, feature))
        elif j < graph.token_index(0):
            layer, pos = divmod(j - graph.n_features, graph.n_pos)
            mapping = zeroed(frozen.errors[layer], (0, pos))
        else:
            value = tokens_value.clone()
            value[0, j - graph.token_index(0)] = 0
            mapping = {frozen.token_embeds: Array(value, name=frozen.token_embeds.name)}
        effect = targets(frozen, graph, mapping) - clean
        torch.testing.assert_close(effect, -graph.adjacency_matrix[rows, j], atol=1e-10, rtol=1e-9)


def some_columns(graph, n_features: int = 12) -> list[int]:
    """Every error and token column and ``n_features`` feature columns across the layers."""
    step = max(1, graph.n_features // n_features)
    return list(range(0, graph.n_features, step)) + list(range(graph.n_features, graph.logit_offset))


@pytest.mark.parametrize("build", [gpt2_model, llama_model], ids=["gpt2", "llama"])
def test_frozen_circuit_computes_the_model(build):
    circuit, tcs = build()
    frozen = frozen_replacement(circuit, tcs, dtype=torch.float64)
    original = circuit.get_unique(names.LOGITS).evaluate(dtype=torch.float64)
    torch.testing.assert_close(frozen.logits.evaluate(dtype=torch.float64), original, atol=1e-12, rtol=1e-12)
    # in the model's float32, the whole circuit (its root: the loss) too
    torch.testing.assert_close(
        frozen_replacement(circuit, tcs).circuit.evaluate(), circuit.evaluate(), atol=1e-5, rtol=1e-5
    )
    # what was frozen: every layer's pattern and norm scales, as Arrays of the clean values
    frozen_names = {node.name for node in frozen.circuit.get(lambda n: isinstance(n, Array))}
    assert {"b0.a.frozen_probs", "b1.a.frozen_probs", "a1.norm.frozen_scale", "final.call.frozen_scale"} <= (
        frozen_names
    )
    acts = frozen.acts[1].value
    assert acts[0, 0].abs().sum() == 0 and acts[0, 1:].count_nonzero() > 0  # circuit-tracer: none at BOS


def test_frozen_values_are_the_clean_run():
    circuit, tcs = gpt2_model()
    frozen = frozen_replacement(circuit, tcs, dtype=torch.float64)
    run = sae_analyses.feature_values(
        sae_analyses.splice_saes(circuit, tcs), [("mlp_out", 1)], dtype=torch.float64
    )
    expected = run["mlp_out1.sae.acts"].clone()
    expected[:, 0] = 0
    torch.testing.assert_close(frozen.acts[1].value, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("build", [gpt2_model, llama_model], ids=["gpt2", "llama"])
def test_adjacency_columns_are_interventions(build):
    circuit, tcs = build()
    graph = attribution_graph(circuit, tcs, dtype=torch.float64, batch_size=64)
    assert graph.n_features > 20 and len(graph.logit_tokens) >= 1
    assert graph.adjacency_matrix[graph.n_features : graph.logit_offset].abs().sum() == 0  # no rows
    check_columns(graph, some_columns(graph))


def test_gemma2_adjacency_columns_are_interventions():
    """Soft-capped attention and logits, sandwich norms: the post-norm over the MLP frozen too when
    the transcoder writes the MLP's own output (circuit-tracer's ``mlp.hook_out``), not the post-norm's."""
    circuit = gemma2_circuit()
    tcs = [(transcoder(layer, 16), ("ln2", layer), names.mlp_out(layer)) for layer in range(2)]
    graph = attribution_graph(circuit, tcs, dtype=torch.float64)
    frozen = graph.replacement
    frozen_names = {node.name for node in frozen.circuit.get(lambda n: isinstance(n, Array))}
    assert "b1.m.post_norm.frozen_scale" in frozen_names
    original = circuit.get_unique(names.LOGITS).evaluate(dtype=torch.float64)
    torch.testing.assert_close(frozen.logits.evaluate(dtype=torch.float64), original, atol=1e-12, rtol=1e-12)
    check_columns(graph, some_columns(graph, 8))


def test_transcoders_at_points_or_node_names():
    """``(sae, read, write)`` with a point and a node name: the graph of the transcoders' own hooks."""
    circuit, tcs = gpt2_model()
    own = attribution_graph(circuit, tcs)
    named = attribution_graph(
        circuit, [(tc, ("ln2", layer), names.mlp_out(layer)) for layer, tc in enumerate(tcs)]
    )
    torch.testing.assert_close(named.adjacency_matrix, own.adjacency_matrix, atol=0, rtol=0)
    hooked = transcoder(0, 12, out="mlp.hook_out")  # circuit-tracer's hook: no point stands for it
    with pytest.raises(
        ExperimentError, match=r"transcoders\[0\]: hook_name_out 'blocks.0.mlp.hook_out'.*'b0.m'"
    ):
        attribution_graph(circuit, [hooked, tcs[1]])
    with pytest.raises(ExperimentError, match="0 nodes are named 'b0.nothing'"):
        attribution_graph(circuit, [(tcs[0], ("ln2", 0), "b0.nothing"), tcs[1]])


def test_transcoders_of_different_widths():
    circuit, _ = gpt2_model()
    tcs = [transcoder(0, 12, width=24), transcoder(1, 12, width=56)]
    graph = attribution_graph(circuit, tcs, dtype=torch.float64)
    assert graph.active_features[:, 2].max() > 24  # layer 1's features
    check_columns(graph, some_columns(graph, 6))


def test_batch_size_does_not_change_the_graph():
    circuit, tcs = gpt2_model()
    one = attribution_graph(circuit, tcs, dtype=torch.float64, batch_size=7, device="cpu")
    other = attribution_graph(circuit, tcs, dtype=torch.float64, batch_size=1000)
    torch.testing.assert_close(one.adjacency_matrix, other.adjacency_matrix, atol=1e-12, rtol=0)


def test_salient_logits_cover_the_probability():
    circuit, tcs = gpt2_model()
    graph = attribution_graph(circuit, tcs, max_n_logits=4, desired_logit_prob=0.2)
    probs = torch.softmax(circuit.get_unique(names.LOGITS).evaluate()[0, -1], -1)
    order = probs.argsort(descending=True)
    n = len(graph.logit_tokens)
    assert graph.logit_tokens.tolist() == order[:n].tolist()
    torch.testing.assert_close(graph.logit_probabilities, probs[order[:n]])
    assert n == 4 or (probs[order[: n - 1]].sum() < 0.2 <= probs[order[:n]].sum())


def test_refusals():
    circuit, tcs = gpt2_model()
    with pytest.raises(ExperimentError, match="transcoders: the model has 2 layers and 1"):
        attribution_graph(circuit, tcs[:1])
    with pytest.raises(ExperimentError, match=r"transcoders\[0\]: it reads or writes"):
        attribution_graph(circuit, [tcs[1], tcs[1]])
    plain = SAE(
        "standard", tcs[0].W_enc, tcs[0].b_enc, tcs[0].W_dec, tcs[0].b_dec, hook_name="blocks.0.hook_mlp_out"
    )
    with pytest.raises(ExperimentError, match=r"transcoders\[0\].*'standard'"):
        attribution_graph(circuit, [plain, tcs[1]])
    with pytest.raises(ExperimentError, match="tokens of shape"):
        attribution_graph(circuit, tcs, tokens=torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ExperimentError, match="max_n_logits"):
        attribution_graph(circuit, tcs, max_n_logits=0)
    with pytest.raises(ExperimentError, match="one prompt"):
        frozen_replacement(gpt2_circuit(token_ids(17, (2, 7), seed=1)), tcs)
    # transcoders that leave the MLPs in place: the GELU is on the stream's path, not linear
    misplaced = transcoders(2, 12, out="hook_attn_out")
    with pytest.raises(ExperimentError, match="'m.act'.*not linear"):
        frozen_replacement(circuit, misplaced)


def test_tokens_argument_runs_the_circuit_on_them():
    circuit, tcs = gpt2_model()
    other = token_ids(17, (1, 7), seed=9)
    graph = attribution_graph(circuit, tcs, tokens=other[0])
    assert graph.input_tokens.tolist() == other[0, :-1].tolist()
    expected = attribution_graph(gpt2_circuit(other), tcs)
    torch.testing.assert_close(graph.adjacency_matrix, expected.adjacency_matrix)


CIRCUIT_TRACER = Path(__file__).parent / "data" / "circuit_tracer"


def test_adjacency_is_circuit_tracers():
    """circuit-tracer 0.5.0's own graph of its small random Gemma-2 test model (2 layers, JumpReLU
    transcoders reading ``mlp.hook_in``, writing ``mlp.hook_out``, before the post-MLP norm):
    ``scripts/circuit_tracer_reference.py``, tests/data/circuit_tracer/README.md.  Largest
    difference 2.4e-6 (entries up to 5.0)."""
    reference = load_file(CIRCUIT_TRACER / "reference.safetensors")
    config = json.loads((CIRCUIT_TRACER / "tl_config.json").read_text())
    state = load_file(CIRCUIT_TRACER / "model.safetensors")
    meta = json.loads((CIRCUIT_TRACER / "graph_meta.json").read_text())
    circuit = cm.from_transformer_lens(state, reference["tokens"][None], cfg=config, convention="prompt")
    tcs = [
        (load_sae(CIRCUIT_TRACER / "transcoders" / f"layer_{layer}"), ("ln2", layer), names.mlp_out(layer))
        for layer in range(2)
    ]
    for dtype in (torch.float32, torch.float64):
        graph = attribution_graph(circuit, tcs, dtype=dtype)
        assert graph.input_tokens.tolist() == reference["tokens"].tolist()
        assert graph.active_features.tolist() == reference["active_features"].tolist()
        assert graph.selected_features.tolist() == reference["selected_features"].tolist()
        assert graph.logit_tokens.tolist() == reference["logit_token_ids"].tolist()
        assert [list(node) for node in graph.nodes] == meta["nodes"]
        close = dict(atol=1e-5, rtol=1e-5, check_dtype=False)
        torch.testing.assert_close(graph.activation_values, reference["activation_values"], **close)
        torch.testing.assert_close(graph.logit_probabilities, reference["logit_probabilities"], **close)
        torch.testing.assert_close(graph.adjacency_matrix, reference["adjacency_matrix"], **close)


def test_freeze_attention_and_norms_keeps_the_clean_patterns_and_scales():
    """On other tokens, the frozen circuit is the model with every pattern and norm scale patched in
    from the clean run (``ex.patch``, the library's activation patching: an independent rewrite)."""
    circuit = gpt2_circuit(TOKENS)
    frozen = freeze_attention_and_norms(circuit)
    assert {"b0.a.frozen_probs", "a1.norm.frozen_scale", "final.call.frozen_scale"} <= {
        node.name for node in frozen.get(lambda n: isinstance(n, Array))
    }
    other = {names.TOKENS: token_ids(17, (1, 7), seed=11)}
    on_other = ex.with_inputs(frozen, other)[0].evaluate()
    moved = ex.with_inputs(circuit, other)[0]
    patched = ex.patch(moved, {names.PROBS, "ln.rsqrt"}, {names.TOKENS: TOKENS})
    torch.testing.assert_close(on_other, patched.evaluate(), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(on_other, moved.evaluate(), atol=1e-3)  # the freezing changes something
