"""``attach=True``: weight arrays are views of the model's parameters, and gradients reach them.

The full per-parameter comparison against Hugging Face's backward is
``circuits.cli.parity`` (tests/test_parity.py); here: no copies, tied
embeddings, the TransformerLens loader and the builders, and the caveat that
an optimizer step makes an attached circuit stale.
"""

from __future__ import annotations

import functools

import factories
import pytest
import torch
import torch.nn.functional as F

import circuits as cc
import circuits.models as cm
from factories import transformer_lens_state

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 37


#: a small GPT-2 (in float64) and Llama, with a larger init than their configs'
gpt2 = functools.partial(
    factories.gpt2,
    dtype=torch.float64,
    n_head=2,
    n_embd=16,
    vocab_size=VOCAB,
    n_positions=16,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    initializer_range=0.2,
)
llama = functools.partial(
    factories.llama,
    hidden_size=16,
    intermediate_size=24,
    vocab_size=VOCAB,
    max_position_embeddings=32,
    initializer_range=0.2,
)


def tokens():
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))


def weight_arrays(circuit):
    return [n for n in cc.unique_nodes([circuit]) if isinstance(n, cc.Array) and ".w." in n.name]


def hf_grads(model, toks):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=toks[:, :-1]).logits
    F.cross_entropy(logits.reshape(-1, VOCAB), toks[:, 1:].reshape(-1)).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize(
    "make", [lambda: gpt2(True), lambda: gpt2(False), llama], ids=["gpt2-tied", "gpt2", "llama"]
)
def test_attached_arrays_are_views_of_parameters(make):
    model = make()
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    attached = weight_arrays(cm.from_hf(model, tokens(), attach=True))
    assert attached and all(a.value.untyped_storage().data_ptr() in storages for a in attached)
    assert all(a.value.requires_grad for a in attached)
    copied = weight_arrays(cm.from_hf(model, tokens()))
    assert not any(a.value.untyped_storage().data_ptr() in storages or a.value.requires_grad for a in copied)


def test_tied_embedding_gets_both_gradients():
    model, toks = gpt2(True), tokens()
    circuit = cm.from_hf(model, toks, attach=True)
    names = {
        a.name
        for a in weight_arrays(circuit)
        if a.value.data_ptr() == model.transformer.wte.weight.data_ptr()
    }
    assert names == {"t.w.tok_embeds", "t.w.unembed"}
    cc.evaluate(circuit).mean().backward()
    ours = model.transformer.wte.weight.grad.clone()
    want = hf_grads(model, toks)["transformer.wte.weight"]
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-12)
    # the unembedding's part alone would differ: the embedding's part is there too
    unembed_only = cm.from_hf(model, toks).update(
        "t.w.unembed", lambda n: cc.Array(model.transformer.wte.weight, name=n.name)
    )
    model.zero_grad(set_to_none=True)
    cc.evaluate(unembed_only).mean().backward()
    assert (model.transformer.wte.weight.grad - want).abs().max() > 1e-6


@pytest.mark.parametrize("tied", [True, False])
def test_transformer_lens_attached(tied):
    model, toks = gpt2(tied), tokens()
    circuit = cm.from_transformer_lens(
        transformer_lens_state(model, detach=False), toks, family="gpt2", attach=True
    )
    cc.evaluate(circuit).mean().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}
    for name, want in hf_grads(model, toks).items():
        torch.testing.assert_close(ours[name], want, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize("family", ["gpt2", "llama", "attn_only"])
def test_builders_attach(family):
    config, random_weights, build = {
        "gpt2": (cm.GPT2Config(1, 2, 8, VOCAB, 16), cm.gpt2_random_weights, cm.build_gpt2),
        "llama": (cm.LlamaConfig(1, 2, 8, 8, VOCAB), cm.llama_random_weights, cm.build_llama),
        "attn_only": (
            cm.AttnOnlyConfig(1, 2, 8, 4, VOCAB, 16),
            cm.attn_only_random_weights,
            cm.build_attn_only,
        ),
    }[family]
    weights = {k: v.requires_grad_() for k, v in random_weights(config, dtype=torch.float64).items()}
    assert not cc.evaluate(build(config, weights, tokens())).requires_grad
    cc.evaluate(build(config, weights, tokens(), attach=True)).mean().backward()
    assert all(w.grad is not None and w.grad.abs().max() > 0 for w in weights.values())


def test_an_optimizer_step_makes_an_attached_circuit_stale():
    model, toks = llama(), tokens()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    circuit = cm.from_hf(model, toks, attach=True)
    cc.evaluate(circuit).mean().backward()
    optimizer.step()
    with pytest.raises(cc.errors.StaleTensorError):
        cc.evaluate(circuit)
    rebuilt = cc.evaluate(cm.from_hf(model, toks, attach=True)).mean()
    with torch.no_grad():
        logits = model(input_ids=toks[:, :-1]).logits
    want = F.cross_entropy(logits.reshape(-1, VOCAB), toks[:, 1:].reshape(-1))
    assert abs(rebuilt.item() - want.item()) < 1e-5


def test_without_attach_the_circuit_keeps_its_copy():
    model, toks = llama(), tokens()
    circuit = cm.from_hf(model, toks)
    before = cc.evaluate(circuit).clone()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    torch.testing.assert_close(cc.evaluate(circuit), before, rtol=0, atol=0)
