"""Build, print and parse circuits of 10^4 and 10^5 nodes; parse against the parser before issue 20.

Issue 2's targets: each step under 2 s at 10^5 nodes, and the 10^5/10^4 time
ratio at most 12.  Issue 20's: parse at most 0.9 s at 10^5 nodes with the
same linear scaling, measured in one run against the parser as it was
(``circuits/parsing.py`` at commit ``PARSER_BEFORE``, read from git history:
the clone needs that commit, so not a shallow one).  The circuit is transformer-shaped but
shallow enough that its text is linear in its size (many 50-op branches over
shared weights, summed at the root), since the format's indentation makes
very deep text quadratic whatever the printer does.

    python bench/format_scale.py                 # the issues' sizes
    python bench/format_scale.py --quick         # 10^3 and 10^4 nodes, fewer rounds
    python bench/format_scale.py --sizes 1000 10000 --rounds 3

Each step runs ``--rounds`` times; the two parsers alternate on the same
text (which goes first swaps each round), so a busy spell of this shared
machine slows both.  Times are wall-clock medians and bests; the load
average before and after says how busy the machine was.  The frozen parser
builds its nodes with today's ``circuits.core.nodes``, so what made construction
cheaper helps it too: the ratio is the parser's own gain.

Three reference lines, on the same circuits in the same run, say what the
machine does at these sizes: a bare walk (each node once, its hash put in a
set: less than any printer must do); the build by hand with Python's cyclic
garbage collector paused; and the construction floor: every node of the
parsed circuit made again, children first, the cheapest way a node can be
made (``rebuilt_like``: its class's fields copied, only its hash computed,
no derivation or checks; leaves, 2% here, are reused), the collector paused
as parse pauses it.  A parser must at
least read the text and make the nodes, so the floor is part of parse's.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import re
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import circuits as cc
from circuits.core.gcpause import gc_paused
from circuits.core.nodes import rebuilt_like

BRANCH_LENGTH = 50
#: ``circuits/parsing.py`` at this commit is the parser before issue 20's speed-up.
PARSER_BEFORE = "a169e809c5d77ae2ed331d6ed25a954f4173e455"
#: Where the modules it imports live today (CHANGELOG.md, 0.2.0, Moved).
MOVED_SINCE = {
    "circuits.gcpause": "circuits.core.gcpause",
    "circuits.hashing": "circuits.core.hashing",
    "circuits.nodes": "circuits.core.nodes",
    "circuits.shapes": "circuits.core.shapes",
    "circuits.store": "circuits.text.store",
}


@functools.cache
def parser_before() -> types.ModuleType:
    """The parser before issue 20, read from git history into a module of its own."""
    where = f"{PARSER_BEFORE}:circuits/parsing.py"
    shown = subprocess.run(
        ["git", "show", where], cwd=Path(__file__).resolve().parent, capture_output=True, text=True
    )
    if shown.returncode != 0:
        sys.exit(f"format_scale: cannot read {where} from git history (a shallow clone?): {shown.stderr}")
    source = shown.stdout
    for old, new in MOVED_SINCE.items():
        source = re.sub(rf"^from {re.escape(old)} import", f"from {new} import", source, flags=re.M)
    module = types.ModuleType("parser_before")
    sys.modules[module.__name__] = module  # attrs and dataclasses look a class's module up
    exec(compile(source, where, "exec"), module.__dict__)
    return module


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


def floor_plan(circuit: cc.Circuit) -> list[tuple[cc.Circuit, tuple[int, ...]]]:
    """Every distinct node once, after its children, with its children's places in the list."""
    position: dict[bytes, int] = {}
    plan: list[tuple[cc.Circuit, tuple[int, ...]]] = []
    stack = [(circuit, False)]
    while stack:
        node, ready = stack.pop()
        if node.hash in position:
            continue
        if ready:
            position[node.hash] = len(plan)
            plan.append((node, tuple(position[child.hash] for child in node.children)))
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in node.children if child.hash not in position)
    return plan


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


def construct_again(plan: list[tuple[cc.Circuit, tuple[int, ...]]]) -> cc.Circuit:
    """The circuit made again node by node the cheapest way (the construction floor; see above)."""
    made: list[cc.Circuit] = []
    with gc_paused(long_lived=True):  # as parse pauses it
        for node, places in plan:
            made.append(rebuilt_like(node, tuple([made[i] for i in places]), node.name) if places else node)
    return made[-1]


def build_without_gc(num_nodes: int) -> cc.Circuit:
    gc.disable()
    try:
        return build(num_nodes)
    finally:
        gc.enable()


def timed(steps: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Each step ``rounds`` times, the steps taking turns (their order reversed every other round).

    A step's result is freed after its time is taken, so no step pays for freeing another's.
    """
    times: dict[str, list[float]] = {step: [] for step in steps}
    for round_number in range(rounds):
        for step in steps if round_number % 2 == 0 else reversed(steps):
            start = time.perf_counter()
            result = steps[step]()
            times[step].append(time.perf_counter() - start)
            del result
    return times


def measure(num_nodes: int, rounds: int) -> dict[str, Any]:
    circuit = build(num_nodes)
    text = circuit.repr()
    for parser in (cc.parse, parser_before().parse):
        assert parser(text) == circuit, f"{parser.__module__}.parse(print(c)) differs from c"
    plan = floor_plan(circuit)
    assert construct_again(plan) == circuit
    times = timed(
        {
            "build": lambda: build(num_nodes),
            "print": circuit.repr,
            "parse": lambda: cc.parse(text),
            "parse before": lambda: parser_before().parse(text),
            "construction floor": lambda: construct_again(plan),
            "build, gc paused": lambda: build_without_gc(num_nodes),
            "bare walk": lambda: bare_walk(circuit),
        },
        rounds,
    )
    return {"nodes": len(plan), "lines": text.count("\n") + 1, "times": times}


def median(row: dict[str, Any], step: str) -> float:
    return statistics.median(row["times"][step])


def report(small: dict[str, Any], large: dict[str, Any], load_before: tuple, load_after: tuple) -> None:
    for row in (small, large):
        print(
            f"{row['nodes']:>7} nodes {row['lines']:>7} lines, median (best) of {len(row['times']['parse'])}:"
        )
        for step, times in row["times"].items():
            print(f"    {step:<19} {statistics.median(times):.3f} s ({min(times):.3f} s)")
    steps = ("build", "print", "parse", "parse before", "construction floor")
    ratios = {step: median(large, step) / median(small, step) for step in steps}
    print(
        f"time ratios for {large['nodes'] / small['nodes']:.1f}x nodes (medians): "
        + ", ".join(f"{step} {ratio:.2f}x" for step, ratio in ratios.items())
    )
    slowest = max(median(large, step) for step in ("build", "print", "parse"))
    print(
        f"issue 2: slowest step at {large['nodes']} nodes {slowest:.3f} s (target < 2 s), "
        f"worst ratio {max(ratios[step] for step in ('build', 'print', 'parse')):.2f}x (target <= 12)"
    )
    print(f"load average (1, 5, 15 min): before {_load(load_before)}, after {_load(load_after)}")
    parse, before = median(large, "parse"), median(large, "parse before")
    print(
        f"headline: parse at {large['nodes']} nodes {parse:.3f} s median (target <= 0.9 s), "
        f"{before / parse:.2f}x faster than the parser before ({before:.3f} s, same run); "
        f"{large['nodes'] / small['nodes']:.1f}x nodes take {ratios['parse']:.2f}x the time "
        f"(before: {ratios['parse before']:.2f}x)"
    )


def _load(load: tuple) -> str:
    return ", ".join(f"{value:.2f}" for value in load)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs=2, default=None, metavar=("SMALL", "LARGE"))
    parser.add_argument("--rounds", type=int, default=None, help="runs per step (default 5, quick 3)")
    parser.add_argument("--quick", action="store_true", help="10^3 and 10^4 nodes, 3 rounds")
    args = parser.parse_args()
    sizes = args.sizes or ([1_000, 10_000] if args.quick else [10_000, 100_000])
    rounds = args.rounds or (3 if args.quick else 5)
    load_before = os.getloadavg()
    small, large = (measure(size, rounds) for size in sizes)
    report(small, large, load_before, os.getloadavg())


if __name__ == "__main__":
    main()
