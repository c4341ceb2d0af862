"""rust_circuit's operation objects: ``Getter``, ``Updater`` and ``Expander``.

Each holds settings (and, for an Updater or Expander, what to do with a
found node) and is called on a circuit and a matcher; ``bind(matcher)``
gives a ``BoundGetter`` or ``BoundUpdater`` called on a circuit alone.
They are thin: the work is ``circuits.rewriting.matching.get``,
``circuits.rewriting.rewrite.update`` and ``circuits.rewriting.batching.expand``.

Differences from rust_circuit (see docs/rewrites.md):

- ``assert_any_found`` defaults to True (rust_circuit: False), as
  ``update`` does here: a matcher that finds nothing is a ``NoMatchError``.
- ``fn`` is always called once per distinct node (rust_circuit's
  ``cache_transform`` / ``cache_update``, both True by default); False is
  refused rather than ignored.
- An ``Expander`` takes plain matchers only (``expand`` does not take
  IterativeMatchers) and no ``suffix``.
"""

from __future__ import annotations

from typing import Any, Callable

from circuits.rewriting.batching import expand
from circuits.errors import ExpandError, MatchError, NoMatchError, RewriteError
from circuits.rewriting.matching import (
    FoundRoutes,
    Matcher,
    as_iterative,
    get,
    get_all_paths,
    get_paths,
    get_unique,
    get_unique_op,
    no_match_hint,
    validate,
    walk,
)
from circuits.core.nodes import Circuit, check_node
from circuits.rewriting.rewrite import update

__all__ = ["BoundGetter", "BoundUpdater", "Expander", "Getter", "Updater"]


def _flag(value: Any, what: str, error: type = MatchError) -> bool:
    if not isinstance(value, bool):
        raise error(f"{what} {value!r} is not a bool")
    return value


def _or_default(value: bool | None, default: bool, what: str, error: type = MatchError) -> bool:
    return default if value is None else _flag(value, what, error)


class Getter:
    """rust_circuit's ``Getter``: ``getter(circuit, matcher)`` is ``get(circuit, matcher)``, with
    fancy validation when asked (``circuits.rewriting.matching.validate_found``)."""

    def __init__(self, default_fancy_validate: bool = False):
        self.default_fancy_validate = _flag(default_fancy_validate, "Getter: default_fancy_validate")

    def _validating(self, fancy_validate: bool | None) -> bool:
        return _or_default(fancy_validate, self.default_fancy_validate, "Getter: fancy_validate")

    def get(self, circuit: Circuit, matcher: Any, fancy_validate: bool | None = None) -> set[Circuit]:
        return get(circuit, matcher, fancy_validate=self._validating(fancy_validate))

    __call__ = get

    def get_unique_op(
        self, circuit: Circuit, matcher: Any, fancy_validate: bool | None = None
    ) -> Circuit | None:
        return get_unique_op(circuit, matcher, fancy_validate=self._validating(fancy_validate))

    def get_unique(self, circuit: Circuit, matcher: Any, fancy_validate: bool | None = None) -> Circuit:
        return get_unique(circuit, matcher, fancy_validate=self._validating(fancy_validate))

    def get_paths(self, circuit: Circuit, matcher: Any) -> FoundRoutes:
        return get_paths(circuit, matcher)

    def get_all_paths(self, circuit: Circuit, matcher: Any) -> FoundRoutes:
        return get_all_paths(circuit, matcher)

    def validate(self, circuit: Circuit, matcher: Any) -> None:
        validate(circuit, matcher, "Getter.validate")

    def bind(self, matcher: Any) -> BoundGetter:
        return BoundGetter(self, matcher)


class BoundGetter:
    """A ``Getter`` and a matcher: ``bound(circuit)`` is ``getter(circuit, matcher)``."""

    def __init__(self, getter: Getter, matcher: Any):
        if not isinstance(getter, Getter):
            raise MatchError(f"BoundGetter: getter {getter!r} is not a Getter")
        self.getter, self.matcher = getter, as_iterative(matcher)

    def get(self, circuit: Circuit, fancy_validate: bool | None = None) -> set[Circuit]:
        return self.getter.get(circuit, self.matcher, fancy_validate)

    __call__ = get

    def get_unique_op(self, circuit: Circuit, fancy_validate: bool | None = None) -> Circuit | None:
        return self.getter.get_unique_op(circuit, self.matcher, fancy_validate)

    def get_unique(self, circuit: Circuit, fancy_validate: bool | None = None) -> Circuit:
        return self.getter.get_unique(circuit, self.matcher, fancy_validate)

    def get_paths(self, circuit: Circuit) -> FoundRoutes:
        return get_paths(circuit, self.matcher)

    def get_all_paths(self, circuit: Circuit) -> FoundRoutes:
        return get_all_paths(circuit, self.matcher)

    def validate(self, circuit: Circuit) -> None:
        self.getter.validate(circuit, self.matcher)


class Updater:
    """rust_circuit's ``Updater``: ``updater(circuit, matcher)`` is
    ``update(circuit, matcher, transform)`` (``circuits.rewriting.rewrite.update``)."""

    def __init__(
        self,
        transform: Callable[[Circuit], Circuit],
        cache_transform: bool = True,
        cache_update: bool = True,
        default_fancy_validate: bool = False,
        default_assert_any_found: bool = True,
    ):
        if not callable(transform):
            raise RewriteError(f"Updater: transform {transform!r} is not callable (node -> node)")
        for what, value in (("cache_transform", cache_transform), ("cache_update", cache_update)):
            if _flag(value, f"Updater: {what}", RewriteError) is not True:
                raise RewriteError(
                    f"Updater: {what}=False is not supported: the transform is always called once per "
                    "distinct node, and a node's update is shared by every path that reaches it alike"
                )
        self.transform = transform
        self.cache_transform, self.cache_update = cache_transform, cache_update
        self.default_fancy_validate = _flag(
            default_fancy_validate, "Updater: default_fancy_validate", RewriteError
        )
        self.default_assert_any_found = _flag(
            default_assert_any_found, "Updater: default_assert_any_found", RewriteError
        )

    def update(
        self,
        circuit: Circuit,
        matcher: Any,
        fancy_validate: bool | None = None,
        assert_any_found: bool | None = None,
    ) -> Circuit:
        validating = _or_default(
            fancy_validate, self.default_fancy_validate, "Updater: fancy_validate", RewriteError
        )
        asserting = _or_default(
            assert_any_found, self.default_assert_any_found, "Updater: assert_any_found", RewriteError
        )
        return update(circuit, matcher, self.transform, assert_any_found=asserting, fancy_validate=validating)

    __call__ = update

    def bind(self, matcher: Any) -> BoundUpdater:
        return BoundUpdater(self, matcher)


class BoundUpdater:
    """An ``Updater`` and a matcher: ``bound(circuit)`` is ``updater(circuit, matcher)``."""

    def __init__(self, updater: Updater, matcher: Any):
        if not isinstance(updater, Updater):
            raise RewriteError(f"BoundUpdater: updater {updater!r} is not an Updater")
        self.updater, self.matcher = updater, as_iterative(matcher)

    def update(
        self, circuit: Circuit, fancy_validate: bool | None = None, assert_any_found: bool | None = None
    ) -> Circuit:
        return self.updater.update(circuit, self.matcher, fancy_validate, assert_any_found)

    __call__ = update


class Expander:
    """rust_circuit's ``Expander``: several replacements at once, each ``(matcher, transform)``,
    with every ancestor rebuilt to carry the batch axes a replacement adds
    (``circuits.rewriting.batching.expand``; the first pair whose matcher matches a node wins, and
    nothing below a replaced node is searched).

    ``ban_multiple_matches_on_node=True``: a node two matchers match is an ``ExpandError``.
    ``assert_any_found`` (default True here): a ``NoMatchError`` if no matcher matches a node.
    """

    def __init__(
        self,
        *expanders: tuple[Any, Any],
        ban_multiple_matches_on_node: bool = False,
        default_fancy_validate: bool = False,
        default_assert_any_found: bool = True,
        suffix: str | None = None,
    ):
        if suffix is not None:
            raise ExpandError(
                f"Expander: suffix={suffix!r} is not supported (rebuilt nodes keep their names); "
                "rename them afterwards with update"
            )
        pairs = []
        for position, pair in enumerate(expanders):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ExpandError(
                    f"Expander: expander {position} is {pair!r}, not a (matcher, transform) pair"
                )
            if not (isinstance(pair[1], Circuit) or callable(pair[1])):
                raise ExpandError(
                    f"Expander: the transform of expander {position} is not callable: {pair[1]!r}"
                )
            if not as_iterative(pair[0]).is_plain:
                raise ExpandError(
                    f"Expander: expander {position}'s matcher {pair[0]!r} restricts paths, which expand does "
                    "not support: expand the circuit, or un-share the node with update first"
                )
            pairs.append(pair)
        self.matchers = [as_iterative(matcher) for matcher, _ in pairs]
        self.replacements = [transform for _, transform in pairs]
        self.ban_multiple_matches_on_node = _flag(
            ban_multiple_matches_on_node, "Expander: ban_multiple_matches_on_node", ExpandError
        )
        self.default_fancy_validate = _flag(
            default_fancy_validate, "Expander: default_fancy_validate", ExpandError
        )
        self.default_assert_any_found = _flag(
            default_assert_any_found, "Expander: default_assert_any_found", ExpandError
        )
        self.suffix = None

    def batch(
        self, circuit: Circuit, fancy_validate: bool | None = None, assert_any_found: bool | None = None
    ) -> Circuit:
        check_node(circuit, "Expander: the circuit", ExpandError)
        if _or_default(fancy_validate, self.default_fancy_validate, "Expander: fancy_validate", ExpandError):
            for matcher in self.matchers:
                validate(circuit, matcher, "Expander")
        predicates = [m.plain_matcher.predicate for m in self.matchers]
        any_key = Matcher.from_predicate(lambda node: any(p(node) for p in predicates), "Expander matchers")
        found = [entry.node for entry in walk(circuit, any_key, descend_found=False) if entry.found]
        if not found and _or_default(
            assert_any_found, self.default_assert_any_found, "Expander: assert_any_found", ExpandError
        ):
            shown = ", ".join(repr(m) for m in self.matchers)
            hints = "".join(no_match_hint(circuit, m) for m in self.matchers)
            raise NoMatchError(
                f"Expander({shown}): no node found in {circuit.describe()}{hints}; "
                "pass assert_any_found=False where finding nothing is fine"
            )
        if self.ban_multiple_matches_on_node:
            self._refuse_multiple(found, predicates)
        return expand(circuit, {m.plain_matcher: r for m, r in zip(self.matchers, self.replacements)})

    __call__ = batch

    def _refuse_multiple(self, found: list[Circuit], predicates: list) -> None:
        for node in found:
            count = sum(bool(p(node)) for p in predicates)
            if count > 1:
                raise ExpandError(
                    f"Expander: {node.describe()} {list(node.shape)} is matched by {count} matchers "
                    "(ban_multiple_matches_on_node=True)"
                )
