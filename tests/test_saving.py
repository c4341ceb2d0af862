"""cc.save / cc.load: the text plus a tensor store beside it, read back with the weights."""

from __future__ import annotations

import errno
import io
import os
import shutil
from pathlib import Path

import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits.text import saving
from circuits.text.saving import read_text, store_path

SMALL = cm.AttnOnlyConfig(n_layers=2, n_heads=3, d_model=12, d_head=4, vocab_size=23, n_ctx=16)


def _model() -> cc.Circuit:
    weights = cm.attn_only_random_weights(SMALL, seed=2)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    return cc.passes.split_heads(cc.passes.causal_mask(cm.build_attn_only(SMALL, weights, tokens)))


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
    def ablate(n):
        return cc.Scalar(0.0, shape=n.shape)

    assert torch.equal(
        loaded.update("b1.a.head0", ablate).evaluate(), circuit.update("b1.a.head0", ablate).evaluate()
    )


def test_store_path_rule(tmp_path):
    assert store_path(tmp_path / "m.circ") == tmp_path / "m.tensors"
    assert store_path(tmp_path / "m") == tmp_path / "m.tensors"
    with pytest.raises(cc.errors.StoreError, match="'.tensors'"):
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
    with pytest.raises(cc.errors.ParseError, match="2 top-level circuits") as info:  # says how many
        cc.load(path)
    assert info.value.line_number == 3  # where the second starts


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
    with pytest.raises(cc.errors.MissingTensorError):
        loaded.evaluate()
    # and it cannot be saved elsewhere: its tensor is nowhere
    with pytest.raises(cc.errors.MissingTensorError) as info:
        cc.save(loaded, tmp_path / "elsewhere.circ")
    assert info.value.node.name == "w"
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
    with pytest.raises(cc.errors.ParseError) as caught:
        cc.load(path)
    assert caught.value.line_number == 3 and "'q'" in caught.value.line


def test_mmap_loads_the_same_circuit(tmp_path):
    x = cc.Array(torch.randn(3, 4), name="x")
    circuit = cc.Einsum.from_einsum_string("ab,b->a", x, cc.Array(torch.randn(4), name="v"), name="y")
    path = cc.save(circuit, tmp_path / "model.circ")
    loaded = cc.load(path, mmap=True)
    assert loaded == circuit and torch.equal(loaded.evaluate(), circuit.evaluate())
    assert cc.load_many(path, mmap=True) == [circuit]


# ------------------------------------------------------------ typed errors naming the path


def test_load_of_a_missing_file(tmp_path):
    with pytest.raises(cc.errors.StoreError) as caught:
        cc.load(tmp_path / "nothing.circ")
    assert str(tmp_path / "nothing.circ") in str(caught.value)
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_load_of_a_directory(tmp_path):
    (tmp_path / "dir.circ").mkdir()
    with pytest.raises(cc.errors.StoreError) as caught:
        cc.load(tmp_path / "dir.circ")
    assert str(tmp_path / "dir.circ") in str(caught.value)
    assert isinstance(caught.value.__cause__, IsADirectoryError)


def test_load_of_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.circ"
    path.write_bytes("'a' Add\n  'caf\xe9' [] Scalar 1\n".encode("latin-1"))
    with pytest.raises(cc.errors.StoreError) as caught:
        cc.load(path)
    assert str(caught.value).startswith(f"{path}:2: not UTF-8 text")
    assert "column 7" in str(caught.value)
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)


def test_load_with_a_store_that_is_a_regular_file(tmp_path):
    path = cc.save(cc.Array(torch.ones(2), name="a"), tmp_path / "m.circ")
    shutil.rmtree(tmp_path / "m.tensors")
    (tmp_path / "m.tensors").write_text("a file, not a store")
    with pytest.raises(cc.errors.StoreError, match="is not a directory") as caught:
        cc.load(path)
    assert str(tmp_path / "m.tensors") in str(caught.value)


def test_load_with_a_garbage_store_file(tmp_path):
    path = cc.save(cc.Array(torch.ones(2), name="a"), tmp_path / "m.circ")
    (tensor_file,) = (tmp_path / "m.tensors").iterdir()
    tensor_file.write_bytes(b"\x00" * 100)
    with pytest.raises(cc.errors.ParseError) as caught:
        cc.load(path)
    assert caught.value.line_number == 1 and str(tensor_file) in caught.value.message
    assert isinstance(caught.value.__cause__, cc.errors.StoreError)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_save_into_a_read_only_directory(tmp_path, monkeypatch, code):
    """As root nothing is read-only, so the OS calls that create files and directories refuse."""
    path = tmp_path / "m.circ"
    cc.save(cc.Array(torch.ones(2), name="a"), path)
    before = path.read_bytes()
    real_open = os.open

    def refuse_open(target, flags, *args, **kwargs):
        if flags & os.O_CREAT and Path(target).parent == tmp_path:
            raise OSError(code, os.strerror(code), str(target))
        return real_open(target, flags, *args, **kwargs)

    def refuse_mkdir(target, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(target))

    monkeypatch.setattr(os, "open", refuse_open)
    monkeypatch.setattr(os, "mkdir", refuse_mkdir)
    with pytest.raises(cc.errors.StoreError, match=os.strerror(code)) as caught:  # the text, the store exists
        cc.save(cc.Array(torch.zeros(2), name="b"), path)
    assert str(path) in str(caught.value) and caught.value.__cause__.errno == code
    assert path.read_bytes() == before
    with pytest.raises(cc.errors.StoreError, match="cannot create the tensor store") as caught:  # a new store
        cc.save(cc.Array(torch.zeros(2), name="b"), tmp_path / "new.circ")
    assert str(tmp_path / "new.tensors") in str(caught.value) and caught.value.__cause__.errno == code


def test_save_where_the_store_is_a_regular_file(tmp_path):
    (tmp_path / "m.tensors").write_text("a file")
    with pytest.raises(cc.errors.StoreError, match="is not a directory") as caught:
        cc.save(cc.Array(torch.ones(2), name="a"), tmp_path / "m.circ")
    assert str(tmp_path / "m.tensors") in str(caught.value)
    assert not (tmp_path / "m.circ").exists()


def test_save_under_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("a file")
    with pytest.raises(cc.errors.StoreError) as caught:
        cc.save(cc.Array(torch.ones(2), name="a"), tmp_path / "file" / "m.circ")
    assert str(tmp_path / "file" / "m.tensors") in str(caught.value)
    assert isinstance(caught.value.__cause__, NotADirectoryError)


def test_save_of_a_name_utf8_cannot_encode(tmp_path):
    bad = cc.Add(cc.Array(torch.ones(2), name="x"), name="head\ud800\x1b[2J")
    with pytest.raises(cc.errors.StoreError) as caught:
        cc.save(bad, tmp_path / "m.circ")
    message = str(caught.value)
    assert "'head\\ud800\\x1b[2J' Add" in message and str(tmp_path / "m.circ") in message
    assert "\x1b" not in message and "\ud800" not in message
    assert isinstance(caught.value.__cause__, UnicodeEncodeError)
    assert os.listdir(tmp_path) == []  # refused before anything was written


# ------------------------------------------------------------ reading text


def test_byte_order_mark_and_crlf_are_accepted(tmp_path):
    circuit = cc.Add(cc.Array(torch.arange(3.0), name="w"), cc.Scalar(1.0), name="out")
    path = cc.save(circuit, tmp_path / "m.circ")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    loaded = cc.load(path)
    assert loaded == circuit and torch.equal(loaded.evaluate(), circuit.evaluate())
    assert read_text(path) == circuit.repr() + "\n"


def test_a_name_with_a_carriage_return_survives_a_file(tmp_path):
    circuit = cc.Add(cc.Array(torch.ones(2), name="a\rb"), name="c\r\nd")
    assert cc.load(cc.save(circuit, tmp_path / "m.circ")) == circuit


def test_read_text_bounds_each_line(tmp_path, monkeypatch):
    monkeypatch.setattr(saving, "MAX_LINE_CHARACTERS", 10)
    path = tmp_path / "long.circ"
    path.write_text("'a' Add\n  'b' Add\n" + "x" * 11)
    with pytest.raises(cc.errors.StoreError) as caught:
        read_text(path)
    assert str(caught.value).startswith(f"{path}:3: the line is longer than 10 characters")
    path.write_text("'a' Add\n" + "x" * 10 + "\n" + "y" * 10)  # exactly the limit, with and without newline
    assert read_text(path) == "'a' Add\n" + "x" * 10 + "\n" + "y" * 10


def test_read_text_from_streams():
    data = "\ufeff'a' Add\r\n  'b' Add\r\n".encode()
    stream = io.BytesIO(data)
    assert read_text(stream, "<bytes>") == "'a' Add\n  'b' Add\n"
    assert not stream.closed  # the caller's stream is left open
    assert read_text(io.StringIO("'a' Add\n")) == "'a' Add\n"
    with pytest.raises(cc.errors.StoreError, match="^<bytes>:2: not UTF-8"):
        read_text(io.BytesIO(b"'a' Add\n\xff"), "<bytes>")


def test_checks_come_before_any_write(tmp_path):
    fresh = cc.Array(torch.zeros(2), name="fresh")
    edited = torch.ones(2)
    stale = cc.Array(edited, name="stale")
    edited.add_(1)
    with pytest.raises(cc.errors.StaleTensorError) as info:
        cc.save([fresh, stale], tmp_path / "m.circ")
    assert info.value.node is stale
    with pytest.raises(cc.errors.NodeTypeError, match="root 1 is a Tensor"):
        cc.save([fresh, edited], tmp_path / "m.circ")
    placeholder = cc.parse(fresh.repr())
    with pytest.raises(cc.errors.MissingTensorError) as info:
        cc.save(placeholder, tmp_path / "m.circ")
    assert info.value.node is placeholder
    assert os.listdir(tmp_path) == []
