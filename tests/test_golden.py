"""The reference file of docs/format.md reads and reprints byte for byte."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import circuits as cc

# sha256 of the reference file as the format's stewards published it
REFERENCE_SHA256 = "a8abdc87eaf9ec577e74a6deca9f5288f9916167780a6da84c8a30d68aeb85f3"


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
    with pytest.raises(cc.errors.MissingTensorError) as info:
        embeds.tensor()
    assert info.value.node is embeds and embeds.extra == "26cf3704c325241f6eb75ce7"


def test_the_reference_file_is_the_specified_bytes():
    """tests/data/attn_only_2l.circ is the format's reference as published, byte for byte.

    The round trip above would still pass on a file edited consistently (a hash or a name changed,
    a newline added at the end, line endings converted on checkout), so its digest is pinned here.
    """
    data = (Path(__file__).resolve().parent / "data" / "attn_only_2l.circ").read_bytes()
    assert b"\r" not in data and not data.endswith(b"\n")
    assert hashlib.sha256(data).hexdigest() == REFERENCE_SHA256
