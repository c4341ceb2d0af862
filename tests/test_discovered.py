"""``ex.discovered_circuit`` and ``ex.discovery.faithfulness`` (issue 32 item 4): kept edges as a circuit whose
other edges read their ablated values, against the plain-torch forward of tests/acdc_reference.py;
its save/load round trip; MIB's faithfulness, CPR and CMD against a hand computation; typed errors."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.experiments as ex
import circuits.models as cm
from circuits.errors import ExperimentError
from circuits.experiments.faithfulness import MIB_FRACTIONS, area_under

import acdc_reference as ref
import factories as f


def _tokens(seed: int, shape=(3, 7)) -> torch.Tensor:
    return f.token_ids(f.FAMILY_VOCAB, shape, seed=seed)


@pytest.fixture(scope="module")
def model():
    hf = f.gpt2(perturb=f.scaled_weights, n_layer=2, n_head=3, n_embd=15).double()
    clean, corrupted = _tokens(0), _tokens(1)
    c = cm.from_hf(hf, clean)
    edges = ex.edge_circuit(c, ablation="resample", corrupted_inputs={"toks_int_var": corrupted})
    ablated = ref.ablated_values(hf, clean[:, :-1], corrupted[:, :-1], "resample")
    return hf, clean[:, :-1], ablated, edges


KEPT = ["embeds->t.call", "b1.m->t.call", "b0.a.head1->b1.m", "embeds->b0.a.head1.v", "b0.m->b1.a.head2.q"]


def _reference_kl(hf, clean, ablated, kept, position=None) -> float:
    full = ref.forward(hf, clean, frozenset(), ablated)
    every = {f"{s}->{r}" for r, senders in full.readable.items() for s in senders}
    removed = frozenset(every - set(kept))
    return float(ref.kl(full.logits, ref.forward(hf, clean, removed, ablated).logits, position).detach())


def test_the_discovered_circuit_is_the_kept_edges_with_the_others_ablated(model):
    hf, clean, ablated, edges = model
    found = ex.discovered_circuit(edges, reversed(KEPT), metric="kl")
    assert found.kept == tuple(e.name for e in edges.edges if e.name in KEPT)  # in edge order
    assert found.n_edges == 75 and "5 of 75 edges" in repr(found)
    expected = ref.forward(hf, clean, frozenset(e.name for e in edges.edges) - set(KEPT), ablated).logits
    assert (found.circuit.get_unique("t.call").evaluate() - expected).abs().max() < 1e-10
    assert abs(found.metric - _reference_kl(hf, clean, ablated, KEPT)) < 1e-12
    at_last = ex.discovered_circuit(edges, KEPT, metric="kl", position=-1)
    assert abs(at_last.metric - _reference_kl(hf, clean, ablated, KEPT, -1)) < 1e-12


def test_it_saves_loads_and_re_evaluates_to_its_metric(model, tmp_path):
    _, _, _, edges = model
    found = ex.discovered_circuit(edges, KEPT, metric="kl")
    path = found.save(tmp_path / "found.circ")
    circuit, metric = cc.load_many(path)
    assert circuit.hash == found.circuit.hash and metric.hash == found.metric_circuit.hash
    assert float(found.metric_circuit.evaluate()) == found.metric
    # loaded tensors are contiguous copies: another kernel's summation order at most
    assert float(metric.evaluate()) == pytest.approx(found.metric, rel=1e-12)
    text = circuit.repr()
    assert "'edges.ablated' [9,3,6,15] Array" in text and "'edges.mask->t.call' [9] Array" in text


def test_it_prints_the_kept_senders_of_each_receiver(model, capsys):
    _, _, _, edges = model
    found = ex.discovered_circuit(edges, KEPT)
    assert found.metric is None and found.metric_circuit is None
    assert found.comment(found.edges.receiver("t.call").input) == "kept: embeds, b1.m"
    assert found.comment(found.edges.receiver("b1.a.head0.k").input) == "kept: none"
    found.print(depth=8)
    assert "kept: embeds, b1.m" in capsys.readouterr().out


def test_selections_from_edge_scores(model):
    _, _, _, edges = model
    scores = {e.name: float(i % 7) - 3.0 for i, e in enumerate(edges.edges)}  # ties broken by edge order
    values = torch.tensor(list(scores.values()), dtype=torch.float64)
    edge_scores = ex.discovery.EdgeScores(edges.edges, values, 0.0, "eap", 1)
    by_abs = sorted(scores, key=lambda n: -abs(scores[n]))
    top = ex.discovered_circuit(edges, edge_scores, top=10)
    assert set(top.kept) == set(by_abs[:10])
    at = ex.discovered_circuit(edges, edge_scores, threshold=3.0)
    assert set(at.kept) == {n for n, v in scores.items() if abs(v) >= 3.0}


def test_faithfulness_against_a_hand_computation(model):
    hf, clean, ablated, edges = model
    names = [e.name for e in edges.edges]
    scores = {name: float((7 * i) % 75) for i, name in enumerate(names)}  # a permutation of 0..74
    curve = ex.discovery.faithfulness(edges, scores, "kl", fractions=(0.02, 0.1, 0.5, 1.0))
    ranked = sorted(names, key=lambda n: -scores[n])
    full = _reference_kl(hf, clean, ablated, names)
    corrupted = _reference_kl(hf, clean, ablated, [])
    assert curve.n_kept == (1, 7, 37, 75)
    expected = [
        (_reference_kl(hf, clean, ablated, ranked[:n]) - corrupted) / (full - corrupted)
        for n in (1, 7, 37, 75)
    ]
    assert max(abs(a - b) for a, b in zip(curve.faithfulness, expected)) < 1e-9
    xs = [0.02, 0.1, 0.5, 1.0]
    cpr = sum((xs[i + 1] - xs[i]) * (expected[i] + expected[i + 1]) / 2 for i in range(3))
    cmd = sum((xs[i + 1] - xs[i]) * (abs(1 - expected[i]) + abs(1 - expected[i + 1])) / 2 for i in range(3))
    assert abs(curve.cpr - cpr) < 1e-9 and abs(curve.cmd - cmd) < 1e-9
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-12)


def test_the_mib_area_rule():
    # faithfulness 0, 0.5, 1 at 10%, 50%, 100%: CPR = 0.4 * 0.25 + 0.5 * 0.75, CMD = 0.4 * 0.75 + 0.5 * 0.25
    assert area_under((0.1, 0.5, 1.0), (0.0, 0.5, 1.0)) == pytest.approx(0.475)
    assert MIB_FRACTIONS == (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def test_the_faithfulness_plot(model):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    _, _, _, edges = model
    scores = {e.name: float(i) for i, e in enumerate(edges.edges)}
    curve = ex.discovery.faithfulness(edges, scores, "kl")
    figure = curve.plot()
    (line,) = figure.axes[0].lines[:1]
    assert list(line.get_ydata()) == list(curve.faithfulness)
    assert "CPR" in figure.axes[0].get_legend().get_texts()[0].get_text()
    assert len(curve.to_pandas()) == 10


def test_bad_inputs_are_typed_errors_naming_the_argument(model):
    _, _, _, edges = model
    with pytest.raises(ExperimentError, match="kept names an edge that does not exist.*'b9.m->t.call'"):
        ex.discovered_circuit(edges, ["b9.m->t.call"])
    with pytest.raises(ExperimentError, match="kept names an edge"):
        ex.discovered_circuit(edges, ["b1.m->b0.m"])  # written after its receiver reads
    with pytest.raises(ExperimentError, match="empty circuit"):
        ex.discovered_circuit(edges, [])
    with pytest.raises(ExperimentError, match="kept must be"):
        ex.discovered_circuit(edges, "embeds->t.call")
    scores = {e.name: 1.0 for e in edges.edges}
    with pytest.raises(ExperimentError, match="scores must score every edge.*unknown \\['nope->t.call'\\]"):
        ex.discovery.faithfulness(edges, {**scores, "nope->t.call": 1.0}, "kl")
    with pytest.raises(ExperimentError, match="fractions"):
        ex.discovery.faithfulness(edges, scores, "kl", fractions=(0.5, 0.1))
    with pytest.raises(ExperimentError, match="threshold"):
        ex.discovered_circuit(
            edges, ex.discovery.EdgeScores(edges.edges, torch.ones(75), 0.0, "eap", 1), threshold=-1.0
        )
    with pytest.raises(ExperimentError, match="metric 'constant' does not read the edges"):
        ex.discovered_circuit(edges, KEPT, metric=ex.Metric(lambda c: cc.Scalar(1.0, name="one"), "constant"))
