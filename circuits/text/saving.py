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
  only possibly unused), once read back and found intact: a damaged one
  is rewritten.
- ``load`` of a text file without a store beside it (the golden file, say)
  gives arrays that know their shape and hash but have no tensor: they
  print identically and raise ``MissingTensorError`` when evaluated.  With
  a store, a tensor missing from it is a ``ParseError`` at its line.
- Tensors are read into memory: ``load(path, mmap=True)`` maps them
  instead, with the caveat ``TensorStore`` states (a file changed while
  mapped changes the tensors or kills the process).
- Text is read by ``read_text``: UTF-8 (a leading byte-order mark is
  dropped), any line ending, lines of at most ``MAX_LINE_CHARACTERS``.
- Every failure to read or write a file is a ``StoreError`` naming it.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Union

from circuits.errors import MissingTensorError, StoreError, shown
from circuits.core.nodes import Array, Circuit, check_node
from circuits.text.parsing import parse, parse_many
from circuits.text.printing import repr_many
from circuits.text.store import TensorStore, remove_dead_temporaries, write_atomically
from circuits.core.traversal import unique_nodes

STORE_SUFFIX = ".tensors"

#: The longest line ``read_text`` accepts, in characters (1 MiB of ASCII).  No
#: printed circuit comes near it; a binary file, or ``/dev/zero``, is refused
#: at its first line rather than read into memory whole.
MAX_LINE_CHARACTERS = 1 << 20

PathLike = Union[str, "os.PathLike[str]"]

# What undecodable bytes read as (errors="surrogateescape"); no UTF-8 text holds one.
_SURROGATE = re.compile("[\ud800-\udfff]")


def store_path(path: PathLike) -> Path:
    """Where the tensors of the circuit text at ``path`` live: ``path`` with suffix ``.tensors``."""
    path = Path(path)
    if path.suffix == STORE_SUFFIX:
        raise StoreError(
            f"{shown(str(path))}: a circuit file cannot end in {STORE_SUFFIX!r}, the suffix of its tensor "
            "store; use '.circ'"
        )
    return path.with_suffix(STORE_SUFFIX)


def save(circuits: Circuit | Iterable[Circuit], path: PathLike) -> Path:
    """Write one circuit (or several, sharing references) and its tensors; return the text's path.

    Everything that can be checked is checked before anything is written:
    every array must have its tensor, unedited since the array was made, or
    already be in the store (an array parsed without its tensor cannot be
    saved elsewhere), and the text must encode as UTF-8.  Tensors go first, the text last, so the text never
    names a tensor that is not on disk.
    """
    roots = [circuits] if isinstance(circuits, Circuit) else list(circuits)
    for position, root in enumerate(roots):
        check_node(root, f"save: root {position}")
    path = Path(path)
    tensors = store_path(path)
    arrays = [n for n in unique_nodes(roots) if isinstance(n, Array)]
    _check_tensors_at_hand([n for n in arrays if not n.is_loaded], tensors)
    at_hand = {n.content_hash: n.tensor() for n in arrays if n.is_loaded}  # refuses one edited in place
    data = _encoded(repr_many(roots) + "\n", path)
    store = TensorStore(tensors)
    for content_hash, tensor in at_hand.items():
        store.save(tensor, content_hash)
    remove_dead_temporaries(path.parent, path.name)
    write_atomically(path, data)
    return path


def _check_tensors_at_hand(missing: Sequence[Array], tensors: Path) -> None:
    """Refuse arrays without a tensor unless the store already holds theirs."""
    if not missing:
        return
    existing = TensorStore(tensors) if tensors.is_dir() else None
    for node in missing:
        cause = None
        if existing is not None:
            try:
                existing.resolve(node.content_hash)
                continue
            except StoreError as error:
                cause = error
        raise MissingTensorError(
            f"save: {node.describe()} {list(node.shape)} with hash {node.extra} has no tensor "
            f"(it was parsed without its store) and {shown(str(tensors))} does not hold it",
            node=node,
        ) from cause


def _encoded(text: str, path: Path) -> bytes:
    """``text`` as UTF-8; a name (or function name) holding a lone surrogate cannot be."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        number = text.count("\n", 0, error.start) + 1
        line = text.split("\n", number)[number - 1].lstrip(" ")
        raise StoreError(
            f"save: {shown(str(path))} cannot be written: the node on line {number}, {shown(line)}, holds "
            f"{shown(text[error.start : error.end])}, which UTF-8 cannot encode ({error.reason}); rename it"
        ) from error


def load(path: PathLike, mmap: bool = False) -> Circuit:
    """The one circuit saved at ``path``, with its tensors from the store beside it if there is one.

    The tensor files are read into memory.  ``mmap=True`` maps them instead
    (no copy), but then a store file changed or truncated while the circuit
    is alive changes its tensors or kills the process with SIGBUS.
    """
    text, store = _read(path, mmap)
    return parse(text, store=store)


def load_many(path: PathLike, mmap: bool = False) -> list[Circuit]:
    """Every circuit saved at ``path``, in order (``save([c1, c2], path)`` gives ``[c1, c2]``)."""
    text, store = _read(path, mmap)
    return parse_many(text, store=store)


def _read(path: PathLike, mmap: bool) -> tuple[str, TensorStore | None]:
    path = Path(path)
    tensors = store_path(path)
    text = read_text(path)
    if tensors.is_dir():
        return text, TensorStore(tensors, mmap=mmap)
    if os.path.lexists(tensors):
        raise StoreError(
            f"{shown(str(tensors))} is not a directory, so the tensors of {shown(str(path))} cannot be read "
            "from it"
        )
    return text, None


def read_text(source: PathLike | IO, name: str | None = None) -> str:
    """The text of a circuit file (a path, or a binary or text stream such as stdin), checked as it is read.

    Read a line at a time, each at most ``MAX_LINE_CHARACTERS`` long, so that
    a file that is no circuit file fails at once rather than filling memory.
    UTF-8, a leading byte-order mark dropped; CRLF and CR line endings read as
    LF.  Every failure is a ``StoreError`` naming the file (``name``, by
    default the path or the stream's name) and, if it is at a line, the line.
    """
    if isinstance(source, (str, os.PathLike)):
        name = shown(str(source) if name is None else name)
        try:
            with open(source, encoding="utf-8", errors="surrogateescape", newline=None) as file:
                return _read_lines(file, name)
        except StoreError:
            raise
        except FileNotFoundError as error:
            raise StoreError(f"{name}: no such file") from error
        except IsADirectoryError as error:
            raise StoreError(f"{name}: is a directory, not a circuit file") from error
        except OSError as error:
            raise StoreError(f"{name}: cannot read it: {error.strerror or error}") from error
    name = shown(str(getattr(source, "name", "<stream>")) if name is None else name)
    if isinstance(source, io.TextIOBase):
        return _read_lines(source, name)
    wrapper = io.TextIOWrapper(source, encoding="utf-8", errors="surrogateescape", newline=None)
    try:
        return _read_lines(wrapper, name)
    finally:
        wrapper.detach()  # the caller's stream stays open


def _read_lines(stream: IO[str], name: str) -> str:
    lines: list[str] = []
    while True:
        number = len(lines) + 1
        try:
            line = stream.readline(MAX_LINE_CHARACTERS + 1)
        except OSError as error:
            raise StoreError(f"{name}:{number}: cannot read it: {error.strerror or error}") from error
        if not line:
            break
        if len(line) > MAX_LINE_CHARACTERS and not line.endswith("\n"):
            raise StoreError(
                f"{name}:{number}: the line is longer than {MAX_LINE_CHARACTERS} characters: not a circuit "
                "file? (the limit is circuits.text.saving.MAX_LINE_CHARACTERS)"
            )
        bad = _SURROGATE.search(line)
        if bad is not None:
            try:
                line.encode("utf-8", "surrogateescape").decode("utf-8")
            except UnicodeError as error:
                raise StoreError(
                    f"{name}:{number}: not UTF-8 text ({error.reason} at column {bad.start() + 1})"
                ) from error
        lines.append(line)
    return "".join(lines).removeprefix("\ufeff")
