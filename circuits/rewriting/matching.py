"""Finding nodes: ``Matcher`` says *what* a node is, ``IterativeMatcher`` *where*.

Matcher
-------
A ``Matcher`` is a predicate on one node.  Every function that takes a
matcher also takes the plain forms it is built from:

=====================  ==================================================
form                   matches
=====================  ==================================================
``"a.q"``              nodes named exactly ``a.q``
``Matcher.regex(p)``   named nodes whose name contains a match of regex
                       ``p`` (``re.search``; anchor with ``^``/``$``); a
                       compiled ``re.Pattern`` is taken as a regex too
``Regex(p)``           the same, read as rust_circuit reads it: ``.`` a
                       literal dot, ``\\.`` any character
``cc.Einsum``          nodes of that class (``isinstance``)
``callable``           nodes for which ``callable(node)`` is true
``{"a", "b"}``         any element (names, nodes, classes, ... mixed)
a node                 nodes structurally equal to it (names included)
``True`` / ``False``   every node / no node
a registered form      what it stands for (``circuits.rewriting.hints``:
                       the transformer layer's ``Point(kind, layer,
                       head)``, one layer's or head's activation)
=====================  ==================================================

and they combine with ``&``, ``|`` and ``~`` (``Matcher("a.q") | "a.k"``,
``cc.Einsum & ~Matcher.regex("^b0")``).

IterativeMatcher: matching restricted to paths
----------------------------------------------
A plain matcher finds a node wherever it is.  Experiments such as path
patching need "this node, but only as reached through that path": the
value input of one attention head, not its query or key input, although
all three reach the same ``'a1.norm'`` node.  An ``IterativeMatcher`` is a
chain of *stages*, each a matcher plus limits on where it may match,
read from the root down::

    value_path = (
        cc.IterativeMatcher("b1.a.head0")  # stage 0: the head, anywhere
        .children(0)                       # stage 1: its child 0 ('a.comb_v')
        .children(1)                       # stage 2: that one's child 1 ('a.v')
        .then("a1.norm")                   # stage 3: 'a1.norm' anywhere below it
    )
    patched = c.update(value_path, lambda n: corrupted)

Stage 0 starts at the root (depth 0).  Every node a stage matches starts
the next stage there (depth 0 again, counted down from that node); a node
matched by the last stage is *found*.  Each stage takes:

- ``min_depth``, ``max_depth``: it matches only nodes at a depth in that
  range below where the stage started (``then`` defaults to
  ``min_depth=1``: strictly below; ``max_depth=None`` is unlimited), and
  does not search deeper than ``max_depth``;
- ``positions``: the stage descends from its start node only through the
  children at these positions (negative positions count from the end;
  positions a node does not have are skipped) - ``children(i, ...)`` is
  ``then(min_depth=1, max_depth=1, positions=(i, ...))``;
- ``stop_at_match``: it does not search below a node it matched.

So "below a node" is ``IterativeMatcher(node).then(m)``, "a depth range"
is ``IterativeMatcher(m, min_depth=2, max_depth=5)``, and "children at
given positions of a matched node" is ``.children(...)``.

What is found depends on the path, not only on the node: with shared
subtrees one node may be found along one path and not along another.
``get`` returns the nodes found along at least one path; rewrites
(``circuits.rewriting.rewrite.update``) rewrite a node only where it is reached
along a path that finds it, un-sharing it from the paths that do not.
A walk keeps, per node, the set of (stage, depth) pairs still active, so
it visits each node at most once per distinct set (once, for a plain
matcher); depths beyond a stage's ``min_depth`` are merged when it has no
``max_depth``, which keeps that number small.  Nothing recurses.

Combining, excluding, routes
----------------------------
Found "along a path" is what ``|`` and ``&`` combine (either side may be a
plain matcher form): ``a | b`` finds a node along a path if ``a`` or ``b``
finds it along that path, ``a & b`` if both do.  So a rewrite with ``a | b``
rewrites a node wherever either would, and ``a & b`` only where both would.
A union of stage chains is itself a graph of stages (``then`` after it
chains from every branch); ``&`` (or ``|`` holding one) runs its sides side
by side, each in its own state, and stages added after it start at every
node it finds.
A stage's ``term_early_at`` matcher stops it at the nodes it matches (below
its start node): routes through them are not searched.  ``get_paths`` and
``get_all_paths`` list the routes from the root by which a matcher finds
each node, to read a path patch before running it.

rust_circuit's chain and restrict
---------------------------------
``m.chain(a, b)`` is rust_circuit's: each item is started *at* every node
the one before finds, so it may find that node itself (``then(a,
min_depth=0)`` for a plain form); ``must_be_sub=True`` makes it strictly
below.  An item may be any IterativeMatcher (a union, another chain, a
``restrict``), run from that node as from a root.  ``chain_many(*chains)``
is the union of one ``chain`` per chain.  ``restrict(m, term_if_matches,
start_depth, end_depth, term_early_at)`` limits any matcher as
rust_circuit's does (depths from where it starts, ``end_depth``
exclusive, ``term_early_at`` checked at its start node too), and
``chain_excluding(parent, child, term_early_at)`` is
``restrict(parent.chain(child), term_early_at=term_early_at)``: the
exclusion holds on the whole route from the root.  Such matchers run as
small state machines beside the stage graph (``_Then``, ``_Restrict``).
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, Callable, Iterable, Iterator, Sequence

from circuits.errors import MatcherError, MatchError
from circuits.core.gcpause import gc_paused
from circuits.core.nodes import Circuit, check_node
from circuits.core.traversal import unique_nodes
from circuits.rewriting.hints import matcher_form, no_match_hints, placement

__all__ = [
    "FoundRoutes",
    "IterativeMatcher",
    "Matcher",
    "Regex",
    "Route",
    "are_any_found",
    "as_iterative",
    "chain_excluding",
    "describe_where",
    "get",
    "get_all_paths",
    "get_paths",
    "get_unique",
    "get_unique_op",
    "layer_text",
    "new_traversal",
    "no_match_hint",
    "restrict",
    "restrict_sl",
    "shortest_paths",
    "validate",
    "validate_found",
    "walk",
]


# ----------------------------------------------------------------- Matcher


class _Finding:
    """rust_circuit's methods on matchers: ``m.get(c)`` is ``get(c, m)``, ``m.update(c, fn)``
    is ``update(c, m, fn)`` and so on (for Matcher and IterativeMatcher alike)."""

    __slots__ = ()

    def get(self, circuit: Circuit, fancy_validate: bool = False) -> set[Circuit]:
        return get(circuit, self, fancy_validate=fancy_validate)

    def get_unique(self, circuit: Circuit, fancy_validate: bool = False) -> Circuit:
        return get_unique(circuit, self, fancy_validate=fancy_validate)

    def get_unique_op(self, circuit: Circuit, fancy_validate: bool = False) -> Circuit | None:
        """The one node found, or None if none is; ``MatchError`` if several are."""
        return get_unique_op(circuit, self, fancy_validate=fancy_validate)

    def are_any_found(self, circuit: Circuit) -> bool:
        return are_any_found(circuit, self)

    def get_paths(self, circuit: Circuit) -> FoundRoutes:
        return get_paths(circuit, self)

    def get_all_paths(self, circuit: Circuit) -> FoundRoutes:
        return get_all_paths(circuit, self)

    def validate(self, circuit: Circuit) -> None:
        """``MatchError`` unless every part of this matcher finds something (``validate_found``)."""
        validate(circuit, self)

    def getter(self, default_fancy_validate: bool = False):
        """A ``BoundGetter`` of this matcher (``circuits.rewriting.operations``)."""
        from circuits.rewriting.operations import Getter

        return Getter(default_fancy_validate).bind(self)

    def update(
        self,
        circuit: Circuit,
        transform: Callable[[Circuit], Circuit],
        cache_transform: bool = True,
        cache_update: bool = True,
        fancy_validate: bool = False,
        assert_any_found: bool = True,
    ) -> Circuit:
        """``circuits.rewriting.rewrite.update(circuit, self, transform, ...)``, rust_circuit's signature
        (``assert_any_found`` defaults to True here, as ``update`` does)."""
        from circuits.rewriting.operations import Updater

        updater = Updater(transform, cache_transform, cache_update)
        return updater.update(circuit, self, fancy_validate, assert_any_found)

    def updater(
        self,
        transform: Callable[[Circuit], Circuit],
        cache_transform: bool = True,
        cache_update: bool = True,
        default_fancy_validate: bool = False,
        default_assert_any_found: bool = True,
    ):
        """A ``BoundUpdater`` of this matcher (``circuits.rewriting.operations``)."""
        from circuits.rewriting.operations import Updater

        settings = (cache_transform, cache_update, default_fancy_validate, default_assert_any_found)
        return Updater(transform, *settings).bind(self)


class Matcher(_Finding):
    """A predicate on nodes; see the module docstring for the accepted forms.

    ``Matcher(form)`` converts any plain form; a Matcher is callable,
    ``matcher(node) -> bool``.
    """

    __slots__ = ("_predicate", "_text", "_checks")

    def __init__(self, form: Any = True):
        if isinstance(form, Matcher):
            predicate, text, checks = form._predicate, form._text, form._checks
        else:
            predicate, text, checks = _convert(form)
        self._predicate: Callable[[Circuit], bool] = predicate
        self._text: str = text
        self._checks: tuple = checks

    @classmethod
    def from_predicate(
        cls, predicate: Callable[[Circuit], bool], text: str, checks: tuple | None = None
    ) -> Matcher:
        """A matcher running ``predicate`` as it is (no conversion), printed as ``text``.

        ``checks`` are what ``fancy_validate`` asks of what it finds (see ``validate_found``);
        by default, that ``predicate`` holds for some found node.
        """
        matcher = object.__new__(cls)
        matcher._predicate = predicate
        matcher._text = text
        matcher._checks = ((_PREDICATE, predicate, text),) if checks is None else checks
        return matcher

    @property
    def predicate(self) -> Callable[[Circuit], bool]:
        """The plain function ``node -> bool`` this matcher runs (the fast path for walks and rewrites)."""
        return self._predicate

    # ------------------------------------------------------- constructors

    @classmethod
    def regex(cls, pattern: str | re.Pattern, flags: int = 0, *, escape_dot: bool = False) -> Matcher:
        """Named nodes whose name contains a match of ``pattern`` (``re.search``).

        ``escape_dot=True`` reads the pattern as rust_circuit's ``Regex`` does by default
        (``.`` a literal dot, ``\\.`` any character); here the default is Python's reading.
        """
        if escape_dot:
            if flags:
                raise MatcherError(f"Matcher.regex({pattern!r}): flags are not taken with escape_dot=True")
            return cls(Regex(pattern, escape_dot=True))
        try:
            compiled = re.compile(pattern, flags) if isinstance(pattern, str) else pattern
        except re.error as error:
            raise MatcherError(
                f"Matcher.regex({pattern!r}): not a valid regular expression: {error}"
            ) from None
        if not isinstance(compiled, re.Pattern):
            raise MatcherError(f"Matcher.regex: pattern {pattern!r} is not a str or re.Pattern")
        search = compiled.search
        return cls.from_predicate(
            lambda node: node.name is not None and search(node.name) is not None,
            f"Matcher.regex({compiled.pattern!r})",
        )

    @classmethod
    def types(cls, *classes: type) -> Matcher:
        """Nodes that are instances of any of ``classes``."""
        for kind in classes:
            if not (isinstance(kind, type) and issubclass(kind, Circuit)):
                raise MatcherError(f"Matcher.types: {kind!r} is not a circuit node class")
        return cls.from_predicate(
            lambda node: isinstance(node, classes),
            "Matcher.types(" + ", ".join(kind.__name__ for kind in classes) + ")",
            ((_TYPES, classes),),
        )

    @classmethod
    def any(cls, *forms: Any) -> Matcher:
        """Nodes matched by any of ``forms`` (the same as a set of them)."""
        return cls(list(forms))

    def to_iterative_matcher(self) -> IterativeMatcher:
        return IterativeMatcher(self)

    def chain(self, *rest: Any, must_be_sub: bool = False) -> IterativeMatcher:
        """``IterativeMatcher(self).chain(...)`` (rust_circuit's ``Matcher.chain``)."""
        return IterativeMatcher(self).chain(*rest, must_be_sub=must_be_sub)

    def chain_many(self, *chains: Any, must_be_sub: bool = False) -> IterativeMatcher:
        return IterativeMatcher(self).chain_many(*chains, must_be_sub=must_be_sub)

    # ---------------------------------------------------------------- use

    def __call__(self, node: Circuit) -> bool:
        return bool(self._predicate(node))

    def __and__(self, other: Any) -> Any:
        other = matcher_form(other)
        if isinstance(other, IterativeMatcher):
            return as_iterative(self) & other
        other = Matcher(other)
        a, b = self._predicate, other._predicate
        return Matcher.from_predicate(
            lambda node: bool(a(node)) and bool(b(node)),
            f"({self._text} & {other._text})",
            self._checks + other._checks,
        )

    def __rand__(self, other: Any) -> Any:
        other = matcher_form(other)
        return as_iterative(other) & self if isinstance(other, IterativeMatcher) else Matcher(other) & self

    def __or__(self, other: Any) -> Any:
        other = matcher_form(other)
        if isinstance(other, IterativeMatcher):
            return as_iterative(self) | other
        other = Matcher(other)
        a, b = self._predicate, other._predicate
        return Matcher.from_predicate(
            lambda node: bool(a(node)) or bool(b(node)),
            f"({self._text} | {other._text})",
            self._checks + other._checks,
        )

    def __ror__(self, other: Any) -> Any:
        other = matcher_form(other)
        return as_iterative(other) | self if isinstance(other, IterativeMatcher) else Matcher(other) | self

    def __invert__(self) -> Matcher:
        a = self._predicate
        return Matcher.from_predicate(lambda node: not a(node), f"~{self._text}", ())  # nothing to check

    def __repr__(self) -> str:
        return self._text


# What fancy validation asks of the nodes a matcher found, one entry per part of it:
# (_NAMES, names) every name is among them; (_TYPES, classes) each class has an instance among
# them; (_NODES, ((hash, text), ...)) each node is among them; (_PREDICATE, predicate, text)
# some node satisfies it.  A negation asks nothing (rust_circuit's validate_matched).
_NAMES, _TYPES, _NODES, _PREDICATE = "names", "types", "nodes", "predicate"


def _convert(form: Any) -> tuple[Callable[[Circuit], bool], str, tuple]:
    registered = matcher_form(form)
    if registered is not form:  # a registered form (a Point): what it stands for, if that is plain
        if isinstance(registered, IterativeMatcher) and registered.is_plain:
            registered = registered.plain_matcher
        if isinstance(registered, Matcher):
            return registered._predicate, registered._text, registered._checks
        form = registered
    if isinstance(form, bool):
        predicate = (lambda node: True) if form else (lambda node: False)
        return predicate, f"Matcher({form})", ((_PREDICATE, predicate, f"Matcher({form})"),)
    if isinstance(form, str):
        return (lambda node: node.name == form), f"Matcher({form!r})", ((_NAMES, frozenset([form])),)
    if isinstance(form, (re.Pattern, Regex)):
        matcher = Matcher.regex(form.compiled if isinstance(form, Regex) else form)
        text = f"Matcher({form!r})" if isinstance(form, Regex) else matcher._text
        return matcher._predicate, text, ((_PREDICATE, matcher._predicate, text),)
    if isinstance(form, Circuit):
        target, text = form.hash, f"<{form.describe()} {list(form.shape)}>"
        return (lambda node: node.hash == target), f"Matcher({text})", ((_NODES, ((target, text),)),)
    if isinstance(form, type):
        if issubclass(form, Circuit):
            return (lambda node: isinstance(node, form)), f"Matcher({form.__name__})", ((_TYPES, (form,)),)
        raise MatcherError(f"Matcher({form.__name__}): a class matcher must be a circuit node class")
    if isinstance(form, types.UnionType):  # cc.Einsum | cc.Add, as Python spells a union of classes
        return _convert_collection(typing.get_args(form))
    if isinstance(form, IterativeMatcher):
        raise MatcherError(
            f"{form!r} restricts paths and cannot be used as a plain Matcher; "
            "pass it where an IterativeMatcher is accepted (get, update, ...)"
        )
    if isinstance(form, (set, frozenset, list, tuple)):
        return _convert_collection(form)
    if callable(form):
        text = f"Matcher({getattr(form, '__name__', None) or type(form).__name__})"
        return form, text, ((_PREDICATE, form, text),)
    raise MatcherError(
        f"cannot make a Matcher from {type(form).__name__} {form!r}: expected a name, a regex "
        "(Matcher.regex, Regex), a node class, a predicate, a set of these, a node, or a bool"
    )


def _convert_collection(forms) -> tuple[Callable[[Circuit], bool], str, tuple]:
    names = frozenset(f for f in forms if isinstance(f, str))
    nodes = tuple((f.hash, f"<{f.describe()} {list(f.shape)}>") for f in forms if isinstance(f, Circuit))
    hashes = frozenset(h for h, _ in nodes)
    matchers = [Matcher(f) for f in forms if not isinstance(f, (str, Circuit))]
    others = [m._predicate for m in matchers]

    def predicate(node: Circuit) -> bool:
        return node.name in names or node.hash in hashes or any(p(node) for p in others)

    shown = sorted(names)[:6]
    text = "{" + ", ".join(repr(n) for n in shown)
    extra = len(forms) - len(shown)
    text += (", " if shown and extra else "") + (f"...{extra} more" if extra else "") + "}"
    checks = ((_NAMES, names),) if names else ()
    checks += ((_NODES, nodes),) if nodes else ()
    return predicate, f"Matcher({text})", checks + sum((m._checks for m in matchers), ())


class Regex:
    """rust_circuit's ``Regex``: a name pattern where, by default, ``.`` is a literal dot and
    ``\\.`` any character (``escape_dot=False``: Python's reading).  Like ``Matcher.regex``,
    it need not match the whole name (anchor with ``^``/``$``).  A matcher form: named nodes
    whose name it matches."""

    __slots__ = ("pattern", "escape_dot", "compiled")

    def __init__(self, pattern: str, escape_dot: bool = True):
        if not isinstance(pattern, str):
            raise MatcherError(f"Regex: pattern {pattern!r} is not a str")
        if not isinstance(escape_dot, bool):
            raise MatcherError(f"Regex({pattern!r}): escape_dot {escape_dot!r} is not a bool")
        read = (
            re.sub(r"(\\\.)|(\.)", lambda m: "." if m.group(1) else r"\.", pattern) if escape_dot else pattern
        )
        try:
            compiled = re.compile(read)
        except re.error as error:
            raise MatcherError(f"Regex({pattern!r}): not a valid regular expression: {error}") from None
        self.pattern, self.escape_dot, self.compiled = pattern, escape_dot, compiled

    def call(self, name: str) -> bool:
        """Whether ``name`` contains a match (rust_circuit's ``Regex.call``)."""
        return self.compiled.search(name) is not None

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r}, escape_dot={self.escape_dot})"


# --------------------------------------------------------- IterativeMatcher


class _Stage:
    __slots__ = ("matcher", "min_depth", "max_depth", "positions", "stop_at_match", "term_early_at", "cap")

    def __init__(self, matcher, min_depth, max_depth, positions, stop_at_match, term_early_at=None):
        where = f"IterativeMatcher stage {matcher!r}"
        if isinstance(min_depth, bool) or not isinstance(min_depth, int) or min_depth < 0:
            raise MatcherError(f"{where}: min_depth {min_depth!r} is not an int >= 0")
        if max_depth is not None and (
            isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < min_depth
        ):
            raise MatcherError(
                f"{where}: max_depth {max_depth!r} is not None or an int >= min_depth {min_depth}"
            )
        if positions is not None:
            if isinstance(positions, int):
                positions = (positions,)
            if not all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
                raise MatcherError(f"{where}: positions {positions!r} are not ints")
            positions = tuple(sorted(set(positions)))
        self.matcher = Matcher(matcher)
        self.min_depth = min_depth
        self.max_depth = max_depth
        self.positions = positions
        self.stop_at_match = bool(stop_at_match)
        self.term_early_at = None if term_early_at is None else Matcher(term_early_at)
        # With no max_depth, every depth >= cap behaves alike, so depths saturate at cap
        # (depth 0, the start node, stays apart when positions or term_early_at depend on it).
        apart = positions is not None or self.term_early_at is not None
        self.cap = max(min_depth, 1 if apart else 0)

    def describe(self, default_min_depth: int) -> str:
        parts = [repr(self.matcher)]
        if self.min_depth != default_min_depth:
            parts.append(f"min_depth={self.min_depth}")
        if self.max_depth is not None:
            parts.append(f"max_depth={self.max_depth}")
        if self.positions is not None:
            parts.append(f"positions={self.positions}")
        if self.stop_at_match:
            parts.append("stop_at_match=True")
        if self.term_early_at is not None:
            parts.append(f"term_early_at={self.term_early_at!r}")
        return ", ".join(parts)


State = frozenset  # of (stage index, depth) pairs; the empty set means "nothing more below"
_DONE: State = frozenset()


class IterativeMatcher(_Finding):
    """Matching restricted to paths: a chain of stages (see the module docstring).

    ``IterativeMatcher(m, min_depth=0, max_depth=None, positions=None,
    stop_at_match=False, term_early_at=None)`` is stage 0, searched from the
    root; ``then`` and ``children`` append stages and return a new
    IterativeMatcher (they never modify this one).  ``|`` and ``&`` combine
    two (or one and a plain matcher form): see "Combining" in the module
    docstring.

    Inside, the stages form a small graph: ``_following[i]`` are the stages a
    hit of stage ``i`` starts (none: the hit is found) and ``_heads`` are the
    stages started at the root, so a union of chains is one graph.
    """

    __slots__ = ("_stages", "_following", "_heads", "_start", "_plain", "_predicates", "_term_hits")

    def __init__(
        self,
        matcher: Any = True,
        *,
        min_depth: int = 0,
        max_depth: int | None = None,
        positions: Sequence[int] | int | None = None,
        stop_at_match: bool = False,
        term_early_at: Any = None,
    ):
        registered = matcher_form(matcher)
        options = (min_depth, max_depth, positions, stop_at_match, term_early_at)
        if isinstance(registered, IterativeMatcher) and options == (0, None, None, False, None):
            # a registered form that restricts paths (a head's Point), with no stage options: as it is
            self._set_stages(registered._stages, registered._following, registered._heads)
            return
        stage = _Stage(matcher, min_depth, max_depth, positions, stop_at_match, term_early_at)
        self._set_stages((stage,), ((),), (0,))

    def _set_stages(self, stages: tuple[_Stage, ...], following: tuple, heads: tuple[int, ...]) -> None:
        self._stages = stages
        self._following = following
        self._heads = heads
        self._start = frozenset((head, 0) for head in heads)
        only = stages[0]
        self._plain = (
            len(stages) == 1
            and only.min_depth == 0
            and only.max_depth is None
            and only.positions is None
            and not only.stop_at_match
            and only.term_early_at is None
        )
        # Walks compute one hit per predicate: each stage's matcher, then each term_early_at.
        terms = [index for index, stage in enumerate(stages) if stage.term_early_at is not None]
        self._predicates = tuple(stage.matcher._predicate for stage in stages) + tuple(
            stages[index].term_early_at._predicate for index in terms
        )
        term_hits: list[int | None] = [None] * len(stages)
        for offset, index in enumerate(terms):
            term_hits[index] = len(stages) + offset
        self._term_hits = tuple(term_hits)

    @staticmethod
    def _built(stages: tuple[_Stage, ...], following: tuple, heads: tuple[int, ...]) -> IterativeMatcher:
        new = object.__new__(IterativeMatcher)
        new._set_stages(stages, following, heads)
        return new

    def _extended(self, stage: _Stage) -> IterativeMatcher:
        """``stage`` appended after every stage whose hits were found so far."""
        return self._spliced(IterativeMatcher._built((stage,), ((),), (0,)))

    def _spliced(self, rest: IterativeMatcher) -> IterativeMatcher:
        """``rest`` (a stage graph) started at every node this one finds, as its found nodes."""
        shift = len(self._stages)
        starts = tuple(head + shift for head in rest._heads)
        following = tuple(after or starts for after in self._following) + tuple(
            tuple(index + shift for index in after) for after in rest._following
        )
        return IterativeMatcher._built(self._stages + rest._stages, following, self._heads)

    def _chained(self, rest: IterativeMatcher) -> IterativeMatcher:
        """``rest`` (any IterativeMatcher) started at every node this one finds, that node included."""
        if type(rest) is IterativeMatcher:
            return self._spliced(rest)
        return _Then.of(self, rest)

    def then(
        self,
        matcher: Any = True,
        *,
        min_depth: int = 1,
        max_depth: int | None = None,
        positions: Sequence[int] | int | None = None,
        stop_at_match: bool = False,
        term_early_at: Any = None,
    ) -> IterativeMatcher:
        """Then, below each node found so far, the nodes ``matcher`` matches.

        Depths count from the node the previous stage found (``min_depth=1``:
        strictly below it; ``0`` lets it match that node itself).  With
        ``term_early_at``, the stage does not search below a node (other
        than its start) that this matcher matches: routes through such a
        node are excluded (the node itself can still be found).
        """
        stage = _Stage(matcher, min_depth, max_depth, positions, stop_at_match, term_early_at)
        return self._extended(stage)

    def children(self, *positions: int, matcher: Any = True) -> IterativeMatcher:
        """Then the children at ``positions`` of each node found so far (filtered by ``matcher``)."""
        if not positions:
            raise MatcherError("IterativeMatcher.children: give at least one child position")
        return self._extended(_Stage(matcher, 1, 1, positions, False))

    def chain(self, *rest: Any, must_be_sub: bool = False) -> IterativeMatcher:
        """rust_circuit's ``chain``: each of ``rest`` in turn, started at every node the one
        before finds.

        Each item starts *at* that node (depth 0), so it may find the node itself:
        ``corr_root_matcher.chain("labels")`` finds the root if it is ``'labels'``.  With
        ``must_be_sub=True`` each item finds only nodes strictly below (``then``'s default).
        An item is a matcher form (one stage: ``then(form, min_depth=0)``) or any
        IterativeMatcher (``restrict(...)``, another chain, a union ...), run from there as
        from a root.
        """
        result: IterativeMatcher = self
        for form in map(matcher_form, rest):
            if not isinstance(form, IterativeMatcher):
                result = result.then(form, min_depth=1 if must_be_sub else 0)
            else:
                result = result._chained(restrict(form, start_depth=1) if must_be_sub else form)
        return result

    def chain_many(self, *chains: Any, must_be_sub: bool = False) -> IterativeMatcher:
        """The union (``|``) of ``self.chain(*chain)`` over ``chains``, as rust_circuit's.

        Each chain is a list or tuple of items (successive stages), or one item.
        """
        if not chains:
            raise MatcherError(f"{self!r}.chain_many: give at least one chain of matcher forms")
        result = None
        for chain in chains:
            items = chain if isinstance(chain, (list, tuple)) else (chain,)
            one = self.chain(*items, must_be_sub=must_be_sub)
            result = one if result is None else result | one
        return result

    def __or__(self, other: Any) -> IterativeMatcher:
        other = as_iterative(other)
        if type(self) is not IterativeMatcher or type(other) is not IterativeMatcher:
            return _Combination.of("any", (self, other))
        if self._plain and other._plain:
            return IterativeMatcher(self.plain_matcher | other.plain_matcher)
        shift = len(self._stages)
        following = tuple(tuple(index + shift for index in after) for after in other._following)
        heads = tuple(head + shift for head in other._heads)
        return IterativeMatcher._built(
            self._stages + other._stages, self._following + following, self._heads + heads
        )

    def __ror__(self, other: Any) -> IterativeMatcher:
        return as_iterative(other) | self

    def __and__(self, other: Any) -> IterativeMatcher:
        other = as_iterative(other)
        if self._plain and other._plain:
            return IterativeMatcher(self.plain_matcher & other.plain_matcher)
        return _Combination.of("all", (self, other))

    def __rand__(self, other: Any) -> IterativeMatcher:
        return as_iterative(other) & self

    @property
    def is_plain(self) -> bool:
        """True if this restricts nothing: it finds exactly what its one matcher matches."""
        return self._plain

    @property
    def plain_matcher(self) -> Matcher:
        """The matcher of the first stage (the whole matcher when ``is_plain``)."""
        return self._stages[0].matcher

    def matchers(self) -> list[Matcher]:
        """Every stage's matcher (for messages: the names a matcher looks for)."""
        return [stage.matcher for stage in self._stages]

    def final_matchers(self) -> list[Matcher]:
        """The matchers whose hits are found, which ``fancy_validate`` checks (rust_circuit checks
        the last matcher of each chain, the parts of an ``|``, nothing of an ``&``)."""
        return [stage.matcher for stage, after in zip(self._stages, self._following) if not after]

    @property
    def start(self) -> State:
        return self._start

    def step_from(self, state: State, hits: tuple[bool, ...], count: int) -> tuple[bool, list[State]]:
        """At a node reached in ``state``, given which of the walk's predicates match it (``hits``)
        and its child ``count`` (all a step needs of the node, so walks can cache it): is it found,
        and the state for each child."""
        stages, following, term_hits = self._stages, self._following, self._term_hits
        pending = list(state)
        seen = set(pending)
        found = False
        common: set = set()
        by_position: dict[int, set] | None = None
        i = 0
        while i < len(pending):
            index, depth = pending[i]
            i += 1
            stage = stages[index]
            hit = (
                hits[index]
                and depth >= stage.min_depth
                and (stage.max_depth is None or depth <= stage.max_depth)
            )
            if hit:
                if not following[index]:
                    found = True
                for after in following[index]:
                    started = (after, 0)
                    if started not in seen:
                        seen.add(started)
                        pending.append(started)
                if stage.stop_at_match:
                    continue
            term = term_hits[index]
            if term is not None and depth > 0 and hits[term]:
                continue
            if stage.max_depth is not None:
                if depth >= stage.max_depth:
                    continue
                item = (index, depth + 1)
            else:
                item = (index, min(depth + 1, stage.cap))
            if depth == 0 and stage.positions is not None:
                if by_position is None:
                    by_position = {}
                for position in stage.positions:
                    p = position + count if position < 0 else position
                    if 0 <= p < count:
                        by_position.setdefault(p, set()).add(item)
            else:
                common.add(item)
        if by_position is None:
            shared = frozenset(common)
            return found, [shared] * count
        return found, [frozenset(common | by_position.get(p, set())) for p in range(count)]

    def child_states(self, node: Circuit, state: State) -> list[State]:
        """The state for each child of ``node`` reached in ``state`` (falsy where nothing more can be
        found below): what the printer's ``traversal=`` asks (``circuits.text.printing.Traversal``)."""
        hits = tuple([bool(predicate(node)) for predicate in self._predicates])
        return self.step_from(state, hits, len(node.children))[1]

    def __repr__(self) -> str:
        texts = [self._chain_repr(chain) for chain in self._chains()]
        return texts[0] if len(texts) == 1 else "(" + " | ".join(texts) + ")"

    def _chains(self) -> list[list[int]]:
        """The stage chains from each head to a stage whose hits are found (the stage graph is acyclic)."""
        chains, stack = [], [[head] for head in reversed(self._heads)]
        while stack:
            chain = stack.pop()
            following = self._following[chain[-1]]
            if not following:
                chains.append(chain)
            stack.extend(chain + [after] for after in reversed(following))
        return chains

    def _chain_repr(self, chain: list[int]) -> str:
        head = f"IterativeMatcher({self._stages[chain[0]].describe(0)})"
        return head + "".join(_stage_call(self._stages[index]) for index in chain[1:])


def _stage_call(stage: _Stage) -> str:
    """``.children(...)``, ``.chain(...)`` or ``.then(...)``: how a stage after the first is written."""
    if stage.min_depth == 1 and stage.max_depth == 1 and stage.positions is not None:
        positions = ", ".join(str(p) for p in stage.positions)
        matcher = "" if repr(stage.matcher) == "Matcher(True)" else f", matcher={stage.matcher!r}"
        return f".children({positions}{matcher})"
    if stage.describe(0) == repr(stage.matcher):  # min_depth 0 and nothing else: a chain item
        return f".chain({stage.matcher!r})"
    return f".then({stage.describe(1)})"


class _Composite(IterativeMatcher):
    """An IterativeMatcher that is not one stage graph: its state is a tuple of its parts'
    states (``_DONE`` once nothing more can be found), and items chained after it run as a
    ``_Then``."""

    __slots__ = ()

    def _extended(self, stage: _Stage) -> IterativeMatcher:
        return self._chained(IterativeMatcher._built((stage,), ((),), (0,)))

    def _chained(self, rest: IterativeMatcher) -> IterativeMatcher:
        return _Then.of(self, rest)

    @property
    def plain_matcher(self) -> Matcher:
        raise MatcherError(f"{self!r} combines IterativeMatchers and has no single plain matcher")


class _Combination(_Composite):
    """``a | b`` or ``a & b`` where a plain stage graph cannot say it: the parts run side by side.

    Its state is the tuple of the parts' states (``_DONE`` once nothing more can be found:
    for "any", when every part is done; for "all", when any part is).  A node is found when
    any (all) of the parts find it in the states that reach it along the same path.
    """

    __slots__ = ("_mode", "_parts", "_slices")

    @staticmethod
    def of(mode: str, parts: tuple[IterativeMatcher, ...]) -> _Combination:
        flat: list[IterativeMatcher] = []
        for part in parts:
            same = isinstance(part, _Combination) and part._mode == mode
            flat.extend(part._parts if same else (part,))
        new = object.__new__(_Combination)
        new._mode, new._parts = mode, tuple(flat)
        slices, predicates = [], []
        for part in flat:
            slices.append((len(predicates), len(predicates) + len(part._predicates)))
            predicates.extend(part._predicates)
        new._slices, new._predicates = tuple(slices), tuple(predicates)
        new._start = tuple(part._start for part in flat)
        new._plain = False
        return new

    def step_from(self, state: tuple, hits: tuple[bool, ...], count: int) -> tuple[bool, list]:
        results = [
            part.step_from(part_state, hits[low:high], count) if part_state else (False, None)
            for part, part_state, (low, high) in zip(self._parts, state, self._slices)
        ]
        keep = all if self._mode == "all" else any
        found = keep(part_found for part_found, _ in results)
        children = []
        for position in range(count):
            states = tuple(_DONE if kids is None else kids[position] for _, kids in results)
            children.append(states if keep(states) else _DONE)
        return found, children

    def matchers(self) -> list[Matcher]:
        return [matcher for part in self._parts for matcher in part.matchers()]

    def final_matchers(self) -> list[Matcher]:
        if self._mode == "all":
            return []
        return [matcher for part in self._parts for matcher in part.final_matchers()]

    def __repr__(self) -> str:
        joiner = " & " if self._mode == "all" else " | "
        return "(" + joiner.join(repr(part) for part in self._parts) + ")"


class _Then(_Composite):
    """``rest`` started at every node ``first`` finds (that node included), where the two
    cannot be one stage graph.  Its state is the pair (``first``'s state, ``rest``'s): for a
    stage graph ``rest``, the union of the states it was started in (the pairs of a stage
    graph step independently); for any other, the frozenset of them."""

    __slots__ = ("_first", "_rest", "_split", "_graph")

    @staticmethod
    def of(first: IterativeMatcher, rest: IterativeMatcher) -> _Then:
        new = object.__new__(_Then)
        new._first, new._rest = first, rest
        new._split = len(first._predicates)
        new._graph = type(rest) is IterativeMatcher
        new._predicates = first._predicates + rest._predicates
        new._start = (first._start, _DONE)
        new._plain = False
        return new

    def _chained(self, rest: IterativeMatcher) -> IterativeMatcher:
        return _Then.of(self._first, self._rest._chained(rest))

    def matchers(self) -> list[Matcher]:
        return self._first.matchers() + self._rest.matchers()

    def final_matchers(self) -> list[Matcher]:
        return self._rest.final_matchers()

    def step_from(self, state: tuple, hits: tuple[bool, ...], count: int) -> tuple[bool, list]:
        first_state, rest_state = state
        first_found, first_children = False, [_DONE] * count
        if first_state:
            first_found, first_children = self._first.step_from(first_state, hits[: self._split], count)
        rest, rest_hits = self._rest, hits[self._split :]
        if self._graph:
            if first_found:
                rest_state = rest_state | rest._start
            found, rest_children = False, [_DONE] * count
            if rest_state:
                found, rest_children = rest.step_from(rest_state, rest_hits, count)
        else:
            if first_found:
                rest_state = rest_state | {rest._start}
            found, kids = False, [set() for _ in range(count)]
            for one in rest_state:
                one_found, one_children = rest.step_from(one, rest_hits, count)
                found = found or one_found
                for position, child in enumerate(one_children):
                    if child:
                        kids[position].add(child)
            rest_children = [frozenset(child) for child in kids]
        return found, [
            (first, rest) if first or rest else _DONE for first, rest in zip(first_children, rest_children)
        ]

    def __repr__(self) -> str:
        chains = self._rest._chains() if self._graph else ()
        if len(chains) == 1:  # one chain of stages: written as the calls that append them
            return repr(self._first) + "".join(_stage_call(self._rest._stages[i]) for i in chains[0])
        return f"{self._first!r}.chain({self._rest!r})"


class _Restrict(_Composite):
    """rust_circuit's ``restrict``: ``inner`` with depth limits and early termination.

    Its state is (``inner``'s state, depth below where it started); the depth stops counting
    once no limit needs it.  See ``restrict``.
    """

    __slots__ = ("_inner", "_term_if_matches", "_start_depth", "_end_depth", "_term_early_at")

    @staticmethod
    def of(inner, term_if_matches, start_depth, end_depth, term_early_at) -> _Restrict:
        new = object.__new__(_Restrict)
        new._inner = inner
        new._term_if_matches = bool(term_if_matches)
        new._start_depth, new._end_depth = start_depth, end_depth
        new._term_early_at = term_early_at
        extra = () if term_early_at is None else (term_early_at._predicate,)
        new._predicates = inner._predicates + extra
        new._start = (inner._start, 0)
        new._plain = False
        return new

    def matchers(self) -> list[Matcher]:
        return self._inner.matchers()

    def final_matchers(self) -> list[Matcher]:
        return self._inner.final_matchers()

    def step_from(self, state: tuple, hits: tuple[bool, ...], count: int) -> tuple[bool, list]:
        inner_state, depth = state
        end, start = self._end_depth, self._start_depth
        if end is not None and depth >= end:
            return False, [_DONE] * count
        found, children = self._inner.step_from(inner_state, hits[: len(self._inner._predicates)], count)
        before_start = start is not None and depth < start
        found = found and not before_start
        if (
            not any(children)
            or (found and self._term_if_matches)
            or (end is not None and depth >= end - 1)
            or (self._term_early_at is not None and hits[-1])
        ):
            return found, [_DONE] * count
        deeper = depth + 1 if end is not None or before_start else depth
        return found, [(child, deeper) if child else _DONE for child in children]

    def __repr__(self) -> str:
        inner = self._inner
        parts = [repr(inner.plain_matcher if inner.is_plain else inner)]
        if self._term_if_matches:
            parts.append("term_if_matches=True")
        if self._start_depth is not None:
            parts.append(f"start_depth={self._start_depth}")
        if self._end_depth is not None:
            parts.append(f"end_depth={self._end_depth}")
        if self._term_early_at is not None:
            parts.append(f"term_early_at={self._term_early_at!r}")
        return f"restrict({', '.join(parts)})"


def restrict(
    matcher: Any,
    term_if_matches: bool = False,
    start_depth: int | None = None,
    end_depth: int | None = None,
    term_early_at: Any = False,
) -> IterativeMatcher:
    """rust_circuit's ``restrict``: ``matcher`` (any form or IterativeMatcher) limited by depth,
    counted from where it starts (the root, or the node a chain starts it at: depth 0).

    It finds what ``matcher`` finds at depths ``start_depth <= d < end_depth`` (``None``: no
    bound; ``end_depth`` is exclusive, as in rust_circuit); it searches no deeper than
    ``end_depth - 1``, nothing below a node it found when ``term_if_matches``, and nothing below
    a node ``term_early_at`` matches (that node itself may still be found; unlike a stage's
    ``term_early_at``, this applies to the start node too).  ``restrict(A.chain(B), ...)``,
    ``A.chain(restrict(B, ...))`` and ``restrict(A, ...).chain(B)`` are three different
    matchers, as in rust_circuit.
    """
    where = "restrict"
    for label, depth in (("start_depth", start_depth), ("end_depth", end_depth)):
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
            raise MatcherError(f"{where}: {label} {depth!r} is not None or an int >= 0")
    if not isinstance(term_if_matches, bool):
        raise MatcherError(f"{where}: term_if_matches {term_if_matches!r} is not a bool")
    term = None if term_early_at is False or term_early_at is None else Matcher(term_early_at)
    return _Restrict.of(as_iterative(matcher), term_if_matches, start_depth, end_depth, term)


def restrict_sl(
    matcher: Any, term_if_matches: bool = False, depth_slice: slice = slice(None), term_early_at: Any = False
) -> IterativeMatcher:
    """rust_circuit's ``restrict_sl``: ``restrict`` with the depths as a slice (``slice(2, 5)``)."""
    if not isinstance(depth_slice, slice) or depth_slice.step is not None:
        raise MatcherError(f"restrict_sl: depth_slice {depth_slice!r} is not a slice without a step")
    return restrict(matcher, term_if_matches, depth_slice.start, depth_slice.stop, term_early_at)


def new_traversal(
    start_depth: int | None = None, end_depth: int | None = None, term_early_at: Any = False
) -> IterativeMatcher:
    """rust_circuit's ``new_traversal``: every node, within the limits (``restrict(True, ...)``)."""
    return restrict(True, False, start_depth, end_depth, term_early_at)


def chain_excluding(parent: Any, child: Any, term_early_at: Any = False) -> IterativeMatcher:
    """rust_circuit's ``chain_excluding``: ``child`` chained from what ``parent`` finds, on routes
    that pass through no node ``term_early_at`` matches:
    ``restrict(parent.chain(child), term_early_at=term_early_at)`` (``parent.chain(child)``
    when ``term_early_at`` is False).

    "Head 1.4's direct route to the logits" in a 4-layer model: ``chain_excluding("t.call",
    "b1.a.head4", Matcher.regex(r"^b[23]\\.[am]$"))`` reaches the head from the logits through
    the residual stream only, not through a later layer's attention or MLP.  The exclusion
    holds on the whole route from the root (to ``parent`` too); an excluded node can still be
    found itself, and ``child`` can be the node ``parent`` finds.
    """
    chained = as_iterative(parent).chain(child)
    return chained if term_early_at is False else restrict(chained, term_early_at=term_early_at)


def as_iterative(form: Any) -> IterativeMatcher:
    """An IterativeMatcher as given, or a plain one from any matcher form."""
    form = matcher_form(form)
    if isinstance(form, IterativeMatcher):
        return form
    return IterativeMatcher(Matcher(form))


# -------------------------------------------------------------------- walks


class WalkEntry:
    """One visited (node, state) pair of a walk, in post-order.

    ``key`` identifies the pair; ``child_keys[i]`` is the key under which
    child ``i`` was visited, or None if nothing below it can be found (it is
    left as it is).  ``child_keys`` is None when the walk did not descend
    (a found node, with ``descend_found=False``).
    """

    __slots__ = ("key", "node", "found", "child_keys")

    def __init__(self, key, node, found, child_keys):
        self.key = key
        self.node = node
        self.found = found
        self.child_keys = child_keys


def walk(root: Circuit, matcher: Any, *, descend_found: bool = True) -> list[WalkEntry]:
    """Every (node, state) pair reachable from ``root``, children before parents.

    A plain matcher visits every distinct node once (key: its hash).  An
    IterativeMatcher visits each node once per distinct state that reaches
    it, and skips subtrees where nothing more can be found.  With
    ``descend_found=False`` the walk does not go below found nodes (for
    rewrites that replace a found subtree whole).  Iterative: any depth.
    """
    check_node(root, "walk: the circuit to search", MatcherError)
    iterative = as_iterative(matcher)
    if iterative.is_plain:
        return _walk_plain(root, iterative.plain_matcher, descend_found)
    return _walk_states(root, iterative, descend_found)


def _walk_plain(root: Circuit, matcher: Matcher, descend_found: bool) -> list[WalkEntry]:
    predicate = matcher._predicate
    entries: dict[bytes, WalkEntry] = {}
    order: list[WalkEntry] = []
    stack: list[tuple[Circuit, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        key = node.hash
        if expanded:
            order.append(entries[key])
            continue
        if key in entries:
            continue
        found = bool(predicate(node))
        if found and not descend_found:
            entries[key] = entry = WalkEntry(key, node, True, None)
            order.append(entry)
            continue
        children = node.children
        entries[key] = WalkEntry(key, node, found, tuple(child.hash for child in children))
        stack.append((node, True))
        for child in reversed(children):
            if child.hash not in entries:
                stack.append((child, False))
    return order


def _walk_states(root: Circuit, matcher: IterativeMatcher, descend_found: bool) -> list[WalkEntry]:
    with gc_paused():  # a walk makes a tuple or two per node: young collections would traverse them all
        return _walk_states_unpaused(root, matcher, descend_found)


def _walk_states_unpaused(root: Circuit, matcher: IterativeMatcher, descend_found: bool) -> list[WalkEntry]:
    entries: dict[tuple, WalkEntry] = {}
    order: list[WalkEntry] = []
    predicates = matcher._predicates
    step_from = matcher.step_from
    steps: dict[tuple, tuple[bool, list]] = {}  # (state, hits, child count) -> step result
    stack: list[tuple[Circuit, State, tuple | None]] = [(root, matcher.start, None)]
    pop, push = stack.pop, stack.append
    while stack:
        node, state, key = pop()
        if key is not None:  # children done
            order.append(entries[key])
            continue
        key = (node.hash, state)
        if key in entries:
            continue
        children = node.children
        hits = tuple([bool(p(node)) for p in predicates])
        memo = (state, hits, len(children))
        result = steps.get(memo)
        if result is None:
            result = steps[memo] = step_from(state, hits, len(children))
        found, child_states = result
        if found and not descend_found:
            entries[key] = entry = WalkEntry(key, node, True, None)
            order.append(entry)
            continue
        child_keys = [
            (child.hash, child_state) if child_state else None
            for child, child_state in zip(children, child_states)
        ]
        entries[key] = WalkEntry(key, node, found, child_keys)
        push((node, state, key))
        for position in range(len(children) - 1, -1, -1):
            child_key = child_keys[position]
            if child_key is not None and child_key not in entries:
                push((children[position], child_states[position], None))
    return order


# ------------------------------------------------------------------ finding


def iter_found(root: Circuit, matcher: Any) -> Iterator[Circuit]:
    """Found nodes, possibly repeated (one per state reaching them)."""
    iterative = as_iterative(matcher)
    if iterative.is_plain:
        predicate = iterative.plain_matcher._predicate
        return (node for node in unique_nodes([root]) if predicate(node))
    return (entry.node for entry in _walk_states(root, iterative, True) if entry.found)


def get(circuit: Circuit, matcher: Any, *, fancy_validate: bool = False) -> set[Circuit]:
    """Every distinct node of ``circuit`` that ``matcher`` finds (plain or iterative).

    ``fancy_validate=True``: ``MatchError`` unless every part of the matcher finds something
    (``validate_found``), so ``{"b0.a.head1", "b0.a.haed2"}`` does not quietly find one head.
    """
    check_node(circuit, "get: the circuit to search", MatcherError)
    found = set(iter_found(circuit, matcher))
    if fancy_validate:
        validate_found(circuit, matcher, found, "get")
    return found


def validate(circuit: Circuit, matcher: Any, what: str = "validate") -> set[Circuit]:
    """The nodes ``matcher`` finds, after ``validate_found`` checked them."""
    check_node(circuit, f"{what}: the circuit to search", MatcherError)
    found = set(iter_found(circuit, matcher))
    validate_found(circuit, matcher, found, what)
    return found


def validate_found(circuit: Circuit, matcher: Any, found: set[Circuit], what: str = "validate") -> None:
    """rust_circuit's fancy validation: ``MatchError`` unless each part of ``matcher`` found
    something among ``found``: every name of a name (or set of names), an instance of every
    class, every node given as a node, and, for a regex or predicate, some node it matches.

    Of an IterativeMatcher, the matchers whose hits are found are checked (the last of each
    chain, each side of an ``|``; nothing of an ``&``, nor of a negation ``~m``).
    """
    iterative = as_iterative(matcher)
    finals = [iterative.plain_matcher] if iterative.is_plain else iterative.final_matchers()
    names = {node.name for node in found}
    hashes = {node.hash for node in found}
    missing: list[str] = []
    for check in (check for final in finals for check in final._checks):
        kind = check[0]
        if kind == _NAMES:
            missing += [
                repr(name) + _close_text(circuit, name) for name in sorted(check[1]) if name not in names
            ]
        elif kind == _TYPES:
            missing += [cls.__name__ for cls in check[1] if not any(isinstance(n, cls) for n in found)]
        elif kind == _NODES:
            missing += [text for target, text in check[1] if target not in hashes]
        elif not any(check[1](node) for node in found):
            missing.append(check[2])
    if missing:
        shown = iterative.plain_matcher if iterative.is_plain else iterative
        raise MatchError(
            f"{what}({shown!r}) with fancy_validate: {len(found)} node(s) found in {circuit.describe()}, "
            f"but these parts of the matcher found nothing: {', '.join(missing)}",
            count=len(found),
            nodes=sorted(found, key=lambda n: (n.name or "", n.hash)),
        )


def _close_text(circuit: Circuit, name: str) -> str:
    close = _close_names(circuit, name)
    return f" (names that come close: {', '.join(repr(n) for n in close)})" if close else ""


def are_any_found(circuit: Circuit, matcher: Any) -> bool:
    """Whether ``matcher`` finds any node (a plain matcher stops at the first)."""
    check_node(circuit, "are_any_found: the circuit to search", MatcherError)
    iterative = as_iterative(matcher)
    if iterative.is_plain:
        predicate = iterative.plain_matcher._predicate
        seen: set[bytes] = set()
        stack = [circuit]
        while stack:
            node = stack.pop()
            if node.hash in seen:
                continue
            seen.add(node.hash)
            if predicate(node):
                return True
            stack.extend(node.children)
        return False
    return any(True for _ in iter_found(circuit, iterative))


_SHOWN = 8


def get_unique_op(circuit: Circuit, matcher: Any, *, fancy_validate: bool = False) -> Circuit | None:
    """The one node ``matcher`` finds, or None if it finds none; ``MatchError`` if several
    (rust_circuit's ``get_unique_op``)."""
    found = get(circuit, matcher, fancy_validate=fancy_validate)
    if len(found) > 1:
        get_unique(circuit, matcher)  # its MatchError says where each sits
    return next(iter(found), None)


def get_unique(circuit: Circuit, matcher: Any, *, fancy_validate: bool = False) -> Circuit:
    """The one node ``matcher`` finds; ``MatchError`` if none or several do.

    With none, the message lists names that come close and, for a head's name on a layer whose
    heads are not split, says to ``split_heads``.  With several, it says where each sits: its
    path from the root and, where a registered naming convention tells (``circuits.rewriting.hints``),
    its layer (and head).
    """
    found = get(circuit, matcher, fancy_validate=fancy_validate)
    if len(found) == 1:
        return next(iter(found))
    iterative = as_iterative(matcher)
    shown = iterative if not iterative.is_plain else iterative.plain_matcher
    if not found:
        raise MatchError(
            f"get_unique({shown!r}): no node matches in {circuit.describe()}{no_match_hint(circuit, matcher)}",
            count=0,
            nodes=[],
        )
    paths = shortest_paths(circuit, found)
    nodes = sorted(found, key=lambda n: _order(n, paths[n.hash], len(found) <= _PLACED))
    more = f" ({_SHOWN} shown, and {len(nodes) - _SHOWN} more)" if len(nodes) > _SHOWN else ""
    lines = [
        f"\n  {n.describe()} {list(n.shape)}: {describe_where(n, paths[n.hash])}" for n in nodes[:_SHOWN]
    ]
    raise MatchError(
        f"get_unique({shown!r}): {len(nodes)} distinct nodes match in {circuit.describe()}, "
        f"expected exactly one{more}:{''.join(lines)}",
        count=len(nodes),
        nodes=nodes,
    )


_PLACED = 64  # several nodes found: up to this many are ordered by layer (the names tell it)


def _order(node: Circuit, path: list[Circuit], placed: bool) -> tuple:
    """Sort key: by name, kind, layer and head (when ``placed``), then path: deterministic."""
    at = placement(node, path) if placed else None
    layer = (0, -1, ()) if at is None else (1, at[0], at[1] or ())
    return (node.name is None, node.name or "", node.kind, layer, [p.name or "" for p in path], node.hash)


def no_match_hint(circuit: Circuit, form: Any) -> str:
    """What a message about ``form`` finding nothing in ``circuit`` adds: the registered hints
    (``circuits.rewriting.hints``; the transformer convention's says, for a head's name such as
    ``'b1.a.head2'`` on a layer that is not split into heads, that ``split_heads`` makes them),
    then names that come close.  Empty, or ``'; ...'``.

    The one suggestion function of the rewriting layer (``update``, ``replace``, ``get_unique``
    and the experiments use it).  Beyond a name, it reads the names a Matcher, a set or an
    IterativeMatcher looks for (each absent one gets its close names), and for a node, says
    which nodes of its name the circuit has instead.
    """
    if isinstance(form, str):
        hints = no_match_hints(circuit, form)
        close = _close_names(circuit, form)
        hints.append(f"names that come close: {', '.join(repr(n) for n in close)}" if close else "")
        return "".join(f"; {hint}" for hint in hints if hint)
    present = {node.name for node in unique_nodes([circuit])}
    hints = []
    for name in _names_of(form):
        if name not in present:
            hints += no_match_hints(circuit, name)
            hints.append(f"no node is named {name!r}{_close_text(circuit, name)}")
    if isinstance(form, Circuit) and form.name in present:
        same = sorted((n for n in unique_nodes([circuit]) if n.name == form.name), key=lambda n: n.hash)
        shown = ", ".join(f"{n.describe()} {list(n.shape)}" for n in same[:3])
        hints.append(f"the circuit's node(s) named {form.name!r} differ from it: {shown}")
    return "".join(f"; {hint}" for hint in hints if hint)


def _names_of(form: Any) -> list[str]:
    """The names ``form`` looks for (a Matcher's name parts, every stage's of an IterativeMatcher)."""
    form = matcher_form(form)
    if isinstance(form, Circuit):
        return [] if form.name is None else [form.name]
    if isinstance(form, IterativeMatcher):
        matchers = form.matchers()
    else:
        try:
            matchers = [Matcher(form)]
        except MatcherError:
            return []
    found = (name for m in matchers for check in m._checks if check[0] == _NAMES for name in check[1])
    return sorted(set(found))


# -------------------------------------------------------------------- routes


class Route(tuple):
    """The nodes of one route from the root to a found node, root first; prints as its names
    joined by ``' -> '`` (an unnamed node as ``<Kind>``)."""

    __slots__ = ()

    def __str__(self) -> str:
        return " -> ".join(node.name if node.name is not None else f"<{node.describe()}>" for node in self)

    def __repr__(self) -> str:
        return f"Route({str(self)!r})"


class FoundRoutes(dict):
    """``{found node: route}`` (``get_paths``) or ``{found node: [routes]}`` (``get_all_paths``);
    prints one route a line, sorted, so a path patch can be read before it runs."""

    def __repr__(self) -> str:
        lines = []
        for routes in self.values():
            lines.extend(str(route) for route in (routes if isinstance(routes, list) else [routes]))
        return "\n".join(sorted(lines)) if lines else "(no routes: nothing found)"

    __str__ = __repr__


def get_paths(circuit: Circuit, matcher: Any) -> FoundRoutes:
    """For every node ``matcher`` finds, one shortest route by which it finds it.

    Breadth-first over the (node, state) pairs of a walk, so only routes along which the
    matcher actually finds the node count (an IterativeMatcher's restrictions apply).
    """
    check_node(circuit, "get_paths: the circuit to search", MatcherError)
    entries = walk(circuit, matcher)
    by_key = {entry.key: entry for entry in entries}
    root_key = entries[-1].key
    parent: dict = {root_key: None}
    first_found: dict[bytes, Any] = {}
    frontier = [root_key]
    while frontier:
        following = []
        for key in frontier:
            entry = by_key[key]
            if entry.found:
                first_found.setdefault(entry.node.hash, key)
            for child_key in entry.child_keys or ():
                if child_key is not None and child_key not in parent:
                    parent[child_key] = key
                    following.append(child_key)
        frontier = following
    routes = FoundRoutes()
    for key in first_found.values():
        nodes = []
        while key is not None:
            nodes.append(by_key[key].node)
            key = parent[key]
        routes[nodes[0]] = Route(reversed(nodes))
    return routes


def get_all_paths(circuit: Circuit, matcher: Any, *, limit: int | None = 1000) -> FoundRoutes:
    """For every node ``matcher`` finds, every route (distinct sequence of nodes) by which it
    finds it.

    A DAG can have exponentially many routes: past ``limit`` routes in all this raises
    ``MatcherError`` (``limit=None``: no bound).  Only subtrees where something is found are
    searched, so the work is at most the routes' total length.
    """
    check_node(circuit, "get_all_paths: the circuit to search", MatcherError)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise MatcherError(f"get_all_paths: limit {limit!r} is not None or an int >= 1")
    entries = walk(circuit, matcher)
    by_key = {entry.key: entry for entry in entries}
    leads_to_found: dict = {}
    for entry in entries:  # post-order: children first
        below = entry.child_keys or ()
        leads_to_found[entry.key] = entry.found or any(k is not None and leads_to_found[k] for k in below)
    routes = FoundRoutes()
    count = 0
    stack: list[tuple[Any, tuple | None]] = [(entries[-1].key, None)]
    while stack:
        key, above = stack.pop()
        entry = by_key[key]
        here = (entry.node, above)  # a linked list back to the root: no copying per step
        if entry.found:
            count += 1
            if limit is not None and count > limit:
                raise MatcherError(
                    f"get_all_paths({as_iterative(matcher)!r}): more than {limit} routes in "
                    f"{circuit.describe()}; pass a larger limit= (or limit=None), narrow the "
                    "matcher, or use get_paths for one route per node"
                )
            routes.setdefault(entry.node, []).append(_route_of(here))
        below = [k for k in dict.fromkeys(entry.child_keys or ()) if k is not None and leads_to_found[k]]
        stack.extend((child_key, here) for child_key in reversed(below))
    return routes


def _route_of(link: tuple | None) -> Route:
    nodes = []
    while link is not None:
        node, link = link
        nodes.append(node)
    return Route(reversed(nodes))


# ------------------------------------------------------------ where a node sits

_PATH_HEAD, _PATH_TAIL = 4, 8  # as evaluation's error_at cuts a long path


def shortest_paths(root: Circuit, targets: Iterable[Circuit]) -> dict[bytes, list[Circuit]]:
    """For each target (by hash), the nodes of a shortest path from ``root`` to it, root first.

    Breadth-first, iterative; stops once every target is reached.  A target not below ``root``
    gets no entry.
    """
    wanted = {node.hash for node in targets}
    parent: dict[bytes, Circuit | None] = {root.hash: None}
    frontier, remaining = [root], len(wanted - {root.hash})
    while frontier and remaining:
        following = []
        for node in frontier:
            for child in node.children:
                if child.hash not in parent:
                    parent[child.hash] = node
                    following.append(child)
                    remaining -= child.hash in wanted
        frontier = following
    paths = {}
    for node in targets:
        if node.hash not in parent:
            continue
        path = [node]
        while (above := parent[path[-1].hash]) is not None:
            path.append(above)
        paths[node.hash] = path[::-1]
    return paths


def describe_where(node: Circuit, path: Sequence[Circuit]) -> str:
    """``'layer 1, path t.loss > ... > b1.a > a.comb_v > a.attn_probs'``: how a message says where
    ``node`` sits, given a path to it (``shortest_paths``); long paths are cut in the middle."""
    shown = [p.name if p.name is not None else f"<{p.describe()}>" for p in path]
    if len(shown) > _PATH_HEAD + _PATH_TAIL + 1:
        skipped = len(shown) - _PATH_HEAD - _PATH_TAIL
        shown = shown[:_PATH_HEAD] + [f"... ({skipped} more) ..."] + shown[-_PATH_TAIL:]
    layer = layer_text(node, path)
    return (f"{layer}, " if layer else "") + f"path {' > '.join(shown)}"


def layer_text(node: Circuit, path: Sequence[Circuit] = ()) -> str:
    """``'layer 1'`` or ``'layer 1, head 2'`` (``'heads 0-3'``) where a registered naming
    convention tells which layer ``node`` belongs to, else ``''``.

    ``path`` is the node's path from the root, the node last; the placers of
    ``circuits.rewriting.hints`` read it (the transformer convention's rules:
    ``circuits.transformer.layer_hints.placement``).
    """
    placed = placement(node, path)
    if placed is None:
        return ""
    layer, heads = placed
    if heads is None:
        return f"layer {layer}"
    return f"layer {layer}, " + (f"head {heads[0]}" if heads[0] == heads[1] else "heads %d-%d" % heads)


def _close_names(circuit: Circuit, form: Any) -> list[str]:
    if not isinstance(form, str):
        return []
    names = {node.name for node in unique_nodes([circuit]) if node.name is not None}
    return difflib.get_close_matches(form, sorted(names), n=5, cutoff=0.6)
