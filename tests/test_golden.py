"""The reference file of FORMAT.md reads and reprints byte for byte."""

from __future__ import annotations

import pytest

import circuits as cc


def test_golden_round_trip_is_byte_identical(golden_text):
    circuit = cc.parse(golden_text)
    assert circuit.repr() == golden_text


def test_golden_has_one_distinct_node_per_full_line(golden_text):
    circuit = cc.parse(golden_text)
    # every golden node is named, so a full line is one with text after the closing quote
    full_lines = [line for line in golden_text.split("\n") if line.rsplit("'", 1)[-1].strip()]
    assert len(cc.unique_nodes([circuit])) == 312
    assert len(full_lines) == 312


def test_golden_shapes(golden_text):
    circuit = cc.parse(golden_text)
    assert circuit.name == "t.loss"
    assert circuit.shape == (300,)
    nodes = cc.unique_nodes([circuit])
    probs = [n for n in nodes if n.name == "a.attn_probs"]
    assert len(probs) == 16
    assert all(n.shape == (300, 300) for n in probs)
    by_name = {n.name: n for n in nodes}
    assert by_name["t.w.tok_embeds"].shape == (50259, 256)
    assert by_name["idxed_embeds"].shape == (300, 256)
    assert by_name["ll"].shape == (300,)
    assert by_name["a1.w.o.head7"].shape == (256, 32)


def test_golden_parse_is_stable_and_equal(golden_text):
    assert cc.parse(golden_text) == cc.parse(golden_text)
    assert hash(cc.parse(golden_text)) == hash(cc.parse(golden_text))


def test_unloaded_golden_array_fails_only_when_asked(golden_text):
    circuit = cc.parse(golden_text)
    embeds = [n for n in cc.unique_nodes([circuit]) if n.name == "t.w.tok_embeds"][0]
    assert not embeds.is_loaded
    with pytest.raises(cc.errors.MissingTensorError, match="'t.w.tok_embeds'.*26cf3704c325241f6eb75ce7"):
        embeds.tensor()
