"""models.from_torch on Hugging Face models built from small odd-dimension configs with random
weights: the imported circuit's value against the model's own forward (float32, within 1e-5)."""

from __future__ import annotations

import factories
import pytest
import torch

transformers = pytest.importorskip("transformers")

import circuits as cc  # noqa: E402
from circuits import models  # noqa: E402
from circuits.text.store import TensorStore  # noqa: E402

transformers.logging.set_verbosity_error()
TOL = dict(atol=1e-5, rtol=1e-5)


def _tokens(vocab: int, shape=(2, 7), seed: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _randomized(model):
    """Every parameter perturbed, so zero biases and unit norms do not hide a mis-wired one."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model.eval()


def gpt2(attn_implementation: str = "sdpa"):
    return factories.gpt2(
        seed=None,
        perturb=_randomized,
        n_embd=15,
        n_head=3,
        vocab_size=41,
        n_positions=19,
        attn_implementation=attn_implementation,
    )


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_gpt2_logits_equal_hugging_face(attn_implementation):
    model = gpt2(attn_implementation)
    tokens = _tokens(41)
    circuit = models.from_torch(model, (tokens,), strict=True)  # every op has a translation
    with torch.no_grad():
        expected = model(tokens).logits
    torch.testing.assert_close(circuit.evaluate(), expected, **TOL)
    # named by module path: parameters, inputs, and each op by the module that ran it
    assert circuit.get_unique("transformer.h.1.attn.c_attn.weight").shape == (15, 45)
    assert circuit.get_unique("input_ids").shape == (2, 7)
    assert circuit.are_any_found("transformer.h.0.attn.c_attn.addmm")
    assert circuit.are_any_found("transformer.h.1.ln_2.layer_norm")


def test_gpt2_inputs_are_swappable_arrays():
    """The example inputs are Arrays named by argument: replacing them evaluates other tokens."""
    model = gpt2()
    circuit = models.from_torch(model, (_tokens(41),))
    other = _tokens(41, seed=9)
    swapped = circuit.update("input_ids", lambda n: cc.Array(other, name="input_ids"))
    with torch.no_grad():
        expected = model(other).logits
    torch.testing.assert_close(swapped.evaluate(), expected, **TOL)


def test_llama_logits_equal_hugging_face():
    config = transformers.LlamaConfig(
        vocab_size=43,
        hidden_size=18,
        intermediate_size=25,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    model = _randomized(transformers.LlamaForCausalLM(config))
    tokens = _tokens(43)
    circuit = models.from_torch(model, (tokens,), strict=True)
    with torch.no_grad():
        expected = model(tokens).logits
    torch.testing.assert_close(circuit.evaluate(), expected, **TOL)
    assert circuit.get_unique("model.layers.1.mlp.gate_proj.weight").shape == (25, 18)


def test_bert_with_attention_mask_equals_hugging_face(tmp_path):
    config = transformers.BertConfig(
        vocab_size=39,
        hidden_size=15,
        intermediate_size=23,
        num_hidden_layers=2,
        num_attention_heads=3,
        max_position_embeddings=17,
    )
    model = _randomized(transformers.BertModel(config))
    tokens = _tokens(39)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, 4:] = 0  # the first row's last three positions are padding
    mask[1, 6:] = 0
    circuit = models.from_torch(model, (tokens,), {"attention_mask": mask})
    with torch.no_grad():
        expected = model(tokens, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(circuit.evaluate(), expected, **TOL)
    # the mask is an input too: another mask gives what the model gives with it
    other = torch.ones(2, 7, dtype=torch.long)
    other[1, 2:] = 0
    swapped = circuit.update("attention_mask", lambda n: cc.Array(other, name="attention_mask"))
    with torch.no_grad():
        expected = model(tokens, attention_mask=other).last_hidden_state
    torch.testing.assert_close(swapped.evaluate(), expected, **TOL)
    # the mask is built by aten ops without a translation (int to bool, and, an advanced index):
    # they print and parse back, and the circuit read back evaluates the same
    specs = {n.spec.name for n in cc.unique_nodes([circuit]) if isinstance(n, cc.GeneralFunction)}
    assert any(name.startswith("aten.__and__.Tensor(") for name in specs)
    store = TensorStore(tmp_path / "tensors")
    back = cc.parse(circuit.repr(store=store), store=store)
    assert back == circuit
    torch.testing.assert_close(back.evaluate(), circuit.evaluate(), atol=0, rtol=0)
    pooled = models.from_torch(model, (tokens,), {"attention_mask": mask}, output="pooler_output")
    with torch.no_grad():
        expected = model(tokens, attention_mask=mask).pooler_output
    torch.testing.assert_close(pooled.evaluate(), expected, **TOL)


def _marian():
    config = transformers.MarianConfig(
        vocab_size=37,
        d_model=15,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=3,
        decoder_attention_heads=3,
        encoder_ffn_dim=21,
        decoder_ffn_dim=21,
        max_position_embeddings=23,
        pad_token_id=0,
        decoder_start_token_id=0,
    )
    return _randomized(transformers.MarianMTModel(config))


def test_marian_encoder_equals_hugging_face():
    model = _marian()
    tokens = _tokens(37)
    encoder = model.get_encoder()
    circuit = models.from_torch(encoder, (tokens,))
    with torch.no_grad():
        expected = encoder(tokens).last_hidden_state
    torch.testing.assert_close(circuit.evaluate(), expected, **TOL)
    assert circuit.are_any_found("layers.0.self_attn.q_proj.weight")


def test_marian_decoder_step_equals_hugging_face():
    """One decoder step: the encoder's states and one decoder token in, the logits out."""
    model = _marian()
    tokens = _tokens(37)
    with torch.no_grad():
        states = model.get_encoder()(tokens).last_hidden_state
    step = torch.tensor([[0], [0]])
    kwargs = {"encoder_outputs": (states,), "decoder_input_ids": step}
    logits, encoder_states = models.from_torch(
        model, (), kwargs, output=["logits", "encoder_last_hidden_state"]
    )
    with torch.no_grad():
        expected = model(**kwargs).logits
    assert logits.shape == (2, 1, 37)
    torch.testing.assert_close(logits.evaluate(), expected, **TOL)
    torch.testing.assert_close(encoder_states.evaluate(), states, **TOL)
    assert logits.are_any_found("model.decoder.layers.1.encoder_attn.k_proj.weight")
