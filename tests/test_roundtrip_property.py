"""Property tests: random circuits of every node type print and read back.

The strategy builds a DAG iteratively (leaves first, then ops that pick
existing nodes whose shapes fit), so it shares subtrees, reuses names on
distinct nodes, and never recurses.  Every op's output shape is computed
here by hand and checked against the node; the printed text is checked
line by line against FORMAT.md's rules with a tokenizer written in this
file; and parsed circuits are compared with an independent structural
walk as well as with ``==``.
"""

from __future__ import annotations

import math
import re

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as cc

USER_SPEC = "test_rt.user-fn.double"
cc.register_function(
    cc.FunctionSpec(USER_SPEC, 1, lambda shapes: shapes[0], lambda x: 2 * x), replace=True
)

ELEMENTWISE = [
    "rsqrt", "reciprocal", "gelu", "gelu_new", "relu", "silu", "sigmoid", "tanh",
    "exp", "log", "sqrt", "sin", "cos", "abs", USER_SPEC,
]
LAST_AXIS_SAME = ["softmax", "log_softmax"]
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
AXIS_NAMES = ["a", "b", "c", "d", "h", "w", "x1", "y_2", "head", "Q"]
MAX_POOL_RANK = 6  # ops add at most one axis to a pool node, so patterns fit in AXIS_NAMES

# A small pool so that distinct nodes often share a name.
NAME_POOL = [
    "x", "it's", "back\\slash", "#hash", "two words", "line\nbreak", "naïve", "中文",
    "''", "\\'", "", "ln.mean_subbed", " lead", "trail ", "a # b", "\\n", "🙂",
]
names = st.one_of(
    st.none(),
    st.sampled_from(NAME_POOL),
    st.text(max_size=6),  # any character but surrogates: quotes, \n, \r, \x00, ...
)
sizes = st.one_of(st.integers(1, 4), st.just(0))
shapes = st.lists(sizes, max_size=3).map(tuple)


def pick(draw, nodes):
    """One of ``nodes``, favouring the most recent, so that DAGs grow deep."""
    back = draw(st.one_of(st.just(0), st.just(0), st.integers(0, len(nodes) - 1)))
    return nodes[-1 - back]


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


# ----------------------------------------------------------------- the builder


@st.composite
def leaf(draw):
    kind = draw(st.sampled_from(["Array", "Scalar", "Symbol"]))
    shape = draw(shapes)
    name = draw(names)
    if kind == "Array":
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.float16]))
        seed = draw(st.integers(0, 3))
        gen = torch.Generator().manual_seed(seed)
        tensor = (torch.randn(shape, generator=gen) * 3).to(dtype)
        node = cc.Array(tensor, name=name)
    elif kind == "Scalar":
        value = draw(
            st.one_of(
                st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-5, -10000.0, 0.1, 1 / 3]),
                st.floats(allow_nan=True, allow_infinity=True),
            )
        )
        node = cc.Scalar(value, shape=shape, name=name)
    else:
        node = cc.Symbol(shape, name=name)
    assert node.shape == shape
    return node


def op_einsum(draw, pool):
    count = draw(st.integers(1, 3))
    operands = [pick(draw, pool) for _ in range(count)]
    letter_size: dict[str, int] = {}
    all_axes = []
    for operand in operands:
        axes = ""
        for size in operand.shape:
            fitting = [l for l, s in letter_size.items() if s == size]
            choices = fitting + (["new"] if len(letter_size) < len(LETTERS) else [])
            choice = draw(st.sampled_from(choices))
            if choice == "new":
                choice = LETTERS[len(letter_size)]
                letter_size[choice] = size
            axes += choice
        all_axes.append(axes)
    perm = draw(st.permutations(sorted(letter_size)))
    out = "".join(perm[: draw(st.integers(0, len(perm)))])
    name = draw(names)
    if draw(st.booleans()):
        node = cc.Einsum.from_einsum_string(",".join(all_axes) + "->" + out, *operands, name=name)
    else:
        as_ints = draw(st.booleans())
        args = [(o, [LETTERS.index(l) for l in a] if as_ints else a) for o, a in zip(operands, all_axes)]
        node = cc.Einsum(*args, out_axes=out, name=name)
    assert node.shape == tuple(letter_size[l] for l in out)
    return node


def op_add(draw, pool):
    count = draw(st.sampled_from([0, 1, 2, 2, 3]))
    operands, shape = [], ()
    for _ in range(count):
        fitting = [n for n in pool if broadcast(shape, n.shape) is not None]
        operand = pick(draw, fitting)
        shape = broadcast(shape, operand.shape)
        operands.append(operand)
    node = cc.Add(*operands, name=draw(names))
    assert node.shape == shape
    return node


def op_function(draw, pool):
    family = draw(st.sampled_from(["elementwise", "last_axis", "gen_index"]))
    name = draw(names)
    ranked = [n for n in pool if n.rank >= 1]
    if family == "elementwise" or not ranked:
        x = pick(draw, pool)
        node = cc.GeneralFunction.new_by_name(x, spec_name=draw(st.sampled_from(ELEMENTWISE)), name=name)
        assert node.shape == x.shape
        return node
    x = pick(draw, ranked)
    if family == "last_axis":
        spec = draw(st.sampled_from(LAST_AXIS_SAME + ["last_dim_size"]))
        node = cc.GeneralFunction(x, spec=spec, name=name)
        assert node.shape == (x.shape[:-1] if spec == "last_dim_size" else x.shape)
        return node
    # gen_index_at_D[_batch_x][_no_batch_index][_c], shapes as FORMAT.md states them
    batch_x = draw(st.booleans())
    no_batch_index = draw(st.booleans())
    check = "_c" if draw(st.booleans()) else ""
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
    index = pick(draw, candidates)
    batch_rank = 0
    if batch_x:
        batch_rank = index.rank if not no_batch_index else index.rank - 1
    rest = x.shape[batch_rank:]
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
        + check
    )
    node = cc.GeneralFunction(x, index, spec=spec, name=name)
    assert node.shape == expected, (spec, x.shape, index.shape)
    return node


def op_index(draw, pool):
    x = pick(draw, pool)
    count = draw(st.integers(0, x.rank))
    items, expected = [], []
    for size in x.shape[:count]:
        kinds = ["slice", "tensor"] + (["int"] if size > 0 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-size, size))
            start, stop = draw(bound), draw(bound)
            begin = 0 if start is None else start + size if start < 0 else start
            end = size if stop is None else stop + size if stop < 0 else stop
            if end < begin:
                start, stop = stop, start
                begin, end = end, begin
            items.append(slice(start, stop))
            expected.append(end - begin)
        else:
            values = draw(st.lists(st.integers(-size, size - 1), max_size=3)) if size else []
            items.append(torch.tensor(values, dtype=torch.int64) if draw(st.booleans()) else values)
            expected.append(len(values))
    expected.extend(x.shape[count:])
    index = items[0] if count == 1 and draw(st.booleans()) else tuple(items)
    node = cc.Index(x, index, name=draw(names))
    assert node.shape == tuple(expected), (x.shape, index)
    return node


def op_rearrange(draw, pool):
    x = pick(draw, pool)
    axes = list(draw(st.permutations(AXIS_NAMES)))[: x.rank]
    kinds = ["permute", "new_axis"]
    if x.rank >= 2:
        kinds.append("merge")
    if any(s >= 1 for s in x.shape):
        kinds.append("split")
    if x.rank >= 1:
        kinds.append("ellipsis")
    kind = draw(st.sampled_from(kinds))
    sizes: dict[str, int] = {}
    left = list(axes)
    if kind == "permute":
        right = list(draw(st.permutations(axes)))
        expected = tuple(x.shape[axes.index(a)] for a in right)
    elif kind == "new_axis":
        new = "n_new"
        sizes[new] = draw(st.integers(1, 3))
        at = draw(st.integers(0, len(axes)))
        right = axes[:at] + [new] + axes[at:]
        expected = x.shape[:at] + (sizes[new],) + x.shape[at:]
    elif kind == "merge":
        i = draw(st.integers(0, x.rank - 2))
        right = axes[:i] + [f"({axes[i]} {axes[i + 1]})"] + axes[i + 2 :]
        expected = x.shape[:i] + (x.shape[i] * x.shape[i + 1],) + x.shape[i + 2 :]
    elif kind == "split":
        i = draw(st.sampled_from([j for j, s in enumerate(x.shape) if s >= 1]))
        size = x.shape[i]
        factor = draw(st.sampled_from([f for f in range(1, size + 1) if size % f == 0]))
        outer, inner = axes[i] + "o", axes[i] + "i"
        sizes[outer] = factor
        left = axes[:i] + [f"({outer} {inner})"] + axes[i + 1 :]
        right = axes[:i] + [outer, inner] + axes[i + 1 :]
        expected = x.shape[:i] + (factor, size // factor) + x.shape[i + 1 :]
    else:  # ellipsis: move the last axis first
        left, right = ["...", axes[-1]], [axes[-1], "..."]
        expected = (x.shape[-1],) + x.shape[:-1]
    sep = draw(st.sampled_from([" -> ", "->", "  ->   "]))
    pattern = " ".join(left) + sep + " ".join(right)
    node = cc.Rearrange(x, pattern, name=draw(names), **sizes)
    assert node.shape == expected, (pattern, x.shape)
    return node


def op_concat(draw, pool):
    ranked = [n for n in pool if n.rank >= 1]
    if not ranked:
        return op_add(draw, pool)
    x = pick(draw, ranked)
    axis = draw(st.integers(-x.rank, x.rank - 1))
    a = axis % x.rank
    fitting = [
        n for n in ranked
        if n.rank == x.rank and all(p == q for j, (p, q) in enumerate(zip(n.shape, x.shape)) if j != a)
    ]
    others = [pick(draw, fitting) for _ in range(draw(st.integers(0, 2)))]
    node = cc.Concat(x, *others, axis=axis, name=draw(names))
    total = x.shape[a] + sum(n.shape[a] for n in others)
    assert node.shape == x.shape[:a] + (total,) + x.shape[a + 1 :]
    return node


def op_twin(draw, pool):
    """An equal node built again (a different object): must print as a repeat."""
    node = pick(draw, pool)
    twin = node.evolve()
    assert twin is not node and twin == node
    return twin


def op_rename(draw, pool):
    """The same structure under another name: a distinct node, often with a shared name."""
    return pick(draw, pool).rename(draw(names))


OPS = {
    "Einsum": op_einsum,
    "Add": op_add,
    "GeneralFunction": op_function,
    "Index": op_index,
    "Rearrange": op_rearrange,
    "Concat": op_concat,
    "twin": op_twin,
    "rename": op_rename,
}


@st.composite
def dags(draw, max_ops=14):
    """A pool of nodes: leaves, then ops over nodes already in the pool."""
    pool = [draw(leaf()) for _ in range(draw(st.integers(1, 4)))]
    for _ in range(draw(st.integers(2, max_ops))):
        node = OPS[draw(st.sampled_from(sorted(OPS)))](draw, pool)
        if node.rank <= MAX_POOL_RANK:  # keeps Rearrange within AXIS_NAMES
            pool.append(node)
    return pool


def gather_all(pool):
    """One root holding the whole pool: every node summed to rank 0, then added."""
    totals = [cc.Einsum.from_einsum_string(LETTERS[: n.rank] + "->", n) for n in pool]
    return cc.Add(*totals, name="all")


@st.composite
def circuits_(draw):
    pool = draw(dags())
    return gather_all(pool) if draw(st.booleans()) else pool[-1]


@st.composite
def root_lists(draw):
    pool = draw(dags())
    count = draw(st.integers(1, 4))
    first = gather_all(pool) if draw(st.booleans()) else pool[-1]
    return [first] + [pick(draw, pool) for _ in range(count - 1)]


# ------------------------------------------------- independent structure checks


def own_fields(node):
    """What distinguishes a node besides its name, shape and children."""
    if isinstance(node, cc.Array):
        return node.content_hash[:24]
    if isinstance(node, cc.Scalar):
        v = node.value
        return ("nan",) if math.isnan(v) else (v, math.copysign(1.0, v))
    if isinstance(node, cc.Einsum):
        return (node.operand_axes, node.out_axes)
    if isinstance(node, cc.GeneralFunction):
        return node.spec.name
    if isinstance(node, cc.Index):
        out = []
        for item in node.index:
            if isinstance(item, slice):
                out.append(("slice", item.start, item.stop))
            elif isinstance(item, torch.Tensor):
                out.append(("tensor", tuple(item.tolist())))
            else:
                out.append(("int", int(item)))
        return tuple(out)
    if isinstance(node, cc.Rearrange):
        return (node.pattern, node.sizes)
    if isinstance(node, cc.Concat):
        return node.axis
    return None


def structural_keys(roots):
    """A key per node, built bottom-up here (not from node.hash), memoized by id."""
    keys: dict[int, tuple] = {}
    stack = [(r, False) for r in roots]
    while stack:
        node, ready = stack.pop()
        if id(node) in keys:
            continue
        if not ready:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children)
            continue
        keys[id(node)] = (
            type(node).__name__,
            node.name,
            tuple(node.shape),
            own_fields(node),
            tuple(keys[id(c)] for c in node.children),
        )
    return keys


def assert_same_structure(a_roots, b_roots):
    ka, kb = structural_keys(a_roots), structural_keys(b_roots)
    assert [ka[id(r)] for r in a_roots] == [kb[id(r)] for r in b_roots]


_REF = re.compile(
    r"^(?P<indent> *)(?:(?P<serial_named>\d+) '(?P<name_s>(?:[^'\\]|\\.)*)'"
    r"|'(?P<name>(?:[^'\\]|\\.)*)'|(?P<serial>\d+))(?P<rest> .*)?$"
)
_UNESCAPE = {"\\\\": "\\", "\\'": "'", "\\n": "\n"}


def unescape(text: str) -> str:
    return re.sub(r"\\.", lambda m: _UNESCAPE[m.group()], text)


def check_text_against_format(roots, text, shapes=False, serials=False):
    """Walk the roots as FORMAT.md describes and compare with the text line by line."""
    keys = structural_keys(roots)
    names_of = {}
    for node_key in set(keys.values()):
        if node_key[1] is not None:
            names_of.setdefault(node_key[1], set()).add(node_key)
    lines = text.split("\n")
    assert not text.endswith("\n")
    written: dict[tuple, str] = {}
    next_serial = 0
    stack = [(r, 0) for r in reversed(roots)]
    position = 0
    while stack:
        node, depth = stack.pop()
        line = lines[position]
        position += 1
        match = _REF.match(line)
        assert match, line
        assert len(match["indent"]) == 2 * depth, line
        serial = match["serial_named"] or match["serial"]
        name = match["name_s"] if match["name_s"] is not None else match["name"]
        reference = line[len(match["indent"]) : len(line) - len(match["rest"] or "")]
        key = keys[id(node)]
        if key in written:
            assert match["rest"] is None, f"repeat written in full: {line!r}"
            assert reference == written[key]
            continue
        written[key] = reference
        assert (None if name is None else unescape(name)) == node.name
        needs_serial = node.name is None or serials or len(names_of[node.name]) > 1
        if needs_serial:
            assert serial is not None and int(serial) == next_serial, line
            next_serial += 1
        else:
            assert serial is None, line
        rest = match["rest"]
        assert rest is not None, line
        rest = rest[1:]
        shape_text = "[" + ",".join(str(s) for s in node.shape) + "]"
        if shapes or isinstance(node, (cc.Array, cc.Scalar, cc.Symbol, cc.Index)):
            assert rest.startswith(shape_text + " "), line
            rest = rest[len(shape_text) + 1 :]
        variant, _, extra = rest.partition(" ")
        assert variant == type(node).__name__
        if isinstance(node, cc.Array):
            assert re.fullmatch(r"[0-9a-f]{24}", extra)
        elif isinstance(node, cc.Einsum):
            operands = ["".join(LETTERS[i] for i in ax) for ax in node.operand_axes]
            assert extra == ",".join(operands) + "->" + "".join(LETTERS[i] for i in node.out_axes)
        elif isinstance(node, cc.GeneralFunction):
            assert extra == node.spec.name
        elif isinstance(node, cc.Concat):
            assert extra == str(node.axis)
        elif isinstance(node, (cc.Symbol, cc.Add)):
            assert extra == ""
        stack.extend((c, depth + 1) for c in reversed(node.children))
    assert position == len(lines)
    assert len(written) == len(set(keys.values()))


# ------------------------------------------------------------------ properties

SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SETTINGS
@given(circuits_())
def test_parse_of_repr_is_equal_and_reprints_identically(circuit):
    text = circuit.repr()
    check_text_against_format([circuit], text)
    parsed = cc.parse(text)
    assert parsed == circuit
    assert hash(parsed) == hash(circuit)
    assert_same_structure([parsed], [circuit])
    assert parsed.repr() == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(circuits_(), st.booleans(), st.booleans())
def test_round_trip_with_shapes_and_serials(circuit, shapes, serials):
    text = circuit.repr(shapes=shapes, serials=serials)
    check_text_against_format([circuit], text, shapes=shapes, serials=serials)
    parsed = cc.parse(text)
    assert parsed == circuit
    assert_same_structure([parsed], [circuit])
    assert parsed.repr(shapes=shapes, serials=serials) == text
    # the options change the text only, not what it reads back to
    assert parsed.repr() == circuit.repr()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(root_lists(), st.booleans(), st.booleans())
def test_several_roots_round_trip(roots, shapes, serials):
    text = cc.repr_many(roots, shapes=shapes, serials=serials)
    check_text_against_format(roots, text, shapes=shapes, serials=serials)
    parsed = cc.parse_many(text)
    assert parsed == roots
    assert_same_structure(parsed, roots)
    assert cc.repr_many(parsed, shapes=shapes, serials=serials) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_separately_built_equal_circuits_are_equal(pool):
    """Rebuilding every node of a DAG bottom-up from its parts gives equal nodes."""
    rebuilt: dict[int, cc.Circuit] = {}
    for node in pool:
        for n in cc.postorder([node]):
            if id(n) in rebuilt:
                continue
            children = tuple(rebuilt[id(c)] for c in n.children)
            copy = n.evolve(children=children) if n.children else n.evolve()
            assert copy is not n
            rebuilt[id(n)] = copy
    for node in pool:
        assert rebuilt[id(node)] == node
        assert hash(rebuilt[id(node)]) == hash(node)
        assert rebuilt[id(node)].repr() == node.repr()


def test_every_node_type_and_awkward_names_in_one_circuit():
    """A hand-built circuit covering each variant, checked against text written by hand."""
    emb = cc.Array(torch.zeros(5, 3), name="it's a \\ #name")
    toks = cc.Symbol((4,), name="toks\n2")
    looked = cc.GeneralFunction(emb, toks, spec="gen_index_at_0_c", name="naïve 中")
    scale = cc.Scalar(0.5, name=None)
    scaled = cc.Einsum.from_einsum_string("sd,->sd", looked, scale, name="x")
    both = cc.Add(scaled, looked, name="x")  # a second distinct 'x'
    first = cc.Index(both, (slice(None, -1), torch.tensor([2, 0])), name=None)
    flat = cc.Rearrange(first, "s d -> (s d)")
    cat = cc.Concat(flat, flat, axis=0, name="#")
    text = cat.repr()
    hexed = emb.content_hash[:24]
    expected = "\n".join(
        [
            "'#' Concat 0",
            "  0 Rearrange s d -> (s d)",
            "    1 [3,2] Index [:-1,[2,0]]",
            "      2 'x' Add",
            "        3 'x' Einsum sd,->sd",
            "          'naïve 中' GeneralFunction gen_index_at_0_c",
            f"            'it\\'s a \\\\ #name' [5,3] Array {hexed}",
            "            'toks\\n2' [4] Symbol",
            "          4 [] Scalar 0.5",
            "        'naïve 中'",
            "  0",
        ]
    )
    assert text == expected
    parsed = cc.parse(expected)
    assert parsed == cat
    assert parsed.repr() == expected
    assert parsed.shape == (12,)
