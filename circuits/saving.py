"""Circuits on disk: the FORMAT.md text in a file, the tensors in a store beside it.

``save(c, "model.circ")`` writes the text to ``model.circ`` and every
array's tensor to ``model.tensors/``, a ``TensorStore`` (one safetensors
file per tensor, named by content hash).  ``load("model.circ")`` reads
them back: the same circuit, with its weights, evaluating identically.

- The store is always ``store_path(path)``: the text file's path with its
  suffix replaced by ``.tensors`` (``model.circ`` -> ``model.tensors``;
  ``model`` -> ``model.tensors``).  Use the ``.circ`` suffix.
- Several roots: ``save([c1, c2], path)`` prints them together, sharing
  references (``repr_many``); ``load_many(path)`` returns them as a list,
  as ``parse_many`` does.  ``load(path)`` expects exactly one circuit, as
  ``parse`` does.
- Saving again to the same path replaces the text; tensors already in the
  store are kept (files are named by content, so they are never stale,
  only possibly unused).
- ``load`` of a text file without a store beside it (the golden file, say)
  gives arrays that know their shape and hash but have no tensor: they
  print identically and raise ``MissingTensorError`` when evaluated.  With
  a store, a tensor missing from it is a ``ParseError`` at its line.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterable, Union

from circuits.errors import MissingTensorError, StoreError
from circuits.nodes import Array, Circuit
from circuits.parsing import parse, parse_many
from circuits.printing import repr_many
from circuits.store import TensorStore
from circuits.traversal import unique_nodes

STORE_SUFFIX = ".tensors"

PathLike = Union[str, "os.PathLike[str]"]


def store_path(path: PathLike) -> Path:
    """Where the tensors of the circuit text at ``path`` live: ``path`` with suffix ``.tensors``."""
    path = Path(path)
    if path.suffix == STORE_SUFFIX:
        raise StoreError(
            f"{path}: a circuit file cannot end in {STORE_SUFFIX!r}, the suffix of its tensor store; "
            "use '.circ'"
        )
    return path.with_suffix(STORE_SUFFIX)


def save(circuits: Circuit | Iterable[Circuit], path: PathLike) -> Path:
    """Write one circuit (or several, sharing references) and its tensors; return the text's path.

    Every array must have its tensor, or already be in the store: an array
    parsed without its tensor cannot be saved elsewhere, and saying so up
    front beats writing a file that will not load.
    """
    roots = [circuits] if isinstance(circuits, Circuit) else list(circuits)
    for position, root in enumerate(roots):
        if not isinstance(root, Circuit):
            raise TypeError(f"save: root {position} is a {type(root).__name__}, not a circuit")
    path = Path(path)
    tensors = store_path(path)
    missing = [n for n in unique_nodes(roots) if isinstance(n, Array) and not n.is_loaded]
    if missing:
        existing = TensorStore(tensors) if tensors.is_dir() else None
        for node in missing:
            try:
                if existing is None:
                    raise StoreError("no store")
                existing.resolve(node.content_hash)
            except StoreError:
                raise MissingTensorError(
                    f"save: {node.describe()} {list(node.shape)} with hash {node.extra} has no tensor "
                    f"(it was parsed without its store) and {tensors} does not hold it"
                ) from None
    store = TensorStore(tensors)
    text = repr_many(roots, store=store) + "\n"
    _write_atomically(path, text)
    return path


def load(path: PathLike) -> Circuit:
    """The one circuit saved at ``path``, with its tensors from the store beside it if there is one."""
    text, store = _read(path)
    return parse(text, store=store)


def load_many(path: PathLike) -> list[Circuit]:
    """Every circuit saved at ``path``, in order (``save([c1, c2], path)`` gives ``[c1, c2]``)."""
    text, store = _read(path)
    return parse_many(text, store=store)


def _read(path: PathLike) -> tuple[str, TensorStore | None]:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    tensors = store_path(path)
    return text, TensorStore(tensors) if tensors.is_dir() else None


def _write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8", newline="\n") as file:  # mode from the umask
            file.write(text)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
