"""Importing a Hugging Face GPT-2 with ``models.from_torch``, and the imported circuit's forward
against Hugging Face's own, same weights, same run.

Defaults are GPT-2-small dimensions (12 layers, 12 heads, d_model 768,
vocab 50257, 1024 positions), random weights, batch 8 x 128 tokens, CPU
float32, 2 threads (as bench/forward_vs_hf.py).  Reported: the import time
(torch.export, the walk, copying and hashing the weights), the circuit's
node count, then the logits forward of each, timed alternately over
several rounds (``c.evaluate()``, the library's ordinary evaluation, against
``model(input_ids).logits``), their medians and ratio, and the ratio of
the medians of process CPU time (other processes on the cores shake wall
time far more).  The last line is the headline: the wall-time ratio
(target <= 1.2).
A quick run (well under a minute): ``python bench/import_gpt2.py --layers 2 --heads 4 --d-model 256 --vocab 5000 --batch 2 --seq 64 --rounds 3``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from benchtools import add_gpt2_size_arguments, hf_gpt2_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=5)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)

    import circuits as cc
    from circuits import models

    model = hf_gpt2_model(args)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    print(
        f"GPT-2 {args.layers} layers, {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.seq}; float32, {torch.get_num_threads()} threads"
    )
    print(f"load average before import (other processes share the cores): {os.getloadavg()[0]:.2f}")
    start = time.perf_counter()
    circuit = models.from_torch(model, (tokens,), strict=True)  # strict: every op has a translation
    imported = time.perf_counter() - start
    nodes = cc.unique_nodes([circuit])
    print(f"import (strict=True): {imported:.2f} s; {len(nodes)} distinct nodes")

    def circuit_logits():
        return circuit.evaluate()

    def hf_logits():
        return model(input_ids=tokens).logits

    with torch.inference_mode():
        diff = (circuit_logits() - hf_logits()).abs().max().item()  # agreement, and a warm-up of both
        print(f"max |logits diff| {diff:.3g}")
        print(f"load average before timing: {os.getloadavg()[0]:.2f}")
        times: dict[str, list[float]] = {"circuit": [], "hf": []}
        cpu: dict[str, list[float]] = {"circuit": [], "hf": []}
        pairs = [("circuit", circuit_logits), ("hf", hf_logits)]
        for round_ in range(args.rounds):
            for name, fn in pairs if round_ % 2 == 0 else pairs[::-1]:  # alternate who goes first
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    print(f"load average after timing: {os.getloadavg()[0]:.2f}")
    med = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(
            f"{name:8s} median {med[name] * 1000:8.1f} ms  min {min(values) * 1000:8.1f} ms  "
            f"(rounds: {', '.join(f'{v * 1000:.0f}' for v in values)})"
        )
    cpu_ratio = statistics.median(cpu["circuit"]) / statistics.median(cpu["hf"])
    print(f"CPU-time ratio (process time, less shaken by other processes on the cores): {cpu_ratio:.3f}")
    print(f"best-of-rounds ratio: {min(times['circuit']) / min(times['hf']):.3f}")
    print(f"ratio (imported circuit / HF forward logits): {med['circuit'] / med['hf']:.3f} (target <= 1.2)")


if __name__ == "__main__":
    main()
