"""circuits.transformer.names: every name it builds parses back, and every name a built circuit holds is
one of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import circuits as cc
import circuits.models as cm
from circuits.transformer import names
from circuits.passes import layer_of

numbers = st.integers(0, 10**6)
parts = st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True)


# ------------------------------------------------------------------ build -> parse


@given(numbers)
def test_per_layer_names_round_trip(layer):
    for build, kind in [
        (names.block, "block"),
        (names.attn_out, "attn_out"),
        (names.resid_mid, "resid_mid"),
        (names.mlp_out, "mlp_out"),
        (names.attn_norm, "attn_norm"),
        (names.mlp_norm, "mlp_norm"),
        (names.layer_mask, "layer_mask"),
    ]:
        text = build(layer)
        assert names.parse(text) == names.Name(kind, layer)
        assert names.parse(text).text == text


@given(numbers, numbers, st.integers(0, 1000))
def test_head_names_round_trip(layer, first, extra):
    single = names.head(layer, first)
    assert names.parse_head(single) == (layer, first)
    assert names.parse_head_group(single) == (layer, first, first)
    assert names.parse(single).text == single
    group = names.head(layer, first, first + extra)
    assert names.parse_head_group(group) == (layer, first, first + extra)
    assert names.parse_head(group) == ((layer, first) if extra == 0 else None)
    assert names.parse(group).text == group


@given(numbers, parts, st.none() | st.tuples(numbers, st.integers(0, 9)))
def test_weight_names_round_trip(layer, part, heads):
    weight = names.attn_weight(layer, part)
    assert names.parse_attn_weight(weight) == (layer, part)
    if heads is not None:
        first, extra = heads
        sliced = names.head_weight(weight, first, first + extra)
        assert names.parse(sliced) == names.Name("attn_weight", layer, part, (first, first + extra))
        assert names.parse_attn_weight(sliced) == (layer, part)
        assert names.parse(sliced).text == sliced
    mlp = names.mlp_weight(layer, part)
    assert names.parse(mlp) == names.Name("mlp_weight", layer, part)
    for norm in (names.LN, names.RMS):
        for which in ("scale", "bias"):
            text = names.norm_weight(names.attn_prefix(layer), which, norm)
            assert names.parse(text) == names.Name("attn_norm_weight", layer, f"{norm}.w.{which}")
            text = names.norm_weight(names.mlp_prefix(layer), which, norm)
            assert names.parse(text).text == text


def test_masks_sliced_by_split_heads_round_trip():
    for name, expected in [
        ("t.a1.c.mask.head2", names.Name("layer_mask", 1, heads=(2, 2))),
        ("t.a.c.causal_mask.head0-3", names.Name("fixed", part=names.CAUSAL_MASK, heads=(0, 3))),
    ]:
        assert names.parse(name) == expected and expected.text == name


def test_fixed_names_parse_as_themselves():
    for name in names.FIXED:
        assert names.parse(name) == names.Name("fixed", part=name)
        assert names.parse(name).text == name
    assert names.rope_part(names.Q, "cos") == "a.q_cos" and names.norm_node(names.RMS, "y") == "rms.y"


def test_the_builders_spellings_are_unchanged():
    """The names of tests/data/attn_only_2l.circ, spelled out once, here."""
    assert names.head(3, 7) == "b3.a.head7" and names.head(2, 4, 7) == "b2.a.head4-7"
    assert names.head_weight(names.attn_weight(3, "q"), 7) == "a3.w.q.head7"
    assert [names.block(1), names.attn_out(1), names.resid_mid(1), names.mlp_out(1)] == [
        "b1",
        "b1.a",
        "b1.resid_mid",
        "b1.m",
    ]
    assert [names.attn_norm(0), names.mlp_norm(0), names.mlp_weight(0, "proj_in")] == [
        "a0.norm",
        "m0.norm",
        "m0.w.proj_in",
    ]
    assert names.norm_weight(names.FINAL, "scale") == "final.ln.w.scale"
    assert names.layer_mask(2) == "t.a2.c.mask"
    assert (names.TOKENS, names.SCORES, names.LOGITS, names.LOSS) == (
        "toks_int_var",
        "a.attn_scores",
        "t.call",
        "t.loss",
    )


@pytest.mark.parametrize(
    "name",
    [
        "b03",  # a leading zero
        "b٣.a",  # a digit that is not ASCII
        "b1.a.head3-3",  # a group of one is written 'head3'
        "b1.a.head4-2",  # a group backwards
        "b-1",
        "b1.a.head",
        "a1.w.q.head1.head2",
        "a1.w.",
        "a1.ln.w.weight",
        "m1.w.q.head0",  # MLP weights have no heads
        "b1.head0",
        "t.call.head0",  # only attention weights and masks are sliced by heads
        "x",
        "",
        "b1 ",
    ],
)
def test_names_outside_the_convention_do_not_parse(name):
    assert names.parse(name) is None


def test_parse_of_what_is_not_a_string():
    for value in (None, 3, ("b1",), b"b1"):
        assert names.parse(value) is None
        assert names.parse_head(value) is None and names.parse_head_group(value) is None


def test_builders_refuse_what_they_cannot_write():
    for bad in (-1, 1.0, True, "1", None):
        with pytest.raises(ValueError):
            names.block(bad)
    with pytest.raises(ValueError):
        names.head(0, 3, 2)
    with pytest.raises(ValueError):
        names.attn_weight(0, "q.head1")
    with pytest.raises(ValueError):
        names.norm_weight("a0", "weight")
    with pytest.raises(ValueError):
        names.norm_node(names.LN, "nope")
    with pytest.raises(ValueError):
        names.rope_part(names.Q, "tan")


def test_names_imports_nothing_of_the_package_and_no_torch():
    tree = ast.parse(Path(names.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "re", "typing"}, imported


# --------------------------------------------------------- built circuits -> parse

ATTN = cm.AttnOnlyConfig(n_layers=2, n_heads=4, d_model=16, d_head=4, vocab_size=50, n_ctx=20)
GPT2 = cm.GPT2Config(n_layers=2, n_heads=4, d_model=16, vocab_size=50, n_ctx=20)
LLAMA = cm.LlamaConfig(n_layers=2, n_heads=4, d_model=16, d_mlp=32, vocab_size=50)
LLAMA_GQA = cm.LlamaConfig(n_layers=2, n_heads=4, d_model=16, d_mlp=32, vocab_size=50, n_kv_heads=2)


def _built(family: str) -> cc.Circuit:
    if family == "attn_only":
        return cm.build_attn_only(ATTN, cm.attn_only_random_weights(ATTN), seq_len=5)
    if family == "gpt2":
        return cm.build_gpt2(GPT2, cm.gpt2_random_weights(GPT2), seq_len=5)
    config = LLAMA_GQA if family == "llama_gqa" else LLAMA
    return cm.build_llama(config, cm.llama_random_weights(config), seq_len=5)


def _variants(family: str) -> dict[str, cc.Circuit]:
    built = _built(family)
    masked = built if family != "attn_only" else cc.passes.causal_mask(built)
    return {
        "built": built,
        "split": cc.passes.split_heads(masked),
        "grouped": cc.passes.split_heads(masked, layers=[1], heads=[[0, 1], [2, 3]]),
        "knocked out": cc.passes.causal_mask(built, mask=lambda layer, head: torch.ones(5, 5).tril()),
        "knocked out, split": cc.passes.split_heads(
            cc.passes.causal_mask(built, mask=lambda layer, head: torch.ones(5, 5))
        ),
        "per-head mask, split": cc.passes.split_heads(cc.passes.causal_mask(built, mask=torch.ones(4, 5, 5))),
    }


def _names(circuit: cc.Circuit) -> set[str]:
    return {node.name for node in cc.unique_nodes([circuit]) if node.name is not None}


@pytest.mark.parametrize("family", ["attn_only", "gpt2", "llama", "llama_gqa"])
def test_every_name_of_a_built_circuit_parses_back(family):
    for variant, circuit in _variants(family).items():
        for name in _names(circuit):
            parsed = names.parse(name)
            assert parsed is not None, f"{family} {variant}: {name!r} is not in the convention"
            assert parsed.text == name


@pytest.mark.parametrize("family", ["attn_only", "gpt2", "llama"])
def test_every_weight_name_parses_as_a_weight(family):
    config = {"attn_only": ATTN, "gpt2": GPT2, "llama": LLAMA}[family]
    for name in config.weight_shapes():
        parsed = names.parse(name)
        assert parsed is not None and (
            parsed.kind.endswith("weight") or parsed.part.startswith(("t.w.", "final."))
        )


def test_every_name_of_the_golden_file_parses_back(golden_text):
    found = set(re.findall(r"^ *'([^']*)'", golden_text, flags=re.M))
    assert len(found) > 100
    for name in found:
        parsed = names.parse(name)
        assert parsed is not None and parsed.text == name, name


def test_split_heads_names_parse_to_their_layer_and_heads():
    split = _variants("gpt2")["grouped"]
    heads = sorted(names.parse_head_group(n) for n in _names(split) if names.parse_head_group(n))
    assert heads == [(1, 0, 1), (1, 2, 3)]
    sliced = {names.parse(n).heads for n in _names(split) if names.parse(n).kind == "attn_weight"}
    assert sliced == {None, (0, 1), (2, 3)}


# -------------------------------------------------------------- activation kinds


@pytest.mark.parametrize("family", ["attn_only", "gpt2", "llama"])
def test_every_activation_kind_names_a_node_of_the_built_circuit(family):
    circuit = _variants(family)["split"]
    present = _names(circuit)
    n_layers = 2
    for kind, entry in names.ACTIVATION_KINDS.items():
        if entry.scope == "model":
            layers = [n_layers] if kind == "resid_final" else [None]
        else:
            layers = range(n_layers)
        for layer in layers:
            heads = range(4) if entry.scope == "head" else [None]
            for head in heads:
                name = names.activation_name(kind, family, layer, head)
                if name is None:
                    continue
                assert name in present, f"{family}: {kind} at layer {layer} is {name!r}, not in the circuit"
                within = entry.within(layer) if callable(entry.within) else entry.within
                if within is not None:
                    assert circuit.get_unique(within).get(name), f"{kind}: no {name!r} under {within!r}"
                elif entry.shared:
                    found = {layer_of(node) for node in circuit.get(name)}
                    assert layer in found, f"{family}: no {kind} node {name!r} of layer {layer}"


def test_activation_names_per_family():
    assert names.activation_name("resid_pre", "gpt2", 0) == "embeds"
    assert names.activation_name("resid_pre", "llama", 0) == "idxed_embeds"
    assert names.activation_name("resid_pre", "attn_only", 3) == "b2"
    assert names.activation_name("resid_final", "gpt2", 12) == "b11"
    assert names.activation_name("head_out", "gpt2", 3, 7) == "b3.a.head7"
    assert names.activation_name("mlp_post", "llama", 0) == "m.gated"
    assert names.activation_name("mlp_out", "attn_only", 0) is None
    assert names.activation_name("logits", "llama") == "t.call"
    for bad in [("nope", "gpt2", 0), ("q", "bert", 0), ("resid_post", "gpt2", None), ("head_out", "gpt2", 0)]:
        with pytest.raises(ValueError):
            names.activation_name(*bad)


def test_the_models_page_lists_every_activation_kind():
    page = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    for kind in names.ACTIVATION_KINDS:
        assert f"`{kind}`" in page, f"docs/models.md does not list the activation kind {kind!r}"
