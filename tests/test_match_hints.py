"""The matcher's hints come from a registry (circuits.rewriting.hints), not from the transformer layer.

The generic matcher places found nodes and suggests ``split_heads`` only through what a naming
convention registers; ``import circuits`` registers the transformer convention's
(tests/test_readable_failures.py checks those messages). Here: the registry is the only path, and
any convention can use it.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits.rewriting import hints
from circuits.transformer import layer_hints


def _two_named(name: str) -> cc.Circuit:
    """A root over two distinct nodes of one name (found together, they make get_unique fail)."""
    return cc.Add(cc.Array(torch.zeros(2), name=name), cc.Array(torch.ones(2), name=name), name="root")


def test_import_circuits_registers_the_transformer_hints_once():
    assert layer_hints.placement in hints.PLACERS
    assert layer_hints.split_heads_hint in hints.NO_MATCH_HINTS
    hints.register(placer=layer_hints.placement, no_match=layer_hints.split_heads_hint)
    assert hints.PLACERS.count(layer_hints.placement) == 1
    assert hints.NO_MATCH_HINTS.count(layer_hints.split_heads_hint) == 1


def test_without_a_placer_no_layer_is_told(monkeypatch):
    circuit = _two_named("b1.a")  # a layer's attention output, in the transformer convention
    with pytest.raises(cc.errors.MatchError) as info:
        circuit.get_unique("b1.a")
    assert all("layer 1, path root > b1.a" in line for line in str(info.value).split("\n")[1:])
    monkeypatch.setattr(hints, "PLACERS", [])
    with pytest.raises(cc.errors.MatchError) as info:
        circuit.get_unique("b1.a")
    lines = str(info.value).split("\n")[1:]
    assert len(lines) == 2 and all(line.endswith(": path root > b1.a") for line in lines)


def test_another_convention_registers_its_own_placer_and_hint(monkeypatch):
    def placer(node, path):
        return (7, (2, 3)) if node.name == "stage7" else None

    def no_match(circuit, name):
        return "stages are numbered from 1" if name == "stage0" else ""

    monkeypatch.setattr(hints, "PLACERS", [])
    monkeypatch.setattr(hints, "NO_MATCH_HINTS", [])
    hints.register(placer=placer, no_match=no_match)
    circuit = _two_named("stage7")
    with pytest.raises(cc.errors.MatchError) as info:
        circuit.get_unique("stage7")
    assert all("layer 7, heads 2-3, path root > stage7" in line for line in str(info.value).split("\n")[1:])
    with pytest.raises(cc.errors.MatchError) as info:
        circuit.get_unique("stage0")
    assert str(info.value).endswith("; stages are numbered from 1; names that come close: 'stage7'")
    assert info.value.count == 0
