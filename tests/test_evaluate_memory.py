"""Evaluation releases intermediates early, and never recurses over depth.

How memory is measured: torch's profiler with ``profile_memory=True``
records every allocation and free made by torch's CPU allocator.  Each op
event carries the bytes it allocated net of what it freed
(``self_cpu_memory_usage``, so nested ops are not counted twice); frees
that happen outside any op (a tensor dropped by Python, which is how the
evaluator releases an intermediate) are separate ``[memory]`` events.
Summing them in time order gives the bytes allocated at every moment of
the evaluation; the peak of that curve is the peak tensor memory of the
call (on top of the Arrays' own tensors, allocated before it).  The test
also checks that the profiler saw every intermediate being allocated
(1,000 x 4 MB in total), so a low peak cannot come from missed events.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import circuits as cc

MB = 2**20


def allocation_curve(prof) -> tuple[int, int]:
    """(peak bytes live, total bytes allocated) over the profiled region."""
    changes = []
    for event in prof.events():
        if event.name == "[memory]":
            delta = event.cpu_memory_usage
        else:
            delta = event.self_cpu_memory_usage
        if delta:
            changes.append((event.time_range.start, delta))
    changes.sort(key=lambda change: change[0])
    live = peak = allocated = 0
    for _, delta in changes:
        live += delta
        peak = max(peak, live)
        allocated += max(delta, 0)
    return peak, allocated


@pytest.fixture
def one_thread():
    # 1M-element ops are faster on one thread than on two shared with other work
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def four_mb_chain(length: int) -> tuple[cc.Circuit, torch.Tensor]:
    """``length`` nodes after the input, each a fresh 1024x1024 float32 (4 MB) tensor."""
    x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))
    node = cc.Array(x, name="x")
    half = cc.Scalar(0.5, name="half")
    scale = cc.Scalar(0.9, name="scale")
    for i in range(length):
        if i % 3 == 0:
            node = cc.GeneralFunction.new_by_name(node, spec_name="tanh", name=f"t{i}")
        elif i % 3 == 1:
            node = cc.Add(node, half, name=f"a{i}")
        else:
            node = cc.Einsum.from_einsum_string("ab,->ab", node, scale, name=f"e{i}")
    return node, x


@pytest.mark.slow
def test_thousand_node_chain_of_4mb_intermediates_peaks_under_64mb(one_thread):
    chain, x = four_mb_chain(1000)
    assert len(cc.unique_nodes([chain])) == 1000 + 3

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = chain.evaluate()
    peak, allocated = allocation_curve(prof)
    print(
        f"\npeak tensor memory during evaluate: {peak / MB:.1f} MB; allocated in all {allocated / MB:.0f} MB"
    )

    assert allocated >= 1000 * 4 * MB  # the profiler saw every intermediate
    assert peak < 64 * MB
    # the same ops in plain torch give the same value
    expected = x
    for i in range(1000):
        expected = torch.tanh(expected) if i % 3 == 0 else expected + 0.5 if i % 3 == 1 else expected * 0.9
    torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-6)


def test_roots_of_evaluate_many_are_kept_while_others_are_released(one_thread):
    chain, _ = four_mb_chain(30)
    nodes = {n.name: n for n in cc.unique_nodes([chain])}
    roots = [nodes["t0"], nodes["e14"], chain]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        results = cc.evaluate_many(roots)
    peak, _ = allocation_curve(prof)
    assert [tuple(r.shape) for r in results] == [(1024, 1024)] * 3
    assert peak < 6 * 4 * MB + MB  # three kept roots + the two live links of the chain, with slack
    torch.testing.assert_close(results[0], torch.tanh(nodes["x"].value))


def test_fifty_thousand_deep_chain_evaluates_without_recursion():
    x = torch.randn(3)
    node = cc.Array(x, name="x")
    one = cc.Scalar(1.0, name="one")
    depth = 50_000
    for i in range(depth):  # built iteratively
        if i % 2:
            node = cc.Add(node, one)
        else:
            node = cc.Einsum.from_einsum_string("a,->a", node, cc.Scalar(1.0, name="id"))
    started = time.perf_counter()
    result = node.evaluate()
    print(f"\n{depth}-deep chain evaluated in {time.perf_counter() - started:.2f} s")
    torch.testing.assert_close(result, x + depth // 2, rtol=1e-6, atol=1e-3)


def test_error_deep_in_a_long_chain_reports_a_shortened_path():
    toks = cc.Symbol((2,), name="toks")
    emb = cc.Array(torch.randn(4, 3), name="emb")
    node = cc.GeneralFunction.new_by_name(emb, toks, spec_name="gen_index_at_0_c", name="lookup")
    for i in range(20_000):
        node = cc.GeneralFunction.new_by_name(node, spec_name="relu", name=f"r{i}")
    with pytest.raises(cc.errors.EvaluationError) as info:
        node.evaluate(inputs={"toks": torch.tensor([1, 9])})
    assert info.value.node.name == "lookup" and isinstance(info.value.__cause__, ValueError)
    assert len(info.value.path) == 20_001
    message = str(info.value)
    assert "GeneralFunction 'r19999' > GeneralFunction 'r19998'" in message
    assert "(19989 more)" in message and message.endswith("GeneralFunction 'r0' > GeneralFunction 'lookup'")
