"""A directory of safetensors files, one per tensor, named by content hash.

Printing can save every array it writes; parsing with a store loads the
arrays back by the hex prefix the text carries (``PRINTED_HEX_DIGITS``).

- A file is written to a temporary name, fsynced and renamed, so a crash
  never leaves a half-written tensor under a real hash.  The temporary's
  name carries the writer's host and pid: a later save removes those whose
  writer is dead (killed mid-save), never a live writer's.
- Files are created with mode 0o666 less the umask, as any program's files.
- A file whose bytes do not match its name is refused on load, and
  rewritten on save.
- Loading reads the file into memory: the tensors stay as they were when
  read whatever happens to the file afterwards, and a truncated file is a
  ``StoreError``.  ``TensorStore(path, mmap=True)`` maps files instead
  (faster for big tensors, no copy), at a price: a file changed or
  truncated while mapped changes the tensors or kills the process (SIGBUS).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import uuid
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from circuits.errors import StoreError, shown
from circuits.core.hashing import FULL_HEX_DIGITS, tensor_bytes, tensor_content_hash

_SUFFIX = ".safetensors"
_KEY = "tensor"
_FULL_HASH = re.compile(f"[0-9a-f]{{{FULL_HEX_DIGITS}}}")
_POSIX = os.name == "posix"
# The host in temporary names: only this machine's pids can be checked.
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64]
_TEMPORARY = re.compile(r"\.(?P<target>.+)\.(?P<host>[A-Za-z0-9-]*)\.(?P<pid>\d{1,10})\.[0-9a-f]{12}\.tmp")


class TensorStore:
    """Tensors saved and loaded by content hash (or a unique prefix of it).

    ``mmap=True`` loads by memory-mapping the files: no copy, but a file
    changed or truncated while its tensors are alive changes them or kills
    the process with SIGBUS.  The default reads each file into memory.
    """

    def __init__(self, path: str | os.PathLike, mmap: bool = False):
        self.path = Path(path)
        self.mmap = mmap
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError as error:
            raise StoreError(
                f"{shown(str(self.path))} is not a directory: a tensor store is a directory of "
                f"{_SUFFIX} files"
            ) from error
        except OSError as error:
            raise StoreError(
                f"cannot create the tensor store {shown(str(self.path))}: {_reason(error)}"
            ) from error
        self._hashes: set[str] | None = None
        self._swept = False

    def __repr__(self) -> str:
        return f"TensorStore({str(self.path)!r}{', mmap=True' if self.mmap else ''})"

    def save(self, tensor: torch.Tensor, content_hash: str | None = None) -> str:
        """Save ``tensor`` unless its file is there intact; return its full hash.

        A file already there is read and compared byte for byte (not with
        float equality, which NaN and -0.0 fool), so a truncated or damaged
        file is repaired rather than trusted for its name.
        """
        tensor = tensor.detach().to("cpu").contiguous()
        content_hash = content_hash or tensor_content_hash(tensor)
        target = self.path / (content_hash + _SUFFIX)
        if target.exists() and _holds(target, tensor):
            return content_hash
        try:
            data = safetensors.torch.save({_KEY: tensor})
        except Exception as error:  # safetensors' refusal (a KeyError for complex128, say)
            raise StoreError(
                f"cannot save a {tensor.dtype} tensor {list(tensor.shape)} to {shown(str(target))}: "
                f"safetensors cannot write it ({type(error).__name__}: {error})"
            ) from error
        if not self._swept:
            remove_dead_temporaries(self.path)
            self._swept = True
        write_atomically(target, data)
        if self._hashes is not None:
            self._hashes.add(content_hash)
        return content_hash

    def _known_hashes(self, refresh: bool) -> set[str]:
        if self._hashes is None or refresh:
            try:
                names = os.listdir(self.path)
            except OSError as error:
                raise StoreError(
                    f"cannot list the tensor store {shown(str(self.path))}: {_reason(error)}"
                ) from error
            self._hashes = {
                name[: -len(_SUFFIX)] for name in names if name.endswith(_SUFFIX) and not name.startswith(".")
            }
        return self._hashes

    def resolve(self, prefix: str) -> str:
        """The one full hash starting with ``prefix``; missing or ambiguous is an error."""
        matches = [h for h in self._known_hashes(False) if h.startswith(prefix)]
        if not matches:
            matches = [h for h in self._known_hashes(True) if h.startswith(prefix)]
        if not matches:
            raise StoreError(f"no tensor with hash prefix {shown(prefix)} in {shown(str(self.path))}")
        if len(matches) > 1:
            raise StoreError(
                f"hash prefix {shown(prefix)} is ambiguous in {shown(str(self.path))}: matches "
                f"{[shown(h) for h in sorted(matches)[:5]]}"
            )
        return matches[0]

    def load(self, prefix: str) -> torch.Tensor:
        """The tensor whose hash starts with ``prefix``, checked against its hash."""
        content_hash = self.resolve(prefix)
        path = self.path / (content_hash + _SUFFIX)
        tensor = read_tensor(path, self.mmap)
        actual = tensor_content_hash(tensor)
        if actual == content_hash:
            return tensor
        if not _FULL_HASH.fullmatch(content_hash):
            raise StoreError(
                f"{shown(str(path))} is misnamed: store files are named by the full {FULL_HEX_DIGITS}-hex "
                f"content hash of their tensor, and this one's is {actual}"
            )
        raise StoreError(
            f"{shown(str(path))} is corrupted: its contents hash to {actual}, not {content_hash}"
        )


def read_tensor(path: Path, mmap: bool = False) -> torch.Tensor:
    """The one tensor of a file this store wrote; anything else is a ``StoreError`` naming it."""
    try:
        tensors = safetensors.torch.load_file(path) if mmap else safetensors.torch.load(path.read_bytes())
    except OSError as error:
        raise StoreError(f"cannot read {shown(str(path))}: {_reason(error)}") from error
    except safetensors.SafetensorError as error:
        raise StoreError(f"{shown(str(path))} is not a whole safetensors file ({error})") from error
    if list(tensors) != [_KEY]:
        keys = shown(", ".join(repr(key) for key in tensors) or "none")
        raise StoreError(
            f"{shown(str(path))} holds the tensors {keys}, not one named {_KEY!r}: it is not a file this "
            "store wrote"
        )
    return tensors[_KEY]


def _holds(path: Path, tensor: torch.Tensor) -> bool:
    """Whether ``path`` holds exactly ``tensor``: dtype, shape and raw bytes."""
    try:
        existing = read_tensor(path)
    except StoreError:
        return False
    return (
        existing.dtype == tensor.dtype
        and existing.shape == tensor.shape
        and torch.equal(tensor_bytes(existing), tensor_bytes(tensor))
    )


def temporary_path(target: Path, pid: int | None = None) -> Path:
    """Where ``target`` is written before its rename: hidden, and naming this host and the writer's pid."""
    pid = os.getpid() if pid is None else pid
    return target.with_name(f".{target.name}.{_HOST}.{pid}.{uuid.uuid4().hex[:12]}.tmp")


def write_atomically(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` whole or not at all, and durably.

    The bytes go to a temporary beside ``target`` (mode 0o666 less the
    umask), which is fsynced, renamed over ``target``, and the directory
    fsynced: after a crash the file is the old one or the new one, never
    half of one, and a return means the new one is on disk.
    """
    temporary = temporary_path(target)
    try:
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with open(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
        if _POSIX:  # a directory cannot be opened for fsync on Windows
            directory = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise StoreError(f"cannot write {shown(str(target))}: {_reason(error)}") from error


def remove_dead_temporaries(directory: Path, target: str | None = None) -> None:
    """Remove the temporaries of writers that died before their rename (of ``target`` only, if given).

    Only this host's, and only when their pid is gone: another process's
    write in progress is never touched.  One another user owns and we may
    not remove is left to them.
    """
    try:
        names = os.listdir(directory)
    except OSError as error:
        raise StoreError(f"cannot list {shown(str(directory))}: {_reason(error)}") from error
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        if match is None or match["host"] != _HOST or (target is not None and match["target"] != target):
            continue
        if _writer_is_dead(int(match["pid"])):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.remove(directory / name)


def _writer_is_dead(pid: int) -> bool:
    if not _POSIX or pid <= 0:  # on Windows, os.kill(pid, 0) would end the process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: alive, another user's
        pass
    return False


def _reason(error: OSError) -> str:
    return error.strerror or str(error)
