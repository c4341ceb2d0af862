"""Hypothesis strategies shared by every property test: shapes, tensors, names, index items, circuits.

Everything here is safe at size-0 axes: a value is only drawn from a range
that is not empty (an int item only for an axis of size >= 1, a gen_index
position only below a non-empty axis), so no strategy fails by drawing
from nothing.

Circuits are built iteratively (leaves first, then ops that pick nodes
already in the pool whose shapes fit), so they share subtrees, reuse names
on distinct nodes, and never recurse.  Every node kind is drawn (Tags,
Scatters, Symbols with and without a uuid, Einsums with no operand or a
repeated output letter among them).  Each op's output shape is computed
here by hand and checked against the node.  ``evaluable=True`` builds
circuits that evaluate: float64 Arrays, Scalars from a few finite values, no
Symbols, only functions defined on every real (no exp, log, sqrt, rsqrt,
reciprocal, so no NaN from a domain), and gen_index indices that are int64
Arrays with positions in range.
"""

from __future__ import annotations

import math

import torch
from hypothesis import assume
from hypothesis import strategies as st

import circuits as cc

USER_SPEC = "tests.user-fn.double"
cc.register_function(cc.FunctionSpec(USER_SPEC, 1, lambda shapes: shapes[0], lambda x: 2 * x), replace=True)

DEFINED_EVERYWHERE = ["gelu", "gelu_new", "relu", "silu", "sigmoid", "tanh", "sin", "cos", "abs", USER_SPEC]
ELEMENTWISE = DEFINED_EVERYWHERE + ["rsqrt", "reciprocal", "exp", "log", "sqrt"]
LAST_AXIS = ["softmax", "log_softmax", "last_dim_size"]
DTYPES = [torch.float32, torch.float64, torch.int64, torch.float16]
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
AXIS_NAMES = ["a", "b", "c", "d", "h", "w", "x1", "y_2", "head", "Q"]
MAX_POOL_RANK = 6  # ops add at most one axis to a pool node, so Rearrange patterns fit in AXIS_NAMES

# Characters a printer or parser could get wrong, and a small pool of whole names so
# that distinct nodes often share one.  '' is a name (distinct from None).
AWKWARD_CHARS = ["\r", "\n", "'", '"', "\\", "#", " ", "\t", "\x00"]
NAME_POOL = [
    "",
    "x",
    "\r",
    "\n",
    "\r\n",
    "'",
    '"',
    "\\",
    "#",
    " ",
    "it's",
    "back\\slash",
    "#hash",
    "two words",
    "line\nbreak",
    "cr\rlf\r\n",
    "naïve",
    "中文",
    "🙂",
    "''",
    "\\'",
    "\\n",
    "\\r",
    "a # b",
    " lead",
    "trail ",
    "ln.mean_subbed",
]


# ------------------------------------------------------------------ small values

seeds = st.integers(0, 2**31 - 1)


def sizes(min_size: int = 0, max_size: int = 4) -> st.SearchStrategy[int]:
    """An axis size; when 0 is allowed, about half the draws are 0."""
    return (
        st.one_of(st.just(0), st.integers(1, max_size)) if min_size == 0 else st.integers(min_size, max_size)
    )


def shapes(min_rank: int = 0, max_rank: int = 3, min_size: int = 0, max_size: int = 4):
    """A shape tuple, size-0 axes included unless ``min_size`` >= 1."""
    return st.lists(sizes(min_size, max_size), min_size=min_rank, max_size=max_rank).map(tuple)


def names(allow_none: bool = True) -> st.SearchStrategy[str | None]:
    """A node name: any Unicode but lone surrogates (category Cs), with the awkward cases drawn often."""
    chars = st.one_of(st.sampled_from(AWKWARD_CHARS), st.characters(exclude_categories=["Cs"]))
    text = st.one_of(st.sampled_from(NAME_POOL), st.text(chars, max_size=6))
    return st.one_of(st.none(), text) if allow_none else text


NAMES = names()


def seeded_tensor(shape, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Standard normal values from a seeded generator (so examples shrink and replay), cast to dtype."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float64).to(dtype)


@st.composite
def tensors(draw, shape=None, dtype=None) -> torch.Tensor:
    """A tensor of ``shape`` (drawn by ``shapes()`` if None) and ``dtype`` (drawn from DTYPES if None)."""
    shape = draw(shapes()) if shape is None else tuple(shape)
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    return seeded_tensor(shape, draw(seeds), dtype)


@st.composite
def index_items(draw, shape, lists: bool = False) -> tuple:
    """Items for ``cc.Index`` on a node of ``shape``: one per leading axis (zero to all of them).

    Each is an int (only for a non-empty axis), a slice with ``None`` or in-range bounds that
    selects start <= stop, or an int64 tensor of in-range positions (possibly empty; a plain
    list instead when ``lists``).  Ints and tensor positions may be negative.
    """
    items = []
    for size in shape[: draw(st.integers(0, len(shape)))]:
        kind = draw(st.sampled_from(["slice", "tensor", "int"] if size else ["slice", "tensor"]))
        if kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-size, size))
            start, stop = draw(bound), draw(bound)
            if _position(start, size, 0) > _position(stop, size, size):
                start, stop = stop, start
            items.append(slice(start, stop))
        else:
            values = draw(st.lists(st.integers(-size, size - 1), max_size=3)) if size else []
            items.append(values if lists and draw(st.booleans()) else torch.tensor(values, dtype=torch.int64))
    return tuple(items)


def _position(bound, size, default):
    return default if bound is None else bound + size if bound < 0 else bound


def index_shape(shape, items) -> tuple:
    """The shape ``cc.Index`` must give, written out here: ints drop their axis."""
    out = []
    for size, item in zip(shape, items):
        if isinstance(item, slice):
            out.append(_position(item.stop, size, size) - _position(item.start, size, 0))
        elif not isinstance(item, int):
            out.append(len(item))
    return tuple(out) + tuple(shape[len(items) :])


def broadcast(a: tuple, b: tuple) -> tuple | None:
    """numpy broadcasting written out, or None when a and b do not broadcast."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + a
    b = (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


# ------------------------------------------------------------------ circuits


class _Builder:
    """One circuit draw: the hypothesis ``draw``, the options, and an op per node kind."""

    def __init__(self, draw, evaluable: bool):
        self.draw, self.evaluable = draw, evaluable

    def name(self):
        return self.draw(NAMES)

    def pick(self, nodes):
        """One of ``nodes``, favouring the most recent, so that DAGs grow deep."""
        back = self.draw(st.one_of(st.just(0), st.just(0), st.integers(0, len(nodes) - 1)))
        return nodes[-1 - back]

    def leaf(self):
        draw = self.draw
        kind = draw(st.sampled_from(["Array", "Scalar"] if self.evaluable else ["Array", "Scalar", "Symbol"]))
        shape = draw(shapes())
        if kind == "Array":
            node = cc.Array(draw(tensors(shape, torch.float64 if self.evaluable else None)), name=self.name())
        elif kind == "Scalar":
            special = st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-5, -10000.0, 0.1, 1 / 3, 2.5])
            value = draw(special if self.evaluable else st.one_of(special, st.floats()))
            node = cc.Scalar(value, shape=shape, name=self.name())
        else:
            uuid = draw(st.one_of(st.none(), st.none(), st.uuids()))
            node = cc.Symbol(shape, name=self.name(), uuid=uuid)
            assert node.uuid == (None if uuid is None or uuid.int == 0 else uuid)
        assert node.shape == shape
        return node

    def einsum(self, pool):
        """Operands' letters drawn to fit their sizes; sometimes no operand (the empty product,
        rank 0) or an output letter repeated (a diagonal embedding)."""
        draw = self.draw
        operands = [self.pick(pool) for _ in range(draw(st.sampled_from([0, 1, 1, 2, 2, 3])))]
        letter_size: dict[str, int] = {}
        all_axes = []
        for operand in operands:
            axes = ""
            for size in operand.shape:
                fitting = [letter for letter, s in letter_size.items() if s == size]
                choice = draw(st.sampled_from(fitting + (["new"] if len(letter_size) < len(LETTERS) else [])))
                if choice == "new":
                    choice = LETTERS[len(letter_size)]
                    letter_size[choice] = size
                axes += choice
            all_axes.append(axes)
        perm = draw(st.permutations(sorted(letter_size)))
        out = "".join(perm[: draw(st.integers(0, len(perm)))])
        if out and draw(st.integers(0, 4)) == 0:
            repeated = draw(st.sampled_from(out))
            at = draw(st.integers(0, len(out)))
            out = out[:at] + repeated + out[at:]
        if draw(st.booleans()):
            node = cc.Einsum.from_einsum_string(",".join(all_axes) + "->" + out, *operands, name=self.name())
        else:
            as_ints = draw(st.booleans())
            args = [(o, [LETTERS.index(x) for x in a] if as_ints else a) for o, a in zip(operands, all_axes)]
            node = cc.Einsum(*args, out_axes=out, name=self.name())
        assert node.shape == tuple(letter_size[x] for x in out)
        return node

    def add(self, pool):
        operands, shape = [], ()
        for _ in range(self.draw(st.sampled_from([0, 1, 2, 2, 3]))):
            operand = self.pick([n for n in pool if broadcast(shape, n.shape) is not None])
            shape = broadcast(shape, operand.shape)
            operands.append(operand)
        node = cc.Add(*operands, name=self.name())
        assert node.shape == shape
        return node

    def function(self, pool):
        draw = self.draw
        family = draw(st.sampled_from(["elementwise", "last_axis", "gen_index"]))
        ranked = [n for n in pool if n.rank >= 1]
        if family == "elementwise" or not ranked:
            x = self.pick(pool)
            spec = draw(st.sampled_from(DEFINED_EVERYWHERE if self.evaluable else ELEMENTWISE))
            node = cc.GeneralFunction.new_by_name(x, spec_name=spec, name=self.name())
            assert node.shape == x.shape
            return node
        x = self.pick(ranked)
        if family == "last_axis":
            spec = draw(st.sampled_from(LAST_AXIS))
            node = cc.GeneralFunction(x, spec=spec, name=self.name())
            assert node.shape == (x.shape[:-1] if spec == "last_dim_size" else x.shape)
            return node
        return self.gen_index(x, pool)

    def gen_index(self, x, pool):
        """gen_index_at_D[_batch_x][_no_batch_index][_c], shapes as docs/format.md states them."""
        draw = self.draw
        batch_x, no_batch_index, checked = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
        if self.evaluable:
            index = self.index_array(x, batch_x, no_batch_index)
        else:
            if batch_x and not no_batch_index:
                # the index's shape equals x's leading axes, and x keeps at least one more axis
                candidates = [i for i in pool if i.rank < x.rank and x.shape[: i.rank] == i.shape]
            elif batch_x:
                # index = batch axes + one looked-up axis; x = batch axes + at least one more
                candidates = [
                    i for i in pool if 1 <= i.rank <= x.rank and x.shape[: i.rank - 1] == i.shape[:-1]
                ]
            else:
                candidates = pool
            if not candidates:
                batch_x, candidates = False, pool
            index = self.pick(candidates)
        batch_rank = 0 if not batch_x else index.rank - 1 if no_batch_index else index.rank
        rest = x.shape[batch_rank:]
        if self.evaluable and math.prod(index.shape):  # looked-up positions exist: look up a non-empty axis
            dims = [d for d, size in enumerate(rest) if size]
            assume(dims)
            d = draw(st.sampled_from(dims))
            dim = d - len(rest) if draw(st.booleans()) else d
            index = cc.Array(torch.remainder(index.value, rest[d]), name=index.name)
        else:
            dim = draw(st.integers(-len(rest), len(rest) - 1))
            d = dim % len(rest)
        batch, looked_up = x.shape[:batch_rank], index.shape[batch_rank:]
        if no_batch_index:
            expected = batch + rest[:d] + looked_up + rest[d + 1 :]
        else:
            expected = batch + looked_up + rest[:d] + rest[d + 1 :]
        spec = (
            f"gen_index_at_{dim}"
            + ("_batch_x" if batch_x else "")
            + ("_no_batch_index" if no_batch_index else "")
            + ("_c" if checked else "")
        )
        node = cc.GeneralFunction(x, index, spec=spec, name=self.name())
        assert node.shape == expected, (spec, x.shape, index.shape)
        return node

    def index_array(self, x, batch_x, no_batch_index):
        """A fresh int64 Array fitting x (its positions are brought in range once the axis is known)."""
        if batch_x:
            batch = x.shape[: self.draw(st.integers(0, x.rank - 1))]
            shape = batch + ((self.draw(sizes()),) if no_batch_index else ())
        else:
            shape = self.draw(shapes(max_rank=2))
        values = torch.randint(0, 2**16, shape, generator=torch.Generator().manual_seed(self.draw(seeds)))
        return cc.Array(values, name=self.name())

    def index(self, pool):
        x = self.pick(pool)
        items = self.draw(index_items(x.shape, lists=True))
        index = items[0] if len(items) == 1 and self.draw(st.booleans()) else items
        node = cc.Index(x, index, name=self.name())
        assert node.shape == index_shape(x.shape, items), (x.shape, index)
        return node

    def rearrange(self, pool):
        draw = self.draw
        x = self.pick(pool)
        axes = list(draw(st.permutations(AXIS_NAMES)))[: x.rank]
        kinds = ["permute", "new_axis"]
        if x.rank >= 2:
            kinds.append("merge")
        if any(s >= 1 for s in x.shape):
            kinds.append("split")
        if x.rank >= 1:
            kinds.append("ellipsis")
        kind = draw(st.sampled_from(kinds))
        new_sizes: dict[str, int] = {}
        left = list(axes)
        if kind == "permute":
            right = list(draw(st.permutations(axes)))
            expected = tuple(x.shape[axes.index(a)] for a in right)
        elif kind == "new_axis":
            new_sizes["n_new"] = draw(sizes(1, 3))
            at = draw(st.integers(0, len(axes)))
            right = axes[:at] + ["n_new"] + axes[at:]
            expected = x.shape[:at] + (new_sizes["n_new"],) + x.shape[at:]
        elif kind == "merge":
            i = draw(st.integers(0, x.rank - 2))
            right = axes[:i] + [f"({axes[i]} {axes[i + 1]})"] + axes[i + 2 :]
            expected = x.shape[:i] + (x.shape[i] * x.shape[i + 1],) + x.shape[i + 2 :]
        elif kind == "split":
            i = draw(st.sampled_from([j for j, s in enumerate(x.shape) if s >= 1]))
            size = x.shape[i]
            factor = draw(st.sampled_from([f for f in range(1, size + 1) if size % f == 0]))
            outer, inner = axes[i] + "o", axes[i] + "i"
            new_sizes[outer] = factor
            left = axes[:i] + [f"({outer} {inner})"] + axes[i + 1 :]
            right = axes[:i] + [outer, inner] + axes[i + 1 :]
            expected = x.shape[:i] + (factor, size // factor) + x.shape[i + 1 :]
        else:  # ellipsis: move the last axis first
            left, right = ["...", axes[-1]], [axes[-1], "..."]
            expected = (x.shape[-1],) + x.shape[:-1]
        pattern = " ".join(left) + draw(st.sampled_from([" -> ", "->", "  ->   "])) + " ".join(right)
        node = cc.Rearrange(x, pattern, name=self.name(), **new_sizes)
        assert node.shape == expected, (pattern, x.shape)
        return node

    def concat(self, pool):
        ranked = [n for n in pool if n.rank >= 1]
        if not ranked:
            return self.add(pool)
        x = self.pick(ranked)
        axis = self.draw(st.integers(-x.rank, x.rank - 1))
        a = axis % x.rank
        fitting = [
            n
            for n in ranked
            if n.rank == x.rank and n.shape[:a] + n.shape[a + 1 :] == x.shape[:a] + x.shape[a + 1 :]
        ]
        others = [self.pick(fitting) for _ in range(self.draw(st.integers(0, 2)))]
        node = cc.Concat(x, *others, axis=axis, name=self.name())
        total = x.shape[a] + sum(n.shape[a] for n in others)
        assert node.shape == x.shape[:a] + (total,) + x.shape[a + 1 :]
        return node

    def identity(self, pool):
        """A node that leaves its child's value alone: a full Index, a same-order Rearrange, one operand."""
        x = self.pick(pool)
        kind = self.draw(st.sampled_from(["Index", "Rearrange", "Add", "Einsum"]))
        if kind == "Index":
            node = cc.Index(x, (slice(None),) * self.draw(st.integers(0, x.rank)), name=self.name())
        elif kind == "Rearrange":
            axes = " ".join(AXIS_NAMES[: x.rank])
            node = cc.Rearrange(x, f"{axes} -> {axes}", name=self.name())
        elif kind == "Add":
            node = cc.Add(x, name=self.name())
        else:
            node = cc.Einsum.from_einsum_string(
                f"{LETTERS[: x.rank]}->{LETTERS[: x.rank]}", x, name=self.name()
            )
        assert node.shape == x.shape
        return node

    def tag(self, pool):
        """A Tag: its child's shape, under a drawn uuid."""
        x = self.pick(pool)
        uuid = self.draw(st.uuids())
        node = cc.Tag(x, uuid, name=self.name())
        assert node.shape == x.shape and node.uuid == uuid
        return node

    def scatter(self, pool):
        """A Scatter: its child padded with zeros on either side of each axis, the slices spelled
        every way rust_circuit's index reads (None, negative, fewer items than axes)."""
        draw = self.draw
        x = self.pick(pool)
        before = [draw(sizes(0, 2)) for _ in x.shape]
        shape = tuple(b + size + draw(sizes(0, 2)) for b, size in zip(before, x.shape))
        items = []
        for start, size, total in zip(before, x.shape, shape):
            stop = start + size
            starts = [start] + ([None] if start == 0 else []) + ([start - total] if start < total else [])
            stops = [stop] + ([None] if stop == total else []) + ([stop - total] if stop < total else [])
            items.append(slice(draw(st.sampled_from(starts)), draw(st.sampled_from(stops))))
        while (
            items
            and range(shape[len(items) - 1])[items[-1]] == range(shape[len(items) - 1])
            and draw(st.booleans())
        ):
            items.pop()  # a trailing full slice may be left out
        node = cc.Scatter(x, tuple(items), shape, name=self.name())
        assert node.shape == shape
        assert node.index == tuple(slice(b, b + size) for b, size in zip(before, x.shape))
        return node

    def twin(self, pool):
        """An equal node built again (a different object): must print as a repeat."""
        node = self.pick(pool)
        twin = node.evolve()
        assert twin is not node and twin == node
        return twin

    def rename(self, pool):
        """The same structure under another name: a distinct node, often with a shared name."""
        return self.pick(pool).rename(self.name())


OPS = (
    "einsum",
    "add",
    "function",
    "index",
    "rearrange",
    "concat",
    "identity",
    "twin",
    "rename",
    "tag",
    "scatter",
)


@st.composite
def dags(draw, evaluable: bool = False, max_ops: int = 14) -> list[cc.Circuit]:
    """A pool of nodes of every type: 1-4 leaves, then ops over nodes already in the pool."""
    build = _Builder(draw, evaluable)
    pool = [build.leaf() for _ in range(draw(st.integers(1, 4)))]
    for _ in range(draw(st.integers(2, max_ops))):
        node = getattr(build, draw(st.sampled_from(OPS)))(pool)
        if node.rank <= MAX_POOL_RANK:  # keeps Rearrange within AXIS_NAMES
            pool.append(node)
    return pool


def gather_all(pool) -> cc.Circuit:
    """One root holding the whole pool: every node summed to rank 0, then added."""
    return cc.Add(*[cc.Einsum.from_einsum_string(LETTERS[: n.rank] + "->", n) for n in pool], name="all")


@st.composite
def random_circuits(draw, evaluable: bool = False, max_ops: int = 14) -> cc.Circuit:
    """A random circuit: the last node of a ``dags`` pool, or one root over the whole pool."""
    pool = draw(dags(evaluable, max_ops))
    return gather_all(pool) if draw(st.booleans()) else pool[-1]


@st.composite
def root_lists(draw, evaluable: bool = False, max_ops: int = 14) -> list[cc.Circuit]:
    """One to four roots over one pool (so they share nodes), for ``repr_many`` and ``evaluate_many``."""
    pool = draw(dags(evaluable, max_ops))
    build = _Builder(draw, evaluable)
    first = gather_all(pool) if draw(st.booleans()) else pool[-1]
    return [first] + [build.pick(pool) for _ in range(draw(st.integers(0, 3)))]


@st.composite
def indexed_circuits(draw, evaluable: bool = True) -> cc.Index:
    """A random circuit with a random ``cc.Index`` on top (tensor items as tensors)."""
    top = draw(random_circuits(evaluable))
    return cc.Index(top, draw(index_items(top.shape)), name=draw(names()))
