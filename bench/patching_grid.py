"""The (layer, position) ``resid_pre`` patching grid: ``ex.patching_grids.act_patch_resid_pre`` against TransformerLens.

Issue 15's benchmark at GPT-2-small dimensions (12 layers, 12 heads, d_model 768, d_mlp 3072, vocab
50257, n_ctx 1024), random weights, batch 4 x 24 tokens, CPU float32, 2 threads; metric = logit
difference at the last position (one good and one bad token per row).  The corrupted tokens differ
from the clean ones at every third position.

- TransformerLens 4.x (its natively booted GPT-2, ``benchtools.tl_gpt2_model``): ``run_with_cache``
  on the clean tokens, then
  ``patching.get_act_patch_resid_pre`` (one ``run_with_hooks`` per (layer, position), every
  position unembedded).
- circuits: the same weights through ``models.from_transformer_lens`` (the bridge), then one
  ``act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, logit_diff(-1, good, bad))`` call (the
  clean and corrupted values included): per layer, every position's patch in one batched
  evaluation of the layers above it, one position unembedded.

Both run in the same process (``--rounds`` alternate which goes first; medians reported) and must
agree within ``--tolerance`` (1e-4).  The (head, position) head-output grid
(``act_patch_attn_head_out_by_pos``, TransformerLens's ``z`` patched per head and position) is timed
for circuits too; ``--tl-heads`` times TransformerLens's on it as well (12 x 24 x 12 runs:
minutes).  The last line is the headline ratio circuits / TransformerLens (target <= 0.3).

    python bench/patching_grid.py                                    # the issue's sizes
    python bench/patching_grid.py --d-model 256 --heads 8 --vocab 8192 --layers 4 --rounds 1   # quick: < 1 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from benchtools import patching_inputs, tl_gpt2_model

from circuits import experiments as ex
from circuits import models
from circuits.experiments import patching_grids

TARGET = 0.3


def timed(action):
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def head_grid(args, circuit, corrupted, metric, options, tl_grid) -> None:
    """Time the (head, position) head-output grid (and TransformerLens's, with ``--tl-heads``)."""
    from transformer_lens import patching

    with torch.no_grad():
        seconds, ours = timed(
            lambda: (
                patching_grids.act_patch_attn_head_out_by_pos(
                    circuit, {"toks_int_var": corrupted}, metric, **options
                ).values
            )
        )
        print(f"circuits (head, position) head-output grid {tuple(ours.shape)}: {seconds:.2f} s")
        if args.tl_heads:
            tl_seconds, theirs = timed(lambda: tl_grid(patching.get_act_patch_attn_head_out_by_pos))
            worst = (ours - theirs).abs().max().item()
            print(
                f"TransformerLens head grid {tl_seconds:.2f} s; ratio {seconds / tl_seconds:.3f}; "
                f"largest difference {worst:.2e}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--seq", type=int, default=24, help="positions the model reads (tokens are seq + 1 long)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both; medians count")
    parser.add_argument("--patches-per-run", type=int, default=32)
    parser.add_argument("--positions-per-run", type=int, default=8, help="positions one batched run spans")
    parser.add_argument("--skip-heads", action="store_true", help="leave out the (head, position) grid")
    parser.add_argument("--tl-heads", action="store_true", help="time TransformerLens's head grid too (slow)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformer_lens import patching

    model = tl_gpt2_model(args)
    clean, corrupted, good, bad = patching_inputs(args)
    circuit = models.from_transformer_lens(model, clean, family="gpt2")
    metric = ex.metrics.logit_diff(-1, good, bad)
    options = {"patches_per_run": args.patches_per_run, "positions_per_run": args.positions_per_run}

    def tl_metric(logits):
        last = logits[:, -1]
        return (last.gather(-1, good[:, None]) - last.gather(-1, bad[:, None])).mean()

    def tl_grid(function):
        _, cache = model.run_with_cache(clean[:, :-1])
        return function(model, corrupted[:, :-1], cache, tl_metric)

    print(
        f"GPT-2 {args.layers} layers x {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}, "
        f"batch {args.batch} x {args.seq}, float32, {args.threads} threads, "
        f"runs of {args.patches_per_run} patches over {args.positions_per_run} positions; load {os.getloadavg()[0]:.2f}"
    )
    ours_times, tl_times = [], []
    for round_ in range(args.rounds):
        with torch.no_grad():
            runs = [
                (
                    "circuits",
                    lambda: (
                        patching_grids.act_patch_resid_pre(
                            circuit, {"toks_int_var": corrupted}, metric, **options
                        ).values
                    ),
                    ours_times,
                ),
                ("TransformerLens", lambda: tl_grid(patching.get_act_patch_resid_pre), tl_times),
            ]
            results = {}
            for label, action, times in runs if round_ % 2 == 0 else runs[::-1]:
                seconds, results[label] = timed(action)
                times.append(seconds)
                print(
                    f"round {round_ + 1}: {label} resid_pre grid {seconds:.2f} s; load {os.getloadavg()[0]:.2f}"
                )
        worst = (results["circuits"] - results["TransformerLens"]).abs().max().item()
        print(f"round {round_ + 1}: largest |circuits - TransformerLens| over the grid: {worst:.2e}")
        if worst > args.tolerance:
            raise SystemExit(f"the grids disagree: {worst:.3e} > tolerance {args.tolerance:g}")

    if not args.skip_heads:
        head_grid(args, circuit, corrupted, metric, options, tl_grid)
    ours, theirs = statistics.median(ours_times), statistics.median(tl_times)
    print(
        f"circuits {ours:.2f} s, TransformerLens {theirs:.2f} s (medians of {args.rounds}); "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(f"resid_pre grid circuits / TransformerLens: {ours / theirs:.3f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
