"""ACDC on a 4-layer GPT-2-style model: the mean time per tested edge against one full forward.

Issue 32's benchmark (item 6, ACDC's part): the native GPT-2 builder's model (random weights,
seed 0) of 4 layers, 12 heads, d_model 768, vocab 50257 (GPT-2 small's width), on 8 x 128 tokens,
CPU float32.  ``ex.acdc`` with KL at the last position (as ACDC's IOI, docstring and greater-than
tasks measure it), resample ablation from corrupted tokens (every third position redrawn), one
``--threshold``.

Figures, each printed with the load average (other processes share the cores):

- one full forward: ``cc.evaluate`` of the model circuit's logits (every position, no cache), the
  fastest of ``--rounds``; and, for scale, the edge circuit's KL circuit evaluated uncached (what
  ACDC's first evaluation costs);
- ACDC: the wall time of the whole ``ex.acdc`` call (the ``EdgeState`` built, which evaluates every
  component once at every position; the every-edge-ablated check; every test), divided by the
  number of tested edges; and, apart, ``ACDCResult.seconds`` (from the first test to the last,
  the set-up left out) divided by the same.

The last line is the headline: mean time per tested edge, set-up included / one full forward
(target <= 0.3).

    python bench/acdc.py              # the issue's sizes (several minutes on 2 cores)
    python bench/acdc.py --quick      # d_model 256, vocab 4096, 4 x 64 tokens: under a minute
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from benchtools import add_gpt2_size_arguments, best_time, native_gpt2_circuit, patching_inputs

import circuits as cc
from circuits import experiments as ex
from circuits.experiments.discovery_metric import DiscoveryMetric

TARGET = 0.3


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=2)
    parser.set_defaults(layers=4)
    parser.add_argument(
        "--threshold", type=float, default=None, help="ACDC's tau, in nats of KL (2e-3; --quick 5e-4)"
    )
    parser.add_argument(
        "--cache-gib", type=float, default=2.0, help="the Evaluator's budget (ACDC's default 2 GiB)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a small model: under a minute")
    args = parser.parse_args()
    if args.quick:
        args.d_model, args.heads, args.vocab, args.batch, args.seq = 256, 8, 4096, 4, 64
    if args.threshold is None:
        args.threshold = 5e-4 if args.quick else 2e-3
    torch.set_num_threads(args.threads)
    circuit = native_gpt2_circuit(args)
    clean, corrupted, _, _ = patching_inputs(args)
    circuit = ex.with_inputs(circuit, {"toks_int_var": clean})[0]
    inputs = {"toks_int_var": corrupted}

    logits = circuit.get_unique("t.call")
    forward, _ = best_time(lambda: cc.evaluate(logits), args.rounds)
    print(f"one full forward (the model's logits, uncached): {forward:.3f} s ({load()})")

    edges = ex.edge_circuit(circuit, ablation="resample", corrupted_inputs=inputs)
    print(f"{len(edges.senders)} senders, {len(edges.receivers)} receivers, {len(edges.edges)} edges")
    spec_root = DiscoveryMetric("kl", edges, position=-1, what="bench").root(edges.circuit)
    edge_forward, _ = best_time(lambda: cc.evaluate(spec_root), args.rounds)
    print(f"the edge circuit's KL, uncached: {edge_forward:.3f} s ({load()})")

    evaluator = cc.Evaluator(int(args.cache_gib * 2**30))
    start = time.perf_counter()
    result = ex.acdc(
        edges,
        None,
        "kl",
        threshold=args.threshold,
        position=-1,
        evaluator=evaluator,
    )
    whole = time.perf_counter() - start
    per_edge = whole / result.tested
    print(
        f"ACDC threshold {args.threshold:g}: {len(result.kept)} edges kept, {result.tested} tested "
        f"({result.evaluations} circuits evaluated), KL {result.metric:.4g}; {whole:.1f} s, of which set-up {whole - result.seconds:.1f} s ({load()})"
    )
    print(
        f"per tested edge: {per_edge:.3f} s = {per_edge / edge_forward:.3f} x the edge circuit's KL forward; "
        f"without the set-up {result.seconds / result.tested:.3f} s = {result.seconds / result.tested / forward:.3f} "
        "x one full forward"
    )
    ratio = per_edge / forward
    verdict = "meets" if ratio <= TARGET else "misses"
    print(
        f"mean time per tested edge (set-up included) / one full forward: {ratio:.3f} ({verdict} the target {TARGET})"
    )


if __name__ == "__main__":
    main()
