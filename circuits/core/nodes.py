"""The circuit node classes.

Every node is a frozen attrs class.  Its ``shape``, its printed ``extra``
(the text after the variant in FORMAT.md) and its structural ``hash`` are
computed once, at construction, from the node's own fields and its
children's hashes; so equality and hashing are O(1) and never walk the
tree, however deep.
"""

from __future__ import annotations

import copy
import operator
import re
import uuid as uuid_module
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import attrs
import einops
import numpy as np
import torch

from circuits.core import shapes as shape_rules
from circuits.errors import (
    CircuitError,
    ConcatError,
    EinsumError,
    FunctionSpecError,
    LeafError,
    MissingTensorError,
    NodeTypeError,
    IndexSpecError,
    RandomVariableError,
    RearrangeError,
    StaleTensorError,
    TagError,
    shown,
)
from circuits.core.functions import FunctionSpec, get_function
from circuits.core.hashing import PRINTED_HEX_DIGITS, node_hash, tensor_content_hash

if TYPE_CHECKING:  # only annotations here
    from circuits.evaluation.costs import CircuitCost
    from circuits.text.print_options import PrintOptions

Shape = shape_rules.Shape
_HASH_HEX = re.compile(r"[0-9a-f]{%d,}" % PRINTED_HEX_DIGITS)


def check_node(value: Any, what: str, error: type[CircuitError] = NodeTypeError, hint: str = "") -> Circuit:
    """``value`` if it is a circuit node, else ``error``: ``"{what} is a Tensor, not a circuit node"``.

    ``what`` names the value where it is used (``"save: root 1"``); where the
    type reads better inside the sentence, ``what`` holds ``{got}`` in its
    place (``"update: fn returned {got} for Array 'x'"``).  ``hint``, if
    given, follows in parentheses.
    """
    if isinstance(value, Circuit):
        return value
    got = f"a {type(value).__name__}"
    message = what.replace("{got}", got) if "{got}" in what else f"{what} is {got}"
    raise error(f"{message}, not a circuit node" + (f" ({hint})" if hint else ""))


def _check_name(instance, attribute, value):
    if value is not None and not isinstance(value, str):
        raise NodeTypeError(
            f"{type(instance).__name__} name must be a str or None, got {type(value).__name__} {value!r}"
        )


def _check_children(instance, attribute, value):
    for position, child in enumerate(value):
        if not isinstance(child, Circuit):  # checked first: the message is built only when it is needed
            check_node(
                child, f"{shape_rules.describe(type(instance).__name__, instance.name)}: child {position}"
            )


def _check_shape(shape: Any, where: str) -> Shape:
    if type(shape) is tuple and all(type(size) is int and 0 <= size < 2**63 for size in shape):
        return shape  # the common case, checked in one pass
    try:
        if isinstance(shape, str) or any(isinstance(size, bool) for size in shape):
            raise TypeError
        result = tuple(operator.index(size) for size in shape)  # 2.5 is refused, not truncated
    except (TypeError, ValueError):
        raise LeafError(f"{where}: shape {shown(repr(shape))} is not a sequence of ints") from None
    if any(size < 0 for size in result):
        raise LeafError(f"{where}: shape {shown(str(list(result)))} has a negative size")
    if any(size >= 2**63 for size in result):
        raise LeafError(f"{where}: shape {shown(str(list(result)))} has a size past int64, torch's limit")
    return result


@attrs.frozen(init=False, eq=False, repr=False)
class Circuit:
    """Base of every node: a name, children, and derived shape and hash.

    Every node is built by its class's constructor, which normalizes the
    arguments and ends in attrs' ``__attrs_init__``: the validators run, then
    ``__attrs_post_init__`` sets every derived (``init=False``) field.
    ``evolve`` and ``with_children`` build through the constructor too.

    Subclasses implement ``_derive()``, returning ``(shape, extra)``: the
    output shape after checking the node's fields against its children, and
    the EXTRA text the printer writes for it.  ``_derive`` may read the
    children's shapes and nothing else of them, which is what lets
    ``with_children`` keep its result over children of the same shapes.
    """

    children: tuple[Circuit, ...] = attrs.field(validator=_check_children)
    name: str | None = attrs.field(validator=_check_name)
    shape: Shape = attrs.field(init=False)
    extra: str = attrs.field(init=False)
    hash: bytes = attrs.field(init=False)

    def __attrs_post_init__(self):
        self._set_derived(*self._derive())

    def _derive(self) -> tuple[Shape, str]:
        raise NotImplementedError

    def _set_derived(self, shape: Shape, extra: str) -> None:
        """Set every derived field, given ``_derive``'s result (a subclass with more sets them here)."""
        _set_shape(self, shape)
        _set_extra(self, extra)
        _set_hash(self, node_hash(self.kind, self.name, shape, extra, self.children))

    # ------------------------------------------------------------ identity

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Circuit):
            return NotImplemented
        return self.hash == other.hash

    def __hash__(self) -> int:
        return int.from_bytes(self.hash[:8], "little")

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__name__  # the variant printed in FORMAT.md; a class attribute, read often

    @property
    def rank(self) -> int:
        return len(self.shape)

    def describe(self) -> str:
        """How messages name this node: ``Einsum 'a.q'`` or ``unnamed Einsum``."""
        return shape_rules.describe(self.kind, self.name)

    def __repr__(self) -> str:
        return f"<{self.describe()} {shape_rules.format_shape(self.shape)}>"

    # ------------------------------------------------------------- rebuild

    def evolve(self, **changes: Any) -> Circuit:
        """A new node of the same class with some fields changed, built by the class's constructor.

        So an evolved node, and every node a rewrite rebuilds, passes exactly
        the checks of a node built by hand, and has every derived field
        computed afresh.  (A class whose constructor takes other arguments
        than its parent's overrides ``_from_fields``.)
        """
        fields = {name: getattr(self, name) for name in _init_fields(type(self))}
        unknown = set(changes) - set(fields)
        if unknown:
            raise NodeTypeError(
                f"{self.describe()}: evolve got {sorted(unknown)}, which are not fields of "
                f"{type(self).__name__} (its fields: {sorted(fields)})"
            )
        fields.update(changes)
        return type(self)._from_fields(fields, self)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Circuit | None) -> Circuit:
        """A node of this class from its init fields: a call of ``cls(...)``, its constructor.

        ``old`` is the node being evolved, or None when unpickling.
        """
        raise NotImplementedError

    def __reduce__(self):
        """Pickle and deepcopy as a flat list of nodes, so that any depth works (no recursion)."""
        return _unflatten, (_flatten(self),)

    def __deepcopy__(self, memo: dict) -> Circuit:
        records = _flatten(self)
        for cls, fields, _ in records:
            value = fields.get("value")
            if isinstance(value, torch.Tensor) and value.requires_grad and not value.is_leaf:
                raise LeafError(
                    f"{shape_rules.describe(cls.kind, fields['name'])}: its tensor is inside an autograd graph "
                    "(a view of a parameter, as attach=True makes), which torch cannot deep-copy; deep-copy "
                    "a circuit built without attach=True"
                )
        return _unflatten(copy.deepcopy(records, memo))

    def rename(self, name: str | None) -> Circuit:
        return self if name == self.name else self.evolve(name=name)

    def with_children(self, children: Sequence[Circuit]) -> Circuit:
        """This node over new ``children`` (itself if they are the same objects): the one way to
        replace children, which every rewrite uses.

        The new node is built as ``evolve(children=...)`` builds it, with one
        shortcut for the classes of this module: when every new child has the
        shape of the one it replaces, ``_derive``'s result (a function of the
        node's own fields and its children's shapes) is kept, and only the
        derived fields are set again (``_set_derived``, the structural hash
        among them).  A rewrite deep in a big circuit so rebuilds its many
        ancestors without re-deriving them.
        """
        children = tuple(children)
        old_children = self.children
        if len(children) == len(old_children):
            keep_derived = type(self) in _KEEP_DERIVED_CLASSES
            changed = False
            for new, old in zip(children, old_children):
                if new is not old:
                    changed = True
                    if not isinstance(new, Circuit) or new.shape != old.shape:
                        keep_derived = False
                        break
            if not changed:
                return self
            if keep_derived:
                return rebuilt_like(self, children, self.name)
        try:
            return self.evolve(children=children)
        except Exception as error:
            error.add_note(_rebuilding_note(self, children))
            raise

    # ------------------------------------------------------------- text

    def repr(self, options: PrintOptions | None = None, /, **overrides: Any) -> str:
        """This circuit in the FORMAT.md text (``circuits.text.printing.repr_many``).

        ``options`` is a ``cc.PrintOptions`` (None: the defaults); keywords are its fields
        and override the object's: ``c.repr(depth=2)``, ``c.repr(options, depth=3)``.
        """
        from circuits.text.printing import repr_many

        return repr_many([self], options, **overrides)

    def print(self, options: PrintOptions | None = None, /, **overrides: Any) -> None:
        """Print ``repr`` (the same options)."""
        print(self.repr(options, **overrides))

    def cost(self) -> CircuitCost:
        """The static cost of evaluating this circuit: FLOPs, bytes, peak memory
        (``circuits.evaluation.costs.cost``)."""
        from circuits.evaluation.costs import cost

        return cost(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython: the FORMAT.md text (see ``circuits.text.html.pretty_text`` for the depth rule)."""
        from circuits.text.html import pretty_text

        printer.text(pretty_text(self))

    def _repr_html_(self) -> str:
        """Jupyter: collapsible HTML (see ``circuits.text.html.to_html``)."""
        from circuits.text.html import to_html

        return to_html(self)

    # ------------------------------------------------- evaluate and rewrite
    # Thin delegations so notebooks can write ``c.evaluate()``, ``c.get(...)``;
    # the work lives in its own module.

    def evaluate(
        self,
        inputs: Mapping[Circuit | str, Any] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """This circuit's value as a torch.Tensor (see ``circuits.evaluation.evaluate``)."""
        from circuits.evaluation import evaluate

        return evaluate(self, inputs=inputs, device=device, dtype=dtype)

    def get(self, matcher: Any, *, fancy_validate: bool = False) -> set[Circuit]:
        """Every distinct node matching ``matcher`` (see ``circuits.rewriting.matching``)."""
        from circuits.rewriting.matching import get

        return get(self, matcher, fancy_validate=fancy_validate)

    def get_unique(self, matcher: Any, *, fancy_validate: bool = False) -> Circuit:
        """The one node matching ``matcher``; zero or several is an error."""
        from circuits.rewriting.matching import get_unique

        return get_unique(self, matcher, fancy_validate=fancy_validate)

    def are_any_found(self, matcher: Any) -> bool:
        from circuits.rewriting.matching import are_any_found

        return are_any_found(self, matcher)

    def update(
        self,
        matcher: Any,
        fn: Callable[[Circuit], Circuit],
        *,
        assert_any_found: bool = True,
        fancy_validate: bool = False,
    ) -> Circuit:
        """Every matching node replaced by ``fn(node)`` (see ``circuits.rewriting.rewrite.update``); a
        matcher that finds nothing is an error unless ``assert_any_found=False``."""
        from circuits.rewriting.rewrite import update

        return update(self, matcher, fn, assert_any_found=assert_any_found, fancy_validate=fancy_validate)

    def replace(self, mapping: Any, *, assert_all_found: bool = True) -> Circuit:
        """Nodes replaced by ``mapping[node]`` (see ``circuits.rewriting.rewrite.replace``); a key that
        replaces nothing is an error unless ``assert_all_found=False``."""
        from circuits.rewriting.rewrite import replace

        return replace(self, mapping, assert_all_found=assert_all_found)


# Setting a frozen node's field through its slot's bound __set__ takes two thirds of the time of
# object.__setattr__ (which looks the slot up each time); construction and rebuilt_like set so.
_set_children, _set_name, _set_shape, _set_extra, _set_hash = (
    getattr(Circuit, field).__set__ for field in ("children", "name", "shape", "extra", "hash")
)


def _shapes_of(nodes: Sequence[Any]) -> list:
    """Children shapes for an error message (a non-node shows its type)."""
    return [list(n.shape) if isinstance(n, Circuit) else type(n).__name__ for n in nodes]


def _rebuilding_note(node: Circuit, children: tuple) -> str:
    """What ``with_children`` was doing when the constructor refused the new children."""
    changed = [
        f"child {i}: {old.describe()} {list(old.shape)} -> "
        + (f"{new.describe()} {list(new.shape)}" if isinstance(new, Circuit) else type(new).__name__)
        for i, (old, new) in enumerate(zip(node.children, children))
        if new is not old
    ]
    return f"while rebuilding {node.describe()} over new children ({'; '.join(changed)})"


def _init_fields(cls: type) -> tuple[str, ...]:
    """The fields a node of ``cls`` is made of (``children`` first); the rest are derived from them."""
    names = _INIT_FIELDS.get(cls)
    if names is None:
        names = _INIT_FIELDS[cls] = tuple(f.name for f in attrs.fields(cls) if f.init)
    return names


def _own_fields(cls: type) -> tuple[str, ...]:
    """``_init_fields`` but ``children``: what a node of ``cls`` holds of its own."""
    return _init_fields(cls)[1:]


_INIT_FIELDS: dict[type, tuple[str, ...]] = {}


def keeps_derivation(node: Circuit) -> bool:
    """Whether ``rebuilt_like(node, ...)`` may stand for ``node``'s constructor (its class's
    ``_derive`` reads nothing of the children but their shapes)."""
    return type(node) in _KEEP_DERIVED_CLASSES


def rebuilt_like(prototype: Circuit, children: tuple[Circuit, ...], name: str | None) -> Circuit:
    """The node ``type(prototype)``'s constructor builds from ``prototype``'s fields with
    ``children`` and ``name`` in place of its own, without deriving it again.

    Only for a prototype that ``keeps_derivation`` and ``children`` of the
    shapes of its own (the caller's promise): then ``_derive`` would return
    what it returned for the prototype, so only the hash is computed anew.
    ``with_children`` and the parser, which meets many lines alike, build so.
    (``Circuit._set_derived``'s work is done here: no class that keeps
    derivations overrides it.)
    """
    cls = type(prototype)
    node = object.__new__(cls)
    try:
        copied = _COPIED_FIELDS[cls]
    except KeyError:
        copied = _COPIED_FIELDS[cls] = tuple(
            (field, getattr(cls, field).__set__) for field in _own_fields(cls) if field != "name"
        )
    for field, set_field in copied:
        set_field(node, getattr(prototype, field))
    shape, extra = prototype.shape, prototype.extra
    _set_children(node, children)
    _set_name(node, name)
    _set_shape(node, shape)
    _set_extra(node, extra)
    _set_hash(node, node_hash(cls.kind, name, shape, extra, children))
    return node


# rebuilt_like's fields of each class, name aside, with their slots' setters
_COPIED_FIELDS: dict[type, tuple[tuple[str, Callable[[Any, Any], None]], ...]] = {}


def _no_children(cls: type, fields: Mapping[str, Any]) -> None:
    if fields["children"]:
        raise LeafError(
            f"{shape_rules.describe(cls.kind, fields['name'])} is a leaf: it takes no children, "
            f"got {len(fields['children'])}"
        )


def _one_child(cls: type, fields: Mapping[str, Any], error: type[CircuitError]) -> Circuit:
    children = fields["children"]
    if len(children) != 1:
        raise error(
            f"{shape_rules.describe(cls.kind, fields['name'])}: a {cls.kind} has exactly one child, "
            f"got {len(children)}"
        )
    return children[0]


@attrs.frozen(init=False, eq=False, repr=False)
class Array(Circuit):
    """A tensor leaf.  Its identity is its content hash, not the tensor object.

    ``value`` is None for an array parsed without its tensor at hand: it still
    knows its shape and hash, prints identically, and raises
    ``MissingTensorError`` only when its value is asked for.

    The tensor is kept as given, not copied, so that gradients reach the
    caller's tensor.  Its version counter (``tensor._version``, which every
    in-place torch op bumps, optimizer steps included) is recorded, and every
    read of the value (evaluation, saving, ``tensor()``) checks it: a tensor
    edited in place after the Array was made raises ``StaleTensorError``
    rather than giving values that its hash and printed form do not
    describe.  Writes the counter cannot see (through ``.data`` or a numpy
    view) are the one way around this: do not use them on wrapped tensors.

    A tensor that requires grad is a variable, not only a value: two such
    tensors with equal contents are two nodes (their hashes differ), so each
    gets its own gradient, as torch's backward would give it.
    """

    value: torch.Tensor | None = attrs.field()
    content_hash: str = attrs.field()
    declared_shape: Shape = attrs.field()
    tensor_version: int | None = attrs.field(init=False)
    tensor_requires_grad: bool = attrs.field(init=False)

    def __init__(self, value: Any, name: str | None = None):
        where = shape_rules.describe("Array", name)
        value = _leaf_tensor(value, where)
        self.__attrs_init__(
            children=(),
            name=name,
            value=value,
            content_hash=tensor_content_hash(value),
            declared_shape=tuple(value.shape),
        )

    @classmethod
    def from_hash(cls, shape: Sequence[int], content_hash: str, name: str | None = None) -> Array:
        """An array known only by shape and (a prefix of) its content hash."""
        where = shape_rules.describe("Array", name)
        if not isinstance(content_hash, str) or not _HASH_HEX.fullmatch(content_hash):
            raise LeafError(
                f"{where}: content hash {content_hash!r} is not at least "
                f"{PRINTED_HEX_DIGITS} lowercase hex digits"
            )
        node = object.__new__(cls)
        node.__attrs_init__(
            children=(),
            name=name,
            value=None,
            content_hash=content_hash,
            declared_shape=_check_shape(shape, where),
        )
        return node

    def _set_derived(self, shape: Shape, extra: str) -> None:
        value = self.value
        object.__setattr__(self, "tensor_version", None if value is None else value._version)
        object.__setattr__(self, "tensor_requires_grad", value is not None and value.requires_grad)
        super()._set_derived(shape, extra)
        if self.tensor_requires_grad:  # a variable: told apart from an equal value by its tensor object
            identity = f"grad:{id(value)}"  # unique among live tensors, and this node keeps its tensor alive
            object.__setattr__(self, "hash", node_hash(self.kind, self.name, shape, extra, (), identity))

    def _derive(self):
        if self.children:
            raise LeafError(f"{self.describe()}: an Array has no children")
        if self.value is not None and tuple(self.value.shape) != self.declared_shape:
            raise LeafError(
                f"{self.describe()}: tensor shape {list(self.value.shape)} is not the declared "
                f"{list(self.declared_shape)}"
            )
        return self.declared_shape, self.content_hash[:PRINTED_HEX_DIGITS]

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Array | None) -> Array:
        _no_children(cls, fields)
        value, name = fields["value"], fields["name"]
        if value is None:
            return cls.from_hash(fields["declared_shape"], fields["content_hash"], name=name)
        if old is None:  # unpickled: the hash was computed from these very bytes
            return cls._of_known_hash(value, fields["content_hash"], name)
        if (fields["content_hash"], fields["declared_shape"]) != (old.content_hash, old.declared_shape):
            raise LeafError(
                f"{old.describe()}: content_hash and declared_shape follow from the tensor; give value= instead"
            )
        if value is old.value and old.is_fresh():
            return cls._of_known_hash(value, old.content_hash, name)  # a rename: nothing to rehash
        return cls(value, name=name)

    @classmethod
    def _of_known_hash(cls, value: torch.Tensor, content_hash: str, name: str | None) -> Array:
        """An Array of a tensor whose content hash is known (attrs' init: checked, derived fields set)."""
        node = object.__new__(cls)
        node.__attrs_init__(
            children=(), name=name, value=value, content_hash=content_hash, declared_shape=tuple(value.shape)
        )
        return node

    @property
    def is_loaded(self) -> bool:
        return self.value is not None

    def is_fresh(self) -> bool:
        """Whether the tensor is as it was when the Array was made (see the class docstring)."""
        value = self.value
        return value is None or (
            value._version == self.tensor_version and value.requires_grad == self.tensor_requires_grad
        )

    def check_fresh(self) -> None:
        """Raise ``StaleTensorError`` if the tensor was edited in place (or its requires_grad set) since."""
        if self.is_fresh():
            return
        value = self.value
        if value.requires_grad != self.tensor_requires_grad:
            change = f"its requires_grad was set to {value.requires_grad} after the Array was made"
        else:
            change = (
                f"it was modified in place after the Array was made (version {self.tensor_version}, "
                f"now {value._version})"
            )
        raise StaleTensorError(
            f"{self.describe()} {shape_rules.format_shape(self.shape)} with hash "
            f"{self.content_hash[:PRINTED_HEX_DIGITS]}: {change}, so its hash and printed form no longer "
            "describe its tensor; make a new Array from the tensor as it is now (or clone it before "
            "changing it)",
            node=self,
        )

    def tensor(self) -> torch.Tensor:
        """The tensor, or a clear error if it was never loaded or was modified in place since."""
        if self.value is None:
            raise MissingTensorError(
                f"{self.describe()} {shape_rules.format_shape(self.shape)} with hash "
                f"{self.content_hash[:PRINTED_HEX_DIGITS]} has no tensor: it was parsed "
                "without a tensor store holding it (pass store= to parse)",
                node=self,
            )
        self.check_fresh()
        return self.value


def _leaf_tensor(value: Any, where: str) -> torch.Tensor:
    """``value`` as a tensor an Array can hold (hash, print, save), or a LeafError saying why not."""
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except Exception as error:
            raise LeafError(
                f"{where}: value of type {type(value).__name__} is not a tensor ({error})"
            ) from error
    problem = None
    if value.is_meta:
        problem = "a meta tensor, which has a shape but no values"
    elif value.layout != torch.strided:
        problem = f"a {value.layout} tensor; give a dense one (tensor.to_dense())"
    elif value.is_quantized or value.is_nested:
        problem = "a quantized or nested tensor; give a plain dense one"
    elif value.is_conj() or value.is_neg():
        problem = "a lazy conjugate or negative view; give tensor.resolve_conj().resolve_neg()"
    if problem is not None:
        raise LeafError(f"{where}: the value is {problem}")
    if value.is_inference():
        # inference tensors have no version counter: a private copy cannot be edited behind our back
        with torch.inference_mode(False):
            value = value.clone()
    return value


def format_scalar(value: float) -> str:
    """Shortest decimal that reads back to the same float, never in exponent form."""
    return np.format_float_positional(np.float64(value), trim="-")


@attrs.frozen(init=False, eq=False, repr=False)
class Scalar(Circuit):
    """A constant of any shape: every element equals ``value``."""

    value: float = attrs.field()
    declared_shape: Shape = attrs.field()

    def __init__(self, value: float, shape: Sequence[int] = (), name: str | None = None):
        where = shape_rules.describe("Scalar", name)
        self.__attrs_init__(
            children=(),
            name=name,
            value=_scalar_value(value, where),
            declared_shape=_check_shape(shape, where),
        )

    def _derive(self):
        if self.children:
            raise LeafError(f"{self.describe()}: a Scalar has no children")
        return self.declared_shape, format_scalar(self.value)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Scalar | None) -> Scalar:
        _no_children(cls, fields)
        return cls(fields["value"], shape=fields["declared_shape"], name=fields["name"])


def _scalar_value(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.number))
        or isinstance(value, np.complexfloating)
    ):
        raise LeafError(f"{where}: value {shown(repr(value))} is not a real number")
    try:
        return float(value)
    except OverflowError:
        raise LeafError(f"{where}: value {shown(str(value), 60)} is too large for a float64") from None


@attrs.frozen(init=False, eq=False, repr=False)
class Symbol(Circuit):
    """An input placeholder: a shape, a name and an optional uuid, no value.

    Two Symbols with the same name, shape and uuid are the same input.  The
    uuid (rust_circuit's) tells apart inputs that share a name and shape;
    ``None`` (rust_circuit's nil uuid) is the default and prints nothing.
    """

    declared_shape: Shape = attrs.field()
    uuid: uuid_module.UUID | None = attrs.field()

    def __init__(self, shape: Sequence[int], name: str | None = None, *, uuid: Any = None):
        where = shape_rules.describe("Symbol", name)
        self.__attrs_init__(
            children=(),
            name=name,
            declared_shape=_check_shape(shape, where),
            uuid=_optional_uuid(uuid, where),
        )

    @classmethod
    def new_with_random_uuid(cls, shape: Sequence[int], name: str | None = None) -> Symbol:
        """A Symbol no other Symbol equals (rust_circuit's name)."""
        return cls(shape, name=name, uuid=uuid_module.uuid4())

    @classmethod
    def new_with_none_uuid(cls, shape: Sequence[int], name: str | None = None) -> Symbol:
        """A Symbol without a uuid, as ``Symbol(shape, name)`` makes (rust_circuit's name)."""
        return cls(shape, name=name)

    def _derive(self):
        if self.children:
            raise LeafError(f"{self.describe()}: a Symbol has no children")
        return self.declared_shape, "" if self.uuid is None else str(self.uuid)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Symbol | None) -> Symbol:
        _no_children(cls, fields)
        return cls(fields["declared_shape"], name=fields["name"], uuid=fields["uuid"])


def _uuid(value: Any, where: str, error: type[CircuitError]) -> uuid_module.UUID:
    """``value`` (a UUID or its text, any spelling ``uuid.UUID`` reads) as a UUID."""
    if isinstance(value, uuid_module.UUID):
        return value
    if not isinstance(value, str):
        raise error(f"{where}: uuid {shown(repr(value))} is a {type(value).__name__}, not a uuid.UUID or str")
    try:
        return uuid_module.UUID(value)
    except ValueError:
        raise error(
            f"{where}: uuid {shown(repr(value))} is not a uuid like 1a280c74-fa9f-4dd9-94f4-5cca4a0cf243"
        ) from None


def _optional_uuid(value: Any, where: str) -> uuid_module.UUID | None:
    """A Symbol's uuid: None for none, as for rust_circuit's nil uuid (both print nothing)."""
    if value is None:
        return None
    value = _uuid(value, where, LeafError)
    return None if value.int == 0 else value


@attrs.frozen(init=False, eq=False, repr=False)
class Einsum(Circuit):
    """Elementwise product over all axes, summed over axes not in the output.

    Axes are integers ``i`` in ``range(len(spec.EINSUM_LETTERS))``, printed as
    ``EINSUM_LETTERS[i]`` (a-z, A-Z: the letters torch.einsum accepts).  As in
    rust_circuit, a letter may repeat in the output (``ab->abaa``: the value
    on the diagonal, zero off it), and an Einsum of no operands is the
    empty product, the rank-0 constant 1 (printed ``->``, with no children).
    """

    operand_axes: tuple[tuple[int, ...], ...] = attrs.field()
    out_axes: tuple[int, ...] = attrs.field()

    def __init__(self, *args: tuple[Circuit, Sequence[int] | str], out_axes, name: str | None = None):
        where = shape_rules.describe("Einsum", name)
        nodes, axes = [], []
        for position, arg in enumerate(args):
            if not (isinstance(arg, tuple) and len(arg) == 2):
                raise EinsumError(f"{where}: operand {position} must be a (node, axes) pair, got {arg!r}")
            nodes.append(arg[0])
            axes.append(shape_rules.normalize_axes(arg[1], where))
        self.__attrs_init__(
            children=tuple(nodes),
            name=name,
            operand_axes=tuple(axes),
            out_axes=shape_rules.normalize_axes(out_axes, where),
        )

    @classmethod
    def from_einsum_string(cls, string: str, *nodes: Circuit, name: str | None = None) -> Einsum:
        """``Einsum.from_einsum_string("qc,kc,,qk->qk", q, k, scale, mask)``; ``...`` as torch.einsum
        reads it (``"...ij,...jk->...ik"``: broadcast batch axes, summed if the output has no ``...``)."""
        where = shape_rules.describe("Einsum", name)
        if not isinstance(string, str):
            raise EinsumError(
                f"{where}: einsum string {shown(repr(string))} is a {type(string).__name__}, not a str "
                "like 'ab,bc->ac'"
            )
        if "..." in string and string.count("->") == 1:  # torch.einsum's ellipsis, in letters
            shapes = [node.shape if isinstance(node, Circuit) else None for node in nodes]
            string = shape_rules.expand_ellipsis(string.replace(" ", ""), shapes, where)
        try:
            operands, out = shape_rules.parse_einsum_string(string.replace(" ", ""), where)
        except EinsumError as error:
            raise EinsumError(f"{error}; operand shapes {_shapes_of(nodes)}") from None
        if not nodes and operands == ((),):
            operands = ()  # "->" of no nodes: the empty product, as rust_circuit reads it
        if len(operands) != len(nodes):
            raise EinsumError(
                f"{where}: einsum string {string!r} has {len(operands)} operands but "
                f"{len(nodes)} nodes were given, with shapes {_shapes_of(nodes)}"
            )
        return cls(*zip(nodes, operands), out_axes=out, name=name)

    def _derive(self):
        where = self.describe()
        if len(self.operand_axes) != len(self.children):
            raise EinsumError(
                f"{where}: {len(self.operand_axes)} operand axes for {len(self.children)} children"
            )
        shape = shape_rules.einsum_shape(
            [c.shape for c in self.children], self.operand_axes, self.out_axes, where
        )
        return shape, self.einsum_string

    @classmethod
    def scalar_mul(
        cls, node: Circuit, scalar: float, name: str | None = None, scalar_name: str | None = None
    ) -> Einsum:
        """rust_circuit's ``Einsum.scalar_mul``: ``node`` times the number ``scalar``, as an Einsum
        of ``node`` and a rank-0 ``Scalar(scalar, name=scalar_name)`` over ``node``'s axes."""
        where = f"Einsum.scalar_mul({shape_rules.describe('Einsum', name)})"
        check_node(node, f"{where}: node")
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float, np.integer, np.floating)):
            raise EinsumError(f"{where}: scalar {shown(repr(scalar))} is not a real number")
        axes = tuple(range(node.rank))
        return cls((node, axes), (Scalar(scalar, name=scalar_name), ()), out_axes=axes, name=name)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Einsum | None) -> Einsum:
        children, axes = fields["children"], fields["operand_axes"]
        if len(children) != len(axes):
            raise EinsumError(
                f"{shape_rules.describe(cls.kind, fields['name'])}: {len(axes)} operand axes for "
                f"{len(children)} children"
            )
        return cls(*zip(children, axes), out_axes=fields["out_axes"], name=fields["name"])

    @property
    def einsum_string(self) -> str:
        return shape_rules.einsum_text(self.operand_axes, self.out_axes)

    @property
    def repeats_output_axes(self) -> bool:
        """Whether a letter appears twice in the output (``ab->abaa``): a diagonal embedding."""
        return len(set(self.out_axes)) != len(self.out_axes)


@attrs.frozen(init=False, eq=False, repr=False)
class Add(Circuit):
    """Sum of the children, broadcast as in numpy (right-aligned)."""

    def __init__(self, *nodes: Circuit, name: str | None = None):
        self.__attrs_init__(children=tuple(nodes), name=name)

    @classmethod
    def minus(cls, positive: Circuit, negative: Circuit, name: str | None = None) -> Add:
        """rust_circuit's ``Add.minus``: ``positive - negative``, as the Add of ``positive`` and
        ``Einsum.scalar_mul(negative, -1.0)`` (named ``'neg {name}'`` after ``negative``, its
        Scalar ``'neg_1'``, as rust_circuit names them)."""
        check_node(positive, f"Add.minus({shape_rules.describe('Add', name)}): positive")
        check_node(negative, f"Add.minus({shape_rules.describe('Add', name)}): negative")
        negated_name = None if negative.name is None else f"neg {negative.name}"
        return cls(positive, Einsum.scalar_mul(negative, -1.0, negated_name, "neg_1"), name=name)

    def _derive(self):
        return shape_rules.broadcast_shapes([c.shape for c in self.children], self.describe()), ""

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Add | None) -> Add:
        return cls(*fields["children"], name=fields["name"])


@attrs.frozen(init=False, eq=False, repr=False)
class GeneralFunction(Circuit):
    """A registered function of its children, printed by the function's name."""

    spec: FunctionSpec = attrs.field()

    def __init__(self, *nodes: Circuit, spec: FunctionSpec | str, name: str | None = None):
        if isinstance(spec, str):
            try:
                spec = get_function(spec)
            except FunctionSpecError as error:
                raise FunctionSpecError(
                    f"{shape_rules.describe('GeneralFunction', name)} of children shapes {_shapes_of(nodes)}: {error}"
                ) from None
        if not isinstance(spec, FunctionSpec):
            raise FunctionSpecError(
                f"{shape_rules.describe('GeneralFunction', name)}: spec {spec!r} is not a FunctionSpec"
            )
        self.__attrs_init__(children=tuple(nodes), name=name, spec=spec)

    @classmethod
    def new_by_name(cls, *nodes: Circuit, spec_name: str, name: str | None = None) -> GeneralFunction:
        return cls(*nodes, spec=spec_name, name=name)

    def _derive(self):
        where = f"{self.describe()} ({self.spec.name})"
        shapes = [c.shape for c in self.children]
        if len(shapes) != self.spec.num_inputs:
            raise FunctionSpecError(
                f"{where}: takes {self.spec.num_inputs} children, got {len(shapes)} "
                f"with shapes {[list(s) for s in shapes]}"
            )
        try:
            shape = _check_shape(self.spec.shape_fn(shapes), "shape")
        except Exception as error:  # noqa: BLE001 - a user's shape_fn may raise anything
            raise FunctionSpecError(
                f"{where}: children shapes {[list(s) for s in shapes]} do not fit: "
                f"{type(error).__name__}: {error}"
            ) from error
        return shape, self.spec.name

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: GeneralFunction | None) -> GeneralFunction:
        return cls(*fields["children"], spec=fields["spec"], name=fields["name"])


@attrs.frozen(init=False, eq=False, repr=False)
class Index(Circuit):
    """Per axis an int (drops the axis), a step-less slice, or a 1-D int tensor.

    The index is padded with full slices to the child's rank.
    """

    index: tuple = attrs.field()

    def __init__(self, node: Circuit, index: Any, name: str | None = None):
        where = shape_rules.describe("Index", name)
        items = shape_rules.normalize_index(index, check_node(node, f"{where}: child").shape, where)
        self.__attrs_init__(children=(node,), name=name, index=items)

    def _derive(self):
        if len(self.children) != 1:
            raise IndexSpecError(
                f"{self.describe()}: an Index has exactly one child, got {len(self.children)}"
            )
        child_shape = self.children[0].shape
        shape_rules.check_index(self.index, child_shape, self.describe())
        return shape_rules.index_shape(self.index, child_shape), shape_rules.format_index(self.index)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Index | None) -> Index:
        return cls(_one_child(cls, fields, IndexSpecError), fields["index"], name=fields["name"])

    @property
    def node(self) -> Circuit:
        return self.children[0]


def _normalize_pattern(pattern: str) -> str:
    spaced = pattern.replace("(", " ( ").replace(")", " ) ").replace("->", " -> ")
    return " ".join(spaced.split()).replace("( ", "(").replace(" )", ")")


@attrs.frozen(init=False, eq=False, repr=False)
class Rearrange(Circuit):
    """An einops rearrangement (``einops.repeat`` patterns, so new axes are allowed).

    Axis sizes given as keywords are kept and printed after the pattern
    (``a (b c) -> a b c, b=2``) so that the text reads back to the same node.
    An axis called ``name`` (or ``sizes``) is sized through ``sizes={...}``.
    """

    pattern: str = attrs.field()
    sizes: tuple[tuple[str, int], ...] = attrs.field()

    def __init__(
        self,
        node: Circuit,
        pattern: str,
        /,
        name: str | None = None,
        *,
        sizes: Mapping[str, int] | None = None,
        **axis_sizes: int,
    ):
        where = shape_rules.describe("Rearrange", name)
        if not isinstance(pattern, str):
            raise RearrangeError(f"{where}: pattern {pattern!r} is not a string")
        sizes = {**(sizes or {}), **axis_sizes}
        for axis, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise RearrangeError(f"{where}: size {axis}={size!r} is not a positive int")
        self.__attrs_init__(
            children=(node,),
            name=name,
            pattern=_normalize_pattern(pattern),
            sizes=tuple(sorted(sizes.items())),
        )

    def _derive(self):
        if len(self.children) != 1:
            raise RearrangeError(f"{self.describe()}: a Rearrange has exactly one child")
        child_shape = self.children[0].shape
        try:
            probe = torch.empty(child_shape, device="meta")
            shape = tuple(einops.repeat(probe, self.pattern, **dict(self.sizes)).shape)
        except (einops.EinopsError, RuntimeError, TypeError, ValueError, OverflowError) as error:
            reason = " ".join(str(error).split("Exception raised from")[0].split())  # no C++ trace
            raise RearrangeError(
                f"{self.describe()}: pattern {self.pattern!r} with sizes {dict(self.sizes)} does not "
                f"fit child shape {list(child_shape)}: {reason}"
            ) from None
        extra = self.pattern + "".join(f", {axis}={size}" for axis, size in self.sizes)
        return shape, extra

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Rearrange | None) -> Rearrange:
        child = _one_child(cls, fields, RearrangeError)
        return cls(child, fields["pattern"], name=fields["name"], sizes=dict(fields["sizes"]))

    @property
    def node(self) -> Circuit:
        return self.children[0]


@attrs.frozen(init=False, eq=False, repr=False)
class Concat(Circuit):
    """Children joined along ``axis``; every other axis must agree."""

    axis: int = attrs.field()

    def __init__(self, *nodes: Circuit, axis: int, name: str | None = None):
        where = shape_rules.describe("Concat", name)
        if not nodes:
            raise ConcatError(f"{where}: needs at least one child")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ConcatError(f"{where}: axis {axis!r} is not an int")
        for position, node in enumerate(nodes):
            check_node(node, f"{where}: child {position}")
        rank = len(nodes[0].shape)
        if not -rank <= axis < rank:
            raise ConcatError(
                f"{where}: axis {axis} is out of range for rank {rank} children "
                f"(shapes {[list(n.shape) for n in nodes]})"
            )
        self.__attrs_init__(children=tuple(nodes), name=name, axis=int(axis) % rank)

    def _derive(self):
        shapes = [c.shape for c in self.children]
        if not shapes:
            raise ConcatError(f"{self.describe()}: needs at least one child")
        first = shapes[0]
        if not 0 <= self.axis < len(first):
            raise ConcatError(
                f"{self.describe()}: axis {self.axis} is out of range for rank {len(first)} children "
                f"(shapes {[list(s) for s in shapes]})"
            )
        for position, shape in enumerate(shapes):
            others_match = len(shape) == len(first) and all(
                a == b for i, (a, b) in enumerate(zip(shape, first)) if i != self.axis
            )
            if not others_match:
                raise ConcatError(
                    f"{self.describe()}: child {position} has shape {list(shape)} but child 0 has "
                    f"{list(first)}; all axes but {self.axis} must agree "
                    f"(shapes {[list(s) for s in shapes]})"
                )
        total = sum(shape[self.axis] for shape in shapes)
        return first[: self.axis] + (total,) + first[self.axis + 1 :], str(self.axis)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Concat | None) -> Concat:
        return cls(*fields["children"], axis=fields["axis"], name=fields["name"])


@attrs.frozen(init=False, eq=False, repr=False)
class Tag(Circuit):
    """Its child's value, under a uuid: rust_circuit's Tag.

    The uuid is part of the node (printed, hashed), so two Tags of equal
    subtrees with different uuids are different nodes: that is how a
    structurally equal subtree is kept apart where it must be rewritten on
    its own (causal scrubbing's treeification).
    """

    uuid: uuid_module.UUID = attrs.field()

    def __init__(self, node: Circuit, uuid: Any, name: str | None = None):
        where = shape_rules.describe("Tag", name)
        self.__attrs_init__(children=(node,), name=name, uuid=_uuid(uuid, where, TagError))

    @classmethod
    def new_with_random_uuid(cls, node: Circuit, name: str | None = None) -> Tag:
        """A Tag no other Tag equals (rust_circuit's name)."""
        return cls(node, uuid_module.uuid4(), name=name)

    def _derive(self):
        if len(self.children) != 1:
            raise TagError(f"{self.describe()}: a Tag has exactly one child, got {len(self.children)}")
        return self.children[0].shape, str(self.uuid)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Tag | None) -> Tag:
        return cls(_one_child(cls, fields, TagError), fields["uuid"], name=fields["name"])

    @property
    def node(self) -> Circuit:
        return self.children[0]


@attrs.frozen(init=False, eq=False, repr=False)
class Scatter(Circuit):
    """Its child written into zeros of ``shape`` at a slice per axis: rust_circuit's Scatter.

    ``Scatter(x, index, shape)`` is ``out = zeros(shape); out[index] = x``,
    the inverse of an Index of those slices.  The index is slices only and
    is kept in rust_circuit's canonical form (``shapes.normalize_scatter_index``);
    the child's shape must be the shape the index selects.
    """

    index: tuple[slice, ...] = attrs.field()
    declared_shape: Shape = attrs.field()

    def __init__(self, node: Circuit, index: Any, shape: Sequence[int], name: str | None = None):
        where = shape_rules.describe("Scatter", name)
        shape = _check_shape(shape, where)
        items = shape_rules.normalize_scatter_index(index, shape, where)
        self.__attrs_init__(children=(node,), name=name, index=items, declared_shape=shape)

    def _derive(self):
        if len(self.children) != 1:
            raise IndexSpecError(
                f"{self.describe()}: a Scatter has exactly one child, got {len(self.children)}"
            )
        shape = self.declared_shape
        selected = shape_rules.index_shape(self.index, shape)
        child_shape = self.children[0].shape
        if len(self.index) != len(shape) or selected != child_shape:
            raise IndexSpecError(
                f"{self.describe()}: index {shape_rules.format_index(self.index)} of output shape "
                f"{list(shape)} selects shape {list(selected)}, but the child has shape {list(child_shape)}"
            )
        return shape, shape_rules.format_index(self.index)

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Scatter | None) -> Scatter:
        child = _one_child(cls, fields, IndexSpecError)
        return cls(child, fields["index"], fields["declared_shape"], name=fields["name"])

    @property
    def node(self) -> Circuit:
        return self.children[0]


@attrs.frozen(init=False, eq=False, repr=False)
class DiscreteVar(Circuit):
    """A random variable drawn from the rows of ``values``: rust_circuit's DiscreteVar.

    Row ``i`` of ``values`` (its first axis enumerates the samples) comes with
    probability ``probs_and_group[i]``; the variable has the shape of one row.
    rust_circuit samples it (Monte Carlo expectations); this library keeps it
    in the tree, printed, parsed and saved, but cannot evaluate it.  Without
    ``probs_and_group`` the samples are equally likely, under a fresh Tag (so
    two such variables are sampled independently), as in rust_circuit.
    """

    def __init__(self, values: Circuit, probs_and_group: Circuit | None = None, name: str | None = None):
        where = shape_rules.describe("DiscreteVar", name)
        check_node(values, f"{where}: values", RandomVariableError)
        if probs_and_group is None:
            if not values.shape:
                raise RandomVariableError(
                    f"{where}: values has shape [], but its first axis must count the samples"
                )
            probs_and_group = DiscreteVar.uniform_probs_and_group(values.shape[0])
        check_node(probs_and_group, f"{where}: probs_and_group", RandomVariableError)
        self.__attrs_init__(children=(values, probs_and_group), name=name)

    def _derive(self):
        if len(self.children) != 2:
            raise RandomVariableError(
                f"{self.describe()}: a DiscreteVar has two children (values, probs_and_group), "
                f"got {len(self.children)}"
            )
        values, probs = (child.shape for child in self.children)
        if len(probs) != 1:
            raise RandomVariableError(
                f"{self.describe()}: probs_and_group has shape {list(probs)}; it must be 1-d"
            )
        if not values:
            raise RandomVariableError(
                f"{self.describe()}: values has shape [], but its first axis must count the samples"
            )
        if values[0] != probs[0]:
            raise RandomVariableError(
                f"{self.describe()}: values has {values[0]} samples (shape {list(values)}) but "
                f"probs_and_group has {probs[0]} probabilities (shape {list(probs)})"
            )
        return values[1:], ""

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: DiscreteVar | None) -> DiscreteVar:
        children = fields["children"]
        if len(children) != 2:
            raise RandomVariableError(
                f"{shape_rules.describe(cls.kind, fields['name'])}: a DiscreteVar has two children "
                f"(values, probs_and_group), got {len(children)}"
            )
        return cls(children[0], children[1], name=fields["name"])

    @staticmethod
    def uniform_probs_and_group(size: int, name: str | None = None) -> Tag:
        """``size`` equal probabilities under a fresh Tag (named ``name``): a new group whose
        variables are sampled together, none equal to another group (rust_circuit's)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise RandomVariableError(
                f"DiscreteVar.uniform_probs_and_group: size must be an int >= 0, got {shown(repr(size))}"
            )
        return Tag.new_with_random_uuid(Scalar(1.0 / size if size else 0.0, (size,)), name=name)

    @property
    def values(self) -> Circuit:
        return self.children[0]

    @property
    def probs_and_group(self) -> Circuit:
        return self.children[1]


@attrs.frozen(init=False, eq=False, repr=False)
class StoredCumulantVar(Circuit):
    """A random variable known by its cumulants: rust_circuit's StoredCumulantVar.

    ``cumulants`` maps an order k (1 the mean, 2 the covariance: both required)
    to a node of the variable's shape repeated k times; the children are the
    cumulants by increasing order.  The uuid tells apart variables of equal
    cumulants (independent draws).  Printed ``1, 2|<uuid>``; not evaluable.
    """

    orders: tuple[int, ...] = attrs.field()
    uuid: uuid_module.UUID = attrs.field()

    def __init__(self, cumulants: Mapping[int, Circuit], uuid: Any = None, name: str | None = None):
        where = shape_rules.describe("StoredCumulantVar", name)
        if not isinstance(cumulants, Mapping):
            raise RandomVariableError(
                f"{where}: cumulants is a {type(cumulants).__name__}, not a mapping of order -> node"
            )
        for order in cumulants:
            if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 1:
                raise RandomVariableError(f"{where}: cumulant order {shown(repr(order))} is not an int >= 1")
        orders = tuple(sorted(int(order) for order in cumulants))
        children = tuple(
            check_node(cumulants[order], f"{where}: cumulant {order}", RandomVariableError)
            for order in orders
        )
        uuid = uuid_module.uuid4() if uuid is None else _uuid(uuid, where, RandomVariableError)
        self.__attrs_init__(children=children, name=name, orders=orders, uuid=uuid)

    @classmethod
    def new_mv(
        cls,
        mean: Circuit,
        variance: Circuit,
        higher_cumulants: Mapping[int, Circuit] | None = None,
        uuid: Any = None,
        name: str | None = None,
    ) -> StoredCumulantVar:
        """From the mean and variance, and any higher cumulants (rust_circuit's name)."""
        return cls({**(higher_cumulants or {}), 1: mean, 2: variance}, uuid=uuid, name=name)

    def _derive(self):
        if len(self.orders) != len(self.children) or 1 not in self.orders or 2 not in self.orders:
            raise RandomVariableError(
                f"{self.describe()}: needs the cumulants of orders 1 and 2 (mean, variance), one child "
                f"each; got orders {list(self.orders)} over {len(self.children)} children"
            )
        base = self.children[self.orders.index(1)].shape
        for order, child in zip(self.orders, self.children):
            if child.shape != base * order:
                raise RandomVariableError(
                    f"{self.describe()}: cumulant {order} has shape {list(child.shape)}, but the variable's "
                    f"shape {list(base)} repeated {order} times is {list(base * order)}"
                )
        return base, f"{', '.join(map(str, self.orders))}|{self.uuid}"

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: StoredCumulantVar | None) -> StoredCumulantVar:
        orders, children = fields["orders"], fields["children"]
        if len(orders) != len(children):
            raise RandomVariableError(
                f"{shape_rules.describe(cls.kind, fields['name'])}: {len(orders)} cumulant orders "
                f"{list(orders)} for {len(children)} children"
            )
        return cls(dict(zip(orders, children)), fields["uuid"], name=fields["name"])

    @property
    def cumulants(self) -> dict[int, Circuit]:
        return dict(zip(self.orders, self.children))


@attrs.frozen(init=False, eq=False, repr=False)
class Cumulant(Circuit):
    """The joint cumulant of its children: rust_circuit's Cumulant.

    Its shape is the children's shapes one after another (an outer-product
    layout: the covariance of x [3] and y [2] is [3, 2]).  rust_circuit
    expands it into expectations and samples; this library does not evaluate it.
    """

    def __init__(self, *nodes: Circuit, name: str | None = None):
        where = shape_rules.describe("Cumulant", name)
        for position, node in enumerate(nodes):
            check_node(node, f"{where}: child {position}", RandomVariableError)
        self.__attrs_init__(children=tuple(nodes), name=name)

    def _derive(self):
        return tuple(size for child in self.children for size in child.shape), ""

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], old: Cumulant | None) -> Cumulant:
        return cls(*fields["children"], name=fields["name"])

    @property
    def nodes(self) -> tuple[Circuit, ...]:
        return self.children

    @property
    def cumulant_number(self) -> int:
        return len(self.children)


# ------------------------------------------------------------ pickling


def _flatten(root: Circuit) -> list[tuple]:
    """Every distinct node below ``root``, children first: ``(class, fields, child positions)``."""
    position: dict[bytes, int] = {}
    records: list[tuple] = []
    stack: list[tuple[Circuit, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if node.hash in position:
            continue
        if not ready:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children) if child.hash not in position)
            continue
        cls = type(node)
        fields = {name: getattr(node, name) for name in _own_fields(cls)}
        position[node.hash] = len(records)
        records.append((cls, fields, tuple(position[child.hash] for child in node.children)))
    return records


def _unflatten(records: list[tuple]) -> Circuit:
    """The root that ``_flatten`` recorded, rebuilt bottom-up by the constructors (checked, derived anew)."""
    nodes: list[Circuit] = []
    for cls, fields, children in records:
        nodes.append(cls._from_fields({"children": tuple(nodes[i] for i in children), **fields}, None))
    return nodes[-1]


# The classes whose _derive with_children may keep over children of the same shapes.  A class
# defined elsewhere (a subclass, say) is always rebuilt by its constructor: it may derive more.
_KEEP_DERIVED_CLASSES = frozenset(
    {
        Einsum,
        Add,
        GeneralFunction,
        Index,
        Rearrange,
        Concat,
        Tag,
        Scatter,
        DiscreteVar,
        StoredCumulantVar,
        Cumulant,
    }
)
