"""Zero-ablating every attention head: ``circuits.experiments.sweep`` against TransformerLens.

Issue 7's benchmark at GPT-2-small dimensions (12 layers, 12 heads, d_model
768, vocab 50257), batch 8 x 128 predicted tokens, random weights, CPU
float32, 2 threads: zero-ablate each of the 144 heads in turn, metric =
mean loss.

- TransformerLens 3.x: a ``HookedTransformer`` with random weights, one
  ``run_with_hooks(tokens, return_type="loss")`` per head with a hook that
  zeroes ``blocks.{L}.attn.hook_z[:, :, h]``.
- circuits: the same weights through ``models.from_transformer_lens``,
  ``split_heads``, then one ``sweep(split, head_names(split), zero_ablate,
  mean_loss)`` call (the clean run included), which evaluates through a
  cached ``Evaluator``: per head, only what lies above that head is
  recomputed.

Both sweeps run in the same process on the same tokens (``--rounds`` > 1
alternates them and reports medians), under ``torch.no_grad()``; their 144
losses must agree within ``--tolerance`` (1e-4).  The last line is the
headline ratio, circuits / TransformerLens (target <= 0.5).

    pip install -e ".[bench]"                # transformer-lens < 4
    python bench/ablation_sweep.py           # the issue's dimensions (several minutes)
    python bench/ablation_sweep.py --layers 2 --heads 4 --d-model 128 --vocab 1000 --batch 2 --seq 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from circuits import experiments as ex
from circuits import models
from circuits.passes import split_heads

TARGET = 0.5


def tl_model(args):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=args.layers,
        n_heads=args.heads,
        d_model=args.d_model,
        d_head=args.d_model // args.heads,
        d_mlp=4 * args.d_model,
        d_vocab=args.vocab,
        n_ctx=max(1024, args.seq + 1),
        act_fn="gelu_new",
        normalization_type="LN",
        seed=args.seed,
    )
    model = HookedTransformer(cfg)
    model.eval()
    # TransformerLens initialises biases to 0 and norms to 1: perturb every parameter so each one matters
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def tl_sweep(model, tokens, layers: int, heads: int) -> dict[str, float]:
    results = {}
    for layer in range(layers):
        for head in range(heads):

            def zero_head(z, hook, head=head):
                z[:, :, head] = 0.0
                return z

            loss = model.run_with_hooks(
                tokens, return_type="loss", fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)]
            )
            results[f"b{layer}.a.head{head}"] = float(loss)
    return results


def timed(action):
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128, help="predicted positions (tokens are seq + 1 long)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternating rounds of both sweeps; medians count"
    )
    parser.add_argument(
        "--cache-gib", type=float, default=4.0, help="the Evaluator's budget, GiB (default 4)"
    )
    parser.add_argument(
        "--policy", choices=["planned", "lru"], default="planned", help="the sweep's cache admission"
    )
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = tl_model(args)
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(args.seed + 1)
    )
    build_time, circuit = timed(
        lambda: models.from_transformer_lens(model.state_dict(), tokens, family="gpt2")
    )
    split_time, split = timed(lambda: split_heads(circuit))
    names = ex.head_names(split)
    assert len(names) == args.layers * args.heads
    print(
        f"GPT-2 {args.layers} layers x {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}, "
        f"batch {args.batch} x {args.seq}, float32, {args.threads} threads, {len(names)} heads to ablate"
    )
    print(
        f"circuit from the TransformerLens state dict {build_time:.2f} s, split_heads {split_time:.2f} s "
        "(setup, not timed below)"
    )

    ours_times, tl_times = [], []
    for round_ in range(args.rounds):
        evaluator = ex.Evaluator(int(args.cache_gib * 2**30))
        with torch.no_grad():
            t, ours = timed(
                lambda: ex.sweep(
                    split,
                    names,
                    ex.zero_ablate,
                    ex.mean_loss,
                    evaluator=evaluator,
                    policy=args.policy,
                    progress=False,
                )
            )
        ours_times.append(t)
        stats = evaluator.stats
        print(
            f"round {round_ + 1}: circuits sweep {t:.1f} s ({t / len(names):.2f} s/head; clean loss "
            f"{ours.baseline:.6f}; {stats.computed} nodes computed, {stats.hits} cache hits, cache peak "
            f"{stats.peak_nbytes / 2**20:.0f} MiB of {args.cache_gib:g} GiB, {stats.evicted} evictions)"
        )
        with torch.no_grad():
            t, theirs = timed(lambda: tl_sweep(model, tokens, args.layers, args.heads))
        tl_times.append(t)
        print(
            f"round {round_ + 1}: TransformerLens run_with_hooks sweep {t:.1f} s "
            f"({t / len(names):.2f} s/head)"
        )
        worst = max(abs(ours[name] - theirs[name]) for name in names)
        print(
            f"round {round_ + 1}: largest |circuits - TransformerLens| over {len(names)} losses: {worst:.2e}"
        )
        if worst > args.tolerance:
            raise SystemExit(f"the sweeps disagree: {worst:.3e} > tolerance {args.tolerance:g}")
        by_layer = {}
        for record in ours.records:
            by_layer.setdefault(record["layer"], []).append(record["seconds"])
        print(
            "circuits seconds per head, mean by ablated layer: "
            + ", ".join(f"L{layer} {statistics.mean(s):.2f}" for layer, s in sorted(by_layer.items()))
        )

    ours_median, tl_median = statistics.median(ours_times), statistics.median(tl_times)
    ratio = ours_median / tl_median
    print(f"circuits {ours_median:.1f} s, TransformerLens {tl_median:.1f} s (median of {args.rounds})")
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"headline: circuits / TransformerLens = {ratio:.2f} ({verdict} the target <= {TARGET})")


if __name__ == "__main__":
    main()
