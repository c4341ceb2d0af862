"""Mixtral (a mixture of experts in each MLP) against Hugging Face's ``MixtralForCausalLM``.

Random-weight models from small odd-sized configs (nothing is downloaded), with every norm perturbed.
Hugging Face runs its experts through ``grouped_mm`` by default, which refuses these sizes on a CPU,
so the models run its ``eager`` experts (the per-expert loop of ``MixtralExperts.forward``).  Its
router takes the softmax in float32 and its ``MixtralRMSNorm`` rounds through float32, so the float64
reference runs with both round trips removed (as the Llama tests do for the norm).  The references:
the model's own logits, its router's outputs (a forward hook on ``mlp.gate``), and for ablations
the model with a hook that zeroes a head's input to ``o_proj`` or an expert's routing weight.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from hf_reference import check_heads_and_points, check_logits_and_loss, hf_logits, logits_of, random_tokens

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.core.functions import get_function
from circuits.errors import FunctionSpecError, ModelError
from circuits.transformer import names

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 61
EXPERTS, TOP_K = 5, 2
tokens_for = functools.partial(random_tokens, VOCAB)
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
MEASURED: dict[str, float] = {}


def mixtral(kv_heads: int = 2, tied: bool = False, seed: int = 0, dtype=torch.float32, **extra):
    torch.manual_seed(seed)
    fields = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=40,
        intermediate_size=23,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.2,
        tie_word_embeddings=tied,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
    )
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**{**fields, **extra})).eval()
    model.set_experts_implementation("eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model.to(dtype)


def _no_float32_round_trips(monkeypatch):
    """The float64 reference: Mixtral's RMSNorm and router softmax computed in the model's dtype."""
    from transformers.models.mixtral import modeling_mixtral

    def norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def router(self, hidden_states):
        logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
        top, indices = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        return logits, top / top.sum(dim=-1, keepdim=True), indices

    monkeypatch.setattr(modeling_mixtral.MixtralRMSNorm, "forward", norm)
    monkeypatch.setattr(modeling_mixtral.MixtralTopKRouter, "forward", router)


def _router_outputs(model, inputs: torch.Tensor, layer: int):
    """Hugging Face's router of ``layer`` on ``inputs``: ``(logits, weights, indices)``, per token."""
    seen = {}
    handle = model.model.layers[layer].mlp.gate.register_forward_hook(
        lambda module, args, output: seen.update(out=output)
    )
    try:
        hf_logits(model, inputs)
    finally:
        handle.remove()
    return seen["out"]


def _dense(weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Hugging Face's sparse routing ``[tokens, k]`` as ``[tokens, experts]`` (zero where not routed)."""
    return torch.zeros(weights.shape[0], EXPERTS, dtype=weights.dtype).scatter(-1, indices, weights)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize(
    "kv_heads,tied,window",
    [(4, False, None), (2, False, 4), (1, True, None)],
    ids=["mha", "gqa-window", "mqa-tied"],
)
def test_equals_hugging_face_forward(kv_heads, tied, window, batched, dtype, monkeypatch):
    if dtype == torch.float64:
        _no_float32_round_trips(monkeypatch)
    model = mixtral(kv_heads, tied, dtype=dtype, sliding_window=window)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    MEASURED[f"{kv_heads}-{tied}-{window}-{batched}-{dtype}"] = check_logits_and_loss(
        model, circuit, tokens, TOL[dtype]
    )
    assert logits_of(circuit).dtype == dtype
    assert len(circuit.get_unique(names.mlp_out(1)).children) == EXPERTS


def test_the_router_and_the_routing_are_hugging_faces():
    """``'b{L}.m.router'`` is the router's logits; the experts ``'b{L}.m.routing'`` gives weight
    are exactly those Hugging Face routes each token to, with its weights."""
    model = mixtral()
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    for layer in range(2):
        logits, weights, indices = _router_outputs(model, tokens[:, :-1], layer)
        ours_logits = circuit.get_unique(names.router(layer)).evaluate()
        routing = circuit.get_unique(names.router(layer, "routing")).evaluate().reshape(-1, EXPERTS)
        torch.testing.assert_close(ours_logits.reshape(-1, EXPERTS), logits, rtol=0, atol=1e-5)
        want = _dense(weights, indices)
        assert torch.equal(routing != 0, want != 0)  # the same experts, token by token
        torch.testing.assert_close(routing, want, rtol=0, atol=1e-6)
        assert (routing != 0).sum(-1).eq(TOP_K).all()


def test_ties_break_as_in_hugging_face():
    """Four experts with zero router rows tie exactly on every token: which of them a token gets is
    ``torch.topk``'s choice, and the circuit makes the very choice Hugging Face's router makes (another
    tie rule, the highest index first, would choose otherwise)."""
    model = mixtral()
    with torch.no_grad():
        model.model.layers[0].mlp.gate.weight[:4] = 0
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    _, weights, indices = _router_outputs(model, tokens[:, :-1], 0)
    probs = circuit.get_unique(names.router(0, "router_probs")).evaluate().reshape(-1, EXPERTS)
    routing = circuit.get_unique(names.router(0, "routing")).evaluate().reshape(-1, EXPERTS)
    chosen = routing != 0
    assert torch.equal(chosen, _dense(weights, indices) != 0)
    tied = chosen[:, :4].sum(-1)
    assert ((tied > 0) & (tied < 4)).all()  # every token took some, not all, of the tied experts
    highest_first = torch.topk(probs.flip(-1), TOP_K, dim=-1).indices
    assert not torch.equal(chosen, _dense(torch.ones_like(weights), EXPERTS - 1 - highest_first) != 0)
    torch.testing.assert_close(routing, _dense(weights, indices), rtol=0, atol=1e-6)


def test_top_k_functions_keep_what_torch_topk_keeps():
    x = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.1], [0.5, 0.0, 0.25, 0.25, 0.0]], dtype=torch.float64)
    for k in (1, 2, 3):
        values, indices = torch.topk(x, k, dim=-1)
        plain = torch.zeros_like(x).scatter(-1, indices, values)
        normalized = torch.zeros_like(x).scatter(-1, indices, values / values.sum(-1, keepdim=True))
        node = cc.Array(x, name="probs")
        for name, want in ((f"top_k_{k}", plain), (f"top_k_{k}_normalized", normalized)):
            fn = cc.GeneralFunction.new_by_name(node, spec_name=name, name="routing")
            assert torch.equal(fn.evaluate(), want), name
            assert cc.parse(fn.repr()) == fn
    with pytest.raises(Exception, match="only 5"):
        cc.GeneralFunction.new_by_name(cc.Array(x), spec_name="top_k_6")
    with pytest.raises(FunctionSpecError):
        get_function("top_k_0")


def test_split_heads_and_points_and_a_zeroed_head(monkeypatch):
    """Head splitting keeps the value; zero-ablating head 1.2 equals the model with that head's
    slice of ``o_proj``'s input zeroed; every activation point finds its node, and the MLP's
    internals are found once per expert."""
    _no_float32_round_trips(monkeypatch)
    model = mixtral(2, dtype=torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    check_heads_and_points(
        model,
        circuit,
        tokens,
        model.model.layers[1].self_attn.o_proj,
        head=2,
        d_head=model.config.hidden_size // model.config.num_attention_heads,
        kinds=("q", "k", "v", "attn_probs", "z", "resid_mid", "mlp_out", "ln2"),
    )
    for kind in ("mlp_pre", "mlp_post"):
        assert len(circuit.get(ex.Point(kind, 1))) == EXPERTS


def _logits_without_expert(model, inputs: torch.Tensor, layer: int, expert: int) -> torch.Tensor:
    """The model's logits with ``expert``'s routing weight in ``layer`` zeroed (a hook on the router)."""

    def drop(module, args, output):
        logits, weights, indices = output
        return logits, weights.masked_fill(indices == expert, 0), indices

    handle = model.model.layers[layer].mlp.gate.register_forward_hook(drop)
    try:
        return hf_logits(model, inputs)
    finally:
        handle.remove()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_ablating_one_expert_is_one_update(dtype, monkeypatch):
    """Zeroing ``'b1.m.expert3'`` (one ``update``) equals the model whose router gives expert 3 no
    weight; the expert mattered."""
    if dtype == torch.float64:
        _no_float32_round_trips(monkeypatch)
    model = mixtral(dtype=dtype)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    target = names.expert(1, 3)
    ablated = circuit.update(target, lambda node: cc.Array(torch.zeros(node.shape, dtype=dtype), name=target))
    want = _logits_without_expert(model, tokens[..., :-1], 1, 3)
    diff = (logits_of(ablated) - want).abs().max().item()
    MEASURED[f"expert-ablation-{dtype}"] = diff
    assert diff < TOL[dtype]
    assert (logits_of(circuit) - want).abs().max().item() > 1e-3
    assert (logits_of(ex.zero_ablate(circuit, target)) - want).abs().max().item() < TOL[dtype]


def test_gradients_reach_the_experts_and_the_router_as_in_hugging_face(monkeypatch):
    """With ``attach=True`` the circuit's loss fills the fused expert and router parameters' ``.grad``
    as the model's own backward does (zero for an expert's rows on tokens not routed to it)."""
    _no_float32_round_trips(monkeypatch)
    model = mixtral(dtype=torch.float64)
    tokens = tokens_for(True)
    cm.from_hf(model, tokens, attach=True).evaluate().mean().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    logits = model(input_ids=tokens[:, :-1]).logits
    F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
    for name in ("model.layers.1.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj"):
        param = model.get_parameter(name)
        assert param.grad.abs().max() > 0
        torch.testing.assert_close(ours[name], param.grad, rtol=1e-9, atol=1e-12)


def test_checkpoints_in_either_expert_layout(tmp_path):
    """``save_pretrained`` writes the per-expert layout (``block_sparse_moe.experts.{e}.w1``); the
    model in memory holds the fused one (``mlp.experts.gate_up_proj``): both give the same circuit."""
    model = mixtral(2)
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)
    assert (logits_of(loaded) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5
    assert loaded.get_unique(names.mlp_weight(0, "expert4_down")).shape == (40, 23)


def test_router_jitter_is_training_only_and_supported():
    """``router_jitter_noise`` scales the router's input in training only: in ``eval()`` the model
    (and the circuit) compute without it."""
    model = mixtral(router_jitter_noise=0.3)
    tokens = tokens_for(True)
    check_logits_and_loss(model, cm.from_hf(model, tokens), tokens, 1e-5)


@pytest.mark.parametrize(
    "field,value",
    [
        ("norm_topk_prob", False),
        ("shared_expert_intermediate_size", 16),
        ("n_shared_experts", 1),
        ("mlp_only_layers", [0]),
        ("scoring_func", "sigmoid"),
        ("moe_intermediate_size", 8),
    ],
)
def test_options_of_other_moe_families_are_refused_by_name(field, value):
    """A field that would mean another router or MLP is refused, naming it, where ``MixtralConfig``
    would ignore it and the circuit would compute Mixtral's routing instead."""
    config = dict(mixtral().config.to_dict(), **{field: value})
    with pytest.raises(ModelError, match=rf"Mixtral config options not supported: {field}="):
        cm.from_hf_state_dict(config, {}, tokens_for(False))


def test_broken_configs_and_state_dicts_name_the_field_or_key():
    model = mixtral()
    config = model.config.to_dict()
    with pytest.raises(ModelError, match="'num_experts_per_tok' 6 is more than 'num_local_experts' 5"):
        cm.from_hf_state_dict(dict(config, num_experts_per_tok=6), {})
    with pytest.raises(ModelError, match="'num_local_experts' is 'eight'"):
        cm.from_hf_state_dict(dict(config, num_local_experts="eight"), {})
    with pytest.raises(ModelError, match="unsupported architecture: model_type 'qwen2_moe'"):
        cm.from_hf_state_dict(dict(config, model_type="qwen2_moe"), {})
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.mlp.experts.down_proj"}
    with pytest.raises(
        ModelError, match=r"(?s)Mixtral state dict.*missing: 'model.layers.1.mlp.experts.down_proj'"
    ):
        cm.from_hf_state_dict(config, state, tokens_for(False))
    with pytest.raises(ModelError, match="experts_per_token=3 is more than n_experts=2"):
        cm.LlamaConfig(
            n_layers=1, n_heads=2, d_model=8, d_mlp=6, vocab_size=9, n_experts=2, experts_per_token=3
        )


def test_the_builder_config_and_random_weights():
    """A Mixtral-style ``LlamaConfig`` builds without Hugging Face; its names parse back."""
    config = cm.LlamaConfig(
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        d_model=12,
        d_mlp=10,
        vocab_size=13,
        n_experts=3,
        experts_per_token=1,
    )
    weights = cm.llama_random_weights(config, seed=1, dtype=torch.float64)
    assert weights[names.mlp_weight(1, "router")].shape == (3, 12)
    assert names.mlp_weight(0, "gate") not in weights
    circuit = cm.build_llama(
        config, weights, torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(0))
    )
    routing = circuit.get_unique(names.router(1, "routing")).evaluate()
    assert torch.equal((routing != 0).sum(-1), torch.ones(2, 5, dtype=torch.int64))
    assert torch.allclose(routing.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    for node in cc.unique_nodes([circuit]):
        if node.name is not None:
            parsed = names.parse(node.name)
            assert parsed is not None and parsed.text == node.name, node.name
    assert names.parse_expert("b1.m.expert2") == (1, 2) and names.parse_expert("b1.m") is None
    assert cc.parse(circuit.repr()) == circuit  # top_k_1_normalized prints and parses by name
