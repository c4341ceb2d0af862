"""Nothing silently wrong in the experiments: a mistake is an error, never an effect of zero or NaN."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits import experiments as ex
from circuits import models
from circuits.models.demo_model import repeated_tokens


@pytest.fixture(scope="module")
def split():
    return cc.passes.split_heads(cc.passes.causal_mask(models.load_demo_model(repeated_tokens(2, 6))))


def test_an_input_key_that_matches_no_node_is_refused(split):
    other = repeated_tokens(2, 6, seed=1)
    with pytest.raises(cc.errors.ExperimentError, match="'toks_int_vr'.*did you mean 'toks_int_var'"):
        ex.patch(split, "b1.a.head1", {"toks_int_vr": other})
    with pytest.raises(cc.errors.ExperimentError, match="'toks_int_vr'"):
        ex.resample_ablate(split, "b1.a.head1", {"toks_int_var": other, "toks_int_vr": other})
    with pytest.raises(cc.errors.ExperimentError, match="'toks_int_vr'"):
        ex.mean_ablate(split, "b1.a.head1", {"toks_int_vr": other[None]})


def test_an_input_key_outside_what_is_rewritten_changes_nothing(split):
    unembed = split.get_unique("t.w.unembed")  # head 1.1 does not depend on it: its value is its own
    assert ex.patch(split, "b1.a.head1", {"t.w.unembed": torch.zeros(unembed.shape)}) == split


def test_patching_from_the_same_inputs_is_still_the_same_circuit(split):
    own = split.get_unique("toks_int_var").value
    assert ex.patch(split, "b1.a.head1", {"toks_int_var": own.clone()}) == split


def test_mean_over_an_empty_dataset_is_refused(split):
    empty = torch.zeros((0, 2, 13), dtype=torch.int64)
    with pytest.raises(cc.errors.ExperimentError, match="no examples"):
        ex.mean_ablate(split, "b1.a.head1", {"toks_int_var": empty})
    rebatched = torch.zeros((0, 13), dtype=torch.int64)
    with pytest.raises(cc.errors.ExperimentError, match="no examples"):
        ex.mean_ablate(split, "b1.a.head1", {"toks_int_var": rebatched})


def test_sweep_of_a_single_string_says_what_is_wrong(split):
    with pytest.raises(cc.errors.ExperimentError, match=r"single str 'b0.a.head0'; write \['b0.a.head0'\]"):
        ex.sweep(split, "b0.a.head0", progress=False)


def test_sweep_with_a_repeated_target_names_it(split):
    with pytest.raises(cc.errors.ExperimentError, match="'b0.a.head0' appear more than once"):
        ex.sweep(split, ["b0.a.head0", "b0.a.head0"], progress=False)


def test_sweep_with_an_ablation_returning_none(split):
    with pytest.raises(cc.errors.ExperimentError, match="returned a NoneType for target 'b0.a.head0'"):
        ex.sweep(split, ["b0.a.head0"], lambda c, t: None, progress=False)


def test_budgets_that_are_not_byte_counts(split):
    for bad in (-1, None, 2.5):
        with pytest.raises(cc.errors.CacheError):
            cc.Evaluator(bad)
        with pytest.raises(cc.errors.CacheError):
            ex.sweep(split, ["b0.a.head0"], cache_bytes=bad, progress=False)


def test_a_metric_that_is_not_one_number(split):
    with pytest.raises(cc.errors.ExperimentError, match="not one number"):
        ex.sweep(split, ["b0.a.head0"], metric=lambda value: value, progress=False)
