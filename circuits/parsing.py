"""The FORMAT.md reader: text back into circuits.

Lines are read one at a time with an explicit stack of nodes whose children
are still coming, so the depth of the text never touches Python's call
stack.  Anything wrong in the text raises ``ParseError`` with the line
number, the line, and what was expected.
"""

from __future__ import annotations

import re
from typing import Callable

import attrs
import torch

from circuits.errors import CircuitError, ParseError
from circuits.nodes import (
    Add,
    Array,
    Circuit,
    Concat,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scalar,
    Symbol,
)
from circuits.store import TensorStore

_SERIAL = re.compile(r"\d+")
_NAME = re.compile(r"'((?:[^'\\]|\\.)*)'")
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", "'": "'", "n": "\n"}
_SHAPE = re.compile(r"\[([0-9 ,]*)\]")
_VARIANT = re.compile(r"[A-Za-z]+")
_HEX = re.compile(r"[0-9a-f]{24,64}")
_SIZE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*")

LEAF_KINDS = ("Array", "Scalar", "Symbol")


@attrs.define
class _Line:
    """One parsed line, waiting for its children (if it is not a repeat)."""

    number: int
    text: str
    depth: int
    serial: int | None
    name: str | None
    shape: tuple[int, ...] | None = None
    kind: str | None = None
    extra: str = ""
    children: list[Circuit] = attrs.field(factory=list)

    @property
    def is_repeat(self) -> bool:
        return self.kind is None

    def error(self, message: str) -> ParseError:
        return ParseError(message, self.number, self.text)


def parse(text: str, store: TensorStore | None = None) -> Circuit:
    """Read exactly one circuit."""
    roots = parse_many(text, store=store)
    if len(roots) != 1:
        raise ParseError(f"expected one circuit, found {len(roots)} top-level circuits")
    return roots[0]


def parse_many(text: str, store: TensorStore | None = None) -> list[Circuit]:
    """Read every top-level circuit in ``text``, in order."""
    if not isinstance(text, str):
        raise ParseError(f"expected text (str), got {type(text).__name__}")
    return _Reader(store).read(text)


class _Reader:
    def __init__(self, store: TensorStore | None):
        self.store = store
        self.roots: list[Circuit] = []
        self.pending: list[_Line] = []
        self.by_serial: dict[int, Circuit | _Line] = {}
        self.by_name: dict[str, dict[bytes, Circuit]] = {}

    def read(self, text: str) -> list[Circuit]:
        last: _Line | None = None
        for number, raw in enumerate(text.split("\n"), start=1):
            line = self._split(number, raw)
            if line is None:
                continue
            if last is not None and last.is_repeat and line.depth > last.depth:
                raise line.error(f"indented under line {last.number}, a repeat, which has no children")
            self._close_to(line.depth)
            parent_depth = self.pending[-1].depth if self.pending else -1
            if line.depth > parent_depth + 1:
                raise line.error(
                    f"indented to depth {line.depth} but the enclosing node is at depth {parent_depth}; "
                    "a child is indented two spaces more than its parent"
                )
            if line.is_repeat:
                self._attach(self._resolve(line))
            else:
                if line.serial is not None:
                    if line.serial in self.by_serial:
                        raise line.error(f"serial number {line.serial} is already used")
                    self.by_serial[line.serial] = line
                self.pending.append(line)
            last = line
        self._close_to(0)
        return self.roots

    # ------------------------------------------------------------ lines

    def _split(self, number: int, raw: str) -> _Line | None:
        """Take a line apart into reference, shape, variant and extra."""
        body = raw.lstrip(" ")
        if not body.strip() or body.startswith("#"):
            return None
        spaces = len(raw) - len(body)
        if spaces % 2:
            raise ParseError(f"indented by {spaces} spaces; indent is two spaces per depth", number, raw)
        if body[0] == "\t":
            raise ParseError("indent with spaces, not tabs", number, raw)
        position = 0
        serial = None
        match = _SERIAL.match(body)
        if match:
            serial = int(match.group())
            position = match.end()
            if body[position:position + 1] == " ":
                position += 1
            elif position < len(body) and body[position] != "#":
                raise ParseError("expected a space after the serial number", number, raw)
        name = None
        if body[position:position + 1] == "'":
            match = _NAME.match(body, position)
            if not match:
                raise ParseError("unterminated quoted name (a quote inside a name is written \\')", number, raw)
            name = self._unescape(match.group(1), number, raw)
            position = match.end()
        if serial is None and name is None:
            raise ParseError("expected a reference: a serial number, a 'quoted name', or both", number, raw)
        rest = body[position:].split("#", 1)[0].rstrip()
        line = _Line(number, raw, spaces // 2, serial, name)
        if not rest:
            return line
        if not rest.startswith(" ") and name is not None:
            raise ParseError("expected a space after the name", number, raw)
        rest = rest.lstrip(" ")
        match = _SHAPE.match(rest)
        if match:
            line.shape = self._shape(match.group(1), line)
            rest = rest[match.end():].lstrip(" ")
        match = _VARIANT.match(rest)
        if not match:
            raise line.error(f"expected a variant name (Array, Einsum, ...) but found {rest!r}")
        line.kind = match.group()
        line.extra = rest[match.end():].strip(" ")
        if line.kind not in _BUILDERS:
            raise line.error(f"unknown variant {line.kind!r}; expected one of {', '.join(_BUILDERS)}")
        if line.kind in LEAF_KINDS and line.shape is None:
            raise line.error(f"{line.kind} needs its shape, e.g. [300,256], before the variant")
        return line

    @staticmethod
    def _unescape(escaped: str, number: int, raw: str) -> str:
        def replace(match: re.Match) -> str:
            try:
                return _ESCAPES[match.group(1)]
            except KeyError:
                raise ParseError(
                    f"unknown escape \\{match.group(1)} in a name (only \\\\, \\' and \\n)", number, raw
                ) from None

        return _ESCAPE.sub(replace, escaped)

    @staticmethod
    def _shape(text: str, line: _Line) -> tuple[int, ...]:
        parts = [part.strip() for part in text.split(",")] if text.strip() else []
        if any(not part.isdigit() for part in parts):
            raise line.error(f"malformed shape [{text}]: expected comma-separated sizes like [300,256]")
        return tuple(int(part) for part in parts)

    # ------------------------------------------------------------ nodes

    def _close_to(self, depth: int) -> None:
        """Finish every pending node at ``depth`` or deeper: its children are complete."""
        while self.pending and self.pending[-1].depth >= depth:
            line = self.pending.pop()
            node = self._build(line)
            if line.serial is not None:
                self.by_serial[line.serial] = node
            if node.name is not None:
                self.by_name.setdefault(node.name, {})[node.hash] = node
            self._attach(node)

    def _attach(self, node: Circuit) -> None:
        if self.pending:
            self.pending[-1].children.append(node)
        else:
            self.roots.append(node)

    def _build(self, line: _Line) -> Circuit:
        builder = _BUILDERS[line.kind]
        try:
            node = builder(line, self.store)
        except ParseError:
            raise
        except CircuitError as error:
            raise line.error(str(error)) from error
        except (ValueError, TypeError, IndexError, OverflowError) as error:
            raise line.error(f"cannot build {line.kind} from {line.extra!r}: {error}") from error
        if line.shape is not None and tuple(node.shape) != line.shape:
            raise line.error(
                f"the line says shape {list(line.shape)} but the {line.kind} computes "
                f"{list(node.shape)} from its children"
            )
        return node

    def _resolve(self, line: _Line) -> Circuit:
        """The node a repeat line names; it must have been written before."""
        if line.serial is not None:
            found = self.by_serial.get(line.serial)
            if found is None:
                raise line.error(f"repeat of serial number {line.serial}, which no earlier line defines")
            if isinstance(found, _Line):
                raise line.error(
                    f"repeat of serial number {line.serial}, whose line {found.number} is an "
                    "enclosing node (a circuit cannot contain itself)"
                )
            if line.name is not None and found.name != line.name:
                raise line.error(
                    f"serial number {line.serial} is {found.describe()}, not {line.name!r}"
                )
            return found
        candidates = self.by_name.get(line.name, {})
        if not candidates:
            enclosing = any(p.name == line.name for p in self.pending)
            why = "an enclosing node (a circuit cannot contain itself)" if enclosing else "defined by no earlier line"
            raise line.error(f"repeat of {line.name!r}, which is {why}")
        if len(candidates) > 1:
            raise line.error(
                f"repeat of {line.name!r} is ambiguous: {len(candidates)} distinct nodes carry that "
                "name; refer to one by its serial number"
            )
        return next(iter(candidates.values()))


# ------------------------------------------------------------------ builders


def _no_children(line: _Line) -> None:
    if line.children:
        raise line.error(f"{line.kind} is a leaf but has {len(line.children)} children")


def _no_extra(line: _Line) -> None:
    if line.extra:
        raise line.error(f"{line.kind} takes nothing after the variant, found {line.extra!r}")


def _build_array(line: _Line, store: TensorStore | None) -> Circuit:
    _no_children(line)
    if not _HEX.fullmatch(line.extra):
        raise line.error(f"Array needs a 24-hex content hash, found {line.extra!r}")
    if store is None:
        return Array.from_hash(line.shape, line.extra, name=line.name)
    tensor = store.load(line.extra)
    node = Array(tensor, name=line.name)
    if not node.content_hash.startswith(line.extra):
        raise line.error(f"the store's tensor hashes to {node.content_hash[:24]}, not {line.extra}")
    return node


def _build_scalar(line: _Line, store: TensorStore | None) -> Circuit:
    _no_children(line)
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+|inf|nan)", line.extra):
        raise line.error(f"Scalar needs a decimal value like -1 or 0.00001, found {line.extra!r}")
    return Scalar(float(line.extra), shape=line.shape, name=line.name)


def _build_symbol(line: _Line, store: TensorStore | None) -> Circuit:
    _no_children(line)
    _no_extra(line)
    return Symbol(line.shape, name=line.name)


def _build_einsum(line: _Line, store: TensorStore | None) -> Circuit:
    return Einsum.from_einsum_string(line.extra, *line.children, name=line.name)


def _build_add(line: _Line, store: TensorStore | None) -> Circuit:
    _no_extra(line)
    return Add(*line.children, name=line.name)


def _build_function(line: _Line, store: TensorStore | None) -> Circuit:
    if not line.extra:
        raise line.error("GeneralFunction needs the function's name after the variant")
    return GeneralFunction(*line.children, spec=line.extra, name=line.name)


def _build_index(line: _Line, store: TensorStore | None) -> Circuit:
    if len(line.children) != 1:
        raise line.error(f"Index takes one child, found {len(line.children)}")
    return Index(line.children[0], _parse_index(line), name=line.name)


def _parse_index(line: _Line) -> tuple:
    text = line.extra.replace(" ", "")
    if not (text.startswith("[") and text.endswith("]")):
        raise line.error(f"Index needs [...] after the variant, found {line.extra!r}")
    items = []
    for part in re.findall(r"\[[^\[\]]*\]|[^,]+", text[1:-1]):
        if part.startswith("["):
            values = part[1:-1]
            if values and not re.fullmatch(r"-?\d+(,-?\d+)*", values):
                raise line.error(f"malformed tensor index {part!r}: expected [3,1,4]")
            items.append(torch.tensor([int(v) for v in values.split(",")] if values else [], dtype=torch.int64))
        elif re.fullmatch(r"-?\d+", part):
            items.append(int(part))
        elif re.fullmatch(r"(-?\d+)?:(-?\d+)?", part):
            start, stop = part.split(":")
            items.append(slice(int(start) if start else None, int(stop) if stop else None))
        else:
            raise line.error(f"malformed index item {part!r}: expected an int, start:stop or [i,j,...]")
    rebuilt = ",".join(re.findall(r"\[[^\[\]]*\]|[^,]+", text[1:-1]))
    if rebuilt != text[1:-1]:
        raise line.error(f"malformed index {line.extra!r}: empty item or stray comma")
    return tuple(items)


def _build_rearrange(line: _Line, store: TensorStore | None) -> Circuit:
    if len(line.children) != 1:
        raise line.error(f"Rearrange takes one child, found {len(line.children)}")
    pattern, *size_texts = line.extra.split(",")
    sizes = {}
    for text in size_texts:
        match = _SIZE.fullmatch(text)
        if not match:
            raise line.error(f"malformed axis size {text.strip()!r}: expected name=int")
        sizes[match.group(1)] = int(match.group(2))
    return Rearrange(line.children[0], pattern, name=line.name, **sizes)


def _build_concat(line: _Line, store: TensorStore | None) -> Circuit:
    if not re.fullmatch(r"-?\d+", line.extra):
        raise line.error(f"Concat needs its axis as an int, found {line.extra!r}")
    return Concat(*line.children, axis=int(line.extra), name=line.name)


_BUILDERS: dict[str, Callable[[_Line, TensorStore | None], Circuit]] = {
    "Array": _build_array,
    "Scalar": _build_scalar,
    "Symbol": _build_symbol,
    "Einsum": _build_einsum,
    "Add": _build_add,
    "GeneralFunction": _build_function,
    "Index": _build_index,
    "Rearrange": _build_rearrange,
    "Concat": _build_concat,
}
