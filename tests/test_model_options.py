"""One ``models.ModelOptions`` for every model entry point, and one ``causal`` default (True).

Every builder and loader takes the options object after its tokens and each field as a
keyword that overrides it; the default build is causal, checked here against the model's
own behaviour (a later token changes no earlier position's loss) rather than against the
mask the builder writes.  The shipped demo model is built causal, as it was trained: its
circuit equals a plain-torch causal forward of its weights written below (the training
script's), and reproduces the losses the training run recorded.
"""

from __future__ import annotations

import inspect

import attrs
import pytest
import torch
import torch.nn.functional as F

import circuits as cc
import circuits.models as cm
from circuits.models.demo_model import demo_config, demo_info, load_demo_weights, repeated_tokens
from tests.experiments_reference import attn_only_transformer_lens_state

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 31
ATTN = cm.AttnOnlyConfig(n_layers=2, n_heads=2, d_model=8, d_head=4, vocab_size=VOCAB, n_ctx=16)
GPT2 = cm.GPT2Config(1, 2, 8, VOCAB, 16)
LLAMA = cm.LlamaConfig(1, 2, 8, 8, VOCAB)


def tokens(shape=(2, 7), seed=1):
    return torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def hf_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=VOCAB, n_positions=16)
    return transformers.GPT2LMHeadModel(config).eval()


def hf_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=24,
        vocab_size=VOCAB,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config).eval()


def hf_neox():
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=16,
        intermediate_size=12,
        vocab_size=VOCAB,
        max_position_embeddings=16,
        rotary_pct=0.25,
    )
    return transformers.GPTNeoXForCausalLM(config).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    hf_gpt2().save_pretrained(directory)
    return directory


def entry_points(checkpoint) -> dict:
    """Each entry point as ``call(tokens, *args, **keywords)``: its other arguments filled in."""
    attn_w = cm.attn_only_random_weights(ATTN, seed=2)
    neox_model = hf_neox()
    _, neox_config, neox_weights = cm.hf_to_weights(neox_model.config, neox_model.state_dict())
    gpt2_model = hf_gpt2()
    return {
        "build_attn_only": lambda t, *a, **k: cm.build_attn_only(ATTN, attn_w, t, *a, **k),
        "build_gpt2": lambda t, *a, **k: cm.build_gpt2(GPT2, cm.gpt2_random_weights(GPT2), t, *a, **k),
        "build_llama": lambda t, *a, **k: cm.build_llama(LLAMA, cm.llama_random_weights(LLAMA), t, *a, **k),
        "build_neox": lambda t, *a, **k: cm.build_neox(neox_config, neox_weights, t, *a, **k),
        "from_hf": lambda t, *a, **k: cm.from_hf(gpt2_model, t, *a, **k),
        "from_hf_state_dict": lambda t, *a, **k: cm.from_hf_state_dict(
            gpt2_model.config, gpt2_model.state_dict(), t, *a, **k
        ),
        "load_hf_checkpoint": lambda t, *a, **k: cm.load_hf_checkpoint(checkpoint, t, *a, **k),
        "from_transformer_lens": lambda t, *a, **k: cm.from_transformer_lens(
            attn_only_transformer_lens_state(ATTN, attn_w), t, *a, family="attn_only", **k
        ),
        "load_demo_model": lambda t, *a, **k: cm.load_demo_model(t, *a, **k),
    }


NAMES = [
    "build_attn_only",
    "build_gpt2",
    "build_llama",
    "build_neox",
    "from_hf",
    "from_hf_state_dict",
    "load_hf_checkpoint",
    "from_transformer_lens",
    "load_demo_model",
]
#: The encoders take the options too, but for those a bidirectional model cannot honour
#: (``bert.NOT_ENCODER_OPTIONS``: tests/test_models_bert.py, tests/test_models_signatures.py).
ENCODER_NAMES = ["build_bert", "from_hf_bert", "load_sentence_transformer"]
#: tracr's compiled models take them but ``convention``, ``causal`` and ``rope`` (its own:
#: tests/test_ground_truth.py)
TRACR_NAMES = ["build_tracr"]


@pytest.fixture(scope="module")
def calls(checkpoint):
    return entry_points(checkpoint)


def test_the_list_is_every_entry_point_taking_the_options():
    def takes_options(thing) -> bool:
        try:
            return "options" in inspect.signature(thing).parameters
        except (TypeError, ValueError):
            return False

    taking = [name for name in cm.__all__ if takes_options(getattr(cm, name))]
    assert sorted(taking) == sorted(NAMES + ENCODER_NAMES + TRACR_NAMES)


# ------------------------------------------------------------- causal


def later_input_changes_earlier_loss(call) -> bool:
    """Whether changing the last input token (t[:, -2]) changes the loss at position 0."""
    t = tokens()
    changed = t.clone()
    changed[:, -2] = t[:, -2] % (VOCAB - 1) + 1
    before, after = call(t).evaluate(), call(changed).evaluate()
    return not torch.allclose(before[:, 0], after[:, 0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_point_builds_causal_by_default(calls, name):
    call = calls[name]
    assert not later_input_changes_earlier_loss(call)
    assert later_input_changes_earlier_loss(lambda t: call(t, causal=False))
    assert call(tokens()) == call(tokens(), causal=True) == call(tokens(), cm.ModelOptions())


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_point_takes_the_options_object_and_keyword_overrides(calls, name):
    call, t = calls[name], tokens()
    unmasked = cm.ModelOptions(causal=False)
    by_keyword = call(t, causal=False)
    assert call(t, unmasked) == by_keyword
    assert call(t, options=unmasked) == by_keyword
    assert call(t, unmasked, causal=True) == call(t)  # the keyword overrides the object's field
    assert call(t, unmasked, neg_inf=-1e3) == call(t, causal=False, neg_inf=-1e3)
    assert call(None, cm.ModelOptions(seq_len=5, batch_size=3)).shape == (3, 5)
    assert call(t, unmasked) != call(t)


def test_the_golden_convention_and_attach_travel_in_the_object(calls):
    t = tokens((2, 8))
    options = cm.ModelOptions(convention="golden", attach=True)
    for name in ("from_hf", "build_attn_only", "from_transformer_lens"):
        circuit = calls[name](t, options)
        assert circuit.shape == (2, 6)  # [S+2] tokens: 6 positions
        got, by_keyword = circuit.evaluate(), calls[name](t, convention="golden", attach=True).evaluate()
        torch.testing.assert_close(got, by_keyword, rtol=0, atol=0)
    # attached, the model's parameters stay in autograd (the random weights of the others need no grad)
    assert calls["from_hf"](t, options).evaluate().requires_grad
    assert not calls["from_hf"](t, options, attach=False).evaluate().requires_grad


# --------------------------------------------------------- the demo model


def plain_causal_loss(w: dict, tokens: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """The demo's training forward (scripts/train_induction.py) in plain torch: per-token loss."""
    c = demo_config()
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seq = inputs.shape[1]
    resid = w["t.w.tok_embeds"][inputs]
    pos = w["t.w.pos_embeds"][:seq]
    allowed = (
        torch.ones(seq, seq, dtype=torch.bool).tril() if causal else torch.ones(seq, seq, dtype=torch.bool)
    )
    for layer in range(c.n_layers):
        norm = F.layer_norm(
            resid, (c.d_model,), w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"], c.ln_eps
        )
        q = torch.einsum("bqd,hcd->bhqc", norm + pos, w[f"a{layer}.w.q"])
        k = torch.einsum("bkd,hcd->bhkc", norm + pos, w[f"a{layer}.w.k"])
        v = torch.einsum("bkd,hVd->bhkV", norm, w[f"a{layer}.w.v"])
        scores = (torch.einsum("bhqc,bhkc->bhqk", q, k) * c.d_head**-0.5).masked_fill(~allowed, -10000.0)
        comb = torch.einsum("bhqk,bhkV->bhqV", scores.softmax(-1), v)
        resid = torch.einsum("bhsV,hdV->bsd", comb, w[f"a{layer}.w.o"]) + resid
    final = F.layer_norm(resid, (c.d_model,), w["final.ln.w.scale"], w["final.ln.w.bias"], c.ln_eps)
    logits = torch.einsum("bsh,vh->bsv", final, w["t.w.unembed"])
    return -logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def test_demo_model_is_built_causal_as_trained():
    w = {k: v.double() for k, v in load_demo_weights().items()}
    t = repeated_tokens(4, 12)
    circuit = cm.load_demo_model(t)
    got = circuit.evaluate().double()
    causal, unmasked = plain_causal_loss(w, t), plain_causal_loss(w, t, causal=False)
    assert (got - causal).abs().max().item() < 1e-4
    assert (got - unmasked).abs().max().item() > 0.1  # the unmasked model is another model
    no_mask = cm.load_demo_model(t, causal=False).evaluate().double()
    assert (no_mask - unmasked).abs().max().item() < 1e-4
    assert cc.passes.causal_mask(circuit) == circuit  # the pass has nothing left to do


def test_demo_model_reproduces_the_losses_its_training_recorded():
    """scripts/train_induction.py evaluated its causal torch model on these rows."""
    results, half = demo_info()["results"], demo_info()["task"]["seq_len"] // 2
    seed = demo_info()["seed"] + 54321
    per_token = cm.load_demo_model(repeated_tokens(256, half, vocab_size=64, seed=seed)).evaluate()
    first, second = per_token[:, :half].mean().item(), per_token[:, half:].mean().item()
    assert first == pytest.approx(results["two_copies_first_half_loss"], abs=1e-4)
    assert second == pytest.approx(results["two_copies_second_half_loss"], abs=1e-4)


# ------------------------------------------------------------ the object


def test_options_are_frozen_and_evolve_into_new_objects():
    options = cm.ModelOptions(causal=False, seq_len=4)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        options.causal = True
    changed = options.evolve(seq_len=6)
    assert (changed.seq_len, changed.causal, options.seq_len) == (6, False, 4)
    assert options.evolve() is options
    assert options == cm.ModelOptions(seq_len=4, causal=False) != changed
    assert repr(options) == "ModelOptions(seq_len=4, causal=False)"
    assert cm.ModelOptions().changed() == {}
    cos, sin = cm.rope_cos_sin(LLAMA, 6)
    assert cm.ModelOptions(rope=(cos, sin)) == cm.ModelOptions(rope=(cos.clone(), sin.clone()))
    assert cm.ModelOptions(rope=(cos, sin)) != cm.ModelOptions(rope=(sin, cos))


@pytest.mark.parametrize(
    "make",
    [
        lambda: cm.ModelOptions(cause=False),
        lambda: cm.ModelOptions().evolve(cause=False),
        lambda: cm.build_attn_only(ATTN, cm.attn_only_random_weights(ATTN), tokens(), cause=False),
        lambda: cm.load_demo_model(tokens(), cm.ModelOptions(), cause=False),
    ],
)
def test_an_unknown_keyword_is_a_model_error_naming_it(make):
    with pytest.raises(cm.ModelError) as info:
        make()
    assert info.value.field == "cause"
    assert "'cause'" in str(info.value) and "did you mean 'causal'?" in str(info.value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("causal", "no"),
        ("attach", 1),
        ("neg_inf", float("-inf")),
        ("neg_inf", 3.0),
        ("convention", "gold"),
        ("seq_len", "5"),
        ("seq_len", 0),
        ("batch_size", True),
    ],
)
def test_a_wrong_typed_field_is_a_model_error_naming_it(field, value):
    with pytest.raises(cm.ModelError) as info:
        cm.ModelOptions(**{field: value})
    assert info.value.field == field
    with pytest.raises(cm.ModelError) as info:
        cm.load_demo_model(tokens(), **{field: value})
    assert info.value.field == field


def test_an_options_argument_that_is_no_options_object_is_refused(calls):
    with pytest.raises(cm.ModelError) as info:
        calls["from_hf"](tokens(), {"causal": False})
    assert info.value.field == "options"


def test_a_field_an_entry_point_cannot_honour_is_refused_by_name(checkpoint):
    cos, sin = cm.rope_cos_sin(LLAMA, 6)
    cases = [
        (lambda: cm.from_hf(hf_llama(), tokens(), cm.ModelOptions(rope=(cos, sin))), "rope"),
        (lambda: cm.from_hf(hf_llama(), tokens(), rope=(cos, sin)), "rope"),
        (lambda: cm.load_hf_checkpoint(checkpoint, tokens(), cm.ModelOptions(attach=True)), "attach"),
        (
            lambda: cm.build_gpt2(
                GPT2, cm.gpt2_random_weights(GPT2), tokens(), cm.ModelOptions(rope=(cos, sin))
            ),
            "rope",
        ),
    ]
    for call, field in cases:
        with pytest.raises(cm.ModelError) as info:
            call()
        assert info.value.field == field
        assert f"does not take option {field!r}" in str(info.value)
    # the default value of a field it does not take is no error
    assert cm.load_hf_checkpoint(
        checkpoint, tokens(), cm.ModelOptions(attach=False)
    ) == cm.load_hf_checkpoint(checkpoint, tokens())


def test_a_bidirectional_transformer_lens_cfg_must_ask_for_causal_false():
    w = cm.attn_only_random_weights(ATTN, seed=2)
    state = {
        k: v
        for k, v in attn_only_transformer_lens_state(ATTN, w).items()
        if not k.endswith(("mask", "IGNORE"))
    }
    cfg = {
        "n_layers": 2,
        "d_model": 8,
        "n_heads": 2,
        "d_head": 4,
        "d_vocab": VOCAB,
        "n_ctx": 16,
        "attn_only": True,
        "positional_embedding_type": "shortformer",
        "normalization_type": "LN",
        "attention_dir": "bidirectional",
        "eps": 1e-5,
        "act_fn": "gelu_new",
        "original_architecture": "attn_only",
    }
    with pytest.raises(cm.ModelError) as info:
        cm.from_transformer_lens(state, tokens(), cfg=cfg, family="attn_only")
    assert info.value.field == "causal"
    built = cm.from_transformer_lens(state, tokens(), cfg=cfg, family="attn_only", causal=False)
    assert built == cm.build_attn_only(ATTN, w, tokens(), causal=False)
