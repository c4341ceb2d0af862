"""A plain-torch reference of the edge rewrite and of EAP / EAP-IG, written on Hugging Face GPT-2 and
Llama models directly (their weights, and their own modules where those compute in the model's
dtype), independent of ``circuits``: every receiver reads its own sum of the senders written
before it, and a sender or the embeddings can be given fixed values.

``forward`` returns the logits, the senders' outputs and every receiver's input (tensors of one
autograd graph); ``eap``, ``eap_ig_inputs`` and ``eap_ig_activations`` compute the scores
``{edge name: score}`` by the definitions of docs/discovery.md.
"""

from __future__ import annotations

import math

import torch


class Run:
    def __init__(self):
        self.senders: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, torch.Tensor] = {}
        self.readable: dict[str, list[str]] = {}  #: receiver -> the senders written before it
        self.bias = 0.0
        self.logits = None

    def read(self, receiver: str, drop: set) -> torch.Tensor:
        """The receiver's input: the senders so far (less the dropped edges), plus the biases."""
        self.readable[receiver] = list(self.senders)
        terms = [v for s, v in self.senders.items() if f"{s}->{receiver}" not in drop]
        zero = 0 * next(iter(self.senders.values()))
        total = sum(terms, zero) + self.bias
        self.inputs.setdefault(receiver, total)
        return self.inputs[receiver]


def _attend(q, k, v):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_()


def _sender(run: Run, name: str, value: torch.Tensor, fixed: dict) -> None:
    run.senders[name] = _leaf(fixed[name]) if name in fixed else value


def gpt2_forward(hf, tokens, *, embeds=None, fixed=None, drop=()) -> Run:
    fixed, drop, run = fixed or {}, set(drop), Run()
    t, cfg = hf.transformer, hf.config
    d, n_heads = cfg.n_embd, cfg.n_head
    dh = d // n_heads
    emb = t.wte(tokens) + t.wpe(torch.arange(tokens.shape[-1])) if embeds is None else embeds
    _sender(run, "embeds", _leaf(emb), fixed)
    for layer, block in enumerate(t.h):
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias
        wo = block.attn.c_proj.weight
        heads = {}
        for h in range(n_heads):
            parts = []
            for i, role in enumerate("qkv"):
                cols = slice(i * d + h * dh, i * d + (h + 1) * dh)
                x = block.ln_1(run.read(f"b{layer}.a.head{h}.{role}", drop))
                parts.append(x @ w[:, cols] + b[cols])
            heads[f"b{layer}.a.head{h}"] = _attend(*parts) @ wo[h * dh : (h + 1) * dh]
        for name, value in heads.items():
            _sender(run, name, value, fixed)
        run.bias = run.bias + block.attn.c_proj.bias
        _sender(run, f"b{layer}.m", block.mlp(block.ln_2(run.read(f"b{layer}.m", drop))), fixed)
    run.logits = hf.lm_head(t.ln_f(run.read("t.call", drop)))
    return run


def _rms(x, weight, eps):
    """RMSNorm in the input's dtype (Hugging Face's computes in float32 even in a float64 model)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def llama_forward(hf, tokens, *, embeds=None, fixed=None, drop=()) -> Run:
    fixed, drop, run = fixed or {}, set(drop), Run()
    m, cfg = hf.model, hf.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    dh, eps = cfg.hidden_size // n_heads, cfg.rms_norm_eps
    emb = m.embed_tokens(tokens) if embeds is None else embeds
    _sender(run, "idxed_embeds", _leaf(emb), fixed)
    positions = torch.arange(tokens.shape[-1])[None]
    cos, sin = m.rotary_emb(emb, positions)  # the tables Hugging Face uses (float32, cast)
    for layer, block in enumerate(m.layers):
        attn, norm = block.self_attn, block.input_layernorm.weight
        kv_label = "head" if n_kv == n_heads else "kv"
        heads = {}
        for h in range(n_heads):
            g = h // (n_heads // n_kv)
            q_in = _rms(run.read(f"b{layer}.a.head{h}.q", drop), norm, eps)
            k_in = _rms(run.read(f"b{layer}.a.{kv_label}{g}.k", drop), norm, eps)
            v_in = _rms(run.read(f"b{layer}.a.{kv_label}{g}.v", drop), norm, eps)
            q = _rotate(q_in @ attn.q_proj.weight[h * dh : (h + 1) * dh].T, cos, sin)
            k = _rotate(k_in @ attn.k_proj.weight[g * dh : (g + 1) * dh].T, cos, sin)
            v = v_in @ attn.v_proj.weight[g * dh : (g + 1) * dh].T
            heads[f"b{layer}.a.head{h}"] = _attend(q, k, v) @ attn.o_proj.weight[:, h * dh : (h + 1) * dh].T
        for name, value in heads.items():
            _sender(run, name, value, fixed)
        mlp_in = _rms(run.read(f"b{layer}.m", drop), block.post_attention_layernorm.weight, eps)
        _sender(run, f"b{layer}.m", block.mlp(mlp_in), fixed)
    run.logits = hf.lm_head(_rms(run.read("t.call", drop), m.norm.weight, eps))
    return run


def _grads(run: Run, metric) -> dict[str, torch.Tensor]:
    names = list(run.inputs)
    found = torch.autograd.grad(metric(run.logits), [run.inputs[n] for n in names], allow_unused=True)
    return {n: torch.zeros_like(run.inputs[n]) if g is None else g for n, g in zip(names, found)}


def _edge_scores(clean: Run, corrupted: Run, grads_of) -> dict[str, float]:
    scores = {}
    for receiver, senders in clean.readable.items():
        for sender in senders:
            diff = corrupted.senders[sender] - clean.senders[sender]
            scores[f"{sender}->{receiver}"] = float((diff.detach() * grads_of(sender, receiver)).sum())
    return scores


def eap(forward, hf, clean_tokens, corrupted_tokens, metric) -> dict[str, float]:
    clean, corrupted = forward(hf, clean_tokens), forward(hf, corrupted_tokens)
    grads = _grads(clean, metric)
    return _edge_scores(clean, corrupted, lambda s, r: grads[r])


def eap_ig_inputs(forward, hf, clean_tokens, corrupted_tokens, metric, steps) -> dict[str, float]:
    clean, corrupted = forward(hf, clean_tokens), forward(hf, corrupted_tokens)
    first = next(iter(clean.senders))
    a, b = corrupted.senders[first].detach(), clean.senders[first].detach()
    total = None
    for k in range(steps):
        grads = _grads(forward(hf, clean_tokens, embeds=a + k / steps * (b - a)), metric)
        total = grads if total is None else {n: total[n] + grads[n] for n in grads}
    return _edge_scores(clean, corrupted, lambda s, r: total[r] / steps)


def _unit(sender: str) -> str:
    return sender.rpartition(".head")[0] if ".head" in sender else sender


def eap_ig_activations(forward, hf, clean_tokens, corrupted_tokens, metric, steps) -> dict[str, float]:
    clean, corrupted = forward(hf, clean_tokens), forward(hf, corrupted_tokens)
    units: dict[str, list[str]] = {}
    for sender in clean.senders:
        units.setdefault(_unit(sender), []).append(sender)
    mean = {}
    for unit, members in units.items():
        total = None
        for k in range(1, steps + 1):
            alpha = k / steps
            fixed = {
                s: alpha * clean.senders[s].detach() + (1 - alpha) * corrupted.senders[s].detach()
                for s in members
            }
            grads = _grads(forward(hf, clean_tokens, fixed=fixed), metric)
            total = grads if total is None else {n: total[n] + grads[n] for n in grads}
        mean[unit] = {n: g / steps for n, g in total.items()}
    return _edge_scores(clean, corrupted, lambda s, r: mean[_unit(s)][r])
