"""The attention-only builder: golden-file structure, and numbers equal to plain torch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import circuits as cc
import circuits.models as cm
from experiments_reference import attn_only_transformer_lens_state

GOLDEN = Path(__file__).resolve().parent / "data" / "attn_only_2l.circ"
GOLDEN_DIMS = cm.AttnOnlyConfig(n_layers=2, n_heads=8, d_model=256, d_head=32, vocab_size=50259, n_ctx=2048)
SMALL = cm.AttnOnlyConfig(n_layers=2, n_heads=3, d_model=12, d_head=4, vocab_size=23, n_ctx=16)


# --------------------------------------------------------------- text helpers


def _masked(line: str) -> str:
    line = re.sub(r"Array [0-9a-f]{24}$", "Array <hash>", line)
    return re.sub(r"^(\s*)\d+ '", r"\1N '", line)  # serial numbers count head-split nodes in the golden file


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


_REFERENCE = re.compile(r"\s*(?:\d+ )?'((?:[^'\\]|\\.)*)'(.*)")


def _reference_name(line: str) -> str | None:
    match = _REFERENCE.match(line)
    return match.group(1) if match else None


def _is_full(line: str) -> bool:
    """A line that writes a node (not a repeat reference to one written before)."""
    match = _REFERENCE.match(line)
    return bool(match and match.group(2).strip())


def _drop_subtrees(lines: list[str], names: set[str]) -> list[str]:
    """The lines without the full subtrees of nodes named in ``names``."""
    out, skip_below = [], None
    for line in lines:
        if skip_below is not None and _indent(line) > skip_below:
            continue
        skip_below = None
        if _reference_name(line) in names and _is_full(line):
            skip_below = _indent(line)
            out.append(" " * skip_below + f"'{_reference_name(line)}' <dropped>")
            continue
        out.append(line)
    return out


def _subtree(lines: list[str], name: str) -> list[str]:
    """The first full subtree of the node called ``name``, de-indented."""
    for start, line in enumerate(lines):
        if _reference_name(line) == name and _is_full(line):
            base = _indent(line)
            block = [line]
            for following in lines[start + 1 :]:
                if _indent(following) <= base:
                    break
                block.append(following)
            return [b[base:] for b in block]
    raise AssertionError(f"no full subtree named {name!r}")


@pytest.fixture(scope="module")
def golden_build() -> cc.Circuit:
    weights = cm.attn_only_random_weights(GOLDEN_DIMS, seed=1)
    tokens = torch.randint(0, GOLDEN_DIMS.vocab_size, (302,), generator=torch.Generator().manual_seed(0))
    # the golden file is the unmasked build (the masks are written by cc.passes.causal_mask): causal=False
    return cm.build_attn_only(GOLDEN_DIMS, weights, tokens, convention="golden", causal=False)


def test_golden_skeleton_matches_outside_attention(golden_build):
    """From 't.loss' down to 'b1', the final layer norm and the loss head, as in the golden file."""
    golden = GOLDEN.read_text().split("\n")
    ours = golden_build.repr().split("\n")
    drop = {"b1.a"}  # heads and masks live inside it
    expected = [_masked(line) for line in _drop_subtrees(golden, drop)]
    got = [_masked(line) for line in _drop_subtrees(ours, drop)]
    assert got == expected


@pytest.mark.parametrize("name, inner", [("a0.norm", set()), ("a1.norm", {"b0.a"})])
def test_golden_layer_norms_and_embeddings_match(golden_build, name, inner):
    """Each layer's norm, the embeddings, tokens and positions are written as in the golden file."""
    golden = _subtree(GOLDEN.read_text().split("\n"), name)
    ours = _subtree(golden_build.repr().split("\n"), name)
    assert [_masked(x) for x in _drop_subtrees(ours, inner)] == [
        _masked(x) for x in _drop_subtrees(golden, inner)
    ]


def test_golden_positions_and_tokens(golden_build):
    text = golden_build.repr()
    for line in (
        "'t.w.pos_embeds_idxed' [300,256] Index [:300,:]",
        "'t.w.pos_embeds' [2048,256] Array",
        "'input_toks_int' [300] Index [:-2]",
        "'true_toks_int' [300] Index [1:-1]",
        "'toks_int_var' [302] Array",
    ):
        assert line in text
    assert golden_build.shape == (300,)


def test_unsplit_attention_uses_head_axis(golden_build):
    text = golden_build.repr()
    for line in (
        "'a.q' Einsum qd,hcd->hqc",
        "'a.k' Einsum kd,hcd->hkc",
        "'a.v' Einsum kd,hVd->hkV",
        "'a.attn_scores' Einsum hqc,hkc,h->hqk",
        "'a.comb_v' Einsum hqk,hkV->hqV",
        "'b1.a' Einsum hsV,hdV->sd",
        "'a.c.bias_for_head_size' Einsum hjk->hj",
        "'a0.w.q' [8,32,256] Array",
        "'a0.w.o' [8,256,32] Array",
    ):
        assert line in text, line
    assert "causal_mask" not in text


def test_parse_round_trip(golden_build):
    text = golden_build.repr()
    assert cc.parse(text) == golden_build


# ------------------------------------------------------------ plain torch


def reference_loss(
    config: cm.AttnOnlyConfig, w: dict, tokens: torch.Tensor, golden: bool = False, causal=False
):
    """The same model in ordinary torch: per-token negative log-likelihood (no mask unless causal)."""
    extra = 2 if golden else 1
    inputs, targets = tokens[..., :-extra], tokens[..., 1 : tokens.shape[-1] - extra + 1]
    seq = inputs.shape[-1]
    d = config.d_model

    def ln(x, prefix):
        return F.layer_norm(x, (d,), w[f"{prefix}.ln.w.scale"], w[f"{prefix}.ln.w.bias"], eps=config.ln_eps)

    resid = w["t.w.tok_embeds"][inputs]
    pos = w["t.w.pos_embeds"][:seq]
    for layer in range(config.n_layers):
        normed = ln(resid, f"a{layer}")
        qk_in = normed + pos
        q = torch.einsum("...sd,hcd->...hsc", qk_in, w[f"a{layer}.w.q"])
        k = torch.einsum("...sd,hcd->...hsc", qk_in, w[f"a{layer}.w.k"])
        v = torch.einsum("...sd,hcd->...hsc", normed, w[f"a{layer}.w.v"])
        scores = q @ k.transpose(-1, -2) / config.d_head**0.5
        if causal:
            scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
        z = scores.softmax(-1) @ v
        resid = resid + torch.einsum("...hsc,hdc->...sd", z, w[f"a{layer}.w.o"])
    logits = ln(resid, "final") @ w["t.w.unembed"].T
    return -logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("golden", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_loss_equals_plain_torch(batched, golden, causal):
    w = cm.attn_only_random_weights(SMALL, seed=3, dtype=torch.float64)
    w = {k: v * 20 if ".w." in k and "ln" not in k else v for k, v in w.items()}  # sharper attention
    shape = (3, 11) if batched else (11,)
    tokens = torch.randint(0, SMALL.vocab_size, shape, generator=torch.Generator().manual_seed(5))
    circuit = cm.build_attn_only(
        SMALL, w, tokens, convention="golden" if golden else "default", causal=causal
    )
    got = circuit.evaluate()
    want = reference_loss(SMALL, w, tokens, golden, causal)
    assert got.shape == want.shape == (shape[:-1] + (11 - (2 if golden else 1),))
    assert (got - want).abs().max().item() < 1e-12
    # float32 evaluation of the same circuit
    got32 = circuit.evaluate(dtype=torch.float32)
    assert got32.dtype == torch.float32
    assert (got32.double() - want).abs().max().item() < 1e-5


def test_batched_rows_equal_unbatched_builds():
    w = cm.attn_only_random_weights(SMALL, seed=4)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    batched = cm.build_attn_only(SMALL, w, tokens).evaluate()
    for row in range(2):
        single = cm.build_attn_only(SMALL, w, tokens[row]).evaluate()
        torch.testing.assert_close(batched[row], single, rtol=0, atol=1e-6)
    text = cm.build_attn_only(SMALL, w, tokens).repr()
    assert "'input_toks_int' [2,8] Index [:,:-1]" in text
    assert "'a.q' Einsum bqd,hcd->bhqc" in text
    assert "'ln.neg_mean' Einsum bAh,z,bA->bAz" in text
    assert "'t.loss' Einsum ba,->ba" in text


def test_placeholder_tokens_from_seq_len():
    w = cm.attn_only_random_weights(SMALL)
    c = cm.build_attn_only(SMALL, w, seq_len=7, batch_size=2)
    assert c.shape == (2, 7)
    assert c.get_unique("toks_int_var").shape == (2, 8)
    c = cm.build_attn_only(SMALL, w, seq_len=7, convention="golden")
    assert c.get_unique("toks_int_var").shape == (9,)


def test_unembed_bias_is_optional():
    w = cm.attn_only_random_weights(SMALL)
    bias = torch.randn(SMALL.vocab_size)
    tokens = torch.randint(0, SMALL.vocab_size, (6,))
    plain = cm.build_attn_only(SMALL, w, tokens)
    biased = cm.build_attn_only(SMALL, {**w, "t.w.unembed_bias": bias}, tokens)
    logits = cc.evaluate(plain.get_unique("t.call"))
    torch.testing.assert_close(cc.evaluate(biased.get_unique("t.call")), logits + bias)


# ------------------------------------------------------------------ errors


def test_missing_unknown_and_misshapen_weights_are_listed():
    w = cm.attn_only_random_weights(SMALL)
    del w["a1.w.k"]
    w["a0.w.q"] = torch.zeros(3, 4, 13)
    w["a0.w.typo"] = torch.zeros(1)
    with pytest.raises(cm.ModelError) as info:
        cm.build_attn_only(SMALL, w, seq_len=4)
    message = str(info.value)
    assert "'a1.w.k' [3, 4, 12]" in message
    assert "'a0.w.q' has shape [3, 4, 13], expected [3, 4, 12]" in message
    assert "'a0.w.typo'" in message
    assert isinstance(info.value, cc.CircuitError)


@pytest.mark.parametrize(
    "tokens, message",
    [
        (torch.tensor([1.0, 2.0]), "integer"),
        (torch.zeros(2, 2, 2, dtype=torch.long), "expected [S+1] or [B,S+1]"),
        (torch.tensor([5]), "more than 1 tokens"),
        (torch.tensor([0, 99]), "vocabulary has 23"),
        (torch.zeros(18, dtype=torch.long), "position table has only 16"),
    ],
)
def test_bad_tokens(tokens, message):
    with pytest.raises(cm.ModelError, match=re.escape(message)):
        cm.build_attn_only(SMALL, cm.attn_only_random_weights(SMALL), tokens)


def test_tokens_or_seq_len_needed():
    with pytest.raises(cm.ModelError, match="seq_len"):
        cm.build_attn_only(SMALL, cm.attn_only_random_weights(SMALL))
    with pytest.raises(cm.ModelError, match="convention"):
        cm.build_attn_only(SMALL, cm.attn_only_random_weights(SMALL), seq_len=3, convention="shifted")


# --------------------------------------------------------- TransformerLens


def test_transformer_lens_attn_only():
    w = cm.attn_only_random_weights(SMALL, seed=7)
    tokens = torch.randint(0, SMALL.vocab_size, (10,))
    direct = cm.build_attn_only(SMALL, w, tokens)
    loaded = cm.from_transformer_lens(attn_only_transformer_lens_state(SMALL, w), tokens, family="attn_only")
    assert loaded == direct  # same structure, names and tensors (so same hashes)


def test_transformer_lens_errors():
    w = cm.attn_only_random_weights(SMALL, seed=7)
    state = attn_only_transformer_lens_state(SMALL, w)
    state["blocks.0.attn.b_Q"] = torch.ones(SMALL.n_heads, SMALL.d_head)
    with pytest.raises(cm.ModelError, match="no attention biases"):
        cm.from_transformer_lens(state, seq_len=4, family="attn_only")
    state = attn_only_transformer_lens_state(SMALL, w)
    del state["blocks.1.ln1.w"], state["ln_final.w"]
    with pytest.raises(cc.errors.ModelError, match="folded layer norms") as info:  # the likely cause
        cm.from_transformer_lens(state, seq_len=4, family="attn_only")
    assert info.value.missing_keys == ["blocks.1.ln1.w", "ln_final.w"]
    with pytest.raises(cm.ModelError, match="family"):
        cm.from_transformer_lens(state, seq_len=4, family="bert")
    with pytest.raises(cc.errors.ModelError) as info:
        cm.from_transformer_lens({}, seq_len=4, family="gpt2")
    needed = ["embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.mlp.W_in"]
    assert info.value.missing_keys == needed


def test_core_and_models_import_without_transformers():
    import subprocess

    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import circuits, circuits.models as cm\n"
        "assert 'transformers' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "c = cm.AttnOnlyConfig(1, 2, 8, 4, 11, 8)\n"
        "print(cm.build_attn_only(c, cm.attn_only_random_weights(c), seq_len=3).shape)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(3,)"
