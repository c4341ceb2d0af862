"""Sweeps sharded across an executor give the local sweep's table."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

import pytest
import torch

import circuits as cc
from circuits import experiments as ex
from circuits import models
from circuits.models.demo_model import repeated_tokens


@pytest.fixture(scope="module")
def split():
    return cc.passes.split_heads(cc.passes.causal_mask(models.load_demo_model(repeated_tokens(2, 8))))


def _same_table(sharded: ex.SweepResult, local: ex.SweepResult) -> None:
    assert list(sharded) == list(local)  # the same targets, in the same order
    assert sharded.baseline == pytest.approx(local.baseline, rel=1e-6, abs=0)
    for target, value in local.items():
        assert sharded[target] == pytest.approx(value, rel=1e-6, abs=0), target
    assert [r["target"] for r in sharded.records] == [r["target"] for r in local.records]
    assert all(r["delta"] == r["metric"] - sharded.baseline for r in sharded.records)


class _InlineExecutor(concurrent.futures.Executor):
    """Runs each task at once, in this process: the sharding without the processes."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_shards_in_order_give_the_local_table(split):
    local = ex.sweep(split, ex.head_names(split), progress=False)
    for shards in (1, 3, 100):
        sharded = ex.sweep(split, ex.head_names(split), executor=_InlineExecutor(), shards=shards)
        _same_table(sharded, local)


def test_bad_executor_arguments_are_refused(split):
    with pytest.raises(cc.errors.ExperimentError, match="shards must be a positive int"):
        ex.sweep(split, ["b0.a.head0"], executor=_InlineExecutor(), shards=0)
    with pytest.raises(cc.errors.ExperimentError, match="cannot be shared"):
        ex.sweep(split, ["b0.a.head0"], executor=_InlineExecutor(), evaluator=cc.Evaluator(2**20))
    with pytest.raises(cc.errors.ExperimentError, match="must be a concurrent.futures.Executor"):
        ex.sweep(split, ["b0.a.head0"], executor=object())


@pytest.mark.slow
def test_a_process_pool_gives_the_local_table(split):
    local = ex.sweep(split, ex.head_names(split), progress=False)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        _same_table(ex.sweep(split, ex.head_names(split), executor=pool), local)
        with pytest.raises(cc.errors.ExperimentError, match="picklable"):
            ex.sweep(split, ["b0.a.head0"], ablation=lambda c, t: ex.zero_ablate(c, t), executor=pool)


@pytest.mark.slow
def test_a_dask_cluster_gives_the_local_table(split):
    distributed = pytest.importorskip("distributed")
    local = ex.sweep(split, ex.head_names(split), progress=False)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        with distributed.Client(cluster) as client:
            _same_table(
                ex.sweep(split, ex.head_names(split), executor=client.get_executor(), shards=2), local
            )


def test_head_grid_puts_each_heads_delta_at_its_layer_and_head(split):
    table = ex.sweep(split, ["b1.a.head2", "b0.a.head1"], progress=False)
    grid = table.head_grid()
    assert grid.shape == (2, 3)
    assert grid[1, 2].item() == pytest.approx(table["b1.a.head2"] - table.baseline, rel=1e-6)
    assert grid[0, 1].item() == pytest.approx(table["b0.a.head1"] - table.baseline, rel=1e-6)
    assert int(grid.isnan().sum()) == 4
    with pytest.raises(cc.errors.ExperimentError, match="no target of this sweep is a single head"):
        ex.sweep(split, {"tokens": "idxed_embeds"}, progress=False).head_grid()


_FORKED_POOL = """
import concurrent.futures, json, multiprocessing, sys
import torch
import circuits as cc
from circuits import experiments as ex
from circuits import models
from circuits.models.demo_model import repeated_tokens

torch.set_num_threads(2)  # the parent's thread pool running when the workers fork: what used to hang
split = cc.passes.split_heads(cc.passes.causal_mask(models.load_demo_model(repeated_tokens(2, 8))))
local = ex.sweep(split, ex.head_names(split), progress=False)
clean = cc.passes.causal_mask(models.load_demo_model(repeated_tokens(2, 8)))
corrupted = repeated_tokens(2, 8, seed=1)
metric = ex.logit_diff(-1, good=[1, 2], bad=[3, 4])
local_grid = ex.patching_grids.act_patch_resid_pre(clean, {"toks_int_var": corrupted}, metric)
fork = multiprocessing.get_context("fork")
with concurrent.futures.ProcessPoolExecutor(2, mp_context=fork) as pool:
    forked = ex.sweep(split, ex.head_names(split), executor=pool)
    forked_grid = ex.patching_grids.act_patch_resid_pre(clean, {"toks_int_var": corrupted}, metric, executor=pool)
print(json.dumps({
    "local": dict(local), "forked": dict(forked), "baselines": [local.baseline, forked.baseline],
    "grids": [local_grid.values.tolist(), forked_grid.values.tolist()], "parent_threads": torch.get_num_threads(),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_a_fork_started_process_pool_finishes_with_the_local_results():
    """``ProcessPoolExecutor``'s Linux default (before Python 3.14) forks workers from a process whose
    torch threads are running; their first einsum used to wait forever.  Run in a subprocess with a
    timeout, so that a hang fails this test instead of stopping the suite."""
    import json
    import os
    import signal
    import subprocess
    import sys

    # a session of its own, so that a hang is ended with its forked workers, none left behind
    process = subprocess.Popen(
        [sys.executable, "-c", _FORKED_POOL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("a sweep or grid on a fork-started ProcessPoolExecutor did not finish in 240 s (hung)")
    assert process.returncode == 0, stderr[-3000:]
    found = json.loads(stdout.strip().splitlines()[-1])
    assert found["parent_threads"] == 2  # the parent keeps its threads; only forked workers run on one
    assert list(found["forked"]) == list(found["local"])
    for target, value in found["local"].items():
        assert found["forked"][target] == pytest.approx(value, rel=1e-6, abs=0), target
    assert found["baselines"][1] == pytest.approx(found["baselines"][0], rel=1e-6, abs=0)
    local_grid, forked_grid = (torch.tensor(values) for values in found["grids"])
    assert local_grid.abs().max() > 0 and (forked_grid - local_grid).abs().max() < 1e-5
