"""Files a save leaves behind: durable writes, the usual permissions, no temporaries for ever."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import torch

import circuits as cc
from circuits.text import store as store_module
from circuits.text.store import temporary_path


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield 0o027
    os.umask(previous)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped: no process has it now."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_text_and_tensor_files_get_the_same_mode_from_the_umask(tmp_path, umask_027):
    path = cc.save(cc.Array(torch.ones(2), name="a"), tmp_path / "m.circ")
    (tensor_file,) = (tmp_path / "m.tensors").iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(tensor_file.stat().st_mode) == 0o640


def test_dead_writers_temporaries_are_removed_and_live_ones_kept(tmp_path):
    path = tmp_path / "m.circ"
    cc.save(cc.Array(torch.ones(2), name="a"), path)
    tensors = tmp_path / "m.tensors"
    dead = _dead_pid()
    leftovers = [temporary_path(path, dead), temporary_path(tensors / f"{'0' * 64}.safetensors", dead)]
    live = [
        temporary_path(path, os.getpid()),
        temporary_path(tensors / f"{'1' * 64}.safetensors", os.getpid()),
    ]
    other_host = tensors / f".{'2' * 64}.safetensors.another-host.{dead}.0123456789ab.tmp"
    other_file = temporary_path(tmp_path / "other.circ", dead)  # another text file's: not this save's
    for file in [*leftovers, *live, other_host, other_file]:
        file.write_bytes(b"half a file")
    cc.save(cc.Array(torch.zeros(2), name="b"), path)
    assert not any(file.exists() for file in leftovers)
    assert all(file.exists() for file in [*live, other_host, other_file])
    assert torch.equal(cc.load(path).evaluate(), torch.zeros(2))


def test_temporaries_name_the_writer(tmp_path):
    name = temporary_path(tmp_path / "m.circ").name
    assert name.startswith(".m.circ.") and name.endswith(".tmp") and f".{os.getpid()}." in name


def test_a_failed_write_leaves_no_temporary(tmp_path, monkeypatch):
    def fail(fd):
        raise OSError(28, os.strerror(28))  # ENOSPC

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(cc.errors.StoreError) as info:
        cc.save(cc.Array(torch.ones(2), name="a"), tmp_path / "m.circ")
    assert info.value.__cause__.errno == 28
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["m.tensors"] and os.listdir(tmp_path / "m.tensors") == []


def test_files_and_their_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def record(fd):
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    path = cc.save(cc.Array(torch.ones(2), name="a"), tmp_path / "m.circ")
    (tensor_file,) = (tmp_path / "m.tensors").iterdir()
    for written, directory in [(tensor_file, tmp_path / "m.tensors"), (path, tmp_path)]:
        assert written.stat().st_ino in synced  # the file, before its rename
        assert directory.stat().st_ino in synced  # its directory, after
    assert synced.index(path.stat().st_ino) < synced.index(tmp_path.stat().st_ino)


def test_only_this_hosts_pids_are_checked(monkeypatch, tmp_path):
    monkeypatch.setattr(store_module, "_HOST", "this-host")
    leftover = temporary_path(tmp_path / "x", _dead_pid())
    leftover.write_bytes(b"")
    monkeypatch.setattr(store_module, "_HOST", "that-host")
    store_module.remove_dead_temporaries(tmp_path)
    assert leftover.exists()
    monkeypatch.setattr(store_module, "_HOST", "this-host")
    store_module.remove_dead_temporaries(tmp_path)
    assert not leftover.exists()
