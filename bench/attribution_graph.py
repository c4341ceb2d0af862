"""An attribution graph of one prompt: time and peak memory against circuit-tracer's, or 10 clean forwards.

Issue 33's benchmark (item 6): a Llama of SmolLM2-135M's dimensions (30 layers, d_model 576, 9 query
heads sharing 3 key/value heads of 64, d_mlp 1536, vocabulary 49152) with random weights on a
64-token prompt (token 0 first: the special token circuit-tracer skips), CPU float32, with a random
JumpReLU transcoder per layer (``--features`` wide, reading the MLP's input and writing its
output) whose threshold is set from the clean run so that about ``--l0`` features fire per
position.  Ours: ``ex.tracing.attribution_graph`` (every active feature and logit a target,
``--batch-size`` per backward).

- ``--circuit-tracer PYTHON`` (the Python of circuit-tracer's own venv, e.g. ``/tmp/ct-venv/bin/python``;
  tests/data/circuit_tracer/README.md says how to make it): the reference is
  ``circuit_tracer.attribute`` on the same weights, transcoders and prompt.
  ``bench/circuit_tracer_side.py`` builds them there (TransformerLens 3's random initialization,
  seeded) and saves them; this side reads them (``from_transformer_lens``, ``load_sae``).  Each
  round runs circuit-tracer (a fresh process; only ``attribute`` is timed) then ours; medians of
  ``--rounds``, each side timed warm (one untimed call first).  The peaks: torch.profiler's memory events over one more run of each.  The
  adjacencies are compared when they have at most 4096 nodes.
- Without it: the model is ``build_llama``'s with ``llama_random_weights``, and the reference is 10
  clean forwards of the same circuit (``cc.evaluate`` of the logits), alternating round by round;
  the forwards' peak is one forward's.

The last line is the headline: ours / the reference, time and peak memory (target <= 1.0 against
circuit-tracer).

    python bench/attribution_graph.py --circuit-tracer /tmp/ct-venv/bin/python   # the issue's sizes: long
    python bench/attribution_graph.py --quick [--circuit-tracer ...]             # 4 layers, d_model 128: a minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchtools import gc_timed, peak_bytes

MiB = 2**20
SMOLLM2 = dict(layers=30, heads=9, kv_heads=3, d_head=64, d_model=576, d_mlp=1536, vocab=49152, seq=64)
QUICK = dict(layers=4, heads=4, kv_heads=2, d_head=32, d_model=128, d_mlp=256, vocab=2048, seq=16)
SIDE = Path(__file__).with_name("circuit_tracer_side.py")


def side(args, folder: Path, *flags: str) -> dict:
    """Run ``circuit_tracer_side.py`` with circuit-tracer's Python: its JSON line (``--make``: none)."""
    sizes = [f"--{key.replace('_', '-')}={value}" for key, value in args.sizes.items()]
    sizes += [f"--features={args.features}", f"--l0={args.l0}", f"--batch-size={args.batch_size}"]
    command = [args.circuit_tracer, str(SIDE), str(folder), *sizes, f"--threads={args.threads}", *flags]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"circuit-tracer's side failed:\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def circuit_tracer_model(args, folder: Path):
    """The circuit and transcoders circuit-tracer's side saved in ``folder``."""
    import torch
    from safetensors.torch import load_file

    import circuits.models as cm
    from circuits.models.sae import load_sae
    from circuits.transformer import names

    state = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "tl_config.json").read_text())
    prompt = load_file(str(folder / "prompt.safetensors"))["tokens"]
    circuit = cm.from_transformer_lens(state, prompt[None].to(torch.int64), cfg=config, convention="prompt")
    layers = range(args.sizes["layers"])
    tcs = [(load_sae(folder / "transcoders" / f"layer_{L}"), ("ln2", L), names.mlp_out(L)) for L in layers]
    return circuit, tcs


def own_model(args):
    """``build_llama``'s random model and transcoders calibrated as circuit-tracer's side does."""
    import torch

    import circuits.models as cm
    from circuits import experiments as ex
    from circuits.models.sae import SAE

    s = args.sizes
    config = cm.LlamaConfig(
        n_layers=s["layers"], n_heads=s["heads"], n_kv_heads=s["kv_heads"], d_head=s["d_head"],
        d_model=s["d_model"], d_mlp=s["d_mlp"], vocab_size=s["vocab"], rms_eps=1e-5,
    )  # fmt: skip
    prompt = torch.randint(1, s["vocab"], (1, s["seq"]), generator=torch.Generator().manual_seed(1))
    prompt[0, 0] = 0
    options = cm.ModelOptions(convention="prompt")
    circuit = cm.build_llama(config, cm.llama_random_weights(config, seed=0), prompt, options)
    cache = ex.run_with_cache(circuit, [("ln2", layer) for layer in range(s["layers"])])
    generator, tcs, d, width = torch.Generator().manual_seed(2), [], s["d_model"], args.features
    for layer in range(s["layers"]):
        w_enc = torch.randn(d, width, generator=generator) / d**0.5
        b_enc = torch.randn(width, generator=generator) * 0.1
        pre = cache[("ln2", layer)][0] @ w_enc + b_enc
        threshold = torch.quantile(pre.flatten()[:1_000_000], 1 - args.l0 / width).clamp(min=0)
        tcs.append(
            SAE(
                "jumprelu_transcoder", W_enc=w_enc, b_enc=b_enc,
                W_dec=torch.randn(width, d, generator=generator) / width**0.5, b_dec=torch.zeros(d),
                threshold=torch.full((width,), float(threshold)), apply_b_dec_to_input=False,
                hook_name=f"blocks.{layer}.ln2.hook_normalized", hook_name_out=f"blocks.{layer}.hook_mlp_out",
            )
        )  # fmt: skip
    return circuit, tcs


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--circuit-tracer", metavar="PYTHON", help="circuit-tracer's venv's python")
    parser.add_argument("--features", type=int, default=4608)
    parser.add_argument("--l0", type=float, default=8.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a small model: about a minute")
    args = parser.parse_args()
    args.sizes = dict(QUICK if args.quick else SMOLLM2)
    if args.quick:
        args.features = 512
    return args


def main() -> None:
    import torch

    import circuits as cc
    from circuits import experiments as ex
    from circuits.transformer import names

    args = arguments()
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="attribution_graph_bench_"))
    if args.circuit_tracer:
        side(args, folder, "--make")
        circuit, tcs = circuit_tracer_model(args, folder)
    else:
        circuit, tcs = own_model(args)
    logits = circuit.get_unique(names.LOGITS)

    def reference() -> float:
        if args.circuit_tracer:
            return side(args, folder)["seconds"]
        with torch.no_grad():
            return gc_timed(lambda: [cc.evaluate(logits) for _ in range(10)])[0]

    def ours():
        return ex.tracing.attribution_graph(circuit, tcs, batch_size=args.batch_size)

    what = "circuit-tracer" if args.circuit_tracer else "10 clean forwards"
    ours()  # warm, as circuit-tracer's side is timed: the first call's one-time costs (lazy imports) untimed
    reference_times, our_times = [], []
    for _ in range(args.rounds):
        reference_times.append(reference())
        seconds, graph = gc_timed(ours)
        our_times.append(seconds)
        print(
            f"round {len(our_times)}: {what} {reference_times[-1]:.3f} s, ours {seconds:.3f} s "
            f"({graph.n_features} features, {len(graph.logit_tokens)} logits, "
            f"{graph.adjacency_matrix.shape[0]} nodes; load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    if args.circuit_tracer:
        reference_peak = side(args, folder, "--peak")["peak_bytes"]
    else:
        reference_peak = peak_bytes(lambda: torch.no_grad()(cc.evaluate)(logits))
    our_peak = peak_bytes(ours)
    if (folder / "adjacency.safetensors").exists():
        from safetensors.torch import load_file

        theirs = load_file(str(folder / "adjacency.safetensors"))["adjacency_matrix"]
        difference = (graph.adjacency_matrix - theirs).abs().max()
        print(f"adjacency: largest difference from circuit-tracer's {float(difference):.3g}")
    reference, attribution = statistics.median(reference_times), statistics.median(our_times)
    print(f"{what}: median {reference:.3f} s of {[round(t, 3) for t in reference_times]}")
    print(f"attribution graph: median {attribution:.3f} s of {[round(t, 3) for t in our_times]}")
    print(f"peak allocated: {what} {reference_peak / MiB:.1f} MiB, ours {our_peak / MiB:.1f} MiB")
    print(
        f"attribution graph / {what}: time {attribution / reference:.2f}, "
        f"peak memory {our_peak / max(reference_peak, 1):.2f}"
    )


if __name__ == "__main__":
    main()
