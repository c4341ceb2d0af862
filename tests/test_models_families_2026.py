"""The families of 2026 against their Hugging Face models (issue 30, items 3 and 5).

Qwen3 (query/key norms; windowed layers by ``layer_types``), Gemma 3 (query/key norms, local and global
layers with two rotary bases, the global ones optionally ``linear``-scaled, ``query_pre_attn_scalar``),
Gemma 2 with ``query_pre_attn_scalar`` other than ``head_dim``, Phi-3 (fused ``qkv_proj`` and
``gate_up_proj``, a partial rotary embedding, a window, ``longrope``) and Llama with each scaled rotary
variant transformers knows beyond ``llama3`` (``linear``, ``dynamic``, ``yarn``, ``longrope``).  Each
variant is a tiny random model (2 layers, odd sizes, every parameter perturbed, 12 positions: longer
than the windows and than the original context of ``dynamic``, ``yarn`` and ``longrope``, so that the
scaled frequencies are the ones used).  The references are the models' own forwards, hooks on their
modules and ``from_pretrained`` of their saved checkpoints.  Hugging Face rounds its RMSNorms and the
eager softmax through float32 even in float64 models: the float64 references run without those round
trips (its rotary tables are float32 too, and the circuit uses them as they are).  Then the refusals:
rotary variants, quantisations, architectures and options the builder does not reproduce are
``ModelError``s naming the field.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json

import pytest
import torch
from hf_reference import check_heads_and_points, check_logits_and_loss, hf_logits, logits_of, random_tokens

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.errors import ModelError
from circuits.models.hf import config_for
from circuits.passes import layer_of
from circuits.transformer import names

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

VOCAB, LENGTH = 61, 13  # 12 positions
TOL = {torch.float32: 1e-4, torch.float64: 1e-9}
COMMON = dict(num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=16, attn_implementation="eager")
QWEN3 = dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=28, head_dim=6, intermediate_size=37)
GEMMA3 = dict(
    num_attention_heads=3,
    num_key_value_heads=1,
    hidden_size=30,  # sqrt(30) is no float32: the embedding scale's rounding shows
    head_dim=10,
    intermediate_size=37,
    query_pre_attn_scalar=7,
    sliding_window=4,
    sliding_window_pattern=2,  # layer 0 local (sliding), layer 1 global
    rope_theta=3000.0,
    rope_local_base_freq=100.0,
    final_logit_softcapping=3.0,
)
PHI3 = dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=40,
    intermediate_size=37,
    partial_rotary_factor=0.6,  # 6 of each head's 10 dims rotated
    sliding_window=5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
LLAMA = dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=24, intermediate_size=37)
LONGROPE = dict(
    rope_type="longrope", rope_theta=500.0, short_factor=[1.0, 1.5, 2.0], long_factor=[2.0, 4.0, 8.0]
)

#: variant -> (transformers config class, its fields beyond COMMON)
VARIANTS = {
    "qwen3": ("Qwen3Config", QWEN3),
    "qwen3-window": (
        "Qwen3Config",
        dict(QWEN3, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    ),
    "gemma3": ("Gemma3TextConfig", GEMMA3),
    "gemma3-linear": ("Gemma3TextConfig", dict(GEMMA3, rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "gemma2-scalar": (
        "Gemma2Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=32,
            head_dim=6,
            query_pre_attn_scalar=11,
            intermediate_size=37,
            sliding_window=4,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
    ),
    "phi3": ("Phi3Config", PHI3),
    "phi3-longrope": (
        "Phi3Config",
        dict(
            PHI3,
            rope_scaling=dict(LONGROPE, short_factor=[1.0, 1.2, 1.5]),
            original_max_position_embeddings=8,
        ),
    ),
    "llama-linear": ("LlamaConfig", dict(LLAMA, rope_parameters={"rope_type": "linear", "factor": 4.0})),
    "llama-dynamic": (
        "LlamaConfig",
        dict(LLAMA, max_position_embeddings=8, rope_parameters={"rope_type": "dynamic", "factor": 4.0}),
    ),
    "llama-yarn": (
        "LlamaConfig",
        dict(
            LLAMA, rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
        ),
    ),
    "llama-longrope": (
        "LlamaConfig",
        dict(
            LLAMA, rope_parameters=dict(LONGROPE, short_factor=[1.0] * 3, original_max_position_embeddings=8)
        ),
    ),
}
CAUSAL_LM = {"Gemma3TextConfig": "Gemma3ForCausalLM"}
QK_NORMED = ("qwen3", "qwen3-window", "gemma3", "gemma3-linear")
SANDWICHED = ("gemma3", "gemma3-linear", "gemma2-scalar")

tokens_for = functools.partial(random_tokens, VOCAB, True, LENGTH)


def hf_model(variant: str, dtype: torch.dtype = torch.float32, **overrides):
    """A random model of ``variant`` with every parameter perturbed (norms too), in eval mode."""
    config_name, fields = VARIANTS[variant]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**COMMON, **fields, **overrides})
    model_class = CAUSAL_LM.get(config_name, config_name.replace("Config", "ForCausalLM"))
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    return model.to(dtype)


def _exact_rms_norm(self, x):
    """An RMSNorm in the input's dtype: ``w * norm(x)`` (``variance_epsilon``) or Gemma's ``(1 + w) * norm(x)``."""
    plain = hasattr(self, "variance_epsilon")
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + (self.variance_epsilon if plain else self.eps))
    return self.weight * normed if plain else normed * (1.0 + self.weight)


@pytest.fixture
def float64_throughout(monkeypatch):
    """Hugging Face's RMSNorms and eager softmax without their float32 round trips (float64 stays float64)."""
    import importlib

    for family in ("llama", "qwen3", "gemma2", "gemma3", "phi3"):
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        for name, value in vars(module).items():
            if name.endswith("RMSNorm") and isinstance(value, type):
                monkeypatch.setattr(value, "forward", _exact_rms_norm)
    original = torch.nn.functional.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        return original(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax)


# ------------------------------------------------------------------ the logits


def logits_diff(variant: str, dtype: torch.dtype) -> float:
    """``from_hf``'s logits against the model's (checked within ``TOL``); the largest difference."""
    model = hf_model(variant, dtype)
    tokens = tokens_for()
    return check_logits_and_loss(model, cm.from_hf(model, tokens), tokens, TOL[dtype])


def checkpoint_diff(variant: str, dtype: torch.dtype, directory) -> float:
    """``load_hf_checkpoint``'s logits against ``from_pretrained``'s of the same saved model."""
    hf_model(variant, dtype).save_pretrained(directory)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    tokens = tokens_for()
    return check_logits_and_loss(reference, cm.load_hf_checkpoint(directory, tokens), tokens, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_from_hf_equals_the_model(variant, dtype, request):
    if dtype == torch.float64:
        request.getfixturevalue("float64_throughout")
    logits_diff(variant, dtype)


@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.float64], ids=["f32", "f64"]
)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_load_hf_checkpoint_equals_from_pretrained(variant, dtype, tmp_path, request):
    if dtype == torch.float64:
        request.getfixturevalue("float64_throughout")
    checkpoint_diff(variant, dtype, tmp_path)


@pytest.mark.parametrize(
    "variant, change",
    [
        ("qwen3", {"qk_norm": False}),
        ("gemma3", {"rope_local_theta": None}),
        ("gemma3", {"query_pre_attn_scalar": None}),
        ("gemma2-scalar", {"query_pre_attn_scalar": None}),
        ("phi3", {"rotary_dims": None}),
        ("phi3-longrope", {}),
        ("llama-yarn", {}),
        ("llama-dynamic", {}),
    ],
)
def test_without_each_change_the_logits_are_off(variant, change):
    """The changes these families make matter at these sizes: dropping the query/key norms, the
    local rotary base, the scores' scalar, the partial rotary or a scaled variant's tables (``{}``:
    the default tables) moves the logits, so the tests above cannot pass by accident."""
    tokens = tokens_for()
    model = hf_model(variant)
    config, weights = cm.hf_to_weights(model.config, model.state_dict())[1:]
    if "qk_norm" in change:
        weights = {k: v for k, v in weights.items() if "_norm" not in k}
    changed = cm.build_llama(dataclasses.replace(config, **change), weights, tokens)  # default tables
    assert (logits_of(changed) - hf_logits(model, tokens[..., :-1])).abs().max() > 1e-2


# ------------------------------------------------------------------ heads, points, ablation


def _captured(model, module, inputs, pre: bool = False):
    """The output of ``module`` (its first input with ``pre``) in the model's forward on ``inputs``."""
    seen = []
    hook = (
        module.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        if pre
        else module.register_forward_hook(
            lambda m, args, out: seen.append(out[0] if isinstance(out, tuple) else out)
        )
    )
    try:
        with torch.no_grad():
            model(input_ids=inputs)
    finally:
        hook.remove()
    return seen[0]


def points_diff(variant: str) -> float:
    """Layer 1's activation points (and the query/key norms' outputs) against the model's own values
    in float64: hidden states, hooks on its modules and its attention weights; the largest relative
    difference (checked within ``TOL``)."""
    model = hf_model(variant, torch.float64)
    tokens = tokens_for()
    inputs = tokens[:, :-1]
    circuit = cm.from_hf(model, tokens)
    layer = model.model.layers[1]
    with torch.no_grad():
        out = model(input_ids=inputs, output_hidden_states=True, output_attentions=True)
    batch, seq = inputs.shape
    heads = model.config.num_attention_heads
    z = _captured(model, layer.self_attn.o_proj, inputs, pre=True).reshape(batch, seq, heads, -1)
    sandwiched = variant in SANDWICHED
    want = {
        ("resid_pre", 1): out.hidden_states[1],
        ("attn_probs", 1): out.attentions[1],
        ("z", 1): z.transpose(1, 2),
        ("attn_out", 1): _captured(
            model, layer.post_attention_layernorm if sandwiched else layer.self_attn, inputs
        ),
        ("mlp_out", 1): _captured(
            model, layer.post_feedforward_layernorm if sandwiched else layer.mlp, inputs
        ),
        "resid_final": _captured(model, model.model.norm, inputs, pre=True),
        "ln_final": _captured(model, model.model.norm, inputs),
    }
    cache = ex.run_with_cache(circuit, list(want))
    worst = max(_relative(cache[key], value) for key, value in want.items())
    if variant in QK_NORMED:  # each head's normed queries and keys, before rotation
        for which in ("q", "k"):
            node = [n for n in circuit.get(f"a.{which}_norm") if layer_of(n) == 1]
            assert len(node) == 1
            normed = _captured(model, getattr(layer.self_attn, f"{which}_norm"), inputs)
            if variant.startswith("qwen3"):  # Qwen3 norms [B, S, h, c], Gemma 3 [B, h, S, c]
                normed = normed.transpose(1, 2)
            worst = max(worst, _relative(node[0].evaluate(), normed))
    assert worst < TOL[torch.float64], worst
    return worst


def _relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert theirs.abs().max() > 0.1  # not a comparison of near-zero values
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def ablation_check(variant: str) -> None:
    """``split_heads`` keeps the value; zero-ablating layer 1's last head equals the model with that
    head's slice of ``o_proj``'s input zeroed (within 1e-10); every point finds one node."""
    model = hf_model(variant, torch.float64)
    tokens = tokens_for()
    circuit = cm.from_hf(model, tokens)
    config = config_for(model.config)[1]
    check_heads_and_points(
        model,
        circuit,
        tokens,
        model.model.layers[1].self_attn.o_proj,
        head=config.n_heads - 1,
        d_head=config.head_size,
        kinds=("ln1", "ln1_scale", "q", "k", "v", "attn_scores", "attn_probs", "z", "attn_out")
        + ("resid_mid", "ln2", "mlp_pre", "mlp_post", "mlp_out", "resid_post"),
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_points_equal_the_models_activations(variant, float64_throughout):
    points_diff(variant)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_split_heads_and_a_zero_ablated_head(variant, float64_throughout):
    ablation_check(variant)


# ------------------------------------------------------------------ what the circuits say


def test_the_new_nodes_are_named_and_print():
    """Gemma 3's circuit reads as the model does: its query/key norms, the local layers' tables and the
    scores' scalar are named nodes of the convention, and the printed circuit shows them."""
    model = hf_model("gemma3")
    circuit = cm.from_hf(model, tokens_for())
    for name in (
        names.Q_NORM,
        names.K_NORM,
        names.ROPE_COS_LOCAL,
        names.ROPE_SIN_LOCAL,
        names.QUERY_SCALE,
        names.QUERY_SCALE_FACTOR,
        names.attn_weight(1, "q_norm"),
        names.attn_weight(0, "k_norm"),
    ):
        assert circuit.get(name), name
        assert names.parse(name) is not None and names.parse(name).text == name
    text = circuit.get_unique(names.attn_out(0)).repr()
    assert "'a.q_norm'" in text and "'t.a.c.rope_cos_local'" in text and "'a.c.div_query_scalar'" in text
    tables = {layer_of(q): q.children[0].children[1].name for q in circuit.get(names.Q)}
    assert tables == {0: names.ROPE_COS_LOCAL, 1: names.ROPE_COS}  # layer 0 local, layer 1 global
    config = config_for(model.config)[1]
    assert (config.sliding_layers, config.rope_local_theta, config.rope_theta) == ((0,), 100.0, 3000.0)
    assert config.query_pre_attn_scalar == 7 and config.qk_norm and config.attn_softcap is None


def test_gemma3_ignores_attn_logit_softcapping_as_transformers_does():
    """``Gemma3Attention`` stores ``attn_logit_softcapping`` and never applies it: neither does the circuit."""
    model = hf_model("gemma3", attn_logit_softcapping=0.5)
    tokens = tokens_for()
    check_logits_and_loss(model, cm.from_hf(model, tokens), tokens, TOL[torch.float32])


def test_phi3_splits_its_fused_projections_and_attached_gradients_reach_them(float64_throughout):
    """The query, key and value weights are row slices of ``qkv_proj`` and the gate and up weights the
    halves of ``gate_up_proj``; with ``attach=True`` they are views, and the circuit's backward fills
    the fused parameters' gradients as the model's own backward does."""
    model = hf_model("phi3", torch.float64)
    tokens = tokens_for()
    weights = cm.hf_to_weights(model.config, model.state_dict())[2]
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    q_rows = 4 * 10
    torch.testing.assert_close(
        weights[names.attn_weight(1, "q")].reshape(q_rows, -1), attn.qkv_proj.weight[:q_rows]
    )
    torch.testing.assert_close(weights[names.mlp_weight(1, "up")], mlp.gate_up_proj.weight[37:])
    loss = cc.evaluate(cm.from_hf(model, tokens, attach=True)).mean()
    loss.backward()
    ours = [p.grad.clone() for p in (attn.qkv_proj.weight, mlp.gate_up_proj.weight)]
    model.zero_grad()
    logits = model(input_ids=tokens[:, :-1]).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
    for got, param in zip(ours, (attn.qkv_proj.weight, mlp.gate_up_proj.weight)):
        assert param.grad.abs().max() > 1e-3
        torch.testing.assert_close(got, param.grad, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ rotary state and spellings


def test_dynamic_tables_follow_the_models_state_and_leave_it_alone():
    """``dynamic`` recomputes its frequencies when a longer input grows the module's cache, and keeps
    them for shorter inputs above the original length: the circuit takes the tables the model's next
    forward uses, and building it changes nothing in the model."""
    model = hf_model("llama-dynamic")
    rotary = model.model.rotary_emb
    before = (rotary.inv_freq.clone(), rotary.max_seq_len_cached)
    tokens = tokens_for()
    circuit = cm.from_hf(model, tokens)
    assert torch.equal(rotary.inv_freq, before[0]) and rotary.max_seq_len_cached == before[1]
    check_logits_and_loss(model, circuit, tokens, TOL[torch.float32])
    hf_logits(model, random_tokens(VOCAB, True, 20))  # grows the cache to 20 positions
    grown = cm.from_hf(model, tokens)
    assert (logits_of(grown) - logits_of(circuit)).abs().max() > 1e-3  # other frequencies now
    check_logits_and_loss(model, grown, tokens, TOL[torch.float32])


def test_a_transformers_4_gemma3_config_reads_as_transformers_5_does(tmp_path):
    """A Gemma 3 ``config.json`` in the 4.x spelling (``rope_theta``, ``rope_local_base_freq``,
    ``rope_scaling``, ``sliding_window_pattern``; no ``rope_parameters``, no ``layer_types``) gives
    ``from_pretrained``'s logits."""
    model = hf_model("gemma3-linear")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        config.pop(key, None)
    config.update(
        rope_theta=3000.0,
        rope_local_base_freq=100.0,
        rope_scaling={"rope_type": "linear", "factor": 4.0},
        sliding_window_pattern=2,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reference.config.rope_parameters["full_attention"]["rope_type"] == "linear"
    tokens = tokens_for()
    check_logits_and_loss(reference, cm.load_hf_checkpoint(tmp_path, tokens), tokens, TOL[torch.float32])


#: Each new family's fields whose absence its config class fills with a default the builder's differs from.
LEFT_OUT = {
    "qwen3": ("Qwen3Config", QWEN3, ("num_key_value_heads", "head_dim", "sliding_window", "layer_types")),
    "gemma3_text": (
        "Gemma3TextConfig",
        GEMMA3,
        (
            "num_key_value_heads",
            "head_dim",
            "hidden_activation",
            "tie_word_embeddings",
            "query_pre_attn_scalar",
        )
        + (
            "sliding_window",
            "layer_types",
            "rope_parameters",
            "sliding_window_pattern",
            "_sliding_window_pattern",
        ),
    ),
    "phi3": ("Phi3Config", PHI3, ("num_key_value_heads", "rms_norm_eps", "partial_rotary_factor")),
}


def _hf_config(family: str, config: dict):
    """transformers' reading of ``config`` (a deep copy: the config class fills its rotary mapping in place)."""
    fields = {k: copy.deepcopy(v) for k, v in config.items() if k != "model_type"}
    return transformers.AutoConfig.for_model(family, **fields)


@pytest.mark.parametrize("family", list(LEFT_OUT))
def test_left_out_fields_take_the_config_classes_defaults(family):
    config_name, fields, left_out = LEFT_OUT[family]
    heads = 2 * (transformers.AutoConfig.for_model(family).num_key_value_heads or 2)  # twice the default
    sizes = dict(num_attention_heads=heads, hidden_size=8 * heads, vocab_size=VOCAB, num_hidden_layers=7)
    full = getattr(transformers, config_name)(**{**fields, **sizes}).to_dict()
    config = {k: v for k, v in full.items() if k not in left_out}
    if family == "phi3":  # the factor is in the rotary parameters too (transformers 4.x: the top level alone)
        config["rope_parameters"] = {k: v for k, v in config["rope_parameters"].items() if k not in left_out}
    hf = _hf_config(family, config)
    ours = config_for(config)[1]
    assert ours.kv_heads == hf.num_key_value_heads
    assert ours.head_size == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert ours.rms_eps == hf.rms_norm_eps and ours.tie_word_embeddings == hf.tie_word_embeddings
    windowed = tuple(
        i for i, kind in enumerate(getattr(hf, "layer_types", None) or []) if kind == "sliding_attention"
    )
    if family != "phi3":
        assert ours.sliding_layers == windowed and ours.sliding_window == hf.sliding_window
    if family == "gemma3_text":
        assert windowed == (0, 1, 2, 3, 4, 6)  # every sixth layer global
        assert ours.query_pre_attn_scalar == hf.query_pre_attn_scalar and ours.act == "gelu_new"
        assert (
            (ours.rope_theta, ours.rope_local_theta)
            == (1e6, 1e4)
            == tuple(
                hf.rope_parameters[kind]["rope_theta"] for kind in ("full_attention", "sliding_attention")
            )
        )
    if family == "phi3":
        assert ours.rotary_dims is None and hf.rope_parameters["partial_rotary_factor"] == 1.0
        legacy = dict(config, partial_rotary_factor=0.75)  # 4.x: the top level only
        factor = _hf_config(family, legacy).rope_parameters["partial_rotary_factor"]
        assert config_for(legacy)[1].rotary_dims == int(ours.head_size * factor) == 6


# ------------------------------------------------------------------ refused by name (item 5)


def _config(variant: str, **changes) -> dict:
    return dict(hf_model(variant).config.to_dict(), **changes)


@pytest.mark.parametrize(
    "variant, changes, fragment",
    [
        (
            "llama-linear",
            {"rope_parameters": {"rope_type": "proportional"}},
            "'rope_parameters' asks for the rotary variant 'proportional'",
        ),
        (
            "qwen3",
            {"rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2.0}},
            "'rope_scaling' asks for the rotary variant 'ntk-by-parts'",
        ),
        ("phi3", {"rope_parameters": {"type": "su2"}}, "'rope_parameters' asks for the rotary variant 'su2'"),
        (
            "gemma3",
            {"rope_parameters": {"full_attention": {"rope_type": "foo"}, "sliding_attention": {}}},
            "rope_parameters['full_attention'] asks for the rotary variant 'foo'",
        ),
        ("gemma3", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "'rope_parameters' is"),
        ("qwen3", {"attention_bias": True}, "attention_bias=True"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
        ("gemma3", {"layer_types": ["full_attention"]}, "'layer_types' is"),
        ("gemma3", {"sliding_window": None}, "sliding-window layers [0] but no window"),
        (
            "qwen3",
            {"layer_types": ["full_attention", "sliding_attention"]},
            "sliding-window layers [1] but no window",
        ),
        (
            "phi3",
            {"partial_rotary_factor": 1.5, "rope_parameters": {"rope_type": "default"}},
            "'partial_rotary_factor' is 1.5",
        ),
        (
            "phi3",
            {"quantization_config": {"quant_method": "gptq", "bits": 4}},
            "'quantization_config' has quant_method 'gptq'",
        ),
        (
            "gemma3",
            {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
            "unsupported architecture",
        ),
    ],
)
def test_what_the_builder_cannot_build_is_refused_by_name(variant, changes, fragment):
    with pytest.raises(ModelError) as error:
        cm.from_hf_state_dict(_config(variant, **changes), {}, tokens_for())
    assert fragment in str(error.value)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.uint8])
def test_a_checkpoint_with_quantised_tensors_is_refused(dtype, tmp_path):
    """A tensor in a dtype the builders do not compute with (packed 4-bit, int8, float8: values that need
    scales stored elsewhere) is refused, naming it, and never converted to the config's dtype."""
    from safetensors.torch import save_file

    model = hf_model("qwen3")
    model.save_pretrained(tmp_path)
    state = dict(model.state_dict())
    key = "model.layers.1.mlp.up_proj.weight"
    state[key] = state[key].to(dtype)
    save_file(
        {k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"},
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(
        ModelError, match=rf"'{key}' has dtype {str(dtype).removeprefix('torch.')}, not a weight dtype"
    ):
        cm.load_hf_checkpoint(tmp_path, tokens_for())


def test_a_quantised_model_in_memory_is_refused():
    model = hf_model("llama-linear")
    model.config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with pytest.raises(ModelError, match="'quantization_config' has quant_method 'bitsandbytes'"):
        cm.from_hf(model, tokens_for())


def test_the_builders_rope_tables_are_checked_per_layer_kind():
    """``rope=`` gives a pair, or a mapping from layer kinds to pairs: a kind the config does not have,
    or a table of another width, is refused; a local kind's tables reach the local layers only."""
    model = hf_model("gemma3")
    config, weights = cm.hf_to_weights(model.config, model.state_dict())[1:]
    tokens = tokens_for()
    cos, sin = cm.rope_cos_sin(config, LENGTH - 1, theta=100.0)
    built = cm.build_llama(config, weights, tokens, rope={"sliding_attention": (cos, sin)})
    assert built == cm.build_llama(config, weights, tokens)
    llama = hf_model("llama-linear")
    llama_config, llama_weights = cm.hf_to_weights(llama.config, llama.state_dict())[1:]
    with pytest.raises(ModelError, match=r"rope= has tables for \['sliding_attention'\]"):
        cm.build_llama(
            llama_config, llama_weights, tokens, rope={"sliding_attention": (cos[:, :6], sin[:, :6])}
        )
    with pytest.raises(ModelError, match=r"rope tables \(full_attention\) have shapes \[12, 4\]"):
        cm.build_llama(config, weights, tokens, rope=(cos[:, :4], sin[:, :4]))
    phi3 = config_for(hf_model("phi3").config)[1]
    with pytest.raises(
        ModelError, match=r"an even number of rotated dims up to d_head 10, got 5 \(rotary_dims\)"
    ):
        cm.build_llama(dataclasses.replace(phi3, rotary_dims=5), cm.llama_random_weights(phi3), seq_len=4)
    with pytest.raises(ModelError, match="query_pre_attn_scalar=0"):
        dataclasses.replace(config, query_pre_attn_scalar=0)


def test_every_name_of_a_built_circuit_with_the_new_fields_parses_back():
    """The builder's new nodes keep the naming convention: built and split, every name parses back."""
    config = cm.LlamaConfig(
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_model=24,
        d_head=6,
        d_mlp=30,
        vocab_size=VOCAB,
        qk_norm=True,
        query_pre_attn_scalar=5.0,
        rope_local_theta=100.0,
        sliding_window=3,
        sliding_layers=(0,),
        rotary_dims=4,
    )
    built = cm.build_llama(config, cm.llama_random_weights(config), seq_len=5)
    for circuit in (built, cc.passes.split_heads(built)):
        for node in cc.unique_nodes([circuit]):
            if node.name is not None:
                parsed = names.parse(node.name)
                assert parsed is not None and parsed.text == node.name, node.name
