"""``cc.cost`` of a GPT-2-small circuit (8 x 128 tokens) and of a 10^5-node circuit.

Issue 18's targets: under 0.2 s for GPT-2 small, under 2 s at 10^5 nodes.  The
first call is reported apart from the best of the next ones: the first also
plans each distinct einsum (an ``lru_cache`` per equation and shapes), which
later calls on circuits of the same shapes reuse.  The 10^5-node circuit is
bench/format_scale.py's (branches of mixed ops over shared leaves).  The last
line is the headline.

A quick run: ``python bench/cost.py --layers 2 --heads 4 --d-model 256 --batch 2 --seq 64 --nodes 10000``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from benchtools import add_gpt2_size_arguments, best_time
from format_scale import build

GPT2_TARGET, SCALE_TARGET = 0.2, 2.0


def first_and_best(action, rounds: int) -> tuple[float, float]:
    start = time.perf_counter()
    action()
    first = time.perf_counter() - start
    best, _ = best_time(action, rounds)
    return first, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=3)
    parser.add_argument("--nodes", type=int, default=100_000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import circuits as cc
    from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights

    config = GPT2Config(
        n_layers=args.layers, n_heads=args.heads, d_model=args.d_model, vocab_size=args.vocab, n_ctx=1024
    )
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1)
    )
    gpt2 = build_gpt2(config, gpt2_random_weights(config, seed=0), tokens)
    gpt2_first, gpt2_best = first_and_best(lambda: cc.cost(gpt2), args.rounds)
    result = cc.cost(gpt2)
    print(
        f"GPT-2 {args.layers} layers, d_model {args.d_model}, batch {args.batch} x {args.seq}: "
        f"{len(result.nodes)} nodes, {result.total.flop_count / 1e9:.1f} GFLOP, peak {result.peak_bytes / 2**20:.0f} MiB"
    )
    print(f"  cost: first {gpt2_first:.3f} s, best of {args.rounds} after {gpt2_best:.3f} s")

    scale = build(args.nodes)
    scale_first, scale_best = first_and_best(lambda: cc.cost(scale), args.rounds)
    print(
        f"{len(cc.cost(scale).nodes)} nodes: cost first {scale_first:.3f} s, best of {args.rounds} after {scale_best:.3f} s"
    )
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(
        f"cc.cost: GPT-2 {gpt2_first:.3f} s (target < {GPT2_TARGET}), "
        f"{args.nodes} nodes {scale_first:.3f} s (target < {SCALE_TARGET})"
    )


if __name__ == "__main__":
    main()
