"""``ex.acdc`` and ablated edges (issue 32 items 3 and 5's part): edges that read zero, mean or
resampled sender values against a plain-torch forward on the Hugging Face GPT-2, ACDC's kept edges
and per-edge deltas against a brute-force greedy reference (tests/acdc_reference.py: every edge
tried by a whole new forward), and the typed errors."""

from __future__ import annotations

import math

import pytest
import torch

import circuits as cc
import circuits.experiments as ex
import circuits.models as cm
from circuits.errors import ExperimentError

import acdc_reference as ref
import factories as f


def _gpt2():
    """2 layers of 3 heads of 5 dims, biases and norms moved: 75 edges."""
    return f.gpt2(perturb=f.scaled_weights, n_layer=2, n_head=3, n_embd=15).double()


def _tokens(seed: int, shape=(3, 7)) -> torch.Tensor:
    return f.token_ids(f.FAMILY_VOCAB, shape, seed=seed)


@pytest.fixture(scope="module")
def model():
    hf = _gpt2()
    clean, corrupted = _tokens(0), _tokens(1)
    return hf, clean, corrupted, cm.from_hf(hf, clean)


def _logits(circuit) -> torch.Tensor:
    return circuit.get_unique("t.call").evaluate()


def _neg_logit_diff(logits: torch.Tensor) -> torch.Tensor:
    """A task metric ACDC minimises: minus the last position's logit difference of two tokens."""
    return -(logits[:, -1, 3] - logits[:, -1, 5]).mean()


# ------------------------------------------------------------------ ablated edges


@pytest.mark.parametrize("ablation", ["resample", "mean", "zero"])
def test_an_ablated_edge_reads_the_senders_ablated_value(model, ablation):
    hf, clean, corrupted, c = model
    edges = ex.edge_circuit(c, ablation=ablation, corrupted_inputs={"toks_int_var": corrupted})
    assert edges.ablation == ablation
    # masks at 1: the zero-ablation form bit for bit (1 - m is exactly 0), the model within rounding
    assert torch.equal(_logits(edges.circuit), _logits(ex.edge_circuit(c).circuit))
    assert (_logits(edges.circuit) - _logits(c)).abs().max() < 1e-10
    ablated = ref.ablated_values(hf, clean[:, :-1], corrupted[:, :-1], ablation)
    full = _logits(edges.circuit)
    for edge in ["b0.a.head2->b1.a.head1.k", "embeds->b1.m", "b1.m->t.call", "b0.m->b1.a.head0.v"]:
        expected = ref.forward(hf, clean[:, :-1], {edge}, ablated).logits
        got = _logits(edges.without_edges([edge]).circuit)
        assert (got - expected).abs().max() < 1e-10, edge
        assert (got - full).abs().max() > 1e-6, edge  # the edge matters (far above the 1e-10)


def test_the_ablated_circuit_prints_its_ablated_senders(model):
    _, _, corrupted, c = model
    edges = ex.edge_circuit(c, ablation="resample", corrupted_inputs={"toks_int_var": corrupted})
    text = edges.circuit.repr()
    assert "'edges.ablated' [9,3,6,15] Array" in text
    assert "'edges.unmask->b1.m' Add" in text and "'edges.ablated<8' [8,3,6,15] Index" in text
    mean = ex.edge_circuit(c, ablation="mean", corrupted_inputs={"toks_int_var": _tokens(2, (5, 7))})
    assert mean.ablated.shape == (9, 6, 15)  # the mean over 5 rows, broadcast over the batch


def test_edges_of_another_ablation_keep_the_masked_api(model):
    _, _, corrupted, c = model
    edges = ex.edge_circuit(c, ablation="resample", corrupted_inputs={"toks_int_var": corrupted})
    one = edges.without_edges(["b0.m->t.call"])
    assert one.receiver("t.call").mask.value[4] == 0 and one.ablation == "resample"
    assert one.receiver("t.call").input.name == "edges->t.call"
    with pytest.raises(ExperimentError, match="already reads"):
        edges.with_ablation("mean", {"toks_int_var": corrupted})


# ------------------------------------------------------------------ ACDC against the reference

SLOW = pytest.mark.slow  # the reference runs a whole forward per tested edge
CASES = [
    # (ablation, metric, position, absolute, thresholds)
    pytest.param("resample", "kl", None, False, (3e-4, 2e-3), marks=SLOW),
    ("resample", "kl", -1, False, (1e-3,)),
    ("mean", "kl", None, False, (1e-3,)),
    pytest.param("zero", "kl", None, False, (1e-3, 1e-2), marks=SLOW),
    pytest.param("resample", "task", None, True, (3e-3, 1e-2), marks=SLOW),
    pytest.param("mean", "task", None, True, (3e-3,), marks=SLOW),
]


def _reference_metric(hf, clean, ablated, metric, position):
    if metric == "task":
        return _neg_logit_diff
    full = ref.forward(hf, clean, frozenset(), ablated).logits
    return lambda logits: ref.kl(full, logits, position)


@pytest.mark.parametrize("ablation,metric,position,absolute,thresholds", CASES)
def test_acdc_keeps_the_edges_the_brute_force_reference_keeps(
    model, ablation, metric, position, absolute, thresholds
):
    hf, clean, corrupted, c = model
    ablated = ref.ablated_values(hf, clean[:, :-1], corrupted[:, :-1], ablation)
    measure = _reference_metric(hf, clean[:, :-1], ablated, metric, position)
    ours = _neg_logit_diff if metric == "task" else "kl"
    for threshold in thresholds:
        kept, steps, final = ref.acdc(hf, clean[:, :-1], ablated, measure, threshold, absolute)
        tested = [delta for _, delta in steps if delta is not None]
        # every decision clear of the threshold: float rounding cannot flip one
        assert min(abs((abs(d) if absolute else d) - threshold) for d in tested) > 1e-9
        assert 0 < len(kept) < len(steps)  # a circuit, not everything or nothing
        result = ex.acdc(
            c,
            {"toks_int_var": corrupted},
            ours,
            threshold=threshold,
            ablation=ablation,
            position=position,
            absolute=absolute,
        )
        assert sorted(result.kept) == sorted(kept)
        assert [s.edge for s in result.steps] == [edge for edge, _ in steps]
        for step, (_, delta) in zip(result.steps, steps):
            assert step.tested == (delta is not None)
            if delta is not None:
                assert abs(step.delta - delta) < 1e-10
        assert abs(result.metric - final) < 1e-10
        found = result.circuit()
        assert abs(found.metric - final) < 1e-10  # the discovered circuit states the reference's metric


def test_acdc_recomputes_only_above_the_tested_receiver(model):
    """Each evaluation computes the tested receiver and what lies above it, never the layers below:
    an edge into the logits recomputes no head."""
    _, _, corrupted, c = model
    evaluator = cc_evaluator()
    ex.acdc(c, {"toks_int_var": corrupted}, "kl", threshold=3e-4, evaluator=evaluator)
    # the first tested edge (b1.m -> t.call) was evaluated once its masks were cached: a handful of nodes
    assert evaluator.stats.hits > 0
    edges = ex.edge_circuit(c, ablation="resample", corrupted_inputs={"toks_int_var": corrupted})
    evaluator = cc_evaluator()
    evaluator.evaluate(edges.circuit.get_unique("t.call"))
    total = evaluator.stats.last_computed
    evaluator.evaluate(edges.without_edges(["b1.m->t.call"]).circuit.get_unique("t.call"))
    assert 0 < evaluator.stats.last_computed < total / 10


def cc_evaluator():
    return cc.Evaluator(2**30)


def test_the_result_as_a_table(model):
    pytest.importorskip("pandas")
    _, _, corrupted, c = model
    result = ex.acdc(c, {"toks_int_var": corrupted}, "kl", threshold=3e-4)
    frame = result.to_pandas()
    assert list(frame.columns) == ["step", "edge", "sender", "receiver", "tested", "delta", "kept", "metric"]
    assert len(frame) == len(result.edges.edges) == 75
    assert frame["kept"].sum() == len(result.kept)
    assert frame.loc[~frame["tested"], "delta"].isna().all()
    assert "of 75 edges kept" in repr(result)


def test_unconnected_components_are_pruned_untested(model):
    _, _, corrupted, c = model
    result = ex.acdc(c, {"toks_int_var": corrupted}, "kl", threshold=2e-3)
    readers = {e.partition("->")[0] for e in result.kept}
    for step in result.steps:
        component = (
            step.receiver.rpartition(".")[0] if step.receiver.endswith((".q", ".k", ".v")) else step.receiver
        )
        if not step.tested:
            assert component not in readers and not step.kept
    assert not all(step.tested for step in result.steps)


# ------------------------------------------------------------------ bad input


def test_bad_inputs_are_typed_errors_naming_the_argument(model):
    _, _, corrupted, c = model
    inputs = {"toks_int_var": corrupted}
    for threshold in (-1e-3, math.nan, math.inf, "0.1", True):
        with pytest.raises(ExperimentError, match="threshold"):
            ex.acdc(c, inputs, "kl", threshold=threshold)
    with pytest.raises(ExperimentError, match="corrupted_inputs"):
        ex.acdc(c, {"toks_int_var": _tokens(1, (3, 6))}, "kl", threshold=1e-3)
    with pytest.raises(ExperimentError, match="corrupted_inputs"):
        ex.acdc(c, None, "kl", threshold=1e-3)
    with pytest.raises(ExperimentError, match="ablation"):
        ex.acdc(c, inputs, "kl", threshold=1e-3, ablation="gaussian")
    with pytest.raises(ExperimentError, match="metric"):
        ex.acdc(c, inputs, "kld", threshold=1e-3)
    with pytest.raises(ExperimentError, match="does not depend on the edges"):
        ex.acdc(c, inputs, lambda logits: torch.tensor(1.0), threshold=1e-3)
    constant = ex.Metric(lambda circuit: cc.Scalar(1.0, name="one"), "constant")
    with pytest.raises(ExperimentError, match="metric 'constant' does not read the edges"):
        ex.acdc(c, inputs, constant, threshold=1e-3)
    with pytest.raises(ExperimentError, match="corrupted_inputs .* change nothing"):
        ex.acdc(c, {"toks_int_var": _tokens(0)}, "kl", threshold=1e-3)  # corrupted == clean


def test_a_threshold_that_removes_every_edge_is_no_result(model):
    _, _, corrupted, c = model
    with pytest.raises(cc.errors.NoCircuitError, match="removed every edge") as error:
        ex.acdc(c, {"toks_int_var": corrupted}, "kl", threshold=1e6)
    assert isinstance(error.value, ExperimentError) and error.value.threshold == 1e6
    assert 0 < error.value.largest_delta < 1e6
