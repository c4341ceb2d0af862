"""A brute-force ACDC written directly in torch on a Hugging Face GPT-2, independent of ``circuits``.

``forward`` recomputes the whole model with every receiver (each head's query, key and value
input, each MLP's input, the logits) reading its own sum of the senders written before it; an
edge in ``removed`` contributes the sender's ``ablated`` value instead of its own.  ``acdc`` is
Conmy et al.'s greedy loop spelled out: receivers from the logits down, senders from the latest,
every edge tried by a whole new forward; a component that no kept edge reads has its inputs
removed untested.
"""

from __future__ import annotations

import math

import torch


class Run:
    def __init__(self):
        self.senders: dict[str, torch.Tensor] = {}
        self.readable: dict[str, list[str]] = {}  #: receiver -> the senders written before it (in order)
        self.logits = None


def _attend(q, k, v):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def forward(hf, tokens, removed=frozenset(), ablated=None) -> Run:
    run, bias = Run(), 0.0
    t, cfg = hf.transformer, hf.config
    d, n_heads = cfg.n_embd, cfg.n_head
    dh = d // n_heads

    def read(receiver: str) -> torch.Tensor:
        run.readable[receiver] = list(run.senders)
        total = bias
        for sender, value in run.senders.items():
            total = total + (ablated[sender] if f"{sender}->{receiver}" in removed else value)
        return total

    run.senders["embeds"] = t.wte(tokens) + t.wpe(torch.arange(tokens.shape[-1]))
    for layer, block in enumerate(t.h):
        w, b, wo = block.attn.c_attn.weight, block.attn.c_attn.bias, block.attn.c_proj.weight
        heads = {}
        for h in range(n_heads):
            parts = []
            for i, role in enumerate("qkv"):
                cols = slice(i * d + h * dh, i * d + (h + 1) * dh)
                parts.append(block.ln_1(read(f"b{layer}.a.head{h}.{role}")) @ w[:, cols] + b[cols])
            heads[f"b{layer}.a.head{h}"] = _attend(*parts) @ wo[h * dh : (h + 1) * dh]
        run.senders.update(heads)
        bias = bias + block.attn.c_proj.bias
        run.senders[f"b{layer}.m"] = block.mlp(block.ln_2(read(f"b{layer}.m")))
    run.logits = hf.lm_head(t.ln_f(read("t.call")))
    return run


def ablated_values(hf, clean, corrupted, ablation: str) -> dict[str, torch.Tensor]:
    """Each sender's ablated value: its corrupted output, that output's mean over the batch, or 0."""
    senders = forward(hf, corrupted).senders
    if ablation == "resample":
        return senders
    if ablation == "mean":
        return {name: value.mean(0).expand_as(value) for name, value in senders.items()}
    return {name: torch.zeros_like(value) for name, value in senders.items()}


def kl(full_logits, logits, position=None) -> torch.Tensor:
    """Mean over the batch (and the positions, or at ``position``) of KL(full || circuit)."""
    if position is not None:
        full_logits, logits = full_logits[:, position], logits[:, position]
    p_log = full_logits.log_softmax(-1)
    return (p_log.exp() * (p_log - logits.log_softmax(-1))).sum(-1).mean()


def _component(receiver: str):
    if receiver == "t.call":
        return None
    head, _, role = receiver.rpartition(".")
    return head if role in ("q", "k", "v") else receiver


def acdc(hf, clean, ablated, metric, threshold, absolute=False):
    """The kept edges and the steps ``[(edge, delta or None)]`` in visit order; ``metric(logits)``."""
    with torch.no_grad():
        full = forward(hf, clean, frozenset(), ablated)
        removed, current = set(), float(metric(full.logits))
        kept_out = {sender: 0 for sender in full.senders}
        steps = []
        for receiver in reversed(list(full.readable)):
            senders = full.readable[receiver]
            component = _component(receiver)
            if component is not None and kept_out[component] == 0:
                removed |= {f"{s}->{receiver}" for s in senders}
                steps += [(f"{s}->{receiver}", None) for s in reversed(senders)]
                continue
            for sender in reversed(senders):
                edge = f"{sender}->{receiver}"
                value = float(metric(forward(hf, clean, removed | {edge}, ablated).logits))
                delta = value - current
                if (abs(delta) if absolute else delta) < threshold:
                    removed.add(edge)
                    current = value
                else:
                    kept_out[sender] += 1
                steps.append((edge, delta))
        every = [f"{s}->{r}" for r, senders in full.readable.items() for s in senders]
        return [e for e in every if e not in removed], steps, current
