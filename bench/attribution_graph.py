"""An attribution graph of one prompt: time and peak memory against circuit-tracer's, or 10 clean forwards.

Issue 33's benchmark (item 6): a Llama of SmolLM2-135M's dimensions (30 layers, d_model 576, 9 query
heads sharing 3 key/value heads of 64, d_mlp 1536, vocabulary 49152) with random weights on a
64-token prompt (token 0 first: the special token circuit-tracer skips), CPU float32, with a random
JumpReLU transcoder per layer (``--features`` wide, reading the MLP's input and writing its
output) whose threshold is set from the clean run so that ``--l0`` features fire per position on
average (``benchtools.threshold_between``: halfway between two pre-activations, so none lies
within rounding of it and both sides find the same features).  Ours:
``ex.tracing.attribution_graph`` (every active feature and logit a target, ``--batch-size`` per
backward).

- ``--circuit-tracer PYTHON`` (the Python of circuit-tracer's own venv, e.g. ``/tmp/ct-venv/bin/python``;
  tests/data/circuit_tracer/README.md says how to make it): the reference is
  ``circuit_tracer.attribute`` on the same weights, transcoders and prompt.
  ``bench/circuit_tracer_side.py`` builds them there (TransformerLens 3's random initialization,
  seeded) and saves them; our side reads them (``from_transformer_lens``, ``load_sae``).  When
  the graphs have at most 4096 nodes, both sides save them and ``bench/attribution_compare.py``
  compares them: the feature sets (a feature on one side only, against its threshold and the
  sides' float32 rounding), the activations, the transcoders' inputs per layer and the adjacency.
- Without it: the model is ``build_llama``'s with ``llama_random_weights``, and the reference is 10
  clean forwards of the same circuit (``cc.evaluate`` of the logits).

Each round runs the reference then ours, each side in a fresh process of its own (this script
with ``--child``, or circuit-tracer's side) that builds its model, calls once warm (lazy imports
and other one-time costs unmeasured), then measures a second call: its seconds, and its peak as
the kernel sees it (``benchtools.resident_peak``: the resident high-water mark ``VmHWM``, reset
just before the call, less the resident set just before; so the call's own peak increment,
whatever allocated it, and nothing is recorded during the call, so it costs nothing at any size).
This is the headline peak.  ``--allocations`` (on with ``--quick``) adds torch's own peak
allocations, by torch.profiler's memory events over a third call: at the issue's sizes the
profiler's record grows to gigabytes (circuit-tracer's passed 23 GB), so it is off there.  A
watchdog kills a side whose resident set passes ``--rss-limit-gb`` (18): its peak is then
reported as more than the limit less its resident set before the call.  Medians of ``--rounds``.

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

from benchtools import peak_bytes, print_json, resident_peak, run_watched, threshold_between

MiB = 2**20
SMOLLM2 = dict(layers=30, heads=9, kv_heads=3, d_head=64, d_model=576, d_mlp=1536, vocab=49152, seq=64)
QUICK = dict(layers=4, heads=4, kv_heads=2, d_head=32, d_model=128, d_mlp=256, vocab=2048, seq=16)
SIDE = Path(__file__).with_name("circuit_tracer_side.py")
SAVE_LIMIT = 4096  # the most nodes whose adjacencies are saved and compared


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
        threshold = threshold_between(pre, max(1, round(args.l0 * pre.shape[0])))
        tcs.append(
            SAE(
                "jumprelu_transcoder", W_enc=w_enc, b_enc=b_enc,
                W_dec=torch.randn(width, d, generator=generator) / width**0.5, b_dec=torch.zeros(d),
                threshold=torch.full((width,), threshold), apply_b_dec_to_input=False,
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
    parser.add_argument(
        "--allocations",
        action="store_true",
        help="also torch's peak allocations by its profiler (with --quick: on)",
    )
    parser.add_argument(
        "--rss-limit-gb", type=float, default=18.0, help="the watchdog: a side's resident limit"
    )
    parser.add_argument("--child", choices=("ours", "forwards"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = dict(QUICK if args.quick else SMOLLM2)
    if args.quick:
        args.features = 512
        args.allocations = True
    return args


def child(args) -> None:
    """One side in this (fresh) process: build, call once warm, then measure a second call
    (``resident_peak``; ``--allocations``: a third under torch's profiler); print it as JSON."""
    import torch

    import circuits as cc
    from circuits import experiments as ex
    from circuits.transformer import names

    torch.set_num_threads(args.threads)
    circuit, tcs = circuit_tracer_model(args, args.folder) if args.circuit_tracer else own_model(args)
    logits = circuit.get_unique(names.LOGITS)

    @torch.no_grad()
    def forwards():
        return [cc.evaluate(logits) for _ in range(10)]

    def ours():
        return ex.tracing.attribution_graph(circuit, tcs, batch_size=args.batch_size)

    action = ours if args.child == "ours" else forwards
    action()  # warm, as circuit-tracer's side is: the first call's one-time costs (lazy imports) unmeasured
    result, graph = resident_peak(action, on_start=lambda rss: print_json({"rss_before": rss}))
    if args.allocations:
        result["allocated_bytes"] = peak_bytes(action)
    if args.child == "ours":
        result |= dict(features=graph.n_features, logits=len(graph.logit_tokens))
        result["nodes"] = nodes = graph.adjacency_matrix.shape[0]
        if args.circuit_tracer and nodes <= SAVE_LIMIT:
            save_graph(args, circuit, graph)
    print_json(result)


def save_graph(args, circuit, graph) -> None:
    """Our adjacency, and for ``attribution_compare`` the active features, their activations, the
    logits and the transcoders' inputs (each layer's ``ln2`` output, ``[layers, pos, d_model]``)."""
    import torch
    from safetensors.torch import save_file

    from circuits import experiments as ex

    points = [("ln2", layer) for layer in range(args.sizes["layers"])]
    cache = ex.run_with_cache(circuit, points)
    saved = dict(adjacency_matrix=graph.adjacency_matrix, active_features=graph.active_features)
    saved |= dict(activation_values=graph.activation_values, logit_tokens=graph.logit_tokens)
    saved["inputs"] = torch.stack([cache[point][0] for point in points])
    save_file({k: v.detach().contiguous() for k, v in saved.items()}, str(args.folder / "ours.safetensors"))


def launch(args, command: list[str], what: str) -> dict:
    """Run one side's process under the watchdog: its JSON record (``killed_rss`` if killed)."""
    done = run_watched(command, rss_limit=int(args.rss_limit_gb * 2**30))
    record = done.records()
    if done.killed_rss is not None:
        return record | dict(killed_rss=done.killed_rss)
    if done.returncode != 0 or "seconds" not in record:
        sys.exit(f"{what}'s side failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return record


def peak_text(record: dict) -> str:
    """A side's peak for the report: MiB, or a lower bound when the watchdog killed it."""
    if "killed_rss" in record and "rss_before" not in record:
        return f"not measured (killed at {record['killed_rss'] / 2**30:.1f} GB resident while building)"
    if "killed_rss" in record:
        bound = record["killed_rss"] - record.get("rss_before", 0)
        return f"> {bound / MiB:.0f} MiB (killed at {record['killed_rss'] / 2**30:.1f} GB resident)"
    return f"{record['peak_bytes'] / MiB:.1f} MiB"


def compare_with_circuit_tracer(folder: Path) -> None:
    """``attribution_compare``'s report on the two graphs, when both were saved (at most
    ``SAVE_LIMIT`` nodes): the feature sets (any feature on one side only against its threshold and
    the sides' rounding), the shared features' activations, the transcoders' inputs per layer, and
    the adjacency over the nodes both graphs have."""
    from attribution_compare import compare

    lines = compare(folder)
    print("\n".join(lines) if lines else f"graphs not compared: over {SAVE_LIMIT} nodes, not saved")


def median_peak(records: list[dict]) -> tuple[float, str]:
    """The median peak (bytes) of the finished runs, or the largest lower bound a killed run gave,
    and ``""`` or ``">"`` to say which."""
    finished = [r["peak_bytes"] for r in records if "killed_rss" not in r]
    if finished:
        return statistics.median(finished), ""
    bounds = [r["killed_rss"] - r["rss_before"] for r in records if "rss_before" in r]
    return (max(bounds), ">") if bounds else (0, "?")


def summary(what: str, theirs: list[dict], ours: list[dict]) -> None:
    """Each side's median time and peaks (torch's allocations too where measured), then the headline."""
    medians = {}
    for name, records in ((what, theirs), ("attribution graph", ours)):
        times = [r["seconds"] for r in records if "killed_rss" not in r]
        if times:
            medians[name] = statistics.median(times)
            print(f"{name}: median {medians[name]:.3f} s of {[round(t, 3) for t in times]}")
        print(f"{name}: peak resident increment {'; '.join(peak_text(r) for r in records)}")
        allocated = [f"{r['allocated_bytes'] / MiB:.1f}" for r in records if "allocated_bytes" in r]
        if allocated:
            print(f"{name}: peak torch allocations (profiler) {', '.join(allocated)} MiB")
    (reference, reference_bound), (attribution, our_bound) = median_peak(theirs), median_peak(ours)
    time_ratio = (
        f"{medians['attribution graph'] / medians[what]:.2f}"
        if len(medians) == 2
        else "not measured (a run was killed)"
    )
    peak_ratio = f"{attribution / max(reference, 1):.2f}"
    if reference_bound or our_bound:
        bound = {(">", ""): "<", ("", ">"): ">"}.get((reference_bound, our_bound), "not measured:")
        peak_ratio = f"{bound} {peak_ratio}"
    print(f"attribution graph / {what}: time {time_ratio}, peak memory {peak_ratio}")


def main() -> None:
    args = arguments()
    if args.child:
        child(args)
        return
    folder = Path(tempfile.mkdtemp(prefix="attribution_graph_bench_"))
    sizes = [f"--{key.replace('_', '-')}={value}" for key, value in args.sizes.items()]
    sizes += [f"--features={args.features}", f"--l0={args.l0}", f"--batch-size={args.batch_size}"]
    sizes += [f"--threads={args.threads}", f"--save-limit={SAVE_LIMIT}"]
    side = [args.circuit_tracer, str(SIDE), str(folder), *sizes] + ["--allocations"] * args.allocations
    if args.circuit_tracer and subprocess.run([*side, "--make"], capture_output=True, check=False).returncode:
        sys.exit(f"circuit-tracer's side failed to build the model: run {' '.join(side)} --make")
    mine = [sys.executable, __file__, *sys.argv[1:], "--folder", str(folder), "--child"]
    what = "circuit-tracer" if args.circuit_tracer else "10 clean forwards"
    reference = side if args.circuit_tracer else [*mine, "forwards"]
    theirs, ours = [], []
    for round_ in range(1, args.rounds + 1):
        theirs.append(launch(args, reference, what))
        ours.append(launch(args, [*mine, "ours"], "our"))
        print(
            f"round {round_}: {what} {theirs[-1].get('seconds', float('nan')):.3f} s, {peak_text(theirs[-1])}; "
            f"ours {ours[-1].get('seconds', float('nan')):.3f} s, {peak_text(ours[-1])} "
            f"(features: ours {ours[-1].get('features')}, {what}'s {theirs[-1].get('features', '-')}; "
            f"{ours[-1].get('logits')} logits, {ours[-1].get('nodes')} nodes; "
            f"load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
        if "killed_rss" in theirs[-1] or "killed_rss" in ours[-1]:
            break  # another round would be killed again
    if args.circuit_tracer:
        compare_with_circuit_tracer(folder)
    summary(what, theirs, ours)


if __name__ == "__main__":
    main()
