"""``ex.run_with_cache`` of every point against one plain evaluation of the same circuit.

Issue 15's target: caching every activation point (``run_with_cache(c)``, its default points)
costs at most 1.1x one ``cc.evaluate(c)``, at GPT-2-small dimensions (12 layers, 12 heads,
d_model 768, vocab 50257), batch 8 x 128 tokens, random weights, CPU float32, 2 threads.  Both
are timed alternately, several rounds; medians, their ratio and the machine's load are reported,
with the number of activations cached and the memory they hold.  The last line is the headline.

A quick run: ``python bench/run_with_cache.py --layers 2 --heads 4 --d-model 256 --batch 2 --seq 64``.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from benchtools import add_gpt2_size_arguments, gc_timed, native_gpt2_circuit

TARGET = 1.1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from circuits import experiments as ex

    circuit = native_gpt2_circuit(args)
    with torch.no_grad():
        plain_times, cached_times = [], []
        for _ in range(args.rounds):
            seconds, _ = gc_timed(circuit.evaluate)
            plain_times.append(seconds)
            seconds, cache = gc_timed(lambda: ex.run_with_cache(circuit))
            cached_times.append(seconds)
            storages = {
                value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()
                for value in cache.values()
            }
            held = sum(storages.values())  # a tensor cached under two keys (resid_post 0, resid_pre 1) once
            count = len(cache)
            del cache
    plain, cached = statistics.median(plain_times), statistics.median(cached_times)
    print(f"plain evaluate: median {plain:.3f} s of {[round(t, 3) for t in plain_times]}")
    print(f"run_with_cache: median {cached:.3f} s of {[round(t, 3) for t in cached_times]}")
    print(f"{count} activations cached, holding {held / 2**20:.0f} MiB")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"run_with_cache / evaluate: {cached / plain:.3f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
