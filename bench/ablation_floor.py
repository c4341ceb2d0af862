"""The fastest exact head sweep we could write by hand, against TransformerLens.

Issue 7 asks that ``sweep`` zero-ablate each of GPT-2 small's 144 heads in
at most 0.5 of the time TransformerLens takes (``bench/ablation_sweep.py``).
This script measures how low any evaluator of that sweep can go on this
machine in exact float32: a *perfect* cached sweep written directly in
torch, with every fusion torch offers and no circuit at all.

- Perfect cache: the clean run's residual stream before each layer and each
  layer's per-head attention output ``z`` are computed once, untimed.  Per
  head ``(L, h)`` only what that head changes is computed: layer L's output
  projection with ``z[:, :, h]`` zeroed, layer L's MLP, layers L+1.., the
  unembedding and the loss.
- Hand-fused ops: ``layer_norm``, one ``linear`` for Q, K and V with their
  biases, ``scaled_dot_product_attention``, ``addmm`` for biases and the
  residual, ``gelu(approximate="tanh")``, ``cross_entropy`` for the loss.
- ``--compile`` runs the layer and the top through ``torch.compile``
  (inductor, C++ kernels), one compiled graph for every layer (the weights
  are arguments); compilation happens before the timing.
- ``--bf16-matmul`` lets oneDNN run the sweep's float32 matmuls in
  bfloat16 (``torch.backends.mkldnn.matmul.fp32_precision``; AMX on CPUs
  that have it): not exact, so the losses' difference from
  TransformerLens is reported rather than held to ``--tolerance``.

TransformerLens runs ``run_with_hooks`` on the same weights and heads, in
the same process, as in ``bench/ablation_sweep.py``; the two sets of losses
must agree within ``--tolerance``.  ``--heads-per-layer k`` times heads 0..k-1
of every layer only (a quick run; per-head costs depend on the layer, not the
head, so the ratio stays comparable).  The last line is the headline: this
floor / TransformerLens.

    python bench/ablation_floor.py                        # the issue's sizes, all 144 heads (~5 min)
    python bench/ablation_floor.py --heads-per-layer 2    # a sample of 24 heads (~1 min)
    python bench/ablation_floor.py --compile --heads-per-layer 2
    python bench/ablation_floor.py --bf16-matmul --heads-per-layer 2
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from ablation_sweep import TARGET, retain_freed_memory, timed, tl_sweep
from benchtools import add_gpt2_size_arguments, tl_gpt2_model


def fused_weights(model) -> tuple[list[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]:
    """Per layer, the weights laid out for ``linear``; and the final norm and unembedding."""
    state = {key: value.detach() for key, value in model.tl_parameters().items()}
    blocks = []
    for layer in range(model.cfg.n_layers):
        p = f"blocks.{layer}."
        qkv = torch.cat([state[p + f"attn.W_{x}"] for x in "QKV"], dim=0)  # (3h, d, c)
        w_qkv = qkv.permute(0, 2, 1).reshape(-1, qkv.shape[1]).contiguous()  # (3hc, d)
        b_qkv = torch.cat([state[p + f"attn.b_{x}"].reshape(-1) for x in "QKV"])
        w_o = state[p + "attn.W_O"]  # (h, c, d)
        blocks.append(
            (
                state[p + "ln1.w"], state[p + "ln1.b"], w_qkv, b_qkv,
                w_o.reshape(-1, w_o.shape[-1]).t().contiguous(), state[p + "attn.b_O"],
                state[p + "ln2.w"], state[p + "ln2.b"],
                state[p + "mlp.W_in"].t().contiguous(), state[p + "mlp.b_in"],
                state[p + "mlp.W_out"].t().contiguous(), state[p + "mlp.b_out"],
            )
        )  # fmt: skip
    top = (
        state["ln_final.w"],
        state["ln_final.b"],
        state["unembed.W_U"].t().contiguous(),
        state["unembed.b_U"],
    )
    return blocks, top


def attention_z(x, ln_w, ln_b, w_qkv, b_qkv, heads: int, eps: float) -> torch.Tensor:
    """Each head's attention output before the output projection, ``(batch, seq, heads, d_head)``."""
    batch, seq, d_model = x.shape
    qkv = F.linear(F.layer_norm(x, (d_model,), ln_w, ln_b, eps), w_qkv, b_qkv)
    q, k, v = qkv.view(batch, seq, 3, heads, -1).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def mlp_out(x, z, w_o, b_o, ln_w, ln_b, w_in, b_in, w_out, b_out, eps: float) -> torch.Tensor:
    """The residual after a layer, from its input ``x`` and its heads' outputs ``z``."""
    batch, seq, d_model = x.shape
    mid = torch.addmm(x.reshape(-1, d_model), z.reshape(batch * seq, -1), w_o.t()).add_(b_o)
    hidden = F.gelu(F.linear(F.layer_norm(mid, (d_model,), ln_w, ln_b, eps), w_in, b_in), approximate="tanh")
    return torch.addmm(mid, hidden, w_out.t()).add_(b_out).view(batch, seq, d_model)


def block(x, weights, heads: int, eps: float) -> torch.Tensor:
    ln1_w, ln1_b, w_qkv, b_qkv, *rest = weights
    return mlp_out(x, attention_z(x, ln1_w, ln1_b, w_qkv, b_qkv, heads, eps), *rest, eps)


def top_loss(x, ln_w, ln_b, w_u, b_u, targets, eps: float) -> torch.Tensor:
    d_model = x.shape[-1]
    normed = F.layer_norm(x, (d_model,), ln_w, ln_b, eps).reshape(-1, d_model)
    return F.cross_entropy(torch.addmm(b_u, normed, w_u.t()), targets.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_gpt2_size_arguments(parser, rounds=1)
    parser.add_argument("--heads-per-layer", type=int, default=None, help="time heads 0..k-1 of each layer")
    parser.add_argument("--compile", action="store_true", help="torch.compile the layer and the top")
    parser.add_argument(
        "--bf16-matmul",
        action="store_true",
        help="float32 matmuls in bfloat16 (inexact) for the hand-fused sweep",
    )
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    retain_freed_memory()
    model = tl_gpt2_model(args)
    eps = model.cfg.eps
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(args.seed + 1)
    )
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    blocks, top = fused_weights(model)
    sample = args.heads if args.heads_per_layer is None else args.heads_per_layer
    pairs = [(layer, head) for layer in range(args.layers) for head in range(sample)]
    run_block, run_top = block, top_loss
    if args.compile:
        run_block = torch.compile(block, dynamic=False)
        run_top = torch.compile(top_loss, dynamic=False)

    with torch.no_grad():
        # the perfect cache, untimed: every layer's input and heads' outputs in the clean run
        x = model.embed(inputs) + model.pos_embed.W_pos[: inputs.shape[-1]]  # the first positions' rows
        clean_inputs, clean_z = [], []
        for weights in blocks:
            clean_inputs.append(x)
            clean_z.append(attention_z(x, *weights[:4], args.heads, eps).contiguous())
            x = mlp_out(x, clean_z[-1], *weights[4:], eps)
        (compile_time, _), _ = timed(
            lambda: (run_block(x, blocks[0], args.heads, eps), run_top(x, *top, targets, eps))
        )

    def floor_sweep() -> dict[str, float]:
        previous = torch.backends.mkldnn.matmul.fp32_precision  # process-global: restored after
        if args.bf16_matmul:
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        try:
            return exact_sweep_body()
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = previous

    def exact_sweep_body() -> dict[str, float]:
        results = {}
        for layer, head in pairs:
            z = clean_z[layer].clone()
            z[:, :, head] = 0.0
            x = mlp_out(clean_inputs[layer], z, *blocks[layer][4:], eps)
            for weights in blocks[layer + 1 :]:
                x = run_block(x, weights, args.heads, eps)
            results[f"b{layer}.a.head{head}"] = float(run_top(x, *top, targets, eps))
        return results

    print(
        f"GPT-2 {args.layers} layers x {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}, "
        f"batch {args.batch} x {args.seq}, float32, {args.threads} threads; {len(pairs)} heads timed"
        + (f"; torch.compile warm-up {compile_time:.1f} s (not timed below)" if args.compile else "")
    )
    floor_times, tl_times = [], []
    for round_ in range(args.rounds):
        with torch.no_grad():
            (floor_time, _), ours = timed(floor_sweep)
            (tl_time, _), theirs = timed(lambda: tl_sweep(model, tokens, pairs))
        floor_times.append(floor_time)
        tl_times.append(tl_time)
        worst = max(abs(ours[name] - theirs[name]) for name in ours)
        print(
            f"round {round_ + 1}: hand-fused perfect sweep {floor_time:.2f} s, TransformerLens {tl_time:.2f} s; "
            f"largest |difference| over {len(ours)} losses {worst:.2e}"
        )
        if worst > args.tolerance and not args.bf16_matmul:
            raise SystemExit(f"the sweeps disagree: {worst:.3e} > tolerance {args.tolerance:g}")
    ratio = statistics.median(floor_times) / statistics.median(tl_times)
    print(
        f"headline: hand-fused perfect sweep{' (bf16 matmuls)' if args.bf16_matmul else ''} / TransformerLens "
        f"= {ratio:.3f} "
        f"(issue 7's target for circuits <= {TARGET})"
    )


if __name__ == "__main__":
    main()
