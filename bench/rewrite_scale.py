"""update of one deep leaf and get of a regex over a 10^5-node circuit.

Issue 4's targets: each under 1 s at 10^5 nodes.  The circuit is a
residual stream, the deepest shape a rewrite meets: per layer an Einsum
with the layer's own weight, a relu, and an Add onto the stream, so a leaf
at the bottom ('embed', depth about half the node count) or a weight of an
early layer has most of the circuit as its ancestors, and updating it
rebuilds every one of them.  Also reported: the same update through a
path-restricted IterativeMatcher, a replace, and expand adding a batch axis
at the bottom (which must re-derive every ancestor).

    python bench/rewrite_scale.py                  # the issue's size, 100000 nodes
    python bench/rewrite_scale.py --nodes 1000 10000
"""

from __future__ import annotations

import argparse
import sys

import torch
from benchtools import best_time

import circuits as cc

sys.setrecursionlimit(10_000)  # nothing here may need more; a recursion would fail loudly


def build(num_nodes: int) -> cc.Circuit:
    """About ``num_nodes`` distinct nodes: 4 per layer, a chain as deep as half of them."""
    generator = torch.Generator().manual_seed(0)
    stream = cc.Array(torch.randn(4, 8, generator=generator), name="embed")
    for layer in range(max(1, num_nodes // 4)):
        weight = cc.Array(torch.randn(8, 8, generator=generator), name=f"l{layer}.w")
        hidden = cc.Einsum.from_einsum_string("sd,ed->se", stream, weight, name=f"l{layer}.mlp")
        act = cc.GeneralFunction.new_by_name(hidden, spec_name="relu", name=f"l{layer}.act")
        stream = cc.Add(stream, act, name=f"l{layer}.resid")
    return stream


def measure(num_nodes: int, repeat: int) -> dict:
    circuit = build(num_nodes)
    nodes = len(cc.unique_nodes([circuit]))
    before = circuit.hash
    new_embed = cc.Array(torch.zeros(4, 8), name="embed")
    new_weight = cc.Array(torch.zeros(8, 8), name="l1.w")
    regex = cc.Matcher.regex(r"^l\d*7\.w$")
    layers = max(1, num_nodes // 4)
    rows = {}
    rows["update leaf 'embed'"], out = best_time(lambda: circuit.update("embed", lambda n: new_embed), repeat)
    assert out.get_unique("embed") is new_embed and len(cc.unique_nodes([out])) == nodes
    rows["update leaf 'l1.w'"], out = best_time(lambda: circuit.update("l1.w", lambda n: new_weight), repeat)
    assert out.get_unique("l1.w") is new_weight
    rows["get regex"], found = best_time(lambda: circuit.get(regex), repeat)
    assert len(found) == sum(1 for i in range(layers) if str(i).endswith("7"))
    rows["get_unique name"], _ = best_time(lambda: circuit.get_unique("l1.w"), repeat)
    path = cc.IterativeMatcher(f"l{layers - 1}.resid").children(0).then("embed")
    rows["update via IterativeMatcher"], out = best_time(
        lambda: circuit.update(path, lambda n: new_embed), repeat
    )
    assert len(out.get("embed")) == 2  # un-shared: patched below child 0, clean below child 1
    old_embed = circuit.get_unique("embed")
    rows["replace leaf"], _ = best_time(lambda: circuit.replace({old_embed: new_embed}), repeat)
    batched = cc.Array(torch.zeros(2, 4, 8), name="embed")
    rows["expand batch of 2"], out = best_time(lambda: cc.expand(circuit, {"embed": batched}), repeat)
    assert out.shape == (2,) + circuit.shape
    assert circuit.hash == before, "a rewrite changed its input"
    return {"nodes": nodes, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[100_000], help="circuit sizes to measure")
    parser.add_argument("--repeat", type=int, default=3, help="runs per step; the fastest counts")
    args = parser.parse_args()
    results = []
    for size in args.nodes:
        result = measure(size, args.repeat)
        results.append(result)
        print(f"{result['nodes']} nodes:")
        for step, seconds in result["rows"].items():
            print(f"  {step:<28} {seconds:.3f} s")
    last = results[-1]
    update_time = last["rows"]["update leaf 'embed'"]
    get_time = last["rows"]["get regex"]
    verdict = "met" if max(update_time, get_time) < 1.0 else "NOT met"
    print(
        f"headline: at {last['nodes']} nodes, update of the deepest leaf {update_time:.3f} s, "
        f"get of a regex {get_time:.3f} s (target < 1 s each: {verdict})"
    )


if __name__ == "__main__":
    main()
