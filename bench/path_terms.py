"""``ex.path_terms`` of a GPT-2-small: every first-order term and every head-to-head composition.

Issue 16 asks for a report, not a target: build and evaluate all first- and second-order
head-composition terms (``order=2``) of GPT-2-small dimensions (12 layers, 12 heads, d_model 768,
vocab 50257) at batch 1 x 32, random weights, CPU float32, 2 threads; report the node count, the
build time and the evaluation time relative to one forward (``evaluate`` of the model circuit)
measured in the same run.  Forward, build and evaluation alternate, several rounds; medians and
the machine's load are reported.  The last line is the headline.

A quick run: ``python bench/path_terms.py --layers 4 --heads 4 --d-model 256 --vocab 5000``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import torch
from benchtools import add_gpt2_size_arguments


def timed(action):
    gc.collect()
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=3)
    parser.add_argument("--order", type=int, default=2)
    parser.add_argument(
        "--tokens", type=int, default=0, help="keep only this many logits (0: the whole vocab)"
    )
    parser.set_defaults(batch=1, seq=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import circuits as cc
    from circuits import experiments as ex
    from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights

    config = GPT2Config(
        n_layers=args.layers, n_heads=args.heads, d_model=args.d_model, vocab_size=args.vocab, n_ctx=1024
    )
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1)
    )
    circuit = cc.passes.split_heads(build_gpt2(config, gpt2_random_weights(config, seed=0), tokens))
    logits = circuit.get_unique(ex.Point("logits"))
    print(
        f"GPT-2 {args.layers} layers, {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.seq}; order {args.order}; "
        f"{'all logits' if args.tokens == 0 else f'{args.tokens} logits'}; {args.threads} threads; "
        f"{len(cc.unique_nodes(circuit))} nodes in the model"
    )
    forwards, builds, evaluations = [], [], []
    with torch.no_grad():
        for _ in range(args.rounds):
            seconds, _ = timed(circuit.evaluate)
            forwards.append(seconds)
            chosen = list(range(args.tokens)) or None
            seconds, result = timed(lambda: ex.path_terms(circuit, order=args.order, tokens=chosen))
            builds.append(seconds)
            seconds, value = timed(result.terms.evaluate)
            evaluations.append(seconds)
    expected = logits.evaluate()[:, -1]
    error = (value - (expected if args.tokens == 0 else expected[:, : args.tokens])).abs().max().item()
    nodes = len(cc.unique_nodes(result.terms))
    forward, build, evaluation = (statistics.median(t) for t in (forwards, builds, evaluations))
    for what, times in (("forward", forwards), ("build", builds), ("evaluate terms", evaluations)):
        print(f"{what}: median {statistics.median(times):.3f} s of {[round(t, 3) for t in times]}")
    print(
        f"{len(result.labels)} first-order terms, {len(result.compositions)} composition terms, "
        f"{nodes} distinct nodes; largest |sum of terms - logits| {error:.2e}"
    )
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(
        f"path terms (order {args.order}): {nodes} nodes, build {build:.2f} s = {build / forward:.1f} forwards, "
        f"evaluate {evaluation:.2f} s = {evaluation / forward:.1f} forwards (one forward {forward:.3f} s)"
    )


if __name__ == "__main__":
    main()
