"""The tensor store: arrays saved while printing and loaded back while parsing."""

from __future__ import annotations

import hashlib
import os

import pytest
import safetensors.torch
import torch

import circuits as cc


def small_circuit() -> tuple[cc.Circuit, tuple[cc.Array, ...]]:
    """A root over two arrays; a third array, h, stays outside the circuit."""
    w = cc.Array(torch.arange(12, dtype=torch.float32).reshape(3, 4), name="w")
    b = cc.Array(torch.tensor([1, 2, 3], dtype=torch.int64), name="b")
    h = cc.Array(torch.randn(2, 2, dtype=torch.float64), name="h")
    root = cc.Add(cc.Einsum.from_einsum_string("ab->a", w), b, cc.Scalar(0.5), name="root")
    return root, (w, b, h)


def test_print_saves_and_parse_loads_exact_tensors(tmp_path):
    root, arrays = small_circuit()
    store = cc.TensorStore(tmp_path / "tensors")
    text = root.repr(store=store)
    files = sorted(p.name for p in (tmp_path / "tensors").iterdir())
    assert len(files) == 2  # 'h' is not in the circuit; w and b are
    again = cc.parse(text, store=store)
    assert again == root
    loaded = {n.name: n for n in cc.unique_nodes([again]) if isinstance(n, cc.Array)}
    for original in arrays[:2]:
        tensor = loaded[original.name].tensor()
        assert tensor.dtype == original.value.dtype
        assert torch.equal(tensor, original.value)


def test_file_names_are_the_content_hash_of_dtype_shape_and_bytes(tmp_path):
    tensor = torch.tensor([[1.5, -2.0]], dtype=torch.float32)
    store = cc.TensorStore(tmp_path)
    full = store.save(tensor)
    # independent reference: blake2b-256 over "dtype|shape|" then the raw bytes
    reference = hashlib.blake2b(digest_size=32)
    reference.update(b"torch.float32|[1, 2]|")
    reference.update(tensor.numpy().tobytes())
    assert full == reference.hexdigest()
    assert (tmp_path / f"{full}.safetensors").exists()
    assert cc.Array(tensor).repr().endswith(full[:24])


def test_same_bytes_different_dtype_or_shape_hash_differently():
    base = torch.zeros(4, dtype=torch.int32)
    assert cc.Array(base) != cc.Array(base.view(torch.float32))
    assert cc.Array(base) != cc.Array(base.reshape(2, 2))
    assert cc.Array(base) == cc.Array(torch.zeros(4, dtype=torch.int32))


def test_missing_prefix_is_a_clear_error(tmp_path):
    text = "'w' [2] Array 0123456789abcdef01234567"
    with pytest.raises(cc.ParseError, match="0123456789abcdef01234567") as info:
        cc.parse(text, store=cc.TensorStore(tmp_path))
    assert info.value.line_number == 1
    assert isinstance(info.value.__cause__, cc.StoreError)


def test_ambiguous_prefix_is_a_clear_error(tmp_path):
    store = cc.TensorStore(tmp_path)
    real = store.save(torch.ones(2))
    # a second file sharing the first 24 hex digits (forged, to provoke the ambiguity)
    twin = real[:24] + ("0" if real[24] != "0" else "1") + real[25:]
    os.link(tmp_path / f"{real}.safetensors", tmp_path / f"{twin}.safetensors")
    with pytest.raises(cc.StoreError, match="ambiguous"):
        store.load(real[:24])
    assert torch.equal(store.load(real), torch.ones(2))


def test_corrupted_file_is_refused(tmp_path):
    store = cc.TensorStore(tmp_path)
    full = store.save(torch.ones(3))
    safetensors.torch.save_file({"tensor": torch.zeros(3)}, str(tmp_path / f"{full}.safetensors"))
    with pytest.raises(cc.StoreError, match="corrupted"):
        store.load(full[:24])


def test_writes_leave_no_temporary_files(tmp_path):
    store = cc.TensorStore(tmp_path)
    for i in range(5):
        store.save(torch.full((3,), float(i)))
    names = os.listdir(tmp_path)
    assert len(names) == 5 and all(n.endswith(".safetensors") and not n.startswith(".") for n in names)


def test_saving_twice_keeps_one_file(tmp_path):
    store = cc.TensorStore(tmp_path)
    assert store.save(torch.ones(2)) == store.save(torch.ones(2))
    assert len(os.listdir(tmp_path)) == 1


def test_requires_grad_and_noncontiguous_tensors_round_trip(tmp_path):
    weight = torch.randn(4, 3, requires_grad=True)
    view = weight.detach().t()  # non-contiguous
    store = cc.TensorStore(tmp_path)
    for tensor in (weight, view):
        node = cc.Array(tensor, name="t")
        again = cc.parse(node.repr(store=store), store=store)
        assert again == node
        assert torch.equal(again.tensor(), tensor.detach())


def test_unloaded_arrays_print_identically_and_compare_equal(tmp_path):
    root, _ = small_circuit()
    text = root.repr()
    without = cc.parse(text)
    assert without == root
    assert without.repr() == text
    arrays = [n for n in cc.unique_nodes([without]) if isinstance(n, cc.Array)]
    assert arrays and all(not a.is_loaded for a in arrays)
