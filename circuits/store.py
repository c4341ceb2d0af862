"""A directory of safetensors files, one per tensor, named by content hash.

Printing can save every array it writes; parsing with a store loads the
arrays back by the 24-hex prefix the text carries.  A file is written to a
temporary name and renamed, so a crash never leaves a half-written tensor
under a real hash; a file whose bytes do not match its name is refused.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import safetensors.torch
import torch

from circuits.errors import StoreError
from circuits.hashing import tensor_content_hash

_SUFFIX = ".safetensors"
_KEY = "tensor"


class TensorStore:
    """Tensors saved and loaded by content hash (or a unique prefix of it)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._hashes: list[str] | None = None

    def __repr__(self) -> str:
        return f"TensorStore({str(self.path)!r})"

    def save(self, tensor: torch.Tensor, content_hash: str | None = None) -> str:
        """Save ``tensor`` (if not already there) and return its full hash."""
        content_hash = content_hash or tensor_content_hash(tensor)
        target = self.path / (content_hash + _SUFFIX)
        if target.exists():
            return content_hash
        data = {_KEY: tensor.detach().to("cpu").contiguous()}
        handle, temporary = tempfile.mkstemp(dir=self.path, prefix=".tmp-", suffix=_SUFFIX)
        os.close(handle)
        try:
            safetensors.torch.save_file(data, temporary)
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        if self._hashes is not None:
            self._hashes.append(content_hash)
        return content_hash

    def _known_hashes(self, refresh: bool) -> list[str]:
        if self._hashes is None or refresh:
            self._hashes = [
                entry.name[: -len(_SUFFIX)]
                for entry in os.scandir(self.path)
                if entry.name.endswith(_SUFFIX) and not entry.name.startswith(".")
            ]
        return self._hashes

    def resolve(self, prefix: str) -> str:
        """The one full hash starting with ``prefix``; missing or ambiguous is an error."""
        matches = [h for h in self._known_hashes(False) if h.startswith(prefix)]
        if not matches:
            matches = [h for h in self._known_hashes(True) if h.startswith(prefix)]
        if not matches:
            raise StoreError(f"no tensor with hash prefix {prefix} in {self.path}")
        if len(matches) > 1:
            raise StoreError(
                f"hash prefix {prefix} is ambiguous in {self.path}: matches {sorted(matches)[:5]}"
            )
        return matches[0]

    def load(self, prefix: str) -> torch.Tensor:
        """The tensor whose hash starts with ``prefix``, checked against its hash."""
        content_hash = self.resolve(prefix)
        path = self.path / (content_hash + _SUFFIX)
        try:
            tensor = safetensors.torch.load_file(str(path))[_KEY]
        except Exception as error:
            raise StoreError(f"cannot read {path}: {error}") from None
        actual = tensor_content_hash(tensor)
        if actual != content_hash:
            raise StoreError(
                f"{path} is corrupted: its contents hash to {actual[:24]}, not {content_hash[:24]}"
            )
        return tensor
