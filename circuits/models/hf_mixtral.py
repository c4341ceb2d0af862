"""Hugging Face Mixtral (``MixtralForCausalLM``): its mixture-of-experts config fields and weights.

The rest of Mixtral is Mistral (``hf_llama``).  Its experts are read in either layout: the
fused one of a model in memory (transformers 5: ``mlp.gate.weight``, ``mlp.experts.gate_up_proj``
``[E, 2 * d_mlp, d]`` with the gate first, ``mlp.experts.down_proj`` ``[E, d, d_mlp]``) or the
per-expert one of checkpoints (``block_sparse_moe.gate.weight``, ``block_sparse_moe.experts.{e}.w1``
(gate), ``w3`` (up), ``w2`` (down): what the Hub holds and what ``save_pretrained`` writes).

Mixtral's router always takes the softmax over every expert, then the top ``num_experts_per_tok``
divided by their sum; it has no shared experts, and ``router_jitter_noise`` acts in training
only (the circuit is the model in ``eval()``).  Fields of other mixture-of-experts families that
would change what a config means (``norm_topk_prob=False``, shared experts, dense layers, another
scoring function) are refused, naming the field, rather than ignored as ``MixtralConfig`` would.
"""

from __future__ import annotations

from typing import Any

import torch

from circuits.errors import ModelError, shown
from circuits.models.moe import expert_part
from circuits.models.reading import Reader, get_field, int_field, number_field
from circuits.transformer import names

FAMILY = "Mixtral"

#: field -> the value that means what Mixtral computes (any other is refused; absent is fine).
_MEANS_MIXTRAL: dict[str, Any] = {
    "norm_topk_prob": True,
    "shared_expert_intermediate_size": 0,
    "n_shared_experts": 0,
    "num_shared_experts": 0,
    "moe_shared_expert_intermediate_size": 0,
    "mlp_only_layers": [],
    "decoder_sparse_step": 1,
    "first_k_dense_replace": 0,
    "scoring_func": "softmax",
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
}


def moe_fields(config: Any) -> dict[str, int]:
    """``n_experts`` and ``experts_per_token`` of ``LlamaConfig`` from a Mixtral config, each checked."""
    problems = [
        f"{field}={shown(repr(get_field(config, field)))} (Mixtral computes {field}={wanted!r})"
        for field, wanted in _MEANS_MIXTRAL.items()
        if get_field(config, field) is not None and get_field(config, field) != wanted
    ]
    moe_size = get_field(config, "moe_intermediate_size")
    if moe_size is not None and moe_size != get_field(config, "intermediate_size"):
        problems.append(
            f"moe_intermediate_size={shown(repr(moe_size))} (Mixtral's experts are intermediate_size wide)"
        )
    if problems:
        raise ModelError(f"{FAMILY} config options not supported: {', '.join(problems)}")
    number_field(FAMILY, config, "router_jitter_noise", 0.0)  # training only, but a bad value is refused
    n_experts = int_field(FAMILY, config, "num_local_experts", 8)
    top_k = int_field(FAMILY, config, "num_experts_per_tok", 2)
    if top_k > n_experts:
        raise ModelError(
            f"{FAMILY} config: 'num_experts_per_tok' {top_k} is more than 'num_local_experts' {n_experts}"
        )
    return {"n_experts": n_experts, "experts_per_token": top_k}


def moe_weights_from_hf(
    r: Reader, prefix: str, layer: int, n_experts: int, d_model: int, d_mlp: int
) -> dict[str, torch.Tensor | None]:
    """Layer ``layer``'s router and expert weights (views), from whichever layout the state dict has."""
    e, d, m = n_experts, d_model, d_mlp
    out: dict[str, torch.Tensor | None] = {}
    if prefix + "block_sparse_moe.gate.weight" in r.state:
        base = prefix + "block_sparse_moe."
        out[names.mlp_weight(layer, "router")] = r.take(base + "gate.weight", (e, d))
        for expert in range(e):
            for which, key, shape in (("gate", "w1", (m, d)), ("up", "w3", (m, d)), ("down", "w2", (d, m))):
                weight = r.take(f"{base}experts.{expert}.{key}.weight", shape)
                out[names.mlp_weight(layer, expert_part(expert, which))] = weight
        return out
    out[names.mlp_weight(layer, "router")] = r.take(prefix + "mlp.gate.weight", (e, d))
    gate_up = r.take(prefix + "mlp.experts.gate_up_proj", (e, 2 * m, d))
    down = r.take(prefix + "mlp.experts.down_proj", (e, d, m))
    for expert in range(e):
        parts = {
            "gate": None if gate_up is None else gate_up[expert, :m],
            "up": None if gate_up is None else gate_up[expert, m:],
            "down": None if down is None else down[expert],
        }
        for which, weight in parts.items():
            out[names.mlp_weight(layer, expert_part(expert, which))] = weight
    return out
