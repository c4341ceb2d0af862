"""``memory_bytes``: a sweep, a patching grid and attribution patching within a user's budget.

Peaks are measured with torch's profiler (its memory events over the run, as tests/test_cost.py
measures a forward), in float32 (bfloat16's kept float32 buffer would be there before the run).
A budget binds when it lies below what the run takes without one; the results must not change,
and a budget below the least a run needs is a CacheError before anything is evaluated.
"""

from __future__ import annotations

import sys
from pathlib import Path

import factories
import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.errors import CacheError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import benchtools  # noqa: E402

VOCAB = 97


@pytest.fixture(scope="module")
def model_and_tokens():
    model = factories.llama(hidden_size=48, intermediate_size=96, vocab_size=VOCAB, num_attention_heads=4)
    tokens = factories.token_ids(VOCAB, (3, 14), seed=2)
    corrupted = tokens.clone()
    corrupted[:, 6] = (corrupted[:, 6] + 5) % VOCAB
    return cm.from_hf(model, tokens), corrupted


def _peak(run):
    """``(result, the most bytes torch allocated at once during run())``: the benches' method."""
    results = []
    peak = benchtools.peak_bytes(lambda: results.append(run()))
    return results[0], peak


def _least(run) -> int:
    """The smallest budget a run accepts, from its refusal of 1 byte (plans fill 95% of a budget)."""
    with pytest.raises(CacheError) as caught:
        run(1)
    assert caught.value.memory_bytes == 1 and caught.value.needed_bytes > 0
    return caught.value.needed_bytes * 20 // 19 + 1


def _logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 3] - logits[:, -1, 8]).mean()


def test_a_sweep_within_a_budget_stays_under_it_with_the_same_results(model_and_tokens):
    circuit, _ = model_and_tokens
    heads = ex.head_names(circuit)
    free, free_peak = _peak(lambda: ex.sweep(circuit, heads, progress=False))
    least = _least(lambda budget: ex.sweep(circuit, heads, progress=False, memory_bytes=budget))
    budget = (least + free_peak) // 2
    assert budget < free_peak  # the budget binds
    kept, peak = _peak(lambda: ex.sweep(circuit, heads, progress=False, memory_bytes=budget))
    assert peak <= budget
    assert max(abs(kept[h] - free[h]) for h in heads) <= 1e-5
    plan = ex.sweep_plan(circuit, heads, memory_bytes=budget)
    assert plan.peak_bytes - ex.sweep_plan(circuit, []).cost.held_bytes <= budget


def test_a_budget_too_small_is_refused_before_anything_runs(model_and_tokens):
    circuit, corrupted = model_and_tokens
    calls = []

    def metric(logits):
        calls.append(1)
        return _logit_diff(logits)

    heads = ex.head_names(circuit)
    runs = {
        "sweep": lambda: ex.sweep(circuit, heads, ablation=ex.zero_ablate, metric=metric, memory_bytes=4096),
        "sweep_plan": lambda: ex.sweep_plan(circuit, heads, memory_bytes=4096),
        "act_patch_resid_pre": lambda: ex.patch_grid(
            circuit, {"toks_int_var": corrupted}, metric, "resid_pre", memory_bytes=4096
        ),
        "attribution_patching": lambda: ex.attribution_patching(
            circuit, {"toks_int_var": corrupted}, metric, memory_bytes=4096
        ),
    }
    for what, run in runs.items():
        with pytest.raises(CacheError, match=f"^{what}: memory_bytes=4096") as caught:
            run()
        assert caught.value.needed_bytes > 4096
    assert not calls


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1 GiB"])
def test_memory_bytes_must_be_a_positive_int(model_and_tokens, bad):
    circuit, corrupted = model_and_tokens
    with pytest.raises(CacheError, match="memory_bytes must be a positive int"):
        ex.sweep(circuit, ["b0.a.head0"], memory_bytes=bad)
    with pytest.raises(CacheError, match="memory_bytes must be a positive int"):
        ex.patch_grid(circuit, {"toks_int_var": corrupted}, _logit_diff, "resid_pre", memory_bytes=bad)
    with pytest.raises(CacheError, match="memory_bytes must be a positive int"):
        ex.attribution_patching(circuit, {"toks_int_var": corrupted}, _logit_diff, memory_bytes=bad)


def test_an_evaluators_cache_must_fit_in_the_budget(model_and_tokens):
    circuit, _ = model_and_tokens
    least = _least(lambda budget: ex.sweep(circuit, ["b1.a.head2"], progress=False, memory_bytes=budget))
    with pytest.raises(CacheError, match="the evaluator's cache"):
        ex.sweep(circuit, ["b1.a.head2"], evaluator=cc.Evaluator(10 * least), memory_bytes=2 * least)


def test_a_patching_grid_within_a_budget_stays_under_it_with_the_same_values(model_and_tokens):
    circuit, corrupted = model_and_tokens
    inputs = {"toks_int_var": corrupted}
    free, free_peak = _peak(lambda: ex.patch_grid(circuit, inputs, _logit_diff, "resid_pre"))
    least = _least(lambda b: ex.patch_grid(circuit, inputs, _logit_diff, "resid_pre", memory_bytes=b))
    budget = (least + free_peak) // 2
    assert budget < free_peak
    kept, peak = _peak(lambda: ex.patch_grid(circuit, inputs, _logit_diff, "resid_pre", memory_bytes=budget))
    assert peak <= budget
    torch.testing.assert_close(kept.values, free.values, rtol=1e-5, atol=1e-5)


def test_attribution_patching_stays_under_its_bound(model_and_tokens):
    circuit, corrupted = model_and_tokens
    inputs = {"toks_int_var": corrupted}
    free = ex.attribution_patching(circuit, inputs, _logit_diff)
    least = _least(lambda b: ex.attribution_patching(circuit, inputs, _logit_diff, memory_bytes=b))
    kept, peak = _peak(lambda: ex.attribution_patching(circuit, inputs, _logit_diff, memory_bytes=least))
    assert peak <= least
    for kind in free:
        torch.testing.assert_close(kept[kind], free[kind], rtol=0, atol=0)
