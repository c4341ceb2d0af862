"""Ablations, patching, metrics and sweeps against the model written in plain torch."""

from __future__ import annotations

import functools

import factories
import pytest
import torch
from experiments_reference import CONFIG, SEQ, forward, split_circuit, tokens, weights

import circuits as cc
from circuits import experiments as ex
from circuits import models

TOL = dict(rtol=1e-10, atol=1e-10)


@pytest.fixture(scope="module")
def setup():
    w = weights(0)
    toks = tokens(1)
    return w, toks, split_circuit(w, toks)


# ----------------------------------------------------------------- ablations


@pytest.mark.parametrize("layer, head", [(0, 1), (1, 2)])
def test_zero_ablating_one_head_is_zeroing_its_output_in_torch(setup, layer, head):
    w, toks, split = setup
    ablated = ex.zero_ablate(split, f"b{layer}.a.head{head}")
    expected, _, _ = forward(w, toks, override={(layer, head): torch.zeros(())})
    torch.testing.assert_close(ablated.evaluate(), expected, **TOL)
    assert ablated.get_unique(f"b{layer}.a.head{head}").kind == "Scalar"  # the name is kept
    assert not torch.allclose(ablated.evaluate(), split.evaluate())


def test_zero_ablating_a_regex_of_heads(setup):
    w, toks, split = setup
    ablated = ex.zero_ablate(split, cc.Matcher.regex(r"^b0\.a\.head[02]$"))
    zero = torch.zeros(())
    expected, _, _ = forward(w, toks, override={(0, 0): zero, (0, 2): zero})
    torch.testing.assert_close(ablated.evaluate(), expected, **TOL)


def test_a_target_that_matches_nothing_is_an_error(setup):
    _, _, split = setup
    with pytest.raises(cc.errors.ExperimentError, match="finds no node"):
        ex.zero_ablate(split, "b0.a.head9")


def test_mean_ablation_batched_circuit_dataset_of_other_size(setup):
    """[N, S+1] dataset tokens for a circuit on [B, S+1]: per-position mean over the N rows."""
    w, toks, split = setup
    dataset = tokens(7, batch=5)
    _, _, dataset_heads = forward(w, dataset)
    mean = dataset_heads[(0, 2)].mean(0)  # [S, d]
    expected, _, _ = forward(w, toks, override={(0, 2): mean})
    ablated = ex.mean_ablate(split, "b0.a.head2", {"toks_int_var": dataset})
    torch.testing.assert_close(ablated.evaluate(), expected, **TOL)
    node = ablated.get_unique("b0.a.head2")
    assert node.kind == "Rearrange" and node.children[0].shape == (SEQ, CONFIG.d_model)


def test_mean_ablation_unbatched_circuit_expands_over_the_dataset():
    w = weights(2)
    one = tokens(3, batch=None)
    split = split_circuit(w, one)
    dataset = tokens(4, batch=6)
    _, _, dataset_heads = forward(w, dataset)
    mean = dataset_heads[(1, 0)].mean(0)
    expected, _, _ = forward(w, one.unsqueeze(0), override={(1, 0): mean})
    ablated = ex.mean_ablate(split, "b1.a.head0", {"toks_int_var": dataset})
    torch.testing.assert_close(ablated.evaluate(), expected[0], **TOL)
    assert ablated.get_unique("b1.a.head0").kind == "Array"
    with pytest.raises(cc.errors.ExperimentError, match="no batch axis"):
        ex.mean_ablate(split, "b1.a.head0", {"toks_int_var": tokens(5, batch=None)})


def test_mean_ablation_of_nodes_that_do_not_depend_on_the_inputs_keeps_them(setup):
    _, _, split = setup
    weight = "a0.w.q.head1"  # an Index of a weight: the same on every input
    assert ex.mean_ablate(split, weight, {"toks_int_var": tokens(7, batch=4)}) == split


def test_resample_ablation_takes_each_row_from_the_other_inputs(setup):
    w, toks, split = setup
    other = tokens(9)
    _, _, other_heads = forward(w, other)
    expected, _, _ = forward(w, toks, override={(1, 1): other_heads[(1, 1)]})
    ablated = ex.resample_ablate(split, "b1.a.head1", {"toks_int_var": other})
    torch.testing.assert_close(ablated.evaluate(), expected, **TOL)
    with pytest.raises(cc.errors.ExperimentError, match="shape of the inputs"):
        ex.resample_ablate(split, "b1.a.head1", {"toks_int_var": tokens(9, batch=3)})


# ------------------------------------------------------------------ patching


def test_patching_from_the_circuits_own_inputs_is_a_no_op(setup):
    _, toks, split = setup
    for target in (
        "b0.a.head0",
        "b1.a.head2",
        "a1.norm",
        cc.IterativeMatcher("b1.a.head0").then("b0.a.head1"),
    ):
        patched = ex.patch(split, target, {"toks_int_var": toks.clone()})
        assert patched == split  # structurally the same circuit
        torch.testing.assert_close(patched.evaluate(), split.evaluate(), rtol=0, atol=0)


def test_activation_patching_matches_torch(setup):
    w, toks, split = setup
    source = tokens(11)
    _, _, source_heads = forward(w, source)
    patched = ex.patch(split, "b0.a.head1", {"toks_int_var": source})
    expected, _, _ = forward(w, toks, override={(0, 1): source_heads[(0, 1)]})
    torch.testing.assert_close(patched.evaluate(), expected, **TOL)


def test_path_patching_only_the_value_input_of_a_later_head(setup):
    """Head 0.1 from the source run, seen only by head 1.2's value projection."""
    w, toks, split = setup
    source = tokens(12)
    _, _, source_heads = forward(w, source)
    value_path = cc.IterativeMatcher("b1.a.head2").then("a.v").then("b0.a.head1")
    patched = ex.patch(split, value_path, {"toks_int_var": source})

    def patched_stream(resid, heads):
        return resid - heads[(0, 1)] + source_heads[(0, 1)]

    expected, _, _ = forward(w, toks, value_resid={(1, 2): patched_stream})
    torch.testing.assert_close(patched.evaluate(), expected, **TOL)
    # and it is not the same as patching the head everywhere
    everywhere, _, _ = forward(w, toks, override={(0, 1): source_heads[(0, 1)]})
    assert not torch.allclose(expected, everywhere)
    # the rest of the circuit still uses the target run's head 0.1
    assert split.get_unique("b0.a.head1") in patched.get("b0.a.head1")


# ------------------------------------------------------------------- metrics


def test_mean_loss(setup):
    w, toks, split = setup
    loss, _, _ = forward(w, toks)
    assert ex.mean_loss(split) == pytest.approx(float(loss.mean()), abs=1e-12)
    assert ex.mean_loss.circuit(split).shape == ()


@pytest.mark.parametrize("push_down", [True, False])
def test_logit_difference(setup, push_down):
    w, toks, split = setup
    _, logits, _ = forward(w, toks)
    metric = ex.logit_diff(-1, good=3, bad=5, push_down=push_down)
    expected = (logits[:, -1, 3] - logits[:, -1, 5]).mean()
    assert metric(split) == pytest.approx(float(expected), abs=1e-10)
    per_row = ex.logit_diff(2, good=torch.tensor([1, 4]), bad=[0, 0], push_down=push_down)
    expected = ((logits[0, 2, 1] - logits[0, 2, 0]) + (logits[1, 2, 4] - logits[1, 2, 0])) / 2
    assert per_row(split) == pytest.approx(float(expected), abs=1e-10)
    with pytest.raises(cc.errors.ExperimentError, match="token ids"):
        ex.logit_diff(0, good=[1, 2, 3], bad=0)(split)


@pytest.mark.parametrize(
    "good, shown",
    [
        (3.7, "good must be integer token ids"),
        (torch.tensor([3.0, 4.0]), r"good must be integer token ids.*torch.float32"),
        (True, "good must be integer token ids"),
        ([3, True], "good must be integer token ids"),
        ("3", "good must be integer token ids"),
        (None, "good must be integer token ids"),
    ],
)
def test_logit_difference_refuses_ids_that_are_not_integers(good, shown):
    """A float id would be read as its integer part (3.7 as token 3): refused when the metric is made."""
    with pytest.raises(cc.errors.ExperimentError, match=shown):
        ex.logit_diff(-1, good=good, bad=2)
    with pytest.raises(cc.errors.ExperimentError, match=shown.replace("good", "bad")):
        ex.logit_diff(-1, good=2, bad=good)


def test_logit_difference_refuses_a_position_that_is_not_an_int():
    with pytest.raises(cc.errors.ExperimentError, match="position must be an int, got 2.0"):
        ex.logit_diff(2.0, good=1, bad=2)


def test_logit_difference_ids_of_integer_types_are_read_as_given(setup):
    import numpy as np

    w, toks, split = setup
    _, logits, _ = forward(w, toks)
    expected = float((logits[:, 2, 4] - logits[:, 2, 1]).mean())
    for good, bad in (
        (np.int32(4), torch.tensor(1, dtype=torch.uint8)),
        (torch.tensor([4, 4]), np.array([1, 1])),
    ):
        assert ex.logit_diff(2, good=good, bad=bad)(split) == pytest.approx(expected, abs=1e-10)
    ids = torch.tensor([4, 4])
    metric = ex.logit_diff(2, good=ids, bad=1)
    ids[0] = 0  # the metric keeps the ids it was given
    assert metric(split) == pytest.approx(expected, abs=1e-10)


def test_a_metric_whose_circuit_is_not_one_number_is_refused(setup):
    _, _, split = setup
    per_token = ex.Metric(lambda c: c.get_unique("t.loss"), "per_token_loss")
    with pytest.raises(
        cc.errors.ExperimentError,
        match=r"metric per_token_loss: .* has shape \[2, 6\]; a metric gives one number",
    ):
        per_token(split)


def test_logit_difference_push_down_computes_less(setup):
    _, _, split = setup
    pushed = ex.logit_diff(-1, good=3, bad=5).circuit(split)
    assert pushed.get_unique("metric.logits_at").kind == "Einsum"  # the unembedding itself, at one position
    assert pushed.get_unique("final.call").shape == (2, CONFIG.d_model)


@pytest.mark.parametrize("position", [-1, 3])
def test_logit_difference_computes_no_layer_below_the_last_twice(position):
    """The index stops at the stream the last layer reads: below it every position is computed
    anyway (keys and values), so a second pass for the measured position would only add work
    (6 times the forward's CPU time on SmolLM2's 30 layers).  The value is the logits' own."""
    config = factories.llama_config(n_layers=4)
    toks = factories.token_ids(config.vocab_size, (2, 7), seed=3)
    circuit = factories.llama_circuit(toks, config, convention="prompt")
    metric = ex.logit_diff(position, good=torch.tensor([1, 4]), bad=2)
    logits = circuit.evaluate()
    expected = (logits[[0, 1], position, [1, 4]] - logits[:, position, 2]).mean()
    assert metric(circuit) == pytest.approx(float(expected), abs=1e-6)
    pushed = metric.circuit(circuit)
    matmuls = {name: cc.cost(c).total.flops["matmul"] for name, c in (("metric", pushed), ("model", circuit))}
    assert matmuls["metric"] < matmuls["model"]  # less than one forward: no layer runs twice
    assert pushed.get_unique("b2").shape == (2, 7, config.d_model)  # the stream the last layer reads
    assert pushed.get_unique("final.call").shape == (2, config.d_model)  # normed at one position


def test_kl_divergence_from_the_clean_run(setup):
    w, toks, split = setup
    ablated = ex.zero_ablate(split, "b0.a.head0")
    _, clean_logits, _ = forward(w, toks)
    _, logits, _ = forward(w, toks, override={(0, 0): torch.zeros(())})
    p, q = torch.log_softmax(clean_logits, -1), torch.log_softmax(logits, -1)
    expected = (p.exp() * (p - q)).sum(-1).mean()
    metric = ex.kl_div(split)
    assert metric(ablated) == pytest.approx(float(expected), abs=1e-12)
    assert metric(split) == pytest.approx(0.0, abs=1e-12)


def test_metric_node_missing_is_an_error():
    x = cc.Array(torch.ones(3), name="x")
    with pytest.raises(cc.errors.ExperimentError, match="'t.loss'"):
        ex.mean_loss(x)


# -------------------------------------------------------------------- sweeps


def test_sweep_equals_each_ablation_evaluated_alone(setup):
    _, _, split = setup
    names = ex.head_names(split)
    assert names == [f"b{layer}.a.head{head}" for layer in range(2) for head in range(3)]
    table = ex.sweep(split, names, progress=False)
    assert list(table) == names
    assert table.baseline == pytest.approx(float(split.evaluate().mean()), abs=1e-12)
    for name in names:
        alone = float(ex.zero_ablate(split, name).evaluate().mean())
        assert table[name] == pytest.approx(alone, abs=1e-12)
    record = table.records[4]
    assert record["target"] == "b1.a.head1" and (record["layer"], record["head"]) == (1, 1)
    assert record["delta"] == pytest.approx(record["metric"] - record["baseline"])
    lru = ex.sweep(split, names, policy="lru", progress=False)
    assert dict(lru) == pytest.approx(dict(table), abs=1e-12)


def test_sweep_to_pandas(setup):
    pandas = pytest.importorskip("pandas")
    _, _, split = setup
    frame = ex.sweep(split, ex.head_names(split), progress=False).to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    table = frame.pivot(index="layer", columns="head", values="metric")
    assert table.shape == (2, 3)


def test_sweep_with_other_ablations_metrics_and_labels(setup):
    w, toks, split = setup
    dataset = tokens(21, batch=4)
    ev = cc.Evaluator(2**24)
    ablation = functools.partial(ex.mean_ablate, dataset_inputs={"toks_int_var": dataset}, evaluator=ev)
    targets = {"L0H1": "b0.a.head1", "L1H0": "b1.a.head0"}
    table = ex.sweep(split, targets, ablation, ex.kl_div(split), evaluator=ev, progress=False)
    assert list(table) == ["L0H1", "L1H0"] and table.baseline == pytest.approx(0.0, abs=1e-12)
    for label, target in targets.items():
        assert table[label] == pytest.approx(ex.kl_div(split)(ablation(split, target)), abs=1e-12)
    # a plain function of the evaluated root is a metric too
    last = ex.sweep(split, ["b0.a.head0"], metric=lambda loss: loss[:, -1].mean(), progress=False)
    expected, _, _ = forward(w, toks, override={(0, 0): torch.zeros(())})
    assert last["b0.a.head0"] == pytest.approx(float(expected[:, -1].mean()), abs=1e-10)


def test_sweep_reports_a_bad_target_before_evaluating(setup):
    _, _, split = setup
    ev = cc.Evaluator(2**24)
    with pytest.raises(cc.errors.ExperimentError, match="b9.a.head0"):
        ex.sweep(split, ["b0.a.head0", "b9.a.head0"], evaluator=ev, progress=False)
    assert ev.stats.computed == 0


def test_sweep_recomputes_only_what_each_ablation_changed(setup):
    _, _, split = setup
    names = ex.head_names(split)
    ev = cc.Evaluator(2**26)
    ex.sweep(split, names, evaluator=ev, progress=False)
    clean = ex.mean_loss.circuit(split)
    full = sum(1 for n in cc.unique_nodes([clean]) if n.children)
    per_head = []
    for name in names:
        ablated = ex.mean_loss.circuit(ex.zero_ablate(split, name))
        per_head.append(sum(1 for n in cc.unique_nodes([ablated]) if n.children))
    # far less than a full evaluation per head: the clean run once, then what changed
    assert ev.stats.computed < full + sum(per_head) / 2


@pytest.mark.parametrize("presplit", [True, False])
def test_gpt2_sweep_matches_transformer_lens_style_hooks(presplit):
    """On GPT-2 (biases, MLPs): zeroing head h's z in torch equals the sweep's zero ablation."""
    config = models.GPT2Config(n_layers=2, n_heads=2, d_model=8, vocab_size=13, n_ctx=16)
    w = models.gpt2_random_weights(config, seed=4, dtype=torch.float64)
    toks = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(5))
    circuit = models.build_gpt2(config, w, toks)
    if presplit:
        circuit = cc.passes.split_heads(circuit)
    table = ex.sweep(circuit, ex.head_names(circuit), progress=False)
    for layer in range(2):
        for head in range(2):
            zeroed = dict(w)
            zeroed[f"a{layer}.w.o"] = w[f"a{layer}.w.o"].clone()
            zeroed[f"a{layer}.w.o"][head] = 0  # z[:, :, head] = 0 is W_O[head] = 0
            expected = models.build_gpt2(config, zeroed, toks).evaluate().mean()
            assert table[f"b{layer}.a.head{head}"] == pytest.approx(float(expected), abs=1e-10)


def test_head_names_of_unsplit_and_partly_split_circuits(setup):
    w, toks, _ = setup
    masked = cc.passes.causal_mask(models.build_attn_only(CONFIG, w, toks))
    every = [f"b{layer}.a.head{head}" for layer in range(2) for head in range(3)]
    assert ex.head_names(masked) == every
    assert ex.head_names(cc.passes.split_heads(masked, layers=[1])) == every
    grouped = cc.passes.split_heads(masked, layers=[0], heads=[[0, 1], [2]])
    assert ex.head_names(grouped) == ["b0.a.head0-1", "b0.a.head2"] + every[3:]


def test_sweep_of_an_unsplit_circuit_splits_one_layer_per_target(setup):
    """Head names on unsplit layers: the same values as the split circuit's, and as torch's."""
    w, toks, split = setup
    masked = cc.passes.causal_mask(models.build_attn_only(CONFIG, w, toks))
    names = ex.head_names(masked)
    table = ex.sweep(masked, names, progress=False)
    on_split = ex.sweep(split, names, progress=False)
    assert table.baseline == pytest.approx(on_split.baseline, abs=1e-12)
    for name in names:
        layer, head = int(name[1]), int(name[-1])
        expected, _, _ = forward(w, toks, override={(layer, head): torch.zeros(())})
        assert table[name] == pytest.approx(float(expected.mean()), abs=1e-12)
        assert table[name] == pytest.approx(on_split[name], abs=1e-12)
    group = ex.sweep(masked, ["b1.a.head0-1"], progress=False)
    zeros = {(1, 0): torch.zeros(()), (1, 1): torch.zeros(())}
    assert group["b1.a.head0-1"] == pytest.approx(
        float(forward(w, toks, override=zeros)[0].mean()), abs=1e-12
    )
    with pytest.raises(cc.errors.ExperimentError, match="b1.a.head7"):
        ex.sweep(masked, ["b1.a.head7"], progress=False)
