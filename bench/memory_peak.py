"""``cc.cost``'s predicted peak against the peak torch's profiler measures, one forward (issue 31 item 4).

A random Llama of Llama 3.2 1B's shape (16 layers, d_model 2048, 32 query heads sharing 8 key/value
heads of 64, d_mlp 8192, vocabulary 128256, tied embeddings: 1.24B parameters), built with
``models.from_hf`` in bfloat16 and in float32, on ``--batch`` x ``--seq`` tokens.  Predicted: the
values' peak of the logits ``'t.call'`` (``cc.cost(...).peak_value_bytes``: the weights are held
before and after and are left out) and the Arrays held (``held_bytes``), the latter against the
weights' own bytes.  Measured: the running sum of torch.profiler's memory events over a second
evaluation (the first warms kernels and hashes), as tests/test_cost.py measures it; the Arrays
held against the model's parameters, each tensor once.  The target is within 10%.

On a CPU without bfloat16 instructions a bfloat16 contraction works in float32 chunks
(``circuits/evaluation/reduced.py``): the chunks' transient copies count at their contraction's
step (``NodeCost.workspace_bytes``), and the float32 buffer kept between evaluations is predicted as
``scratch_bytes`` and compared with the buffer's size after the first evaluation
(``reduced.scratch_bytes()``); the measured second evaluation allocates no new buffer.

    python bench/memory_peak.py            # 1B, both dtypes (about two minutes; 8 GB of memory)
    python bench/memory_peak.py --quick    # a 4-layer model of d_model 256, seconds
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import circuits as cc
from circuits import models
from circuits.evaluation import reduced

TARGET = 0.10
MiB = 2**20


def llama(quick: bool, dtype: torch.dtype):
    import transformers

    transformers.logging.set_verbosity_error()
    size = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32)
    if quick:
        size = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4)
    config = transformers.LlamaConfig(
        **size,
        num_key_value_heads=size["num_attention_heads"] // 4,
        head_dim=64,
        vocab_size=8192 if quick else 128256,
        tie_word_embeddings=True,
        use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def profiled(run):
    """``(run(), the most bytes torch allocated at once during it)``, from the profiler's memory events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return result, peak


def profiled_peak(root: cc.Circuit) -> int:
    """The most bytes torch allocated at once during one evaluation of ``root``."""
    with torch.no_grad():
        return profiled(lambda: cc.evaluate(root))[1]


def measure(dtype: torch.dtype, args) -> float:
    model = llama(args.quick, dtype)
    tokens = torch.randint(0, 1000, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1))
    root = models.from_hf(model, tokens).get_unique("t.call")
    predicted = cc.cost(root)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied tensor once
    kept = reduced.scratch_bytes()
    with torch.no_grad():
        cc.evaluate(root)
    kept = reduced.scratch_bytes() - kept  # the buffer the first evaluation made (or grew)
    measured = profiled_peak(root)
    ratio = predicted.peak_value_bytes / measured
    print(
        f"{str(dtype).removeprefix('torch.')}: values peak predicted {predicted.peak_value_bytes / MiB:.1f} MiB, "
        f"measured {measured / MiB:.1f} MiB, ratio {ratio:.3f}; Arrays held predicted "
        f"{predicted.held_bytes / MiB:.0f} MiB, parameters {weights / MiB:.0f} MiB; float32 scratch "
        f"predicted {predicted.scratch_bytes / MiB:.1f} MiB, kept {kept / MiB:.1f} MiB",
        flush=True,
    )
    return ratio


def model_arguments(doc: str) -> argparse.ArgumentParser:
    """The options of the 1B-model memory benches: ``--quick``, ``--batch``, ``--seq``, ``--threads``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 4-layer model of d_model 256")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def main() -> None:
    args = model_arguments(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    ratios = {dtype: measure(dtype, args) for dtype in (torch.bfloat16, torch.float32)}
    worst = max(abs(ratio - 1) for ratio in ratios.values())
    shown = ", ".join(f"{str(d).removeprefix('torch.')} {r:.3f}" for d, r in ratios.items())
    verdict = "within" if worst <= TARGET else "outside"
    print(f"headline: predicted / measured values peak of one forward: {shown} ({verdict} {TARGET:.0%})")


if __name__ == "__main__":
    main()
