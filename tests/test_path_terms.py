"""``ex.path_terms``: the logits at one position as an Add of one node per direct path.

Checked on a GPT-2 of odd dims (position embeddings, attention and MLP biases, layer norm), on a
Hugging Face GPT-2 of odd dims against its own forward and hooks, on the shipped attention-only
demo model and on a small Llama (RMSNorm, grouped heads): the terms sum to the logits, each term
read at the answer token is direct logit attribution's component, the embedding and a head term
match plain torch, terms evaluate and ablate as nodes, and bad input is refused by name.
"""

from __future__ import annotations

import factories
import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.errors import ExperimentError
from circuits.models.demo_model import load_demo_model, repeated_tokens
from circuits.transformer.points import Point

TOL = 1e-5
CONFIG = factories.gpt2_config()  # 2 layers of 3 heads, width 12, vocabulary 17


def gpt2() -> cc.Circuit:
    tokens = factories.token_ids(17, (3, 9), seed=5)  # batch 3, 8 positions
    return factories.gpt2_circuit(tokens, CONFIG, seed=2)


def demo() -> cc.Circuit:
    return cc.passes.causal_mask(load_demo_model(repeated_tokens(4, 8)))


def llama() -> cc.Circuit:
    """RMSNorm (no centring, no norm bias) and grouped key/value heads."""
    tokens = torch.tensor([[1, 5, 2, 7], [3, 3, 0, 9]])
    return factories.llama_circuit(tokens, seed=1, causal=True)


MODELS = {"gpt2": gpt2, "demo": demo, "llama": llama}


def logits_at(circuit: cc.Circuit, pos: int) -> torch.Tensor:
    return circuit.get_unique(Point("logits")).evaluate()[:, pos]


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("pos", [-1, 0])
def test_terms_sum_to_the_logits(model, pos):
    circuit = MODELS[model]()
    result = ex.path_terms(circuit, pos)
    assert result.terms.name == "path_terms"
    assert [child.name for child in result.terms.children] == [f"path.{x}" for x in result.labels]
    torch.testing.assert_close(result.terms.evaluate(), logits_at(circuit, pos), atol=TOL, rtol=0)


def test_labels_cover_every_direct_path():
    labels = ex.path_terms(gpt2()).labels
    heads = [f"L{layer}H{head}" for layer in range(2) for head in range(3)]
    assert labels == ["embed", "pos_embed", *heads[:3], "0_attn_bias", "0_mlp_out"] + [
        *heads[3:],
        "1_attn_bias",
        "1_mlp_out",
        "bias",
    ]
    assert ex.path_terms(demo()).labels == [
        "embed",
        *[f"L{l}H{h}" for l in range(2) for h in range(4)],
        "bias",
    ]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_term_is_its_direct_logit_attribution(model):
    circuit = MODELS[model]()
    result = ex.path_terms(circuit, -1)
    answers = logits_at(circuit, -1).argmax(-1)
    dla = ex.direct_logit_attribution(circuit, answers, pos=-1)
    assert dla.labels == result.labels
    rows = torch.arange(answers.shape[0])
    for label, values in zip(dla.labels, dla.values):
        term = result.terms.get_unique(f"path.{label}").evaluate()
        torch.testing.assert_close(term[rows, answers], values, atol=TOL, rtol=0)


def test_the_embedding_term_by_hand():
    circuit = demo()
    tokens = circuit.get_unique("input_toks_int").evaluate()  # the inputs: the last token is a target
    w = {n: circuit.get_unique(n).evaluate() for n in ("t.w.tok_embeds", "t.w.unembed", "final.ln.w.scale")}
    scale = circuit.get_unique(Point("ln_final_scale")).evaluate()[:, -1]
    rows = w["t.w.tok_embeds"][tokens[:, -1]]
    centred = rows - rows.mean(-1, keepdim=True)
    expected = (centred * scale[:, None] * w["final.ln.w.scale"]) @ w["t.w.unembed"].T
    term = ex.path_terms(circuit).terms.get_unique("path.embed").evaluate()
    torch.testing.assert_close(term, expected, atol=TOL, rtol=0)


def hf_gpt2():
    """A Hugging Face GPT-2 of odd dims, every parameter perturbed (its init sets the norms to 1
    and biases to 0, which would hide their terms), and its circuit."""
    model = factories.gpt2(
        perturb=factories.shifted(0.1),
        n_head=3,
        n_embd=15,
        vocab_size=19,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        initializer_range=0.2,
    )
    toks = torch.randint(0, 19, (3, 9), generator=torch.Generator().manual_seed(6))
    return model, toks, cm.from_hf(model, toks)


def test_hugging_face_gpt2_terms_sum_to_its_own_logits_and_a_head_term_by_hand():
    """The independent reference is the model's own forward: its logits, and head 1.2's output
    read from the input of its output projection (hooks), frozen-normed and unembedded in torch."""
    model, toks, circuit = hf_gpt2()
    captured = {}
    attn, final_norm = model.transformer.h[1].attn, model.transformer.ln_f
    hooks = [
        attn.c_proj.register_forward_hook(lambda m, args, out: captured.update(z=args[0])),
        final_norm.register_forward_hook(lambda m, args, out: captured.update(resid=args[0])),
    ]
    with torch.no_grad():
        logits = model(toks[:, :-1]).logits[:, -1]
    for hook in hooks:
        hook.remove()
    for order in (1, 2):
        result = ex.path_terms(circuit, pos=-1, order=order)
        torch.testing.assert_close(result.terms.evaluate(), logits, atol=TOL, rtol=0)
    d_head = 5
    rows = slice(2 * d_head, 3 * d_head)  # head 2's part of the merged heads and of c_proj's input
    head = captured["z"][:, -1, rows] @ attn.c_proj.weight[rows]  # Conv1D: weight [in, out]
    resid = captured["resid"][:, -1]
    scale = 1 / torch.sqrt(resid.var(-1, unbiased=False, keepdim=True) + final_norm.eps)
    centred = head - head.mean(-1, keepdim=True)
    expected = (centred * scale * final_norm.weight) @ model.lm_head.weight.T
    term = ex.path_terms(circuit, pos=-1).terms.get_unique("path.L1H2").evaluate()
    torch.testing.assert_close(term, expected.detach(), atol=TOL, rtol=0)


def test_a_term_evaluates_and_ablates():
    result = ex.path_terms(gpt2())
    total = result.terms.evaluate()
    head = result.terms.get_unique("path.L1H2").evaluate()
    ablated = ex.zero_ablate(result.terms, "path.L1H2").evaluate()
    torch.testing.assert_close(ablated, total - head, atol=TOL, rtol=0)
    assert "path.L1H2" in str(result.terms.get_unique("path.L1H2").describe())


def test_bad_input_is_refused_by_name():
    circuit = gpt2()
    with pytest.raises(ExperimentError, match="logits"):
        ex.path_terms(circuit.get_unique("final.call"))
    with pytest.raises(ExperimentError, match="pos=8"):
        ex.path_terms(circuit, 8)
    with pytest.raises(ExperimentError, match="pos='x'"):
        ex.path_terms(circuit, "x")
    with pytest.raises(ExperimentError):
        ex.path_terms("not a circuit")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_terms_of_chosen_tokens_are_those_columns_of_the_full_terms(model):
    circuit = MODELS[model]()
    chosen = [5, 0, 7]
    full, some = ex.path_terms(circuit, order=2), ex.path_terms(circuit, order=2, tokens=chosen)
    assert some.terms.shape == (full.terms.shape[0], 3) and some.labels == full.labels
    for child, whole in zip(some.terms.children, full.terms.children):
        torch.testing.assert_close(child.evaluate(), whole.evaluate()[:, chosen], atol=TOL, rtol=0)
    torch.testing.assert_close(some.terms.evaluate(), logits_at(circuit, -1)[:, chosen], atol=TOL, rtol=0)


@pytest.mark.parametrize("tokens", [[], [1.5], [[1]], [-1], [17], "ab"])
def test_bad_tokens_are_refused_by_name(tokens):
    with pytest.raises(ExperimentError, match="tokens="):
        ex.path_terms(gpt2(), tokens=tokens)
    with pytest.raises(ExperimentError, match="layer="):
        ex.path_terms(gpt2(), tokens=[1], layer=1)
