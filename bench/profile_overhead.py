"""``cc.profile`` of a GPT-2-small forward against the same forward unprofiled, in the same run.

Issue 18's target: profiling (a timer read after every node) costs at most 10% over a plain
evaluation, at GPT-2-small dimensions (12 layers, 12 heads, d_model 768, vocab 50257), batch
8 x 128 tokens, random weights, CPU float32, 2 threads.  Plain and profiled evaluations
alternate, several rounds; medians, their ratio and the machine's load are reported.  The last
line is the headline.

A quick run: ``python bench/profile_overhead.py --layers 2 --heads 4 --d-model 256 --batch 2 --seq 64``.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from benchtools import add_gpt2_size_arguments, gc_timed, native_gpt2_circuit

TARGET = 1.10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from circuits.evaluation.profiling import profile

    circuit = native_gpt2_circuit(args)
    plain_times, profiled_times = [], []
    with torch.no_grad():
        circuit.evaluate()  # warm-up: allocator, einsum paths
        for _ in range(args.rounds):
            seconds, _ = gc_timed(circuit.evaluate)
            plain_times.append(seconds)
            seconds, result = gc_timed(lambda: profile(circuit))
            profiled_times.append(seconds)
    plain, profiled = statistics.median(plain_times), statistics.median(profiled_times)
    print(f"plain evaluate: median {plain:.3f} s of {[round(t, 3) for t in plain_times]}")
    print(f"profile: median {profiled:.3f} s of {[round(t, 3) for t in profiled_times]}")
    print(result.table(top=8))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"profile / evaluate: {profiled / plain:.3f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
