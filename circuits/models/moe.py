"""Mixture-of-experts MLPs (Mixtral): a router, top-k routing, and one named node per expert.

Layer ``L``'s MLP ``'b{L}.m'`` is the Add of its experts' outputs ``'b{L}.m.expert{e}'``
(``names.expert``), each a SwiGLU MLP's output ``'m.expert_out'`` times the expert's routing
weight ``'m.expert_weight'``, a column of ``'b{L}.m.routing'``.  The routing is
``top_k_K_normalized`` (``circuits.core.functions``: ``torch.topk``'s own choice of experts, ties
included, the chosen weights divided by their sum, zero elsewhere) of ``'b{L}.m.router_probs'``,
the softmax of the router logits ``'b{L}.m.router'``, exactly the order in which Hugging Face's
``MixtralTopKRouter`` computes them.  In a bfloat16 or float16 model, as there, the softmax, the top-k
and the weighting are in float32 (the logits upcast as ``'b{L}.m.router_float32'``), and each expert's
weighted output ``'b{L}.m.expert{e}_float32'`` is rounded to the model's dtype as ``'b{L}.m.expert{e}'``.

Evaluated dense: every expert runs on every token, and a token's weight for an expert it is not
routed to is zero, so the sum is the sparse model's (``x * 0`` adds nothing; a non-finite expert
output on a token not routed to it would show, where the sparse model never computes it).  The
price: the MLP costs ``n_experts / experts_per_token`` times the sparse model's (4x for Mixtral
8x7B).  In return, ablating expert ``e`` of layer ``L`` is one ``update`` of ``'b{L}.m.expert{e}'``
(``ex.zero_ablate(c, 'b1.m.expert2')``), and every expert's activations exist at every position.
"""

from __future__ import annotations

from collections.abc import Mapping

from circuits.core.nodes import Add, Circuit
from circuits.models.common import einsum, fn, last_axis_index, reduced_precision, type_as, upcast
from circuits.transformer import names

#: An expert's three weights, as ``names.mlp_weight(layer, expert_part(e, which))``.
EXPERT_PARTS = ("gate", "up", "down")


def expert_part(expert: int, which: str) -> str:
    """``'expert5_gate'``: the weight part of expert 5's ``which`` (one of ``EXPERT_PARTS``) projection."""
    return f"expert{expert}_{which}"


def moe_weight_shapes(layer: int, n_experts: int, d_model: int, d_mlp: int) -> dict[str, tuple[int, ...]]:
    """Layer ``layer``'s router ``'m{L}.w.router'`` ``[experts, d_model]`` and each expert's
    ``'m{L}.w.expert{e}_gate'``/``_up`` ``[d_mlp, d_model]`` and ``_down`` ``[d_model, d_mlp]``."""
    shapes = {names.mlp_weight(layer, "router"): (n_experts, d_model)}
    for e in range(n_experts):
        shapes[names.mlp_weight(layer, expert_part(e, "gate"))] = (d_mlp, d_model)
        shapes[names.mlp_weight(layer, expert_part(e, "up"))] = (d_mlp, d_model)
        shapes[names.mlp_weight(layer, expert_part(e, "down"))] = (d_model, d_mlp)
    return shapes


def moe_mlp(w: Mapping[str, Circuit], norm: Circuit, layer: int, n_experts: int, top_k: int, act: str) -> Add:
    """``'b{L}.m'``: the experts' outputs, each weighted by its routing weight, summed (see the module)."""
    router = w[names.mlp_weight(layer, "router")]
    reduced = reduced_precision(router)
    logits = einsum("sd,ed->se", norm, router, name=names.router(layer))
    if reduced:
        logits = upcast(logits, names.float32_value(names.router(layer)))
    probs = fn("softmax", logits, name=names.router(layer, "router_probs"))
    routing = fn(f"top_k_{top_k}_normalized", probs, name=names.router(layer, "routing"))
    experts = []
    for e in range(n_experts):
        out = _gated_mlp(w, norm, layer, e, act)
        weight = last_axis_index(routing, e, name=names.EXPERT_WEIGHT)
        name = names.expert(layer, e)
        if not reduced:
            experts.append(einsum("sd,s->sd", out, weight, name=name))
        else:
            experts.append(
                type_as(einsum("sd,s->sd", out, weight, name=names.float32_value(name)), out, name)
            )
    return Add(*experts, name=names.mlp_out(layer))


def _gated_mlp(w: Mapping[str, Circuit], norm: Circuit, layer: int, e: int, act: str) -> Circuit:
    """Expert ``e``'s SwiGLU ``down(act(gate(x)) * up(x))``, named as the Llama MLP's inside."""
    weight = {which: w[names.mlp_weight(layer, expert_part(e, which))] for which in EXPERT_PARTS}
    gate_in = einsum("sd,Md->sM", norm, weight["gate"], name=names.MLP_GATE)
    gate = fn(act, gate_in, name=names.MLP_ACT)
    up = einsum("sd,Md->sM", norm, weight["up"], name=names.MLP_UP)
    gated = einsum("sM,sM->sM", gate, up, name=names.MLP_GATED)
    return einsum("sM,dM->sd", gated, weight["down"], name=names.EXPERT_OUT)
