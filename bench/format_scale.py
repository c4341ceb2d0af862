"""Build, print and parse circuits of 10^4 and 10^5 nodes; check the cost is linear.

Issue 2's targets: each step under 2 s at 10^5 nodes, and the 10^5/10^4 time
ratio at most 12.  The circuit is transformer-shaped but shallow enough that
its text is linear in its size (many 50-op branches over shared weights,
summed at the root), since the format's indentation makes very deep text
quadratic whatever the printer does.

    python bench/format_scale.py                 # the issue's sizes
    python bench/format_scale.py --sizes 1000 10000
"""

from __future__ import annotations

import argparse

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


def measure(num_nodes: int, repeat: int) -> dict[str, float]:
    build_time, circuit = best_time(lambda: build(num_nodes), repeat)
    print_time, text = best_time(circuit.repr, repeat)
    parse_time, again = best_time(lambda: cc.parse(text), repeat)
    assert again == circuit, "parse(print(c)) differs from c"
    return {
        "nodes": len(cc.unique_nodes([circuit])),
        "lines": text.count("\n") + 1,
        "build": build_time,
        "print": print_time,
        "parse": parse_time,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    slowest = max(large[step] for step in ("build", "print", "parse"))
    print(
        f"headline: slowest step at {large['nodes']} nodes {slowest:.3f} s (target < 2 s), "
        f"worst ratio {max(ratios.values()):.2f}x (target <= 12)"
    )


if __name__ == "__main__":
    main()
