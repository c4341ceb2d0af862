"""splice_sae and the feature analyses against a tiny Hugging Face GPT-2 with the SAE hooked in by
hand (plain torch written here: the reference), and against the unspliced circuit."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits.errors import SAEError
from circuits.experiments.sae import (
    feature_attribution,
    feature_logit_attrs,
    feature_patching,
    feature_values,
    sae_names,
    splice_sae,
    splice_saes,
)
from circuits.models.sae import SAE
from circuits.transformer import names
from circuits.transformer.points import Point
from factories import gpt2, gpt2_circuit

D, M = 32, 24  # factories.gpt2(): width 32


def random_sae(architecture: str, hook: str, seed: int = 0, d: int = D, **extra) -> SAE:
    g = torch.Generator().manual_seed(seed)
    tensors = dict(
        W_enc=torch.randn(d, M, generator=g) / d**0.5,
        b_enc=torch.randn(M, generator=g) * 0.1,
        W_dec=torch.randn(M, d, generator=g) / M**0.5,
        b_dec=torch.randn(d, generator=g) * 0.1,
    )
    if architecture == "jumprelu":
        extra["threshold"] = torch.rand(M, generator=g) * 0.2
    if architecture == "topk":
        extra.setdefault("k", 5)
    return SAE(architecture, **tensors, hook_name=hook, **extra)


def reference_encode(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """SAELens's arithmetic, written out: (x - b_dec) @ W_enc + b_enc, then the activation."""
    x = x.to(sae.W_enc.dtype)
    pre = (x - sae.b_dec if sae.apply_b_dec_to_input else x) @ sae.W_enc + sae.b_enc
    if sae.architecture == "topk":
        values, indices = pre.topk(sae.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, indices, values.clamp(min=0))
    acts = pre.clamp(min=0)
    return acts * (pre > sae.threshold) if sae.threshold is not None else acts


def reference_decode(sae: SAE, acts: torch.Tensor) -> torch.Tensor:
    return acts @ sae.W_dec + sae.b_dec


@pytest.fixture(scope="module")
def model():
    return gpt2()


TOKENS = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(3))
CORRUPTED = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(4))


def logits_circuit(model, tokens=TOKENS) -> cc.Circuit:
    return cm.from_hf(model, tokens).get_unique(names.LOGITS)


def hooked_logits(model, tokens, edit_block_input=None, edit_mlp=None):
    """HF logits with layer 1's input (resid_pre 1) and/or layer 0's MLP output edited by hooks."""
    handles = []
    if edit_block_input is not None:

        def pre_hook(module, args, kwargs):
            return (edit_block_input(args[0]),) + args[1:], kwargs

        handles.append(model.transformer.h[1].register_forward_pre_hook(pre_hook, with_kwargs=True))
    if edit_mlp is not None:
        handles.append(model.transformer.h[0].mlp.register_forward_hook(lambda m, a, out: edit_mlp(out)))
    try:
        return model(input_ids=tokens[:, :-1]).logits
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize(
    "architecture,kind,layer",
    [
        ("standard", "resid_pre", 1),
        ("jumprelu", "mlp_out", 0),
        ("topk", "attn_out", 1),
        ("standard", "resid_mid", 0),
    ],
)
def test_splice_with_error_keeps_the_value(architecture, kind, layer):
    tokens = torch.randint(0, 17, (2, 6), generator=torch.Generator().manual_seed(0))
    circuit = gpt2_circuit(tokens)
    sae = random_sae(architecture, f"blocks.{layer}.hook_{kind}", d=12)
    spliced = splice_sae(circuit, sae)
    assert spliced.get_unique(sae_names(Point(kind, layer)).acts).shape[-1] == M
    torch.testing.assert_close(spliced.evaluate(), circuit.evaluate(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        spliced.evaluate(dtype=torch.float64), circuit.evaluate(dtype=torch.float64), atol=1e-12, rtol=1e-12
    )
    # the point still finds the (spliced) node, and its value is the original activation
    before = cc.experiments.run_with_cache(circuit, [Point(kind, layer)])[Point(kind, layer)]
    after = cc.experiments.run_with_cache(spliced, [Point(kind, layer)])[Point(kind, layer)]
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_splice_without_error_is_the_sae_substituted_model(model, architecture):
    sae = random_sae(architecture, "blocks.1.hook_resid_pre", seed=1)
    spliced = splice_sae(logits_circuit(model), sae, error=False)
    expected = hooked_logits(model, TOKENS, lambda h: reference_decode(sae, reference_encode(sae, h)))
    torch.testing.assert_close(spliced.evaluate(), expected, atol=1e-5, rtol=1e-5)
    assert not spliced.are_any_found(sae_names(("resid_pre", 1)).error)


def test_several_saes_at_once(model):
    first = random_sae("jumprelu", "blocks.0.hook_mlp_out", seed=2)
    second = random_sae("standard", "blocks.1.hook_resid_pre", seed=3)
    spliced = splice_saes(logits_circuit(model), [first, second], error=False)
    expected = hooked_logits(
        model,
        TOKENS,
        edit_block_input=lambda h: reference_decode(second, reference_encode(second, h)),
        edit_mlp=lambda out: reference_decode(first, reference_encode(first, out)),
    )
    torch.testing.assert_close(spliced.evaluate(), expected, atol=1e-5, rtol=1e-5)
    kept = splice_saes(logits_circuit(model), [(first, Point("mlp_out", 0)), second])
    torch.testing.assert_close(kept.evaluate(), hf_plain(model), atol=1e-5, rtol=1e-5)


def hf_plain(model):
    with torch.no_grad():
        return model(input_ids=TOKENS[:, :-1]).logits


def resid_pre1(model, tokens=TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens[:, :-1], output_hidden_states=True).hidden_states[1]


def test_feature_values_are_the_encoding_of_the_activation(model):
    sae = random_sae("standard", "blocks.1.hook_resid_pre", seed=4)
    values = feature_values(splice_sae(logits_circuit(model), sae), [("resid_pre", 1)])
    names_ = sae_names(("resid_pre", 1))
    h = resid_pre1(model)
    acts = reference_encode(sae, h)
    assert (acts > 0).any() and (acts == 0).any()
    torch.testing.assert_close(values[names_.acts], acts, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values[names_.recon], reference_decode(sae, acts), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values[names_.error], h - reference_decode(sae, acts), atol=1e-5, rtol=1e-5)


def edited_features(sae: SAE, edit):
    """resid_pre 1 as the spliced model computes it after editing the features: decode of the
    edited features plus the error of the unedited ones (held fixed, as SAELens's error term)."""

    def hook(h):
        acts = reference_encode(sae, h)
        return reference_decode(sae, edit(acts.clone())) + (h - reference_decode(sae, acts))

    return hook


def test_ablating_and_steering_a_feature_is_one_update(model):
    sae = random_sae("standard", "blocks.1.hook_resid_pre", seed=5)
    spliced = splice_sae(logits_circuit(model), sae)
    acts_name, k = sae_names(("resid_pre", 1)).acts, 7
    keep = torch.ones(M)
    keep[k] = 0
    ablated = spliced.update(
        acts_name, lambda a: cc.Einsum.from_einsum_string("...f,f->...f", a, cc.Array(keep))
    )

    def zero(acts):
        acts[..., k] = 0
        return acts

    torch.testing.assert_close(
        ablated.evaluate(), hooked_logits(model, TOKENS, edited_features(sae, zero)), atol=1e-5, rtol=1e-5
    )
    push = torch.zeros(M)
    push[k] = 4.0
    steered = spliced.update(acts_name, lambda a: cc.Add(a, cc.Array(push)))

    def steer(acts):
        acts[..., k] += 4.0
        return acts

    torch.testing.assert_close(
        steered.evaluate(), hooked_logits(model, TOKENS, edited_features(sae, steer)), atol=1e-5, rtol=1e-5
    )
    assert (steered.evaluate() - spliced.evaluate()).abs().max() > 1e-2


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 3] - logits[:, -1, 5]).sum()


def test_feature_patching_and_attribution_against_hooks(model):
    sae = random_sae("standard", "blocks.1.hook_resid_pre", seed=6)
    spliced = splice_sae(logits_circuit(model), sae)
    inputs = {"toks_int_var": CORRUPTED}
    patched = feature_patching(spliced, ("resid_pre", 1), logit_diff, corrupted_inputs=inputs)
    clean_acts = reference_encode(sae, resid_pre1(model))
    expected = []
    for k in range(M):

        def put(acts, k=k):
            acts[..., k] = clean_acts[..., k]
            return acts

        expected.append(logit_diff(hooked_logits(model, CORRUPTED, edited_features(sae, put))))
    torch.testing.assert_close(patched, torch.stack(expected).detach(), atol=1e-4, rtol=1e-5)
    assert patched.std() > 1e-3

    attributed = feature_attribution(spliced, ("resid_pre", 1), logit_diff, corrupted_inputs=inputs)
    corrupted_acts = reference_encode(sae, resid_pre1(model, CORRUPTED))
    leaf = corrupted_acts.clone().requires_grad_(True)

    def from_leaf(h):
        return reference_decode(sae, leaf) + (h - reference_decode(sae, reference_encode(sae, h))).detach()

    metric = logit_diff(hooked_logits(model, CORRUPTED, from_leaf))
    (gradient,) = torch.autograd.grad(metric, leaf)
    torch.testing.assert_close(attributed, (clean_acts - corrupted_acts) * gradient, atol=1e-5, rtol=1e-4)


def test_feature_logit_attrs_through_the_decoder(model):
    sae = random_sae("standard", "blocks.1.hook_resid_pre", seed=7)
    spliced = splice_sae(cm.from_hf(model, TOKENS), sae)
    tokens = torch.tensor([3, 5])
    attrs = feature_logit_attrs(spliced, ("resid_pre", 1), tokens, pos_slice=-1)
    acts = reference_encode(sae, resid_pre1(model))[:, -1]  # [batch, feature]
    written = acts[..., None] * sae.W_dec  # [batch, feature, d]
    hidden = _resid_final(model)[:, -1]  # [batch, d]
    scale = 1 / (hidden.var(-1, unbiased=False, keepdim=True) + model.config.layer_norm_epsilon).sqrt()
    centered = written - written.mean(-1, keepdim=True)
    direction = model.transformer.ln_f.weight * model.lm_head.weight[tokens]  # [batch, d]
    expected = torch.einsum("bfd,bd->fb", centered * scale[:, None], direction)
    torch.testing.assert_close(attrs, expected.detach(), atol=1e-5, rtol=1e-5)


def _resid_final(model) -> torch.Tensor:
    captured = {}
    handle = model.transformer.ln_f.register_forward_pre_hook(lambda m, a: captured.setdefault("x", a[0]))
    try:
        with torch.no_grad():
            model(input_ids=TOKENS[:, :-1])
    finally:
        handle.remove()
    return captured["x"]


def test_refusals():
    circuit = gpt2_circuit(torch.randint(0, 17, (1, 5)))
    wide = random_sae("standard", "blocks.1.hook_resid_pre", d=D)
    with pytest.raises(SAEError) as caught:
        splice_sae(circuit, wide)
    assert caught.value.field == "d_in"
    sae = random_sae("standard", "blocks.1.hook_resid_pre", d=12)
    with pytest.raises(SAEError, match="already spliced"):
        splice_sae(splice_sae(circuit, sae), sae)
    with pytest.raises(SAEError) as caught:
        splice_sae(circuit, random_sae("standard", "blocks.1.hook_something", d=12))
    assert caught.value.field == "hook_name"
    with pytest.raises(SAEError, match="not a circuits.models.sae.SAE"):
        splice_sae(circuit, object())
