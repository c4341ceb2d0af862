"""``from_transformer_lens`` for the rotary families, OPT and GPT-2, against TransformerLens's own forward.

Nothing is downloaded: each family's random-weight Hugging Face model comes from an odd-dimension
config (tests/factories.py), and TransformerLens's ``HookedTransformer`` is built
offline from it as ``from_pretrained_no_processing`` would: the ``HookedTransformerConfig`` from
TransformerLens's own ``convert_hf_model_config`` (reading a ``config.json`` written to a temporary
directory) or, for the Gemmas, whose configs TransformerLens hard-codes per model name, from a copy
of its ``google/gemma-2b`` / ``google/gemma-2-2b`` entries with small dimensions; the weights from
TransformerLens's ``convert_*_weights``, loaded unprocessed.  The references are TransformerLens's
forward (logits, and with a ``hook_z`` hook zeroing one head) and the Hugging Face model's.
"""

from __future__ import annotations

import json
import math
import pathlib
import tempfile

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

lens = pytest.importorskip("transformer_lens")
pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")

TOL = 1e-4  # float32, against TransformerLens and against Hugging Face
MEASURED: dict[str, float] = {}


def _gemma_cfg(model, act_fn: str) -> dict:
    """TransformerLens's hard-coded ``google/gemma-2b`` (Gemma) or ``google/gemma-2-2b`` (Gemma 2)
    entry, with the small model's dimensions."""
    c = model.config
    cfg = dict(
        d_model=c.hidden_size,
        d_head=c.head_dim,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=act_fn,
        normalization_type="RMS",
        rotary_base=10000.0,
        rotary_dim=c.head_dim,
        positional_embedding_type="rotary",
        use_attn_scale=True,
        n_key_value_heads=c.num_key_value_heads,
        gated_mlp=True,
        final_rms=True,
        original_architecture=type(model).__name__,
    )
    if type(model).__name__ == "Gemma2ForCausalLM":
        kinds = ["local", "global"] * c.num_hidden_layers  # as TransformerLens: even layers windowed
        cfg.update(
            window_size=c.sliding_window,
            use_local_attn=True,
            attn_types=kinds[: c.num_hidden_layers],
            attn_scores_soft_cap=c.attn_logit_softcapping,
            output_logits_soft_cap=c.final_logit_softcapping,
            use_normalization_before_and_after=True,
        )
    return cfg


def _converter(architecture: str):
    from transformer_lens.pretrained import weight_conversions as wc

    return {
        "GPT2LMHeadModel": wc.convert_gpt2_weights,
        "OPTForCausalLM": wc.convert_opt_weights,
        "GPTNeoXForCausalLM": wc.convert_neox_weights,
        "LlamaForCausalLM": wc.convert_llama_weights,
        "Qwen2ForCausalLM": wc.convert_qwen2_weights,
        "MistralForCausalLM": wc.convert_mistral_weights,
        "GemmaForCausalLM": wc.convert_gemma_weights,
        "Gemma2ForCausalLM": wc.convert_gemma_weights,
    }[architecture]


def tl_from_hf(model, gemma_act: str = "gelu_pytorch_tanh", **processing):
    """TransformerLens's ``HookedTransformer`` of ``model``, built offline (see the module docstring);
    ``processing``: ``load_and_process_state_dict``'s options (all off by default).  The config.json
    goes to a fresh temporary directory: TransformerLens takes a path containing "llama" or "gemma"
    for a model name and fetches nothing, but reads no config either."""
    from transformer_lens.loading_from_pretrained import convert_hf_model_config

    architecture = type(model).__name__
    if architecture.startswith("Gemma"):
        cfg = _gemma_cfg(model, gemma_act)
    else:
        config = json.loads(model.config.to_json_string())
        if architecture == "GPT2LMHeadModel":  # the hub's config.json has it; transformers 5's object not
            config["n_ctx"] = config["n_positions"]
        with tempfile.TemporaryDirectory(prefix="hf_config_") as directory:
            path = pathlib.Path(directory) / "config.json"
            path.write_text(json.dumps(dict(config, architectures=[architecture])))
            cfg = convert_hf_model_config(directory)
        cfg.pop("tokenizer_name")  # no tokenizer offline
        if architecture == "GPTNeoXForCausalLM":  # TransformerLens's entry drops the base: 10000, Pythia's
            cfg["rotary_base"] = model.config.rope_parameters["rope_theta"]
    cfg.update(dtype=torch.float32, device="cpu", init_weights=False)
    hooked = lens.HookedTransformer(lens.HookedTransformerConfig.from_dict(cfg))
    state = _converter(architecture)(model, hooked.cfg)
    options = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    hooked.load_and_process_state_dict(
        {k: v.detach() for k, v in state.items()}, **dict(options, **processing)
    )
    return hooked.eval()


def tl_logits(hooked, inputs, hooks=()):
    with torch.no_grad():
        return hooked.run_with_hooks(inputs, fwd_hooks=list(hooks))


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
    """The circuit read from the HookedTransformer gives TransformerLens's logits and the Hugging
    Face model's, and the family is read off the cfg."""
    model = MODELS[key]()
    hooked = tl_from_hf(model)
    tokens = random_tokens(model.config.vocab_size, True, length=13)
    circuit = cm.from_transformer_lens(hooked, tokens)
    ours = logits_of(circuit)
    theirs = tl_logits(hooked, tokens[:, :-1])
    hf = hf_logits(model, tokens[:, :-1])
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
    hooked = tl_from_hf(model)
    tokens = random_tokens(model.config.vocab_size, True, length=11, seed=2)
    circuit = cm.from_transformer_lens(hooked, tokens)
    split = cc.passes.split_heads(circuit)
    assert (logits_of(split) - logits_of(circuit)).abs().max().item() < 1e-5
    ablated = ex.zero_ablate(split, names.head(1, 2))

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    want = tl_logits(hooked, tokens[:, :-1], [("blocks.1.attn.hook_z", zero_head)])
    assert (logits_of(ablated) - want).abs().max().item() < TOL
    assert (logits_of(circuit) - want).abs().max().item() > 1e-3


def test_state_dict_and_cfg_equal_the_model_and_family_is_checked():
    """``(state_dict, cfg=, family=)`` builds the same circuit as the model; a family unlike the cfg's
    architecture, or one unknown, is refused naming it."""
    hooked = tl_from_hf(qwen2(2))
    tokens = random_tokens(97, False)
    state = hooked.state_dict()
    assert cm.from_transformer_lens(
        state, tokens, cfg=hooked.cfg, family="qwen2"
    ) == cm.from_transformer_lens(hooked, tokens)
    assert cm.from_transformer_lens(state, tokens, cfg=hooked.cfg.to_dict()) == cm.from_transformer_lens(
        hooked, tokens
    )
    with pytest.raises(
        ModelError, match=r"family='llama' but cfg.original_architecture is 'Qwen2ForCausalLM'"
    ):
        cm.from_transformer_lens(hooked, tokens, family="llama")
    with pytest.raises(ModelError, match=r"family 'gptj' is not one of"):
        cm.from_transformer_lens(hooked, tokens, family="gptj")
    with pytest.raises(ModelError, match=r"pass the HookedTransformer, or its cfg as cfg="):
        cm.from_transformer_lens(state, tokens, family="qwen2")
    with pytest.raises(ModelError, match=r"give family="):
        cm.from_transformer_lens(state, tokens)
    with pytest.raises(ModelError, match=r"act='relu' but the cfg's act_fn is 'silu'"):
        cm.from_transformer_lens(hooked, tokens, act="relu")
    with pytest.raises(ModelError, match=r"cfg= is given with a HookedTransformer"):
        cm.from_transformer_lens(hooked, tokens, cfg=hooked.cfg)
    other = dict(hooked.cfg.to_dict(), original_architecture="GPTJForCausalLM")
    with pytest.raises(ModelError, match=r"'GPTJForCausalLM' is not a supported family"):
        cm.from_transformer_lens(state, tokens, cfg=other)


def test_processed_weights_are_refused_or_exact():
    """Folded layer norms are refused naming ``normalization_type``; value biases folded into
    ``b_O`` (Qwen2's) are refused naming ``b_O``; centred writing weights and unembedding are
    still the model TransformerLens runs, and the circuit gives its logits."""
    tokens = random_tokens(97, True)
    folded = tl_from_hf(llama(2), fold_ln=True)
    with pytest.raises(ModelError, match=r"normalization_type='RMSPre' \(folded layer norms"):
        cm.from_transformer_lens(folded, tokens)
    folded_gpt2 = tl_from_hf(gpt2(False), fold_ln=True)
    with pytest.raises(ModelError, match=r"normalization_type='LNPre' \(folded layer norms"):
        cm.from_transformer_lens(folded_gpt2, tokens)
    with pytest.raises(ModelError, match="folded layer norms") as info:  # the likely cause
        cm.from_transformer_lens(folded_gpt2.state_dict(), tokens, family="gpt2")
    norms = [f"blocks.{i}.ln{j}.{p}" for i in (0, 1) for j in (1, 2) for p in "wb"]
    assert info.value.missing_keys == [*norms, "ln_final.w", "ln_final.b"]
    value_folded = tl_from_hf(qwen2(2), fold_value_biases=True)
    with pytest.raises(ModelError, match=r"'blocks.0.attn.b_O'.*fold_value_biases=False"):
        cm.from_transformer_lens(value_folded, tokens)
    centred = tl_from_hf(neox(), center_writing_weights=True, center_unembed=True)
    ours = logits_of(cm.from_transformer_lens(centred, tokens))
    assert (ours - tl_logits(centred, tokens[:, :-1])).abs().max().item() < TOL


def test_gemma_with_transformer_lens_own_act_fn_is_transformer_lens_model():
    """TransformerLens's ``google/gemma-2b`` entry says ``act_fn='gelu'`` (exact erf GELU) where Hugging
    Face's Gemma uses the tanh approximation: the circuit follows TransformerLens's cfg, so it equals
    TransformerLens's forward, which is not Hugging Face's."""
    model = gemma(1)
    hooked = tl_from_hf(model, gemma_act="gelu")
    tokens = random_tokens(97, True)
    circuit = cm.from_transformer_lens(hooked, tokens)
    ours, theirs = logits_of(circuit), tl_logits(hooked, tokens[:, :-1])
    assert (ours - theirs).abs().max().item() < TOL
    MEASURED["gemma act_fn='gelu': max |TL - HF|"] = (
        (theirs - hf_logits(model, tokens[:, :-1])).abs().max().item()
    )


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"use_qk_norm": True}, "use_qk_norm=True"),
        ({"rotary_adjacent_pairs": True}, "rotary_adjacent_pairs=True"),
        ({"attn_scale": 12.0}, "attn_scale=12.0"),
        ({"parallel_attn_mlp": True}, "parallel_attn_mlp=True (expected False for family 'gemma2')"),
        ({"act_fn": "gelu_fast"}, "act_fn 'gelu_fast' is not supported"),
        ({"rotary_dim": 4}, "rotary_dim 4 is not d_head 10"),
        ({"use_dynamic_ntk_rope": True}, "use_dynamic_ntk_rope=True"),
    ],
)
def test_cfg_options_the_builder_lacks_are_refused(change, fragment):
    hooked = tl_from_hf(gemma2(2))
    cfg = dict(hooked.cfg.to_dict(), **change)
    with pytest.raises(ModelError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        cm.from_transformer_lens(hooked.state_dict(), random_tokens(97, False), cfg=cfg)


def test_gemma2_window_and_caps_matter():
    """The Gemma 2 circuit's windowed layers and soft-caps are TransformerLens's: sequences longer
    than the window, and caps small enough to bend the values, still agree (checked above); here the
    circuit built without them is measurably different, so the agreement is not vacuous."""
    hooked = tl_from_hf(gemma2(2))
    tokens = random_tokens(97, True, length=3 * GEMMA2_WINDOW)
    want = tl_logits(hooked, tokens[:, :-1])
    assert (logits_of(cm.from_transformer_lens(hooked, tokens)) - want).abs().max().item() < TOL
    for change in ({"use_local_attn": False}, {"attn_scores_soft_cap": -1.0}):
        cfg = dict(hooked.cfg.to_dict(), **change)
        loose = logits_of(cm.from_transformer_lens(hooked.state_dict(), tokens, cfg=cfg))
        assert (loose - want).abs().max().item() > 1e-3, change


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


def tl_point(hooked, cache, tokens, kind, layer, head):
    """TransformerLens's value of the activation point ``kind``, in our node's layout and meaning
    (docs/models.md's table of kinds; the rotary families' and the layouts' differences here)."""
    from test_points import tl_expected

    cfg = hooked.cfg
    group = cfg.n_heads // (cfg.n_key_value_heads or cfg.n_heads)
    block = f"blocks.{layer}."
    if kind in ("q", "k", "v", "z"):  # ours [b, h, s, c] after the rotation, one per query head
        rotated = cfg.positional_embedding_type == "rotary" and kind in ("q", "k")
        value = cache[block + f"attn.hook_{'rot_' if rotated else ''}{kind}"].transpose(1, 2)
        value = value.repeat_interleave(group, 1) if kind in ("k", "v") else value
        return value if head is None else value[:, head]
    if kind in ("ln1", "ln2", "ln_final") and cfg.normalization_type == "RMS":  # after the weight
        norm = hooked.ln_final if kind == "ln_final" else getattr(hooked.blocks[layer], kind)
        return cache[(block if layer is not None else "") + f"{kind}.hook_normalized"] * norm.w
    if kind == "resid_mid" and cfg.parallel_attn_mlp:  # TransformerLens has none: the residual plus attention
        return cache[block + "hook_resid_pre"] + cache[block + "hook_attn_out"]
    return tl_expected(hooked, cache, kind, layer, head, tokens)


@pytest.mark.parametrize("key", TOOLKIT)
def test_every_activation_point_equals_transformer_lens(key):
    """Every activation point of the circuit, split and unsplit, is TransformerLens's hook value (in
    our layout), and every kind a family has finds one node per layer (per head when split)."""
    model = MODELS[key]()
    hooked = tl_from_hf(model)
    hooked.cfg.use_attn_result = True  # for head_out
    tokens = random_tokens(model.config.vocab_size, True, length=9)
    circuit = cm.from_transformer_lens(hooked, tokens)
    with torch.no_grad():
        _, cache = hooked.run_with_cache(tokens[:, :-1])
    heads = hooked.cfg.n_heads
    wanted = {
        "unsplit": ex.run_with_cache(circuit),
        "split": ex.run_with_cache(
            cc.passes.split_heads(circuit),
            [(kind, layer, h) for kind in HEAD_KINDS for layer in range(2) for h in range(heads)],
        ),
    }
    rotary = hooked.cfg.positional_embedding_type == "rotary"
    lacking = {"head_out"} | ({"pos_embed"} if rotary else set())  # head_out: split circuits only
    assert {kind for kind, _, _ in wanted["unsplit"]} == set(POINT_KINDS) - lacking
    for variant, found in wanted.items():
        for (kind, layer, head), ours in found.items():
            theirs = tl_point(hooked, cache, tokens, kind, layer, head)
            if kind == "attn_scores":  # masked pairs: TransformerLens -inf, ours NEG_INF
                keep = torch.isfinite(theirs)
                ours, theirs = ours[keep], theirs[keep]
            assert ours.shape == theirs.shape, (variant, kind, layer, head)
            assert (ours - theirs).abs().max().item() < TOL, (variant, kind, layer, head)


@pytest.mark.parametrize("key", TOOLKIT)
def test_patching_a_point_equals_transformer_lens_hook(key):
    """``ex.patch`` of layer 1's ``z`` (and layer 0's ``mlp_post``) from corrupted tokens equals
    TransformerLens with the hook's value replaced by its value on the corrupted tokens."""
    model = MODELS[key]()
    hooked = tl_from_hf(model)
    clean = random_tokens(model.config.vocab_size, True, length=9, seed=3)
    corrupted = random_tokens(model.config.vocab_size, True, length=9, seed=4)
    circuit = cm.from_transformer_lens(hooked, clean)
    with torch.no_grad():
        _, source = hooked.run_with_cache(corrupted[:, :-1])
    for kind, layer, hook in (("z", 1, "blocks.1.attn.hook_z"), ("mlp_post", 0, "blocks.0.mlp.hook_post")):
        patched = ex.patch(circuit, Point(kind, layer), {names.TOKENS: corrupted})
        want = tl_logits(hooked, clean[:, :-1], [(hook, lambda value, hook: source[hook.name])])
        assert (logits_of(patched) - want).abs().max().item() < TOL, kind
        assert (logits_of(circuit) - want).abs().max().item() > 1e-3, kind


def _tl_loss(hooked, tokens):
    """TransformerLens's per-token loss of predicting ``tokens[:, 1:]`` from ``tokens[:, :-1]``."""
    log_probs = torch.log_softmax(tl_logits(hooked, tokens[:, :-1]), dim=-1)
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
    hooked = tl_from_hf(model)
    tokens = torch.randint(0, model.config.vocab_size, (24, 8), generator=torch.Generator().manual_seed(5))
    circuit = cc.passes.split_heads(cm.from_transformer_lens(hooked, tokens[:2]))
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
            want = _tl_loss(hooked, data.toks_int_var.value)
            assert (values[claim] - want).abs().max().item() < TOL, claim
    assert (values["head"] - values["all"]).abs().max().item() > 1e-3
    assert (values["head"] - values["none"]).abs().max().item() > 1e-3


@pytest.mark.parametrize("key", ["neox-parallel", "llama-gqa", "gemma2"])
def test_attached_gradients_equal_transformer_lens_backward(key):
    """With ``attach=True`` the circuit's arrays are the HookedTransformer's parameters: the mean loss's
    backward through the circuit fills each parameter's ``.grad`` as TransformerLens's own backward;
    the zero biases the builder has no node for (``b_O``, ``b_U``, ...) get none."""
    hooked = tl_from_hf(MODELS[key]())
    tokens = random_tokens(97, True, length=9)
    circuit = cm.from_transformer_lens(hooked, tokens, attach=True)
    cc.evaluate(circuit).mean().backward()
    ours = {name: p.grad for name, p in hooked.named_parameters()}
    hooked.zero_grad(set_to_none=True)
    log_probs = torch.log_softmax(hooked(tokens[:, :-1]), dim=-1)
    (-log_probs.gather(-1, tokens[:, 1:, None])).mean().backward()
    unused = {name for name, grad in ours.items() if grad is None}
    for name, param in hooked.named_parameters():
        if name in unused:
            assert name.rsplit(".", 1)[-1] in ("b_O", "b_U", "b_in", "b_out", "b_Q", "_b_K", "_b_V"), name
            assert not param.any(), name
        else:
            assert (ours[name] - param.grad).abs().max().item() < 1e-5, name
    assert len(unused) < len(ours) / 2


@pytest.mark.parametrize("masked", [True, False])
def test_attn_only_model_family_and_mask_from_its_cfg(masked):
    """TransformerLens's attention-only model (no architecture: ``attn_only`` with shortformer positions)
    reads as family ``attn_only``, masked as its ``attention_dir`` says; a cfg naming no family is refused."""
    model = factories.tl_model("attn_only", masked)
    tokens = torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(1))
    ours = logits_of(cm.from_transformer_lens(model, tokens, causal=masked))
    assert (ours - tl_logits(model, tokens[:, :-1])).abs().max().item() < TOL
    gpt2_like = factories.tl_model("gpt2", masked)  # a custom cfg: no original_architecture
    with pytest.raises(ModelError, match=r"original_architecture None is not a supported family"):
        cm.from_transformer_lens(gpt2_like, tokens)
    state = gpt2_like.state_dict()
    ours = logits_of(cm.from_transformer_lens(gpt2_like, tokens, family="gpt2", causal=masked))
    assert (ours - tl_logits(gpt2_like, tokens[:, :-1])).abs().max().item() < TOL
    assert cm.from_transformer_lens(state, tokens, family="gpt2", causal=masked) == cm.from_transformer_lens(
        gpt2_like, tokens, family="gpt2", causal=masked
    )
    if not masked:  # the default (causal) is refused for a bidirectional cfg, by name
        with pytest.raises(ModelError) as info:
            cm.from_transformer_lens(model, tokens)
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


transformers = pytest.importorskip("transformers")


def test_llama3_scaled_rotary_uses_transformer_lens_tables():
    """Llama 3's NTK-by-parts rotary: the circuit takes TransformerLens's tables from the state dict, so it
    gives TransformerLens's logits and Hugging Face's; without the tables the variant is refused, and
    with them too short for the positions asked for as well."""
    model = llama3()
    hooked = tl_from_hf(model)
    assert hooked.cfg.use_NTK_by_parts_rope
    tokens = random_tokens(97, True, length=13)
    ours = logits_of(cm.from_transformer_lens(hooked, tokens))
    hf = hf_logits(model, tokens[:, :-1])
    assert (ours - tl_logits(hooked, tokens[:, :-1])).abs().max().item() < TOL
    assert (ours - hf).abs().max().item() < TOL
    plain = logits_of(llama_unscaled(hooked, tokens))
    assert (plain - hf).abs().max().item() > 1e-3  # the scaling matters at these positions
    state = {k: v for k, v in hooked.state_dict().items() if not k.endswith(("rotary_cos", "rotary_sin"))}
    with pytest.raises(ModelError, match="use_NTK_by_parts_rope=True"):
        cm.from_transformer_lens(state, tokens, cfg=hooked.cfg)
    short = {
        k: v[:5] if k.endswith(("rotary_cos", "rotary_sin")) else v for k, v in hooked.state_dict().items()
    }
    with pytest.raises(ModelError, match="rotary tables hold 5 positions, fewer than the 12 asked for"):
        cm.from_transformer_lens(short, tokens, cfg=hooked.cfg)


def llama_unscaled(hooked, tokens):
    """The circuit with the plain rotary tables (the scaling dropped from the cfg and the tables)."""
    cfg = dict(hooked.cfg.to_dict(), use_NTK_by_parts_rope=False)
    state = {k: v for k, v in hooked.state_dict().items() if not k.endswith(("rotary_cos", "rotary_sin"))}
    return cm.from_transformer_lens(state, tokens, cfg=cfg)


@pytest.mark.parametrize("key", ["llama-gqa", "qwen2", "gemma2"])
def test_float64_llama_like_equals_transformer_lens_exactly(key):
    """A float64 HookedTransformer's rotary tables are float64 angles; the circuit takes them, so it is
    TransformerLens's forward to float64 rounding."""
    hooked = tl_from_hf(MODELS[key]())
    cfg = dict(hooked.cfg.to_dict(), dtype=torch.float64)
    wide = lens.HookedTransformer(lens.HookedTransformerConfig.from_dict(cfg))
    tables = ("rotary_cos", "rotary_sin")
    state = {
        k: v.double()
        for k, v in hooked.state_dict().items()
        if v.is_floating_point() and not k.endswith(tables)
    }
    wide.load_state_dict(state, strict=False)
    tokens = random_tokens(97, True, length=13)
    ours = logits_of(cm.from_transformer_lens(wide, tokens))
    assert ours.dtype == torch.float64
    assert (ours - tl_logits(wide, tokens[:, :-1])).abs().max().item() < 1e-10
