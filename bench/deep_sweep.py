"""A deep model on short prompts: the head sweep and the ``resid_pre`` grid against hooked Hugging Face forwards.

Issue 31's benchmark (item 3): a random ``LlamaForCausalLM`` of SmolLM2-135M's dimensions (30
layers, d_model 576, 9 query heads on 3 key/value heads of 64, d_mlp 1536, vocab 49152, tied
embeddings, rms_eps 1e-5, rope_theta 100000; no download), 4 prompts x 14 tokens, CPU float32,
2 threads.  Every parameter gets seeded noise, so the norms and every head matter.

- Head sweep, metric = mean loss.  Hugging Face (TransformerLens's way): one forward per head with
  a forward pre-hook on that layer's ``o_proj`` zeroing the head's 64 input columns, loss by
  ``cross_entropy`` of every position's logits.  circuits: ``models.from_hf`` of the same model,
  then one ``ex.sweep(circuit, ex.head_names(circuit), ex.zero_ablate, ex.mean_loss)`` (the clean
  run included).
- ``resid_pre`` grid, metric = logit difference at the last position.  Hugging Face
  (TransformerLens's ``get_act_patch_resid_pre``): one clean forward caching every layer's input,
  then one forward per (layer, position) on the corrupted tokens with a pre-hook on that decoder
  layer putting the clean residual at that position.  circuits: ``ex.patching_grids.act_patch_resid_pre``.

Each round runs the three in the same process, alternating which side goes first; the figures are
medians over rounds of wall time, each printed with the load average (other processes share the
cores), and of process CPU time (which other load disturbs less; with ``--threads 1`` it is the
wall time a run would take alone).  Both
sides' values must agree within ``--tolerance``.  One plain forward of each (circuit evaluation,
Hugging Face ``model(...)``) is timed too, for scale.  The last line is the headline: the larger of
the two ratios circuits / Hugging Face (target <= 0.5 for both).

    python bench/deep_sweep.py            # the issue's sizes (several minutes)
    python bench/deep_sweep.py --quick    # 6 layers, vocab 8192, one round: under a minute
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from benchtools import patching_inputs

import circuits as cc
from circuits import experiments as ex
from circuits import models

TARGET = 0.5


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def hf_model(args):
    """A random ``LlamaForCausalLM`` of the size flags, every parameter perturbed (seeded), eval mode."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(
        num_hidden_layers=args.layers,
        hidden_size=args.d_model,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.d_head,
        intermediate_size=args.d_mlp,
        vocab_size=args.vocab,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def timed(action):
    """``((wall seconds, process CPU seconds), result)``: CPU time is what other load on the machine
    disturbs least (on one thread it is the wall time the run would take alone)."""
    start, cpu = time.perf_counter(), time.process_time()
    result = action()
    return (time.perf_counter() - start, time.process_time() - cpu), result


def hf_sweep(model, tokens, args) -> dict[str, float]:
    """Mean loss with head ``h`` of layer ``L`` zeroed at ``o_proj``'s input, one forward per head."""
    inputs_, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    results = {}
    for layer in range(args.layers):
        o_proj = model.model.layers[layer].self_attn.o_proj
        for head in range(args.heads):
            columns = slice(head * args.d_head, (head + 1) * args.d_head)

            def zero_head(module, positional, columns=columns):
                x = positional[0].clone()
                x[..., columns] = 0.0
                return (x,)

            handle = o_proj.register_forward_pre_hook(zero_head)
            try:
                logits = model(inputs_).logits
            finally:
                handle.remove()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
            results[f"b{layer}.a.head{head}"] = float(loss)
    return results


def hf_grid(model, clean, corrupted, good, bad, args) -> torch.Tensor:
    """``[layer, pos]`` logit differences with the clean residual patched in at each layer's input."""
    layers = model.model.layers
    cache = {}

    def keeper(layer):
        def keep(module, positional):
            cache[layer] = positional[0].clone()

        return keep

    handles = [layer.register_forward_pre_hook(keeper(i)) for i, layer in enumerate(layers)]
    try:
        model(clean[:, :-1])
    finally:
        for handle in handles:
            handle.remove()
    rows = torch.arange(args.batch)
    grid = torch.zeros(args.layers, args.seq)
    for layer in range(args.layers):
        for position in range(args.seq):

            def patch(module, positional, layer=layer, position=position):
                x = positional[0].clone()
                x[:, position] = cache[layer][:, position]
                return (x, *positional[1:])

            handle = layers[layer].register_forward_pre_hook(patch)
            try:
                last = model(corrupted[:, :-1]).logits[:, -1]
            finally:
                handle.remove()
            grid[layer, position] = (last[rows, good] - last[rows, bad]).mean()
    return grid


def arguments():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=576)
    parser.add_argument("--d-mlp", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=14, help="positions the model reads (tokens are seq + 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians count")
    parser.add_argument("--skip-grid", action="store_true", help="time the head sweep only")
    parser.add_argument("--skip-sweep", action="store_true", help="time the resid_pre grid only")
    parser.add_argument("--quick", action="store_true", help="6 layers, vocab 8192, one round")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.layers, args.vocab, args.rounds = 6, 8192, 1
    return args


class Rounds:
    """The wall and CPU times of each labelled run over the rounds, printed as they come with the load."""

    def __init__(self):
        self.times: dict[str, list[tuple[float, float]]] = {}

    def run(self, round_: int, label: str, action):
        (seconds, cpu), result = timed(action)
        self.times.setdefault(label, []).append((seconds, cpu))
        print(f"round {round_ + 1}: {label} {seconds:.2f} s (cpu {cpu:.2f} s); {load()}", flush=True)
        return result

    def median(self, label: str, which: int = 0) -> float:
        """The median wall (``which`` 0) or CPU (1) time."""
        return statistics.median(times[which] for times in self.times[label])


def check(label: str, worst: float, tolerance: float) -> None:
    print(f"  largest |circuits - Hugging Face| over the {label}: {worst:.2e}")
    if worst > tolerance:
        raise SystemExit(f"the {label}s disagree: {worst:.3e} > tolerance {tolerance:g}")


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    model = hf_model(args)
    clean, corrupted, good, bad = patching_inputs(args)
    (build_seconds, _), circuit = timed(lambda: models.from_hf(model, clean))
    names = ex.head_names(circuit)
    metric = ex.metrics.logit_diff(-1, good, bad)
    print(
        f"Llama {args.layers} layers x {args.heads} heads ({args.kv_heads} kv) of {args.d_head}, d_model "
        f"{args.d_model}, d_mlp {args.d_mlp}, vocab {args.vocab}; {args.batch} x {args.seq} tokens; float32, "
        f"{args.threads} threads; {len(names)} heads, {args.layers * args.seq} grid cells; "
        f"{len(cc.unique_nodes(circuit))} nodes (built in {build_seconds:.2f} s); {load()}",
        flush=True,
    )
    rounds = Rounds()
    sides = {
        "circuits": {
            "forward": lambda: cc.evaluate(circuit),
            "sweep": lambda: ex.sweep(circuit, names, ex.zero_ablate, ex.mean_loss, progress=False),
            "grid": lambda: (
                ex.patching_grids.act_patch_resid_pre(circuit, {"toks_int_var": corrupted}, metric).values
            ),
        },
        "Hugging Face": {
            "forward": lambda: model(clean[:, :-1]).logits,
            "sweep": lambda: hf_sweep(model, clean, args),
            "grid": lambda: hf_grid(model, clean, corrupted, good, bad, args),
        },
    }
    kinds = ["forward"] + ([] if args.skip_sweep else ["sweep"]) + ([] if args.skip_grid else ["grid"])
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
        with torch.no_grad():
            for kind in kinds:
                found = {side: rounds.run(round_, f"{side} {kind}", sides[side][kind]) for side in order}
                if kind == "sweep":
                    ours, theirs = found["circuits"], found["Hugging Face"]
                    check("head sweep", max(abs(ours[n] - theirs[n]) for n in names), args.tolerance)
                elif kind == "grid":
                    worst = (found["circuits"] - found["Hugging Face"]).abs().max().item()
                    check("resid_pre grid", worst, args.tolerance)

    print(f"medians of {args.rounds} round(s); {load()}")
    ratios = {}
    for kind in kinds:
        ours, theirs = rounds.median(f"circuits {kind}"), rounds.median(f"Hugging Face {kind}")
        cpu = rounds.median(f"circuits {kind}", 1) / rounds.median(f"Hugging Face {kind}", 1)
        ratios[kind] = ours / theirs
        count = {"forward": 1, "sweep": len(names), "grid": args.layers * args.seq}[kind]
        print(
            f"{kind}: circuits {ours:.2f} s, Hugging Face {theirs:.2f} s ({count} forward(s): "
            f"{theirs / count * 1000:.0f} ms each); ratio {ours / theirs:.3f} (cpu-time ratio {cpu:.3f})"
        )
    measured = {kind: ratio for kind, ratio in ratios.items() if kind != "forward"}
    if not measured:
        return
    shown = ", ".join(f"{kind} {ratio:.3f}" for kind, ratio in measured.items())
    verdict = "meets" if max(measured.values()) <= TARGET else "misses"
    print(f"headline: circuits / Hugging Face (wall): {shown} ({verdict} the target <= {TARGET}); {load()}")


if __name__ == "__main__":
    main()
