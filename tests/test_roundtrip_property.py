"""Property tests: random circuits of every node type print and read back.

The circuits come from tests/strategies.py (DAGs that share subtrees,
reuse names on distinct nodes, and check each op's shape by hand); the
printed text is checked line by line against docs/format.md's rules with a
tokenizer written in this file; and parsed circuits are compared with an
independent structural walk as well as with ``==``.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import LETTERS, dags, random_circuits, root_lists

import circuits as cc
from circuits.core.traversal import postorder

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
    if isinstance(node, (cc.Tag, cc.Symbol)):
        return node.uuid
    if isinstance(node, cc.Scatter):
        return tuple((item.start, item.stop) for item in node.index)
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
_UNESCAPE = {"\\\\": "\\", "\\'": "'", "\\n": "\n", "\\r": "\r"}


def unescape(text: str) -> str:
    return re.sub(r"\\.", lambda m: _UNESCAPE[m.group()], text)


def check_text_against_format(roots, text, shapes=False, serials=False):
    """Walk the roots as docs/format.md describes and compare with the text line by line."""
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
        if shapes or isinstance(node, (cc.Array, cc.Scalar, cc.Symbol, cc.Index, cc.Scatter)):
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
        elif isinstance(node, cc.Add):
            assert extra == ""
        elif isinstance(node, (cc.Symbol, cc.Tag)):  # the uuid's hyphenated hex, as rust_circuit prints it
            assert extra == ("" if node.uuid is None else str(node.uuid))
        elif isinstance(node, cc.Scatter):  # every slice with both bounds, as rust_circuit prints it
            assert extra == "[" + ",".join(f"{item.start}:{item.stop}" for item in node.index) + "]"
        stack.extend((c, depth + 1) for c in reversed(node.children))
    assert position == len(lines)
    assert len(written) == len(set(keys.values()))


# ------------------------------------------------------------------ properties


@pytest.mark.slow
@settings(max_examples=200)
@given(random_circuits())
def test_parse_of_repr_is_equal_and_reprints_identically(circuit):
    text = circuit.repr()
    check_text_against_format([circuit], text)
    parsed = cc.parse(text)
    assert parsed == circuit
    assert hash(parsed) == hash(circuit)
    assert_same_structure([parsed], [circuit])
    assert parsed.repr() == text


@pytest.mark.slow
@settings(max_examples=150)
@given(random_circuits(), st.booleans(), st.booleans())
def test_round_trip_with_shapes_and_serials(circuit, shapes, serials):
    text = circuit.repr(shapes=shapes, serials=serials)
    check_text_against_format([circuit], text, shapes=shapes, serials=serials)
    parsed = cc.parse(text)
    assert parsed == circuit
    assert_same_structure([parsed], [circuit])
    assert parsed.repr(shapes=shapes, serials=serials) == text
    # the options change the text only, not what it reads back to
    assert parsed.repr() == circuit.repr()


@pytest.mark.slow
@settings(max_examples=150)
@given(root_lists(), st.booleans(), st.booleans())
def test_several_roots_round_trip(roots, shapes, serials):
    text = cc.repr_many(roots, shapes=shapes, serials=serials)
    check_text_against_format(roots, text, shapes=shapes, serials=serials)
    parsed = cc.parse_many(text)
    assert parsed == roots
    assert_same_structure(parsed, roots)
    assert cc.repr_many(parsed, shapes=shapes, serials=serials) == text


@settings(max_examples=150)
@given(dags())
def test_separately_built_equal_circuits_are_equal(pool):
    """Rebuilding every node of a DAG bottom-up from its parts gives equal nodes."""
    rebuilt: dict[int, cc.Circuit] = {}
    for node in pool:
        for n in postorder([node]):
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
