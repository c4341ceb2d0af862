"""``ex.sweep(..., dry_run=True)``: the FLOPs a sweep will run, before running it.

The reference is ``torch.utils.flop_counter.FlopCounterMode`` around the real sweep: the matmul
FLOPs the planned cache actually runs (each distinct node of the clean and ablated circuits once)
equal the plan's.  A dry run evaluates nothing.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex


@pytest.fixture(scope="module")
def split():
    config = cm.GPT2Config(n_layers=2, n_heads=3, d_model=12, vocab_size=17, n_ctx=16)
    tokens = torch.randint(0, 17, (2, 7), generator=torch.Generator().manual_seed(3))
    return cc.passes.split_heads(cm.build_gpt2(config, cm.gpt2_random_weights(config, seed=1), tokens))


def mean(value: torch.Tensor) -> float:
    return value.mean().item()


def test_the_planned_flops_are_what_the_sweep_runs(split):
    heads = ex.head_names(split)
    plan = ex.sweep(split, heads, ex.zero_ablate, mean, dry_run=True)
    with FlopCounterMode(display=False) as counter:
        ex.sweep(split, heads, ex.zero_ablate, mean, progress=False)
    assert plan.cost.total.flops["matmul"] == counter.get_total_flops()
    assert plan.circuits == len(heads) + 1
    one = cc.cost(split)
    assert one.total.flop_count < plan.flops < (len(heads) + 1) * one.total.flop_count  # shared once
    assert plan.peak_bytes >= one.peak_bytes and "GFLOP" in str(plan)


def test_a_dry_run_evaluates_nothing(split):
    def metric(value):
        raise AssertionError("a dry run must not evaluate")

    plan = ex.sweep(split, ["b0.a.head1"], ex.zero_ablate, metric, dry_run=True)
    assert plan.circuits == 2
    with pytest.raises(cc.CircuitError):
        ex.sweep(split, ["no such node"], ex.zero_ablate, metric, dry_run=True)
