"""Config fields that Hugging Face honours, against ``from_pretrained``'s own forward.

Each checkpoint here is written by ``save_pretrained`` and then given a
``config.json`` that a hub checkpoint might have: ``tie_word_embeddings: true``
beside a stored head of its own, both ``rope_parameters`` and ``rope_scaling``,
fields left out (the config class's defaults apply), a ``dtype``.  The
reference is ``AutoModelForCausalLM.from_pretrained`` of that directory; each
test also checks that the alternative reading (the one the loader used to make)
gives logits far from it, so that it cannot pass by accident.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from hf_reference import hf_logits, logits_of, random_tokens

import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError
from circuits.models.hf import config_for

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

VOCAB = 61
TOL = 1e-4

# One small layer of each family; the head count and sizes are the same for all.
SMALL = dict(num_hidden_layers=1, num_attention_heads=4, hidden_size=32, vocab_size=VOCAB)
CONFIGS = {
    "llama": lambda **k: transformers.LlamaConfig(**SMALL, intermediate_size=48, **k),
    "qwen2": lambda **k: transformers.Qwen2Config(**SMALL, num_key_value_heads=2, intermediate_size=48, **k),
    "mistral": lambda **k: transformers.MistralConfig(
        **SMALL, num_key_value_heads=2, intermediate_size=48, **k
    ),
    "gemma": lambda **k: transformers.GemmaConfig(
        **SMALL, num_key_value_heads=1, head_dim=8, intermediate_size=48, **k
    ),
    "gemma2": lambda **k: transformers.Gemma2Config(
        **SMALL, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, intermediate_size=48, **k
    ),
    "gpt_neox": lambda **k: transformers.GPTNeoXConfig(**SMALL, intermediate_size=48, **k),
    "opt": lambda **k: transformers.OPTConfig(
        num_hidden_layers=1,
        num_attention_heads=4,
        hidden_size=32,
        word_embed_proj_dim=32,
        ffn_dim=48,
        vocab_size=VOCAB,
        **k,
    ),
    "gpt2": lambda **k: transformers.GPT2Config(n_layer=1, n_head=4, n_embd=32, vocab_size=VOCAB, **k),
}


def hf_model(family: str, seed: int = 0, **fields):
    """A random-weight model with weights 4x their init (logits of a few units), in eval mode."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family](**fields)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name and "ln" not in name:
                param.mul_(4.0)
    return model


def saved(model, directory, **config_changes) -> dict:
    """``model.save_pretrained(directory)`` with ``config.json`` changed (a None value removes a key)."""
    model.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    for key, value in config_changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    (directory / "config.json").write_text(json.dumps(config))
    return config


def from_pretrained(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(directory).eval()


# ------------------------------------------------ tie_word_embeddings beside a stored head


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_stored_head_is_used_though_the_config_says_tied(family, tmp_path):
    """``from_pretrained`` keeps a stored head that differs from the embedding (``tie_weights``:
    "both are present in the checkpoints with different values, so we will NOT tie them")."""
    model = hf_model(family, tie_word_embeddings=False)
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0, 1.0)
    config = saved(model, tmp_path, tie_word_embeddings=True)
    reference = from_pretrained(tmp_path)
    assert reference.get_output_embeddings().weight is not reference.get_input_embeddings().weight
    tokens = random_tokens(VOCAB, batched=True)
    want = hf_logits(reference, tokens[..., :-1])

    loaded = logits_of(cm.load_hf_checkpoint(tmp_path, tokens))
    assert (loaded - want).abs().max().item() < TOL
    assert (logits_of(cm.from_hf(reference, tokens)) - want).abs().max().item() < TOL
    state = reference.state_dict()
    assert (logits_of(cm.from_hf_state_dict(config, state, tokens)) - want).abs().max().item() < TOL
    # what the embedding as the head gives: far off (the loader's reading before)
    reference.get_output_embeddings().weight = reference.get_input_embeddings().weight
    tied_logits = hf_logits(reference, tokens[..., :-1])
    assert (tied_logits - want).abs().max().item() > 1.0


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "opt"])
def test_a_model_in_memory_computes_with_its_own_head(family):
    """A model whose config says tied but whose head is its own parameter (as ``from_pretrained``
    leaves the checkpoint above): ``from_hf`` reads the head, not the config; with ``attach`` the
    gradients reach the head and the embedding as the model's backward sends them."""
    model = hf_model(family, tie_word_embeddings=False, pad_token_id=None)  # no untrained padding row
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0, 1.0)
    model.config.tie_word_embeddings = True
    tokens = random_tokens(VOCAB, batched=True)
    want = hf_logits(model, tokens[..., :-1])
    circuit = cm.from_hf(model, tokens, attach=True)
    assert (logits_of(circuit) - want).abs().max().item() < TOL

    circuit.evaluate().mean().backward()
    ours = [
        p.grad.clone() for p in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    ]
    model.zero_grad()
    logits = model(tokens[..., :-1]).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[..., 1:].reshape(-1)).backward()
    theirs = [p.grad for p in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)]
    for a, b in zip(ours, theirs):
        assert (a - b).abs().max().item() < 1e-5 * b.abs().max().item()


def test_a_tied_model_keeps_one_embedding_array(tmp_path):
    """Tied for real (one parameter, or a checkpoint without the head): one tensor serves both.  A head
    of equal values in a parameter of its own is the embedding too, except with ``attach``, where it
    must get its own gradient."""
    model = hf_model("llama", tie_word_embeddings=True)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    tokens = random_tokens(VOCAB, batched=False)
    assert names.UNEMBED_WEIGHT not in cm.hf_to_weights(model.config, model.state_dict())[2]
    model.save_pretrained(tmp_path)
    assert cm.load_hf_checkpoint(tmp_path, tokens) == cm.from_hf(model, tokens)

    embedding = model.get_input_embeddings().weight
    model.get_output_embeddings().weight = torch.nn.Parameter(embedding.detach().clone())
    assert names.UNEMBED_WEIGHT not in cm.hf_to_weights(model.config, model.state_dict())[2]
    attached = cm.hf_to_weights(model.config, model.state_dict(keep_vars=True), attach=True)[2]
    assert attached[names.UNEMBED_WEIGHT] is model.get_output_embeddings().weight


def test_an_untied_config_without_a_head_is_refused():
    model = hf_model("llama", tie_word_embeddings=True)
    config = model.config.to_dict() | {"tie_word_embeddings": False}
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ModelError) as info:
        cm.from_hf_state_dict(config, state)
    assert info.value.missing_keys == ["lm_head.weight"]
    assert info.value.unexpected_keys == info.value.mismatched_keys == []


# ------------------------------------------------ rope_parameters beside rope_scaling

LLAMA_ROPE_CASES = {
    # transformers 5: rope_scaling, when set, replaces rope_parameters (and its rope_theta)
    "linear scaling over default parameters": (
        {"rope_type": "default", "rope_theta": 500.0},
        {"rope_type": "linear", "factor": 4.0},
    ),
    "default scaling over linear parameters": (
        {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0},
        {"rope_type": "default"},
    ),
    "llama3 scaling": (
        {"rope_type": "default", "rope_theta": 500.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    ),
    "dynamic, in the 4.x spelling 'type'": (
        {"rope_type": "default", "rope_theta": 500.0},
        {"type": "dynamic", "factor": 3.0},
    ),
}


@pytest.mark.parametrize("case", list(LLAMA_ROPE_CASES))
def test_llama_rope_scaling_wins_over_rope_parameters(case, tmp_path):
    parameters, scaling = LLAMA_ROPE_CASES[case]
    model = hf_model("llama", max_position_embeddings=64, initializer_range=0.1)
    saved(model, tmp_path, rope_parameters=parameters, rope_scaling=scaling, rope_theta=300.0)
    reference = from_pretrained(tmp_path)
    assert reference.config.rope_parameters["rope_theta"] == 300.0  # parameters' rope_theta is gone
    tokens = random_tokens(VOCAB, batched=True, length=21)
    want = hf_logits(reference, tokens[..., :-1])
    assert (logits_of(cm.load_hf_checkpoint(tmp_path, tokens)) - want).abs().max().item() < TOL
    # rope_parameters alone gives other logits
    only_parameters = tmp_path / "only"
    saved(model, only_parameters, rope_parameters=parameters, rope_scaling=None, rope_theta=None)
    assert (hf_logits(from_pretrained(only_parameters), tokens[..., :-1]) - want).abs().max().item() > 0.1


def test_neox_rope_scaling_wins_over_rope_parameters(tmp_path):
    model = hf_model("gpt_neox")
    saved(
        model,
        tmp_path,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0},
        rope_scaling={"rope_type": "default", "rope_theta": 30.0},
        rotary_pct=0.5,
    )
    reference = from_pretrained(tmp_path)
    assert reference.config.rope_parameters["partial_rotary_factor"] == 0.5
    tokens = random_tokens(VOCAB, batched=True, length=21)
    want = hf_logits(reference, tokens[..., :-1])
    assert (logits_of(cm.load_hf_checkpoint(tmp_path, tokens)) - want).abs().max().item() < TOL
    assert (hf_logits(model, tokens[..., :-1]) - want).abs().max().item() > 0.1

    scaled = tmp_path / "scaled"
    saved(
        model,
        scaled,
        rope_parameters={"rope_type": "default"},
        rope_scaling={"rope_type": "linear", "factor": 2},
    )
    with pytest.raises(ModelError, match="'rope_scaling' asks for the rotary variant 'linear'"):
        cm.load_hf_checkpoint(scaled, tokens)


# ------------------------------------------------ fields left out of config.json

# Each family's fields whose absence Hugging Face fills with a default the loader used to differ from.
LEFT_OUT = {
    "qwen2": ("num_key_value_heads", "max_position_embeddings"),
    "mistral": ("num_key_value_heads", "max_position_embeddings", "sliding_window"),
    "gemma": (
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "tie_word_embeddings",
    ),
    "gemma2": (
        "num_key_value_heads",
        "head_dim",
        "hidden_activation",
        "tie_word_embeddings",
        "query_pre_attn_scalar",
        "sliding_window",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    ),
}


@pytest.mark.parametrize("family", list(LEFT_OUT))
def test_left_out_fields_take_the_config_classes_defaults(family):
    """The builder config from a config.json without these fields equals what the family's config
    class makes of it."""
    heads = 2 * transformers.AutoConfig.for_model(family).num_key_value_heads  # twice the default
    full = CONFIGS[family]().to_dict() | {"num_attention_heads": heads, "hidden_size": 8 * heads}
    config = {k: v for k, v in full.items() if k not in LEFT_OUT[family]}
    hf = transformers.AutoConfig.for_model(family, **{k: v for k, v in config.items() if k != "model_type"})
    ours = config_for(config)[1]
    assert ours.kv_heads == hf.num_key_value_heads
    assert ours.head_size == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    if family in ("mistral", "gemma2"):
        assert ours.sliding_window == hf.sliding_window == 4096
    if family == "gemma2":
        assert (ours.attn_softcap, ours.final_softcap) == (
            hf.attn_logit_softcapping,
            hf.final_logit_softcapping,
        )
    if family in ("gemma", "gemma2"):
        act = hf.hidden_act if family == "gemma" else hf.hidden_activation
        assert act == "gelu_pytorch_tanh" and ours.act == "gelu_new"


def test_a_gemma2_checkpoint_without_softcaps_and_activation_is_capped_as_hugging_face_does(tmp_path):
    model = hf_model("gemma2", attn_implementation="eager")
    saved(model, tmp_path, attn_logit_softcapping=None, final_logit_softcapping=None, hidden_activation=None)
    reference = from_pretrained(tmp_path)
    assert reference.config.final_logit_softcapping == 30.0
    tokens = random_tokens(VOCAB, batched=True)
    want = hf_logits(reference, tokens[..., :-1])
    assert (logits_of(cm.load_hf_checkpoint(tmp_path, tokens)) - want).abs().max().item() < TOL


# ------------------------------------------------ dtype


def test_a_checkpoint_loads_in_its_configs_dtype(tmp_path):
    """``from_pretrained`` converts the weights to config.json's ``dtype`` (4.x: ``torch_dtype``)."""
    model = hf_model("gpt2")
    saved(model, tmp_path, dtype=None, torch_dtype="float64")
    reference = from_pretrained(tmp_path)
    tokens = random_tokens(VOCAB, batched=True)
    want = hf_logits(reference, tokens[..., :-1])
    logits = logits_of(cm.load_hf_checkpoint(tmp_path, tokens))
    assert want.dtype == logits.dtype == torch.float64
    assert (logits - want).abs().max().item() < 1e-10
    saved(model, tmp_path, dtype="bfloat16", torch_dtype="float64")  # dtype first, as in transformers
    assert logits_of(cm.load_hf_checkpoint(tmp_path, tokens)).dtype == torch.bfloat16
    for bad in ("auto", "int8", 3):
        saved(model, tmp_path, dtype=bad)
        with pytest.raises(ModelError, match=f"config.json: 'dtype' is {bad!r}"):
            cm.load_hf_checkpoint(tmp_path, tokens)


def test_a_scaled_rotary_variant_takes_the_familys_defaults(tmp_path):
    """yarn reads ``max_position_embeddings`` (as its original length) when the parameters lack it:
    Mistral's default is 131072, Llama's 2048, and the tables differ."""
    model = hf_model("mistral", sliding_window=None, initializer_range=0.1)
    saved(model, tmp_path, rope_parameters={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=None)
    reference = from_pretrained(tmp_path)
    assert reference.config.rope_parameters["original_max_position_embeddings"] == 131072
    tokens = random_tokens(VOCAB, batched=True, length=21)
    want = hf_logits(reference, tokens[..., :-1])
    assert (logits_of(cm.load_hf_checkpoint(tmp_path, tokens)) - want).abs().max().item() < TOL
    as_llama = tmp_path / "as_llama"
    saved(model, as_llama, rope_parameters={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=2048)
    assert (hf_logits(from_pretrained(as_llama), tokens[..., :-1]) - want).abs().max().item() > 0.1


def test_a_scaled_rotary_variant_without_transformers_is_refused_by_name(monkeypatch):
    model = hf_model("mistral", rope_parameters={"rope_type": "linear", "factor": 2.0})
    config, state = model.config.to_dict(), model.state_dict()
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(
        ModelError, match=r"this Mistral checkpoint uses the 'linear' rotary variant.*pip install"
    ):
        cm.from_hf_state_dict(config, state, random_tokens(VOCAB, batched=False))
