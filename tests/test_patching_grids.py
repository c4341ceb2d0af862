"""Patching grids: every ``act_patch_*`` against TransformerLens's ``patching`` module on the same
weights, the attention-only model against a torch forward, executors, and bad input."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import pickle

import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.experiments import causal_suffix
from circuits.experiments import patching_grids as grids
from experiments_reference import CONFIG, forward, tokens, weights

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


def _reference_metric(logits: torch.Tensor) -> torch.Tensor:
    """Logit difference at the last position, written in torch (TransformerLens's metric)."""
    last = logits[:, -1]
    rows = torch.arange(last.shape[0])
    return (last[rows, GOOD[: last.shape[0]]] - last[rows, BAD[: last.shape[0]]]).mean()


# ------------------------------------------------------------------ TransformerLens


@pytest.fixture(scope="module")
def gpt2_setup():
    from test_points import tl_model

    model = tl_model("gpt2", True)  # d_model 12, 3 heads, d_head 4, d_mlp 20, vocab 17, 2 layers
    clean, corrupted = _inputs(17)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    circuit = cm.from_transformer_lens(state, clean, family="gpt2", causal=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean[:, :-1])
    return model, circuit, cache, clean, corrupted


@pytest.mark.slow  # importing TransformerLens alone takes seconds
@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
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
@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
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


@pytest.mark.parametrize("per_position", [True, False])
def test_attention_only_head_grids_equal_torch(per_position):
    w = weights()
    clean = tokens(3)
    corrupted = clean.clone()
    corrupted[:, [0, 2, 5]] = (clean[:, [0, 2, 5]] + 1) % CONFIG.vocab_size
    circuit = cc.causal_mask(cm.build_attn_only(CONFIG, w, clean))
    grid = "attn_head_out_by_pos" if per_position else "attn_head_out_all_pos"
    expected = _torch_head_grid(w, clean, corrupted, per_position)
    ours = grids.patch_grid(
        circuit, {"toks_int_var": corrupted}, ex.metrics.logit_diff(-1, GOOD[:2], BAD[:2]), grid
    )
    assert expected.std() > 1e-4  # the patches differ (float64: the tolerance below is far smaller)
    assert (ours.values - expected).abs().max().item() < 1e-9


# ------------------------------------------------------------------ executors and bad input


class _InlineExecutor(concurrent.futures.Executor):
    """Runs each task at once, in this process, after a pickle round trip (as a process pool would)."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        fn, args = pickle.loads(pickle.dumps((fn, args)))
        future.set_result(fn(*args, **kwargs))
        return future


def _small_gpt2():
    config = cm.GPT2Config(n_layers=2, n_heads=3, d_model=12, d_mlp=20, vocab_size=17, n_ctx=16)
    clean, corrupted = _inputs(17)
    return cm.build_gpt2(config, cm.gpt2_random_weights(config), clean), corrupted


def test_an_executor_gives_the_local_grid():
    circuit, corrupted = _small_gpt2()
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    local = grids.act_patch_attn_head_q_by_pos(circuit, {"toks_int_var": corrupted}, metric)
    inline = grids.act_patch_attn_head_q_by_pos(
        circuit, {"toks_int_var": corrupted}, metric, executor=_InlineExecutor()
    )
    spawn = multiprocessing.get_context("spawn")  # forking a process with torch's threads running can hang
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=spawn) as pool:
        pooled = grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric, executor=pool)
    assert torch.equal(inline.values, local.values) and inline.records == local.records
    assert torch.equal(
        pooled.values, grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric).values
    )


def test_bad_input_is_named():
    circuit, corrupted = _small_gpt2()
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    with pytest.raises(ex.ExperimentError, match=r"\[3, 9\].*\[2, 9\]"):
        grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted[:2]}, metric)
    with pytest.raises(ex.ExperimentError, match="unknown grid 'resid_post_by_head'"):
        grids.patch_grid(circuit, {"toks_int_var": corrupted}, metric, "resid_post_by_head")
    with pytest.raises(ex.ExperimentError, match="'tokens'"):
        grids.act_patch_resid_pre(circuit, {"tokens": corrupted}, metric)
    with pytest.raises(ex.ExperimentError, match=r"point \('q', 0\) finds 3 nodes.*before split_heads"):
        grids.act_patch_attn_head_q_by_pos(cc.split_heads(circuit), {"toks_int_var": corrupted}, metric)
    with pytest.raises(ex.ExperimentError, match="patches_per_run"):
        grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric, patches_per_run=0)
    with pytest.raises(ex.ExperimentError, match="metric"):
        grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, "logit_diff")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
@pytest.mark.parametrize("grid", ["resid_pre", "attn_head_k_by_pos"])
def test_bidirectional_attention_patches_every_position(grid):
    """Without a causal mask a patch reaches earlier positions too: no suffix shortcut."""
    patching = pytest.importorskip("transformer_lens.patching")
    from test_points import tl_model

    model = tl_model("gpt2", False)
    clean, corrupted = _inputs(17)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    circuit = cm.from_transformer_lens(state, clean, family="gpt2", causal=False)
    assert not causal_suffix.is_causal(circuit)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean[:, :-1])
        expected = getattr(patching, f"get_act_patch_{grid}")(
            model, corrupted[:, :-1], cache, _reference_metric
        )
    metric = ex.metrics.logit_diff(-1, GOOD, BAD)
    ours = grids.patch_grid(circuit, {"toks_int_var": corrupted}, metric, grid, positions_per_run=1)
    assert (ours.values - expected).abs().max().item() < TOL


def test_mean_loss_grid_equals_torch():
    """A Metric other than logit_diff: the corrupted run's mean loss, per patch, against torch."""
    w = weights()
    clean = tokens(4)
    corrupted = clean.clone()
    corrupted[:, [1, 3]] = (clean[:, [1, 3]] + 2) % CONFIG.vocab_size
    circuit = cc.causal_mask(cm.build_attn_only(CONFIG, w, clean))
    _, _, clean_heads = forward(w, clean)
    _, _, corrupted_heads = forward(w, corrupted)
    ours = grids.act_patch_attn_head_out_all_pos(circuit, {"toks_int_var": corrupted}, ex.mean_loss)
    for layer in range(CONFIG.n_layers):
        for head in range(CONFIG.n_heads):
            loss, _, _ = forward(w, corrupted, override={(layer, head): clean_heads[(layer, head)]})
            assert abs(ours.values[layer, head].item() - loss.mean().item()) < 1e-9
    assert ours.values.std() > 1e-6


def test_the_causal_suffix_changes_no_value():
    circuit, _ = _small_gpt2()
    assert causal_suffix.is_causal(circuit)
    prefixes = {name: circuit.get_unique(name).evaluate() for name in ("b0", "b1")}
    for position in (1, 5, 7):
        suffixed = causal_suffix.from_position(circuit, position, prefixes)
        assert torch.equal(suffixed.evaluate(), circuit.evaluate())
        assert circuit.get_unique("b1").shape == suffixed.get_unique("b1").shape
