"""Patching grids: every ``act_patch_*`` against TransformerLens's ``patching`` module on the same
weights, the attention-only model against a torch forward, executors, and bad input."""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import pickle

import factories
import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.experiments import causal_suffix, patch_batches
from circuits.experiments.inputs import same_shape_inputs


from circuits.experiments import patching_grids as grids
from experiments_reference import CONFIG, forward, resid_pres, tokens, weights

TOL = 1e-4
GOOD, BAD = torch.tensor([3, 5, 7]), torch.tensor([2, 2, 11])


def _inputs(vocab: int, batch: int = 3, seq: int = 8):
    """Clean tokens [batch, seq + 1] and corrupted ones differing at positions 1, 4 and 6."""
    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    corrupted = clean.clone()
    corrupted[:, [1, 4, 6]] = (
        clean[:, [1, 4, 6]] + 1 + torch.randint(0, vocab - 1, (batch, 3), generator=generator)
    ) % vocab
    return clean, corrupted


def _reference_metric(logits: torch.Tensor, position: int = -1) -> torch.Tensor:
    """Logit difference at ``position`` (the last by default), written in torch (TransformerLens's metric)."""
    last = logits[:, position]
    rows = torch.arange(last.shape[0])
    return (last[rows, GOOD[: last.shape[0]]] - last[rows, BAD[: last.shape[0]]]).mean()


def _reference_metric_at_4(logits: torch.Tensor) -> torch.Tensor:
    return _reference_metric(logits, 4)


# ------------------------------------------------------------------ TransformerLens


@pytest.fixture(scope="module")
def gpt2_setup():
    model = factories.tl_model("gpt2", True)  # d_model 12, 3 heads, d_head 4, d_mlp 20, vocab 17, 2 layers
    clean, corrupted = _inputs(17)
    circuit = cm.from_transformer_lens(model, clean, family="gpt2", causal=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean[:, :-1])
    return model, circuit, cache, clean, corrupted


@pytest.mark.slow  # importing TransformerLens alone takes seconds
@pytest.mark.parametrize("grid", [*grids.GRIDS, *grids.EVERY])
def test_every_grid_equals_transformer_lens(gpt2_setup, grid):
    patching = pytest.importorskip("transformer_lens.patching")
    model, circuit, cache, clean, corrupted = gpt2_setup
    with torch.no_grad():
        expected = getattr(patching, f"get_act_patch_{grid}")(
            model, corrupted[:, :-1], cache, _reference_metric
        )
    assert expected.abs().max() > 0.05  # the patches matter
    ours = getattr(grids, f"act_patch_{grid}")(
        circuit, {"toks_int_var": corrupted}, ex.metrics.logit_diff(-1, GOOD, BAD), patches_per_run=5
    )
    assert ours.values.shape == expected.shape
    assert (ours.values - expected).abs().max().item() < TOL, grid
    assert len(ours.records) == expected.numel()
    slow = grids.patch_grid(circuit, {"toks_int_var": corrupted}, _reference_metric, grid)  # the general path
    assert (slow.values - expected).abs().max().item() < TOL, grid


@pytest.mark.slow
@pytest.mark.parametrize("grid", [*grids.GRIDS, *grids.EVERY])
def test_every_grid_at_an_earlier_position_equals_transformer_lens(gpt2_setup, grid):
    """The metric at position 4 of 8: a run of patches all after it cannot reach it (zero effect)."""
    patching = pytest.importorskip("transformer_lens.patching")
    model, circuit, cache, clean, corrupted = gpt2_setup
    with torch.no_grad():
        expected = getattr(patching, f"get_act_patch_{grid}")(
            model, corrupted[:, :-1], cache, _reference_metric_at_4
        )
        unpatched = float(_reference_metric_at_4(model(corrupted[:, :-1])))
    metric = ex.metrics.logit_diff(4, GOOD, BAD)
    # runs of two positions: [0, 1], ..., [6, 7]; the last lies wholly after position 4
    ours = getattr(grids, f"act_patch_{grid}")(
        circuit, {"toks_int_var": corrupted}, metric, patches_per_run=5, positions_per_run=2
    )
    assert ours.values.shape == expected.shape
    assert (ours.values - expected).abs().max().item() < TOL, grid
    if "all_pos" not in grid:  # a patch after position 4 leaves the metric as the corrupted run has it
        records = ours.records
        later = [r["value"] for r in records if r["pos"] is not None and r["pos"] > 4]
        assert later and all(abs(value - unpatched) < TOL for value in later)


@pytest.mark.slow
@pytest.mark.parametrize("grid", [*grids.GRIDS, *grids.EVERY])
def test_every_grid_of_a_late_corruption_equals_transformer_lens(gpt2_setup, grid):
    """Clean and corrupted differ at position 5 of 8 only: the positions before it are never
    recomputed (``PatchRun.first_change``), and every grid is still TransformerLens's."""
    patching = pytest.importorskip("transformer_lens.patching")
    model, circuit, cache, clean, _ = gpt2_setup
    corrupted = clean.clone()
    corrupted[:, 5] = (clean[:, 5] + 1) % 17
    with torch.no_grad():
        expected = getattr(patching, f"get_act_patch_{grid}")(
            model, corrupted[:, :-1], cache, _reference_metric
        )
    assert expected.abs().max() > 0.05  # the patches matter
    ours = grids.patch_grid(
        circuit, {"toks_int_var": corrupted}, ex.metrics.logit_diff(-1, GOOD, BAD), grid, patches_per_run=5
    )
    assert (ours.values - expected).abs().max().item() < TOL, grid


@pytest.mark.slow
def test_mean_loss_grid_scores_the_clean_targets_as_transformer_lens_users_do(gpt2_setup):
    """TransformerLens's metric is a function of the logits; its users score the clean prompt's next tokens."""
    patching = pytest.importorskip("transformer_lens.patching")
    model, circuit, cache, clean, corrupted = gpt2_setup

    def loss_on(targets):
        def metric(logits):
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[:, 1:].flatten())

        return metric

    inputs = {"toks_int_var": corrupted}
    for metric, targets in ((ex.mean_loss, clean), (ex.mean_loss.with_targets("corrupted"), corrupted)):
        with torch.no_grad():
            expected = patching.get_act_patch_resid_pre(model, corrupted[:, :-1], cache, loss_on(targets))
        ours = grids.act_patch_resid_pre(circuit, inputs, metric)
        assert (ours.values - expected).abs().max().item() < TOL, metric
    clean_scored = grids.act_patch_resid_pre(circuit, inputs, ex.mean_loss).values
    assert (clean_scored - ours.values).abs().max() > 0.1  # the two targets differ: the check can fail


@pytest.mark.slow
def test_records_name_each_patch(gpt2_setup):
    _, circuit, _, _, corrupted = gpt2_setup
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    result = grids.act_patch_attn_head_out_by_pos(circuit, {"toks_int_var": corrupted}, metric)
    for record in result.records:
        assert set(record) == {"layer", "pos", "head", "value"}
        assert result.values[record["layer"], record["pos"], record["head"]].item() == record["value"]
    pattern = grids.act_patch_attn_head_pattern_by_pos(circuit, {"toks_int_var": corrupted}, metric)
    assert all(pattern.values[r["layer"], r["head"], r["pos"]].item() == r["value"] for r in pattern.records)
    every = grids.act_patch_block_every(circuit, {"toks_int_var": corrupted}, metric)
    assert [r["grid"] for r in every.records[:: len(every.records) // 3]] == [
        "resid_pre",
        "attn_out",
        "mlp_out",
    ]


# ------------------------------------------------------------------ attention-only against torch


def _torch_head_grid(w, clean, corrupted, per_position: bool) -> torch.Tensor:
    """The head-output grid by (layer, pos, head) or (layer, head), from the torch forward."""
    _, _, clean_heads = forward(w, clean)
    _, _, corrupted_heads = forward(w, corrupted)
    seq = clean.shape[1] - 1
    shape = (CONFIG.n_layers, seq, CONFIG.n_heads) if per_position else (CONFIG.n_layers, CONFIG.n_heads)
    expected = torch.zeros(shape, dtype=torch.float64)
    for layer in range(CONFIG.n_layers):
        for head in range(CONFIG.n_heads):
            for pos in range(seq) if per_position else [None]:
                patched = corrupted_heads[(layer, head)].clone()
                where = slice(None) if pos is None else pos
                patched[:, where] = clean_heads[(layer, head)][:, where]
                _, logits, _ = forward(w, corrupted, override={(layer, head): patched})
                index = (layer, head) if pos is None else (layer, pos, head)
                expected[index] = _reference_metric(logits)
    return expected


def _attention_only_setup():
    w = weights()
    clean = tokens(3)
    corrupted = clean.clone()
    corrupted[:, [0, 2, 5]] = (clean[:, [0, 2, 5]] + 1) % CONFIG.vocab_size
    return w, clean, corrupted, cc.passes.causal_mask(cm.build_attn_only(CONFIG, w, clean))


EARLIER = 2  # the measured position of the tests below (of 6)


def _at_earlier(logits):
    rows = torch.arange(2)
    return float((logits[rows, EARLIER, GOOD[:2]] - logits[rows, EARLIER, BAD[:2]]).mean())


@pytest.fixture(scope="module")
def earlier_expected():
    """The resid_pre and head-output grids with the metric at position 2, by hand patching in torch."""
    w, clean, corrupted, _ = _attention_only_setup()
    clean_resid, corrupted_resid = resid_pres(w, clean), resid_pres(w, corrupted)
    _, _, clean_heads = forward(w, clean)
    _, _, corrupted_heads = forward(w, corrupted)
    seq = clean.shape[1] - 1
    resid = torch.zeros(CONFIG.n_layers, seq, dtype=torch.float64)
    heads = torch.zeros(CONFIG.n_layers, seq, CONFIG.n_heads, dtype=torch.float64)
    for layer in range(CONFIG.n_layers):
        for pos in range(seq):
            patched = corrupted_resid[layer].clone()
            patched[:, pos] = clean_resid[layer][:, pos]
            resid[layer, pos] = _at_earlier(forward(w, corrupted, resid_pre={layer: patched})[1])
            for head in range(CONFIG.n_heads):
                patched = corrupted_heads[(layer, head)].clone()
                patched[:, pos] = clean_heads[(layer, head)][:, pos]
                heads[layer, pos, head] = _at_earlier(
                    forward(w, corrupted, override={(layer, head): patched})[1]
                )
    return resid, heads, _at_earlier(forward(w, corrupted)[1])


@pytest.mark.parametrize("positions_per_run", [1, 8])
def test_grids_measured_before_the_last_position_equal_torch(earlier_expected, positions_per_run):
    """The metric at position 2 of 6: patches at positions 3 to 5 cannot reach it, so they leave the
    metric exactly as the corrupted run has it (the grid used to fail with 'iteration over a 0-d
    tensor' when a run of patches all lay after the measured position)."""
    expected_resid, expected_heads, unpatched = earlier_expected
    later = expected_resid[:, EARLIER + 1 :]
    assert torch.equal(later, torch.full_like(later, unpatched))  # torch: no effect at all
    assert expected_resid[:, : EARLIER + 1].std() > 1e-3  # the earlier patches matter
    _, _, corrupted, circuit = _attention_only_setup()
    metric = ex.metrics.logit_diff(EARLIER, GOOD[:2], BAD[:2])
    inputs = {"toks_int_var": corrupted}
    options = {"patches_per_run": 4, "positions_per_run": positions_per_run}
    resid = grids.act_patch_resid_pre(circuit, inputs, metric, **options)
    heads = grids.act_patch_attn_head_out_by_pos(circuit, inputs, metric, **options)
    assert (resid.values - expected_resid).abs().max().item() < 1e-9
    assert (heads.values - expected_heads).abs().max().item() < 1e-9
    for values in (resid.values[:, EARLIER + 1 :], heads.values[:, EARLIER + 1 :]):
        assert (values - unpatched).abs().max().item() < 1e-12  # zero effect, not a near miss


@pytest.mark.parametrize("per_position", [True, False])
def test_attention_only_head_grids_equal_torch(per_position):
    w = weights()
    clean = tokens(3)
    corrupted = clean.clone()
    corrupted[:, [0, 2, 5]] = (clean[:, [0, 2, 5]] + 1) % CONFIG.vocab_size
    circuit = cc.passes.causal_mask(cm.build_attn_only(CONFIG, w, clean))
    grid = "attn_head_out_by_pos" if per_position else "attn_head_out_all_pos"
    expected = _torch_head_grid(w, clean, corrupted, per_position)
    ours = grids.patch_grid(
        circuit, {"toks_int_var": corrupted}, ex.metrics.logit_diff(-1, GOOD[:2], BAD[:2]), grid
    )
    assert expected.std() > 1e-4  # the patches differ (float64: the tolerance below is far smaller)
    assert (ours.values - expected).abs().max().item() < 1e-9


def test_a_corruption_of_late_positions_only_gives_the_torch_grids():
    """Clean and corrupted equal before position 3 (of 6): no run recomputes those positions (the
    patches there are no-ops), and every value still equals patching the torch forward by hand."""
    w = weights()
    clean = tokens(3)
    corrupted = clean.clone()
    corrupted[:, [3, 5]] = (clean[:, [3, 5]] + 1) % CONFIG.vocab_size
    circuit = cc.passes.causal_mask(cm.build_attn_only(CONFIG, w, clean))
    inputs, metric = {"toks_int_var": corrupted}, ex.metrics.logit_diff(-1, GOOD[:2], BAD[:2])
    clean_resid, corrupted_resid = resid_pres(w, clean), resid_pres(w, corrupted)
    expected = torch.zeros(CONFIG.n_layers, clean.shape[1] - 1, dtype=torch.float64)
    for layer, pos in itertools.product(range(CONFIG.n_layers), range(clean.shape[1] - 1)):
        patched = corrupted_resid[layer].clone()
        patched[:, pos] = clean_resid[layer][:, pos]
        expected[layer, pos] = _reference_metric(forward(w, corrupted, resid_pre={layer: patched})[1])
    unpatched = _reference_metric(forward(w, corrupted)[1])
    assert torch.equal(expected[:, :3], torch.full_like(expected[:, :3], float(unpatched)))
    assert expected[:, 3:].std() > 1e-3  # the later patches matter
    run = patch_batches.PatchRun(
        circuit, ex.with_inputs(circuit, inputs)[0], ex.Point("resid_pre", 1), metric, cc.Evaluator(2**26)
    )
    assert run.first_change == 3  # what the runs skip: positions 0 to 2
    for options in ({"positions_per_run": 1}, {"positions_per_run": 8, "patches_per_run": 4}):
        resid = grids.act_patch_resid_pre(circuit, inputs, metric, **options)
        assert (resid.values - expected).abs().max().item() < 1e-9
    for per_position in (True, False):
        grid = "attn_head_out_by_pos" if per_position else "attn_head_out_all_pos"
        heads = grids.patch_grid(circuit, inputs, metric, grid)
        torch_grid = _torch_head_grid(w, clean, corrupted, per_position)
        assert (heads.values - torch_grid).abs().max().item() < 1e-9


def test_the_layers_of_a_grid_share_one_cache(monkeypatch):
    """One Evaluator for the whole local grid: the second layer reads the clean and corrupted runs
    the first computed.  (An empty Evaluator is falsy, and ``evaluator or Evaluator(...)`` gave
    every layer a fresh one: on SmolLM2 each layer recomputed both runs, 10 s of CPU a layer.)"""
    made = []

    class Counted(cc.Evaluator):
        def __init__(self, cache_bytes):
            super().__init__(cache_bytes)
            made.append(self)

    monkeypatch.setattr(grids, "Evaluator", Counted)
    circuit, corrupted = _small_gpt2()
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    grids.act_patch_attn_head_out_all_pos(circuit, {"toks_int_var": corrupted}, metric)
    assert len(made) == 1 and made[0].stats.hits > 0


def test_first_change_is_the_first_position_where_any_value_differs():
    clean = torch.zeros(2, 3, 5, 4)  # [batch, head, pos, d]
    corrupted = clean.clone()
    assert patch_batches.first_change(clean, corrupted) == 4  # equal throughout: the last position
    corrupted[1, 2, 3, 0] = 1.0
    assert patch_batches.first_change(clean, corrupted) == 3
    corrupted[0, 0, 1, 3] = float("nan")
    assert patch_batches.first_change(clean, corrupted) == 1  # NaN is a change, never "equal"
    clean[0, 0, 1, 3] = float("nan")
    assert patch_batches.first_change(clean, corrupted) == 1


# ------------------------------------------------------------------ executors and bad input


class _InlineExecutor(concurrent.futures.Executor):
    """Runs each task at once, in this process, after a pickle round trip (as a process pool would)."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        fn, args = pickle.loads(pickle.dumps((fn, args)))
        future.set_result(fn(*args, **kwargs))
        return future


def _small_gpt2():
    clean, corrupted = _inputs(17)
    return factories.gpt2_circuit(clean, factories.gpt2_config(d_mlp=20)), corrupted


def test_an_executor_gives_the_local_grid():
    circuit, corrupted = _small_gpt2()
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    local = grids.act_patch_attn_head_q_by_pos(circuit, {"toks_int_var": corrupted}, metric)
    inline = grids.act_patch_attn_head_q_by_pos(
        circuit, {"toks_int_var": corrupted}, metric, executor=_InlineExecutor()
    )
    assert torch.equal(inline.values, local.values) and inline.records == local.records


@pytest.mark.slow  # starting spawned workers (each imports torch) takes about 20 s here
def test_a_spawned_process_pool_gives_the_local_grid():
    """A fork-started pool: tests/test_sweep_executor.py, in a subprocess that may not hang the suite."""
    circuit, corrupted = _small_gpt2()
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=spawn) as pool:
        pooled = grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric, executor=pool)
    assert torch.equal(
        pooled.values, grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric).values
    )


def test_bad_input_is_named():
    circuit, corrupted = _small_gpt2()
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    with pytest.raises(cc.errors.ExperimentError, match=r"\[3, 9\].*\[2, 9\]"):
        grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted[:2]}, metric)
    with pytest.raises(cc.errors.ExperimentError, match="unknown grid 'resid_post_by_head'"):
        grids.patch_grid(circuit, {"toks_int_var": corrupted}, metric, "resid_post_by_head")
    with pytest.raises(cc.errors.ExperimentError, match="'tokens'"):
        grids.act_patch_resid_pre(circuit, {"tokens": corrupted}, metric)
    with pytest.raises(
        cc.errors.ExperimentError, match=r"point \('q', 0\) finds 3 nodes.*before split_heads"
    ):
        grids.act_patch_attn_head_q_by_pos(
            cc.passes.split_heads(circuit), {"toks_int_var": corrupted}, metric
        )
    with pytest.raises(cc.errors.ExperimentError, match="patches_per_run"):
        grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric, patches_per_run=0)
    with pytest.raises(cc.errors.ExperimentError, match="metric"):
        grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, "logit_diff")


def _last_logits(logits):
    return logits[:, -1, 3]  # one number per row, not one number


@pytest.mark.parametrize(
    "metric, shown",
    [
        (_last_logits, r"metric _last_logits gave a Tensor of shape \[3\].*not one number"),
        (lambda logits: "0.5", "gave a str"),
        (lambda logits: None, "gave a NoneType"),
        (ex.Metric(lambda c: c.get_unique("t.loss"), "per_token"), r"metric per_token: .*shape \[3, 8\]"),
    ],
)
def test_a_metric_that_is_not_one_number_is_named(metric, shown):
    circuit, corrupted = _small_gpt2()
    with pytest.raises(cc.errors.ExperimentError, match=shown):
        grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric)


def test_a_model_without_mlps_has_no_mlp_grid():
    w, clean, corrupted, circuit = _attention_only_setup()
    with pytest.raises(cc.errors.ExperimentError, match="the model has no MLP") as raised:
        grids.act_patch_mlp_out(circuit, {"toks_int_var": corrupted}, ex.metrics.logit_diff(-1, 1, 2))
    assert "split_heads" not in str(raised.value)


@pytest.mark.slow
@pytest.mark.parametrize("grid", ["resid_pre", "attn_head_k_by_pos"])
def test_bidirectional_attention_patches_every_position(grid):
    """Without a causal mask a patch reaches earlier positions too: no suffix shortcut."""
    patching = pytest.importorskip("transformer_lens.patching")
    model = factories.tl_model("gpt2", False)
    clean, corrupted = _inputs(17)
    circuit = cm.from_transformer_lens(model, clean, family="gpt2", causal=False)
    assert not causal_suffix.is_causal(circuit)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean[:, :-1])
        expected = getattr(patching, f"get_act_patch_{grid}")(
            model, corrupted[:, :-1], cache, _reference_metric
        )
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    ours = grids.patch_grid(circuit, {"toks_int_var": corrupted}, metric, grid, positions_per_run=1)
    assert (ours.values - expected).abs().max().item() < TOL


@pytest.mark.parametrize("targets", ["clean", "corrupted"])
@pytest.mark.parametrize("grid", ["attn_head_out_all_pos", "resid_pre"])
def test_mean_loss_grid_scores_the_targets_it_names(targets, grid):
    """``ex.mean_loss`` scores the clean prompt's next tokens (TransformerLens users' metric);
    ``with_targets("corrupted")`` the corrupted prompt's: the patched run's loss, against torch
    with the targets written out."""
    w = weights()
    clean = tokens(4)
    corrupted = clean.clone()
    corrupted[:, [1, 3]] = (clean[:, [1, 3]] + 2) % CONFIG.vocab_size  # inputs and targets differ
    circuit = cc.passes.causal_mask(cm.build_attn_only(CONFIG, w, clean))
    scored = (clean if targets == "clean" else corrupted)[:, 1:]
    metric = ex.mean_loss if targets == "clean" else ex.mean_loss.with_targets("corrupted")
    assert metric.targets == targets
    ours = grids.patch_grid(circuit, {"toks_int_var": corrupted}, metric, grid)
    if grid == "resid_pre":
        clean_resid, corrupted_resid = resid_pres(w, clean), resid_pres(w, corrupted)
        cells = [(layer, pos) for layer in range(CONFIG.n_layers) for pos in range(clean.shape[1] - 1)]
    else:
        _, _, clean_heads = forward(w, clean)
        cells = [(layer, head) for layer in range(CONFIG.n_layers) for head in range(CONFIG.n_heads)]
    for layer, i in cells:
        if grid == "resid_pre":
            patched = corrupted_resid[layer].clone()
            patched[:, i] = clean_resid[layer][:, i]
            loss, _, _ = forward(w, corrupted, resid_pre={layer: patched}, targets=scored)
        else:
            loss, _, _ = forward(w, corrupted, override={(layer, i): clean_heads[(layer, i)]}, targets=scored)
        assert abs(ours.values[layer, i].item() - loss.mean().item()) < 1e-9, (layer, i)
    assert ours.values.std() > 1e-6
    other = ex.mean_loss.with_targets("corrupted" if targets == "clean" else "clean")
    other_values = grids.patch_grid(circuit, {"toks_int_var": corrupted}, other, grid).values
    assert (other_values - ours.values).abs().min() > 0.01  # the two targets differ: the check can fail


def test_metrics_that_read_no_targets_are_the_same_for_either():
    w, clean, corrupted, circuit = _attention_only_setup()
    metric = ex.metrics.logit_diff(-1, GOOD[:2], BAD[:2])
    inputs = {"toks_int_var": corrupted}
    assert torch.equal(
        grids.act_patch_resid_pre(circuit, inputs, metric).values,
        grids.act_patch_resid_pre(circuit, inputs, metric.with_targets("corrupted")).values,
    )
    with pytest.raises(cc.errors.ExperimentError, match="targets must be 'clean' or 'corrupted'"):
        ex.mean_loss.with_targets("source")


def test_the_causal_suffix_changes_no_value():
    circuit, _ = _small_gpt2()
    assert causal_suffix.is_causal(circuit)
    prefixes = {name: circuit.get_unique(name).evaluate() for name in ("b0", "b1")}
    for position in (1, 5, 7):
        suffixed = causal_suffix.from_position(circuit, position, prefixes)
        assert torch.equal(suffixed.evaluate(), circuit.evaluate())
        assert circuit.get_unique("b1").shape == suffixed.get_unique("b1").shape


def test_the_measured_position_is_not_computed_twice_below_the_top_layer():
    """Every position of each layer but the last is computed for the next layer's keys and values,
    so ``logit_diff``'s index at the last position goes through the last layer only: each lower
    MLP is one node over every position, not one more for the measured position.  (The values are
    TransformerLens's: the tests above.)"""
    clean, corrupted = _inputs(17)
    circuit = factories.gpt2_circuit(clean, factories.gpt2_config(n_layers=3, d_mlp=20))
    corrupted_circuit = same_shape_inputs(circuit, {"toks_int_var": corrupted}, "test")
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    run = patch_batches.PatchRun(
        circuit, corrupted_circuit, ex.Point("resid_pre", 0), metric, cc.Evaluator(2**24)
    )
    mlps = sorted(
        (node.name, node.shape) for node in cc.unique_nodes(run.measured) if (node.name or "").endswith(".m")
    )
    assert mlps == [("b0.m", (3, 8, 12)), ("b1.m", (3, 8, 12)), ("b2.m", (3, 12))]


@pytest.mark.parametrize("grid", ["resid_pre", "attn_head_out_all_pos", "block_every"])
def test_a_grid_of_some_layers_is_those_rows_of_the_whole_grid(grid):
    """``layers=``: the whole grid's rows, in the order asked for, and records naming the true layer."""
    circuit, corrupted = _small_gpt2()
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    whole = grids.patch_grid(circuit, {"toks_int_var": corrupted}, metric, grid)
    part = grids.patch_grid(circuit, {"toks_int_var": corrupted}, metric, grid, layers=iter([1, 0]))
    layer_axis = 1 if grid in grids.EVERY else 0
    assert torch.equal(part.values, whole.values.index_select(layer_axis, torch.tensor([1, 0])))
    assert sorted(map(str, part.records)) == sorted(map(str, whole.records))  # each names its layer


@pytest.mark.parametrize("layers", [[], [2], [0, 0], [-1], [True], "01", 1])
def test_bad_layers_are_named(layers):
    circuit, corrupted = _small_gpt2()
    with pytest.raises(cc.errors.ExperimentError, match=r"layers=.*distinct layer numbers in \[0, 2\)"):
        grids.act_patch_resid_pre(
            circuit, {"toks_int_var": corrupted}, ex.metrics.logit_diff(-1, GOOD, BAD), layers=layers
        )
