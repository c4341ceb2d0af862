"""cc.save / cc.load: the text plus a tensor store beside it, read back with the weights."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits.saving import store_path

SMALL = cm.AttnOnlyConfig(n_layers=2, n_heads=3, d_model=12, d_head=4, vocab_size=23, n_ctx=16)


def _model() -> cc.Circuit:
    weights = cm.attn_only_random_weights(SMALL, seed=2)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    return cc.split_heads(cc.causal_mask(cm.build_attn_only(SMALL, weights, tokens)))


def test_round_trip_with_weights_evaluates_identically(tmp_path):
    circuit = _model()
    path = cc.save(circuit, tmp_path / "model.circ")
    assert path == tmp_path / "model.circ"
    assert (tmp_path / "model.tensors").is_dir()
    assert path.read_text() == circuit.repr() + "\n"

    loaded = cc.load(path)
    assert loaded == circuit
    assert loaded.repr() == circuit.repr()
    arrays = [n for n in cc.unique_nodes([loaded]) if isinstance(n, cc.Array)]
    assert arrays and all(a.is_loaded for a in arrays)
    assert torch.equal(loaded.evaluate(), circuit.evaluate())
    # a rewrite of the loaded circuit behaves like one of the original
    ablate = lambda n: cc.Scalar(0.0, shape=n.shape)  # noqa: E731
    assert torch.equal(
        loaded.update("b1.a.head0", ablate).evaluate(), circuit.update("b1.a.head0", ablate).evaluate()
    )


def test_store_path_rule(tmp_path):
    assert store_path(tmp_path / "m.circ") == tmp_path / "m.tensors"
    assert store_path(tmp_path / "m") == tmp_path / "m.tensors"
    with pytest.raises(cc.StoreError, match="'.tensors'"):
        cc.save(_model(), tmp_path / "m.tensors")


def test_several_roots_share_references(tmp_path):
    x = cc.Array(torch.randn(3, 4), name="x")
    y = cc.Einsum.from_einsum_string("ab->b", x, name="y")
    z = cc.Add(x, cc.Scalar(2.0), name="z")
    path = cc.save([y, z], tmp_path / "two.circ")
    assert path.read_text().count("Array") == 1  # x written once, referenced by the second root
    first, second = cc.load_many(path)
    assert (first, second) == (y, z)
    torch.testing.assert_close(second.evaluate(), x.value + 2.0, rtol=0, atol=0)
    with pytest.raises(cc.ParseError, match="2 top-level circuits"):
        cc.load(path)


def test_saving_again_replaces_the_text_and_keeps_the_store(tmp_path):
    path = tmp_path / "c.circ"
    a = cc.Array(torch.ones(2), name="a")
    b = cc.Array(torch.zeros(2), name="b")
    cc.save(a, path)
    cc.save(b, path)
    assert cc.load(path) == b
    assert len(list((tmp_path / "c.tensors").glob("*.safetensors"))) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_without_a_store_arrays_are_placeholders(tmp_path):
    path = tmp_path / "bare.circ"
    circuit = cc.Add(cc.Array(torch.arange(3.0), name="w"), cc.Scalar(1.0), name="out")
    path.write_text(circuit.repr())
    loaded = cc.load(path)
    assert loaded == circuit and loaded.repr() == circuit.repr()
    with pytest.raises(cc.MissingTensorError):
        loaded.evaluate()
    # and it cannot be saved elsewhere: its tensor is nowhere
    with pytest.raises(cc.MissingTensorError, match="'w'"):
        cc.save(loaded, tmp_path / "elsewhere.circ")
    assert not (tmp_path / "elsewhere.circ").exists()


def test_placeholder_saves_back_beside_its_own_store(tmp_path):
    path = tmp_path / "m.circ"
    circuit = cc.Add(cc.Array(torch.arange(3.0), name="w"), cc.Scalar(1.0), name="out")
    cc.save(circuit, path)
    placeholder = cc.parse(path.read_text())  # parsed without the store
    cc.save(placeholder.rename("renamed"), path)  # its tensor is in the store already
    assert torch.equal(cc.load(path).evaluate(), circuit.evaluate())


def test_missing_tensor_in_the_store_names_the_line(tmp_path):
    path = tmp_path / "m.circ"
    cc.save(cc.Add(cc.Array(torch.ones(2), name="p"), cc.Array(torch.zeros(2), name="q"), name="s"), path)
    zeros_hash = cc.Array(torch.zeros(2)).content_hash
    (tmp_path / "m.tensors" / f"{zeros_hash}.safetensors").unlink()
    with pytest.raises(cc.ParseError) as caught:
        cc.load(path)
    assert caught.value.line_number == 3 and "'q'" in caught.value.line


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        cc.load(tmp_path / "nothing.circ")
