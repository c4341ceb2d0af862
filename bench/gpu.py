"""On a GPU in bfloat16: the headline comparisons, each against its reference in the same run.

Issue 31 item 5.  Every figure is a median over ``--rounds`` alternated rounds (which side goes
first alternates), with ``torch.cuda.synchronize()`` around each timed run, and the peak
``torch.cuda.max_memory_allocated`` of each side above what was allocated when it started
(``reset_peak_memory_stats`` before each run; the weights are held throughout and left out):

1. forward: a random Llama of Llama 3.2 1B's shape (16 layers, d_model 2048, 32 query heads on 8
   key/value heads of 64, d_mlp 8192, vocabulary 128256, tied embeddings; bench/memory_peak.py's),
   built on the device in bfloat16; ``cc.evaluate`` of ``models.from_hf``'s logits (the circuit's
   Arrays are the model's own tensors) against the model's own forward (``model(ids).logits``),
   8 x 128 tokens;
2. head sweep: TransformerLens's natively booted GPT-2 small (``benchtools.tl_gpt2_model``) in
   bfloat16, 8 x 128 tokens, every head zeroed in turn, metric = mean loss:
   ``ex.sweep(..., device=)`` of ``models.from_transformer_lens``'s circuit against one
   ``run_with_hooks`` per head zeroing ``hook_z`` (bench/ablation_sweep.py's ``tl_sweep``);
3. ``resid_pre`` patching grid: the same model, 4 x 24 tokens (bench/patching_grid.py's sizes),
   metric = logit difference at the last position: ``act_patch_resid_pre(..., device=)`` against
   TransformerLens's ``patching.get_act_patch_resid_pre``;
4. attribution patching of ``resid_pre`` and ``z`` (every layer, head and position), a Hugging Face
   GPT-2 small in bfloat16, 8 x 128 tokens: ``ex.attribution_patching(..., device=)`` of
   ``models.from_hf``'s circuit against a hooked Hugging Face forward and backward on the
   corrupted tokens (activation gradients only) plus a hooked clean forward.

Each comparison also prints how far the two sides' values are apart (bfloat16: rounding, not
equality; tests/test_gpu.py checks float32 against the CPU exactly).  The last line is the
headline: the four time ratios circuits / reference and the peaks.  ``--out FILE`` appends each
figure to FILE as a JSON line as soon as it is measured, so a run cut short keeps what it had.

    python bench/gpu.py                          # CUDA, the sizes above (about 2-3 minutes on an H100)
    python bench/gpu.py --out gpu.jsonl          # the same, each figure saved as it comes
    python bench/gpu.py --device cpu --quick     # tiny models on the CPU: checks the script (< 1 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from types import SimpleNamespace

import torch
from ablation_sweep import tl_sweep
from benchtools import hf_gpt2_model, patching_inputs, tl_gpt2_model

import circuits as cc
from circuits import experiments as ex
from circuits import models

MiB = 2**20


class Bench:
    """Timed runs on one device: synchronized wall time and the peak memory above the start."""

    def __init__(self, args):
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.rounds = args.rounds
        self.warmup = args.warmup
        self.out = args.out
        self.headline: dict[str, dict] = {}

    def run(self, action):
        """``(seconds, peak bytes above the start or None off CUDA, result)`` of one run."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            start_bytes = torch.cuda.memory_allocated(self.device)
        start = time.perf_counter()
        result = action()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(self.device) - start_bytes if self.cuda else None
        return seconds, peak, result

    def compare(self, kind: str, ours, theirs, agreement) -> float:
        """Alternated rounds of ``ours`` and ``theirs`` (each a function of nothing); prints and
        saves the medians, the ratio and ``agreement(our result, their result)`` (a line of text)."""
        times: dict[str, list] = {"circuits": [], "reference": []}
        peaks: dict[str, list] = {"circuits": [], "reference": []}
        sides = [("circuits", ours), ("reference", theirs)]
        for _ in range(self.warmup):  # kernels chosen, caches made: not timed
            for _, action in sides:
                action()
        for round_ in range(self.rounds):
            results = {}
            for side, action in sides if round_ % 2 == 0 else sides[::-1]:
                seconds, peak, results[side] = self.run(action)
                times[side].append(seconds)
                peaks[side].append(peak)
                print(f"  round {round_ + 1}: {side} {seconds:.3f} s{_mib(peak)}", flush=True)
        agrees = agreement(results["circuits"], results["reference"])
        ours_s, theirs_s = statistics.median(times["circuits"]), statistics.median(times["reference"])
        ours_peak, theirs_peak = max_or_none(peaks["circuits"]), max_or_none(peaks["reference"])
        ratio = ours_s / theirs_s
        print(
            f"{kind}: circuits {ours_s:.3f} s{_mib(ours_peak)}, reference {theirs_s:.3f} s"
            f"{_mib(theirs_peak)}; ratio {ratio:.3f}; {agrees}",
            flush=True,
        )
        figure = dict(
            kind=kind,
            device=str(self.device),
            circuits_s=ours_s,
            reference_s=theirs_s,
            ratio=ratio,
            circuits_peak_bytes=ours_peak,
            reference_peak_bytes=theirs_peak,
            agreement=agrees,
            rounds=self.rounds,
        )
        self.headline[kind] = figure
        self.save(figure)
        return ratio

    def save(self, figure: dict) -> None:
        if self.out:
            with open(self.out, "a") as file:
                file.write(json.dumps(figure) + "\n")


def max_or_none(values: list):
    return None if values[0] is None else max(values)


def _mib(peak) -> str:
    return "" if peak is None else f" (peak +{peak / MiB:.0f} MiB)"


def relative_rms(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.double().cpu(), theirs.double().cpu()
    return ((ours - theirs).square().mean().sqrt() / theirs.square().mean().sqrt().clamp_min(1e-30)).item()


# ------------------------------------------------------------------ 1. forward


def llama(args):
    """A random Llama of Llama 3.2 1B's shape (``--quick``: 2 layers of d_model 256, vocab 8192),
    made on the device and cast to the dtype."""
    import transformers

    transformers.logging.set_verbosity_error()
    size = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32)
    if args.quick:
        size = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4)
    config = transformers.LlamaConfig(
        **size,
        num_key_value_heads=size["num_attention_heads"] // 4,
        head_dim=64,
        vocab_size=8192 if args.quick else 128256,
        tie_word_embeddings=True,
        use_cache=False,
    )
    torch.manual_seed(0)
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(config)
    return model.to(args.dtype).eval()


def forward(bench: Bench, args) -> None:
    model = llama(args)
    batch, seq = (2, 16) if args.quick else (8, 128)
    tokens = torch.randint(0, 1000, (batch, seq + 1), generator=torch.Generator().manual_seed(1))
    logits = models.from_hf(model, tokens).get_unique("t.call")
    ids = tokens[:, :-1].to(bench.device)
    layers = model.config.num_hidden_layers
    print(
        f"1. forward: Llama of {layers} layers, d_model {model.config.hidden_size}, {batch} x {seq}",
        flush=True,
    )
    with torch.no_grad():
        bench.compare(
            "forward",
            lambda: cc.evaluate(logits, device=bench.device),
            lambda: model(ids).logits,
            lambda ours, theirs: f"relative rms difference of the logits {relative_rms(ours, theirs):.2e}",
        )


# ------------------------------------------------------------------ 2, 3. sweep and grid


def gpt2_size(args, batch: int, seq: int) -> SimpleNamespace:
    """GPT-2 small's flags for benchtools (``--quick``: 2 layers of 4 heads, d_model 128, vocab 1000)."""
    if args.quick:
        return SimpleNamespace(layers=2, heads=4, d_model=128, vocab=1000, batch=2, seq=8, seed=0)
    return SimpleNamespace(layers=12, heads=12, d_model=768, vocab=50257, batch=batch, seq=seq, seed=0)


def tl_model(args, size):
    return tl_gpt2_model(size).to(args.device).to(args.dtype)


def head_sweep(bench: Bench, args) -> None:
    size = gpt2_size(args, 8, 128)
    model = tl_model(args, size)
    tokens = torch.randint(
        0, size.vocab, (size.batch, size.seq + 1), generator=torch.Generator().manual_seed(1)
    )
    circuit = models.from_transformer_lens(model, tokens, family="gpt2")
    names = ex.head_names(circuit)
    every_head = [(layer, head) for layer in range(size.layers) for head in range(size.heads)]
    on_device = tokens.to(bench.device)
    print(f"2. head sweep: GPT-2 {size.layers} x {size.heads} heads, {size.batch} x {size.seq}", flush=True)

    def agreement(ours, theirs) -> str:
        worst = max(abs(ours[name] - theirs[name]) for name in names)
        return (
            f"largest |loss difference| over {len(names)} heads {worst:.2e} (clean loss {ours.baseline:.3f})"
        )

    with torch.no_grad():
        bench.compare(
            "head sweep",
            lambda: ex.sweep(circuit, names, progress=False, device=bench.device),
            lambda: tl_sweep(model, on_device, every_head),
            agreement,
        )


def patching_grid(bench: Bench, args) -> None:
    from transformer_lens import patching

    patching.tqdm = lambda iterable, *_, **__: iterable  # its progress bar, not the grid, would print
    size = gpt2_size(args, 4, 24)
    model = tl_model(args, size)
    clean, corrupted, good, bad = patching_inputs(size)
    circuit = models.from_transformer_lens(model, clean, family="gpt2")
    metric = ex.logit_diff(-1, good, bad)
    clean_d, corrupted_d, good_d, bad_d = (t.to(bench.device) for t in (clean, corrupted, good, bad))

    def tl_metric(logits):
        last = logits[:, -1]
        return (last.gather(-1, good_d[:, None]) - last.gather(-1, bad_d[:, None])).mean()

    def theirs():
        _, cache = model.run_with_cache(clean_d[:, :-1])
        return patching.get_act_patch_resid_pre(model, corrupted_d[:, :-1], cache, tl_metric)

    print(f"3. resid_pre grid: GPT-2 {size.layers} layers, {size.batch} x {size.seq}", flush=True)
    with torch.no_grad():
        bench.compare(
            "resid_pre grid",
            lambda: (
                ex.patching_grids.act_patch_resid_pre(
                    circuit, {"toks_int_var": corrupted}, metric, device=bench.device
                ).values
            ),
            theirs,
            lambda ours, theirs: (
                f"largest |difference| {(ours.double() - theirs.double().cpu()).abs().max().item():.2e} "
                f"over {ours.numel()} cells (values up to {ours.double().abs().max().item():.2f})"
            ),
        )


# ------------------------------------------------------------------ 4. attribution patching


class HookedGPT2:
    """A Hugging Face GPT-2 with hooks keeping each block's input (``resid_pre``) and each attention
    output projection's input (``z``, the heads side by side), for TransformerLens-style attribution
    patching: the weights need no gradient, the embedding's output is made to need one."""

    def __init__(self, model):
        self.model = model.requires_grad_(False)
        self.kept: dict[tuple[str, int], torch.Tensor] = {}
        self.handles = [model.transformer.wte.register_forward_hook(self._tracked)]
        for layer, block in enumerate(model.transformer.h):
            self.handles.append(block.register_forward_pre_hook(self._keeper("resid_pre", layer)))
            self.handles.append(block.attn.c_proj.register_forward_pre_hook(self._keeper("z", layer)))

    @staticmethod
    def _tracked(module, inputs, output):
        return output.detach().requires_grad_(torch.is_grad_enabled())

    def _keeper(self, kind: str, layer: int):
        def keep(module, positional):
            self.kept[kind, layer] = positional[0]

        return keep

    def metric(self, ids, good, bad) -> torch.Tensor:
        last = self.model(ids).logits[:, -1].float()
        rows = torch.arange(len(ids), device=ids.device)
        return (last[rows, good] - last[rows, bad]).mean()

    def attribution(self, clean, corrupted, good, bad, heads: int) -> dict[str, torch.Tensor]:
        """``{"resid_pre": [layer, pos], "z": [layer, head, pos]}``: (clean - corrupted) . gradient at
        the corrupted run, summed over the batch and the feature axis."""
        metric = self.metric(corrupted, good, bad)
        keys = sorted(self.kept)
        grads = dict(zip(keys, torch.autograd.grad(metric, [self.kept[key] for key in keys])))
        corrupted_values = {key: self.kept[key].detach() for key in keys}
        with torch.no_grad():
            self.metric(clean, good, bad)
        product = {key: grads[key] * (self.kept[key] - corrupted_values[key]) for key in keys}
        layers = 1 + max(layer for _, layer in keys)
        resid = torch.stack([product["resid_pre", layer].sum((0, 2)) for layer in range(layers)])
        z = torch.stack(
            [
                product["z", layer].unflatten(-1, (heads, -1)).sum((0, 3)).transpose(0, 1)
                for layer in range(layers)
            ]
        )
        return {"resid_pre": resid, "z": z}


def attribution(bench: Bench, args) -> None:
    size = gpt2_size(args, 8, 128)
    model = hf_gpt2_model(size).to(args.device).to(args.dtype)
    clean, corrupted, good, bad = patching_inputs(size)
    circuit = models.from_hf(model, clean)
    metric = ex.logit_diff(-1, good, bad, push_down=False)
    hooked = HookedGPT2(model)
    on_device = [t.to(bench.device) for t in (clean[:, :-1], corrupted[:, :-1], good, bad)]
    print(
        f"4. attribution patching: GPT-2 {size.layers} x {size.heads} heads, {size.batch} x {size.seq}",
        flush=True,
    )

    def agreement(ours, theirs) -> str:
        return ", ".join(
            f"{kind} relative rms difference {relative_rms(ours[kind], theirs[kind]):.2e}" for kind in theirs
        )

    bench.compare(
        "attribution patching",
        lambda: ex.attribution_patching(
            circuit, {"toks_int_var": corrupted}, metric, ["resid_pre", "z"], device=bench.device
        ),
        lambda: hooked.attribution(*on_device, heads=size.heads),
        agreement,
    )


# ------------------------------------------------------------------ main


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to check the script")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds; medians count")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each side first")
    parser.add_argument("--quick", action="store_true", help="tiny models, one round, no warm-up")
    parser.add_argument("--out", help="append each figure to this file as a JSON line as it is measured")
    parser.add_argument(
        "--only", nargs="*", choices=["forward", "sweep", "grid", "attribution"], help="run only these"
    )
    args = parser.parse_args()
    args.dtype = getattr(torch, args.dtype)
    if args.quick:
        args.rounds, args.warmup = 1, 0
    return args


def main() -> None:
    args = arguments()
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(
            "bench/gpu.py: no CUDA here (torch.cuda.is_available() is False); this benchmark is for a GPU. "
            "Run it with --device cpu (--quick) to check the script itself.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    bench = Bench(args)
    started = time.perf_counter()
    where = torch.cuda.get_device_name(bench.device) if bench.cuda else "CPU"
    dtype = str(args.dtype).removeprefix("torch.")
    bench.save(
        dict(kind="start", device=str(bench.device), name=where, argv=sys.argv[1:], torch=torch.__version__)
    )
    print(
        f"device {bench.device} ({where}), {dtype}, {args.rounds} round(s) after {args.warmup} warm-up; "
        f"torch {torch.__version__}",
        flush=True,
    )
    parts = {"forward": forward, "sweep": head_sweep, "grid": patching_grid, "attribution": attribution}
    for name, part in parts.items():
        if not args.only or name in args.only:
            part(bench, args)
            if bench.cuda:
                torch.cuda.empty_cache()  # the part's models and caches are gone: give their memory back
    print(f"all parts in {time.perf_counter() - started:.0f} s", flush=True)
    shown = ", ".join(_headline(kind, figure) for kind, figure in bench.headline.items())
    print(f"headline: circuits / reference on {bench.device} ({where}) in {dtype}, median wall time: {shown}")


def _headline(kind: str, figure: dict) -> str:
    ours, theirs = figure["circuits_peak_bytes"], figure["reference_peak_bytes"]
    peaks = "" if ours is None else f" (peak +{ours / MiB:.0f} vs +{theirs / MiB:.0f} MiB)"
    return f"{kind} {figure['ratio']:.3f}{peaks}"


if __name__ == "__main__":
    main()
