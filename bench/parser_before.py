"""A frozen copy of circuits/text/parsing.py as it was before issue 20's speed-up (commit a169e80).

bench/format_scale.py times it against the current parser on the same text in
the same run.  Only this docstring differs from that commit's file; it still
builds nodes with today's ``circuits.core.nodes``, so any speed-up of node
construction helps both parsers alike.

The original docstring follows.

The FORMAT.md reader: text back into circuits.

Lines are read one at a time with an explicit stack of nodes whose children
are still coming, so the depth of the text never touches Python's call
stack.  Anything wrong in the text raises ``ParseError`` with the line
number, the line, and what was expected.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import Callable

import attrs
import torch

from circuits.errors import CircuitError, ParseError, shown
from circuits.core.gcpause import gc_paused
from circuits.core.hashing import FULL_HEX_DIGITS, PRINTED_HEX_DIGITS
from circuits.core.nodes import (
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
from circuits.core.shapes import EINSUM_LETTERS
from circuits.text.store import TensorStore

_INDENT = re.compile(r" *")
_SERIAL = re.compile(r"\d+")
_NAME = re.compile(r"'((?:[^'\\]|\\.)*)'")
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", "'": "'", "n": "\n", "r": "\r"}
_SHAPE = re.compile(r"\[([^\[\]]*)\]")
_VARIANT = re.compile(r"[A-Za-z]+")
# Exactly what the printer writes: [serial] ['name'] [ [shape]] [ Variant [extra]].
_PRINTED_LINE = re.compile(
    r"(?P<serial>\d+)?"
    r"(?:(?(serial) )'(?P<name>(?:[^'\\]|\\.)*)')?"
    r"(?: (?:\[(?P<shape>(?:\d+(?:,\d+)*)?)\] )?(?P<kind>[A-Za-z]+)(?: (?P<extra>[^#]*[^# ]))?)?"
)
_HEX = re.compile(f"[0-9a-f]{{{PRINTED_HEX_DIGITS},{FULL_HEX_DIGITS}}}")
_INT = re.compile(r"-?\d+")
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit, which takes "²" that int() refuses
_DECIMAL = re.compile(r"-?(\d+(\.\d*)?|\.\d+|inf|nan)")
_SLICE = re.compile(r"(-?\d+)?:(-?\d+)?")
_INT_LIST = re.compile(r"-?\d+(,-?\d+)*")
_INDEX_PART = re.compile(r"\[[^\[\]]*\]|[^,]+")
# An ANSI colour code, or a quoted name (kept whole: codes inside a name are part of it).
_COLOUR_OR_NAME = re.compile(r"'(?:[^'\\]|\\.)*'|\x1b\[[0-9;]*m")
# rust_circuit's symbolic sizes: "0s", "2*1s" (a product of integers and numbered symbols)
_SYMBOLIC_SIZE = re.compile(r"[\d*]*\d+s[\d*s]*")
# rust_circuit's arrows=True tree drawing before a line, and its only-child marker line
_TREE_START = "│├└‣─▼|"
_TREE_DRAWING = re.compile(r"[ │├└‣─]*")
_ONLY_CHILD_MARKER = re.compile(r"(?:▼|\|/) *(?:#.*)?")
_SIZE = re.compile(r"\s*([^\W\d]\w*)\s*=\s*(\d+)\s*")  # einops axis names are identifiers

LEAF_KINDS = ("Array", "Scalar", "Symbol")
# leaves whose shape must be printed: as in rust_circuit, only an Array loaded by hash may omit it
_SHAPED_KINDS = ("Scalar", "Symbol")
# node types rust_circuit prints that this library does not have
_UNSUPPORTED_KINDS = frozenset(
    ("Module", "Tag", "Scatter", "Cumulant", "DiscreteVar", "StoredCumulantVar", "SetSymbolicShape", "Conv")
)


@attrs.define
class _Line:
    """One parsed line, waiting for its children (if it is not a repeat)."""

    number: int
    spaces: int  # the line's own indent, for showing it in errors
    depth: int  # from the indent beyond the block's first line
    body: str
    serial: int | None
    name: str | None
    shape: tuple[int, ...] | None = None
    kind: str | None = None
    extra: str = ""
    children: list[Circuit] = attrs.field(factory=list)
    shown: str | None = None  # the line as written, when that is not its indent and body

    @property
    def is_repeat(self) -> bool:
        return self.kind is None

    def error(self, message: str) -> ParseError:
        return ParseError(message, self.number, self.shown or _shown_line(self.spaces, self.body))


def parse(text: str, store: TensorStore | None = None, tensors_as_random: bool = False) -> Circuit:
    """Read exactly one circuit.

    ``tensors_as_random=True`` (rust_circuit's option) reads every Array as
    a seeded random array of its printed shape, for texts whose weights are
    not at hand (see ``_random_array`` for the seed rule).
    """
    reader = _read(text, store, tensors_as_random)
    roots = reader.roots
    if len(roots) > 1:
        second = reader.root_lines[1]
        raise second.error(
            f"expected one circuit, found {len(roots)} top-level circuits; the second starts here "
            "(use parse_many to read several)"
        )
    if not roots:
        raise ParseError("expected one circuit, found none (the text is empty or all comments)")
    return roots[0]


def parse_many(text: str, store: TensorStore | None = None, tensors_as_random: bool = False) -> list[Circuit]:
    """Read every top-level circuit in ``text``, in order (options as for ``parse``)."""
    return _read(text, store, tensors_as_random).roots


def _read(text: str, store: TensorStore | None, tensors_as_random: bool) -> _Reader:
    if not isinstance(text, str):
        raise ParseError(f"expected text (str), got {type(text).__name__}")
    reader = _Reader(store, tensors_as_random)
    with gc_paused():
        reader.read(text)
    return reader


class _Reader:
    def __init__(self, store: TensorStore | None, tensors_as_random: bool = False):
        self.store = store
        # swapping the Array builder costs the other nodes nothing
        self.builders = {**_BUILDERS, "Array": _random_array} if tensors_as_random else _BUILDERS
        self.roots: list[Circuit] = []
        self.pending: list[_Line] = []
        self.by_serial: dict[int, Circuit | _Line] = {}
        self.by_name: dict[str, dict[bytes, Circuit]] = {}
        # the line that starts each top-level circuit, for parse's error on a second one
        self.root_lines: list[_Line] = []
        # (number, indent, line as written) of an only-child marker whose child line is still to come
        self.marker: tuple[int, int, str] | None = None
        self.base = 0  # the indent of the text's first node line, which is depth 0

    def read(self, text: str) -> None:
        last: _Line | None = None
        self.base = _base_indent(text)
        lines = _lines(text)
        for number, spaces, body in _dedent_checked(lines, self.base) if self.base else lines:
            line = self._split(number, spaces, body)
            if line is None:
                continue
            if self.marker is not None:
                self._only_child(line, last)
                last = line
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
            if line.depth and self.pending[-1].kind in LEAF_KINDS:
                parent = self.pending[-1]
                raise line.error(f"indented under line {parent.number}, a {parent.kind}, which is a leaf")
            if not self.pending:
                self.root_lines.append(line)
            if line.is_repeat:
                self._attach(self._resolve(line))
            else:
                self._open(line)
            last = line
        if self.marker is not None:
            number, _, shown = self.marker
            raise ParseError("the text ends after an only-child marker; its child is missing", number, shown)
        self._close_to(0)

    def _open(self, line: _Line) -> None:
        """Make ``line`` the node whose children the next deeper lines are."""
        if line.serial is not None:
            if line.serial in self.by_serial:
                raise line.error(f"serial number {line.serial} is already used")
            self.by_serial[line.serial] = line
        self.pending.append(line)

    def _only_child(self, line: _Line, last: _Line | None) -> None:
        """Place the line after rust_circuit's only-child marker (``▼``, ``|/``).

        With ``only_child_below`` rust_circuit prints an only child at its
        parent's indent, below a marker line; so this line is a child of the
        line above the marker, not its sibling.  Lines indented deeper are
        its own children; the next line at this indent or less closes both.
        """
        number, spaces, shown = self.marker
        self.marker = None
        if last is None or last.is_repeat or last.kind in LEAF_KINDS:
            raise ParseError(
                "an only-child marker must follow a line that opens a node with children "
                "(not a repeat or a leaf)",
                number,
                shown,
            )
        if not spaces == last.spaces == line.spaces:
            raise line.error(
                f"after the only-child marker on line {number}, the child is indented like its "
                f"parent on line {last.number} and like the marker"
            )
        if line.is_repeat:
            self._attach(self._resolve(line))
        else:
            self._open(line)

    # ------------------------------------------------------------ lines

    def _split(self, number: int, spaces: int, body: str) -> _Line | None:
        """Take a line apart into reference, shape, variant and extra.

        One regex reads every line the printer writes; anything else (comments,
        spaces in shapes, mistakes) goes the slower way that explains errors.
        """
        if not body.strip() or body.startswith("#"):
            return None
        match = _PRINTED_LINE.fullmatch(body)
        indent = spaces - self.base
        if match is None or indent % 2:
            if "\x1b" in body:  # coloured text (printed with color=): read it without the codes
                spaces, body = _without_colours(spaces, body)
                indent = spaces - self.base
                if not body.strip() or body.startswith("#"):
                    return None
                match = _PRINTED_LINE.fullmatch(body)
            if match is None or indent % 2:
                return self._split_slowly(number, spaces, body)
        serial, name, shape, kind, extra = match.group("serial", "name", "shape", "kind", "extra")
        if name is not None and "\\" in name:
            name = self._unescape(name, number, _shown_line(spaces, body))
        raw = _shown_line(spaces, body)
        line = _Line(
            number,
            spaces,
            indent // 2,
            body,
            None if serial is None else _integer(serial, "serial number", number, raw),
            name,
        )
        if kind is not None:
            line.kind, line.extra = kind, extra or ""
            if shape is not None:
                line.shape = (
                    tuple(_integer(size, "size", number, raw) for size in shape.split(",")) if shape else ()
                )
            self._check_variant(line)
        return line

    def _split_slowly(self, number: int, spaces: int, body: str) -> _Line | None:
        raw = _shown_line(spaces, body)  # errors show the line as written, tree drawing included
        if body[0] in _TREE_START:  # rust_circuit's arrows=True drawing or only-child marker
            drawing = _TREE_DRAWING.match(body).end()
            spaces, body = spaces + drawing, body[drawing:]
            if _ONLY_CHILD_MARKER.fullmatch(body):
                self._mark_only_child(number, spaces, raw)
                return None
            if not body or body.startswith("#"):
                return None
        if body[0] == "\t":
            raise ParseError(
                "a tab in the indentation; indent with spaces (two per depth), not tabs", number, raw
            )
        indent = spaces - self.base
        if indent % 2:
            beyond = " beyond the block's first line" if self.base else ""
            raise ParseError(
                f"indented by {indent} spaces{beyond}; indent is two spaces per depth", number, raw
            )
        position = 0
        serial = None
        match = _SERIAL.match(body)
        if match:
            serial = _integer(match.group(), "serial number", number, raw)
            position = match.end()
            if body[position : position + 1] == " ":
                position += 1
            elif position < len(body) and body[position] != "#":
                raise ParseError("expected a space after the serial number", number, raw)
        name = None
        if body[position : position + 1] == "'":
            match = _NAME.match(body, position)
            if not match:
                raise ParseError(
                    "unterminated quoted name (a quote inside a name is written \\')", number, raw
                )
            name = self._unescape(match.group(1), number, raw)
            position = match.end()
        if serial is None and name is None:
            raise ParseError("expected a reference: a serial number, a 'quoted name', or both", number, raw)
        rest = body[position:].split("#", 1)[0].rstrip()
        line = _Line(number, spaces, indent // 2, body, serial, name, shown=raw)
        if not rest:
            return line
        if not rest.startswith(" ") and name is not None:
            raise ParseError("expected a space after the name", number, raw)
        rest = rest.lstrip(" ")
        match = _SHAPE.match(rest)
        if match:
            line.shape = self._shape(match.group(1), line)
            rest = rest[match.end() :].lstrip(" ")
        match = _VARIANT.match(rest)
        if not match:
            raise line.error(f"expected a variant name (Array, Einsum, ...) but found {rest!r}")
        line.kind = match.group()
        line.extra = rest[match.end() :].strip(" ")
        self._check_variant(line)
        return line

    def _mark_only_child(self, number: int, spaces: int, shown: str) -> None:
        if self.marker is not None:
            raise ParseError(
                f"two only-child markers in a row (lines {self.marker[0]} and {number}); "
                "expected the child's line after the first",
                number,
                shown,
            )
        self.marker = (number, spaces, shown)

    @staticmethod
    def _check_variant(line: _Line) -> None:
        if line.kind in _UNSUPPORTED_KINDS:
            raise line.error(f"rust_circuit's {line.kind} is not supported: this library has no such node")
        if line.kind not in _BUILDERS:
            raise line.error(f"unknown variant {line.kind!r}; expected one of {', '.join(_BUILDERS)}")
        if line.shape is None and line.kind in _SHAPED_KINDS:
            raise line.error(f"{line.kind} needs its shape, e.g. [300,256], before the variant")

    @staticmethod
    def _unescape(escaped: str, number: int, raw: str) -> str:
        def replace(match: re.Match) -> str:
            try:
                return _ESCAPES[match.group(1)]
            except KeyError:
                raise ParseError(
                    f"unknown escape \\{match.group(1)} in a name (only \\\\, \\', \\n and \\r)", number, raw
                ) from None

        return _ESCAPE.sub(replace, escaped)

    @staticmethod
    def _shape(text: str, line: _Line) -> tuple[int, ...]:
        parts = [part.strip() for part in text.split(",")] if text.strip() else []
        for part in parts:
            if _SYMBOLIC_SIZE.fullmatch(part):
                raise line.error(
                    f"symbolic size {part!r} in [{text}] is not supported: sizes must be integers"
                )
            if ":" in part:
                raise line.error(f"named axis {part!r} in [{text}] is not supported: sizes must be integers")
        if any(not _DIGITS.fullmatch(part) for part in parts):
            raise line.error(f"malformed shape [{text}]: expected comma-separated sizes like [300,256]")
        return tuple(
            _integer(part, "size", line.number, _shown_line(line.spaces, line.body)) for part in parts
        )

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
        builder = self.builders[line.kind]
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
                raise line.error(f"serial number {line.serial} is {found.describe()}, not {line.name!r}")
            return found
        candidates = self.by_name.get(line.name, {})
        if not candidates:
            enclosing = any(p.name == line.name for p in self.pending)
            why = (
                "an enclosing node (a circuit cannot contain itself)"
                if enclosing
                else "defined by no earlier line"
            )
            raise line.error(f"repeat of {line.name!r}, which is {why}")
        if len(candidates) > 1:
            raise line.error(
                f"repeat of {line.name!r} is ambiguous: {len(candidates)} distinct nodes carry that "
                "name; refer to one by its serial number"
            )
        return next(iter(candidates.values()))


def _base_indent(text: str) -> int:
    """The indent of the first node line: depth 0.

    Text pasted from an indented Python string is indented as a whole; only
    the indent beyond the first line's says the depth.
    """
    return next((spaces for _, spaces, body in _lines(text) if body.strip() and body[0] != "#"), 0)


def _dedent_checked(lines, base: int):
    """Refuse a line indented less than the first node line (blank and comment lines aside).

    Only indented blocks pay for this check; unindented text does not pass here.
    """
    for number, spaces, body in lines:
        if spaces < base and body.strip() and body[0] != "#":
            raise ParseError(
                f"indented by {spaces} spaces, less than the {base} of the block's first line; "
                "a block is indented as a whole",
                number,
                _shown_line(spaces, body),
            )
        yield number, spaces, body


def _lines(text: str):
    """Yield ``(line number, indent width, text after the indent)`` for each line.

    Scans with ``find`` instead of ``split`` so that deep text, whose
    indentation grows quadratically with depth, is never copied.
    """
    position, number, length = 0, 0, len(text)
    while position <= length:
        end = text.find("\n", position)
        if end < 0:
            end = length
        number += 1
        body_start = _INDENT.match(text, position, end).end()
        yield number, body_start - position, text[body_start:end]
        position = end + 1


def _without_colours(spaces: int, body: str) -> tuple[int, str]:
    """The line without ANSI colour codes (SGR, ``ESC[...m``) outside quoted names.

    Only lines that the printer's fast pattern does not read get here, so
    plain text pays nothing.  Spaces that the codes hid from the indent
    count (a whole line may be wrapped in a colour).
    """
    body = _COLOUR_OR_NAME.sub(_keep_names, body)
    stripped = body.lstrip(" ")
    return spaces + len(body) - len(stripped), stripped


def _keep_names(match: re.Match) -> str:
    text = match.group()
    return text if text[0] == "'" else ""


#: Sizes and serial numbers are int64 in torch: more digits than this cannot be one.
_MAX_DIGITS = 19


def _integer(digits: str, what: str, number: int, raw: str) -> int:
    """A size or serial number; refused past int64 (Python would build a 5,000-digit int)."""
    if len(digits) > _MAX_DIGITS or int(digits) >= 2**63:
        raise ParseError(f"{what} {shown(digits, 30)} is too large (at most 2**63 - 1)", number, raw)
    return int(digits)


def _shown_line(spaces: int, body: str) -> str:
    """The line as error messages show it; a very deep indent is abbreviated."""
    return " " * spaces + body if spaces <= 120 else f"<{spaces} spaces>{body}"


# ------------------------------------------------------------------ builders


def _no_children(line: _Line) -> None:
    if line.children:
        raise line.error(f"{line.kind} is a leaf but has {len(line.children)} children")


def _no_extra(line: _Line) -> None:
    if line.extra:
        raise line.error(f"{line.kind} takes nothing after the variant, found {line.extra!r}")


def _build_array(line: _Line, store: TensorStore | None) -> Circuit:
    if line.extra == _RANDOM:
        return _random_array(line, store)
    _no_children(line)
    if not _HEX.fullmatch(line.extra):
        raise line.error(
            f"Array needs a {PRINTED_HEX_DIGITS}-hex content hash (or rand), found {line.extra!r}"
        )
    if store is None:
        if line.shape is None:
            raise line.error(
                f"this Array has no shape, so it needs its tensor: parse with store= to load "
                f"{line.extra} (or print the shape, e.g. [300,256], before the variant)"
            )
        return Array.from_hash(line.shape, line.extra, name=line.name)
    tensor = store.load(line.extra)
    node = Array(tensor, name=line.name)
    if not node.content_hash.startswith(line.extra):
        raise line.error(
            f"the store's tensor hashes to {node.content_hash[:PRINTED_HEX_DIGITS]}, not {line.extra}"
        )
    return node


_RANDOM = "rand"
#: a typo in a printed shape must not make the parser fill the machine's memory
_MAX_RANDOM_ELEMENTS = 2**30


def _random_array(line: _Line, store: TensorStore | None) -> Circuit:
    """``Array rand`` (and every Array under ``tensors_as_random``): seeded normal values.

    rust_circuit draws fresh values each time; here the seed is the SHA-256
    of the line's serial number, name, shape and hash (or ``rand``), so the
    same text always gives the same arrays, and two lines that differ in
    any of these get different ones.  The values are float32 standard
    normals (``torch.randn``).  The printed hash, if any, is not checked:
    the array is a stand-in, and reprints with its own hash.
    """
    _no_children(line)
    if line.shape is None:
        raise line.error("a random Array needs its shape, e.g. [300,256], before the variant")
    if line.extra != _RANDOM and not _HEX.fullmatch(line.extra):
        raise line.error(f"Array needs a {PRINTED_HEX_DIGITS}-hex content hash or rand, found {line.extra!r}")
    if math.prod(line.shape) > _MAX_RANDOM_ELEMENTS:
        raise line.error(
            f"a random Array of shape {list(line.shape)} has more than {_MAX_RANDOM_ELEMENTS} elements "
            "(4 GiB of float32): refused rather than filling memory"
        )
    seed_text = f"{line.serial}|{line.name!r}|{list(line.shape)}|{line.extra}"
    seed = int.from_bytes(hashlib.sha256(seed_text.encode()).digest()[:8], "little") >> 1
    generator = torch.Generator().manual_seed(seed)
    return Array(torch.randn(line.shape, generator=generator), name=line.name)


def _build_scalar(line: _Line, store: TensorStore | None) -> Circuit:
    _no_children(line)
    if not _DECIMAL.fullmatch(line.extra):
        raise line.error(f"Scalar needs a decimal value like -1 or 0.00001, found {line.extra!r}")
    value = float(line.extra)
    if math.isinf(value) and "inf" not in line.extra:
        raise line.error(
            f"Scalar value {shown(line.extra, 40)} is too large for a float64 (it would read as inf)"
        )
    if value == 0 and line.extra.strip("-.0"):
        raise line.error(
            f"Scalar value {shown(line.extra, 40)} is too small for a float64 (it would read as 0)"
        )
    return Scalar(value, shape=line.shape, name=line.name)


def _build_symbol(line: _Line, store: TensorStore | None) -> Circuit:
    _no_children(line)
    _no_extra(line)
    return Symbol(line.shape, name=line.name)


def _build_einsum(line: _Line, store: TensorStore | None) -> Circuit:
    if not line.children and line.extra.replace(" ", "") == "->":
        raise line.error(
            "an Einsum without operands (rust_circuit's `Einsum ->`, the scalar 1) is not supported; "
            "write `[] Scalar 1`"
        )
    spec = line.extra
    if spec.startswith(_FANCY):
        spec = _fancy_to_letters(spec[len(_FANCY) :], line)
    return Einsum.from_einsum_string(spec, *line.children, name=line.name)


_FANCY = "fancy:"


def _fancy_to_letters(fancy: str, line: _Line) -> str:
    """rust_circuit's named-axis einsum (``first second, first -> first``) in letters.

    Axes are words separated by spaces and operands by commas; each distinct
    word becomes a letter, in order of first appearance.
    """
    if fancy.count("->") != 1:
        raise line.error(f"fancy einsum {fancy.strip()!r} needs exactly one '->'")
    inputs, output = fancy.split("->")
    letters: dict[str, str] = {}

    def spell(operand: str) -> str:
        for word in operand.split():
            if word not in letters:
                if len(letters) == len(EINSUM_LETTERS):
                    raise line.error(f"fancy einsum names more than {len(EINSUM_LETTERS)} distinct axes")
                letters[word] = EINSUM_LETTERS[len(letters)]
        return "".join(letters[word] for word in operand.split())

    return ",".join(spell(operand) for operand in inputs.split(",")) + "->" + spell(output)


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
    return Index(line.children[0], _parse_index(line, store), name=line.name)


def _parse_index(line: _Line, store: TensorStore | None) -> tuple:
    text = line.extra.replace(" ", "")
    try:
        if _TENSOR_ITEM.search(text):
            return _index_items_with_tensors(text, store)
        return _index_items(text)
    except ValueError as error:
        raise line.error(str(error)) from None


# rust_circuit's index item that is a tensor by hash: t + 10 hex digits, then its length ("t292d9fdb22 [6]")
_TENSOR_ITEM = re.compile(r"(?:^\[|,)t[0-9a-f]")
_TENSOR_BY_HASH = re.compile(r"t([0-9a-f]+)(?:\[(\d+)\])?")


def _index_items_with_tensors(text: str, store: TensorStore | None) -> tuple:
    """An index with tensors by hash, loaded from the store like Arrays.

    There is no placeholder for a missing index tensor (an Index's shape
    and checks need its values), so without the store it is an error that
    names the hash.  Other items read as in ``_index_items``.
    """
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"Index needs [...] after the variant, found {text!r}")
    parts = _INDEX_PART.findall(text[1:-1])
    if ",".join(parts) != text[1:-1]:
        raise ValueError(f"malformed index {text!r}: empty item or stray comma")
    items = []
    for part in parts:
        match = _TENSOR_BY_HASH.fullmatch(part)
        if match is None:
            items.extend(_index_items(f"[{part}]"))
            continue
        prefix, length = match.groups()
        if store is None:
            raise ValueError(
                f"index tensor t{prefix} is not at hand: parse with store= holding the tensor "
                f"whose hash starts with {prefix}"
            )
        tensor = store.load(prefix)
        if length is not None and tuple(tensor.shape) != (int(length),):
            raise ValueError(
                f"index tensor t{prefix} is printed with length [{length}] but the store's has "
                f"shape {list(tensor.shape)}"
            )
        items.append(tensor)
    return tuple(items)


@functools.lru_cache(maxsize=4096)
def _index_items(text: str) -> tuple:
    """``"[0,:-2,[3,1]]"`` -> ``(0, slice(None, -2), tensor([3, 1]))``; cached, as specs repeat."""
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"Index needs [...] after the variant, found {text!r}")
    inner = text[1:-1]
    parts = _INDEX_PART.findall(inner)
    if ",".join(parts) != inner:
        raise ValueError(f"malformed index {text!r}: empty item or stray comma")
    items = []
    for part in parts:
        if part.startswith("["):
            if len(part) < 2 or not part.endswith("]"):  # "[0" must not read as []
                raise ValueError(f"malformed tensor index {part!r}: expected [3,1,4]")
            values = part[1:-1]
            if values and not _INT_LIST.fullmatch(values):
                raise ValueError(f"malformed tensor index {part!r}: expected [3,1,4]")
            items.append(
                torch.tensor([int(v) for v in values.split(",")] if values else [], dtype=torch.int64)
            )
        elif _INT.fullmatch(part):
            items.append(int(part))
        elif _SLICE.fullmatch(part):
            start, stop = part.split(":")
            items.append(slice(int(start) if start else None, int(stop) if stop else None))
        else:
            raise ValueError(f"malformed index item {part!r}: expected an int, start:stop or [i,j,...]")
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
    if ":" in pattern:
        pattern = _sized_axes(pattern, sizes, line)
    return Rearrange(line.children[0], pattern, name=line.name, sizes=sizes)


# rust_circuit's sized axis in a rearrange spec: "a:2", the size written at any occurrence
_SIZED_AXIS = re.compile(r"(\w*):([\w*]*)")


def _sized_axes(pattern: str, sizes: dict[str, int], line: _Line) -> str:
    """rust_circuit's ``(a:2 b) -> a:2 b``: the einops pattern, with each size put in ``sizes``.

    rust_circuit writes an axis's size after a colon where it appears; einops
    takes sizes as keywords, which our Rearrange keeps.  An axis given two
    different sizes is an error, as is a symbolic size (``a:0s``).
    """

    def strip_size(match: re.Match) -> str:
        axis, size = match.groups()
        if not _AXIS_NAME.fullmatch(axis):
            raise line.error(f"malformed sized axis {match.group()!r}: expected a name, e.g. a:2")
        if _SYMBOLIC_SIZE.fullmatch(size):
            raise line.error(f"symbolic size {match.group()!r} is not supported: sizes must be integers")
        if not _DIGITS.fullmatch(size):
            raise line.error(f"malformed sized axis {match.group()!r}: expected an int size, e.g. a:2")
        value = _integer(size, "size", line.number, _shown_line(line.spaces, line.body))
        if sizes.setdefault(axis, value) != value:
            raise line.error(f"axis {axis!r} is given two sizes, {sizes[axis]} and {value}")
        return axis

    return _SIZED_AXIS.sub(strip_size, pattern)


_AXIS_NAME = re.compile(r"[^\W\d]\w*")


def _build_concat(line: _Line, store: TensorStore | None) -> Circuit:
    if not _INT.fullmatch(line.extra):
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
