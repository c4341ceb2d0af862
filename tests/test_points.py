"""``Point(kind, layer, head)``: one layer's (one head's) node, on every family, split or not, masked or not.

Values are checked against TransformerLens 4's ``run_with_cache`` on the same weights (its natively
booted GPT-2 layout, read through ``from_transformer_lens``) and against the attention-only model (the
shipped demo model included) and a Llama written in torch.  The attention-only model's shortformer
positions have no TransformerLens 4 equivalent (neither its native model nor any Hugging Face one has
them), so its reference is torch code here, where TransformerLens 3's ``HookedTransformer`` was.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.transformer import names, points
from circuits.transformer.points import HEAD_KINDS, POINT_KINDS, TRANSFORMER_LENS_HOOKS, Point
from factories import llama_config, tl_model

TOL = 1e-4


def _nodes(circuit, kind, layer=None, head=None):
    return list(circuit.get(Point(kind, layer, head)))


def _value(circuit, kind, layer=None, head=None):
    return circuit.get_unique(Point(kind, layer, head)).evaluate()


def _variants(circuit, family, masked):
    """The circuit as built (``masked`` picks the builders' causal form), then with heads split."""
    if family == "attn_only" and masked:
        circuit = cc.passes.causal_mask(circuit)
    return {"unsplit": circuit, "split": cc.passes.split_heads(circuit)}


# ------------------------------------------------------------------ TransformerLens


def tl_expected(model, cache, kind, layer, head, tokens):
    """TransformerLens's value of ``kind``, in our node's layout (see docs/models.md)."""
    hook = TRANSFORMER_LENS_HOOKS[kind]
    if hook is not None:
        value = cache[hook.format(layer=layer, last=model.cfg.n_layers - 1)]
    if kind == "pos_embed":
        return value[0]  # ours has no batch axis
    if kind in ("ln1", "ln2", "ln_final"):  # ours is after the norm's weights
        norm = model.ln_final if kind == "ln_final" else getattr(model.blocks[layer], kind)
        return value * norm.w + norm.b
    if kind.endswith("_scale"):  # ours is 1/sqrt(var + eps), [batch, pos]
        return 1 / value.squeeze(-1)
    if kind == "attn_scores" and model.cfg.architecture == "TransformerLensNative":
        value = _native_scores(model, cache, layer)
    if kind in ("q", "k", "v", "z"):  # ours [batch, head, pos, d_head]
        value = value.transpose(1, 2)
    if kind in ("q", "k", "v", "z", "attn_scores", "attn_probs") and head is not None:
        return value[:, head]
    if kind == "head_out":
        return value[:, :, head]
    if kind == "attn_out":  # ours is without the output bias
        return value - model.blocks[layer].attn.b_O
    if hook is not None:
        return value
    logits = model(tokens[:, :-1])
    if kind == "logits":
        return logits
    log_probs = torch.log_softmax(logits, dim=-1)
    if kind == "log_probs":
        return log_probs
    if kind == "loss":
        return -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
    return value


def _native_scores(model, cache, layer):
    """The scores of TransformerLens 4's native model, from its ``hook_q`` and ``hook_k``: that model's
    attention hands the bridge its pattern where the bridge expects scores, so its
    ``hook_attn_scores`` holds the probabilities (tests/test_models_tl_bridge.py checks it)."""
    q, k = cache[f"blocks.{layer}.attn.hook_q"], cache[f"blocks.{layer}.attn.hook_k"]
    scores = torch.einsum("bqhc,bkhc->bhqk", q, k) / q.shape[-1] ** 0.5
    if model.cfg.attention_dir == "causal":
        seq = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
    return scores


def _close(ours, expected, kind, masked, label):
    assert ours.shape == expected.shape, (label, ours.shape, expected.shape)
    if kind == "attn_scores" and masked:  # masked pairs: TransformerLens -inf, ours NEG_INF
        keep = torch.ones(ours.shape[-2:], dtype=torch.bool).tril()
        assert (ours[..., ~keep] == cm.NEG_INF).all(), label
        ours, expected = ours[..., keep], expected[..., keep]
    assert (ours - expected).abs().max().item() < TOL, label


def check_points(circuit, family, masked, n_layers, n_heads, expected_of):
    """Every point of the circuit, built and split (one node per head branch), against
    ``expected_of(kind, layer, head)``; a kind the family lacks finds no node."""
    for variant, c in _variants(circuit, family, masked).items():
        keys = []
        for kind in POINT_KINDS:
            entry = names.ACTIVATION_KINDS[kind]
            if entry.names[family] is None:
                assert _nodes(c, kind, *([0] if entry.scope != "model" else [])) == []
                continue
            for layer in [None] if entry.scope == "model" else range(n_layers):
                split = kind in HEAD_KINDS and variant == "split"
                if split and kind != "head_out":
                    assert len(_nodes(c, kind, layer)) == n_heads  # one per head branch
                if kind != "head_out" or split:
                    keys += [(kind, layer, head) for head in (range(n_heads) if split else [None])]
        found = ex.run_with_cache(c, keys)  # one evaluation for every point
        for kind, layer, head in keys:
            key = kind if layer is None else (kind, layer) if head is None else (kind, layer, head)
            expected = expected_of(kind, layer, head)
            _close(found[key], expected, kind, masked, f"{variant} {kind} {layer} {head}")


def check_against_transformer_lens(model, circuit, family, masked, tokens):
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[:, :-1])
        cache.compute_head_results()  # TransformerLens's per-head results, from its hook_z and W_O

        def expected_of(kind, layer, head):
            return tl_expected(model, cache, kind, layer, head, tokens)

        check_points(circuit, family, masked, model.cfg.n_layers, model.cfg.n_heads, expected_of)


@pytest.mark.slow  # importing TransformerLens alone takes seconds
@pytest.mark.parametrize("masked", [True, False])
def test_every_point_equals_transformer_lens(masked):
    model = tl_model("gpt2", masked)
    tokens = torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(1))

    circuit = cm.from_transformer_lens(model, tokens, causal=masked)  # a bidirectional cfg needs causal=False
    check_against_transformer_lens(model, circuit, "gpt2", masked, tokens)


def _layer_norm(x, scale, bias, eps):
    rsqrt = torch.rsqrt((x - x.mean(-1, keepdim=True)).pow(2).mean(-1) + eps)
    return (x - x.mean(-1, keepdim=True)) * rsqrt[..., None] * scale + bias, rsqrt


def attn_only_reference(config, w, tokens, masked):
    """Every activation of the attention-only model (shortformer positions: added to the queries' and
    keys' inputs only) written in torch: ``{(kind, layer[, head]): value}``, our layouts."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seq, eps = inputs.shape[1], config.ln_eps
    out = {}
    resid = out["embed", None] = w["t.w.tok_embeds"][inputs]
    pos = out["pos_embed", None] = w["t.w.pos_embeds"][:seq]
    for L in range(config.n_layers):
        out["resid_pre", L] = resid
        norm, out["ln1_scale", L] = _layer_norm(resid, w[f"a{L}.ln.w.scale"], w[f"a{L}.ln.w.bias"], eps)
        out["ln1", L] = norm
        q = torch.einsum("bsd,hcd->bhsc", norm + pos, w[f"a{L}.w.q"])
        k = torch.einsum("bsd,hcd->bhsc", norm + pos, w[f"a{L}.w.k"])
        v = torch.einsum("bsd,hcd->bhsc", norm, w[f"a{L}.w.v"])
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if masked:
            scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), cm.NEG_INF)
        probs = torch.softmax(scores, dim=-1)
        z = probs @ v
        heads = torch.einsum("bhsc,hdc->bhsd", z, w[f"a{L}.w.o"])
        out.update({("q", L): q, ("k", L): k, ("v", L): v, ("attn_scores", L): scores})
        out.update({("attn_probs", L): probs, ("z", L): z, ("attn_out", L): heads.sum(1)})
        out.update({("head_out", L, h): heads[:, h] for h in range(config.n_heads)})
        resid = out["resid_post", L] = resid + heads.sum(1)
    out["resid_final", None] = resid
    final = out["ln_final", None], out["ln_final_scale", None] = _layer_norm(
        resid, w["final.ln.w.scale"], w["final.ln.w.bias"], eps
    )
    logits = out["logits", None] = final[0] @ w["t.w.unembed"].T + w.get("t.w.unembed_bias", 0.0)
    log_probs = out["log_probs", None] = torch.log_softmax(logits, dim=-1)
    out["loss", None] = -log_probs.gather(-1, targets[..., None])[..., 0]
    return out


def check_against_reference(circuit, reference, family, masked, n_layers, n_heads):
    """Every point of the circuit (split and not) against ``reference`` (``llama_reference``'s form)."""

    def expected_of(kind, layer, head):
        return _reference_value(reference, kind, layer, head)

    check_points(circuit, family, masked, n_layers, n_heads, expected_of)


@pytest.mark.parametrize("masked", [True, False])
def test_every_attn_only_point_equals_torch(masked):
    config = cm.AttnOnlyConfig(n_layers=2, n_heads=3, d_model=12, d_head=4, vocab_size=17, n_ctx=16)
    w = cm.attn_only_random_weights(config, seed=2)
    tokens = torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(1))
    circuit = cm.build_attn_only(config, w, tokens, causal=masked)
    reference = attn_only_reference(config, w, tokens, masked)
    check_against_reference(circuit, reference, "attn_only", masked, config.n_layers, config.n_heads)


@pytest.mark.slow
@pytest.mark.parametrize("masked", [True, False])
def test_demo_model_points_equal_torch(masked):
    from circuits.models.demo_model import demo_config, load_demo_weights, repeated_tokens

    config, w = demo_config(), load_demo_weights()
    tokens = repeated_tokens(2, 10).to(torch.long)
    reference = attn_only_reference(config, w, tokens, masked)
    circuit = cm.load_demo_model(tokens, causal=masked)
    check_against_reference(circuit, reference, "attn_only", masked, config.n_layers, config.n_heads)


# --------------------------------------------------------------------- Llama in torch

LLAMA = llama_config()  # 2 layers, 4 query heads on 2 key/value heads of 4 dims, width 12


def _rms(x, scale, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale, torch.rsqrt(
        x.pow(2).mean(-1) + eps
    )


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def llama_reference(config, w, tokens, masked):
    """Every activation of a Llama forward pass written in torch: ``{(kind, layer): value}``, our layouts."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seq, eps, group = inputs.shape[1], config.rms_eps, config.n_heads // config.kv_heads
    cos, sin = cm.rope_cos_sin(config, seq, dtype=w["t.w.tok_embeds"].dtype)
    out = {}
    resid = out["embed", None] = w["t.w.tok_embeds"][inputs]
    for L in range(config.n_layers):
        out["resid_pre", L] = resid
        norm, out["ln1_scale", L] = _rms(resid, w[f"a{L}.rms.w.scale"], eps)
        out["ln1", L] = norm
        q = _rotate(torch.einsum("bsd,hcd->bhsc", norm, w[f"a{L}.w.q"]), cos, sin)
        k = _rotate(torch.einsum("bsd,hcd->bhsc", norm, w[f"a{L}.w.k"]), cos, sin).repeat_interleave(group, 1)
        v = torch.einsum("bsd,hcd->bhsc", norm, w[f"a{L}.w.v"]).repeat_interleave(group, 1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if masked:
            scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), cm.NEG_INF)
        probs = torch.softmax(scores, dim=-1)
        z = probs @ v
        heads = torch.einsum("bhsc,hdc->bhsd", z, w[f"a{L}.w.o"])
        out.update({("q", L): q, ("k", L): k, ("v", L): v, ("attn_scores", L): scores})
        out.update({("attn_probs", L): probs, ("z", L): z, ("attn_out", L): heads.sum(1)})
        out.update({("head_out", L, h): heads[:, h] for h in range(config.n_heads)})
        resid = out["resid_mid", L] = resid + heads.sum(1)
        norm, out["ln2_scale", L] = _rms(resid, w[f"m{L}.rms.w.scale"], eps)
        out["ln2", L] = norm
        gate = out["mlp_pre", L] = norm @ w[f"m{L}.w.gate"].T
        gated = out["mlp_post", L] = torch.nn.functional.silu(gate) * (norm @ w[f"m{L}.w.up"].T)
        out["mlp_out", L] = gated @ w[f"m{L}.w.down"].T
        resid = out["resid_post", L] = resid + out["mlp_out", L]
    out["resid_final", None] = resid
    out["ln_final", None], out["ln_final_scale", None] = _rms(resid, w["final.rms.w.scale"], eps)
    logits = out["logits", None] = out["ln_final", None] @ w["t.w.unembed"].T
    log_probs = out["log_probs", None] = torch.log_softmax(logits, dim=-1)
    out["loss", None] = -log_probs.gather(-1, targets[..., None])[..., 0]
    return out


def _reference_value(reference, kind, layer, head):
    if kind == "head_out":
        return reference[kind, layer, head]
    value = reference[kind, layer]
    return value if head is None else value[:, head]


@pytest.mark.parametrize("masked", [True, False])
def test_every_llama_point_equals_torch(masked):
    w = cm.llama_random_weights(LLAMA, seed=3)
    tokens = torch.randint(0, LLAMA.vocab_size, (2, 8), generator=torch.Generator().manual_seed(4))
    reference = llama_reference(LLAMA, w, tokens, masked)
    circuit = cm.build_llama(LLAMA, w, tokens, causal=masked)
    check_against_reference(circuit, reference, "llama", masked, LLAMA.n_layers, LLAMA.n_heads)


# ------------------------------------------------------------------------ quick checks


def _small(family, masked, n_layers=3):
    tokens = torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(0))
    if family == "attn_only":
        config = cm.AttnOnlyConfig(n_layers=n_layers, n_heads=2, d_model=4, d_head=2, vocab_size=7, n_ctx=8)
        return cm.build_attn_only(config, cm.attn_only_random_weights(config), tokens), config.n_heads
    if family == "gpt2":
        config = cm.GPT2Config(n_layers=n_layers, n_heads=2, d_model=4, vocab_size=7, n_ctx=8)
        return cm.build_gpt2(config, cm.gpt2_random_weights(config), tokens, causal=masked), config.n_heads
    config = cm.LlamaConfig(n_layers=n_layers, n_heads=4, n_kv_heads=2, d_model=8, d_mlp=6, vocab_size=7)
    return cm.build_llama(config, cm.llama_random_weights(config), tokens, causal=masked), config.n_heads


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("family", ["attn_only", "gpt2", "llama"])
def test_every_point_finds_one_node_per_layer_and_head(family, masked):
    """Exactly one node per (kind, layer, head), distinct across layers; a layer point of a
    per-head kind on a split circuit finds one node per head."""
    circuit, n_heads = _small(family, masked)
    for variant, c in _variants(circuit, family, masked).items():
        for kind in POINT_KINDS:
            entry = names.ACTIVATION_KINDS[kind]
            if entry.names[family] is None:
                continue
            layers = [None] if entry.scope == "model" else range(3)
            found = set()
            for layer in layers:
                if kind in HEAD_KINDS and variant == "split":
                    for head in range(n_heads):
                        (node,) = _nodes(c, kind, layer, head)
                        found.add(node)
                    if kind != "head_out":
                        assert len(_nodes(c, kind, layer)) == n_heads
                elif kind != "head_out":
                    (node,) = _nodes(c, kind, layer)
                    found.add(node)
            per_layer = len(layers) * (n_heads if kind in HEAD_KINDS and variant == "split" else 1)
            if kind != "head_out" or variant == "split":
                assert len(found) == per_layer, (variant, kind)


def test_points_in_rewrites_and_patching():
    """Points in ``ex.patch`` and ``ex.zero_ablate``: a point rewrites exactly its node."""
    circuit, _ = _small("gpt2", True, n_layers=2)
    c = cc.passes.split_heads(circuit)
    other = torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(9))
    patched = ex.patch(c, Point("resid_pre", 1), {names.TOKENS: other})
    source, _ = ex.with_inputs(c, {names.TOKENS: other})
    assert torch.allclose(
        patched.get_unique(Point("resid_pre", 1)).evaluate(), _value(source, "resid_pre", 1)
    )
    # everything above layer 0 comes from the source run, but the targets are the clean ones
    assert torch.allclose(_value(patched, "logits"), _value(source, "logits"))
    targets = circuit.get_unique(names.TARGET_TOKENS).evaluate()
    loss = -_value(source, "log_probs").gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(_value(patched, "loss"), loss, atol=1e-6)
    zeroed = ex.zero_ablate(c, Point("attn_probs", 1, 0))
    assert not _value(zeroed, "attn_probs", 1, 0).any()
    assert torch.equal(_value(zeroed, "attn_probs", 1, 1), _value(c, "attn_probs", 1, 1))
    assert torch.equal(_value(zeroed, "attn_probs", 0, 0), _value(c, "attn_probs", 0, 0))


def test_the_stop_at_match_trick_is_needed():
    """The issue's example: stop_at_match alone still finds layer 0 below layer 1's norm."""
    circuit, _ = _small("attn_only", False, n_layers=2)
    naive = cc.IterativeMatcher(names.attn_out(1)).then(names.PROBS, stop_at_match=True)
    assert len(circuit.get(naive)) == 2
    assert len(circuit.get(Point("attn_probs", 1))) == 1


def test_argument_errors():
    with pytest.raises(cc.errors.ExperimentError, match="unknown activation kind 'pattern'.*attn_probs"):
        Point("pattern", 1)
    with pytest.raises(cc.errors.ExperimentError, match="layer must be an int"):
        Point("q", 1.0)
    with pytest.raises(cc.errors.ExperimentError, match="layer must be an int"):
        Point("q")
    with pytest.raises(cc.errors.ExperimentError, match="layer must be an int"):
        Point("q", True)
    with pytest.raises(cc.errors.ExperimentError, match="head must be an int"):
        Point("q", 0, "1")
    with pytest.raises(cc.errors.ExperimentError, match="'resid_pre' has no heads"):
        Point("resid_pre", 1, 0)
    with pytest.raises(cc.errors.ExperimentError, match="give no layer"):
        Point("logits", 0)
    with pytest.raises(cc.errors.ExperimentError, match="give head="):
        Point("head_out", 0)


def test_head_point_on_unsplit_or_grouped_layers():
    circuit, _ = _small("attn_only", True, n_layers=2)
    with pytest.raises(cc.errors.ExperimentError, match=r"layer 1's heads are not split.*split_heads"):
        circuit.get(Point("attn_probs", 1, 0))
    with pytest.raises(cc.errors.ExperimentError, match="not split"):
        cc.passes.split_heads(circuit, layers=[0]).get(Point("head_out", 1, 0))
    assert len(cc.passes.split_heads(circuit, layers=[1]).get(Point("z", 1, 0))) == 1
    grouped = cc.passes.split_heads(circuit, heads=[[0, 1]])
    with pytest.raises(cc.errors.ExperimentError, match="inside the branch 'b1.a.head0-1'"):
        grouped.get(Point("q", 1, 1))
    with pytest.raises(
        cc.errors.ExperimentError, match="no head 5; its branches are 'b1.a.head0', 'b1.a.head1'"
    ):
        cc.passes.split_heads(circuit).get(Point("q", 1, 5))
    assert len(grouped.get(Point("q", 1))) == 1  # the group's node


def test_hooks_table_covers_every_kind():
    assert set(TRANSFORMER_LENS_HOOKS) == set(POINT_KINDS)
    assert set(HEAD_KINDS) <= set(POINT_KINDS)


def _get_or_error(circuit, key):
    try:
        return circuit.get(Point(*key))
    except cc.errors.ExperimentError as error:
        return str(error)


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("family", ["attn_only", "gpt2", "llama"])
def test_resolve_points_finds_what_the_matchers_find(family, masked):
    """``resolve_points`` (stage 0 by name, then the tail) agrees with ``get(point)`` (one walk from
    the root) on every key: the same node, no node, several nodes, or the same error."""
    circuit, n_heads = _small(family, masked)
    variants = dict(_variants(circuit, family, masked))
    variants["grouped"] = cc.passes.split_heads(circuit, heads=[list(range(n_heads - 1)), [n_heads - 1]])
    for variant, c in variants.items():
        keys = [(kind, None, None) for kind in POINT_KINDS if names.ACTIVATION_KINDS[kind].scope == "model"]
        keys += [
            (kind, layer, head)
            for kind in POINT_KINDS
            if names.ACTIVATION_KINDS[kind].scope != "model"
            for layer in range(4)
            for head in ([None] if kind not in HEAD_KINDS else [None, 0, n_heads - 1, n_heads])
            if not (kind == "head_out" and head is None)
        ]
        for key in keys:
            expected = _get_or_error(c, key)
            try:
                (node,) = points.resolve_points(c, [key]).values()
                assert expected == {node}, (variant, key)
            except cc.errors.ExperimentError as error:
                if isinstance(expected, str):
                    assert expected in str(error), (variant, key)
                else:
                    assert len(expected) != 1, (variant, key, expected)
                    assert ("finds no node" if not expected else f"finds {len(expected)} nodes") in str(error)
        default = points.resolve_points(c)
        assert default and all(_get_or_error(c, key) == {node} for key, node in default.items())


@pytest.mark.parametrize("family", ["attn_only", "gpt2", "llama"])
def test_patching_a_point_patches_every_use_of_its_node(family):
    """``ex.patch(c, point, other)`` is activation patching: it replaces the node at every use, as
    patching the node itself does (a point searched along a path must not patch that path only)."""
    circuit, n_heads = _small(family, True, n_layers=2)
    other = {"toks_int_var": torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(5))}
    for c in _variants(circuit, family, True).values():
        for key in points.resolve_points(c):
            node = points.resolve_points(c, [key])[key]
            by_point = ex.patch(c, Point(*key), other).evaluate()
            by_node = ex.patch(c, node, other).evaluate()
            assert torch.equal(by_point, by_node), key
