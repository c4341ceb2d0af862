"""``ex.gradients`` and ``ex.attribution_patching`` against TransformerLens's backward hooks and plain torch.

Gradients: TransformerLens on the same weights (odd GPT-2, batched), its backward hooks giving
``∂metric/∂hook``; and the attention-only model written in torch (tests/experiments_reference.py)
with head outputs made leaves.  Attribution patching: the same formula computed from
TransformerLens's caches and gradients, and exact patching by torch for a check of the sign.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.experiments.attribution import attribution_patching
from circuits.experiments.gradients import gradients
from circuits.experiments.metrics import logit_diff

import experiments_reference as ref
from factories import tl_model

TOL = 1e-4
GOOD, BAD = [3, 5, 7], [2, 11, 4]


def _tokens(seed):
    return torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(seed))


def _tl_logit_diff(logits):
    rows = torch.arange(3)
    return (logits[rows, -1, GOOD] - logits[rows, -1, BAD]).mean()


# TransformerLens's hook for each of our kinds, and our layout from its value.
_HOOKS = {
    "resid_pre": ("blocks.{L}.hook_resid_pre", lambda t: t),
    "resid_mid": ("blocks.{L}.hook_resid_mid", lambda t: t),
    "attn_out": ("blocks.{L}.hook_attn_out", lambda t: t),
    "mlp_out": ("blocks.{L}.hook_mlp_out", lambda t: t),
    "mlp_post": ("blocks.{L}.mlp.hook_post", lambda t: t),
    "z": ("blocks.{L}.attn.hook_z", lambda t: t.transpose(1, 2)),
    "v": ("blocks.{L}.attn.hook_v", lambda t: t.transpose(1, 2)),
    "attn_probs": ("blocks.{L}.attn.hook_pattern", lambda t: t),
}


#: TransformerLens 4's ``hook_resid_mid`` is its second norm's input hook, so a backward hook there sees
#: the gradient through the MLP only; the residual path's is ``hook_resid_post``'s, which is added.
_RESIDUAL_PATH = {"resid_mid": "blocks.{L}.hook_resid_post"}


def _tl_hooks(kind, layer):
    """The hooks whose values and gradients give ``kind``'s at ``layer``."""
    return [h.format(L=layer) for h in (_HOOKS[kind][0], _RESIDUAL_PATH.get(kind)) if h is not None]


def _tl_grad(grads, kind, layer):
    """TransformerLens's gradient at ``kind``'s hook, in our layout, the residual path included."""
    hook, layout = _HOOKS[kind]
    grad = grads[hook.format(L=layer)]
    if kind in _RESIDUAL_PATH:
        grad = grad + grads[_RESIDUAL_PATH[kind].format(L=layer)]
    return layout(grad)


def _tl_run(model, tokens, names, backward=True):
    """TransformerLens's metric, and the activations and gradients at the hooks ``names``."""
    acts, grads = {}, {}

    def keep(store, name):  # by the name asked for: TransformerLens 4's hook_resid_pre is an alias
        return lambda tensor, hook: store.__setitem__(name, tensor.detach())

    def leaf(tensor, hook):  # the weights need no gradient: the embeddings start the graph
        return tensor.detach().requires_grad_()

    hooks = [("hook_embed", leaf)] * backward + [(name, keep(acts, name)) for name in names]
    bwd_hooks = [(name, keep(grads, name)) for name in names] if backward else []
    with model.hooks(fwd_hooks=hooks, bwd_hooks=bwd_hooks):
        metric = _tl_logit_diff(model(tokens[:, :-1]))
        if backward:
            metric.backward()
    return float(metric.detach()), acts, grads


@pytest.fixture(scope="module")
def gpt2():
    pytest.importorskip("transformer_lens")
    model = tl_model("gpt2", masked=True, seed=4)
    for param in model.parameters():
        param.requires_grad_(False)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True])
def test_gradients_equal_transformer_lens_backward_hooks(gpt2, split):
    model = gpt2
    tokens = _tokens(1)
    circuit = cm.from_transformer_lens(model, tokens, family="gpt2", causal=True)
    if split:
        circuit = cc.passes.split_heads(circuit)
    keys = [
        (kind, layer)
        for kind in _HOOKS
        for layer in range(2)
        if not (split and kind in ("z", "v", "attn_probs"))
    ]
    if split:
        keys += [("z", 1, 2), ("attn_probs", 0, 1), ("head_out", 1, 0)]
    # a function of the logits (TransformerLens's own metric), or the same as a Metric
    metric = (
        logit_diff(-1, torch.tensor(GOOD), torch.tensor(BAD), push_down=False) if split else _tl_logit_diff
    )
    ours = gradients(circuit, metric, keys)
    hooks = sorted({hook for k, layer, *_ in keys if k in _HOOKS for hook in _tl_hooks(k, layer)})
    hooks.append("blocks.1.hook_attn_out")
    expected_metric, _, tl_grads = _tl_run(model, tokens, hooks)
    assert abs(ours.metric - expected_metric) < TOL
    for key in keys:
        kind, layer, *head = key
        if kind == "head_out":  # the attention output is the heads' sum (plus b_O): each head's gradient
            # is the output's (TransformerLens 4's native attention has no per-head hook_result)
            expected = tl_grads[f"blocks.{layer}.hook_attn_out"]
        else:
            expected = _tl_grad(tl_grads, kind, layer)
            if head:
                expected = expected[:, head[0]]
        got = ours[key]
        assert got.shape == expected.shape, key
        assert (got - expected).abs().max() < TOL, key
        assert expected.abs().max() > 1e-3, key  # the check is not vacuous


def _torch_head_grads(w, toks, layer):
    """Torch's gradient of the mean loss at each head output of ``layer`` (those alone made leaves:
    a leaf at a later layer would cut the paths through it)."""
    _, _, heads = ref.forward(w, toks)
    leaves = {key: value.detach().requires_grad_() for key, value in heads.items() if key[0] == layer}
    loss, _, _ = ref.forward(w, toks, override=leaves)
    return loss.mean(), heads, dict(zip(leaves, torch.autograd.grad(loss.mean(), list(leaves.values()))))


def test_gradients_of_head_outputs_equal_torch():
    """On the attention-only model in plain torch: each layer's head outputs leaves, the mean loss's gradient."""
    w, toks = ref.weights(0), ref.tokens(3)
    split = ref.split_circuit(w, toks)
    keys = [("head_out", layer, head) for layer in range(2) for head in range(3)]
    ours = gradients(split, ex.mean_loss, keys)
    for layer in range(2):
        loss, heads, expected = _torch_head_grads(w, toks, layer)
        assert abs(ours.metric - float(loss.detach())) < 1e-9
        for (_, head), grad in expected.items():
            assert (ours["head_out", layer, head] - grad).abs().max() < 1e-9
            torch.testing.assert_close(ours.activations["head_out", layer, head], heads[(layer, head)])


def test_gradients_errors():
    w, toks = ref.weights(0), ref.tokens(3)
    split = ref.split_circuit(w, toks)
    with pytest.raises(cc.errors.ExperimentError, match="no points"):
        gradients(split, ex.mean_loss, [])
    with pytest.raises(cc.errors.ExperimentError, match="one number"):
        gradients(split, lambda logits: logits, [("resid_pre", 1)])
    with pytest.raises(cc.errors.ExperimentError, match="does not depend on any point"):
        gradients(split, lambda logits: torch.tensor(1.0), [("resid_pre", 1)])
    with pytest.raises(cc.errors.ExperimentError, match="computed from the logits.*ex.mean_loss"):
        gradients(split, lambda logits: logits.sum(), [("loss",)])
    with pytest.raises(cc.errors.ExperimentError, match="finds no node"):
        gradients(split, ex.mean_loss, [("resid_pre", 7)])
    config = cm.GPT2Config(n_layers=1, n_heads=2, d_model=8, vocab_size=11, n_ctx=8)
    c = cm.build_gpt2(config, cm.gpt2_random_weights(config), torch.randint(0, 11, (2, 6)))
    pushed = logit_diff(-1, 1, 2)  # push_down=True: the Index replaces the logits above the points
    with pytest.raises(cc.errors.ExperimentError, match="push_down=False"):
        gradients(c, pushed, [("resid_post", 0)])
    grads = gradients(c, logit_diff(-1, 1, 2, push_down=False), [("resid_post", 0), ("resid_pre", 0)])
    assert grads["resid_post", 0].shape == (2, 5, 8)
    assert grads["resid_post", 0][:, :-1].abs().max() == 0  # only the last position reaches the metric
    with pytest.raises(cc.errors.MissingPointError, match="no gradient"):
        grads["z", 0]
    with pytest.raises(cc.errors.MissingPointError, match="no activation for it"):
        grads.activations["z", 0]


def test_the_activations_take_the_gradients_keys():
    """``grads.activations["z", 0]``, as documented: the same keys as the gradients (it was a plain dict
    keyed by full ``(kind, layer, head)`` tuples, so the short key raised KeyError)."""
    w, toks = ref.weights(0), ref.tokens(3)
    circuit = cc.passes.causal_mask(cm.build_attn_only(ref.CONFIG, w, toks))
    grads = gradients(circuit, ex.mean_loss, [("z", 0), "logits"])
    _, logits, _ = ref.forward(w, toks)
    assert list(grads.activations) == list(grads) == [("z", 0, None), ("logits", None, None)]
    torch.testing.assert_close(grads.activations["logits"], logits, rtol=0, atol=1e-12)
    z = grads.activations["z", 0]
    assert z is grads.activations[("z", 0, None)] and z.shape == grads["z", 0].shape == (2, 3, ref.SEQ, 4)


# ------------------------------------------------------------------ attribution patching


def _expected_attribution(model, clean, corrupted, kind, layer):
    """(clean - corrupted) · ∂metric/∂act on the corrupted run, from TransformerLens alone."""
    hook, layout = _HOOKS[kind]
    name = hook.format(L=layer)
    _, clean_acts, _ = _tl_run(model, clean, [name], backward=False)
    _, corrupted_acts, corrupted_grads = _tl_run(model, corrupted, _tl_hooks(kind, layer))
    product = _tl_grad(corrupted_grads, kind, layer) * layout(clean_acts[name] - corrupted_acts[name])
    if kind in ("z", "v"):
        return product.sum((0, -1))  # [head, pos]
    if kind == "attn_probs":
        return product.sum((0, -1))  # [head, dest pos]
    return product.sum((0, -1))  # [pos]


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True])
def test_attribution_patching_equals_transformer_lens(gpt2, split):
    model = gpt2
    clean, corrupted = _tokens(1), _tokens(1).clone()
    corrupted[:, [1, 4, 6]] = _tokens(2)[:, [1, 4, 6]]  # several positions differ
    circuit = cm.from_transformer_lens(model, clean, family="gpt2", causal=True)
    if split:
        circuit = cc.passes.split_heads(circuit)
    kinds = ["resid_pre", "resid_mid", "attn_out", "mlp_out", "mlp_post", "z", "v", "attn_probs"]
    metric = logit_diff(-1, torch.tensor(GOOD), torch.tensor(BAD), push_down=False)
    result = attribution_patching(circuit, {"toks_int_var": corrupted}, metric, kinds)
    assert abs(result.target_metric - _tl_run(model, corrupted, [], backward=False)[0]) < TOL
    assert abs(result.source_metric - _tl_run(model, clean, [], backward=False)[0]) < TOL
    for kind in kinds:
        assert result[kind].shape == ((2, 3, 8) if kind in ("z", "v", "attn_probs") else (2, 8)), kind
        for layer in range(2):
            expected = _expected_attribution(model, clean, corrupted, kind, layer)
            assert (result[kind][layer] - expected).abs().max() < TOL, (kind, layer)
    assert result["resid_pre"].abs().max() > 1e-3
    rows = result.records
    assert len(rows) == sum(grid.numel() for grid in result.values())
    first = next(r for r in rows if r["kind"] == "z" and r["layer"] == 1 and r["head"] == 2 and r["pos"] == 3)
    assert first["attribution"] == pytest.approx(float(result["z"][1, 2, 3]))


def test_attribution_into_clean_is_the_first_order_term_of_torch_patching():
    """Into the clean run, each head's attribution is (corrupted - clean) · ∂loss/∂head at the clean run,
    computed here in torch; and for a tiny corruption it approaches the exact patching difference."""
    w, toks = ref.weights(0), ref.tokens(3)
    corrupted = toks.clone()
    corrupted[:, 2] = (toks[:, 2] + 1) % ref.CONFIG.vocab_size
    split = ref.split_circuit(w, toks)
    result = attribution_patching(
        split, {"toks_int_var": corrupted}, ex.mean_loss, ["head_out"], into="clean"
    )
    _, _, corrupted_heads = ref.forward(w, corrupted)
    for layer in range(2):
        _, clean_heads, grads = _torch_head_grads(w, toks, layer)
        for (_, head), grad in grads.items():
            expected = (grad * (corrupted_heads[(layer, head)] - clean_heads[(layer, head)])).sum((0, -1))
            assert (result["head_out"][layer, head] - expected).abs().max() < 1e-9
    assert result["head_out"].shape == (2, 3, ref.SEQ)


@pytest.mark.parametrize("targets", ["clean", "corrupted"])
def test_attribution_into_corrupted_scores_the_targets_the_metric_names(targets):
    """Into the corrupted run, with ``ex.mean_loss``: the loss of the corrupted run's logits on the clean
    prompt's next tokens (the default, as the grids score them) or the corrupted prompt's; each
    head's attribution is (clean - corrupted) · ∂loss/∂head at the corrupted run, in torch with the
    targets written out."""
    w, toks = ref.weights(0), ref.tokens(3)
    corrupted = toks.clone()
    corrupted[:, [2, 4]] = (toks[:, [2, 4]] + 1) % ref.CONFIG.vocab_size  # inputs and targets differ
    scored = (toks if targets == "clean" else corrupted)[:, 1:]
    metric = ex.mean_loss if targets == "clean" else ex.mean_loss.with_targets("corrupted")
    split = ref.split_circuit(w, toks)
    result = attribution_patching(split, {"toks_int_var": corrupted}, metric, ["head_out"])
    _, _, clean_heads = ref.forward(w, toks)
    _, _, corrupted_heads = ref.forward(w, corrupted)
    for layer in range(2):
        leaves = {k: v.detach().requires_grad_() for k, v in corrupted_heads.items() if k[0] == layer}
        loss, _, _ = ref.forward(w, corrupted, override=leaves, targets=scored)
        assert abs(result.target_metric - float(loss.mean().detach())) < 1e-9
        grads = dict(zip(leaves, torch.autograd.grad(loss.mean(), list(leaves.values()))))
        for (_, head), grad in grads.items():
            expected = (grad * (clean_heads[(layer, head)] - corrupted_heads[(layer, head)])).sum((0, -1))
            assert (result["head_out"][layer, head] - expected).abs().max() < 1e-9, (layer, head)
    source_loss, _, _ = ref.forward(w, toks, targets=scored)
    assert abs(result.source_metric - float(source_loss.mean())) < 1e-9


def test_attribution_errors():
    w, toks = ref.weights(0), ref.tokens(3)
    split = ref.split_circuit(w, toks)
    loss = lambda value: value.mean()  # noqa: E731
    with pytest.raises(cc.errors.ExperimentError, match="kinds"):
        attribution_patching(split, {"toks_int_var": ref.tokens(4)}, loss, ["nonsense"])
    with pytest.raises(cc.errors.ExperimentError, match="shape"):
        attribution_patching(split, {"toks_int_var": ref.tokens(4)[:, :-1]}, loss, ["resid_pre"])
    with pytest.raises(cc.errors.ExperimentError, match="change nothing"):
        attribution_patching(split, {"toks_int_var": toks}, loss, ["resid_pre"])
    with pytest.raises(cc.errors.ExperimentError, match="into"):
        attribution_patching(split, {"toks_int_var": ref.tokens(4)}, loss, ["resid_pre"], into="both")
