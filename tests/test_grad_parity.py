"""Gradient parity: a two-layer transformer as a circuit against the same model in plain torch.

The circuit is written the way the golden file writes a model: embedding by
``gen_index_at_0_c``, attention scores ``Einsum qc,kc,,qk->qk`` with the
causal mask plus ``(1 - mask) * -10000``, softmax, heads summed with Add,
layer norm spelled out from Einsum, Add, last_dim_size, reciprocal and
rsqrt, an MLP with gelu, unembed, log_softmax and the per-token loss by
``gen_index_at_0_batch_x_c``.  The reference uses torch's own layers
(F.layer_norm, F.softmax, F.gelu, F.cross_entropy) on the same float64
tensors.  Both losses are backpropagated; every parameter's gradient must
agree within 1e-6 (run ``pytest -s`` to see the table).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import circuits as cc

VOCAB, D_MODEL, HEADS, D_HEAD, D_MLP, SEQ, POSITIONS, LAYERS = 23, 16, 2, 8, 32, 7, 12, 2
EPS = 1e-5
GRAD_TOLERANCE = 1e-6


def make_params(generator: torch.Generator) -> dict[str, torch.Tensor]:
    def p(*shape, scale=0.3, offset=0.0):
        value = torch.randn(*shape, generator=generator, dtype=torch.float64) * scale + offset
        return value.requires_grad_()

    params = {"tok_emb": p(VOCAB, D_MODEL, scale=1.0), "pos_emb": p(POSITIONS, D_MODEL)}
    for layer in range(LAYERS):
        pre = f"layer.{layer}."
        params.update(
            {
                pre + "ln1_gamma": p(D_MODEL, scale=0.1, offset=1.0),
                pre + "ln1_beta": p(D_MODEL, scale=0.1),
                pre + "wq": p(HEADS, D_HEAD, D_MODEL),
                pre + "wk": p(HEADS, D_HEAD, D_MODEL),
                pre + "wv": p(HEADS, D_HEAD, D_MODEL),
                pre + "wo": p(HEADS, D_MODEL, D_HEAD),
                pre + "ln2_gamma": p(D_MODEL, scale=0.1, offset=1.0),
                pre + "ln2_beta": p(D_MODEL, scale=0.1),
                pre + "w1": p(D_MLP, D_MODEL),
                pre + "b1": p(D_MLP, scale=0.1),
                pre + "w2": p(D_MODEL, D_MLP),
                pre + "b2": p(D_MODEL, scale=0.1),
            }
        )
    params.update(
        {
            "final_ln_weight": p(D_MODEL, scale=0.1, offset=1.0),
            "final_ln_bias": p(D_MODEL, scale=0.1),
            "unembed": p(VOCAB, D_MODEL),
        }
    )
    return params


# ------------------------------------------------------------- the circuit


def ein(spec: str, *nodes: cc.Circuit, name: str | None = None) -> cc.Circuit:
    return cc.Einsum.from_einsum_string(spec, *nodes, name=name)


def fn(spec_name: str, *nodes: cc.Circuit, name: str | None = None) -> cc.Circuit:
    return cc.GeneralFunction.new_by_name(*nodes, spec_name=spec_name, name=name)


def layer_norm_circuit(x: cc.Circuit, weight: cc.Circuit, bias: cc.Circuit, prefix: str) -> cc.Circuit:
    """As in the golden file: mean-subtract, variance, rsqrt, scale, shift."""
    recip = fn("reciprocal", fn("last_dim_size", x, name="ln.c.hidden_size"), name="ln.c.recip_hidden_size")
    neg_mean = ein("Ah,z,A->Az", x, cc.Scalar(-1.0, shape=(1,), name="ln.neg"), recip, name="ln.neg_mean")
    mean_subbed = cc.Add(x, neg_mean, name="ln.mean_subbed")
    var = ein("ih,ih,i->i", mean_subbed, mean_subbed, recip, name="ln.var")
    var_p_eps = cc.Add(cc.Scalar(EPS, name="ln.c.eps"), var, name="ln.var_p_eps")
    y = ein("ih,i->ih", mean_subbed, fn("rsqrt", var_p_eps, name="ln.rsqrt"), name="ln.y")
    return cc.Add(bias, ein("ih,h->ih", y, weight, name="ln.y_scaled"), name=prefix + "norm")


def build_circuit(params: dict[str, torch.Tensor]) -> cc.Circuit:
    arrays = {name: cc.Array(value, name=name) for name, value in params.items()}
    toks = cc.Symbol((SEQ + 1,), name="toks")
    input_toks = cc.Index(toks, slice(None, -1), name="input_toks")
    true_toks = cc.Index(toks, slice(1, None), name="true_toks")
    mask = cc.Array(torch.tril(torch.ones(SEQ, SEQ, dtype=torch.float64)), name="t.a.c.causal_mask")
    neg_mask = ein("ab,->ab", mask, cc.Scalar(-1.0, name="neg_one"), name="not_mask.neg_mask")
    not_mask = cc.Add(cc.Scalar(1.0, name="one"), neg_mask, name="a.not_mask")
    neg_inf = cc.Scalar(-10000.0, name="a.neg_inf")
    neg_inf_bias = ein("qk,->qk", not_mask, neg_inf, name="a.score_neg_inf_bias")

    embeds = fn("gen_index_at_0_c", arrays["tok_emb"], input_toks, name="idxed_embeds")
    pos = cc.Index(arrays["pos_emb"], (slice(None, SEQ), slice(None)), name="pos_embeds_idxed")
    resid = cc.Add(embeds, pos, name="resid.0")
    for layer in range(LAYERS):
        pre = f"layer.{layer}."
        normed = layer_norm_circuit(resid, arrays[pre + "ln1_gamma"], arrays[pre + "ln1_beta"], f"a{layer}.")
        heads = []
        for h in range(HEADS):
            wq = cc.Index(arrays[pre + "wq"], h, name=f"a{layer}.w.q.head{h}")
            wk = cc.Index(arrays[pre + "wk"], h, name=f"a{layer}.w.k.head{h}")
            wv = cc.Index(arrays[pre + "wv"], h, name=f"a{layer}.w.v.head{h}")
            wo = cc.Index(arrays[pre + "wo"], h, name=f"a{layer}.w.o.head{h}")
            q = ein("qd,cd->qc", normed, wq, name="a.q")
            k = ein("kd,cd->kc", normed, wk, name="a.k")
            v = ein("kd,Vd->kV", normed, wv, name="a.v")
            summed = ein("jk->j", wk, name="a.c.bias_for_head_size")
            head_size = fn("last_dim_size", summed, name="a.c.head_size")
            scale = fn("rsqrt", head_size, name="a.c.div_head_size")
            raw = ein("qc,kc,,qk->qk", q, k, scale, mask, name="a.attn_scores_raw")
            probs = fn("softmax", cc.Add(raw, neg_inf_bias, name="a.attn_scores"), name="a.attn_probs")
            comb = ein("qk,kV->qV", probs, v, name="a.comb_v")
            heads.append(ein("sV,dV->sd", comb, wo, name=f"b{layer}.a.head{h}"))
        resid = cc.Add(resid, cc.Add(*heads, name=f"b{layer}.a"), name=f"b{layer}")
        normed2 = layer_norm_circuit(resid, arrays[pre + "ln2_gamma"], arrays[pre + "ln2_beta"], f"m{layer}.")
        hidden = ein("sd,md->sm", normed2, arrays[pre + "w1"], name=f"m{layer}.in")
        pre_act = cc.Add(hidden, arrays[pre + "b1"], name=f"m{layer}.pre")
        post = ein("sm,dm->sd", fn("gelu", pre_act, name=f"m{layer}.act"), arrays[pre + "w2"])
        resid = cc.Add(resid, cc.Add(post, arrays[pre + "b2"], name=f"m{layer}.out"), name=f"b{layer}.m")
    final = layer_norm_circuit(resid, arrays["final_ln_weight"], arrays["final_ln_bias"], "final.")
    logits = ein("sh,vh->sv", final, arrays["unembed"], name="t.call")
    log_probs = fn("log_softmax", logits, name="log_probs")
    ll = fn("gen_index_at_0_batch_x_c", log_probs, true_toks, name="ll")
    return ein("a,->a", ll, cc.Scalar(-1.0, name="nll.neg"), name="t.loss")


# ----------------------------------------------------- the same in torch


def torch_model(params: dict[str, torch.Tensor], toks: torch.Tensor) -> torch.Tensor:
    inp, target = toks[:-1], toks[1:]
    x = F.embedding(inp, params["tok_emb"]) + params["pos_emb"][:SEQ]
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    for layer in range(LAYERS):
        pre = f"layer.{layer}."
        h = F.layer_norm(x, (D_MODEL,), params[pre + "ln1_gamma"], params[pre + "ln1_beta"], eps=EPS)
        attn = torch.zeros_like(x)
        for i in range(HEADS):
            q = h @ params[pre + "wq"][i].T
            k = h @ params[pre + "wk"][i].T
            v = h @ params[pre + "wv"][i].T
            scores = (q @ k.T) / math.sqrt(D_HEAD)
            scores = torch.where(causal, scores, torch.full_like(scores, -10000.0))
            attn = attn + (F.softmax(scores, dim=-1) @ v) @ params[pre + "wo"][i].T
        x = x + attn
        h2 = F.layer_norm(x, (D_MODEL,), params[pre + "ln2_gamma"], params[pre + "ln2_beta"], eps=EPS)
        hidden = F.gelu(F.linear(h2, params[pre + "w1"], params[pre + "b1"]))
        x = x + F.linear(hidden, params[pre + "w2"], params[pre + "b2"])
    x = F.layer_norm(x, (D_MODEL,), params["final_ln_weight"], params["final_ln_bias"], eps=EPS)
    logits = x @ params["unembed"].T
    return F.cross_entropy(logits, target, reduction="none")


def test_gradients_match_plain_torch_per_parameter():
    generator = torch.Generator().manual_seed(1234)
    params = make_params(generator)
    toks = torch.randint(0, VOCAB, (SEQ + 1,), generator=generator)

    circuit = build_circuit(params)
    assert circuit.shape == (SEQ,)
    loss_circuit = circuit.evaluate(inputs={"toks": toks})
    assert loss_circuit.dtype == torch.float64
    loss_circuit.mean().backward()
    circuit_grads = {name: p.grad.clone() for name, p in params.items()}

    for p in params.values():
        p.grad = None
    loss_torch = torch_model(params, toks)
    loss_torch.mean().backward()

    loss_diff = (loss_circuit - loss_torch).abs().max().item()
    print()
    print(f"{'per-token loss':<24} max_diff={loss_diff:.3e}")
    worst = 0.0
    failures = []
    for name, p in params.items():
        assert p.grad is not None and circuit_grads[name].abs().max() > 0, f"{name} got no gradient"
        diff = (circuit_grads[name] - p.grad).abs().max().item()
        worst = max(worst, diff)
        print(f"{name:<24} max_diff={diff:.3e}")
        if not diff <= GRAD_TOLERANCE:
            failures.append((name, diff))
    print(f"Max weight diff: {worst:.3e}")
    assert loss_diff <= GRAD_TOLERANCE
    assert not failures, f"gradients differ by more than {GRAD_TOLERANCE}: {failures}"
