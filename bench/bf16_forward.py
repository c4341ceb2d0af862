"""The circuit's bfloat16 forward against Hugging Face's bfloat16 forward, same weights, same run.

Two sizes by default, random weights made in bfloat16, CPU, 2 threads:

- GPT-2 small (12 layers, 12 heads, d_model 768, vocab 50257);
- a 1B Llama-shaped model (Llama 3.2 1B's shape: 16 layers, 32 query heads sharing 8 key/value
  heads, d_model 2048, d_mlp 8192, vocab 128256, tied embeddings; 1.24B parameters, 2.5 GB in
  bfloat16);

each on 1 x 64 tokens (``--batch``, ``--seq``).  On a CPU without bfloat16 instructions (AVX2)
Hugging Face's bfloat16 forward is slow: torch's portable bfloat16 matrix product, and GPT-2's
``Conv1D`` weights are ``[in, out]``, its slowest layout (132 s for GPT-2 small on 4 x 64 tokens,
measured on 2 loaded cores), so the default batch is small.

Per size, the circuit's logits ``'t.call'`` (``from_hf(model, tokens, attach=True)``: its arrays
are views of the model's parameters) and ``model(input_ids).logits`` are timed alternately (who
goes first alternates too) for ``--rounds`` rounds, and the medians compared; then the model is
converted to float32 in place and the same is done there, for reference.  Agreement is printed:
the largest difference of the bfloat16 logits from Hugging Face's bfloat16 ones, and Hugging
Face's own bfloat16 against its float32 (the scale of bfloat16's rounding).

The machine's load average is printed before and after each timing: other processes share the
cores, and every op that torch runs on two threads waits for both.  The last line is the headline:
the bfloat16 ratio (circuit / Hugging Face, medians) at each size.
``--quick`` (tiny sizes, 3 rounds) runs in under a minute.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def gpt2_small(quick: bool) -> Any:
    import transformers

    size = dict(n_layer=2, n_head=4, n_embd=128, vocab_size=2000) if quick else dict(vocab_size=50257)
    config = transformers.GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0, **size)
    return _made_in_bfloat16(transformers.GPT2LMHeadModel, config)


def llama_1b(quick: bool) -> Any:
    import transformers

    size = (
        dict(num_hidden_layers=2, hidden_size=128, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=4000)
        if quick
        else dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256)
    )  # fmt: skip
    config = transformers.LlamaConfig(
        max_position_embeddings=2048,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        **size,
    )
    return _made_in_bfloat16(transformers.LlamaForCausalLM, config)


def _made_in_bfloat16(model_class: Any, config: Any) -> Any:
    """The model with random weights (seed 0), made in bfloat16 (no float32 copy of a 1B model first)."""
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return model_class(config).eval()
    finally:
        torch.set_default_dtype(default)


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def alternated(actions: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds per run of each action, ``rounds`` times, the order reversed every other round."""
    times: dict[str, list[float]] = {name: [] for name in actions}
    order = list(actions.items())
    for round_ in range(rounds):
        for name, action in order if round_ % 2 == 0 else order[::-1]:
            gc.collect()
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    return times


def compare(model: Any, tokens: torch.Tensor, rounds: int, label: str) -> tuple[float, torch.Tensor]:
    """Times the circuit's and the model's logits in the model's dtype; the median ratio and the model's logits."""
    import circuits as cc
    import circuits.models as cm

    start = time.perf_counter()
    logits_node = cm.from_hf(model, tokens, attach=True).get_unique("t.call")
    built = time.perf_counter() - start
    inputs = tokens[:, :-1]
    actions = {
        "circuit": lambda: cc.evaluate(logits_node),
        "hugging face": lambda: model(input_ids=inputs).logits,
    }
    with torch.inference_mode():
        ours, theirs = actions["circuit"](), actions["hugging face"]()  # agreement, and a warm-up
        print(f"  {label}: circuit built in {built:.1f} s; max |circuit - HF| {_max_diff(ours, theirs):.3g}")
        print(f"  load average before timing: {load()}")
        times = alternated(actions, rounds)
        print(f"  load average after timing: {load()}")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {label} {name:12s} median {medians[name]:7.2f} s  (rounds: {shown})")
    ratio = medians["circuit"] / medians["hugging face"]
    print(f"  {label} ratio (circuit / HF): {ratio:.3f}")
    return ratio, theirs.float()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def run_size(name: str, make: Callable[[bool], Any], batch: int, seq: int, args: argparse.Namespace) -> float:
    from circuits.evaluation.reduced import native_reduced_matmul

    model = make(args.quick)
    parameters = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1))
    print(
        f"{name}: {parameters / 1e6:.0f}M parameters, batch {batch} x {seq} tokens, "
        f"{torch.get_num_threads()} threads; this CPU multiplies bfloat16 natively: "
        f"{native_reduced_matmul(torch.bfloat16)}"
    )
    ratio, hf_bf16 = compare(model, tokens, args.rounds, "bfloat16")
    if not args.no_float32:
        gc.collect()
        model.float()  # in place: the bfloat16 parameters are freed as it goes
        f32_ratio, hf_f32 = compare(model, tokens, args.rounds, "float32")
        print(f"  HF bfloat16 against HF float32: max |diff| {_max_diff(hf_bf16, hf_f32):.3g}")
        print(f"  {name}: bfloat16 ratio {ratio:.3f}, float32 ratio {f32_ratio:.3f} (reference)")
    del model
    gc.collect()
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 rounds: under a minute")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per side (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--only", choices=("gpt2", "llama"), default=None, help="one size only")
    parser.add_argument("--no-float32", action="store_true", help="skip the float32 reference")
    args = parser.parse_args()
    args.rounds = args.rounds or 3
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    sizes = {
        "gpt2": ("GPT-2 small" if not args.quick else "GPT-2 (quick)", gpt2_small),
        "llama": ("Llama 1B" if not args.quick else "Llama (quick)", llama_1b),
    }
    print(f"load average at start: {load()}; torch {torch.__version__}")
    ratios = {}
    for key, (name, make) in sizes.items():
        if args.only in (None, key):
            ratios[name] = run_size(name, make, args.batch, args.seq, args)
    headline = ", ".join(f"{name} {ratio:.3f}" for name, ratio in ratios.items())
    print(f"bfloat16 forward, circuit / Hugging Face (medians, target <= 1.10): {headline}; load {load()}")


if __name__ == "__main__":
    main()
