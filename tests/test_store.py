"""The tensor store: arrays saved while printing and loaded back while parsing."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys

import pytest
import safetensors
import safetensors.torch
import torch

import circuits as cc
from circuits.text.store import TensorStore


def small_circuit() -> tuple[cc.Circuit, tuple[cc.Array, ...]]:
    """A root over two arrays; a third array, h, stays outside the circuit."""
    w = cc.Array(torch.arange(12, dtype=torch.float32).reshape(3, 4), name="w")
    b = cc.Array(torch.tensor([1, 2, 3], dtype=torch.int64), name="b")
    h = cc.Array(torch.randn(2, 2, dtype=torch.float64), name="h")
    root = cc.Add(cc.Einsum.from_einsum_string("ab->a", w), b, cc.Scalar(0.5), name="root")
    return root, (w, b, h)


def test_print_saves_and_parse_loads_exact_tensors(tmp_path):
    root, arrays = small_circuit()
    store = TensorStore(tmp_path / "tensors")
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
    store = TensorStore(tmp_path)
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
    with pytest.raises(cc.errors.ParseError, match="0123456789abcdef01234567") as info:
        cc.parse(text, store=TensorStore(tmp_path))
    assert info.value.line_number == 1
    assert isinstance(info.value.__cause__, cc.errors.StoreError)


def test_ambiguous_prefix_is_a_clear_error(tmp_path):
    store = TensorStore(tmp_path)
    real = store.save(torch.ones(2))
    # a second file sharing the first 24 hex digits (forged, to provoke the ambiguity)
    twin = real[:24] + ("0" if real[24] != "0" else "1") + real[25:]
    os.link(tmp_path / f"{real}.safetensors", tmp_path / f"{twin}.safetensors")
    with pytest.raises(cc.errors.StoreError, match="ambiguous"):
        store.load(real[:24])
    assert torch.equal(store.load(real), torch.ones(2))


def test_corrupted_file_is_refused(tmp_path):
    store = TensorStore(tmp_path)
    full = store.save(torch.ones(3))
    safetensors.torch.save_file({"tensor": torch.zeros(3)}, str(tmp_path / f"{full}.safetensors"))
    with pytest.raises(cc.errors.StoreError, match="corrupted"):
        store.load(full[:24])


def test_writes_leave_no_temporary_files(tmp_path):
    store = TensorStore(tmp_path)
    for i in range(5):
        store.save(torch.full((3,), float(i)))
    names = os.listdir(tmp_path)
    assert len(names) == 5 and all(n.endswith(".safetensors") and not n.startswith(".") for n in names)


def test_saving_twice_keeps_one_file(tmp_path):
    store = TensorStore(tmp_path)
    assert store.save(torch.ones(2)) == store.save(torch.ones(2))
    assert len(os.listdir(tmp_path)) == 1


def test_requires_grad_and_noncontiguous_tensors_round_trip(tmp_path):
    weight = torch.randn(4, 3, requires_grad=True)
    view = weight.detach().t()  # non-contiguous
    store = TensorStore(tmp_path)
    for tensor in (weight, view):
        node = cc.Array(tensor, name="t")
        again = cc.parse(node.repr(store=store), store=store)
        assert again.repr() == node.repr()
        # a tensor requiring grad is a variable, distinct from its value read back (which needs none)
        assert again == cc.Array(tensor.detach(), name="t")
        assert (again == node) == (not tensor.requires_grad)
        assert torch.equal(again.tensor(), tensor.detach())


def test_a_column_of_one_row_hashes_and_saves_like_its_values(tmp_path):
    """``x[:, 5]`` of a ``[1, 32]`` tensor keeps stride 32 and counts as contiguous: a byte view of
    it is refused, so hashing must lay it out afresh (path terms at batch 1 made such an Array)."""
    column = torch.arange(32.0).reshape(1, 32)[:, 5]
    assert column.is_contiguous() and column.stride() == (32,)
    reference = hashlib.blake2b(digest_size=32)
    reference.update(b"torch.float32|[1]|")
    reference.update(torch.tensor([5.0]).numpy().tobytes())
    assert cc.Array(column) == cc.Array(torch.tensor([5.0]))
    store = TensorStore(tmp_path)
    assert store.save(column) == reference.hexdigest() == store.save(column)
    assert torch.equal(cc.parse(cc.Array(column).repr(store=store), store=store).tensor(), column)


def test_unloaded_arrays_print_identically_and_compare_equal(tmp_path):
    root, _ = small_circuit()
    text = root.repr()
    without = cc.parse(text)
    assert without == root
    assert without.repr() == text
    arrays = [n for n in cc.unique_nodes([without]) if isinstance(n, cc.Array)]
    assert arrays and all(not a.is_loaded for a in arrays)


# ------------------------------------------------------------ loading reads into memory


def _run_python(script: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a subprocess: a SIGBUS there fails a test instead of killing the run."""
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )


_LOAD_THEN_TRUNCATE = """
import os, sys, torch
from circuits.text.store import TensorStore
store = TensorStore(sys.argv[1], mmap={mmap})
full = store.save(torch.arange(1_000_000, dtype=torch.float32))
tensor = store.load(full[:24])
path = store.path / (full + ".safetensors")
with open(path, "r+b") as file:  # overwrite the data in place, then cut the file short
    file.seek(-4096, os.SEEK_END)
    file.write(bytes(4096))
os.truncate(path, 100)
print(int(torch.equal(tensor, torch.arange(1_000_000, dtype=torch.float32))), float(tensor[-1]))
"""


def test_loaded_tensors_do_not_change_when_the_file_does(tmp_path):
    result = _run_python(_LOAD_THEN_TRUNCATE.format(mmap=False).replace("sys.argv[1]", repr(str(tmp_path))))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "999999.0"]


@pytest.mark.skipif(sys.platform != "linux", reason="SIGBUS on a truncated mapping is Linux's behaviour")
def test_mmap_is_an_option_with_the_documented_caveat(tmp_path):
    store = TensorStore(tmp_path, mmap=True)
    full = store.save(torch.arange(6.0))
    assert torch.equal(store.load(full[:24]), torch.arange(6.0))
    assert "mmap=True" in repr(store) and "mmap" in TensorStore.__doc__
    result = _run_python(_LOAD_THEN_TRUNCATE.format(mmap=True).replace("sys.argv[1]", repr(str(tmp_path))))
    assert result.returncode == -signal.SIGBUS


def test_truncated_file_is_a_store_error_naming_it(tmp_path):
    store = TensorStore(tmp_path)
    full = store.save(torch.arange(1000.0))
    path = tmp_path / f"{full}.safetensors"
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(cc.errors.StoreError, match="is not a whole safetensors file") as caught:
        store.load(full[:24])
    assert str(path) in str(caught.value)
    assert isinstance(caught.value.__cause__, safetensors.SafetensorError)


def test_garbage_and_unreadable_files_are_store_errors(tmp_path):
    store = TensorStore(tmp_path)
    garbage = tmp_path / f"{'a' * 64}.safetensors"
    garbage.write_bytes(b"not a safetensors file at all")
    with pytest.raises(cc.errors.StoreError, match="is not a whole safetensors file") as caught:
        store.load("a" * 24)
    assert str(garbage) in str(caught.value)
    garbage.unlink()
    (tmp_path / f"{'b' * 64}.safetensors").mkdir()  # a directory where a file should be
    with pytest.raises(cc.errors.StoreError, match="cannot read") as caught:
        store.load("b" * 24)
    assert isinstance(caught.value.__cause__, IsADirectoryError)


# ------------------------------------------------------------ messages that say what is wrong


def test_file_renamed_to_its_prefix_is_misnamed_not_corrupted(tmp_path):
    store = TensorStore(tmp_path)
    full = store.save(torch.ones(3))
    os.rename(tmp_path / f"{full}.safetensors", tmp_path / f"{full[:24]}.safetensors")
    with pytest.raises(cc.errors.StoreError) as caught:
        TensorStore(tmp_path).load(full[:24])
    message = str(caught.value)
    assert "full 64-hex content hash" in message and full in message and "corrupted" not in message


def test_file_with_another_key_is_not_one_this_store_wrote(tmp_path):
    path = tmp_path / f"{'c' * 64}.safetensors"
    safetensors.torch.save_file({"weight": torch.ones(2), "bias": torch.zeros(2)}, str(path))
    with pytest.raises(cc.errors.StoreError) as caught:
        TensorStore(tmp_path).load("c" * 24)
    message = str(caught.value)
    assert "'bias', 'weight'" in message or "'weight', 'bias'" in message
    assert "not a file this store wrote" in message and str(path) in message


def test_a_regular_file_is_not_a_store(tmp_path):
    (tmp_path / "m.tensors").write_text("not a directory")
    with pytest.raises(cc.errors.StoreError, match="is not a directory") as caught:
        TensorStore(tmp_path / "m.tensors")
    assert str(tmp_path / "m.tensors") in str(caught.value)
    assert isinstance(caught.value.__cause__, FileExistsError)


def test_a_dtype_safetensors_cannot_write_is_a_store_error(tmp_path):
    with pytest.raises(cc.errors.StoreError, match="complex128"):
        TensorStore(tmp_path).save(torch.zeros(2, dtype=torch.complex128))
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------ saving repairs what it finds damaged


def _flip_last_bytes(path):
    data = bytearray(path.read_bytes())
    data[-3:] = bytes(255 - b for b in data[-3:])
    path.write_bytes(bytes(data))


def _flip_header_byte(path):
    data = bytearray(path.read_bytes())
    data[9] ^= 0x20  # inside the JSON header
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: os.truncate(p, p.stat().st_size - 5),
        lambda p: os.truncate(p, 0),
        _flip_last_bytes,
        _flip_header_byte,
        lambda p: safetensors.torch.save_file({"other": torch.ones(4)}, str(p)),
        lambda p: safetensors.torch.save_file({"tensor": torch.ones(4, dtype=torch.float64)}, str(p)),
        lambda p: safetensors.torch.save_file({"tensor": torch.ones(2, 2)}, str(p)),
    ],
    ids=["truncated", "empty", "flipped-data", "flipped-header", "other-key", "other-dtype", "other-shape"],
)
def test_saving_over_a_damaged_file_repairs_it(tmp_path, damage):
    tensor = torch.tensor([1.5, -2.0, 3.25, 7.0])
    store = TensorStore(tmp_path)
    full = store.save(tensor)
    damage(tmp_path / f"{full}.safetensors")
    assert store.save(tensor) == full
    again = TensorStore(tmp_path).load(full[:24])
    assert again.dtype == tensor.dtype and torch.equal(again, tensor)


def test_saving_compares_bytes_not_values(tmp_path):
    # -0.0 == 0.0 and NaN != NaN as floats; as bytes, each differs from the other
    tensor = torch.tensor([-(2**31), 0x7FC00001], dtype=torch.int32).view(torch.float32)  # -0.0, a NaN
    lookalike = torch.tensor([0x00000000, 0x7FC00000], dtype=torch.int32).view(torch.float32)  # 0.0, NaN
    store = TensorStore(tmp_path)
    full = store.save(tensor)
    safetensors.torch.save_file({"tensor": lookalike}, str(tmp_path / f"{full}.safetensors"))
    store.save(tensor)
    assert torch.equal(store.load(full).view(torch.int32), tensor.view(torch.int32))


def test_saving_an_intact_file_leaves_it_alone(tmp_path):
    store = TensorStore(tmp_path)
    full = store.save(torch.ones(3))
    before = os.stat(tmp_path / f"{full}.safetensors")
    store.save(torch.ones(3))
    after = os.stat(tmp_path / f"{full}.safetensors")
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
