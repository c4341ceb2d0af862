"""An attribution graph of one prompt: its time and peak memory against 10 clean forwards, in the same run.

Issue 33's benchmark (item 6): a Llama of SmolLM2-135M's dimensions (30 layers, d_model 576, 9 query
heads sharing 3 key/value heads of 64, d_mlp 1536, vocabulary 49152, tied embeddings; random
weights, seed 0) on a 64-token prompt, CPU float32, with a random JumpReLU transcoder per layer
(``--features`` wide, reading the MLP's input and writing its output) whose thresholds are set from
the clean run so that about ``--l0`` features fire per position.  ``ex.tracing.attribution_graph``
(circuit-tracer's method: every active feature and logit a target, ``--batch-size`` per backward)
against 10 clean forwards of the same circuit (``cc.evaluate`` of the logits, no gradients),
timed alternately round by round, medians of ``--rounds``; the peak of torch's allocations in each
(torch.profiler's memory events, a separate run: one forward's peak for the forwards).

circuit-tracer itself is the issue's first reference; it is not installed in this environment (it
pins TransformerLens 2 and needs its own), so the fallback the issue names is measured here.

The last line is the headline: attribution graph / 10 clean forwards, time (and peak memory).

    python bench/attribution_graph.py            # the issue's sizes (long: tens of thousands of targets)
    python bench/attribution_graph.py --quick    # 4 layers, d_model 128, 16 tokens: under a minute
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchtools import gc_timed

MiB = 2**20
SMOLLM2 = dict(n_layers=30, n_heads=9, n_kv_heads=3, d_model=576, d_mlp=1536, vocab_size=49152)
QUICK = dict(n_layers=4, n_heads=4, n_kv_heads=2, d_model=128, d_mlp=256, vocab_size=2048)


def model(args):
    import torch

    import circuits.models as cm

    sizes = QUICK if args.quick else SMOLLM2
    config = cm.LlamaConfig(**sizes, tie_word_embeddings=True, rms_eps=1e-5)
    prompt = torch.randint(
        0, sizes["vocab_size"], (1, args.seq + 1), generator=torch.Generator().manual_seed(1)
    )
    return cm.build_llama(config, cm.llama_random_weights(config, seed=0), prompt), config


def transcoders(circuit, config, args):
    """One random JumpReLU transcoder per layer; each layer's threshold the ``1 - l0/features``
    quantile of its pre-activations on the clean run (so about ``l0`` fire per position)."""
    import torch

    from circuits import experiments as ex
    from circuits.models.sae import SAE

    d, width = config.d_model, args.features
    points = [("ln2", layer) for layer in range(config.n_layers)]
    cache = ex.run_with_cache(circuit, points)
    generator = torch.Generator().manual_seed(2)
    made = []
    for layer in range(config.n_layers):
        w_enc = torch.randn(d, width, generator=generator) / d**0.5
        b_enc = torch.randn(width, generator=generator) * 0.1
        pre = cache[("ln2", layer)][0] @ w_enc + b_enc
        threshold = torch.quantile(pre.flatten()[:1_000_000], 1 - args.l0 / width).clamp(min=0)
        made.append(
            SAE(
                "jumprelu_transcoder",
                W_enc=w_enc,
                b_enc=b_enc,
                W_dec=torch.randn(width, d, generator=generator) / width**0.5,
                b_dec=torch.zeros(d),
                threshold=torch.full((width,), float(threshold)),
                apply_b_dec_to_input=False,
                hook_name=f"blocks.{layer}.ln2.hook_normalized",
                hook_name_out=f"blocks.{layer}.hook_mlp_out",
            )
        )
    return made


def peak_bytes(run) -> int:
    """The most bytes torch allocated at once during ``run()`` (torch.profiler's memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def main() -> None:
    import torch

    import circuits as cc
    from circuits import experiments as ex
    from circuits.transformer import names

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--features", type=int, default=4608)
    parser.add_argument("--l0", type=float, default=8.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a small model: under a minute")
    args = parser.parse_args()
    if args.quick:
        args.seq, args.features, args.rounds = 16, 512, 2
    torch.set_num_threads(args.threads)
    circuit, config = model(args)
    tcs = transcoders(circuit, config, args)
    logits = circuit.get_unique(names.LOGITS)

    def forwards():
        with torch.no_grad():
            for _ in range(10):
                cc.evaluate(logits)

    def graph():
        return ex.tracing.attribution_graph(circuit, tcs, batch_size=args.batch_size)

    forward_times, graph_times = [], []
    for _ in range(args.rounds):
        forward_times.append(gc_timed(forwards)[0])
        seconds, result = gc_timed(graph)
        graph_times.append(seconds)
        print(
            f"round {len(graph_times)}: 10 forwards {forward_times[-1]:.3f} s, graph {seconds:.3f} s "
            f"({result.n_features} features, {len(result.logit_tokens)} logits, "
            f"{result.adjacency_matrix.shape[0]} nodes; load {os.getloadavg()[0]:.2f})"
        )
    forward_peak = peak_bytes(lambda: torch.no_grad()(cc.evaluate)(logits))
    graph_peak = peak_bytes(graph)
    forward, attribution = statistics.median(forward_times), statistics.median(graph_times)
    print(f"10 clean forwards: median {forward:.3f} s of {[round(t, 3) for t in forward_times]}")
    print(f"attribution graph: median {attribution:.3f} s of {[round(t, 3) for t in graph_times]}")
    print(f"peak allocated: forward {forward_peak / MiB:.1f} MiB, graph {graph_peak / MiB:.1f} MiB")
    print(
        f"attribution graph / 10 clean forwards: time {attribution / forward:.2f}, "
        f"peak memory {graph_peak / max(forward_peak, 1):.2f}"
    )


if __name__ == "__main__":
    main()
