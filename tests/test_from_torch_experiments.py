"""Experiments on an imported model: patching and a head ablation by module-path names.

The reference is the Hugging Face model itself with a forward hook (the patched
module's output taken from the corrupted run) or a forward pre-hook (one head's
slice of the output projection's input zeroed), as a user of hooks would do it.
"""

from __future__ import annotations

import factories
import pytest
import torch

transformers = pytest.importorskip("transformers")

import circuits as cc  # noqa: E402
from circuits import experiments as ex  # noqa: E402
from circuits import models  # noqa: E402

transformers.logging.set_verbosity_error()
TOL = dict(atol=1e-5, rtol=1e-5)
HEADS, D_HEAD = 3, 5


@pytest.fixture(scope="module")
def gpt2():
    model = factories.gpt2(seed=11, n_embd=HEADS * D_HEAD, n_head=HEADS, vocab_size=41, n_positions=19)
    generator = torch.Generator().manual_seed(4)
    clean = torch.randint(0, 41, (2, 7), generator=generator)
    corrupt = torch.randint(0, 41, (2, 7), generator=generator)
    return model, clean, corrupt, models.from_torch(model, (clean,), strict=True)


def _logits_with_hook(model, tokens, module, hook, pre=False):
    handle = module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(tokens).logits
    finally:
        handle.remove()


def test_patching_an_mlp_output_from_the_corrupted_run_equals_a_hooked_model(gpt2):
    model, clean, corrupt, circuit = gpt2
    mlp = model.transformer.h[0].mlp
    with torch.no_grad():
        stored = {}
        handle = mlp.register_forward_hook(lambda m, i, out: stored.setdefault("out", out.clone()))
        model(corrupt)
        handle.remove()
    expected = _logits_with_hook(model, clean, mlp, lambda m, i, out: stored["out"])

    patched = ex.patch(circuit, "transformer.h.0.mlp.c_proj.view_1", {"input_ids": corrupt})
    torch.testing.assert_close(patched.evaluate(), expected, **TOL)
    assert not torch.allclose(patched.evaluate(), circuit.evaluate(), atol=1e-3)  # the patch matters


def test_zeroing_one_head_equals_zeroing_its_slice_of_c_proj_input(gpt2):
    model, clean, _, circuit = gpt2
    head = 1

    def zero_head(module, args):
        (x,) = args
        x = x.clone()
        x[..., head * D_HEAD : (head + 1) * D_HEAD] = 0
        return (x,)

    expected = _logits_with_hook(model, clean, model.transformer.h[1].attn.c_proj, zero_head, pre=True)

    keep = torch.ones(HEADS)
    keep[head] = 0
    attention = "transformer.h.1.attn.scaled_dot_product_attention"
    ablated = circuit.update(
        attention,
        lambda node: cc.Einsum.from_einsum_string(
            "bhsd,h->bhsd", node, cc.Array(keep, name="keep"), name=node.name
        ),
    )
    torch.testing.assert_close(ablated.evaluate(), expected, **TOL)
    assert not torch.allclose(ablated.evaluate(), circuit.evaluate(), atol=1e-3)


def test_split_heads_with_split_to_concat_then_patch_one_head(gpt2):
    """An imported attention split into one named node per head, and one head patched from the corrupted run."""
    model, clean, corrupt, circuit = gpt2
    c_proj = model.transformer.h[1].attn.c_proj
    head = slice(1 * D_HEAD, 2 * D_HEAD)
    stored = {}
    handle = c_proj.register_forward_pre_hook(lambda m, args: stored.setdefault("z", args[0].clone()))
    with torch.no_grad():
        model(corrupt)
    handle.remove()

    def patch_head(module, args):
        (x,) = args
        x = x.clone()
        x[..., head] = stored["z"][..., head]
        return (x,)

    expected = _logits_with_hook(model, clean, c_proj, patch_head, pre=True)

    attention = "transformer.h.1.attn.scaled_dot_product_attention"
    names = [f"L1H{h}" for h in range(HEADS)]
    split = circuit.update(attention, lambda node: cc.passes.split_to_concat(node, 1, 1, names=names))
    torch.testing.assert_close(split.evaluate(), circuit.evaluate(), atol=0, rtol=0)
    patched = ex.patch(split, "L1H1", {"input_ids": corrupt})
    torch.testing.assert_close(patched.evaluate(), expected, **TOL)
    assert not torch.allclose(patched.evaluate(), circuit.evaluate(), atol=1e-3)
