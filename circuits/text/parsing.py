"""The FORMAT.md reader: text back into circuits.

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
from collections.abc import Iterable, Mapping
from typing import Callable
from uuid import UUID

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
    Cumulant,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scalar,
    Scatter,
    StoredCumulantVar,
    Symbol,
    Tag,
)
from circuits.core.nodes import keeps_derivation, rebuilt_like
from circuits.core.shapes import EINSUM_LETTERS
from circuits.text.store import TensorStore

_INDENT = re.compile(r" *")
# Every line of the text in one scan (MULTILINE): its indent (group 1), then its body (group 2),
# which is either exactly what the printer writes, [serial] ['name'] [ [shape]] [ Variant [extra]]
# (groups 3 to 7: read at once), or anything else (groups 3 to 7 None: the slower way explains).
# Optional parts are written as alternatives with an empty one, ``(?:x|)``, and the line's end
# as a lookahead: the same matches as ``(?:x)?`` and ``$``, in three quarters of the time
# (Python's engine runs its generic repeat for an optional group).
_LINE = re.compile(
    r"^( *)((?:(\d+)|)"
    r"(?:(?(3) )'([^'\\\n]*(?:\\.[^'\\\n]*)*)'|)"
    r"(?: (?:\[((?:\d+(?:,\d+)*)?)\] |)([A-Za-z]+)(?: ([^#\n]*[^#\n ])|)|)(?=\n|\Z)|.*)",
    re.MULTILINE,
)
_SERIAL = re.compile(r"\d+")
_NAME = re.compile(r"'((?:[^'\\]|\\.)*)'")
# rust_circuit's reading of a quoted name, tried when ours fails: a quote after a backslash may
# end the name or belong to it, and ends it only if what follows can follow a name (rust's line
# regex decides by backtracking; ``'??`` tries ending first, as it does).  Each alternative
# starts differently, so a long line cannot make it backtrack more than once per quote.
_RUST_QUOTED = r"'((?:[^'\\]|\\'??)*)'(?= |[\s│├└‣─]*(?:#|\Z))"
_RUST_HEAD = re.compile(rf"(?:(\d+)|{_RUST_QUOTED})(?: +{_RUST_QUOTED})?")
_ESCAPE = re.compile(r"\\(.?)")  # (.?): a lone backslash at the end is an error, not kept
_AUTONAME_OFF = re.compile(r" +AD(?= |#|\Z)")  # rust_circuit's "autoname disabled" flag
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
# a size in a shape as rust_circuit reads it: digits with "_" separators (1_000), or a product (2*3)
_SIZE_PRODUCT = re.compile(r"[0-9][0-9_]*(?:\s*\*\s*[0-9][0-9_]*)*")
_AXIS_LABEL = re.compile(r"[^\s:\[\],]*")  # rust_circuit's axis name in a shape ([large:3])
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
# kinds whose shape must be printed (it follows from nothing else): as in rust_circuit
_SHAPED_KINDS = ("Scalar", "Symbol", "Scatter")
# node types rust_circuit prints that this library does not have
_UNSUPPORTED_KINDS = frozenset(("Module", "SetSymbolicShape", "Conv"))


@attrs.define
class _Line:
    """One parsed line, waiting for its children (if it is not a repeat)."""

    number: int
    spaces: int  # the line's own indent, for showing it in errors
    depth: int  # from the indent beyond the block's first line
    body: str
    # the line's identifier: its serial number, or (a str) rust_circuit's quoted identifier
    # when a second quoted string is the name ('id' 'name' ...)
    serial: int | str | None
    name: str | None
    shape: tuple[int, ...] | None = None
    kind: str | None = None
    extra: str = ""
    children: list[Circuit] = attrs.field(factory=list)
    shown: str | None = None  # the line as written, when that is not its indent and body
    # the line's node, once its children are complete (unset before: not in __init__, which
    # every line pays for)
    node: Circuit = attrs.field(init=False)

    @property
    def is_repeat(self) -> bool:
        return self.kind is None

    def error(self, message: str) -> ParseError:
        return ParseError(message, self.number, self.shown or _shown_line(self.spaces, self.body))


def parse(
    text: str,
    store: TensorStore | None = None,
    tensors_as_random: bool = False,
    reference_circuits: Mapping[str, Circuit] | Iterable[Circuit] | None = None,
) -> Circuit:
    """Read exactly one circuit.

    ``tensors_as_random=True`` (rust_circuit's option) reads every Array as
    a seeded random array of its printed shape, for texts whose weights are
    not at hand (see ``_random_array`` for the seed rule).
    ``reference_circuits`` (rust_circuit's option): circuits the text names
    without defining them, as a mapping name -> circuit or as named circuits;
    a line that is just ``'name'`` is that circuit.
    """
    reader = _read(text, store, tensors_as_random, reference_circuits)
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


def parse_many(
    text: str,
    store: TensorStore | None = None,
    tensors_as_random: bool = False,
    reference_circuits: Mapping[str, Circuit] | Iterable[Circuit] | None = None,
) -> list[Circuit]:
    """Read every top-level circuit in ``text``, in order (options as for ``parse``)."""
    return _read(text, store, tensors_as_random, reference_circuits).roots


def _read(text: str, store: TensorStore | None, tensors_as_random: bool, references) -> _Reader:
    if not isinstance(text, str):
        raise ParseError(f"expected text (str), got {type(text).__name__}")
    reader = _Reader(store, tensors_as_random, _references(references))
    with gc_paused(long_lived=True):  # the nodes are the result
        reader.read(text)
    return reader


class _Reader:
    def __init__(
        self,
        store: TensorStore | None,
        tensors_as_random: bool = False,
        references: dict[str, Circuit] | None = None,
    ):
        self.store = store
        self.references = references or {}  # rust_circuit's reference_circuits, by name
        # swapping the Array builder costs the other nodes nothing
        self.builders = {**_BUILDERS, "Array": _random_array} if tensors_as_random else _BUILDERS
        # variants a printed line may name with nothing more to check (shaped and unknown ones are checked)
        self.plain_kinds = frozenset(self.builders).difference(_UNSUPPORTED_KINDS, _SHAPED_KINDS)
        self.roots: list[Circuit] = []
        self.pending: list[_Line] = []
        # the line defining each identifier, serial number or quoted ('id' 'name'); its node once built
        self.by_serial: dict[int | str, _Line] = {}
        # whether a quoted name alone may be an identifier: reference circuits, or 'id' 'name' lines read
        self.quoted_idents = bool(self.references)
        self.autoname_lines: set[int] = set()  # the numbers of the lines carrying rust_circuit's AD
        self.by_name: dict[str, Circuit] = {}  # the first node of each name
        self.name_hashes: dict[str, set[bytes]] = {}  # the distinct nodes of a name several carry
        # the first node built for each (variant, extra, printed shape, children's shapes): see _build
        self.prototypes: dict[tuple, Circuit] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}  # printed shapes read so far, by their text
        # the line that starts each top-level circuit, for parse's error on a second one
        self.root_lines: list[_Line] = []
        # (number, indent, line as written) of an only-child marker whose child line is still to come
        self.marker: tuple[int, int, str] | None = None
        self.base = 0  # the indent of the text's first node line, which is depth 0

    def read(self, text: str) -> None:
        # the line before: its _Line, or (number, groups) of a repeat that _placed_repeat placed
        last: _Line | tuple[int, tuple] | None = None
        # the deepest the next line may be indented: the line before's depth if it is a repeat
        ceiling = _NO_CEILING
        self.base = _base_indent(text)
        for number, match in enumerate(_LINE.finditer(text), 1):
            groups = match.groups()
            if groups[5] is None and (depth := self._placed_repeat(groups, ceiling)) is not None:
                last, ceiling = (number, groups), depth
                continue
            line = self._line(number, groups)
            if line is None:
                continue
            if self.marker is not None:
                self._only_child(line, self._line_before(last))
            else:
                self._place(line, last, ceiling)
            last, ceiling = line, (line.depth if line.kind is None else _NO_CEILING)
        if self.marker is not None:
            number, _, shown = self.marker
            raise ParseError("the text ends after an only-child marker; its child is missing", number, shown)
        self._close_to(0)

    def _placed_repeat(self, groups: tuple, ceiling: int) -> int | None:
        """Place a plain repeat by name (``'w'``), the printer's commonest line, and return its
        depth, if nothing about it needs a _Line (None: the general way reads it and says what
        is wrong, if anything).
        """
        indent, _, serial, name, _, _, _ = groups
        beyond = len(indent) - self.base
        depth, pending = beyond >> 1, self.pending
        if not (
            serial is None
            and name is not None
            and pending
            and 0 <= depth <= ceiling
            and not beyond & 1
            and self.marker is None
            and not self.quoted_idents
            and "\\" not in name
        ):
            return None
        if pending[-1].depth >= depth:
            self._close_to(depth)
        found = self.by_name.get(name)
        if (
            found is None
            or not pending
            or pending[-1].depth + 1 != depth
            or pending[-1].kind in LEAF_KINDS
            or name in self.name_hashes
        ):
            return None
        pending[-1].children.append(found)
        return depth

    def _line_before(self, last: _Line | tuple[int, tuple] | None) -> _Line | None:
        """The line before as a _Line (which a repeat that _placed_repeat placed has not)."""
        return self._line(*last) if last.__class__ is tuple else last

    def _place(self, line: _Line, last: _Line | tuple[int, tuple] | None, ceiling: int) -> None:
        """Put the node or repeat of ``line`` in its place: the indent says under which open node.

        ``ceiling``: the deepest the line may be, the depth of ``last`` if it is a repeat.
        """
        depth, pending = line.depth, self.pending
        if depth > ceiling:
            last = self._line_before(last)
            what = "a reference circuit" if self._is_reference(last) else "a repeat"
            raise line.error(f"indented under line {last.number}, {what}, which has no children in the text")
        if pending and pending[-1].depth >= depth:
            self._close_to(depth)
        if pending:
            parent = pending[-1]
            if depth != parent.depth + 1:
                raise self._too_deep(line, parent.depth)
            if parent.kind in LEAF_KINDS:
                raise line.error(f"indented under line {parent.number}, a {parent.kind}, which is a leaf")
            siblings = parent.children
        elif depth:
            raise self._too_deep(line, -1)
        else:
            self.root_lines.append(line)
            siblings = self.roots
        if line.kind is None:
            siblings.append(self._resolve(line))
        else:
            self._open(line, siblings)

    @staticmethod
    def _too_deep(line: _Line, parent_depth: int) -> ParseError:
        return line.error(
            f"indented to depth {line.depth} but the enclosing node is at depth {parent_depth}; "
            "a child is indented two spaces more than its parent"
        )

    def _open(self, line: _Line, siblings: list[Circuit]) -> None:
        """Make ``line`` the node whose children the next deeper lines are.

        A line whose identifier is already defined is a repeat that restates
        its node's info (rust_circuit's ``1 [2] Scalar 1`` again, or ``1
        Scalar``): the node goes among ``siblings``, once the info is checked.
        """
        if line.serial is not None:
            first = self.by_serial.setdefault(line.serial, line)
            if first is not line:
                siblings.append(self._restated(line, first))
                return
        elif self.quoted_idents:
            first = self._quoted_ident(line)
            if first is not None:
                siblings.append(self._restated(line, first))
                return
        self.pending.append(line)

    def _quoted_ident(self, line: _Line) -> _Line | None:
        """The line defining the identifier a line's only quoted string is, if it is one.

        In rust_circuit ``'x' [2] Scalar 1`` restates an earlier ``'x' 'name'``
        line; a reference circuit's name holds nothing else.
        """
        if line.name in self.references:
            raise self._more_on_reference(line, line.name)
        first = self.by_serial.get(line.name)
        if first is not None:
            line.serial, line.name = line.name, None  # the quoted string was the identifier, not a name
        return first

    def _more_on_reference(self, line: _Line, name: str) -> ParseError:
        return line.error(
            f"{name!r} is a reference circuit (reference_circuits=): a line naming it holds nothing "
            "else, no name, AD, shape, variant or extra"
        )

    def _check_quoted_ident(self, line: _Line) -> None:
        """A line ``'id' 'name' ...``: ``'id'`` is not a reference circuit, nor another line's name."""
        ident = line.serial
        self.quoted_idents = True
        if ident in self.references:
            raise self._more_on_reference(line, ident)
        if ident not in self.by_serial and (
            ident in self.by_name or any(p.name == ident for p in self.pending)
        ):
            raise line.error(
                f"identifier {ident!r} is already the name of an earlier line; a repeat of that "
                f"node is written {ident!r} alone"
            )

    def _restated(self, line: _Line, first: _Line) -> Circuit:
        """The node of a repeat that restates its info, which must equal the first definition's.

        As rust_circuit checks it (``on_repeat_check_info_same``): each field
        the line gives (name, shape, variant, extra, AD) is compared; the
        shape with the node's, printed or computed.  The line is a repeat from
        here on (it takes no children).
        """
        node = getattr(first, "node", None)
        reference = _ident_text(line.serial)
        if node is None:
            raise line.error(
                f"repeat of {reference}, whose line {first.number} is an enclosing node "
                "(a circuit cannot contain itself)"
            )
        autoname = self.autoname_lines
        fields = (
            ("name", line.name, node.name),
            ("shape", None if line.shape is None else list(line.shape), list(node.shape)),
            ("variant", line.kind, first.kind),
            ("extra", line.extra or None, first.extra),
            ("AD (autoname disabled)", (line.number in autoname) or None, first.number in autoname),
        )
        mismatches = [f"{field} {new!r} != {old!r}" for field, new, old in fields if new not in (None, old)]
        if mismatches:
            if "!" in line.extra:
                raise _child_info_error(line)
            raise line.error(
                f"this line restates {reference}, defined on line {first.number}, with different info: "
                + "; ".join(mismatches)
            )
        line.kind = None
        return node

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
            self._open(line, self.pending[-1].children)

    # ------------------------------------------------------------ lines

    def _line(self, number: int, groups: tuple) -> _Line | None:
        """Take a line (its scan's groups) apart into reference, shape, variant and extra (None for
        a blank line).

        One scan of the text reads every line the printer writes; anything
        else (comments, spaces in shapes, mistakes) goes the slower way that
        explains errors.
        """
        indent, body, serial, name, shape, kind, extra = groups
        spaces = len(indent)
        beyond = spaces - self.base
        if (serial is None and name is None) or beyond < 0 or beyond & 1:
            if not body:
                return None
            _check_dedent(number, spaces, body, self.base)
            return self._split(number, spaces, body)
        if serial is not None:
            serial = int(serial) if len(serial) < _MAX_DIGITS else self._serial(serial, number, spaces, body)
        if name is not None and "\\" in name:
            name = self._unescape(name, number, _shown_line(spaces, body))
        if kind is None:
            return _Line(number, spaces, beyond >> 1, body, serial, name)
        line = _Line(number, spaces, beyond >> 1, body, serial, name, None, kind, extra or "")
        if shape is not None:
            known = self.shapes.get(shape)
            line.shape = known if known is not None else self._printed_shape(shape, line)
        if kind not in self.plain_kinds:
            if kind == "AD":  # rust_circuit's autoname flag, not a variant
                return self._split_slowly(number, spaces, body)
            self._check_variant(line)
        return line

    @staticmethod
    def _serial(digits: str, number: int, spaces: int, body: str) -> int:
        return _integer(digits, "serial number", number, _shown_line(spaces, body))

    def _printed_shape(self, text: str, line: _Line) -> tuple[int, ...]:
        """A shape as the printer writes it (``4,8`` for [4,8]), remembered: shapes repeat."""
        raw = _shown_line(line.spaces, line.body)
        shape = tuple(_integer(size, "size", line.number, raw) for size in text.split(",")) if text else ()
        self.shapes[text] = shape
        return shape

    def _split(self, number: int, spaces: int, body: str) -> _Line | None:
        """``_line`` for a line the scan did not read: a comment, an odd indent, colour codes...

        A coloured line is read without its codes by the printer's pattern;
        anything else goes the slower way that explains errors.
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
        if kind == "AD":  # rust_circuit's autoname flag, not a variant
            return self._split_slowly(number, spaces, body)
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
        line = _Line(number, spaces, indent // 2, body, None, None, shown=raw)
        strict = None
        try:
            position = self._reference(line, body)
        except ParseError as error:  # our reading of the names failed: try rust_circuit's
            strict = error
            position = self._rust_reference(line, body, strict)
        if isinstance(line.serial, str):
            self._check_quoted_ident(line)
        match = _AUTONAME_OFF.match(body, position)
        if match:
            self.autoname_lines.add(number)
            position = match.end()
        rest = body[position:].split("#", 1)[0].rstrip()
        try:
            if rest:
                self._rest(line, rest)
        except ParseError:
            if strict is not None:  # the rest of rust_circuit's reading fails too: ours explains it
                raise strict from None
            raise
        return line

    def _reference(self, line: _Line, body: str) -> int:
        """Read ``serial``, ``'name'``, ``serial 'name'`` or ``'ident' 'name'`` into the line.

        Returns where the rest of the line starts.  Names are read with this
        library's escapes (``\\\\``, ``\\'``, ``\\n``, ``\\r``).
        """
        match = _SERIAL.match(body)
        if match:
            line.serial = _integer(match.group(), "serial number", line.number, line.shown)
            position = match.end()
            if position < len(body) and body[position] not in " #":
                raise line.error("expected a space after the serial number")
        else:
            position = 0
        quoted = []
        for _ in range(1 if match else 2):
            start = len(body) - len(body[position:].lstrip(" "))  # rust_circuit allows several spaces
            if body[start : start + 1] != "'":
                break
            found = _NAME.match(body, start)
            if not found:
                raise line.error("unterminated quoted name (a quote inside a name is written \\')")
            quoted.append(self._unescape(found.group(1), line.number, line.shown))
            position = found.end()
            if position < len(body) and body[position] not in " #":
                raise line.error("expected a space after the name")
        self._take_names(line, quoted)
        return position

    def _rust_reference(self, line: _Line, body: str, strict: ParseError) -> int:
        """``_reference`` by rust_circuit's name regex, for names ours refuses (``'\\\\'\\\\'``).

        rust_circuit lets a quote after a backslash end a name or belong to
        it, whichever lets the rest of the line read.  The names found are
        unescaped as ours are, left to right (which gives rust_circuit's
        names on the texts it writes); if that fails too, ``strict`` stands.
        """
        match = _RUST_HEAD.match(body)
        if match is None or match.group(1) is not None and match.group(3) is None:
            raise strict
        try:
            quoted = [
                self._unescape(text, line.number, line.shown)
                for text in match.group(2, 3)
                if text is not None
            ]
        except ParseError:
            raise strict from None
        if match.group(1) is not None:
            line.serial = _integer(match.group(1), "serial number", line.number, line.shown)
        self._take_names(line, quoted)
        return match.end()

    @staticmethod
    def _take_names(line: _Line, quoted: list[str]) -> None:
        if line.serial is None and not quoted:
            raise line.error("expected a reference: a serial number, a 'quoted name', or both")
        if len(quoted) == 2:
            line.serial, line.name = quoted  # rust_circuit's quoted identifier, then the name
        elif quoted:
            line.name = quoted[0]

    def _rest(self, line: _Line, rest: str) -> None:
        """Read ``[shape] Variant extra`` (what follows the reference) into the line."""
        if not rest.startswith(" "):
            raise line.error(f"expected a space before {rest!r}")
        rest = rest.lstrip(" ")
        match = _SHAPE.match(rest)
        if match:
            line.shape = self._shape(match.group(1), line)
            rest = rest[match.end() :].lstrip(" ")
        match = _VARIANT.match(rest)
        if not match or match.end() < len(rest) and rest[match.end()] != " ":
            if rest.startswith("!"):
                raise _child_info_error(line)
            word = rest.split(" ", 1)[0]
            hint = (
                f"; a name is quoted ({word!r}): rust_circuit's unquoted repeat {line.serial} {word} "
                "(printed with on_repeat_check_info_same=False) is not read"
                if isinstance(line.serial, int)
                and line.shape is None
                and word.replace(".", "_").isidentifier()
                else ""
            )
            raise line.error(f"expected a variant name (Array, Einsum, ...) but found {rest!r}{hint}")
        line.kind = match.group()
        line.extra = rest[match.end() :].strip(" ")
        self._check_variant(line)

    def _mark_only_child(self, number: int, spaces: int, shown: str) -> None:
        if self.marker is not None:
            raise ParseError(
                f"two only-child markers in a row (lines {self.marker[0]} and {number}); "
                "expected the child's line after the first",
                number,
                shown,
            )
        self.marker = (number, spaces, shown)

    def _check_variant(self, line: _Line) -> None:
        kind = line.kind
        if kind in _UNSUPPORTED_KINDS:
            raise line.error(f"rust_circuit's {kind} is not supported: this library has no such node")
        if kind in _BUILDERS and (line.shape is not None or kind not in _SHAPED_KINDS):
            return
        if self._restates(line):  # a repeat restating its info: checked against its definition
            return
        if kind not in _BUILDERS:
            raise line.error(f"unknown variant {kind!r}; expected one of {', '.join(_BUILDERS)}")
        raise line.error(f"{kind} needs its shape, e.g. [300,256], before the variant")

    def _restates(self, line: _Line) -> bool:
        """Whether a line with a variant names an identifier defined earlier (see ``_open``)."""
        return (line.serial if line.serial is not None else line.name) in self.by_serial

    @staticmethod
    def _unescape(escaped: str, number: int, raw: str) -> str:
        def replace(match: re.Match) -> str:
            try:
                return _ESCAPES[match.group(1)]
            except KeyError:
                if not match.group(1):
                    raise ParseError(
                        "a name ends in a lone backslash (write \\\\\\\\)", number, raw
                    ) from None
                raise ParseError(
                    f"unknown escape \\{match.group(1)} in a name (only \\\\, \\', \\n and \\r)", number, raw
                ) from None

        return _ESCAPE.sub(replace, escaped)

    @staticmethod
    def _shape(text: str, line: _Line) -> tuple[int, ...]:
        """A shape as rust_circuit reads it: ``[5, 3]``, ``[large:3, small:1]`` (names dropped), ``[1_000]``."""
        if not text.strip():
            return ()
        parts = [part.strip() for part in text.split(",")]
        if len(parts) > 1 and not parts[-1]:
            parts.pop()  # a trailing comma, as rust_circuit allows
        raw = _shown_line(line.spaces, line.body)
        sizes = []
        for part in parts:
            size = part
            if ":" in part:  # a named axis: this library's nodes have no axis names, so it is dropped
                label, _, size = part.partition(":")
                size = size.strip()
                if ":" in size or not _AXIS_LABEL.fullmatch(label.strip()):
                    raise line.error(
                        f"malformed named axis {part!r} in [{text}]: expected name:size, e.g. large:3"
                    )
            if _SYMBOLIC_SIZE.fullmatch(size.replace(" ", "")):
                raise line.error(
                    f"symbolic size {part!r} in [{text}] is not supported: sizes must be integers"
                )
            if not _SIZE_PRODUCT.fullmatch(size):
                raise line.error(f"malformed shape [{text}]: expected comma-separated sizes like [300,256]")
            value = 1
            for factor in size.split("*"):  # checked as it grows: a long product stays cheap
                value *= _integer(factor.strip().replace("_", ""), "size", line.number, raw)
                value = _integer(str(value), "size", line.number, raw)
            sizes.append(value)
        return tuple(sizes)

    # ------------------------------------------------------------ nodes

    def _close_to(self, depth: int) -> None:
        """Finish every pending node at ``depth`` or deeper: its children are complete."""
        pending, prototypes, by_name = self.pending, self.prototypes, self.by_name
        while pending and pending[-1].depth >= depth:
            line = pending.pop()
            children = line.children
            key = (line.kind, line.extra, line.shape, tuple([child.shape for child in children]))
            prototype = prototypes.get(key)
            if prototype is None:
                node = self._build(line, key)
            else:
                node = rebuilt_like(prototype, tuple(children), line.name)
            line.node = node
            name = node.name
            if name is not None:
                known = by_name.setdefault(name, node)
                if known is not node and known.hash != node.hash:
                    self.name_hashes.setdefault(name, {known.hash}).add(node.hash)
            self._attach(node)

    def _attach(self, node: Circuit) -> None:
        if self.pending:
            self.pending[-1].children.append(node)
        else:
            self.roots.append(node)

    def _build(self, line: _Line, key: tuple) -> Circuit:
        """The node of a line whose children are complete, by its variant's builder.

        ``key`` says what the builder reads of the line and its children:
        variant, extra, printed shape and the children's shapes.  The node is
        kept as the prototype of its key, so that a later line of the same key
        gets its class, fields and derivation over its own children
        (``nodes.rebuilt_like``): the node the builder would make, without
        checking and deriving it all again.
        """
        builder = self.builders[line.kind]
        try:
            node = builder(line, self.store)
        except (CircuitError, ValueError, TypeError, IndexError, OverflowError) as error:
            if "!" in line.extra:  # what failed is rust_circuit's child info, not the extra
                raise _child_info_error(line) from None
            if isinstance(error, ParseError):
                raise
            if isinstance(error, CircuitError):
                raise line.error(str(error)) from error
            raise line.error(f"cannot build {line.kind} from {line.extra!r}: {error}") from error
        if line.shape is not None and tuple(node.shape) != line.shape:
            raise line.error(
                f"the line says shape {list(line.shape)} but the {line.kind} computes "
                f"{list(node.shape)} from its children"
            )
        if line.children and keeps_derivation(node):
            self.prototypes[key] = node
        return node

    def _resolve(self, line: _Line) -> Circuit:
        """The node a repeat line names; it must have been written before.

        A quoted name alone is looked up among the reference circuits, then
        the quoted identifiers, then the names (rust_circuit's order).
        """
        if line.serial is not None:
            first = self.by_serial.get(line.serial)
            if first is None:
                raise line.error(f"repeat of {_ident_text(line.serial)}, which no earlier line defines")
            try:
                found = first.node
            except AttributeError:  # not built yet: the line is still open
                raise line.error(
                    f"repeat of {_ident_text(line.serial)}, whose line {first.number} is an enclosing node "
                    "(a circuit cannot contain itself)"
                ) from None
            if line.name is not None and found.name != line.name:
                raise line.error(f"{_ident_text(line.serial)} is {found.describe()}, not {line.name!r}")
            if self.autoname_lines and line.number in self.autoname_lines:
                return self._restated(line, first)
            return found
        if self.quoted_idents:
            reference = self.references.get(line.name)
            if reference is not None:
                if line.number in self.autoname_lines:
                    raise self._more_on_reference(line, line.name)
                return reference
            first = self.by_serial.get(line.name)
            if first is not None:
                line.serial, line.name = line.name, None
                return self._restated(line, first)
        found = self.by_name.get(line.name)
        if found is None:
            enclosing = any(p.name == line.name for p in self.pending)
            why = (
                "an enclosing node (a circuit cannot contain itself)"
                if enclosing
                else "defined by no earlier line"
            )
            raise line.error(f"repeat of {line.name!r}, which is {why}")
        if line.name in self.name_hashes:
            raise line.error(
                f"repeat of {line.name!r} is ambiguous: {len(self.name_hashes[line.name])} distinct nodes "
                "carry that name; refer to one by its serial number"
            )
        return found

    def _is_reference(self, line: _Line) -> bool:
        """Whether a repeat line is a reference circuit's."""
        return line.serial is None and line.name in self.references


def _base_indent(text: str) -> int:
    """The indent of the first node line: depth 0.

    Text pasted from an indented Python string is indented as a whole; only
    the indent beyond the first line's says the depth.
    """
    return next((spaces for _, spaces, body in _lines(text) if body.strip() and body[0] != "#"), 0)


def _check_dedent(number: int, spaces: int, body: str, base: int) -> None:
    """Refuse a line indented less than the first node line (blank and comment lines aside)."""
    if spaces < base and body.strip() and body[0] != "#":
        raise ParseError(
            f"indented by {spaces} spaces, less than the {base} of the block's first line; "
            "a block is indented as a whole",
            number,
            _shown_line(spaces, body),
        )


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
_NO_CEILING = 1 << 62  # no line's depth: the line before opens a node


def _integer(digits: str, what: str, number: int, raw: str) -> int:
    """A size or serial number; refused past int64 (Python would build a 5,000-digit int)."""
    if len(digits) > _MAX_DIGITS or int(digits) >= 2**63:
        raise ParseError(f"{what} {shown(digits, 30)} is too large (at most 2**63 - 1)", number, raw)
    return int(digits)


def _ident_text(serial: int | str) -> str:
    """A line's identifier as messages say it."""
    return f"serial number {serial}" if isinstance(serial, int) else f"identifier {serial!r}"


def _child_info_error(line: _Line) -> ParseError:
    return line.error(
        "'!' child info (rust_circuit's '! 'symbol'' after a line) is for the inputs of a Module only, "
        "and modules are not supported"
    )


def _references(references: Mapping[str, Circuit] | Iterable[Circuit] | None) -> dict[str, Circuit]:
    """rust_circuit's reference circuits as a dict name -> circuit: given by name, or named circuits."""
    if references is None:
        return {}
    if isinstance(references, Mapping):
        pairs = list(references.items())
    elif isinstance(references, (str, Circuit)) or not isinstance(references, Iterable):
        raise ParseError(
            "reference_circuits must be a mapping name -> circuit or an iterable of named circuits, "
            f"not {type(references).__name__}"
        )
    else:
        pairs = [(getattr(circuit, "name", None), circuit) for circuit in references]
    by_name: dict[str, Circuit] = {}
    for name, circuit in pairs:
        if not isinstance(circuit, Circuit):
            raise ParseError(f"reference circuit {name!r} is a {type(circuit).__name__}, not a Circuit")
        if not isinstance(name, str):
            raise ParseError(
                f"reference circuit {circuit.describe()} needs a str name to be referred to by, got {name!r}"
            )
        if name in by_name:
            raise ParseError(f"reference_circuits names {name!r} twice")
        by_name[name] = circuit
    return by_name


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
    if not line.extra:
        raise line.error(
            "this Array has no hash (rust_circuit writes a bare Array for a random one): parse with "
            "tensors_as_random=True to read it as a random array of its shape, or write its hash or rand"
        )
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
    """``Array rand`` (and every Array under ``tensors_as_random``, bare ``Array`` too): seeded normals.

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
    if line.extra and line.extra != _RANDOM and not _HEX.fullmatch(line.extra):
        raise line.error(f"Array needs a {PRINTED_HEX_DIGITS}-hex content hash or rand, found {line.extra!r}")
    if math.prod(line.shape) > _MAX_RANDOM_ELEMENTS:
        raise line.error(
            f"a random Array of shape {list(line.shape)} has more than {_MAX_RANDOM_ELEMENTS} elements "
            "(4 GiB of float32): refused rather than filling memory"
        )
    generator = torch.Generator().manual_seed((_line_seed(line) & (2**64 - 1)) >> 1)  # its first 8 bytes
    return Array(torch.randn(line.shape, generator=generator), name=line.name)


def _line_seed(line: _Line) -> int:
    """128 bits of the SHA-256 of a line's serial number, name, shape and extra: what ``rand`` draws from."""
    seed_text = f"{line.serial}|{line.name!r}|{list(line.shape)}|{line.extra}"
    return int.from_bytes(hashlib.sha256(seed_text.encode()).digest()[:16], "little")


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
    """``Symbol``, ``Symbol <uuid>`` or ``Symbol rand`` (a uuid drawn from the line, see ``_line_seed``)."""
    _no_children(line)
    uuid = line.extra or None
    if uuid == _RANDOM:
        uuid = UUID(bytes=_line_seed(line).to_bytes(16, "little"), version=4)
    return Symbol(line.shape, name=line.name, uuid=uuid)


def _build_tag(line: _Line, store: TensorStore | None) -> Circuit:
    if len(line.children) != 1:
        raise line.error(f"Tag takes one child, found {len(line.children)}")
    if not line.extra:
        raise line.error(
            "Tag needs its uuid after the variant, e.g. Tag 1a280c74-fa9f-4dd9-94f4-5cca4a0cf243"
        )
    return Tag(line.children[0], line.extra, name=line.name)


def _build_scatter(line: _Line, store: TensorStore | None) -> Circuit:
    if len(line.children) != 1:
        raise line.error(f"Scatter takes one child, found {len(line.children)}")
    return Scatter(line.children[0], _parse_index(line, store), line.shape, name=line.name)


def _build_einsum(line: _Line, store: TensorStore | None) -> Circuit:
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


def _build_discrete_var(line: _Line, store: TensorStore | None) -> Circuit:
    _no_extra(line)
    if len(line.children) != 2:
        raise line.error(
            f"DiscreteVar takes two children (values, probs_and_group), found {len(line.children)}"
        )
    return DiscreteVar(line.children[0], line.children[1], name=line.name)


def _build_stored_cumulant_var(line: _Line, store: TensorStore | None) -> Circuit:
    """``StoredCumulantVar 1, 2|<uuid>``: the orders of the children, in their order, then the uuid."""
    orders_text, bar, uuid = line.extra.partition("|")
    if not bar or "|" in uuid:
        raise line.error(
            f"StoredCumulantVar needs its orders and uuid as '1, 2|<uuid>' after the variant, found {line.extra!r}"
        )
    orders = [part.strip() for part in orders_text.split(",")]
    if not all(part.isdigit() for part in orders):
        raise line.error(f"StoredCumulantVar orders {orders_text!r} are not ints separated by commas")
    orders = [int(part) for part in orders]
    if len(set(orders)) != len(orders):
        raise line.error(f"StoredCumulantVar orders {orders_text!r} repeat an order")
    if len(orders) != len(line.children):
        raise line.error(
            f"StoredCumulantVar lists {len(orders)} orders but has {len(line.children)} children"
        )
    return StoredCumulantVar(dict(zip(orders, line.children)), uuid.strip(), name=line.name)


def _build_cumulant(line: _Line, store: TensorStore | None) -> Circuit:
    _no_extra(line)
    return Cumulant(*line.children, name=line.name)


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
    "Tag": _build_tag,
    "Scatter": _build_scatter,
    "DiscreteVar": _build_discrete_var,
    "StoredCumulantVar": _build_stored_cumulant_var,
    "Cumulant": _build_cumulant,
}
