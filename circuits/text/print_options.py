"""``PrintOptions``: every option of the FORMAT.md printer, in one frozen object.

rust_circuit prints with one ``PrintOptions`` object (``c.print(options)``,
``options.evolve(...)``); so does this library.  The options are defined
here only: ``Circuit.repr``/``print`` and ``repr_many`` take an options object
and keywords, each keyword a field of this class that overrides the
object's (``c.repr(options, depth=3)``).  Every field is checked when an
options object is made, so a bad option is a ``PrintError`` naming the
field before anything is printed.

Where rust_circuit's option has another name, this library's keyword is kept
(it came first here): ``serials`` is ``force_use_serial_numbers``,
``comment`` its ``commenters``, ``color`` its ``colorer``, ``store`` its
``tensor_save_dir``; ``arrows``, ``only_child_below``, ``comment_arg_names`` and
``traversal`` have rust_circuit's names and meaning.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Iterable, Protocol, Sequence

import attrs

from circuits.core.nodes import Circuit
from circuits.errors import MatcherError, PrintError, shown
from circuits.rewriting.matching import as_iterative
from circuits.text.store import TensorStore

NodeText = Callable[[Circuit], "str | None"]


class Traversal(Protocol):
    """What ``traversal=`` needs: how far below each node the printout goes.

    ``start`` is the state at each root; ``child_states(node, state)`` gives
    one state per child of ``node`` (reached in ``state``).  The printer
    writes a node's children only if the node's state and at least one
    child's state are truthy; a child whose state is falsy is still written,
    with its own children left out (``... N children not shown``), as
    rust_circuit's printer does.
    """

    @property
    def start(self) -> Any: ...

    def child_states(self, node: Circuit, state: Any) -> Sequence[Any]: ...


def as_traversal(form: Any) -> Traversal:
    """``form`` if it is a ``Traversal``, else the ``IterativeMatcher`` of a matcher form."""
    if hasattr(form, "child_states") and hasattr(form, "start"):
        return form
    return as_iterative(form)


def _traversal(form: Any) -> Traversal | None:
    """The ``traversal`` field's converter: None, or any matcher form as a ``Traversal`` (a form
    that is none is a ``MatcherError`` naming the option)."""
    if form is None:
        return None
    try:
        return as_traversal(form)
    except MatcherError as error:  # still a MatcherError (what it is), now naming the option
        raise MatcherError(f"PrintOptions: traversal={shown(repr(form), 80)}: {error}") from error


def _flag(options: PrintOptions, attribute: attrs.Attribute, value: Any) -> None:
    """A bool option (``1`` or ``"yes"`` would pass a truth test)."""
    if not isinstance(value, bool):
        raise PrintError(
            f"PrintOptions: {attribute.name}={shown(repr(value), 80)}; expected True or False", attribute.name
        )


def _depth(options: PrintOptions, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise PrintError(
            f"PrintOptions: depth={shown(repr(value), 80)}; expected None or an int >= 0 (0: the roots only)",
            "depth",
        )


def _store(options: PrintOptions, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, TensorStore):
        raise PrintError(
            f"PrintOptions: store= takes a cc.TensorStore (or None), got {type(value).__name__}", "store"
        )


def _function(options: PrintOptions, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not callable(value):
        raise PrintError(
            f"PrintOptions: {attribute.name}= takes a function of a node (or None), "
            f"got {type(value).__name__} {shown(repr(value), 80)}",
            attribute.name,
        )


@attrs.frozen(kw_only=True, init=False, repr=False)
class PrintOptions:
    """How ``Circuit.repr``, ``Circuit.print`` and ``repr_many`` write circuits.

    ``depth``: stop below that depth, writing ``...`` where children were left
    out (such text is for reading, not parsing).  ``shapes``: write every
    node's shape.  ``serials``: give every node a serial number
    (rust_circuit's ``force_use_serial_numbers``).  ``store``: save the
    tensor of every array written to that ``TensorStore``.

    ``traversal`` (an ``IterativeMatcher`` or any matcher form, kept as the
    ``Traversal`` it becomes) stops the printout where the traversal stops,
    as ``depth`` does; with both, either one stops it.  ``comment(node)``
    returns text written after the node's line as ``  # text`` (None or ""
    for none; line breaks in it are written as escapes such as ``\\n``),
    once per node, on the line where the node is written in full.
    ``color(node)`` returns a colour name of ``ANSI_COLORS`` or None; every
    line of the node, repeats included, is wrapped in that ANSI colour.  The
    parser skips comments and colour codes, so annotated text reads back.
    ``costs=True`` comments each node with its own static cost (so not with
    ``comment`` too).

    rust_circuit's layouts, whose text the parser reads back:
    ``minimal_shapes`` leaves out every shape the parser can work out (see
    ``printing.shape_needed``; not with ``shapes``), going further than
    rust_circuit's ``shape_only_when_necessary``, which is the default here;
    ``only_child_below`` writes a node's only child at the node's own indent
    after a ``▼`` line; ``arrows`` draws the tree in the indent (``├‣``,
    ``└‣``, ``│``); ``comment_arg_names`` comments each operand line of an
    Einsum with its axes (``  # ab``) before any ``comment`` text.
    """

    depth: int | None = attrs.field(default=None, validator=_depth)
    shapes: bool = attrs.field(default=False, validator=_flag)
    serials: bool = attrs.field(default=False, validator=_flag)
    store: TensorStore | None = attrs.field(default=None, validator=_store)
    traversal: Traversal | None = attrs.field(default=None, converter=_traversal)
    comment: NodeText | None = attrs.field(default=None, validator=_function)
    color: NodeText | None = attrs.field(default=None, validator=_function)
    costs: bool = attrs.field(default=False, validator=_flag)
    minimal_shapes: bool = attrs.field(default=False, validator=_flag)
    only_child_below: bool = attrs.field(default=False, validator=_flag)
    arrows: bool = attrs.field(default=False, validator=_flag)
    comment_arg_names: bool = attrs.field(default=False, validator=_flag)

    def __init__(self, **fields: Any) -> None:
        _check_fields(fields, "PrintOptions")  # an unknown keyword is a PrintError, not a TypeError
        self.__attrs_init__(**fields)

    def __attrs_post_init__(self) -> None:
        if self.shapes and self.minimal_shapes:
            raise PrintError(
                "PrintOptions: shapes=True writes every shape and minimal_shapes=True as few as parse back; "
                "pass one",
                "minimal_shapes",
            )
        if self.costs and self.comment is not None:
            raise PrintError(
                "PrintOptions: costs=True writes the comments; pass comment= or costs=, not both", "costs"
            )

    def evolve(self, **changes: Any) -> PrintOptions:
        """These options with some fields changed (checked as a new object is)."""
        _check_fields(changes, "PrintOptions.evolve")
        return attrs.evolve(self, **changes) if changes else self

    @classmethod
    def resolve(cls, options: PrintOptions | None, overrides: dict[str, Any], where: str) -> PrintOptions:
        """``options`` (None: the defaults) with the keyword ``overrides`` applied: what a print
        call prints with.  Anything but a PrintOptions as ``options`` is a PrintError."""
        if options is None:
            options = _DEFAULT
        elif not isinstance(options, cls):
            raise PrintError(
                f"{where}: options (the first argument) must be a cc.PrintOptions or None, got "
                f"{type(options).__name__} {shown(repr(options), 80)}; keywords go as keywords "
                f"(c.repr(depth=2)) or in one (c.repr(cc.PrintOptions(depth=2)))",
                "options",
            )
        _check_fields(overrides, where)
        return attrs.evolve(options, **overrides) if overrides else options

    def __repr__(self) -> str:
        """The fields set, as a call would set them: ``PrintOptions(depth=2)``."""
        return "PrintOptions(" + ", ".join(f"{k}={v!r}" for k, v in self.changed().items()) + ")"

    def changed(self) -> dict[str, Any]:
        """The fields set to other than their defaults, by name."""
        return {
            field.name: getattr(self, field.name)
            for field in FIELDS
            if getattr(self, field.name) is not getattr(_DEFAULT, field.name)
        }

    def repr(self, *circuits: Circuit) -> str:
        """``circuits`` written together with these options (rust_circuit's ``options.repr(*circuits)``)."""
        from circuits.text.printing import repr_many

        return repr_many(circuits, self)

    def print(self, *circuits: Circuit) -> None:
        """Print ``self.repr(*circuits)``."""
        print(self.repr(*circuits))


FIELDS: tuple[attrs.Attribute, ...] = attrs.fields(PrintOptions)
FIELD_NAMES: tuple[str, ...] = tuple(field.name for field in FIELDS)
_FIELD_PARAMETERS = [
    inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
    for f in FIELDS
]
#: ``help(PrintOptions)`` and ``inspect.signature`` show every field with its default.
PrintOptions.__signature__ = inspect.Signature(_FIELD_PARAMETERS)  # type: ignore[attr-defined]


def spells_out_print_options(function: Callable, fields: Iterable[str] = FIELD_NAMES) -> Callable:
    """``function`` (taking ``**overrides``, the print options) shown by ``help()`` and
    ``inspect.signature`` with each of ``fields`` as a keyword-only parameter instead, with its
    default: the signature says what the keywords are, though they are defined here only."""
    signature = inspect.signature(function)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    function.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=own + [p for p in _FIELD_PARAMETERS if p.name in fields]
    )
    return function


def _check_fields(names: Iterable[str], where: str) -> None:
    """A PrintError naming the first keyword that is not a PrintOptions field (with the closest)."""
    for name in names:
        if name not in FIELD_NAMES:
            close = difflib.get_close_matches(name, FIELD_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PrintError(
                f"{where}: unknown print option {shown(repr(name), 80)}{hint}; the options: "
                + ", ".join(FIELD_NAMES),
                name,
            )


_DEFAULT = PrintOptions()

# Circuit's print methods forward to repr_many; the core layer cannot import this one, so their
# signatures are spelled out here, where the fields are.
spells_out_print_options(Circuit.repr)
spells_out_print_options(Circuit.print)
