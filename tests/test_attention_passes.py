"""causal_mask and split_heads: the golden rebuild, and values against plain torch."""

from __future__ import annotations

import re

import pytest
import torch

import circuits as cc
from circuits import models
from circuits.errors import PassError
from circuits.passes import causal_mask, push_down_index, split_heads

HEX = re.compile(r"Array [0-9a-f]{24}")


def test_golden_rebuild_from_the_builder(golden_text):
    """2 layers, 8 heads, d_model 256, d_head 32, vocab 50259, 302 tokens: mask, split, print."""
    config = models.AttnOnlyConfig(
        n_layers=2, n_heads=8, d_model=256, d_head=32, vocab_size=50259, n_ctx=2048
    )
    weights = models.attn_only_random_weights(config, seed=1)
    tokens = torch.randint(0, config.vocab_size, (302,), generator=torch.Generator().manual_seed(2))
    unsplit = models.build_attn_only(
        config, weights, tokens, convention="golden", causal=False
    )  # the pass masks
    rebuilt = split_heads(causal_mask(unsplit)).repr()
    assert HEX.sub("Array X", rebuilt).split("\n") == HEX.sub("Array X", golden_text).split("\n")


# --------------------------------------------------------------- plain torch

SMALL = models.AttnOnlyConfig(n_layers=2, n_heads=3, d_model=8, d_head=4, vocab_size=11, n_ctx=12)


def small_model(seed: int = 0, batch: int | None = None):
    weights = models.attn_only_random_weights(SMALL, seed=seed, dtype=torch.float64)
    shape = (7,) if batch is None else (batch, 7)
    tokens = torch.randint(0, SMALL.vocab_size, shape, generator=torch.Generator().manual_seed(seed))
    return weights, tokens, models.build_attn_only(SMALL, weights, tokens, causal=False)  # the passes mask it


def layer_norm(x, scale, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * scale + bias


def reference_loss(w, tokens, masks):
    """The attention-only model written directly; ``masks[layer]`` is [heads, q, k] of 0/1."""
    inputs, targets = tokens[:-1], tokens[1:]
    seq = inputs.shape[0]
    resid = w["t.w.tok_embeds"][inputs]
    pos = w["t.w.pos_embeds"][:seq]
    for layer in range(SMALL.n_layers):
        norm = layer_norm(resid, w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"])
        q = torch.einsum("qd,hcd->hqc", norm + pos, w[f"a{layer}.w.q"])
        k = torch.einsum("kd,hcd->hkc", norm + pos, w[f"a{layer}.w.k"])
        v = torch.einsum("kd,hcd->hkc", norm, w[f"a{layer}.w.v"])
        scores = q @ k.transpose(-1, -2) / SMALL.d_head**0.5
        scores = scores.masked_fill(masks[layer] == 0, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a fully masked row attends to nothing
        resid = resid + torch.einsum("hqc,hdc->qd", probs @ v, w[f"a{layer}.w.o"])
    final = layer_norm(resid, w["final.ln.w.scale"], w["final.ln.w.bias"])
    log_probs = torch.log_softmax(final @ w["t.w.unembed"].T, dim=-1)
    return -log_probs[torch.arange(seq), targets]


def test_causal_mask_matches_masked_attention_in_torch():
    weights, tokens, circuit = small_model()
    causal = torch.tril(torch.ones(7 - 1, 7 - 1)).expand(SMALL.n_heads, -1, -1)
    masked = causal_mask(circuit)
    torch.testing.assert_close(
        masked.evaluate(), reference_loss(weights, tokens, [causal] * 2), rtol=1e-10, atol=1e-10
    )
    unmasked = torch.ones_like(causal)
    torch.testing.assert_close(
        circuit.evaluate(), reference_loss(weights, tokens, [unmasked] * 2), rtol=1e-10, atol=1e-10
    )
    assert len(masked.get("a.attn_scores_raw")) == 2 and len(masked.get("t.a.c.causal_mask")) == 1


def test_knockout_masks_per_layer_and_head():
    weights, tokens, circuit = small_model(seed=3)
    seq = 6

    def knockout(layer: int, head: int) -> torch.Tensor:
        mask = torch.tril(torch.ones(seq, seq))
        if layer == 1 and head == 2:
            mask[:, 0] = 0  # head 1.2 may not look at the first token
            mask[0, 0] = 1
        return mask

    masks = [torch.stack([knockout(layer, h) for h in range(SMALL.n_heads)]) for layer in range(2)]
    knocked = causal_mask(circuit, mask=knockout)
    torch.testing.assert_close(
        knocked.evaluate(), reference_loss(weights, tokens, masks), rtol=1e-10, atol=1e-10
    )
    # masking again replaces the mask: back to plain causal
    again = causal_mask(knocked)
    causal = torch.tril(torch.ones(seq, seq)).expand(SMALL.n_heads, -1, -1)
    torch.testing.assert_close(
        again.evaluate(), reference_loss(weights, tokens, [causal] * 2), rtol=1e-10, atol=1e-10
    )


def test_bad_masks_are_clear_errors():
    _, _, circuit = small_model()
    with pytest.raises(PassError, match=r"shape \[5, 5\], expected \[6, 6\]"):
        causal_mask(circuit, mask=torch.ones(5, 5))
    with pytest.raises(PassError, match="0 or 1"):
        causal_mask(circuit, mask=torch.full((6, 6), 0.5))
    with pytest.raises(PassError, match="no 'a.attn_scores'"):
        causal_mask(cc.Array(torch.ones(2), name="x"))


# ----------------------------------------------------------------- splitting


def test_split_heads_keeps_the_loss_and_names_branches():
    _, _, circuit = small_model(seed=5)
    masked = causal_mask(circuit)
    split = split_heads(masked)
    torch.testing.assert_close(split.evaluate(), masked.evaluate(), rtol=1e-10, atol=1e-10)
    assert [c.name for c in split.get_unique("b1.a").children] == ["b1.a.head0", "b1.a.head1", "b1.a.head2"]
    assert split.get_unique("a0.w.q.head2").index[0] == 2


def test_split_heads_groups_and_layers():
    _, _, circuit = small_model(seed=6)
    masked = causal_mask(circuit)
    grouped = split_heads(masked, layers=[1], heads=[[0, 1], [2]])
    torch.testing.assert_close(grouped.evaluate(), masked.evaluate(), rtol=1e-10, atol=1e-10)
    assert [c.name for c in grouped.get_unique("b1.a").children] == ["b1.a.head0-1", "b1.a.head2"]
    assert grouped.get_unique("b0.a").kind == "Einsum"  # layer 0 left unsplit
    with pytest.raises(PassError, match="cover each exactly once"):
        split_heads(masked, heads=[[0, 1]])
    with pytest.raises(PassError, match="not a contiguous range"):
        split_heads(masked, heads=[[0, 2], [1]])
    with pytest.raises(PassError, match="layer 4"):
        split_heads(masked, layers=[4])


def test_zeroing_one_split_head_matches_torch():
    weights, tokens, circuit = small_model(seed=7)
    split = split_heads(causal_mask(circuit))
    ablated = split.update("b0.a.head1", lambda n: cc.Scalar(0.0, shape=n.shape))
    zeroed = dict(weights)
    zeroed["a0.w.o"] = weights["a0.w.o"].clone()
    zeroed["a0.w.o"][1] = 0
    causal = torch.tril(torch.ones(6, 6)).expand(SMALL.n_heads, -1, -1)
    torch.testing.assert_close(
        ablated.evaluate(), reference_loss(zeroed, tokens, [causal] * 2), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_split_heads_and_push_down_on_other_families(family):
    if family == "gpt2":
        config = models.GPT2Config(n_layers=2, n_heads=4, d_model=16, vocab_size=13, n_ctx=16)
        weights = models.gpt2_random_weights(config, seed=1, dtype=torch.float64)
        build = models.build_gpt2
    else:
        config = models.LlamaConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, vocab_size=13, d_mlp=24)
        weights = models.llama_random_weights(config, seed=1, dtype=torch.float64)
        build = models.build_llama
    tokens = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(1))
    circuit = build(config, weights, tokens)
    full = circuit.evaluate()
    split = split_heads(circuit)
    torch.testing.assert_close(split.evaluate(), full, rtol=1e-9, atol=1e-9)
    assert len(split.get_unique("b1.a").children) == 4
    at_one = push_down_index(cc.Index(circuit, (1, 4), name="loss@1,4"))
    torch.testing.assert_close(at_one.evaluate(), full[1, 4], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", ["attn_only", "gpt2", "llama"])
def test_simplify_and_masking_keep_each_family_within_float32_tolerance(family):
    from circuits.passes import simplify

    generator = torch.Generator().manual_seed(11)
    if family == "attn_only":
        circuit = causal_mask(
            models.build_attn_only(
                SMALL,
                models.attn_only_random_weights(SMALL, seed=2),
                torch.randint(0, 11, (3, 8), generator=generator),
            )
        )
    elif family == "gpt2":
        config = models.GPT2Config(
            n_layers=2, n_heads=4, d_model=16, vocab_size=13, n_ctx=16, tie_word_embeddings=False
        )
        circuit = models.build_gpt2(
            config,
            models.gpt2_random_weights(config, seed=2),
            torch.randint(0, 13, (3, 8), generator=generator),
        )
    else:
        config = models.LlamaConfig(n_layers=2, n_heads=4, n_kv_heads=1, d_model=16, vocab_size=13, d_mlp=24)
        circuit = models.build_llama(
            config,
            models.llama_random_weights(config, seed=2),
            torch.randint(0, 13, (3, 8), generator=generator),
        )
    expected = circuit.evaluate()
    for rewritten in (simplify(circuit), causal_mask(circuit), simplify(split_heads(circuit))):
        torch.testing.assert_close(rewritten.evaluate(), expected, rtol=1e-5, atol=1e-5)


def test_unsplit_head_counts_lists_unsplit_layers_with_a_head_axis():
    config = models.AttnOnlyConfig(n_layers=2, n_heads=3, d_model=8, d_head=4, vocab_size=11, n_ctx=12)
    circuit = models.build_attn_only(config, models.attn_only_random_weights(config, seed=0), torch.arange(7))
    assert cc.passes.unsplit_head_counts(circuit) == {0: 3, 1: 3}
    assert cc.passes.unsplit_head_counts(cc.passes.split_heads(circuit, layers=[0])) == {1: 3}
    x = cc.Array(torch.ones(2, 3), name="x")
    not_attention = cc.Einsum.from_einsum_string("ab->ab", x, name="b0.a")  # sums nothing: no heads
    assert cc.passes.unsplit_head_counts(not_attention) == {}
