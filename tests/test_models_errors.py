"""Nothing silently wrong in the model loaders and builders.

Tokens are copied; unknown options, bad flags and config fields of the wrong
kind are refused by name; a damaged checkpoint (config.json, safetensors
files, the shard index) is a ModelError naming the file, and shards the
index puts outside the checkpoint directory are never read.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import factories
import pytest
import torch

import circuits as cc
import circuits.models as cm

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 31


#: a one-layer GPT-2 and Llama
gpt2 = functools.partial(factories.gpt2, n_layer=1, n_head=2, n_embd=8, vocab_size=VOCAB, n_positions=16)
llama = functools.partial(
    factories.llama,
    num_hidden_layers=1,
    hidden_size=16,
    intermediate_size=24,
    vocab_size=VOCAB,
    max_position_embeddings=32,
)


def tokens(shape=(2, 7), seed=1):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def raises_model_error(call, *fragments, cause=None):
    """``call()`` raises a ModelError (not a TypeError) whose message has every fragment."""
    with pytest.raises(cm.ModelError) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert not isinstance(info.value, TypeError)
    if cause is not None:
        assert isinstance(info.value.__cause__, cause), repr(info.value.__cause__)
    return info.value


# ------------------------------------------------------------------ tokens


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_tokens_are_copied(make):
    model, t = make(), tokens()
    circuit = cm.from_hf(model, t)
    before = circuit.evaluate().clone()
    t.fill_(3)
    torch.testing.assert_close(circuit.evaluate(), before, rtol=0, atol=0)
    assert circuit.get_unique("toks_int_var").value.data_ptr() != t.data_ptr()


def test_builder_tokens_are_copied_even_when_int64():
    config = cm.AttnOnlyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, vocab_size=VOCAB, n_ctx=16)
    t = tokens((9,))
    assert t.dtype == torch.int64
    circuit = cm.build_attn_only(config, cm.attn_only_random_weights(config), t)
    before = circuit.evaluate().clone()
    t.zero_()
    torch.testing.assert_close(circuit.evaluate(), before, rtol=0, atol=0)


def test_tokens_without_readable_values():
    model = gpt2()
    raises_model_error(lambda: cm.from_hf(model, torch.zeros(2, 7, dtype=torch.int64, device="meta")), "meta")
    sparse = tokens().to_sparse()
    raises_model_error(lambda: cm.from_hf(model, sparse), "sparse")
    raises_model_error(lambda: cm.from_hf(model, object()), "tokens of type object", cause=Exception)
    raises_model_error(lambda: cm.from_hf(llama(), torch.tensor(3)), "shape []")


# ----------------------------------------------------------------- options

CALLS = {
    "from_hf": lambda **kw: cm.from_hf(gpt2(), tokens(), **kw),
    "from_hf_state_dict": lambda **kw: cm.from_hf_state_dict(
        gpt2().config, gpt2().state_dict(), tokens(), **kw
    ),
    "load_hf_checkpoint": lambda **kw: cm.load_hf_checkpoint("nowhere", tokens(), **kw),
    "from_transformer_lens": lambda **kw: cm.from_transformer_lens({}, tokens(), family="gpt2", **kw),
    "build_gpt2": lambda **kw: cm.build_gpt2(
        cm.GPT2Config(1, 2, 8, VOCAB, 16),
        cm.gpt2_random_weights(cm.GPT2Config(1, 2, 8, VOCAB, 16)),
        tokens(),
        **kw,
    ),
    "build_llama": lambda **kw: cm.build_llama(
        cm.LlamaConfig(1, 2, 8, 8, VOCAB),
        cm.llama_random_weights(cm.LlamaConfig(1, 2, 8, 8, VOCAB)),
        tokens(),
        **kw,
    ),
    "build_attn_only": lambda **kw: cm.build_attn_only(
        cm.AttnOnlyConfig(1, 2, 8, 4, VOCAB, 16),
        cm.attn_only_random_weights(cm.AttnOnlyConfig(1, 2, 8, 4, VOCAB, 16)),
        tokens(),
        **kw,
    ),
    "load_demo_model": lambda **kw: cm.load_demo_model(tokens(), **kw),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_unknown_option_is_named_with_the_accepted_ones(name):
    error = raises_model_error(
        lambda: CALLS[name](bogus=1), name, "'bogus'", "accepted:", "seq_len", "causal"
    )
    assert ("attach" in str(error)) == (name != "load_hf_checkpoint")
    raises_model_error(lambda: CALLS[name](seqlen=3), "did you mean 'seq_len'?")


def test_attach_is_refused_by_the_checkpoint_loader():
    raises_model_error(lambda: cm.load_hf_checkpoint("nowhere", attach=True), "'attach'", "accepted:")


def test_bad_calls_are_model_errors():
    raises_model_error(lambda: cm.from_transformer_lens({}, tokens()), "give family=")
    raises_model_error(lambda: cm.build_gpt2(cm.GPT2Config(1, 2, 8, VOCAB, 16)), "weights", cause=TypeError)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"causal": "no"}, "causal='no' is not a bool"),
        ({"attach": 1}, "attach=1 is not a bool"),
        ({"neg_inf": -math.inf}, "neg_inf=-inf"),
        ({"neg_inf": 10000.0}, "not a finite negative number"),
        ({"convention": "gold"}, "convention 'gold'"),
    ],
)
@pytest.mark.parametrize("name", ["from_hf", "build_gpt2", "build_llama", "build_attn_only"])
def test_bad_option_values(name, options, fragment):
    raises_model_error(lambda: CALLS[name](**options), fragment)


@pytest.mark.parametrize(
    "make, fields, fragment",
    [
        (
            cm.GPT2Config,
            {"n_layers": "2", "n_heads": 2, "d_model": 8, "vocab_size": 5, "n_ctx": 4},
            "n_layers='2'",
        ),
        (
            cm.GPT2Config,
            {"n_layers": 1, "n_heads": 0, "d_model": 8, "vocab_size": 5, "n_ctx": 4},
            "n_heads=0",
        ),
        (
            cm.GPT2Config,
            {"n_layers": 1, "n_heads": 2, "d_model": 8, "vocab_size": 5, "n_ctx": 4, "ln_eps": "1"},
            "ln_eps='1'",
        ),
        (
            cm.LlamaConfig,
            {"n_layers": 1, "n_heads": 2, "d_model": 8, "d_mlp": 8.0, "vocab_size": 5},
            "d_mlp=8.0",
        ),
        (
            cm.LlamaConfig,
            {"n_layers": 1, "n_heads": 2, "d_model": 8, "d_mlp": 8, "vocab_size": 5, "rope_theta": 0},
            "rope_theta=0",
        ),
        (
            cm.AttnOnlyConfig,
            {"n_layers": -1, "n_heads": 2, "d_model": 8, "d_head": 4, "vocab_size": 5, "n_ctx": 4},
            "n_layers=-1",
        ),
    ],
)
def test_builder_configs_check_their_fields(make, fields, fragment):
    raises_model_error(lambda: make(**fields), make.__name__, fragment)


def test_zero_layers_is_a_model():
    config = cm.GPT2Config(n_layers=0, n_heads=2, d_model=8, vocab_size=VOCAB, n_ctx=16)
    assert cm.build_gpt2(config, cm.gpt2_random_weights(config), tokens()).shape == (2, 6)


# ------------------------------------------------------------- config.json


def edit_config(path, change):
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))


@pytest.fixture
def gpt2_checkpoint(tmp_path):
    gpt2().save_pretrained(tmp_path)
    return tmp_path


@pytest.fixture
def llama_checkpoint(tmp_path):
    llama().save_pretrained(tmp_path)
    return tmp_path


def test_checkpoints_load_before_damage(gpt2_checkpoint):
    assert cm.load_hf_checkpoint(gpt2_checkpoint, tokens()) == cm.from_hf(gpt2(), tokens())


@pytest.mark.parametrize(
    "content, fragment, cause",
    [
        (b"{not json", "not valid JSON", json.JSONDecodeError),
        (b'{"model_type": "gpt2\xff"}', "not UTF-8", UnicodeDecodeError),
        (b"[1, 2]", "not a JSON object", None),
        (b'"gpt2"', "not a JSON object", None),
    ],
)
def test_config_json_unreadable(gpt2_checkpoint, content, fragment, cause):
    (gpt2_checkpoint / "config.json").write_bytes(content)
    raises_model_error(
        lambda: cm.load_hf_checkpoint(gpt2_checkpoint, tokens()), "config.json", fragment, cause=cause
    )


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("n_layer", None, "no 'n_layer'"),
        ("n_layer", "2", "'n_layer' is '2'; expected an int >= 0"),
        ("n_layer", 1.0, "'n_layer' is 1.0"),
        ("n_head", 0, "'n_head' is 0; expected an int >= 1"),
        ("n_head", -2, "'n_head' is -2"),
        ("n_head", True, "'n_head' is True"),
        ("n_embd", 9, "'n_embd' 9 is not divisible by 'n_head' 2"),
        ("vocab_size", [31], "'vocab_size' is [31]"),
        ("n_inner", "32", "'n_inner' is '32'"),
        ("layer_norm_epsilon", "1e-5", "'layer_norm_epsilon' is '1e-5'"),
        ("layer_norm_epsilon", math.nan, "'layer_norm_epsilon' is nan"),
        ("activation_function", 3, "'activation_function' is 3; expected a str"),
        ("tie_word_embeddings", "false", "'tie_word_embeddings' is 'false'; expected a bool"),
        ("model_type", ["gpt2"], "model_type ['gpt2']"),
        ("model_type", None, "model_type None"),
    ],
)
def test_gpt2_config_fields(gpt2_checkpoint, key, value, fragment):
    edit_config(gpt2_checkpoint, lambda c: c.pop(key) if value is None else c.update({key: value}))
    raises_model_error(lambda: cm.load_hf_checkpoint(gpt2_checkpoint, tokens()), "config.json", fragment)


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("num_hidden_layers", "1", "'num_hidden_layers' is '1'"),
        ("num_attention_heads", 0, "'num_attention_heads' is 0"),
        ("num_key_value_heads", 3, "'num_attention_heads' 4 is not a multiple of 'num_key_value_heads' 3"),
        ("hidden_size", 16.5, "'hidden_size' is 16.5"),
        ("head_dim", -4, "'head_dim' is -4"),
        ("max_position_embeddings", "32", "'max_position_embeddings' is '32'"),
        ("rms_norm_eps", -1e-5, "'rms_norm_eps' is -1e-05"),
        ("rope_parameters", [10000.0], "'rope_parameters' is [10000.0]"),
        ("rope_parameters", {"rope_type": "default", "rope_theta": "1e4"}, "'rope_theta' is '1e4'"),
        ("attention_bias", "no", "'attention_bias' is 'no'"),
    ],
)
def test_llama_config_fields(llama_checkpoint, key, value, fragment):
    edit_config(llama_checkpoint, lambda c: c.update({key: value}))
    raises_model_error(lambda: cm.load_hf_checkpoint(llama_checkpoint, tokens()), "config.json", fragment)


def test_config_dicts_are_checked_without_a_file():
    config = gpt2().config.to_dict()
    config["n_layer"] = "1"
    raises_model_error(
        lambda: cm.from_hf_state_dict(config, gpt2().state_dict(), tokens()), "'n_layer' is '1'"
    )
    raises_model_error(lambda: cm.from_hf_state_dict(gpt2().config, [1, 2], tokens()), "state dict")


# ------------------------------------------------------------ safetensors


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: data[:100],
        lambda data: b"garbage" * 10,
        lambda data: b"",
    ],
    ids=["half", "header-cut", "garbage", "empty"],
)
def test_broken_safetensors(gpt2_checkpoint, damage):
    path = gpt2_checkpoint / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    raises_model_error(
        lambda: cm.load_hf_checkpoint(gpt2_checkpoint, tokens()),
        "model.safetensors",
        "not a readable safetensors",
        cause=Exception,
    )


def test_the_same_tensor_in_two_files(gpt2_checkpoint):
    (gpt2_checkpoint / "copy.safetensors").write_bytes((gpt2_checkpoint / "model.safetensors").read_bytes())
    raises_model_error(
        lambda: cm.load_hf_checkpoint(gpt2_checkpoint, tokens()), "both hold", "copy.safetensors"
    )


def test_broken_pytorch_bin(gpt2_checkpoint):
    (gpt2_checkpoint / "model.safetensors").unlink()
    (gpt2_checkpoint / "pytorch_model.bin").write_bytes(b"not a pickle")
    raises_model_error(
        lambda: cm.load_hf_checkpoint(gpt2_checkpoint, tokens()),
        "pytorch_model.bin",
        "not a readable",
        cause=Exception,
    )


# ------------------------------------------------------------------ index


@pytest.fixture
def sharded(tmp_path):
    directory = tmp_path / "checkpoint"
    llama().save_pretrained(directory, max_shard_size="2KB")
    index = directory / "model.safetensors.index.json"
    assert index.exists()
    assert cm.load_hf_checkpoint(directory, tokens()) == cm.from_hf(llama(), tokens())
    return directory


def write_index(directory, value):
    (directory / "model.safetensors.index.json").write_text(json.dumps(value))


def weight_map(directory):
    return json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"metadata": {}}', "'weight_map' is None"),
        ('{"weight_map": ["model.safetensors"]}', "'weight_map' is ['model.safetensors']"),
        ('{"weight_map": {}}', "'weight_map' is {}"),
        ('{"weight_map": {"lm_head.weight": 3}}', "weight_map['lm_head.weight'] is 3, not a file name"),
    ],
)
def test_broken_index(sharded, content, fragment):
    (sharded / "model.safetensors.index.json").write_text(content)
    raises_model_error(
        lambda: cm.load_hf_checkpoint(sharded, tokens()), "model.safetensors.index.json", fragment
    )


def test_missing_shard(sharded):
    shard = min(weight_map(sharded).values())
    (sharded / shard).unlink()
    raises_model_error(lambda: cm.load_hf_checkpoint(sharded, tokens()), "index.json", shard, "missing")


def test_index_names_a_tensor_its_shard_lacks(sharded):
    mapping = weight_map(sharded)
    shards = sorted(set(mapping.values()))
    key = next(k for k, v in mapping.items() if v == shards[0])
    mapping[key] = shards[1]
    write_index(sharded, {"weight_map": mapping})
    raises_model_error(lambda: cm.load_hf_checkpoint(sharded, tokens()), f"puts '{key}' in {shards[1]}")


def escape_by(sharded, how):
    """Point one index entry at a copy of its shard outside the checkpoint directory."""
    mapping = weight_map(sharded)
    shard = min(mapping.values())
    outside = sharded.parent / "other"
    outside.mkdir()
    (outside / shard).write_bytes((sharded / shard).read_bytes())
    if how == "parent":
        target = f"../other/{shard}"
    else:
        target = str(outside / shard)
    write_index(sharded, {"weight_map": {k: target if v == shard else v for k, v in mapping.items()}})
    return target


@pytest.mark.parametrize("how", ["parent", "absolute"])
def test_index_pointing_outside_is_refused(sharded, how, monkeypatch):
    target = escape_by(sharded, how)
    read = []
    from safetensors import torch as safetensors_torch

    real = safetensors_torch.load_file
    monkeypatch.setattr(
        safetensors_torch, "load_file", lambda path, *a, **k: read.append(path) or real(path, *a, **k)
    )
    raises_model_error(
        lambda: cm.load_hf_checkpoint(sharded, tokens()), "outside the checkpoint directory", target
    )
    assert read == []  # refused before reading any shard


def test_symlink_inside_the_directory_is_followed(sharded):
    mapping = weight_map(sharded)
    shard = min(mapping.values())
    os.rename(sharded / shard, sharded / "real.bin")
    os.symlink("real.bin", sharded / shard)
    assert cm.load_hf_checkpoint(sharded, tokens()) == cm.from_hf(llama(), tokens())


def test_a_hugging_face_cache_snapshot_loads(sharded):
    """Snapshot shards are symlinks to ../../blobs: the directory's owner made them, so they are followed."""
    blobs = sharded.parent / "blobs"
    blobs.mkdir()
    for shard in set(weight_map(sharded).values()):
        os.rename(sharded / shard, blobs / shard)
        os.symlink(Path("..") / "blobs" / shard, sharded / shard)
    assert cm.load_hf_checkpoint(sharded, tokens()) == cm.from_hf(llama(), tokens())


def test_messages_quote_user_text_safely(gpt2_checkpoint):
    edit_config(gpt2_checkpoint, lambda c: c.update(model_type="\x1b[2J" + "x" * 1000))
    error = raises_model_error(
        lambda: cm.load_hf_checkpoint(gpt2_checkpoint, tokens()), "unsupported architecture"
    )
    assert "\x1b" not in str(error) and len(str(error)) < 800


def test_errors_are_circuit_errors():
    assert issubclass(cm.ModelError, cc.CircuitError)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"tokens": torch.zeros(2, 0, dtype=torch.int64)}, "tokens have shape [2, 0]"),
        ({"seq_len": "5"}, "seq_len='5' is not a positive int"),
        ({"tokens": torch.zeros(3, dtype=torch.int64), "convention": ["x"]}, "convention ['x']"),
    ],
)
def test_llama_positions_that_make_no_rotary_table(options, fragment):
    raises_model_error(lambda: cm.from_hf(llama(), **options), fragment)


def test_rope_tables_are_copied_and_checked():
    config = cm.LlamaConfig(1, 2, 8, 8, VOCAB)
    weights, t = cm.llama_random_weights(config), tokens()
    cos, sin = cm.rope_cos_sin(config, 6)
    circuit = cm.build_llama(config, weights, t, rope=(cos, sin))
    before = circuit.evaluate().clone()
    cos.zero_()
    torch.testing.assert_close(circuit.evaluate(), before, rtol=0, atol=0)
    raises_model_error(
        lambda: cm.build_llama(config, weights, t, rope=cos), "rope= must be a pair", cause=Exception
    )
    raises_model_error(lambda: cm.build_llama(config, weights, t, rope=(cos.long(), sin)), "floating tensors")
