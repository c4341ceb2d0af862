"""``from_transformer_lens`` on TransformerLens 4's ``TransformerBridge``, hook by hook.

A bridge around each family's random-weight Hugging Face model (odd dimensions; nothing downloaded)
and TransformerLens's natively booted model, in compatibility mode and not: every hook name in the
bridge's ``run_with_cache`` is either compared with the circuit's value at its counterpart (an
activation point, or a node inside one, in TransformerLens's layout) or listed in ``NO_COUNTERPART``
with the reason; a hook in neither fails the test, so a hook TransformerLens adds is noticed.
``test_report_measured_diffs`` prints the largest difference per hook (pytest -s).
"""

from __future__ import annotations

import math
import re
from collections import deque

import factories
import pytest
import torch
from factories import gemma, gemma2, mistral, neox, opt, qwen2, sorted_shifted, tl_model
from hf_reference import hf_logits, logits_of, random_tokens

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.errors import ModelError
from circuits.transformer import names
from circuits.transformer.points import Point

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing TransformerLens takes seconds; each model a second


def _tl():
    """tests/tl_reference.py, imported when a test runs (TransformerLens takes seconds to import)."""
    return pytest.importorskip("tl_reference")


TOL = 1e-4  # float32
MEASURED: dict[str, float] = {}


def odd_gpt2(seed: int = 0):
    """A GPT-2 of odd dimensions: 3 heads of 5, d_mlp 23, vocab 19, every weight moved."""
    fields = dict(n_head=3, n_embd=15, n_inner=23, vocab_size=19, n_positions=16)
    return factories.gpt2(seed=seed, perturb=sorted_shifted(0.3, seed), **fields)


def odd_llama(seed: int = 0):
    """A Llama with grouped-query attention (3 heads of 6, one key/value head), d_model 15, every
    weight moved."""
    fields = dict(num_attention_heads=3, head_dim=6, hidden_size=15, intermediate_size=23, vocab_size=19)
    fields.update(max_position_embeddings=32, rms_norm_eps=1e-5)
    return factories.llama(1, seed=seed, perturb=sorted_shifted(0.3, seed), **fields)


def _family_models():
    return {
        "gpt2": odd_gpt2,
        "llama-gqa": odd_llama,
        "opt": lambda: opt(word_embed_proj_dim=39),
        "neox-parallel": lambda: neox(parallel=True, rotary_pct=0.5),
        "neox-sequential": lambda: neox(parallel=False, rotary_pct=1 / 3),
        "qwen2": lambda: qwen2(2),
        "mistral": lambda: mistral(2),
        "gemma": lambda: gemma(1),
        "gemma2": lambda: gemma2(2),
    }


FAMILIES = list(_family_models())
#: Compatibility mode's defaults put into a bias the family's builder has no node for (a ModelError
#: naming it: test_compatibility_mode_biases_the_builder_lacks_are_refused); these options avoid it.
COMPAT_OPTIONS = {
    "qwen2": {"fold_value_biases": False},  # b_V folded into b_O: the Llama builder has no b_O
    "neox-parallel": {"fold_ln": False},  # the final norm's bias folded into b_U: no b_U in build_neox
    "neox-sequential": {"fold_ln": False},
}

# ---------------------------------------------------------------- the hooks and their counterparts

#: TransformerLens 4 hooks with no node in the circuit, and why.
NO_COUNTERPART = {
    r"pos_embed\.hook_in": "the position ids: the circuit slices the position table [:S], no node holds ids",
}


def _below(node, name: str):
    """The nearest node named ``name`` below ``node`` (breadth first): the one of ``node``'s own layer,
    as an earlier layer's lies deeper."""
    queue, seen = deque([node]), set()
    while queue:
        current = queue.popleft()
        if current.name == name and current is not node:
            return current
        for child in current.children:
            if id(child) not in seen:
                seen.add(id(child))
                queue.append(child)
    raise AssertionError(f"no {name!r} below {node.name!r}")


class Ours:
    """The circuit's values in TransformerLens's layouts, by hook."""

    def __init__(self, circuit, model, family):
        self.circuit, self.family = circuit, family
        self.cache = ex.run_with_cache(circuit)
        heads = model.cfg.n_heads
        self.n_heads = heads
        self.group = heads // (model.cfg.n_key_value_heads or heads)
        self.split = ex.run_with_cache(
            cc.passes.split_heads(circuit),
            [("head_out", layer, h) for layer in range(model.cfg.n_layers) for h in range(heads)],
        )
        self.parallel = family.startswith("neox-parallel")

    def point(self, kind, layer=None):
        return self.cache[kind] if layer is None else self.cache[kind, layer]

    def node(self, kind, layer, name):
        """The node ``name`` inside the point ``(kind, layer)``."""
        return _below(self.circuit.get_unique(Point(kind, layer)), name).evaluate()

    def named(self, name):
        return self.circuit.get_unique(name).evaluate()

    def rope(self, hook, theirs):
        """The rotary table ``[S, d_head]``; TransformerLens's ``[1, S, rotated dims]`` (GPT-NeoX rotates
        part of each head: ours holds cos 1 and sin 0 beyond, checked here)."""
        table = self.named(names.ROPE_COS if hook.endswith("cos") else names.ROPE_SIN)
        width = theirs.shape[-1]
        assert torch.equal(table[:, width:], torch.full_like(table[:, width:], float(hook.endswith("cos"))))
        return table[:, :width], theirs[0]


def _heads_last(t):
    """TransformerLens's ``[b, s, h, c]`` as ours ``[b, h, s, c]``."""
    return t.transpose(1, 2)


def _inner(ours: Ours, part: str, layer, norm: str):
    """A norm's normalized value before its weight (``'ln.y'``/``'rms.y'``), or its ``1/scale``."""
    kind = "ln_final" if layer is None else norm
    norm_name = names.RMS if ours.family in RMS_FAMILIES else names.LN
    return ours.node(kind, layer, names.norm_node(norm_name, part))


RMS_FAMILIES = ("llama-gqa", "qwen2", "mistral", "gemma", "gemma2")


def _post_norm(ours: Ours, layer: int, which: str, part: str):
    """Gemma 2's sandwich norm ``ln1_post`` (attention) or ``ln2_post`` (MLP): its input, scale,
    normalized value or output."""
    out = names.attn_out(layer) if which == "ln1_post" else names.mlp_out(layer)
    post = ours.circuit.get_unique(f"{out}.post_norm")
    if part == "hook_out":
        return post.evaluate()
    if part == "hook_in":
        return _below(post, out).evaluate()
    inner = _below(post, names.norm_node(names.RMS, "rsqrt" if part == "hook_scale" else "y")).evaluate()
    return 1 / inner[..., None] if part == "hook_scale" else inner


def counterpart(ours: Ours, hook: str, theirs: torch.Tensor, bridge):
    """``(ours, theirs)`` in one layout for TransformerLens's hook ``hook``, or None (NO_COUNTERPART)."""
    if any(re.fullmatch(p, hook) for p in NO_COUNTERPART):
        return None
    match = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook)
    if match is None:
        return _model_hook(ours, hook, theirs)
    return _block_hook(ours, int(match.group(1)), match.group(2), theirs, bridge)


def _model_hook(ours: Ours, hook: str, theirs):
    if hook == "embed.hook_in":
        return ours.named(names.INPUT_TOKENS), theirs
    if hook in ("embed.hook_out", "hook_embed"):
        return ours.point("embed"), theirs
    if hook in ("pos_embed.hook_out", "hook_pos_embed"):
        return ours.point("pos_embed").expand_as(theirs), theirs
    if hook == "rotary_emb.hook_in":
        return ours.point("resid_pre", 0), theirs
    if hook in ("rotary_emb.hook_cos", "rotary_emb.hook_sin"):
        return ours.rope(hook, theirs)
    if hook == "ln_final.hook_in":
        return ours.point("resid_final"), theirs
    if hook == "ln_final.hook_scale":
        return 1 / ours.point("ln_final_scale")[..., None], theirs
    if hook == "ln_final.hook_normalized":
        return _inner(ours, "y", None, "ln_final"), theirs
    if hook in ("ln_final.hook_out", "unembed.hook_in"):
        return ours.point("ln_final"), theirs
    if hook in ("unembed.hook_out", "hook_unembed"):  # Gemma 2's: before the soft-cap
        return (ours.named(names.UNEMBED) if ours.family == "gemma2" else ours.point("logits")), theirs
    raise KeyError(hook)


_ATTN_OUT = ("attn.hook_out", "attn.o.hook_out", "attn.hook_hidden_states", "hook_attn_out")
_MLP_OUT = ("mlp.out.hook_out", "mlp.hook_out", "hook_mlp_out")


def _block_hook(ours: Ours, layer: int, hook: str, theirs, bridge):
    rotary = ours.family not in ("gpt2", "opt", "native")
    gated = ours.family in RMS_FAMILIES
    if hook in ("hook_in", "hook_resid_pre", "ln1.hook_in") or (hook == "ln2.hook_in" and ours.parallel):
        return ours.point("resid_pre", layer), theirs
    if hook in ("hook_resid_mid", "ln2.hook_in"):
        return ours.point("resid_mid", layer), theirs
    if hook in ("hook_out", "hook_resid_post"):
        return ours.point("resid_post", layer), theirs
    norm = re.fullmatch(r"(ln1|ln2)\.hook_(scale|normalized)", hook)
    if norm:
        which, part = norm.groups()
        if part == "scale":
            return 1 / ours.point(f"{which}_scale", layer)[..., None], theirs
        return _inner(ours, "y", layer, which), theirs
    post = re.fullmatch(r"(ln1_post|ln2_post)\.(hook_\w+)", hook)
    if post:
        return _post_norm(ours, layer, *post.groups()), theirs
    if hook in ("ln1.hook_out", "attn.hook_in", "attn.q.hook_in", "attn.k.hook_in", "attn.v.hook_in"):
        return ours.point("ln1", layer), theirs
    if hook in ("ln2.hook_out", "mlp.hook_in", "mlp.in.hook_in", "mlp.gate.hook_in"):
        return ours.point("ln2", layer), theirs
    attention = _attention_hook(ours, layer, hook, theirs, rotary)
    if attention is not None:
        return attention
    if hook in _ATTN_OUT:
        return _attn_out(ours, layer, hook), theirs
    if hook in ("mlp.hook_pre",) or hook == ("mlp.gate.hook_out" if gated else "mlp.in.hook_out"):
        return ours.point("mlp_pre", layer), theirs
    if gated and hook in ("mlp.in.hook_out", "mlp.hook_pre_linear"):
        return ours.node("mlp_out", layer, names.MLP_UP), theirs
    if hook in ("mlp.out.hook_in", "mlp.hook_post"):
        return ours.point("mlp_post", layer), theirs
    if hook in _MLP_OUT:
        if ours.family == "gemma2" and hook != "hook_mlp_out":  # the MLP's own output: before ln2_post
            return ours.named(names.mlp_out(layer)), theirs
        return ours.point("mlp_out", layer), theirs
    raise KeyError(hook)


def _attn_out(ours: Ours, layer: int, hook: str):
    """Ours ``attn_out`` is without the output bias (docs/models.md); Gemma 2's module output is
    before its sandwich norm, ``hook_attn_out`` after it."""
    if ours.family == "gemma2":
        if hook == "hook_attn_out":
            return ours.point("attn_out", layer)
        return _post_norm(ours, layer, "ln1_post", "hook_in")
    value = ours.point("attn_out", layer)
    bias = ours.circuit.get(names.attn_weight(layer, "o_bias"))
    return value + next(iter(bias)).evaluate() if bias else value


def _attention_hook(ours: Ours, layer: int, hook: str, theirs, rotary: bool):
    """q, k, v (before and after the rotation), the rotary tables, scores, pattern, z and per-head results."""
    qkv = re.fullmatch(r"attn\.(?:([qkv])\.hook_out|hook_([qkv])|hook_rot_([qk]))", hook)
    if qkv:
        which = next(g for g in qkv.groups() if g)
        value = _heads_last(theirs)
        if rotary and which != "v" and not hook.startswith("attn.hook_rot_"):  # before the rotation
            unrotated = names.Q_UNROTATED if which == "q" else names.K_UNROTATED
            return ours.node(which, layer, unrotated), value
        if which != "q" and ours.group > 1:  # ours: one key/value head per query head
            value = value.repeat_interleave(ours.group, 1)
        return ours.point(which, layer), value
    if hook in ("attn.hook_cos", "attn.hook_sin"):
        return ours.rope(hook, theirs)
    if hook == "attn.hook_attn_scores" and ours.family == "native":
        # TransformerLens 4's native attention hands the bridge its pattern where a Hugging Face one hands
        # its scores, so this hook holds the probabilities (hook_pattern's values): no scores to compare
        assert torch.equal(theirs, ours.bridge_cache[f"blocks.{layer}.attn.hook_pattern"])
        return ours.point("attn_probs", layer), theirs
    if hook == "attn.hook_attn_scores":
        return ours.point("attn_scores", layer), theirs
    if hook == "attn.hook_pattern":
        return ours.point("attn_probs", layer), theirs
    if hook in ("attn.o.hook_in", "attn.hook_z"):
        return ours.point("z", layer), _heads_last(theirs)
    if hook == "attn.hook_result":
        heads = [ours.split["head_out", layer, h] for h in range(ours.n_heads)]
        return torch.stack(heads, dim=-2), theirs
    return None


def _compare(ours_value, theirs, hook, family):
    if family == "opt" and theirs.shape != ours_value.shape:  # OPT's layer flattens batch and positions
        theirs = theirs.reshape(ours_value.shape)  # before its MLP norm (Hugging Face's OPTDecoderLayer)
    assert ours_value.shape == theirs.shape, (hook, ours_value.shape, theirs.shape)
    if not theirs.is_floating_point():
        assert torch.equal(ours_value, theirs), hook
        return 0.0
    if hook.endswith("hook_attn_scores"):  # masked: -inf or the dtype's lowest (Hugging Face's), ours NEG_INF
        keep = theirs > torch.finfo(theirs.dtype).min / 2
        assert (ours_value[~keep] == cm.NEG_INF).all(), hook
        ours_value, theirs = ours_value[keep], theirs[keep]
    return (ours_value - theirs).abs().max().item()


def check_every_hook(model, circuit, family: str, tokens, label: str) -> dict[str, float]:
    """Every hook of the bridge's ``run_with_cache`` against the circuit; ``{hook pattern: max diff}``."""
    _, cache = _tl().run_with_cache(model, tokens)
    ours = Ours(circuit, model, family)
    ours.bridge_cache = cache
    worst: dict[str, float] = {}
    unknown = []
    for hook, theirs in cache.items():
        try:
            pair = counterpart(ours, hook, theirs, model)
        except KeyError:
            unknown.append(hook)
            continue
        if pair is None:
            continue
        diff = _compare(*pair, hook, family)
        generic = re.sub(r"blocks\.\d+\.", "blocks.{L}.", hook)
        worst[generic] = max(worst.get(generic, 0.0), diff)
    assert not unknown, f"hooks with no counterpart rule: {unknown}"
    for generic, diff in worst.items():
        MEASURED[f"{label} {generic}"] = diff
        assert diff < TOL, (label, generic, diff)
    return worst


def _with_attn_result(model):
    """``hook_result`` (per-head outputs) where the bridge's attention can give it (OPT's cannot)."""
    try:
        model.set_use_attn_result(True)
    except (ValueError, RuntimeError, NotImplementedError):
        pass
    return model


# ------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("compat", [False, True], ids=["raw", "compat"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_hook_of_a_wrapped_model_equals_the_circuit(family, compat):
    """The circuit read from the bridge has TransformerLens's value at every hook with a counterpart;
    its logits are TransformerLens's (and without compatibility mode Hugging Face's)."""
    hf_model = _family_models()[family]()
    tokens = random_tokens(hf_model.config.vocab_size, True, length=9)
    hf = hf_logits(hf_model, tokens[:, :-1])
    options = COMPAT_OPTIONS.get(family, {}) if compat else {}
    model = _with_attn_result(_tl().bridge(hf_model, compat, **options))
    circuit = cm.from_transformer_lens(model, tokens)
    theirs = _tl().logits(model, tokens[:, :-1])
    MEASURED[f"{family} {'compat' if compat else 'raw'} logits"] = (
        (logits_of(circuit) - theirs).abs().max().item()
    )
    assert (logits_of(circuit) - theirs).abs().max().item() < TOL
    if not compat:
        assert (theirs - hf).abs().max().item() < TOL
    check_every_hook(model, circuit, family, tokens, f"{family} {'compat' if compat else 'raw'}")


@pytest.mark.parametrize("compat", [False, True], ids=["raw", "compat"])
@pytest.mark.parametrize("masked", [True, False], ids=["causal", "bidirectional"])
def test_every_hook_of_a_native_model_equals_the_circuit(masked, compat):
    """``boot_native``'s GPT-2 layout, causal or bidirectional, read as family ``'gpt2'``."""
    model = _with_attn_result(tl_model("gpt2", masked, compat=compat))
    tokens = random_tokens(17, True, length=9)
    circuit = cm.from_transformer_lens(model, tokens, causal=masked)
    assert (logits_of(circuit) - _tl().logits(model, tokens[:, :-1])).abs().max().item() < TOL
    label = f"native {'causal' if masked else 'bidirectional'} {'compat' if compat else 'raw'}"
    check_every_hook(model, circuit, "native", tokens, label)


def test_compatibility_mode_biases_the_builder_lacks_are_refused():
    """Compatibility mode's defaults fold Qwen2's value biases into ``b_O`` and GPT-NeoX's final norm bias
    into ``b_U``; the builders have no node for those, so the bridge is refused naming them (never a
    circuit without them)."""
    tokens = random_tokens(97, True, length=9)
    with pytest.raises(ModelError, match=r"'blocks\.0\.attn\.b_O'.*fold_value_biases=False"):
        cm.from_transformer_lens(_tl().bridge(qwen2(2), compat=True), tokens)
    with pytest.raises(ModelError, match=r"'unembed\.b_U'.*fold_ln=False"):
        cm.from_transformer_lens(_tl().bridge(neox(), compat=True), tokens)


def test_parameter_free_native_norms_are_unit_weights():
    """A native ``normalization_type='LNPre'`` (no weights) is the circuit's layer norm with unit scale
    and zero bias: TransformerLens's logits."""
    model = tl_model(normalization_type="LNPre")
    tokens = random_tokens(17, True, length=9)
    circuit = cm.from_transformer_lens(model, tokens)
    assert (logits_of(circuit) - _tl().logits(model, tokens[:, :-1])).abs().max().item() < TOL
    assert torch.equal(circuit.get_unique("a0.ln.w.scale").evaluate(), torch.ones(12))


@pytest.mark.parametrize("compat", [False, True], ids=["raw", "compat"])
@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_attached_gradients_equal_the_bridge_backward(family, compat):
    """With ``attach=True`` the circuit's arrays are views of the bridge's parameters: the mean loss's
    backward through the circuit fills each parameter's ``.grad`` as the bridge's own backward."""
    model = _tl().bridge(_family_models()[family](), compat)
    tokens = random_tokens(model.cfg.d_vocab, True, length=9)
    circuit = cm.from_transformer_lens(model, tokens, attach=True)
    cc.evaluate(circuit).mean().backward()
    ours = {name: p.grad for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    log_probs = torch.log_softmax(model(tokens[:, :-1]), dim=-1)
    (-log_probs.gather(-1, tokens[:, 1:, None])).mean().backward()
    checked = 0
    for name, param in model.named_parameters():
        if param.grad is None and ours[name] is None:
            continue
        assert ours[name] is not None and param.grad is not None, name
        assert (ours[name] - param.grad).abs().max().item() < 1e-5, name
        checked += 1
    assert checked >= 10


def test_tl_parameters_with_the_bridge_cfg_equal_the_bridge():
    """A native bridge's ``tl_parameters()`` with ``cfg=bridge.cfg`` (HookedTransformer's layout) build the
    bridge's circuit; a wrapped model's are refused (its own config holds what the cfg does not)."""
    tokens = random_tokens(17, True, length=9)
    native = tl_model(compat=True)
    state = {k: v.detach() for k, v in native.tl_parameters().items()}
    assert cm.from_transformer_lens(state, tokens, cfg=native.cfg) == cm.from_transformer_lens(native, tokens)
    for model in (_tl().bridge(odd_gpt2()), _tl().bridge(odd_llama())):
        with pytest.raises(ModelError, match=r"TransformerLens 4 cfg of a wrapped Hugging Face.*pass the"):
            cm.from_transformer_lens(model.tl_parameters(), tokens, cfg=model.cfg)


def test_what_cannot_be_read_is_refused_naming_it():
    tokens = random_tokens(17, True, length=9)
    model = tl_model()
    with pytest.raises(ModelError, match=r"cfg= is given with a TransformerBridge"):
        cm.from_transformer_lens(model, tokens, cfg=model.cfg)
    with pytest.raises(ModelError, match=r"'embed\.weight' is a TransformerBridge state-dict key"):
        cm.from_transformer_lens(model.state_dict(), tokens, family="gpt2")
    with pytest.raises(
        ModelError, match=r"family='llama' but the bridge's cfg.architecture is 'TransformerLensNative'"
    ):
        cm.from_transformer_lens(model, tokens, family="llama")
    with pytest.raises(ModelError, match=r"act='relu' but the cfg's act_fn is 'gelu_new'"):
        cm.from_transformer_lens(model, tokens, act="relu")
    llama = _tl().bridge(odd_llama())
    with pytest.raises(ModelError, match=r"rotary TransformerBridge's tables need the number of positions"):
        cm.from_transformer_lens(llama)  # no tokens, no seq_len
    with pytest.raises(ModelError) as info:
        cm.from_transformer_lens(llama, seq_len=0)
    assert info.value.field == "seq_len"


class _NumberTokenizer:
    """A tokenizer called as Hugging Face's is (``tokenizer(text)["input_ids"]``): word ``"w7"`` is id 7,
    the beginning of sequence id 0."""

    bos_token_id = 0

    def __call__(self, text: str) -> dict:
        return {"input_ids": [int(word[1:]) for word in text.split()]}


def test_model_options_reach_a_bridge():
    """A bridge takes ``models.ModelOptions`` as an object or as keywords, alike: ``causal`` is True by
    default, so a bidirectional bridge is refused naming the field until ``causal=False`` builds
    TransformerLens's model; ``attach`` makes the arrays the bridge's parameters (the circuit's backward
    reaches them; without it the circuit has no graph); ``tokenizer`` reads text; ``rope``, which a bridge
    brings itself, is refused naming it."""
    tokens = random_tokens(17, True, length=9)
    bidirectional = tl_model(masked=False)
    for refused in (
        lambda: cm.from_transformer_lens(bidirectional, tokens),
        lambda: cm.from_transformer_lens(bidirectional, tokens, cm.ModelOptions(seq_len=8)),
        lambda: cm.from_transformer_lens(bidirectional, tokens, cm.ModelOptions(causal=False), causal=True),
    ):
        with pytest.raises(ModelError) as info:
            refused()
        assert info.value.field == "causal"
    unmasked = cm.from_transformer_lens(bidirectional, tokens, cm.ModelOptions(causal=False))
    assert unmasked == cm.from_transformer_lens(bidirectional, tokens, causal=False)
    theirs = _tl().logits(bidirectional, tokens[:, :-1])
    assert (logits_of(unmasked) - theirs).abs().max().item() < TOL
    model = tl_model()
    assert not cc.evaluate(cm.from_transformer_lens(model, tokens)).requires_grad  # copies
    cc.evaluate(cm.from_transformer_lens(model, tokens, cm.ModelOptions(attach=True))).mean().backward()
    reached = [name for name, p in model.named_parameters() if p.grad is not None]
    assert len(reached) == len(list(model.parameters())), reached
    text = "w3 w5 w7 w1 w16 w2"
    ids = torch.tensor([0, 3, 5, 7, 1, 16, 2])
    by_text = cm.from_transformer_lens(model, text, cm.ModelOptions(tokenizer=_NumberTokenizer()))
    assert by_text == cm.from_transformer_lens(model, ids)
    assert by_text == cm.from_transformer_lens(model, text, tokenizer=_NumberTokenizer())
    rotary = _tl().bridge(odd_llama())
    for call in (
        lambda: cm.from_transformer_lens(rotary, random_tokens(19, True), rope=(torch.ones(8, 6),) * 2),
        lambda: cm.from_transformer_lens(
            rotary, random_tokens(19, True), cm.ModelOptions(rope=(torch.ones(8, 6),) * 2)
        ),
    ):
        with pytest.raises(ModelError) as info:
            call()
        assert info.value.field == "rope"


@pytest.mark.parametrize(
    "fields, fragment",
    [
        (
            {"positional_embedding_type": "rotary"},
            "positional_embedding_type='rotary' (TransformerLensNative rotates",
        ),
        ({"n_key_value_heads": 1}, "n_key_value_heads=1"),
        ({"attn_scores_soft_cap": 5.0}, "attn_scores_soft_cap=5.0"),
        ({"output_logits_soft_cap": 5.0}, "output_logits_soft_cap=5.0"),
        ({"attn_only": True}, "attn_only=True (expected False for family 'gpt2')"),
        ({"gated_mlp": True}, "gated_mlp=True"),
        ({"normalization_type": "RMS"}, "normalization_type='RMS'"),
        ({"act_fn": "solu"}, "act_fn 'solu' is not supported"),
        ({"attn_scale": 3.0}, "attn_scale=3.0"),
    ],
)
def test_native_options_the_builder_lacks_are_refused(fields, fragment):
    model = tl_model(**fields)
    with pytest.raises(ModelError, match=re.escape(fragment)):
        cm.from_transformer_lens(model, random_tokens(17, True, length=9))


def test_unsupported_architectures_and_hugging_face_options_are_refused():
    """A bridge whose architecture this reading is not checked for names ``cfg.architecture``; a wrapped
    model's Hugging Face option the builder lacks is refused as ``from_hf`` refuses it."""
    torch.manual_seed(0)
    config = transformers.GPTJConfig(
        n_layer=1, n_head=2, n_embd=8, rotary_dim=4, vocab_size=11, n_positions=16
    )
    gptj = _tl().bridge(transformers.GPTJForCausalLM(config).eval())
    with pytest.raises(ModelError, match=r"cfg.architecture 'GPTJForCausalLM' is not supported"):
        cm.from_transformer_lens(gptj, random_tokens(11, True, length=5))
    disagreeing = _tl().bridge(odd_gpt2())
    disagreeing.cfg.eps = 1e-3  # the bridge's norms would compute with it, the model's config says 1e-5
    with pytest.raises(ModelError, match=r"disagree: cfg.eps 0.001 but the model's epsilon 1e-05"):
        cm.from_transformer_lens(disagreeing, random_tokens(19, True, length=5))
    unscaled = odd_gpt2()
    unscaled.config.scale_attn_weights = False
    with pytest.raises(ModelError, match=r"scale_attn_weights=False"):
        cm.from_transformer_lens(_tl().bridge(unscaled), random_tokens(19, True, length=5))


def test_report_measured_diffs():
    """Not a check: prints the largest differences measured above (pytest -s to see them)."""
    for key, value in sorted(MEASURED.items()):
        print(f"{key} = {value:.3g}")
    assert all(math.isfinite(v) for v in MEASURED.values())
