"""Per-node overhead of ``cc.evaluate`` against a plain Python loop of the same torch ops.

Issue 3's target: on a 10^5-node circuit of tiny ops, evaluation takes at
most 1.5x the time of a plain Python loop calling the same torch ops in the
same order.  The circuit is a chain cycling Add (a bias), Einsum (an
elementwise product with a weight) and GeneralFunction tanh on 4x4 float32
tensors, so the torch work per node is as small as it gets and what is
measured is the evaluator's own cost: building the schedule (post-order,
dispatch, release lists) and running it.  Each timed ``evaluate`` call is
cold: nothing is cached between calls.

Runs alternate between the loop and ``evaluate`` (so a busy machine slows
both alike); the median of each is reported, and the ratio of medians is
the headline.

    python bench/eval_overhead.py                 # the issue's size, 10^5 nodes
    python bench/eval_overhead.py --nodes 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import time

import torch

import circuits as cc

TARGET = 1.5


def build(num_ops: int, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> cc.Circuit:
    """``num_ops`` op nodes over three Array leaves: Add, Einsum, tanh, Add, ..."""
    bias = cc.Array(b, name="b")
    weight = cc.Array(w, name="w")
    node = cc.Array(x, name="x")
    for i in range(num_ops):
        kind = i % 3
        if kind == 0:
            node = cc.Add(node, bias)
        elif kind == 1:
            node = cc.Einsum.from_einsum_string("ab,ab->ab", node, weight)
        else:
            node = cc.GeneralFunction.new_by_name(node, spec_name="tanh")
    return node


def plain_loop(num_ops: int, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same torch calls the evaluator makes, in the same order, written by hand."""
    add, einsum, tanh = torch.add, torch.einsum, torch.tanh
    v = x
    for _ in range(num_ops // 3):
        v = add(v, b)
        v = einsum("ab,ab->ab", v, w)
        v = tanh(v)
    rest = num_ops % 3
    if rest >= 1:
        v = add(v, b)
    if rest >= 2:
        v = einsum("ab,ab->ab", v, w)
    return v


def timed(action):
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100_000, help="op nodes in the chain (default 10^5)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each (default 7); medians count")
    parser.add_argument("--side", type=int, default=4, help="tensors are side x side float32 (default 4)")
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(args.side, args.side, generator=generator) for _ in range(3))
    circuit = build(args.nodes, x, w, b)
    distinct = len(cc.unique_nodes([circuit]))

    # warm up both (einsum's first call, allocator, code paths), and check they agree exactly
    expected = plain_loop(args.nodes, x, w, b)
    got = cc.evaluate(circuit)
    assert torch.equal(got, expected), "evaluate differs from the plain loop"
    del expected, got
    gc.collect()

    loop_times, eval_times = [], []
    for _ in range(args.repeat):
        loop_times.append(timed(lambda: plain_loop(args.nodes, x, w, b))[0])
        eval_times.append(timed(lambda: cc.evaluate(circuit))[0])

    # where evaluate's time goes: building the schedule vs running it
    evaluation = importlib.import_module("circuits.evaluation")
    build_times, run_times = [], []
    for _ in range(args.repeat):
        build_time, plan = timed(lambda: evaluation.compile_plan([circuit]))
        build_times.append(build_time)
        run_times.append(timed(plan.run)[0])

    loop = statistics.median(loop_times)
    evaluated = statistics.median(eval_times)
    per_op = 1e6 / args.nodes
    print(
        f"circuit: {distinct} distinct nodes ({args.nodes} ops cycling Add / Einsum / tanh on "
        f"{args.side}x{args.side} float32), {args.repeat} alternating runs each, medians"
    )
    print(f"plain torch loop: {loop:.3f} s ({loop * per_op:.2f} us/op)   [best {min(loop_times):.3f} s]")
    print(
        f"cc.evaluate:      {evaluated:.3f} s ({evaluated * per_op:.2f} us/node) "
        f"[best {min(eval_times):.3f} s]  = schedule build {statistics.median(build_times):.3f} s "
        f"+ run {statistics.median(run_times):.3f} s"
    )
    print(f"evaluator overhead: {(evaluated - loop) * per_op:.2f} us/node")
    ratio = evaluated / loop
    verdict = "target" if ratio <= TARGET else "MISSED target"
    print(f"overhead ratio: {ratio:.2f}x ({verdict} <= {TARGET}x)")


if __name__ == "__main__":
    main()
