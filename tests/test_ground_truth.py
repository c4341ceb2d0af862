"""Circuit discovery against circuits known by construction (issue 32 item 5): tracr's compiled RASP
programs (tests/data/tracr, written by scripts/tracr_export.py), checked against tracr's own outputs
and true edges, the ROC AUC of EAP and EAP-IG against those edges and ACDC's over a threshold
sweep, ``edge_roc`` against a hand computation, and where the known edges of the shipped induction
model rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import circuits.experiments as ex
import circuits.models as cm
from circuits.errors import ExperimentError, ModelError, NoCircuitError
from circuits.models.demo_model import repeat_mask, repeated_tokens
from circuits.transformer import names

DATA = Path(__file__).resolve().parent / "data" / "tracr"
PROGRAMS = ["reverse", "frac_prevs", "hist", "sort_unique"]


def _export(program: str, dtype=torch.float64) -> cm.TracrExport:
    return cm.load_tracr_export(DATA / program, dtype=dtype)


def _metric(export: cm.TracrExport):
    """The readout of tracr's own answer at every position but BOS's: the clean argmax's logit
    (categorical), the value (numerical)."""
    out = export.tracr_unembedded
    if out.shape[-1] == 1:
        return lambda logits: logits[:, 1:, 0].sum()
    target = out.argmax(-1)[:, 1:, None]
    return lambda logits: logits[:, 1:].gather(-1, target).sum()


def _corrupted(export: cm.TracrExport, kind: str) -> dict:
    """``'zero'``: the embeddings zeroed, which makes every sender zero (tracr's biases are all 0),
    zero ablation as in ACDC's tracr results; ``'resample'``: each row the next row's input."""
    if kind == "resample":
        return {"toks_int_var": export.inputs.roll(1, 0)}
    return {
        w: torch.zeros_like(export.weights[w]) for w in (names.TOK_EMBEDS_WEIGHT, names.POS_EMBEDS_WEIGHT)
    }


# ------------------------------------------------------------------ the compiled models


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_circuit_computes_what_tracr_computed(program, dtype):
    export = _export(program, dtype)
    c = export.circuit()
    final = c.get_unique(names.FINAL_NORM).evaluate()
    assert (final - export.tracr_output.to(dtype)).abs().max() < 1e-5  # tracr ran in float32
    logits = c.evaluate()
    assert (logits - export.tracr_unembedded.to(dtype)).abs().max() < 1e-5
    decoded = [row[1:] for row in export.info["decoded"]]  # tracr's answers (BOS's is no answer)
    if export.info["output"] == "numerical":
        assert torch.allclose(logits[:, 1:, 0], torch.tensor(decoded, dtype=dtype), atol=1e-5)
    else:
        labels = [label.split(":", 1)[1] for label in export.info["output_labels"]]
        got = [[labels[i] for i in row] for row in logits[:, 1:].argmax(-1).tolist()]
        assert got == [[str(x) for x in row] for row in decoded]


def test_tracr_has_no_norm_and_its_identity_norms_are_exact():
    export = _export("reverse")
    c = export.circuit()
    assert export.info["config"]["layer_norm"] is False
    for layer in range(export.config.n_layers):
        before = names.block(layer - 1) if layer else names.EMBEDS
        for norm, stream in [
            (names.attn_norm(layer), before),
            (names.mlp_norm(layer), names.resid_mid(layer)),
        ]:
            assert torch.equal(c.get_unique(norm).evaluate(), c.get_unique(stream).evaluate())


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_true_edges_are_exactly_the_edges_that_carry_anything(program):
    export = _export(program)
    edges = ex.edge_circuit(export.circuit())
    every = {edge.name for edge in edges.edges}
    assert set(export.true_edges) < every
    full = edges.circuit.evaluate()
    false = sorted(every - set(export.true_edges))
    assert torch.equal(edges.without_edges(false).circuit.evaluate(), full)  # not one bit changes
    # each true edge alone matters, but the length head's query and key in reverse: its selector
    # (Comparison.TRUE) attends uniformly whatever they hold
    inert = {"embeds->b0.a.head0.q", "embeds->b0.a.head0.k"} if program == "reverse" else set()
    for edge in export.true_edges:
        change = (edges.without_edges([edge]).circuit.evaluate() - full).abs().max()
        assert (change < 1e-12) if edge in inert else (change > 1e-6), edge


def test_the_true_edges_of_reverse_are_its_program():
    """reverse = Aggregate(Select(indices, length - indices - 1, EQ), tokens): the length head and its
    MLP (layer 0), two MLPs for ``opp_idx`` (layers 1, 2), the reversing head (layer 3)."""
    assert _export("reverse").true_edges == (
        "embeds->b0.a.head0.q",
        "embeds->b0.a.head0.k",
        "embeds->b0.a.head0.v",
        "embeds->b0.m",
        "b0.a.head0->b0.m",
        "embeds->b1.m",
        "b0.m->b1.m",
        "b1.m->b2.m",
        "embeds->b3.a.head0.q",
        "b2.m->b3.a.head0.q",
        "embeds->b3.a.head0.k",
        "embeds->b3.a.head0.v",
        "b3.a.head0->t.call",
    )


# ------------------------------------------------------------------ ROC AUC of EAP and EAP-IG

#: AUC measured in float64 with steps=5, float dust (|score| <= 1e-9 of the largest) counted as 0
AUC = {
    ("reverse", "zero"): {"eap": 0.8077, "eap-ig-inputs": 0.8077, "eap-ig-activations": 0.8077},
    ("reverse", "resample"): {"eap": 0.5769, "eap-ig-inputs": 0.5769, "eap-ig-activations": 0.5769},
    ("frac_prevs", "zero"): {"eap": 1.0, "eap-ig-inputs": 1.0, "eap-ig-activations": 1.0},
    ("frac_prevs", "resample"): {"eap": 0.6, "eap-ig-inputs": 0.6, "eap-ig-activations": 0.6},
    ("hist", "zero"): {"eap": 0.6667, "eap-ig-inputs": 1.0, "eap-ig-activations": 0.9167},
    ("hist", "resample"): {"eap": 0.5833, "eap-ig-inputs": 0.5833, "eap-ig-activations": 0.6667},
    ("sort_unique", "zero"): {"eap": 0.8, "eap-ig-inputs": 1.0, "eap-ig-activations": 0.95},
    ("sort_unique", "resample"): {"eap": 0.65, "eap-ig-inputs": 0.65, "eap-ig-activations": 0.7},
}

#: the true edges EAP scores 0 (zero ablation): reached only through a saturated softmax or a flat
#: step of a tracr MLP, where the gradient at the clean run is 0
EAP_MISSES = {
    "reverse": {
        "embeds->b0.a.head0.q",
        "embeds->b0.a.head0.k",
        "embeds->b0.a.head0.v",
        "b0.a.head0->b0.m",
        "embeds->b1.m",
    },
    "frac_prevs": set(),
    "hist": {"embeds->b0.a.head0.q", "embeds->b0.a.head0.k", "embeds->b0.a.head0.v", "b0.a.head0->b0.m"},
    "sort_unique": {
        "embeds->b0.a.head0.q",
        "embeds->b0.a.head0.k",
        "embeds->b0.a.head0.v",
        "b0.a.head0->b0.m",
    },
}


def _roc(program: str, corruption: str, method: str):
    export = _export(program)
    scores = ex.edge_attribution(
        export.circuit(), _corrupted(export, corruption), _metric(export), method=method, steps=5
    )
    atol = 1e-9 * float(scores.scores.abs().max())
    return export, scores, ex.discovery.edge_roc(scores, export.true_edges, atol=atol), atol


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("corruption", ["zero", "resample"])
def test_eap_roc_auc_against_the_true_edges(program, corruption):
    export, scores, roc, atol = _roc(program, corruption, "eap")
    assert roc.auc == pytest.approx(AUC[program, corruption]["eap"], abs=1e-4)
    if corruption == "zero":
        missed = {edge for edge in export.true_edges if abs(float(scores[edge])) <= atol}
        assert missed == EAP_MISSES[program]
        # every other true edge outranks every false edge
        found = [roc.ranks[e] for e in export.true_edges if e not in missed]
        assert max(found) <= len(found)


@pytest.mark.slow  # EAP-IG (activations) runs 5 steps per unit of senders
@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("corruption", ["zero", "resample"])
@pytest.mark.parametrize("method", ["eap-ig-inputs", "eap-ig-activations"])
def test_eap_ig_roc_auc_against_the_true_edges(program, corruption, method):
    _, _, roc, _ = _roc(program, corruption, method)
    assert roc.auc == pytest.approx(AUC[program, corruption][method], abs=1e-4)


# ------------------------------------------------------------------ ROC AUC of ACDC

#: ACDC's thresholds: 10^-15 to 10, two a decade (float64 KL resolves changes above ~1e-16)
THRESHOLDS = [10.0 ** (k / 2) for k in range(-30, 3)]

#: the true edges ACDC keeps at no threshold.  Zero ablation: reverse's length head's query and key
#: (its selector is all TRUE: they carry nothing, test_the_true_edges_are_exactly_...), and
#: sort_unique's ``embeds->b1.a.head0.k`` (its key's BOS term moves the logits by ~1e-8, a KL of
#: ~1e-17, under float64's resolution).  Resample: what every row shares (BOS, the ``one``
#: direction, the positions, reverse's length: all its rows have 4 tokens) changes nothing.
ACDC_MISSES = {
    ("reverse", "zero"): {"embeds->b0.a.head0.q", "embeds->b0.a.head0.k"},
    ("frac_prevs", "zero"): set(),
    ("hist", "zero"): set(),
    ("sort_unique", "zero"): {"embeds->b1.a.head0.k"},
    ("reverse", "resample"): {  # all but the reversing head's value and output
        "embeds->b0.a.head0.q",
        "embeds->b0.a.head0.k",
        "embeds->b0.a.head0.v",
        "embeds->b0.m",
        "b0.a.head0->b0.m",
        "embeds->b1.m",
        "b0.m->b1.m",
        "b1.m->b2.m",
        "embeds->b3.a.head0.q",
        "b2.m->b3.a.head0.q",
        "embeds->b3.a.head0.k",
    },
    ("frac_prevs", "resample"): {"embeds->b1.a.head0.q", "embeds->b1.a.head0.k"},
    ("hist", "resample"): {"embeds->b0.a.head0.v", "embeds->b0.m"},
    ("sort_unique", "resample"): {
        "embeds->b0.a.head0.v",
        "embeds->b0.m",
        "embeds->b1.a.head0.q",
        "embeds->b1.a.head0.k",
    },
}


def _distance(c):
    """ACDC's tracr metrics, at every position but BOS's against the full model's readout: KL of
    the output distribution (categorical), the mean squared error of the value (numerical)."""
    full = c.evaluate().detach()[:, 1:]
    if full.shape[-1] == 1:
        return lambda logits: ((logits[:, 1:] - full) ** 2).mean()
    full = full.log_softmax(-1)
    return lambda logits: (full.exp() * (full - logits[:, 1:].log_softmax(-1))).sum(-1).mean()


@pytest.fixture
def one_thread():
    """tracr's products are tiny ([80, 41] by [41, 12]): a second thread only waits on the first,
    and ACDC's hundreds of them ran 6-10x slower with two threads on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _acdc_roc(program: str, ablation: str):
    export = _export(program)
    c = export.circuit()
    corrupted = None if ablation == "zero" else {"toks_int_var": export.inputs.roll(1, 0)}
    roc = ex.discovery.acdc_roc(
        c, corrupted, _distance(c), true_edges=export.true_edges, thresholds=THRESHOLDS, ablation=ablation
    )
    return export, roc


def _check_acdc_roc(program: str, ablation: str):
    """No threshold keeps a false edge, the lowest keeps every true edge but the known misses; so
    the curve is (0, 0), (0, best TPR), (1, 1) and the AUC (1 + best TPR) / 2, by hand."""
    export, roc = _acdc_roc(program, ablation)
    true = set(export.true_edges)
    assert all(set(kept) <= true for kept in roc.kept) and set(roc.fpr) == {0.0}
    assert set(roc.kept[0]) == true - ACDC_MISSES[program, ablation]
    assert set(roc.missed) == ACDC_MISSES[program, ablation]
    best = 1 - len(ACDC_MISSES[program, ablation]) / len(true)
    assert max(roc.tpr) == roc.tpr[0] == pytest.approx(best, abs=1e-12)
    assert roc.auc == pytest.approx((1 + best) / 2, abs=1e-12)
    assert roc.runs < len(THRESHOLDS) and roc.kept[-1] == ()  # 10 removes every edge
    return roc


def test_acdc_roc_auc_with_zero_ablation(one_thread):
    """ACDC's paper reports AUC 1.0 for ACDC with zero ablation on reverse and frac_prevs: frac_prevs
    (and hist) keep exactly the true edges; reverse's two length-head edges carry nothing."""
    aucs = {program: _check_acdc_roc(program, "zero").auc for program in PROGRAMS}
    assert aucs == pytest.approx({"reverse": 12 / 13, "frac_prevs": 1.0, "hist": 1.0, "sort_unique": 0.95})


def test_acdc_roc_auc_with_resample_ablation(one_thread):
    aucs = {program: _check_acdc_roc(program, "resample").auc for program in PROGRAMS}
    assert aucs == pytest.approx({"reverse": 15 / 26, "frac_prevs": 0.8, "hist": 5 / 6, "sort_unique": 0.8})


# ------------------------------------------------------------------ edge_roc itself


def test_edge_roc_is_the_mann_whitney_statistic_by_hand():
    scores = {"a": 3.0, "b": -1.0, "c": 1.0, "d": 0.0, "e": -2.5}
    # |scores|: a 3, e 2.5, b 1, c 1, d 0; true a, c.  Pairs (true, false): (a,b) 1, (a,d) 1,
    # (a,e) 1, (c,b) 1/2 (a tie), (c,d) 1, (c,e) 0: 4.5 of 6
    roc = ex.discovery.edge_roc(scores, ["a", "c"])
    assert roc.auc == 4.5 / 6 and (roc.n_true, roc.n_false) == (2, 3)
    assert roc.ranks == {"a": 1.0, "c": 3.5}  # b and c tie for ranks 3 and 4
    assert roc.fpr == (0.0, 0.0, 1 / 3, 2 / 3, 1.0) and roc.tpr == (0.0, 0.5, 0.5, 1.0, 1.0)
    # signed: a 3, c 1, d 0, b -1, e -2.5: true edges above every false one
    assert ex.discovery.edge_roc_auc(scores, ["a", "c"], absolute=False) == 1.0
    assert ex.discovery.edge_roc_auc(scores, ["d"]) == 0.0
    assert ex.discovery.edge_roc_auc({"a": 1e-30, "b": 0.0}, ["a"]) == 1.0
    assert ex.discovery.edge_roc_auc({"a": 1e-30, "b": 0.0}, ["a"], atol=1e-20) == 0.5  # dust is 0: a tie
    assert ex.discovery.edge_roc_auc({"a": 1, "b": 1, "c": 1}, ["a"]) == 0.5


def test_edge_roc_reads_edge_scores_summed_over_positions():
    export = _export("frac_prevs")
    kwargs = dict(corrupted_inputs=_corrupted(export, "zero"), metric=_metric(export))
    per_position = ex.edge_attribution(
        ex.edge_circuit(export.circuit(), per_position=True), **kwargs, per_position=True
    )
    summed = {edge.name: float(s) for edge, s in zip(per_position.edges, per_position.scores.sum(-1))}
    assert (
        ex.discovery.edge_roc(per_position, export.true_edges).ranks
        == ex.discovery.edge_roc(summed, export.true_edges).ranks
    )


def test_edge_roc_errors_name_what_is_wrong():
    with pytest.raises(ExperimentError, match="'x->y'"):
        ex.discovery.edge_roc({"a": 1.0, "b": 0.0}, ["x->y"])
    with pytest.raises(ExperimentError, match="at least one of each"):
        ex.discovery.edge_roc({"a": 1.0}, ["a"])
    with pytest.raises(ExperimentError, match="not finite"):
        ex.discovery.edge_roc({"a": float("nan"), "b": 0.0}, ["a"])
    with pytest.raises(ExperimentError, match=r"scores\['b'\]"):
        ex.discovery.edge_roc({"a": 1.0, "b": "high"}, ["a"])
    with pytest.raises(ExperimentError, match="atol"):
        ex.discovery.edge_roc({"a": 1.0, "b": 0.0}, ["a"], atol=-1)
    with pytest.raises(ExperimentError, match="EdgeScores or a mapping"):
        ex.discovery.edge_roc([("a", 1.0)], ["a"])


def test_tracr_weights_errors_name_the_argument():
    export = _export("hist")
    params = {k: v for k, v in export.weights.items()}
    with pytest.raises(ModelError) as error:
        cm.tracr_weights(params, torch.zeros(18, 6), 1)  # circuit names, not tracr's
    assert error.value.field == "params"
    from safetensors.torch import load_file

    raw = {k: v for k, v in load_file(str(DATA / "hist.safetensors")).items() if "/" in k or "embed." in k}
    with pytest.raises(ModelError) as error:
        cm.tracr_weights(raw, torch.zeros(18, 6), 2)  # 5 query columns are not 2 heads
    assert error.value.field == "n_heads"
    with pytest.raises(ModelError) as error:
        cm.tracr_weights(raw, torch.zeros(17, 6), 1)
    assert error.value.field == "unembed"
    for option, value in [
        ("causal", True),
        ("convention", "default"),
        ("rope", (torch.ones(1), torch.ones(1))),
    ]:
        with pytest.raises(ModelError) as error:
            export.circuit(**{option: value})
        assert error.value.field == option


# ------------------------------------------------------------------ acdc_roc itself


def test_acdc_roc_runs_agree_with_acdc_at_each_threshold(one_thread):
    """A threshold that reuses an earlier run keeps what ``acdc`` at that threshold keeps; one past
    every edge's delta is ``NoCircuitError``, the point (0, 0)."""
    export, roc = _acdc_roc("hist", "resample")
    assert len({kept for kept in roc.kept}) == roc.runs == 3  # two circuits and the empty one
    c = export.circuit()
    corrupted = {"toks_int_var": export.inputs.roll(1, 0)}
    for threshold, kept in list(zip(roc.thresholds, roc.kept))[::4]:
        try:
            direct = ex.acdc(c, corrupted, _distance(c), threshold=threshold).kept
        except NoCircuitError as error:
            assert error.threshold == threshold and error.largest_delta < threshold
            direct = ()
        assert kept == direct, threshold


def test_acdc_roc_curve_is_the_pareto_frontier_of_its_points():
    from circuits.experiments.acdc_roc import _frontier

    # (0.5, 0.7) is beaten by (0.2, 1.0), (0, 0.5) by (0, 0.8): (0,0) (0,.8) (.2,1) (1,1)
    curve = _frontier([0.0, 0.0, 0.5, 0.2], [0.5, 0.8, 0.7, 1.0])
    assert curve == ((0.0, 0.2, 1.0), (0.8, 1.0, 1.0))
    assert ex.discovery.area_under(*curve) == pytest.approx(0.2 * 0.9 + 0.8)
    assert _frontier([0.0, 1.0], [0.0, 1.0]) == ((0.0, 1.0), (0.0, 1.0))  # every edge, no edge
    assert _frontier([0.25, 0.5], [0.5, 0.25]) == ((0.0, 0.25, 1.0), (0.0, 0.5, 1.0))


def test_acdc_roc_errors_name_what_is_wrong():
    export = _export("hist")
    c, true = export.circuit(), export.true_edges
    kwargs = dict(true_edges=true, thresholds=[0.1], ablation="zero")
    with pytest.raises(ExperimentError, match="thresholds is empty"):
        ex.discovery.acdc_roc(c, None, "kl", **{**kwargs, "thresholds": []})
    with pytest.raises(ExperimentError, match="threshold must be"):
        ex.discovery.acdc_roc(c, None, "kl", **{**kwargs, "thresholds": [0.1, -1]})
    with pytest.raises(ExperimentError, match=r"\['x->y'\] are not edges"):
        ex.discovery.acdc_roc(c, None, "kl", **{**kwargs, "true_edges": ["x->y"]})
    every = [edge.name for edge in ex.edge_circuit(c).edges]
    with pytest.raises(ExperimentError, match="8 true and 0 false"):
        ex.discovery.acdc_roc(c, None, "kl", **{**kwargs, "true_edges": every})
    with pytest.raises(ExperimentError, match="ablation must be one of"):
        ex.discovery.acdc_roc(c, None, "kl", **{**kwargs, "ablation": "mean-ish"})
    with pytest.raises(ExperimentError, match="ablation='resample' needs corrupted_inputs"):
        ex.discovery.acdc_roc(c, None, "kl", **{**kwargs, "ablation": "resample"})


# ------------------------------------------------------------------ the shipped induction model

#: the induction circuit: the embeddings into the induction head 1.1's queries and values, the
#: previous-token heads 0.1 and 0.2 into its keys, its output into the logits (tests/test_demo.py
#: finds 1.1 the induction head, 0.2 and 0.1 the previous-token heads its loss needs)
INDUCTION_EDGES = [
    "idxed_embeds->b1.a.head1.q",
    "idxed_embeds->b1.a.head1.v",
    "b0.a.head1->b1.a.head1.k",
    "b0.a.head2->b1.a.head1.k",
    "b1.a.head1->t.call",
]


@pytest.mark.parametrize(
    "method,auc,ranks",
    [
        ("eap", 0.9579, {"q": 5, "v": 17, "k0.1": 3, "k0.2": 2, "logits": 4}),
        pytest.param(
            "eap-ig-inputs",
            0.9921,
            {"q": 6, "v": 1, "k0.1": 5, "k0.2": 4, "logits": 2},
            marks=pytest.mark.slow,  # 5 steps
        ),
    ],
)
def test_where_the_induction_edges_rank(method, auc, ranks):
    block, batch = 12, 8
    clean, corrupted = repeated_tokens(batch, block, seed=0), repeated_tokens(batch, block, seed=1)
    predictable = repeat_mask(block, batch, 2 * block)

    def log_prob_of_the_repeats(logits):
        return logits.log_softmax(-1).gather(-1, clean[:, 1:, None])[..., 0][predictable].sum()

    scores = ex.edge_attribution(
        cm.load_demo_model(clean),
        {"toks_int_var": corrupted},
        log_prob_of_the_repeats,
        method=method,
        steps=5,
    )
    roc = ex.discovery.edge_roc(scores, INDUCTION_EDGES)
    assert len(scores) == 81 and roc.auc == pytest.approx(auc, abs=1e-4)
    assert [roc.ranks[e] for e in INDUCTION_EDGES] == [ranks[k] for k in ("q", "v", "k0.1", "k0.2", "logits")]
