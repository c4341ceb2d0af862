"""A small attention-only transformer written directly in torch, for the experiment tests.

It is the model ``circuits.models.build_attn_only`` builds, batched, with
the causal mask: every head's output is computed on its own, so a test can
read a head's output, replace it (ablation, patching), or feed one head's
value projection from another residual stream (path patching).
"""

from __future__ import annotations

import torch

from circuits import models
from circuits.passes import causal_mask, split_heads

CONFIG = models.AttnOnlyConfig(n_layers=2, n_heads=3, d_model=8, d_head=4, vocab_size=11, n_ctx=12)
SEQ = 6  # predicted positions; token rows are SEQ + 1 long


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    return models.attn_only_random_weights(CONFIG, seed=seed, dtype=torch.float64)


def tokens(seed: int, batch: int | None = 2) -> torch.Tensor:
    shape = (SEQ + 1,) if batch is None else (batch, SEQ + 1)
    return torch.randint(0, CONFIG.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def split_circuit(w, toks):
    """The circuit as the experiments use it: built, causally masked, heads split."""
    return split_heads(causal_mask(models.build_attn_only(CONFIG, w, toks)))


def layer_norm(x, scale, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * scale + bias


def forward(w, toks, override=None, value_resid=None, resid_pre=None, targets=None):
    """Per-token loss ``[B, S]``, logits ``[B, S, V]`` and every head's output ``{(L, h): [B, S, d]}``.

    ``override[(L, h)]`` replaces that head's output (broadcast to ``[B, S, d]``);
    ``resid_pre[L]`` replaces the residual stream entering layer ``L``; ``targets`` (``[B, S]``)
    are the next tokens the loss scores (default: ``toks[:, 1:]``).
    ``value_resid[(L, h)]`` is a function of the residual stream entering
    layer ``L`` and the heads' outputs so far, giving the stream that head's
    *value* input is computed from (queries and keys keep the real one).
    """
    override = override or {}
    value_resid = value_resid or {}
    resid_pre = resid_pre or {}
    inputs, targets = toks[:, :-1], toks[:, 1:] if targets is None else targets
    seq = inputs.shape[1]
    resid = w["t.w.tok_embeds"][inputs]
    pos = w["t.w.pos_embeds"][:seq]
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    heads = {}
    for layer in range(CONFIG.n_layers):
        resid = resid_pre.get(layer, resid)
        scale, bias = w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"]
        norm = layer_norm(resid, scale, bias)
        q = torch.einsum("bqd,hcd->bhqc", norm + pos, w[f"a{layer}.w.q"])
        k = torch.einsum("bkd,hcd->bhkc", norm + pos, w[f"a{layer}.w.k"])
        v = torch.einsum("bkd,hcd->bhkc", norm, w[f"a{layer}.w.v"])
        for head in range(CONFIG.n_heads):
            if (layer, head) in value_resid:
                other = layer_norm(value_resid[(layer, head)](resid, heads), scale, bias)
                v[:, head] = torch.einsum("bkd,cd->bkc", other, w[f"a{layer}.w.v"][head])
        scores = (q @ k.transpose(-1, -2)) / CONFIG.d_head**0.5
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        outs = torch.einsum("bhqc,hdc->bhqd", probs @ v, w[f"a{layer}.w.o"])
        total = torch.zeros_like(resid)
        for head in range(CONFIG.n_heads):
            out = outs[:, head]
            if (layer, head) in override:
                out = override[(layer, head)].expand_as(out)
            heads[(layer, head)] = out
            total = total + out
        resid = resid + total
    final = layer_norm(resid, w["final.ln.w.scale"], w["final.ln.w.bias"])
    logits = final @ w["t.w.unembed"].T
    log_probs = torch.log_softmax(logits, dim=-1)
    loss = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return loss, logits, heads


def resid_pres(w, toks) -> dict[int, torch.Tensor]:
    """The residual stream entering each layer, ``{L: [B, S, D]}`` (layer 0's is the token embeddings)."""
    _, _, heads = forward(w, toks)
    resid = w["t.w.tok_embeds"][toks[:, :-1]]
    found = {}
    for layer in range(CONFIG.n_layers):
        found[layer] = resid
        total = torch.zeros_like(resid)
        for head in range(CONFIG.n_heads):  # summed as forward sums them
            total = total + heads[(layer, head)]
        resid = resid + total
    return found


def attn_only_transformer_lens_state(config: models.AttnOnlyConfig, w: dict) -> dict:
    """Our weights in TransformerLens's HookedTransformer layout (attn-only, shortformer)."""
    state = {
        "embed.W_E": w["t.w.tok_embeds"],
        "pos_embed.W_pos": w["t.w.pos_embeds"],
        "ln_final.w": w["final.ln.w.scale"],
        "ln_final.b": w["final.ln.w.bias"],
        "unembed.W_U": w["t.w.unembed"].T,
        "unembed.b_U": torch.zeros(config.vocab_size),
    }
    for layer in range(config.n_layers):
        p = f"blocks.{layer}."
        state[p + "ln1.w"] = w[f"a{layer}.ln.w.scale"]
        state[p + "ln1.b"] = w[f"a{layer}.ln.w.bias"]
        for which in "qkv":
            state[p + f"attn.W_{which.upper()}"] = w[f"a{layer}.w.{which}"].transpose(1, 2)
            state[p + f"attn.b_{which.upper()}"] = torch.zeros(config.n_heads, config.d_head)
        state[p + "attn.W_O"] = w[f"a{layer}.w.o"].transpose(1, 2)
        state[p + "attn.b_O"] = torch.zeros(config.d_model)
        state[p + "attn.mask"] = torch.ones(config.n_ctx, config.n_ctx, dtype=torch.bool).tril()
        state[p + "attn.IGNORE"] = torch.tensor(-1e5)
    return state
