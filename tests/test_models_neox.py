"""GPT-NeoX (Pythia) against Hugging Face's ``GPTNeoXForCausalLM``: what only GPT-NeoX has.

Random-weight models from small configs (``factories.neox``; nothing is downloaded), with large
weights and perturbed biases and layer norms so that every weight moves the logits, partial
rotary (``rotary_pct`` 0.5 of a head of 12: 6 dims rotated, 6 passed through) and both residual
layouts (parallel, Pythia's, and sequential).  The forward (both layouts), the checkpoint round
trip, head splitting, the points and the causal mask pass, which every family shares, are in
test_models_conformance.py.
"""

from __future__ import annotations

import functools

import dataclasses
import json

import pytest
import torch
from factories import FAMILY_VOCAB as VOCAB
from factories import neox
from hf_reference import hf_logits, logits_of, random_tokens

import circuits as cc
import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

tokens_for = functools.partial(random_tokens, VOCAB)


@pytest.mark.parametrize("rotary_pct", [0.0, 1.0], ids=["no-rotary", "full-rotary"])
def test_rotary_extremes_tied_embeddings_and_no_attention_bias(rotary_pct):
    model = neox(rotary_pct=rotary_pct, tied=True, attention_bias=False).to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    assert not circuit.get(names.Q_NOBIAS) and not circuit.get(names.attn_weight(1, "o_bias"))
    assert circuit.get(names.Q_UNROTATED) and circuit.get(names.V)
    assert (logits_of(circuit) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-10


def test_a_wrong_rotary_fraction_or_residual_layout_differs():
    """The partial rotary fraction and the residual layout both matter: the test can fail."""
    model = neox()
    tokens = tokens_for(True)
    config, weights = cm.hf_to_weights(model.config, model.state_dict())[1:]
    assert config.rotary_pct == 0.5 and config.rotary_dims == 6 and config.parallel_residual
    want = hf_logits(model, tokens[..., :-1])
    assert (logits_of(cm.build_neox(config, weights, tokens)) - want).abs().max().item() < 1e-5
    for wrong in (dict(rotary_pct=1.0), dict(rotary_pct=1 / 3), dict(parallel_residual=False)):
        built = cm.build_neox(dataclasses.replace(config, **wrong), weights, tokens)
        assert (logits_of(built) - want).abs().max().item() > 1e-2, wrong


def test_pythia_style_checkpoint(tmp_path):
    """A Pythia hub checkpoint spells the rotary fields ``rotary_pct``/``rotary_emb_base`` and
    the unembedding ``embed_out``: the same circuit."""
    from safetensors.torch import save_file

    model = neox()
    tokens = tokens_for(True)
    config = model.config.to_dict()
    del config["rope_parameters"]
    config.update(rotary_pct=0.5, rotary_emb_base=1000)
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["embed_out.weight"] = state.pop("lm_head.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    assert cm.load_hf_checkpoint(tmp_path, tokens) == cm.from_hf(model, tokens)


@pytest.mark.parametrize(
    "change,match",
    [
        (
            dict(rope_parameters={"rope_type": "linear", "factor": 2.0}),
            "'rope_parameters' asks for the rotary variant 'linear'",
        ),
        (dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25}), "rotary_pct=0.25"),
        (dict(hidden_act="gelu_fast"), "activation 'gelu_fast'"),
        (dict(rope_parameters=None, rope_scaling={"type": "dynamic"}), "'rope_scaling' asks for .*'dynamic'"),
        (dict(use_parallel_residual="yes"), "'use_parallel_residual' is 'yes'"),
        (dict(head_dim=8), "'head_dim' 8 is not"),
    ],
)
def test_unsupported_configs_name_the_field(change, match):
    """Refused, naming the field: a scaled rotary variant, an odd number
    of rotated dims (0.25 of 12 is 3), an activation the builders lack, a flag of the wrong kind,
    a ``head_dim`` other than the head size (transformers' rotary would read it, its attention not)."""
    model = neox()
    config = dict(model.config.to_dict(), **change)
    with pytest.raises(ModelError, match=match):
        cm.from_hf_state_dict(config, model.state_dict(), tokens_for(False))


def test_attached_gradients_equal_hugging_face_backward():
    """With ``attach=True`` the fused ``query_key_value`` and ``dense`` views pass the gradient
    back to the model's parameters, equal to its own backward."""
    model = neox(parallel=False).to(torch.float64)
    tokens = tokens_for(True)
    logits = model(input_ids=tokens[:, :-1]).logits  # (its own loss is computed in float32)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    want = torch.autograd.grad(loss, list(model.parameters()))
    circuit = cm.from_hf(model, tokens, attach=True)
    got = torch.autograd.grad(cc.evaluate(circuit).mean(), list(model.parameters()))
    for (name, _), g, w in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10, msg=name)
