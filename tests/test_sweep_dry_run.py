"""``ex.sweep_plan(...)``: the FLOPs a sweep will run, before running it.

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
    plan = ex.sweep_plan(split, heads, ex.zero_ablate, mean)
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

    plan = ex.sweep_plan(split, ["b0.a.head1"], ex.zero_ablate, metric)
    assert plan.circuits == 2
    with pytest.raises(cc.CircuitError):
        ex.sweep_plan(split, ["no such node"], ex.zero_ablate, metric)


def test_sweep_no_longer_takes_dry_run(split):
    """The plan is a function of its own: ``sweep`` returns one type, a ``SweepResult``."""
    with pytest.raises(TypeError, match="dry_run"):
        ex.sweep(split, ["b0.a.head1"], dry_run=True)


def test_sweep_plan_takes_what_sweep_takes_and_checks_it(split):
    """The same targets (a mapping, Points) and the same argument checks, named ``sweep_plan``."""
    plan = ex.sweep_plan(split, {"first": "b0.a.head1", "z": ex.Point("z", 1, 2)})
    assert plan.circuits == 3
    with pytest.raises(cc.errors.ExperimentError, match="^sweep_plan: ablation must be a function"):
        ex.sweep_plan(split, ["b0.a.head1"], ablation=3)
    with pytest.raises(cc.errors.CacheError, match="sweep_plan: cache_bytes"):
        ex.sweep_plan(split, ["b0.a.head1"], cache_bytes=-1)
