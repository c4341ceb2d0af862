"""Attribution patching: its time against one clean forward, and its agreement with exact patching.

Issue 15's targets, both measured here:

1. Time.  ``ex.attribution_patching`` of every head output (``z``) and every ``resid_pre``
   position at GPT-2-small dimensions (12 layers, 12 heads, d_model 768, vocab 50257), random
   weights, batch 8 x 128, float32, 2 threads, metric = logit difference at the last position,
   against one clean forward plus the same metric, timed alternately in the same run: at most
   3.5x.  (The metric keeps every position's logits, ``push_down=False``, in both: gradients
   need the points the metric reads.)
2. Agreement.  On the shipped trained induction model: clean rows repeat a random block, the
   corrupted rows have another first block (so induction predicts the wrong tokens); metric = the
   mean loss on the repeated half.  Each head's attribution (summed over positions) against
   exact activation patching of that head (clean into corrupted, ``ex.sweep`` of ``ex.patch``):
   the Pearson correlation (at least 0.8 is the issue's expectation).

The last line is the headline (the time ratio).  A quick run:
``python bench/attribution.py --layers 2 --heads 4 --d-model 256 --batch 2 --seq 64 --rounds 2``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import torch
from benchtools import add_gpt2_size_arguments

TARGET = 3.5


def timing(args) -> tuple[float, float]:
    import circuits as cc
    from circuits import experiments as ex
    from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights

    config = GPT2Config(args.layers, args.heads, args.d_model, args.vocab, n_ctx=max(1024, args.seq + 1))
    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator)
    corrupted = clean.clone()
    corrupted[:, : args.seq // 2] = torch.randint(
        0, args.vocab, (args.batch, args.seq // 2), generator=generator
    )
    circuit = build_gpt2(config, gpt2_random_weights(config, seed=0), clean)
    good, bad = clean[:, -1], corrupted[:, -1] + (corrupted[:, -1] == clean[:, -1]).long()
    metric = ex.logit_diff(-1, good, bad % args.vocab, push_down=False)
    print(
        f"GPT-2 {args.layers} layers, {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.seq}; {args.threads} threads; {len(cc.unique_nodes(circuit))} nodes"
    )
    forward_times, attribution_times = [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        metric(circuit)
        forward_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        ex.attribution_patching(circuit, {"toks_int_var": corrupted}, metric, ["z", "resid_pre"])
        attribution_times.append(time.perf_counter() - start)
    print(
        f"clean forward + metric: median {statistics.median(forward_times):.3f} s of {_rounded(forward_times)}"
    )
    print(
        f"attribution patching:   median {statistics.median(attribution_times):.3f} s of {_rounded(attribution_times)}"
    )
    return statistics.median(forward_times), statistics.median(attribution_times)


def _rounded(times: list[float]) -> list[float]:
    return [round(t, 3) for t in times]


def repeated_half_loss(mask: torch.Tensor):
    """A Metric: the mean loss where the repeat makes the next token predictable."""
    import circuits as cc
    from circuits import experiments as ex

    def build(circuit):
        loss = circuit if circuit.name == "t.loss" else circuit.get_unique("t.loss")
        weights = cc.Array(mask / mask.sum(), name="metric.repeat_weights")
        return cc.Einsum.from_einsum_string("bs,bs->", loss, weights, name="metric.repeated_half_loss")

    return ex.Metric(build, "repeated_half_loss")


def agreement(batch: int, block: int, corruption: str) -> float:
    """Pearson of attribution and exact patching per head; ``corruption``: ``"first block"`` (another
    first block, so the repeat misleads) or ``"three tokens"`` (three tokens of the first block changed)."""
    import circuits as cc
    from circuits import experiments as ex
    from circuits.models.demo_model import load_demo_model, repeat_mask, repeated_tokens

    clean = repeated_tokens(batch, block, seed=0)
    other = repeated_tokens(batch, block, seed=1)
    corrupted = clean.clone()
    changed = slice(1, block + 1) if corruption == "first block" else [2, block // 2, block - 1]
    corrupted[:, changed] = other[:, changed]
    mask = repeat_mask(block, batch, 2 * block).float()
    metric = repeated_half_loss(mask)
    circuit = cc.passes.split_heads(cc.passes.causal_mask(load_demo_model(clean)))
    result = ex.attribution_patching(circuit, {"toks_int_var": corrupted}, metric, ["head_out"])
    attributed = result["head_out"].sum(-1).flatten()
    on_corrupted = ex.patch(circuit, "toks_int_var", {"toks_int_var": corrupted})
    patch_clean = functools.partial(ex.patch, source_inputs={"toks_int_var": clean})
    heads = ex.head_names(circuit)
    table = ex.sweep(on_corrupted, heads, patch_clean, metric, progress=False)
    exact = torch.tensor([table[head] - table.baseline for head in heads])
    pearson = float(torch.corrcoef(torch.stack([attributed, exact]))[0, 1])
    print(
        f"shipped model, {batch} rows, block {block}, {corruption} corrupted: clean loss {result.source_metric:.4f}, corrupted {result.target_metric:.4f}"
    )
    for head, a, e in zip(heads, attributed.tolist(), exact.tolist()):
        print(f"  {head:12s} attribution {a:+.4f}   exact patching {e:+.4f}")
    print(f"Pearson(attribution, exact) over {len(heads)} heads: {pearson:.3f} (issue expects >= 0.8)")
    by_position(clean, corrupted, metric)
    return pearson


def by_position(clean: torch.Tensor, corrupted: torch.Tensor, metric) -> None:
    """The same comparison per (layer, head, position) and per (layer, position) of ``resid_pre``."""
    import circuits as cc
    from circuits import experiments as ex
    from circuits.models.demo_model import load_demo_model

    circuit = cc.passes.causal_mask(load_demo_model(clean))
    inputs = {"toks_int_var": corrupted}
    result = ex.attribution_patching(circuit, inputs, metric, ["z", "resid_pre"])
    heads = ex.patching_grids.act_patch_attn_head_out_by_pos(circuit, inputs, metric).values.permute(0, 2, 1)
    resid = ex.patching_grids.act_patch_resid_pre(circuit, inputs, metric).values
    for name, estimate, exact in [
        ("(layer, head, pos)", result["z"], heads),
        ("resid_pre (layer, pos)", result["resid_pre"], resid),
    ]:
        delta = (exact - result.target_metric).flatten()
        pearson = float(torch.corrcoef(torch.stack([estimate.flatten(), delta]))[0, 1])
        print(f"  per {name}, {delta.numel()} patches: Pearson {pearson:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpt2_size_arguments(parser, rounds=3)
    parser.add_argument(
        "--demo-batch", type=int, default=32, help="rows for the agreement check (default 32)"
    )
    parser.add_argument("--demo-block", type=int, default=16, help="repeated block length there (default 16)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for corruption in ("first block", "three tokens"):
        agreement(args.demo_batch, args.demo_block, corruption)
    forward, attribution = timing(args)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(
        f"attribution patching / (clean forward + metric): {attribution / forward:.3f} (target <= {TARGET})"
    )


if __name__ == "__main__":
    main()
