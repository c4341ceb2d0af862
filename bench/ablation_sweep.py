"""Zero-ablating every attention head: ``circuits.experiments.sweep`` against TransformerLens.

Issue 7's benchmark at GPT-2-small dimensions (12 layers, 12 heads, d_model
768, vocab 50257), batch 8 x 128 predicted tokens, random weights, CPU
float32, 2 threads: zero-ablate each of the 144 heads in turn, metric =
mean loss.

- TransformerLens 4.x: its natively booted GPT-2 (``TransformerBridge.boot_native``,
  what ``HookedTransformer(cfg)`` was in 3.x) with random weights, one
  ``run_with_hooks(tokens, return_type="loss")`` per head with a hook that
  zeroes ``blocks.{L}.attn.hook_z[:, :, h]``.
- circuits: the same weights through ``models.from_transformer_lens`` (the bridge),
  then one ``sweep(circuit, head_names(circuit), zero_ablate, mean_loss)``
  call (the clean run included), which evaluates through a cached
  ``Evaluator``: per head, only what lies above that head is recomputed.
  The circuit is not split beforehand: the sweep splits only each
  target's own layer, so the layers above it keep their heads in one
  matmul.  ``--presplit`` sweeps ``split_heads(circuit)`` instead (every
  layer split, each head's projections computed on their own).

Both sweeps run in the same process on the same tokens (``--rounds`` > 1
alternates which goes first and reports medians), under ``torch.no_grad()``,
with glibc told to keep freed memory for reuse (``--malloc``, see
``retain_freed_memory``); their 144 losses must agree within
``--tolerance`` (1e-4).  Wall time is the measure; process CPU time is
printed too (less sensitive to other load on the machine).  The last line
is the headline ratio, circuits / TransformerLens (target <= 0.5).

    pip install -e ".[bench]"                # transformer-lens >= 4
    python bench/ablation_sweep.py           # the issue's dimensions (several minutes)
    python bench/ablation_sweep.py --d-model 384 --vocab 8192 --batch 4 --seq 64   # quick: ~30 s
    python bench/ablation_sweep.py --policy lru      # the sweep's cache with plain LRU admission
    python bench/ablation_sweep.py --presplit        # sweep the circuit with every layer split
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch
from benchtools import tl_gpt2_model

from circuits import experiments as ex
from circuits import models
from circuits.passes import split_heads
from circuits.evaluation.cache import Evaluator

TARGET = 0.5


def retain_freed_memory() -> None:
    """Ask glibc to keep freed memory in the process (no mmap per large tensor, no trimming).

    Both sweeps allocate and free hundreds of MB per forward (the logits and
    log-probs alone are 206 MB each at the issue's size).  With glibc's
    defaults every such tensor is a fresh mmap, and on this VM touching
    fresh pages costs up to 7 us each once the process holds a few GB,
    which made timings of either sweep swing by 30% from run to run.
    Keeping freed memory for reuse removes that noise for both alike;
    ``--malloc system`` measures with the defaults.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-3, 2**31 - 1)  # M_MMAP_THRESHOLD: serve large blocks from the heap
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: do not give freed heap back to the system


def tl_sweep(model, tokens, targets) -> dict[str, float]:
    """Mean loss with ``blocks.{L}.attn.hook_z[:, :, h]`` zeroed, one ``run_with_hooks`` per ``(L, h)``."""
    results = {}
    for layer, head in targets:

        def zero_head(z, hook, head=head):
            z[:, :, head] = 0.0
            return z

        loss = model.run_with_hooks(
            tokens, return_type="loss", fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)]
        )
        results[f"b{layer}.a.head{head}"] = float(loss)
    return results


def timed(action):
    start, cpu = time.perf_counter(), time.process_time()
    result = action()
    return (time.perf_counter() - start, time.process_time() - cpu), result


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
    parser.add_argument(
        "--malloc",
        choices=["retain", "system"],
        default="retain",
        help="retain: glibc keeps freed memory for reuse (mallopt), for both sweeps; system: glibc defaults",
    )
    parser.add_argument(
        "--presplit", action="store_true", help="sweep split_heads(circuit) (every layer split) instead"
    )
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.malloc == "retain":
        retain_freed_memory()

    model = tl_gpt2_model(args)
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(args.seed + 1)
    )
    (build_time, _), circuit = timed(lambda: models.from_transformer_lens(model, tokens, family="gpt2"))
    split_time = 0.0
    if args.presplit:
        (split_time, _), circuit = timed(lambda: split_heads(circuit))
    names = ex.head_names(circuit)
    every_head = [(layer, head) for layer in range(args.layers) for head in range(args.heads)]
    assert len(names) == args.layers * args.heads
    print(
        f"GPT-2 {args.layers} layers x {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}, "
        f"batch {args.batch} x {args.seq}, float32, {args.threads} threads, {len(names)} heads to ablate"
    )
    print(
        f"circuit from the TransformerLens bridge {build_time:.2f} s"
        + (f", split_heads {split_time:.2f} s" if args.presplit else ", layers split by the sweep")
        + " (setup, not timed below)"
    )

    ours_times, tl_times, ours_cpu, tl_cpu = [], [], [], []
    budget = int(args.cache_gib * 2**30)

    def run_ours(round_: int):
        evaluator = Evaluator(budget)
        with torch.no_grad():
            (t, cpu), result = timed(
                lambda: ex.sweep(
                    circuit,
                    names,
                    ex.zero_ablate,
                    ex.mean_loss,
                    evaluator=evaluator,
                    policy=args.policy,
                    progress=False,
                )
            )
        ours_times.append(t)
        ours_cpu.append(cpu)
        stats = evaluator.stats
        print(
            f"round {round_ + 1}: circuits sweep {t:.2f} s, cpu {cpu:.2f} s ({t / len(names):.2f} s/head; "
            f"clean loss {result.baseline:.6f}; {stats.computed} nodes computed, {stats.hits} cache hits, "
            f"cache peak {stats.peak_nbytes / 2**20:.0f} MiB of {args.cache_gib:g} GiB, "
            f"{stats.evicted} evictions)"
        )
        return result

    def run_theirs(round_: int):
        with torch.no_grad():
            (t, cpu), result = timed(lambda: tl_sweep(model, tokens, every_head))
        tl_times.append(t)
        tl_cpu.append(cpu)
        print(
            f"round {round_ + 1}: TransformerLens run_with_hooks sweep {t:.2f} s, cpu {cpu:.2f} s "
            f"({t / len(names):.2f} s/head)"
        )
        return result

    for round_ in range(args.rounds):
        if round_ % 2 == 0:  # alternate which goes first, so drifting machine load hits both alike
            ours, theirs = run_ours(round_), run_theirs(round_)
        else:
            theirs, ours = run_theirs(round_), run_ours(round_)
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
    cpu_ratio = statistics.median(ours_cpu) / statistics.median(tl_cpu)
    ratio = ours_median / tl_median
    print(
        f"circuits {ours_median:.2f} s, TransformerLens {tl_median:.2f} s (wall, median of {args.rounds}); "
        f"cpu-time ratio {cpu_ratio:.2f}"
    )
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"headline: circuits / TransformerLens = {ratio:.2f} ({verdict} the target <= {TARGET})")


if __name__ == "__main__":
    main()
