"""Property: whatever round-trips through text in memory round-trips through ``cc.save``/``cc.load``.

Random circuits of every node type, with names drawn from all of Unicode
(lone surrogates aside, which no file can hold) and the awkward ones drawn
often (``\\r``, ``\\n``, ``\\r\\n``, quotes, backslashes, ``#``), are saved and
loaded back: the same circuits, the same tensors bit for bit, the same values.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as cc
from strategies import names, root_lists

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes: -0.0 is not 0.0, and a NaN equals itself."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.detach().cpu().numpy().tobytes() == b.detach().cpu().numpy().tobytes()


def saved_and_loaded(roots: list[cc.Circuit]) -> tuple[list[cc.Circuit], str]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "c.circ"
        cc.save(roots, path)
        raw = path.read_bytes()
        return cc.load_many(path), raw.decode("utf-8")


@SETTINGS
@given(root_lists())
def test_random_circuits_round_trip_through_files(roots):
    in_memory = cc.parse_many(cc.repr_many(roots))
    assert in_memory == roots  # the premise: the text round-trips in memory
    loaded, text = saved_and_loaded(roots)
    assert loaded == roots
    assert "\r" not in text  # a raw carriage return would become a line break when read back
    originals = [n for n in cc.unique_nodes(roots) if isinstance(n, cc.Array)]
    copies = [n for n in cc.unique_nodes(loaded) if isinstance(n, cc.Array)]
    assert [n.hash for n in originals] == [n.hash for n in copies]
    for original, copy in zip(originals, copies):
        assert same_bits(original.tensor(), copy.tensor())


@SETTINGS
@given(root_lists(evaluable=True))
def test_random_circuits_evaluate_alike_after_a_round_trip(roots):
    loaded, _ = saved_and_loaded(roots)
    for before, after in zip(cc.evaluate_many(roots), cc.evaluate_many(loaded)):
        assert same_bits(before, after)


@SETTINGS
@given(st.lists(names(allow_none=False), min_size=1, max_size=4))
def test_any_name_round_trips(chosen):
    roots = [cc.Array(torch.tensor([float(i)]), name=name) for i, name in enumerate(chosen)]
    loaded, _ = saved_and_loaded(roots)
    assert [node.name for node in loaded] == chosen
    assert all(same_bits(a.tensor(), b.tensor()) for a, b in zip(roots, loaded))
