"""The cache analyses, direct logit attribution and the logit lens, against TransformerLens and torch.

GPT-2 of odd dimensions: every analysis against TransformerLens 4.x on the same weights (its natively
booted GPT-2 layout, ``factories.tl_model``).  Ours never applies the norms' weights in
``apply_ln_to_stack`` and folds the final norm's weight into the unembedding in ``logit_attrs``;
TransformerLens gives those numbers on its model with the norms folded (compatibility mode with
``fold_ln=True``, nothing centred), which is the reference here.  The attention-only
family is checked against ``experiments_reference``'s torch forward, Llama against
``test_points.llama_reference``.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.models as cm
import experiments_reference as reference
from circuits.errors import ExperimentError
from circuits.experiments.activations import run_with_cache
from circuits.experiments.logit_attribution import direct_logit_attribution, logit_lens
from factories import tl_model
from test_points import LLAMA, llama_reference

TOL = 1e-4  # against TransformerLens and torch
SUM_TOL = 1e-5  # components against the circuit's own logit (difference)
POSITIONS = [None, -1, 3]


def _close(ours, expected, tol=TOL):
    assert ours.shape == expected.shape, (ours.shape, expected.shape)
    assert (ours - expected).abs().max().item() < tol


def _tokens(batch=3, seq=9, vocab=17, seed=1):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def gpt2():
    """Our GPT-2 circuit, its cache, TransformerLens's cache, and TransformerLens's folded model's cache."""
    model = tl_model("gpt2", masked=True)
    tokens = _tokens()
    circuit = cm.from_transformer_lens(model, tokens, family="gpt2", causal=True)
    folded = tl_model("gpt2", masked=True)  # the same weights (the same seed), then folded
    folded.enable_compatibility_mode(
        disable_warnings=True,
        fold_ln=True,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
    )
    with torch.no_grad():
        _, tl_cache = model.run_with_cache(tokens[:, :-1])
        _, folded_cache = folded.run_with_cache(tokens[:, :-1])
    return dict(
        circuit=circuit,
        cache=run_with_cache(circuit),
        tokens=tokens,
        model=model,
        tl=tl_cache,
        folded_model=folded,
        folded=folded_cache,
    )


def _both(gpt2, method, **options):
    """Our method's (stack, labels) and the folded TransformerLens cache's, under the same options."""
    ours = getattr(gpt2["cache"], method)(return_labels=True, **options)
    with torch.no_grad():
        theirs = getattr(gpt2["folded"], method)(return_labels=True, **options)
    return ours, theirs


def _check_same(gpt2, method, **options):
    (ours, our_labels), (theirs, their_labels) = _both(gpt2, method, **options)
    assert our_labels == their_labels, (method, options)
    _close(ours, theirs)


# ------------------------------------------------------------------ GPT-2 against TransformerLens


def _lens(test):
    """A test that runs TransformerLens: slow (importing it alone takes seconds)."""
    return pytest.mark.slow(test)


@_lens
@pytest.mark.parametrize("pos_slice", POSITIONS)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"layer": 1},
        {"layer": 0},
        {"incl_mid": True},
        {"apply_ln": True},
        {"layer": 1, "apply_ln": True},
        {"layer": 1, "incl_mid": True, "apply_ln": True},
        {"layer": 1, "mlp_input": True, "apply_ln": True},
    ],
)
def test_accumulated_resid_equals_transformer_lens(gpt2, options, pos_slice):
    _check_same(gpt2, "accumulated_resid", pos_slice=pos_slice, **options)


@_lens
@pytest.mark.parametrize("pos_slice", POSITIONS)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"mode": "attn"},
        {"mode": "mlp", "incl_embeds": False},
        {"layer": 1, "mlp_input": True},
        {"layer": 1, "apply_ln": True},
        {"layer": 1, "mlp_input": True, "apply_ln": True},
        {"apply_ln": True},
        {"layer": 0},
    ],
)
def test_decompose_resid_equals_transformer_lens(gpt2, options, pos_slice):
    _check_same(gpt2, "decompose_resid", pos_slice=pos_slice, **options)


@_lens
@pytest.mark.parametrize("pos_slice", POSITIONS)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"incl_remainder": True},
        {"layer": 1, "apply_ln": True},
        {"apply_ln": True, "incl_remainder": True},
    ],
)
def test_stack_head_results_equals_transformer_lens(gpt2, options, pos_slice):
    _check_same(gpt2, "stack_head_results", pos_slice=pos_slice, **options)


@_lens
def test_decompositions_sum_to_the_residual_stream(gpt2):
    cache = gpt2["cache"]
    _close(cache.decompose_resid().sum(0), cache["resid_final"], 1e-5)
    _close(cache.decompose_resid(layer=1, mlp_input=True).sum(0), cache["resid_mid", 1], 1e-5)
    _close(cache.stack_head_results(incl_remainder=True).sum(0), cache["resid_final"], 1e-5)


@_lens
@pytest.mark.parametrize("pos_slice", POSITIONS)
def test_apply_ln_to_stack_equals_transformer_lens(gpt2, pos_slice):
    cache, folded = gpt2["cache"], gpt2["folded"]
    stack = cache.decompose_resid(layer=1, pos_slice=pos_slice)
    with torch.no_grad():
        for layer, mlp_input in [(None, False), (1, False), (0, True), (2, False)]:
            ours = cache.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
            theirs = folded.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
            _close(ours, theirs)
        ours = cache.apply_ln_to_stack(stack, 1, pos_slice=pos_slice, batch_slice=(1, 3))
        theirs = folded.apply_ln_to_stack(stack, 1, pos_slice=pos_slice, batch_slice=(1, 3))
        _close(ours, theirs)
        ours = cache.apply_ln_to_stack(
            stack[:, 2], 1, pos_slice=pos_slice, batch_slice=2, has_batch_dim=False
        )
        theirs = folded.apply_ln_to_stack(
            stack[:, 2], 1, pos_slice=pos_slice, batch_slice=2, has_batch_dim=False
        )
        _close(ours, theirs)


@_lens
@pytest.mark.parametrize("pos_slice", POSITIONS)
def test_logit_attrs_equal_folded_transformer_lens(gpt2, pos_slice):
    cache, folded = gpt2["cache"], gpt2["folded"]
    batch, seq = gpt2["tokens"].shape[0], gpt2["tokens"].shape[1] - 1
    shape = (batch,) if isinstance(pos_slice, int) else (batch, seq)
    answers = torch.randint(0, 17, shape, generator=torch.Generator().manual_seed(5))
    wrong = (answers + 3) % 17
    with torch.no_grad():
        for stack in (
            cache.stack_head_results(pos_slice=pos_slice, incl_remainder=True),
            cache.decompose_resid(pos_slice=pos_slice),
        ):
            for incorrect in (None, wrong):
                ours = cache.logit_attrs(stack, answers, incorrect, pos_slice=pos_slice)
                theirs = folded.logit_attrs(stack, answers, incorrect, pos_slice=pos_slice)
                _close(ours, theirs)
        ours = cache.logit_attrs(stack, 4, pos_slice=pos_slice)
        _close(ours, folded.logit_attrs(stack, 4, pos_slice=pos_slice))


@_lens
def test_direct_logit_attribution_sums_to_the_logit_difference_and_equals_transformer_lens(gpt2):
    tokens, model = gpt2["tokens"], gpt2["model"]
    answers, wrong = tokens[:, -1], (tokens[:, -1] + 5) % 17
    for pos in (-1, 2):
        result = direct_logit_attribution(gpt2["circuit"], answers, wrong, pos=pos)
        with torch.no_grad():
            logits = model(tokens[:, :-1])[:, pos]
            rows = torch.arange(len(answers))
            expected_total = logits[rows, answers] - logits[rows, wrong]
            stack, labels = gpt2["folded"].stack_head_results(pos_slice=pos, return_labels=True)
            per_head = gpt2["folded"].logit_attrs(stack, answers, wrong, pos_slice=pos)
        _close(result.total, expected_total)
        _close(result.values.sum(0), result.total, SUM_TOL)
        heads = [result.labels.index(label) for label in labels]
        _close(result.values[heads], per_head)
        assert result.values.shape == (len(result.labels), 3)
        assert result.labels[:2] == ["embed", "pos_embed"] and result.labels[-1] == "bias"
    single = direct_logit_attribution(gpt2["cache"], 7)
    _close(single.total, gpt2["cache"]["logits"][:, -1, 7])
    _close(single.values.sum(0), single.total, SUM_TOL)
    mixed = direct_logit_attribution(gpt2["cache"], answers, 7)  # one wrong token for every row
    _close(mixed.total, gpt2["cache"]["logits"][:, -1].gather(-1, answers[:, None])[:, 0] - single.total)
    _close(mixed.values.sum(0), mixed.total, SUM_TOL)
    pandas = pytest.importorskip("pandas")
    assert isinstance(single.to_pandas(), pandas.DataFrame) and len(single.to_pandas()) == len(
        single.records()
    )
    rows = single.records()
    assert len(rows) == len(single.labels) * 3 and rows[0] == {
        "component": "embed",
        "batch": 0,
        "value": pytest.approx(float(single.values[0, 0])),
    }


@_lens
def test_logit_lens_equals_transformer_lens_with_the_final_norm_recomputed(gpt2):
    model, tl_cache = gpt2["model"], gpt2["tl"]
    for pos in (-1, 4, None):
        lens = logit_lens(gpt2["circuit"], pos=pos, top_k=3)
        with torch.no_grad():
            resid, labels = tl_cache.accumulated_resid(apply_ln=True, pos_slice=pos, return_labels=True)
            logits = resid @ model.W_U + model.b_U
            model_logits = model(gpt2["tokens"][:, :-1])
        assert lens.labels == labels == ["0_pre", "1_pre", "final_post"]
        _close(lens.logits, logits)
        _close(lens.log_probs, torch.log_softmax(logits, -1))
        _close(lens.logits[-1], model_logits if pos is None else model_logits[:, pos])
        _close(lens.top_log_probs, torch.log_softmax(logits, -1).topk(3, -1).values)
    assert lens.top_tokens.shape == (3, 3, 8, 3)
    rows = logit_lens(gpt2["cache"], top_k=2).records()
    assert len(rows) == 3 * 3 * 2 and set(rows[0]) == {"layer", "batch", "rank", "token", "log_prob"}


@_lens
def test_split_heads_and_partial_caches_give_the_same_analyses(gpt2, monkeypatch):
    from circuits.experiments import activations

    runs = []
    compile_plan = activations.compile_plan
    monkeypatch.setattr(activations, "compile_plan", lambda *a: runs.append(a) or compile_plan(*a))
    cache = gpt2["cache"]
    split = run_with_cache(cc.passes.split_heads(gpt2["circuit"]), ["logits"])
    _close(split.stack_head_results(pos_slice=-1), cache.stack_head_results(pos_slice=-1), 1e-5)
    answers = gpt2["tokens"][:, -1]
    _close(
        direct_logit_attribution(split, answers).values, direct_logit_attribution(cache, answers).values, 1e-5
    )
    _close(logit_lens(split).logits, logit_lens(cache).logits, 1e-5)
    assert len(runs) == 2  # the cache's own run, and one for every point the analyses read
    assert list(split) == [("logits", None, None)]  # those points are kept aside


# ------------------------------------------------------------------ attention-only against torch


def _final_ln_parts(resid, w, eps=1e-5):
    """The clean run's final-norm scale and the centred residual, written in torch."""
    centred = resid - resid.mean(-1, keepdim=True)
    return centred, torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("split", [False, True])
def test_attention_only_against_torch(split):
    # the random weights are small; larger output and unembedding weights give head outputs and
    # logits of order 1, so that 1e-4 is a demanding tolerance
    w = {
        k: v.float() * (30 if k.endswith((".w.o", "unembed")) else 1)
        for k, v in reference.weights(seed=3).items()
    }
    tokens = reference.tokens(seed=4, batch=3)
    circuit = cc.passes.causal_mask(cm.build_attn_only(reference.CONFIG, w, tokens))
    cache = run_with_cache(cc.passes.split_heads(circuit) if split else circuit)
    _, logits, heads = reference.forward(w, tokens)
    n_layers, n_heads = reference.CONFIG.n_layers, reference.CONFIG.n_heads
    expected_heads = torch.stack([heads[L, h] for L in range(n_layers) for h in range(n_heads)])
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels == [f"L{L}H{h}" for L in range(n_layers) for h in range(n_heads)]
    _close(stack, expected_heads)
    embed = w["t.w.tok_embeds"][tokens[:, :-1]]
    resid = embed + expected_heads.sum(0)
    decomposed, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "0_attn_out", "1_attn_out"]  # the position embeddings feed q and k only
    _close(decomposed.sum(0), resid)
    answers, wrong = tokens[:, -1], (tokens[:, -1] + 1) % reference.CONFIG.vocab_size
    dla = direct_logit_attribution(cache, answers, wrong, pos=-1)
    rows = torch.arange(3)
    _close(dla.total, logits[rows, -1, answers] - logits[rows, -1, wrong])
    _close(dla.values.sum(0), dla.total, SUM_TOL)
    direction = (w["t.w.unembed"][answers] - w["t.w.unembed"][wrong]) * w["final.ln.w.scale"]
    _, scale = _final_ln_parts(resid[:, -1], w)
    for index, part in enumerate([embed, *expected_heads]):
        centred = part[:, -1] - part[:, -1].mean(-1, keepdim=True)
        _close(dla.values[index], (centred * scale * direction).sum(-1))
    lens = logit_lens(cache, pos=-1)
    _close(lens.logits[-1], logits[:, -1])
    first = reference.layer_norm(embed[:, -1], w["final.ln.w.scale"], w["final.ln.w.bias"])
    _close(lens.logits[0], first @ w["t.w.unembed"].T)


# ------------------------------------------------------------------ Llama against torch


def test_llama_against_torch():
    w = {  # outputs and logits of order 1 (see test_attention_only_against_torch)
        k: v * (30 if k.endswith((".w.o", ".w.down", "unembed")) else 1)
        for k, v in cm.llama_random_weights(LLAMA, seed=3).items()
    }
    tokens = _tokens(batch=2, seq=8, vocab=LLAMA.vocab_size, seed=2)
    expected = llama_reference(LLAMA, w, tokens, masked=True)
    cache = run_with_cache(cm.build_llama(LLAMA, w, tokens, causal=True))
    eps, scale, unembed = LLAMA.rms_eps, w["final.rms.w.scale"], w["t.w.unembed"]

    def lens_logits(x):
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale) @ unembed.T

    lens = logit_lens(cache, pos=-1)
    assert lens.labels == ["0_pre", "1_pre", "final_post"]
    for index, L in enumerate(range(LLAMA.n_layers)):
        _close(lens.logits[index], lens_logits(expected["resid_pre", L][:, -1]))
    _close(lens.logits[-1], expected["logits", None][:, -1])
    r = expected["ln_final_scale", None]  # RMSNorm: no centring
    stack = cache.decompose_resid()
    _close(cache.apply_ln_to_stack(stack), stack * r[..., None])
    answers, wrong = torch.tensor([1, 5]), torch.tensor([2, 2])
    dla = direct_logit_attribution(cache, answers, wrong)
    direction = (unembed[answers] - unembed[wrong]) * scale
    parts = [expected["embed", None]]
    for L in range(LLAMA.n_layers):
        parts += [expected["head_out", L, h] for h in range(LLAMA.n_heads)] + [expected["mlp_out", L]]
    hand = torch.stack([(p[:, -1] * r[:, -1, None] * direction).sum(-1) for p in parts])
    assert dla.labels[:-1] == ["embed"] + [
        label for L in range(2) for label in [*(f"L{L}H{h}" for h in range(4)), f"{L}_mlp_out"]
    ]
    _close(dla.values[:-1], hand)
    _close(dla.values[-1], torch.zeros(2))  # no norm bias, no unembedding bias
    rows = torch.arange(2)
    logits = expected["logits", None][:, -1]
    _close(dla.total, logits[rows, answers] - logits[rows, wrong])
    _close(dla.values.sum(0), dla.total, SUM_TOL)


# ------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def small():
    config = cm.GPT2Config(n_layers=2, n_heads=3, d_model=12, vocab_size=17, n_ctx=10)
    tokens = _tokens(batch=2, seq=7)
    return run_with_cache(cm.build_gpt2(config, cm.gpt2_random_weights(config, seed=2), tokens))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c: c.accumulated_resid(layer=5), r"layer=5: the model has 2 layers"),
        (lambda c: c.stack_head_results(layer="1"), r"layer='1'"),
        (lambda c: c.decompose_resid(mode="heads"), r"mode='heads'"),
        (lambda c: c.decompose_resid(pos_slice=9), r"pos_slice=9: out of range for 6"),
        (lambda c: c.accumulated_resid(mlp_input=True), r"mlp_input=True needs a layer below 2"),
        (
            lambda c: c.apply_ln_to_stack(torch.zeros(3, 2, 6, 5)),
            r"residual_stack \[3, 2, 6, 5\].*d_model=12",
        ),
        (lambda c: c.apply_ln_to_stack(torch.zeros(3, 2, 5, 12)), r"norm scale is \[2, 6\]"),
        (lambda c: c.apply_ln_to_stack(torch.zeros(3, 6, 12), has_batch_dim=False), r"give batch_slice="),
        (lambda c: c.logit_attrs(torch.zeros(3, 2, 6, 12), torch.tensor([1, 2])), r"tokens of shape \[2\]"),
        (
            lambda c: c.logit_attrs(torch.zeros(3, 2, 12), [1, 2], [1], pos_slice=-1),
            r"incorrect_tokens of shape",
        ),
        (lambda c: c.logit_attrs(torch.zeros(3, 2, 12), [1, 40], pos_slice=-1), r"ids range over \[1, 40\]"),
        (lambda c: c.logit_attrs(torch.zeros(3, 2, 12), [1.0, 2.0], pos_slice=-1), r"dtype torch.float32"),
        (lambda c: direct_logit_attribution(c, torch.tensor([1, 2, 3])), r"answer_tokens of shape \[3\]"),
        (lambda c: direct_logit_attribution(c, 1, [[2]]), r"wrong_tokens of shape \[1, 1\]"),
        (lambda c: direct_logit_attribution(c, 1, pos=6), r"pos=6"),
        (lambda c: logit_lens(c, top_k=0), r"top_k=0"),
        (lambda c: logit_lens("b0"), r"the circuit \(or its ActivationCache\)"),
    ],
)
def test_bad_input_raises_naming_it(small, call, message):
    with pytest.raises(ExperimentError, match=message):
        call(small)


def test_attention_only_and_unbatched_refusals():
    w = reference.weights(seed=1)
    batched = run_with_cache(cm.build_attn_only(reference.CONFIG, w, reference.tokens(1, batch=2)))
    with pytest.raises(ExperimentError, match="no MLPs"):
        batched.accumulated_resid(incl_mid=True)
    unbatched = run_with_cache(cm.build_attn_only(reference.CONFIG, w, reference.tokens(1, batch=None)))
    with pytest.raises(ExperimentError, match="batched circuit"):
        unbatched.decompose_resid()
