"""Splitting attention heads, and the loss at one position by pushing an Index down.

Issue 6's targets at GPT-2-small dimensions (12 layers, 12 heads, d_model
768, vocab 50257), batch 8 x 128 tokens, random weights, CPU float32:

- splitting all 144 heads takes under 2 s;
- evaluating the split circuit takes at most 1.5x the unsplit one;
- the loss at one position via ``push_down_index`` against the full loss
  (a large speedup is expected: the unembedding shrinks to one row).

Timings are medians over alternating rounds, so both sides see the same
machine load.

    python bench/split_heads.py                                # the issue's sizes
    python bench/split_heads.py --layers 2 --d-model 128 --heads 4 --batch 2 --seq 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from benchtools import add_gpt2_size_arguments

import circuits as cc
from circuits import models
from circuits.passes import push_down_index, split_heads


def timed(action):
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_gpt2_size_arguments(parser, rounds=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = models.GPT2Config(
        n_layers=args.layers,
        n_heads=args.heads,
        d_model=args.d_model,
        vocab_size=args.vocab,
        n_ctx=max(1024, args.seq),
    )
    weights = models.gpt2_random_weights(config, seed=0)
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(0)
    )
    build_time, circuit = timed(lambda: models.build_gpt2(config, weights, tokens))
    split_time, split = timed(lambda: split_heads(circuit))
    heads = args.layers * args.heads
    print(
        f"GPT-2 {args.layers}x{args.heads}, d_model {args.d_model}, batch {args.batch}x{args.seq}: "
        f"build {build_time:.2f} s, {len(cc.unique_nodes([circuit]))} nodes unsplit, "
        f"{len(cc.unique_nodes([split]))} split"
    )
    print(f"split {heads} heads: {split_time:.3f} s (target < 2 s)")

    position = (args.batch - 1, args.seq // 2)
    push_time, at_position = timed(lambda: push_down_index(cc.Index(circuit, position, name="loss@pos")))
    unsplit_times, split_times, pushed_times = [], [], []
    for _ in range(args.rounds):
        t, full = timed(circuit.evaluate)
        unsplit_times.append(t)
        t, split_value = timed(split.evaluate)
        split_times.append(t)
        t, one = timed(at_position.evaluate)
        pushed_times.append(t)
    torch.testing.assert_close(split_value, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(one, full[position], rtol=1e-4, atol=1e-4)
    unsplit, split_median = statistics.median(unsplit_times), statistics.median(split_times)
    pushed, full_median = statistics.median(pushed_times), unsplit
    print(f"evaluate unsplit {unsplit:.3f} s, split {split_median:.3f} s (median of {args.rounds})")
    print(
        f"loss at position {list(position)}: push-down {push_time:.3f} s once, then evaluate {pushed:.3f} s "
        f"vs full loss {full_median:.3f} s: {full_median / pushed:.1f}x faster"
    )
    print(
        f"headline: split {split_time:.3f} s (target < 2 s), split/unsplit evaluation "
        f"{split_median / unsplit:.2f}x (target <= 1.5x), one-position loss {full_median / pushed:.1f}x faster"
    )


if __name__ == "__main__":
    main()
