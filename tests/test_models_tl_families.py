"""``from_transformer_lens`` for the rotary families, OPT and GPT-2, against TransformerLens 4's own forward.

Nothing is downloaded: each family's random-weight Hugging Face model comes from an odd-dimension
config (tests/factories.py), and TransformerLens 4's ``TransformerBridge`` is built
around it offline (``tl_reference.bridge``: ``build_bridge_from_module``, what ``boot_transformers``
does after loading), its compatibility mode (HookedTransformer's weight processing) where a test asks
for it.  The references are TransformerLens's forward (logits, with hooks editing ``hook_z`` or
``mlp.hook_post``, its backward) and the Hugging Face model's.

What TransformerLens 3's ``HookedTransformer`` had and 4 has not, and so is no longer tested here:
its hard-coded Gemma cfg (``act_fn='gelu'``, exact GELU, where Hugging Face's Gemma uses the tanh
approximation: a bridge computes Hugging Face's); state dicts with their cfg for the rotary families
(a bridge's rotary tables are its wrapped model's: ``from_transformer_lens`` refuses a rotary model's
state dict with a TransformerLens 4 cfg); the attention-only model with shortformer positions (no
TransformerLens 4 model has them: tests/test_points.py checks it against torch); GPT-NeoX's rotated
queries and keys (TransformerLens 4's GPT-NeoX bridge has no ``hook_rot_q``/``hook_rot_k``) and OPT's
scores and pattern (its bridge has no ``hook_attn_scores``/``hook_pattern``); exact float64 agreement
on the rotary families (a bridge runs Hugging Face's eager attention, whose softmax is float32).
"""

from __future__ import annotations

import math

import factories
import pytest
import torch
from hf_reference import hf_logits, logits_of, random_tokens
from factories import GEMMA2_WINDOW, gemma, gemma2, mistral, neox, opt, qwen2
from factories import perturbed_gpt2 as gpt2
from factories import perturbed_llama as llama

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.transformer import names
from circuits.errors import ModelError
from circuits.transformer.points import HEAD_KINDS, POINT_KINDS, Point

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # TransformerLens takes seconds to import, each bridge about one to build

TOL = 1e-4  # float32, against TransformerLens and against Hugging Face
MEASURED: dict[str, float] = {}


def _tl():
    """tests/tl_reference.py, imported when a test runs (TransformerLens takes seconds to import)."""
    return pytest.importorskip("tl_reference")


def tl_from_hf(model, **processing):
    """TransformerLens 4's bridge around ``model``; ``processing``: ``enable_compatibility_mode``'s
    options, those not given off (compatibility mode off without any)."""
    if processing:
        off = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
        processing = {**off, **processing}
    return _tl().bridge(model, **processing)


def tl_logits(model, inputs, hooks=()):
    return _tl().logits(model, inputs, hooks)


#: family -> the Hugging Face model (tests/factories.py)
MODELS = {
    "gpt2": lambda: gpt2(False),
    "opt": lambda: opt(word_embed_proj_dim=39),
    "neox-parallel": lambda: neox(parallel=True, rotary_pct=0.5),
    "neox-sequential": lambda: neox(parallel=False, rotary_pct=1 / 3),
    "llama-mha": lambda: llama(4),
    "llama-gqa": lambda: llama(2),
    "qwen2": lambda: qwen2(2),
    "mistral": lambda: mistral(2),
    "gemma": lambda: gemma(1),
    "gemma2": lambda: gemma2(2),
}


@pytest.mark.parametrize("key", list(MODELS))
def test_equals_transformer_lens_and_hugging_face(key):
    """The circuit read from the bridge gives TransformerLens's logits and the Hugging Face model's,
    and the family is read off the bridge's architecture."""
    model = MODELS[key]()
    tokens = random_tokens(model.config.vocab_size, True, length=13)
    hf = hf_logits(model, tokens[:, :-1])
    bridge = tl_from_hf(model)
    circuit = cm.from_transformer_lens(bridge, tokens)
    ours = logits_of(circuit)
    theirs = tl_logits(bridge, tokens[:, :-1])
    MEASURED[f"{key}: max |ours - TL|"] = (ours - theirs).abs().max().item()
    MEASURED[f"{key}: max |ours - HF|"] = (ours - hf).abs().max().item()
    assert (ours - theirs).abs().max().item() < TOL
    assert (ours - hf).abs().max().item() < TOL
    assert hf.std().item() > 0.1  # logits that a wiring mistake would move


@pytest.mark.parametrize("key", ["neox-parallel", "llama-gqa", "qwen2", "mistral", "gemma", "gemma2", "opt"])
def test_zero_ablated_head_equals_transformer_lens_hook_z(key):
    """Zero-ablating head 1.2 of the split circuit equals TransformerLens with that head's
    ``hook_z`` zeroed; the unablated logits differ (the head matters)."""
    model = MODELS[key]()
    tokens = random_tokens(model.config.vocab_size, True, length=11, seed=2)
    bridge = tl_from_hf(model)
    circuit = cm.from_transformer_lens(bridge, tokens)
    split = cc.passes.split_heads(circuit)
    assert (logits_of(split) - logits_of(circuit)).abs().max().item() < 1e-5
    ablated = ex.zero_ablate(split, names.head(1, 2))

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    want = tl_logits(bridge, tokens[:, :-1], [("blocks.1.attn.hook_z", zero_head)])
    assert (logits_of(ablated) - want).abs().max().item() < TOL
    assert (logits_of(circuit) - want).abs().max().item() > 1e-3


def test_family_and_options_are_checked_against_the_bridge():
    """A family unlike the bridge's architecture, or one unknown, an option unlike its cfg's, a cfg
    given with the bridge, and a rotary model's state dict with its cfg are refused, naming them."""
    bridge = tl_from_hf(qwen2(2))
    tokens = random_tokens(97, False)
    with pytest.raises(
        ModelError, match=r"family='llama' but the bridge's cfg.architecture is 'Qwen2ForCausalLM'"
    ):
        cm.from_transformer_lens(bridge, tokens, family="llama")
    with pytest.raises(ModelError, match=r"family 'gptj' is not one of"):
        cm.from_transformer_lens(bridge, tokens, family="gptj")
    assert cm.from_transformer_lens(bridge, tokens, family="qwen2") == cm.from_transformer_lens(
        bridge, tokens
    )
    with pytest.raises(ModelError, match=r"act='relu' but the cfg's act_fn is 'silu'"):
        cm.from_transformer_lens(bridge, tokens, act="relu")
    with pytest.raises(ModelError, match=r"cfg= is given with a TransformerBridge"):
        cm.from_transformer_lens(bridge, tokens, cfg=bridge.cfg)
    with pytest.raises(ModelError, match=r"pass the TransformerBridge"):
        cm.from_transformer_lens(bridge.tl_parameters(), tokens, cfg=bridge.cfg)
    with pytest.raises(ModelError, match=r"give family="):
        cm.from_transformer_lens(bridge.tl_parameters(), tokens)


def test_processed_weights_are_exact_or_refused():
    """Compatibility mode's folded norms and centred writing weights and unembedding are still the model
    TransformerLens runs, and the circuit gives its logits; a folded model's state dict without its cfg
    is refused listing the missing norm keys (``missing_keys``) and naming the likely cause; value biases
    folded into ``b_O`` (Qwen2's), for which the Llama builder has no node, are refused naming ``b_O``."""
    tokens = random_tokens(97, True)
    for model, processing in (
        (llama(2), {"fold_ln": True, "center_writing_weights": False, "center_unembed": False}),
        (gpt2(False), {"fold_ln": True, "center_writing_weights": False, "center_unembed": False}),
        (neox(), {"fold_ln": False, "center_writing_weights": True, "center_unembed": True}),
    ):
        bridge = tl_from_hf(model, fold_value_biases=False, **processing)
        ours = logits_of(cm.from_transformer_lens(bridge, tokens))
        assert (ours - tl_logits(bridge, tokens[:, :-1])).abs().max().item() < TOL
    folded = factories.tl_model(compat=True)  # TransformerLens 4 keeps folded norms as unit weights
    state = {k: v.detach() for k, v in folded.tl_parameters().items()}
    assert torch.equal(state["blocks.0.ln1.w"], torch.ones(12))
    # TransformerLens 3's folded state dict has no norm weights at all: refused listing them
    norms = [f"blocks.{i}.ln{j}.{p}" for i in (0, 1) for j in (1, 2) for p in "wb"]
    norms += ["ln_final.w", "ln_final.b"]
    with pytest.raises(ModelError, match="folded layer norms") as info:  # the likely cause
        without = {k: v for k, v in state.items() if k not in norms}
        cm.from_transformer_lens(without, random_tokens(17, True), family="gpt2")
    assert info.value.missing_keys == norms
    value_folded = tl_from_hf(qwen2(2), fold_value_biases=True, fold_ln=False)
    with pytest.raises(ModelError, match=r"'blocks.0.attn.b_O'.*fold_value_biases=False"):
        cm.from_transformer_lens(value_folded, tokens)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"use_qk_norm": True}, "use_qk_norm=True"),
        ({"rotary_adjacent_pairs": True}, "rotary_adjacent_pairs=True"),
        ({"parallel_attn_mlp": True}, "parallel_attn_mlp=True (expected False for family 'gemma2')"),
        ({"act_fn": "gelu_fast"}, "act_fn 'gelu_fast' is not supported"),
        ({"use_dynamic_ntk_rope": True}, "use_dynamic_ntk_rope=True"),
        ({"qk_norm_after_rope": True}, "qk_norm_after_rope=True"),
    ],
)
def test_cfg_options_the_builder_lacks_are_refused(change, fragment):
    bridge = tl_from_hf(gemma2(2))
    for key, value in change.items():
        setattr(bridge.cfg, key, value)
    with pytest.raises(ModelError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        cm.from_transformer_lens(bridge, random_tokens(97, False))


def test_gemma2_window_and_caps_matter():
    """The Gemma 2 circuit's windowed layers and soft-caps are the wrapped model's: sequences longer
    than the window, and caps small enough to bend the values, still agree; here the circuit read with
    either dropped from the model's config is measurably different, so the agreement is not vacuous."""
    model = gemma2(2)
    bridge = tl_from_hf(model)
    tokens = random_tokens(97, True, length=3 * GEMMA2_WINDOW)
    want = tl_logits(bridge, tokens[:, :-1])
    assert (logits_of(cm.from_transformer_lens(bridge, tokens)) - want).abs().max().item() < TOL
    for field, value in (("sliding_window", 10**6), ("attn_logit_softcapping", None)):
        kept = getattr(model.config, field)
        setattr(model.config, field, value)
        loose = logits_of(cm.from_transformer_lens(bridge, tokens))
        setattr(model.config, field, kept)
        assert (loose - want).abs().max().item() > 1e-3, field


def test_report_measured_diffs():
    """Not a check: prints the largest logit diffs measured above (pytest -s to see them)."""
    for key, value in sorted(MEASURED.items()):
        print(f"{key} = {value:.3g}")
    assert all(math.isfinite(v) for v in MEASURED.values())


# ------------------------------------------------ the toolkit on each family, against TransformerLens

TOOLKIT = [
    "gpt2",
    "opt",
    "neox-parallel",
    "neox-sequential",
    "llama-gqa",
    "qwen2",
    "mistral",
    "gemma",
    "gemma2",
]


def tl_point(bridge, cache, tokens, kind, layer, head):
    """TransformerLens's value of the activation point ``kind``, in our node's layout and meaning
    (docs/models.md's table of kinds; the rotary families' and the layouts' differences here), or None
    where TransformerLens 4 has no hook for it (GPT-NeoX's rotated queries and keys)."""
    from test_points import tl_expected

    cfg = bridge.cfg
    group = cfg.n_heads // (cfg.n_key_value_heads or cfg.n_heads)
    block = f"blocks.{layer}."
    if kind in ("attn_scores", "attn_probs") and block + "attn.hook_pattern" not in cache:
        return None
    if kind == "attn_out":  # ours is without the output bias (a Llama's has none)
        bias = bridge.blocks[layer].attn.b_O
        return cache[block + "hook_attn_out"] - (0 if bias is None else bias)
    if kind in ("q", "k", "v", "z"):  # ours [b, h, s, c] after the rotation, one per query head
        rotated = cfg.positional_embedding_type == "rotary" and kind in ("q", "k")
        hook = block + f"attn.hook_{'rot_' if rotated else ''}{kind}"
        if hook not in cache:
            return None
        value = cache[hook].transpose(1, 2)
        value = value.repeat_interleave(group, 1) if kind in ("k", "v") else value
        return value if head is None else value[:, head]
    if kind in ("ln1", "ln2", "ln_final"):  # after the weight: the norm's output hook
        return cache[(block if layer is not None else "") + f"{kind}.hook_out"]
    if kind == "resid_mid" and cfg.parallel_attn_mlp:  # TransformerLens has none: the residual plus attention
        return cache[block + "hook_resid_pre"] + cache[block + "hook_attn_out"]
    if kind == "pos_embed":  # TransformerLens 4's has the batch axis
        return cache["hook_pos_embed"][0]
    return tl_expected(bridge, cache, kind, layer, head, tokens)


@pytest.mark.parametrize("key", TOOLKIT)
def test_every_activation_point_equals_transformer_lens(key):
    """Every activation point of the circuit, split and unsplit, is TransformerLens's hook value (in
    our layout), and every kind a family has finds one node per layer (per head when split)."""
    model = MODELS[key]()
    bridge = tl_from_hf(model)
    tokens = random_tokens(model.config.vocab_size, True, length=9)
    circuit = cm.from_transformer_lens(bridge, tokens)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens[:, :-1])
        cache.compute_head_results()  # TransformerLens's per-head results (for head_out)
    heads = bridge.cfg.n_heads
    wanted = {
        "unsplit": ex.run_with_cache(circuit),
        "split": ex.run_with_cache(
            cc.passes.split_heads(circuit),
            [(kind, layer, h) for kind in HEAD_KINDS for layer in range(2) for h in range(heads)],
        ),
    }
    rotary = bridge.cfg.positional_embedding_type == "rotary"
    lacking = {"head_out"} | ({"pos_embed"} if rotary else set())  # head_out: split circuits only
    assert {kind for kind, _, _ in wanted["unsplit"]} == set(POINT_KINDS) - lacking
    compared = 0
    for variant, found in wanted.items():
        for (kind, layer, head), ours in found.items():
            theirs = tl_point(bridge, cache, tokens, kind, layer, head)
            if theirs is None:  # TransformerLens 4 lacks the hook: GPT-NeoX's rotated q and k, OPT's
                missing = {"q", "k"} if key.startswith("neox") else {"attn_scores", "attn_probs"}
                assert key.startswith(("neox", "opt")) and kind in missing, (kind, layer)  # scores
                continue
            if key == "opt" and theirs.shape != ours.shape:  # OPT's layer flattens batch and positions
                theirs = theirs.reshape(ours.shape)  # before its MLP norm (Hugging Face's OPTDecoderLayer)
            if kind == "attn_scores":  # masked: -inf or the dtype's lowest (Hugging Face's), ours NEG_INF
                keep = theirs > torch.finfo(theirs.dtype).min / 2
                ours, theirs = ours[keep], theirs[keep]
            assert ours.shape == theirs.shape, (variant, kind, layer, head)
            assert (ours - theirs).abs().max().item() < TOL, (variant, kind, layer, head)
            compared += 1
    assert compared > 40


@pytest.mark.parametrize("key", TOOLKIT)
def test_patching_a_point_equals_transformer_lens_hook(key):
    """``ex.patch`` of layer 1's ``z`` (and layer 0's ``mlp_post``) from corrupted tokens equals
    TransformerLens with the hook's value replaced by its value on the corrupted tokens."""
    model = MODELS[key]()
    bridge = tl_from_hf(model)
    clean = random_tokens(model.config.vocab_size, True, length=9, seed=3)
    corrupted = random_tokens(model.config.vocab_size, True, length=9, seed=4)
    circuit = cm.from_transformer_lens(bridge, clean)
    with torch.no_grad():
        _, source = bridge.run_with_cache(corrupted[:, :-1])
    for kind, layer, hook in (("z", 1, "blocks.1.attn.hook_z"), ("mlp_post", 0, "blocks.0.mlp.hook_post")):
        patched = ex.patch(circuit, Point(kind, layer), {names.TOKENS: corrupted})
        want = tl_logits(bridge, clean[:, :-1], [(hook, lambda value, hook, name=hook: source[name])])
        assert (logits_of(patched) - want).abs().max().item() < TOL, kind
        assert (logits_of(circuit) - want).abs().max().item() > 1e-3, kind


def _tl_loss(bridge, tokens):
    """TransformerLens's per-token loss of predicting ``tokens[:, 1:]`` from ``tokens[:, :-1]``."""
    log_probs = torch.log_softmax(tl_logits(bridge, tokens[:, :-1]), dim=-1)
    return -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]


@pytest.mark.parametrize("key", TOOLKIT)
def test_causal_scrubbing_runs_on_the_family(key):
    """On the split circuit: a hypothesis claiming the whole model exactly gives TransformerLens's loss
    on the reference examples, one claiming nothing its loss on the drawn examples, and one claiming
    head 1.2 alone gives another loss (the scrub reaches inside the family's layers)."""
    from circuits.causal_scrubbing import (
        Correspondence,
        Dataset,
        ExactSampler,
        Experiment,
        InterpNode,
        UncondSampler,
        corr_root_matcher,
    )

    model = MODELS[key]()
    bridge = tl_from_hf(model)
    tokens = torch.randint(0, model.config.vocab_size, (24, 8), generator=torch.Generator().manual_seed(5))
    circuit = cc.passes.split_heads(cm.from_transformer_lens(bridge, tokens[:2]))
    values = {}
    for claim in ("all", "none", "head"):
        corr = Correspondence()
        root = InterpNode(UncondSampler() if claim == "none" else ExactSampler(), "root")
        corr.add(root, corr_root_matcher)
        if claim == "head":
            corr.add(root.make_descendant(ExactSampler(), "head"), corr_root_matcher.chain(names.head(1, 2)))
        scrubbed = Experiment(circuit, Dataset.from_tokens(tokens), corr, random_seed=0).scrub(6)
        values[claim] = scrubbed.evaluate()
        if claim != "head":
            data = scrubbed.ref_ds if claim == "all" else scrubbed.sampled_inputs[root]
            want = _tl_loss(bridge, data.toks_int_var.value)
            assert (values[claim] - want).abs().max().item() < TOL, claim
    assert (values["head"] - values["all"]).abs().max().item() > 1e-3
    assert (values["head"] - values["none"]).abs().max().item() > 1e-3


@pytest.mark.parametrize("key", ["neox-parallel", "llama-gqa", "gemma2"])
def test_attached_gradients_equal_transformer_lens_backward(key):
    """With ``attach=True`` the circuit's arrays are views of the bridge's parameters: the mean loss's
    backward through the circuit fills each parameter's ``.grad`` as TransformerLens's own backward,
    and leaves none the bridge's forward does not use (GPT-NeoX's fused ``qkv``, which the bridge
    computes with as its split ``q``, ``k``, ``v``)."""
    bridge = tl_from_hf(MODELS[key]())
    tokens = random_tokens(97, True, length=9)
    circuit = cm.from_transformer_lens(bridge, tokens, attach=True)
    cc.evaluate(circuit).mean().backward()
    ours = {name: p.grad for name, p in bridge.named_parameters()}
    bridge.zero_grad(set_to_none=True)
    log_probs = torch.log_softmax(bridge(tokens[:, :-1]), dim=-1)
    (-log_probs.gather(-1, tokens[:, 1:, None])).mean().backward()
    used = 0
    for name, param in bridge.named_parameters():
        assert (ours[name] is None) == (param.grad is None), name
        if param.grad is not None:
            assert (ours[name] - param.grad).abs().max().item() < 1e-5, name
            used += 1
    assert used > len(ours) * 3 / 4


@pytest.mark.parametrize("masked", [True, False])
def test_native_model_family_and_mask_from_its_cfg(masked):
    """TransformerLens 4's natively booted model (no Hugging Face architecture) reads as family ``gpt2``;
    built ``causal`` as its ``attention_dir`` says it gives TransformerLens's logits, and its
    ``tl_parameters()`` with its cfg build the same circuit.  A bidirectional cfg is refused with the
    default ``causal=True`` (the bridge and its state dict alike), naming the field."""
    bridge = factories.tl_model("gpt2", masked)
    tokens = torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(1))
    circuit = cm.from_transformer_lens(bridge, tokens, causal=masked)
    ours = logits_of(circuit)
    assert (ours - tl_logits(bridge, tokens[:, :-1])).abs().max().item() < TOL
    if masked:
        other = cm.from_transformer_lens(bridge, tokens, causal=False)
    else:  # causal=True is refused for this cfg (below): the causal_mask pass masks it
        other = cc.passes.causal_mask(circuit)
    assert (logits_of(other) - ours).abs().max().item() > 1e-3  # the mask matters
    state = {k: v.detach() for k, v in bridge.tl_parameters().items()}
    assert cm.from_transformer_lens(state, tokens, cfg=bridge.cfg, causal=masked) == cm.from_transformer_lens(
        bridge, tokens, family="gpt2", causal=masked
    )
    assert cm.from_transformer_lens(state, tokens, family="gpt2", causal=masked) == cm.from_transformer_lens(
        bridge, tokens, causal=masked
    )
    if not masked:  # the default (causal) is refused for a bidirectional cfg, by name
        for source, cfg in ((bridge, None), (state, bridge.cfg)):
            with pytest.raises(ModelError) as info:
                cm.from_transformer_lens(source, tokens, cfg=cfg)
            assert info.value.field == "causal"


def llama3(seed: int = 0):
    """A Llama with Llama 3's scaled rotary positions (NTK by parts), long wavelengths well scaled."""
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    return factories.llama(
        2,
        seed=seed,
        rms_norm_eps=1e-5,
        rope_scaling=dict(rope, original_max_position_embeddings=8, rope_theta=10000.0),
    )


def test_llama3_scaled_rotary_uses_the_wrapped_models_tables():
    """Llama 3's NTK-by-parts rotary: the circuit takes the wrapped Hugging Face model's tables (the
    bridge's cfg does not record the scaling), so it gives TransformerLens's logits and Hugging Face's;
    the plain tables give others at these positions."""
    model = llama3()
    tokens = random_tokens(97, True, length=13)
    hf = hf_logits(model, tokens[:, :-1])
    bridge = tl_from_hf(model)
    circuit = cm.from_transformer_lens(bridge, tokens)
    ours = logits_of(circuit)
    assert (ours - tl_logits(bridge, tokens[:, :-1])).abs().max().item() < TOL
    assert (ours - hf).abs().max().item() < TOL
    plain = cm.rope_cos_sin(cm.LlamaConfig(n_layers=1, n_heads=4, d_model=32, d_mlp=1, vocab_size=1), 12)
    scaled = circuit.get_unique(names.ROPE_COS).evaluate()
    assert (plain[0] - scaled).abs().max().item() > 1e-3  # the scaling matters at these positions


@pytest.mark.parametrize("masked", [True, False])
def test_float64_native_model_equals_transformer_lens_exactly(masked):
    """A float64 native bridge's circuit is TransformerLens's forward to float64 rounding.  (A bridge around
    a Hugging Face model is not: its eager attention takes the softmax in float32 even in float64 models,
    so TransformerLens 3's exact float64 agreement on the rotary families has no TransformerLens 4
    equivalent.)"""
    bridge = factories.tl_model("gpt2", masked, dtype=torch.float64)
    tokens = torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(1))
    ours = logits_of(cm.from_transformer_lens(bridge, tokens, causal=masked))
    assert ours.dtype == torch.float64
    theirs = tl_logits(bridge, tokens[:, :-1])
    MEASURED[f"native float64 masked={masked}: max |ours - TL|"] = (ours - theirs).abs().max().item()
    assert (ours - theirs).abs().max().item() < 1e-10
