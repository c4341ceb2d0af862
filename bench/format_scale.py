"""Build, print and parse circuits of 10^4 and 10^5 nodes; check the cost is linear.

Issue 2's targets: each step under 2 s at 10^5 nodes, and the 10^5/10^4 time
ratio at most 12.  The circuit is transformer-shaped but shallow enough that
its text is linear in its size (many 50-op branches over shared weights,
summed at the root), since the format's indentation makes very deep text
quadratic whatever the printer does.

    python bench/format_scale.py                 # the issue's sizes
    python bench/format_scale.py --sizes 1000 10000

Two reference lines, measured on the same circuits in the same run, say
what the machine does at these sizes: a bare walk (each node once, its
hash put in a set: less than any printer must do) and the build with
Python's cyclic garbage collector paused.  At 10^4 nodes the circuit fits
in the CPU's caches and at 10^5 it does not, so a walk's time grows faster
than its instruction count; and the 10^5 build alone triggers full
collections over every live object.  The headline stays the measured steps.
"""

from __future__ import annotations

import argparse
import gc

import torch
from benchtools import best_time

import circuits as cc

BRANCH_LENGTH = 50


def build(num_nodes: int) -> cc.Circuit:
    """About ``num_nodes`` distinct nodes: branches of mixed ops over shared leaves."""
    generator = torch.Generator().manual_seed(0)
    weight = cc.Array(torch.randn(8, 8, generator=generator), name="w")
    bias = cc.Array(torch.randn(8, generator=generator), name="bias")
    eps = cc.Scalar(0.00001, name="eps")
    tips = []
    branches = max(1, num_nodes // BRANCH_LENGTH)
    for branch in range(branches):
        x = cc.Array(torch.full((4, 8), float(branch)), name=f"x{branch}")
        for step in range(BRANCH_LENGTH // 5):
            h = cc.Einsum.from_einsum_string("sd,ed->se", x, weight, name=f"b{branch}.h{step}")
            h = cc.Add(h, bias, eps)  # unnamed: printed with a serial number
            h = cc.GeneralFunction.new_by_name(h, spec_name="gelu", name="act")  # shared name
            h = cc.Index(h, (slice(None, None), slice(None, 8)), name=f"b{branch}.idx{step}")
            x = cc.Add(x, h, name=f"b{branch}.resid{step}")
        tips.append(x)
    return cc.Add(*tips, name="root")


def bare_walk(circuit: cc.Circuit) -> int:
    """Visit every distinct node once, hashes in a set: the least a printer must do (a reference)."""
    seen: set[bytes] = set()
    stack = [circuit]
    while stack:
        node = stack.pop()
        if node.hash not in seen:
            seen.add(node.hash)
            stack.extend(node.children)
    return len(seen)


def build_without_gc(num_nodes: int) -> cc.Circuit:
    gc.disable()
    try:
        return build(num_nodes)
    finally:
        gc.enable()


def measure(num_nodes: int, repeat: int) -> dict[str, float]:
    row = measure_steps(num_nodes, repeat)  # its circuit is freed before the next build
    row["build, gc paused"], _ = best_time(lambda: build_without_gc(num_nodes), repeat)
    return row


def measure_steps(num_nodes: int, repeat: int) -> dict[str, float]:
    build_time, circuit = best_time(lambda: build(num_nodes), repeat)
    print_time, text = best_time(circuit.repr, repeat)
    parse_time, again = best_time(lambda: cc.parse(text), repeat)
    assert again == circuit, "parse(print(c)) differs from c"
    walk_time, nodes = best_time(lambda: bare_walk(circuit), repeat)
    return {
        "nodes": nodes,
        "lines": text.count("\n") + 1,
        "build": build_time,
        "print": print_time,
        "parse": parse_time,
        "bare walk": walk_time,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs=2, default=[10_000, 100_000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--repeat", type=int, default=3, help="runs per step; the fastest counts")
    args = parser.parse_args()
    small, large = (measure(size, args.repeat) for size in args.sizes)
    for row in (small, large):
        print(
            f"{row['nodes']:>7} nodes {row['lines']:>7} lines: build {row['build']:.3f} s, "
            f"print {row['print']:.3f} s, parse {row['parse']:.3f} s"
        )
    ratios = {step: large[step] / small[step] for step in ("build", "print", "parse")}
    size_ratio = large["nodes"] / small["nodes"]
    print(
        f"time ratios for {size_ratio:.1f}x nodes: "
        + ", ".join(f"{step} {ratio:.2f}x" for step, ratio in ratios.items())
    )
    references = ("bare walk", "build, gc paused")
    print(
        "references on the same circuits: "
        + ", ".join(
            f"{step} {small[step]:.4f} / {large[step]:.4f} s, {large[step] / small[step]:.2f}x"
            for step in references
        )
    )
    slowest = max(large[step] for step in ("build", "print", "parse"))
    print(
        f"headline: slowest step at {large['nodes']} nodes {slowest:.3f} s (target < 2 s), "
        f"worst ratio {max(ratios.values()):.2f}x (target <= 12)"
    )


if __name__ == "__main__":
    main()
