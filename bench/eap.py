"""EAP over every edge: its time against one clean forward, in the same run.

Issue 32's benchmark (item 6, EAP's part): the native GPT-2 builder's model (random weights, seed
0) at GPT-2-small dimensions (12 layers, 12 heads, d_model 768, vocab 50257) on 8 x 128 tokens,
CPU float32.  ``ex.edge_attribution(circuit, corrupted, metric)`` (method ``"eap"``: the corrupted
run, the tracked clean run, its backward, the scores of every edge) with the metric the logit
difference at the last position (``push_down=False``: the gradient needs every receiver), against
one clean forward plus the same metric (``metric(circuit)``), timed alternately round by round;
medians of ``--rounds``.  Corrupted tokens: every third position redrawn.

The last line is the headline: EAP / (clean forward + metric) (target <= 3.5).

    python bench/eap.py              # the issue's sizes (several minutes on 2 cores)
    python bench/eap.py --quick      # 4 layers, 8 heads, d_model 256, vocab 4096, 4 x 64: under a minute
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchtools import add_gpt2_size_arguments, gc_timed, native_gpt2_circuit, patching_inputs

TARGET = 3.5


def main() -> None:
    import torch

    from circuits import experiments as ex

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a small model: under a minute")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.d_model, args.heads, args.vocab, args.batch, args.seq = 4, 256, 8, 4096, 4, 64
    torch.set_num_threads(args.threads)
    circuit = native_gpt2_circuit(args)
    clean, corrupted, good, bad = patching_inputs(args)
    circuit = ex.with_inputs(circuit, {"toks_int_var": clean})[0]
    metric = ex.logit_diff(-1, good, bad, push_down=False)
    inputs = {"toks_int_var": corrupted}

    forward_times, eap_times = [], []
    for _ in range(args.rounds):
        forward_times.append(gc_timed(lambda: metric(circuit))[0])
        seconds, scores = gc_timed(lambda: ex.edge_attribution(circuit, inputs, metric))
        eap_times.append(seconds)
        print(
            f"round {len(eap_times)}: forward {forward_times[-1]:.3f} s, EAP {seconds:.3f} s "
            f"({len(scores)} edges; load {os.getloadavg()[0]:.2f})"
        )
    forward, eap = statistics.median(forward_times), statistics.median(eap_times)
    print(f"clean forward + metric: median {forward:.3f} s of {[round(t, 3) for t in forward_times]}")
    print(f"EAP over every edge:    median {eap:.3f} s of {[round(t, 3) for t in eap_times]}")
    ratio = eap / forward
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"EAP / (clean forward + metric): {ratio:.3f} ({verdict} the target {TARGET})")


if __name__ == "__main__":
    main()
