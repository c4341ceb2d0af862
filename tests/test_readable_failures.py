"""Failures that say where and why (issue 15, "Readable failures"): on real model circuits."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits import experiments as ex
from circuits import models
from circuits.models.demo_model import repeated_tokens
from circuits.core.traversal import postorder


@pytest.fixture(scope="module")
def demo():
    """The shipped 2-layer attention-only model on 2 prompts of 13 tokens, masked, heads not split."""
    return cc.passes.causal_mask(models.load_demo_model(repeated_tokens(2, 6)))


# ------------------------------------------------------------------ ex.patch


def test_patch_shape_errors_give_both_shapes(demo):
    split = cc.passes.split_heads(demo, layers=[0])
    for source in (repeated_tokens(3, 6), torch.zeros(2, 5, dtype=torch.long)):
        with pytest.raises(cc.errors.ExperimentError) as info:
            ex.patch(split, "b0.a.head1", {"toks_int_var": source})
        message = str(info.value)
        assert "'toks_int_var' has shape [2, 13]" in message
        assert f"the value given for it {list(source.shape)}" in message
        assert "'b0.a.head1' [2, 12, 64]" in message and "row for row" in message
    with pytest.raises(cc.errors.ExperimentError, match=r"shape of the inputs") as info:
        ex.resample_ablate(split, "b0.a.head1", {"toks_int_var": repeated_tokens(6, 6)})
    assert "[2, 13]" in str(info.value) and "[6, 13]" in str(info.value)


# ------------------------------------------------------------- unique_nodes


def test_unique_nodes_takes_one_circuit_or_an_iterable(demo):
    everything = cc.unique_nodes([demo])
    assert cc.unique_nodes(demo) == everything
    assert cc.unique_nodes(iter([demo, demo])) == everything
    assert postorder(demo) == postorder([demo])
    for wrong, named in ((3, "int 3"), (None, "NoneType None"), ("b0", "str 'b0'")):
        with pytest.raises(cc.errors.NodeTypeError, match=f"unique_nodes: takes a circuit .*got {named}"):
            cc.unique_nodes(wrong)
    with pytest.raises(cc.errors.NodeTypeError, match="unique_nodes: root 1 is a Tensor, not a circuit node"):
        cc.unique_nodes([demo, torch.zeros(2)])
    with pytest.raises(TypeError, match="postorder"):  # NodeTypeError is a TypeError
        postorder(7)


# ------------------------------------------------------- several nodes found


def lines_of(error: cc.errors.MatchError) -> list[str]:
    """The message's lines after the first: one per node shown."""
    return str(error).split("\n")[1:]


def test_several_found_say_layer_and_path(demo):
    with pytest.raises(cc.errors.MatchError) as info:
        demo.get_unique("a.attn_probs")
    error = info.value
    assert error.count == 2 and [cc.passes.layer_of(n) for n in error.nodes] == [0, 1]
    first, second = lines_of(error)
    assert (
        "'a.attn_probs'" in first
        and "layer 0" in first
        and first.endswith("> b0.a > a.comb_v > a.attn_probs")
    )
    assert "layer 1" in second and second.endswith("> b1 > b1.a > a.comb_v > a.attn_probs")
    assert all(line.split("path ")[1].startswith("t.loss > ll > ") for line in (first, second))
    # a long path is cut in the middle, as evaluation's error_at cuts it
    with pytest.raises(cc.errors.MatchError) as info:
        demo.get_unique("a.q")
    assert all(
        "more) ... >" in line and line.endswith("> a.attn_scores_raw > a.q") for line in lines_of(info.value)
    )


def test_several_found_on_split_heads_say_the_head(demo):
    with pytest.raises(cc.errors.MatchError) as info:
        cc.passes.split_heads(demo).get_unique("a.attn_probs")
    assert info.value.count == 8
    lines = lines_of(info.value)
    assert [line.split(": ")[1].split(", path")[0] for line in lines] == [
        f"layer {layer}, head {head}" for layer in (0, 1) for head in range(4)
    ]
    assert lines[6].endswith("> b1.a > b1.a.head2 > a.comb_v > a.attn_probs")


def test_several_found_in_gpt2_mlps_and_norms():
    config = models.GPT2Config(n_layers=2, n_heads=2, d_model=8, vocab_size=13, n_ctx=16)
    tokens = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(0))
    c = models.build_gpt2(config, models.gpt2_random_weights(config, seed=0), tokens)
    with pytest.raises(cc.errors.MatchError) as info:
        c.get_unique("m.pre")
    first, second = lines_of(info.value)
    assert "layer 0" in first and "> b0.m > " in first and "layer 1" in second and "> b1.m > " in second
    with pytest.raises(cc.errors.MatchError) as info:
        c.get_unique("ln.rsqrt")
    assert info.value.count == 5
    lines = lines_of(info.value)
    final = [line for line in lines if "layer" not in line]  # the final norm belongs to no layer
    assert len(final) == 1 and "> final.call > " in final[0]
    for layer in (0, 1):
        assert sum(f"layer {layer}, " in line for line in lines) == 2
        assert any(f"> a{layer}.norm > " in line for line in lines)
        assert any(f"> m{layer}.norm > " in line for line in lines)


def test_layer_from_the_weights_below_when_the_path_does_not_tell(demo):
    both = cc.Add(*demo.get("a.comb_v"))  # an unnamed root over both layers' attention
    with pytest.raises(cc.errors.MatchError) as info:
        both.get_unique("a.comb_v")
    lines = lines_of(info.value)
    assert [line.split(": ")[1] for line in lines] == [
        "layer 0, path <unnamed Add> > a.comb_v",
        "layer 1, path <unnamed Add> > a.comb_v",
    ]


# ------------------------------------------------------------ heads not split


def test_a_head_on_an_unsplit_layer_says_to_split_heads(demo):
    for circuit in (demo, cc.passes.split_heads(demo, layers=[0])):
        with pytest.raises(cc.errors.MatchError) as info:
            circuit.get_unique("b1.a.head2")
        assert info.value.count == 0
        message = str(info.value)
        assert "not split into heads" in message and "cc.passes.split_heads(c)" in message
        assert "cc.passes.split_heads(c, layers=[1])" in message
    assert cc.passes.split_heads(demo, layers=[1]).get_unique("b1.a.head2").name == "b1.a.head2"
    with pytest.raises(cc.errors.MatchError, match=r"split_heads\(c, layers=\[1\]\) with heads=.*\[0, 1\]"):
        demo.get_unique("b1.a.head0-1")  # a group
    assert cc.passes.split_heads(demo, layers=[1], heads=[[0, 1], [2, 3]]).get_unique("b1.a.head0-1")
    with pytest.raises(cc.errors.MatchError, match="not split into heads"):
        demo.get_unique("b1.a.head7")  # the layer has 4 heads; splitting says so
    with pytest.raises(cc.errors.MatchError) as info:  # layer 0 is split: no such head, no hint to split
        cc.passes.split_heads(demo, layers=[0]).get_unique("b0.a.head7")
    assert "split_heads" not in str(info.value)
    with pytest.raises(cc.errors.ExperimentError, match=r"zero_ablate: .*split_heads\(c, layers=\[1\]\)"):
        ex.zero_ablate(demo, "b1.a.head2")
