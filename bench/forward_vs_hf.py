"""Circuit evaluation against the Hugging Face forward, same GPT-2 weights.

Defaults are GPT-2-small dimensions (12 layers, 12 heads, d_model 768,
vocab 50257), batch 8 x 128 tokens, random weights, CPU float32, 2 threads.
Both are timed alternately in one run, several rounds; the medians and
their ratio are reported:

- logits: the circuit's ``'t.call'`` against ``model(input_ids).logits``;
- loss: the whole circuit (per-token loss ``'t.loss'``, its mean taken
  after) against ``model(input_ids, labels=...).loss``.

The last line is the headline ratio (logits, circuit / Hugging Face).
A quick run: ``python bench/forward_vs_hf.py --layers 2 --d-model 256 --batch 2 --seq 64 --rounds 3``.
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
    import circuits.models as cm

    model = hf_gpt2_model(args)
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1)
    )
    inputs = tokens[:, :-1]

    start = time.perf_counter()
    circuit = cm.from_hf(model, tokens)
    build = time.perf_counter() - start
    logits_node = circuit.get_unique("t.call")
    nodes = len(cc.unique_nodes([circuit]))
    print(
        f"GPT-2 {args.layers} layers, {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.seq}; float32, {torch.get_num_threads()} threads"
    )
    print(f"load average before timing (other processes share the cores): {os.getloadavg()[0]:.2f}")
    print(
        f"circuit: {nodes} distinct nodes, built in {build:.2f} s (from_hf: convert, copy and hash the weights)"
    )

    def circuit_logits():
        return cc.evaluate(logits_node)

    def hf_logits():
        return model(input_ids=inputs).logits

    def circuit_loss():
        return cc.evaluate(circuit).mean()

    def hf_loss():
        return model(input_ids=tokens, labels=tokens).loss

    with torch.inference_mode():
        # agreement first (and a warm-up of both)
        diff = (circuit_logits() - hf_logits()).abs().max().item()
        loss_diff = abs(circuit_loss().item() - hf_loss().item())
        print(f"max |logits diff| {diff:.3g}, |loss diff| {loss_diff:.3g}")
        times: dict[str, list[float]] = {
            name: [] for name in ("circuit logits", "hf logits", "circuit loss", "hf loss")
        }
        pairs = [
            ("circuit logits", circuit_logits),
            ("hf logits", hf_logits),
            ("circuit loss", circuit_loss),
            ("hf loss", hf_loss),
        ]
        for round_ in range(args.rounds):
            order = pairs if round_ % 2 == 0 else pairs[1::-1] + pairs[:1:-1]  # alternate who goes first
            for name, fn in order:
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    print(f"load average after timing: {os.getloadavg()[0]:.2f}")
    med = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(
            f"{name:15s} median {med[name] * 1000:8.1f} ms  min {min(values) * 1000:8.1f} ms  "
            f"(rounds: {', '.join(f'{v * 1000:.0f}' for v in values)})"
        )
    loss_ratio = med["circuit loss"] / med["hf loss"]
    ratio = med["circuit logits"] / med["hf logits"]
    best = min(times["circuit logits"]) / min(times["hf logits"])
    print(f"loss ratio (circuit 't.loss' / HF forward with labels): {loss_ratio:.3f}")
    print(f"best-of-rounds ratio (logits): {best:.3f}")
    print(f"ratio (circuit 't.call' / HF forward logits): {ratio:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
