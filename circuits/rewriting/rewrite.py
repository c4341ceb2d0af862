"""Rewriting circuits: ``update``, ``replace``, ``substitute``.

Every rewrite returns a new circuit and leaves its input untouched (nodes
are immutable).  A node is rebuilt only when one of its children changed,
so every unchanged subtree of the result is the very same Python object as
in the input, and a shared subtree that is rewritten is rewritten once and
stays shared.  All walks are iterative (any depth) and linear in the size
of the circuit: one pass finds the matches, and only their ancestors are
rebuilt.

Semantics of ``update`` (the same as rust_circuit's ``update``):

- *Which* nodes match is decided on the input circuit.
- Rewriting is bottom-up: ``fn`` is called on a matched node after every
  matched node below it was rewritten, so it receives the node with its
  children already updated (``fn(node.with_children(updated children))``),
  and its parents are rebuilt over what it returns.  A node matched inside
  the subtree of another matched node is therefore rewritten first, and
  the outer node's ``fn`` sees that result.
- What ``fn`` returns is final: it is not searched again.
- ``fn`` is called once per distinct node it is given, however many
  parents or paths share it.

With an ``IterativeMatcher`` (see ``circuits.rewriting.matching``) a node is
rewritten only where it is reached along a path that finds it.  A node
shared by several paths is then un-shared: its ancestors along the finding
paths are rebuilt over the rewritten copy, while along every other path it
stays the original object.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from circuits.errors import NoMatchError, RewriteError
from circuits.core.gcpause import gc_paused
from circuits.rewriting.matching import Matcher, WalkEntry, as_iterative, no_match_hint, validate, walk
from circuits.core.nodes import Array, Circuit, Index, Symbol, check_node
from circuits.core.traversal import unique_nodes

__all__ = ["cast_circuit", "rebuild", "replace", "substitute", "update"]


def update(
    circuit: Circuit,
    matcher: Any,
    fn: Callable[[Circuit], Circuit],
    *,
    assert_any_found: bool = True,
    fancy_validate: bool = False,
) -> Circuit:
    """``circuit`` with every node that ``matcher`` finds replaced by ``fn(node)``.

    ``matcher`` is any matcher form or an IterativeMatcher; see the module
    docstring for the order in which ``fn`` is applied.  A matcher that finds
    nothing is a ``NoMatchError`` naming names that come close (a typo must not
    look like "no effect"); ``assert_any_found=False`` says that finding nothing
    is fine (rust_circuit's keyword, whose default there is False).  With
    ``fancy_validate=True``, every part of the matcher must find something
    (``circuits.rewriting.matching.validate_found``).
    """
    _check_root(circuit, "update")
    if not callable(fn):
        raise RewriteError(f"update: fn must be callable (node -> node), got {type(fn).__name__} {fn!r}")
    if fancy_validate:
        validate(circuit, matcher, what="update")

    done: dict[bytes, Circuit] = {}  # fn is called once per distinct node it is given

    def on_found(node: Circuit) -> Circuit:
        new = done.get(node.hash)
        if new is None:
            new = check_node(fn(node), f"update: fn returned {{got}} for {node.describe()}", RewriteError)
            done[node.hash] = new
        return new

    iterative = as_iterative(matcher)
    with gc_paused():
        if iterative.is_plain:
            result = _rewrite_plain(circuit, iterative.plain_matcher, on_found, descend_found=True)
        else:
            result = rebuild(walk(circuit, iterative, descend_found=True), on_found, circuit)
    if assert_any_found and not done:
        shown = iterative.plain_matcher if iterative.is_plain else iterative
        raise NoMatchError(
            f"update({shown!r}): no node found in {circuit.describe()}{no_match_hint(circuit, matcher)}; "
            "pass assert_any_found=False where finding nothing is fine"
        )
    return result


def replace(
    circuit: Circuit, mapping: Mapping[Circuit, Circuit], *, assert_all_found: bool = True
) -> Circuit:
    """``circuit`` with every node equal to a key of ``mapping`` replaced by its value.

    Keys are nodes, compared by structure (names included).  A replaced
    node is replaced whole: nothing below it is searched, and the value is
    used as given.  A key that is not replaced (not in ``circuit``, or below
    another key, which is replaced whole) is a ``NoMatchError`` saying which;
    ``assert_all_found=False`` says that is fine.
    """
    _check_root(circuit, "replace")
    try:
        items = list(mapping.items())
    except AttributeError:
        raise RewriteError(
            f"replace: expected a mapping {{old node: new node}}, got {type(mapping).__name__}"
        ) from None
    by_hash: dict[bytes, Circuit] = {}
    for old, new in items:
        check_node(old, f"replace: key {old!r}", RewriteError, hint="use update for matchers and names")
        by_hash[old.hash] = check_node(new, f"replace: the replacement for {old.describe()}", RewriteError)
    if not by_hash:
        return circuit
    matcher = Matcher.from_predicate(
        lambda node: node.hash in by_hash, f"Matcher(replace keys: {len(by_hash)})"
    )
    replaced: set[bytes] = set()

    def on_found(node: Circuit) -> Circuit:
        replaced.add(node.hash)
        return by_hash[node.hash]

    with gc_paused():
        result = _rewrite_plain(circuit, matcher, on_found, descend_found=False)
    if assert_all_found and len(replaced) < len(by_hash):
        _refuse_unreplaced(circuit, [old for old, _ in items if old.hash not in replaced])
    return result


def _refuse_unreplaced(circuit: Circuit, keys: list[Circuit]) -> None:
    """The ``NoMatchError`` for ``replace`` keys that replaced nothing, saying why for each."""
    present = {node.hash for node in unique_nodes([circuit])}
    reasons = []
    for key in keys[:_SHOWN_KEYS]:
        where = f"{key.describe()} {list(key.shape)}"
        if key.hash in present:
            reasons.append(f"{where} is below another key, which is replaced whole")
        else:
            reasons.append(f"{where} is not in {circuit.describe()}{no_match_hint(circuit, key)}")
    more = f" (and {len(keys) - _SHOWN_KEYS} more)" if len(keys) > _SHOWN_KEYS else ""
    raise NoMatchError(
        f"replace: {len(keys)} key(s) replaced nothing{more}: "
        + "; ".join(reasons)
        + "; pass assert_all_found=False where that is fine",
        keys=keys,
    )


_SHOWN_KEYS = 5


def substitute(circuit: Circuit, bindings: Mapping[Any, Any]) -> Circuit:
    """``circuit`` with Symbols replaced by nodes: ``substitute(c, {"toks": toks_array})``.

    A key is a Symbol node or a name (every Symbol of that name); a value is
    a node, or a tensor (wrapped as an Array named like the Symbol).  The
    value must have the Symbol's shape exactly: to add batch axes, use
    ``circuits.expand``.  A key that names no Symbol of ``circuit`` is an
    error, so a typo does not silently leave an input unbound.
    """
    _check_root(circuit, "substitute")
    symbols = [node for node in unique_nodes([circuit]) if isinstance(node, Symbol)]
    mapping: dict[Circuit, Circuit] = {}
    for key, value in bindings.items():
        if isinstance(key, Symbol):
            targets = [s for s in symbols if s == key]
            what = f"{key.describe()} {list(key.shape)}"
        elif isinstance(key, str):
            targets = [s for s in symbols if s.name == key]
            what = f"Symbol {key!r}"
        else:
            raise RewriteError(f"substitute: key {key!r} is neither a Symbol node nor a name")
        if not targets:
            present = sorted({f"{s.name!r} {list(s.shape)}" for s in symbols})
            raise RewriteError(
                f"substitute: {what} is not in {circuit.describe()}; its Symbols are: "
                + (", ".join(present[:20]) if present else "none")
            )
        for symbol in targets:
            new = value
            if isinstance(value, torch.Tensor):
                new = Array(value, name=symbol.name)
            check_node(
                new,
                f"substitute: the value for {symbol.describe()}",
                RewriteError,
                hint="give a node or a tensor",
            )
            if new.shape != symbol.shape:
                raise RewriteError(
                    f"substitute: {symbol.describe()} has shape {list(symbol.shape)} but "
                    f"{new.describe()} has shape {list(new.shape)}; a substitute must have the same "
                    "shape (use circuits.expand to add leading batch axes)"
                )
            mapping[symbol] = new
    return replace(circuit, mapping)


def cast_circuit(
    circuit: Circuit, device_dtype: Any = None, *, device: Any = None, dtype: Any = None
) -> Circuit:
    """rust_circuit's ``cast_circuit``: ``circuit`` with its tensors on ``device`` and its
    floating Arrays in ``dtype`` (each None: left as it is).

    ``device_dtype`` is anything with ``.device`` and ``.dtype`` (rust_circuit's
    ``TorchDeviceDtypeOp``), or give ``device=`` / ``dtype=``.  As in ``evaluate``, ``dtype``
    must be a floating dtype and applies to floating tensors only: integer tensors (token ids,
    an Index's tensor index) keep their dtype and only move.  Arrays that already fit are kept
    as they are (the same objects); an Array whose values were not loaded cannot be cast.
    """
    _check_root(circuit, "cast_circuit")
    if device_dtype is not None:
        if device is not None or dtype is not None:
            raise RewriteError("cast_circuit: give device_dtype or device=/dtype=, not both")
        device, dtype = getattr(device_dtype, "device", None), getattr(device_dtype, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise RewriteError(f"cast_circuit: dtype {dtype!r} is not a floating torch dtype")
    try:
        device = None if device is None else torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise RewriteError(f"cast_circuit: device {device!r} is not a torch device ({error})") from None

    def moved(tensor: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and tensor.dtype.is_floating_point else tensor.dtype
        return tensor.to(device=device if device is not None else tensor.device, dtype=cast)

    def cast(node: Circuit) -> Circuit:
        if isinstance(node, Array):
            if node.value is None:
                raise RewriteError(
                    f"cast_circuit: {node.describe()} has no tensor to cast (it was parsed without one)"
                )
            new = moved(node.tensor())
            return node if new is node.value else Array(new, name=node.name)
        items = tuple(moved(item) if isinstance(item, torch.Tensor) else item for item in node.index)
        same = all(a is b for a, b in zip(items, node.index))
        return node if same else Index(node.children[0], items, name=node.name)

    return update(circuit, Matcher.types(Array, Index), cast, assert_any_found=False)


# ---------------------------------------------------------------- internals


def _check_root(circuit: Any, what: str) -> None:
    check_node(circuit, f"{what}: the circuit", RewriteError)


def rebuild(entries: list[WalkEntry], on_found: Callable[[Circuit], Circuit], root: Circuit) -> Circuit:
    """The rewritten root of a walk (``circuits.rewriting.matching.walk``).

    For each entry in post-order: the node rebuilt over its children's
    results (itself when none changed), then ``on_found`` applied if it was
    found (to the node as is, when the walk did not descend).  Results equal
    to the input node count as unchanged, and equal results are interned,
    so sharing is kept wherever the structure allows it.
    """
    results: dict[Any, Circuit | None] = {}  # key -> new node, or None if unchanged
    interned: dict[bytes, Circuit] = {}
    for entry in entries:
        node = entry.node
        child_keys = entry.child_keys
        new = node
        if child_keys is not None:
            new_children = None
            for position, child_key in enumerate(child_keys):
                if child_key is None:
                    continue
                result = results[child_key]
                if result is not None:
                    if new_children is None:
                        new_children = list(node.children)
                    new_children[position] = result
            if new_children is not None:
                new = node.with_children(new_children)
        if entry.found:
            new = on_found(new)
        if new is node or new.hash == node.hash:
            results[entry.key] = None
        else:
            results[entry.key] = interned.setdefault(new.hash, new)
    if not entries:
        return root
    result = results[entries[-1].key]
    return root if result is None else result


_PENDING = object()


def _rewrite_plain(
    root: Circuit, matcher: Matcher, on_found: Callable[[Circuit], Circuit], descend_found: bool
) -> Circuit:
    """``rebuild(walk(root, matcher))`` fused into one post-order pass, for plain matchers.

    Each distinct node (by hash) is visited once; ``results`` maps its hash
    to the rewritten node, or None when it is unchanged.
    """
    predicate = matcher.predicate
    results: dict[bytes, Any] = {}
    interned: dict[bytes, Circuit] = {}
    stack: list[tuple[Circuit, bool]] = [(root, False)]
    pop, push = stack.pop, stack.append
    while stack:
        node, expanded = pop()
        key = node.hash
        if not expanded:
            if key in results:
                continue
            if not descend_found and predicate(node):
                new = on_found(node)
            else:
                results[key] = _PENDING
                push((node, True))
                for child in reversed(node.children):
                    if child.hash not in results:
                        push((child, False))
                continue
        else:
            children = node.children
            new_children = None
            for position, child in enumerate(children):
                result = results[child.hash]
                if result is not None:
                    if new_children is None:
                        new_children = list(children)
                    new_children[position] = result
            new = node if new_children is None else node.with_children(new_children)
            if descend_found and predicate(node):
                new = on_found(new)
        if new is node or new.hash == key:
            results[key] = None
        else:
            results[key] = interned.setdefault(new.hash, new)
    result = results[root.hash]
    return root if result is None else result
