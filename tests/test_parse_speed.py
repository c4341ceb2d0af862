"""What the faster parser relies on, each against a reference built independently.

The parser reads every printed line in one scan (checked against the
printer's line pattern, written out here), places a plain repeat by name
without the general bookkeeping (refusing what is amiss, and the line after
it, with the general way's errors), and builds a line like an
earlier one (same variant, extra and printed shape, over children of the same
shapes) with ``rebuilt_like`` from the earlier node instead of its builder;
``node_hash`` caches part of its header.  Each shortcut must give exactly the
node (fields, hash) and the error that the slow way gives.
"""

from __future__ import annotations

import gc
import hashlib
import re

import attrs
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies import names, random_circuits, shapes

import circuits as cc
from circuits.core.hashing import node_hash
from circuits.core.nodes import keeps_derivation, rebuilt_like
from circuits.text.parsing import _LINE
from circuits.text.store import TensorStore


class Child:
    def __init__(self, digest: bytes):
        self.hash = digest


def reference_node_hash(kind, name, shape, extra, children, identity=""):
    """The byte layout every stored hash was made with (circuits/core/hashing.py before issue 20)."""
    named = "\x00" if name is None else "\x01" + name
    fields = [kind, str(len(named)), named, str(shape), str(len(extra)), extra, str(len(children))]
    header = "\x1f".join(fields) + (f"\x1f{identity}" if identity else "")
    hasher = hashlib.blake2b(header.encode("utf-8", "surrogatepass"), digest_size=16)
    for child in children:
        hasher.update(child.hash)
    return hasher.digest()


# names with lone surrogates too, which the hash encodes with surrogatepass
HASHED_NAMES = st.one_of(names(), st.text(st.characters(), max_size=5))


@given(
    kind=st.sampled_from(["Add", "Einsum", "Array", "Index"]),
    name=HASHED_NAMES,
    shape=shapes(),
    extra=st.one_of(st.just(""), st.text(max_size=8)),
    children=st.lists(st.binary(min_size=16, max_size=16), max_size=3),
    identity=st.one_of(st.just(""), st.text(max_size=6)),
)
def test_node_hash_hashes_the_documented_bytes(kind, name, shape, extra, children, identity):
    children = [Child(digest) for digest in children]
    expected = reference_node_hash(kind, name, shape, extra, children, identity)
    assert node_hash(kind, name, shape, extra, children, identity) == expected
    assert node_hash(kind, name, shape, extra, children, identity) == expected  # the cached tail again


def test_node_hash_digests_stay_what_they_were():
    # computed by circuits/core/hashing.py at commit a169e80, before the header cache
    assert node_hash("Add", "x", (3, 4), "", ()).hex() == "2b6e5ffcd0ca470d37a715d09accba88"
    one = Child(b"\x01" * 16)
    assert node_hash("Einsum", None, (2,), "ab->a", (one,)).hex() == "50c19e4329ff22242b86f68ff371d7f6"


def fields_of(node: cc.Circuit) -> dict:
    """Every attrs field, tensors as lists (so == compares values)."""
    values = {}
    for field in attrs.fields(type(node)):
        value = getattr(node, field.name)
        if field.name == "index":
            value = tuple(item.tolist() if isinstance(item, torch.Tensor) else item for item in value)
        values[field.name] = value
    return values


@given(random_circuits(), st.data())
def test_rebuilt_like_is_the_node_the_constructor_builds(circuit, data):
    """Over other children of the same shapes and another name: evolve (the constructor) agrees."""
    stack, seen = [circuit], set()
    while stack:
        node = stack.pop()
        if node.hash in seen:
            continue
        seen.add(node.hash)
        stack.extend(node.children)
        if not keeps_derivation(node):
            continue
        children = tuple(child.rename(f"other {position}") for position, child in enumerate(node.children))
        name = data.draw(names())
        rebuilt = rebuilt_like(node, children, name)
        built = node.evolve(children=children, name=name)
        assert type(rebuilt) is type(built)
        assert fields_of(rebuilt) == fields_of(built)
        assert rebuilt == built and rebuilt.hash == built.hash
        assert all(new is given for new, given in zip(rebuilt.children, children))


def test_the_classes_rebuilt_like_serves_set_only_the_base_derived_fields():
    """rebuilt_like does ``Circuit._set_derived``'s work itself: no class it serves may override it."""
    x = cc.Symbol((3, 4), name="x")
    served = [
        cc.Einsum.from_einsum_string("ab->a", x),
        cc.Add(x),
        cc.GeneralFunction(x, spec="relu"),
        cc.Index(x, 0),
        cc.Rearrange(x, "a b -> b a"),
        cc.Concat(x, axis=0),
    ]
    for node in served:
        assert keeps_derivation(node)
        assert type(node)._set_derived is cc.Circuit._set_derived
    for leaf in (x, cc.Scalar(1.0), cc.Array(torch.zeros(2))):
        assert not keeps_derivation(leaf)


def test_alike_lines_over_children_of_other_shapes_are_built_for_their_own():
    """Same variant and extra, children of other shapes: each line is built for its own children."""
    text = """
'i' Index [0:2]
  'x' [3] Symbol
'j' Index [0:2]
  'y' [3,4] Symbol
'e' Einsum ab->a
  'p' [2,5] Symbol
'f' Einsum ab->a
  'q' [4,5] Symbol
'r' Rearrange a b -> (a b)
  'p'
's' Rearrange a b -> (a b)
  'q'
"""
    i, j, e, f, r, s = cc.parse_many(text)
    x, y = cc.Symbol((3,), name="x"), cc.Symbol((3, 4), name="y")
    p, q = cc.Symbol((2, 5), name="p"), cc.Symbol((4, 5), name="q")
    assert i == cc.Index(x, (slice(0, 2),), name="i") and i.shape == (2,)
    assert j == cc.Index(y, (slice(0, 2),), name="j") and j.shape == (2, 4)
    assert e == cc.Einsum.from_einsum_string("ab->a", p, name="e") and e.shape == (2,)
    assert f == cc.Einsum.from_einsum_string("ab->a", q, name="f") and f.shape == (4,)
    assert r == cc.Rearrange(p, "a b -> (a b)", name="r") and r.shape == (10,)
    assert s == cc.Rearrange(q, "a b -> (a b)", name="s") and s.shape == (20,)


def repeated_branches(branches: int) -> cc.Circuit:
    """Branches alike line for line (as the printer writes a model): most lines reuse a prototype."""
    w = cc.Array(torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), name="w")
    tips = []
    for branch in range(branches):
        x = cc.Symbol((2, 3), name=f"x{branch}")
        h = cc.Einsum.from_einsum_string("ab,bc->ac", x, w, name=f"h{branch}")
        h = cc.Add(h, cc.Scalar(1.0, (5,), name="one"))  # unnamed: a serial number
        h = cc.GeneralFunction(h, spec="gelu", name="act")  # a name many distinct nodes carry
        h = cc.Index(h, (torch.tensor([1, 0]), slice(1, 4)), name=f"i{branch}")
        h = cc.Rearrange(h, "a (b c) -> c a b", name=f"r{branch}", c=3)
        tips.append(cc.Concat(h, h, axis=0, name=f"c{branch}"))
    return cc.Add(*tips, name="root")


def test_a_text_of_alike_lines_parses_to_the_circuit_built_by_hand(tmp_path):
    circuit = repeated_branches(6)
    store = TensorStore(tmp_path)
    store.save(circuit.get_unique("w").tensor())
    parsed = cc.parse(circuit.repr(), store=store)
    assert parsed == circuit
    assert parsed.repr() == circuit.repr()
    inputs = {f"x{branch}": torch.randn(2, 3) for branch in range(6)}
    torch.testing.assert_close(parsed.evaluate(inputs), circuit.evaluate(inputs))


def test_a_wrong_printed_shape_is_refused_on_a_line_like_an_earlier_good_one():
    text = "'root' Add\n  'a' [3,4] Add\n    'x' [3,4] Symbol\n  'b' [3,5] Add\n    'y' [3,4] Symbol"
    with pytest.raises(cc.errors.ParseError) as caught:
        cc.parse(text)
    assert caught.value.line_number == 4
    assert "the line says shape [3, 5] but the Add computes [3, 4]" in str(caught.value)


def test_a_name_of_several_distinct_nodes_is_ambiguous_and_counted():
    text = "'a' Add\n  0 'x' [3] Symbol\n  1 'x' [1] Symbol\n  2 'x' [3] Symbol\n  3 'x' [1] Symbol\n  'x'"
    with pytest.raises(cc.errors.ParseError, match="2 distinct nodes carry that name") as caught:
        cc.parse(text)
    assert caught.value.line_number == 6
    text = "'a' Add\n  0 'x' [3] Symbol\n  1 'x' [1] Symbol\n  2 'x' [2,1] Symbol\n  'x'"
    with pytest.raises(cc.errors.ParseError, match="3 distinct nodes carry that name") as caught:
        cc.parse(text)
    assert caught.value.line_number == 5


def test_a_name_written_twice_for_one_node_is_not_ambiguous():
    text = "'r' Add\n  'x' [3] Symbol\n  'a' Add\n    'x' [3] Symbol\n  'x'"
    x = cc.Symbol((3,), name="x")
    assert cc.parse(text) == cc.Add(x, cc.Add(x, name="a"), x, name="r")


def test_parse_hands_its_nodes_to_the_oldest_generation_and_restores_the_collector():
    text = repeated_branches(2).repr()
    was_enabled = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            root = cc.parse(text)
            assert gc.isenabled() is enabled
            assert any(node is root for node in gc.get_objects(generation=2))
            with pytest.raises(cc.errors.ParseError):
                cc.parse(text + "\n  'nope'")
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was_enabled else gc.disable)()


def test_parse_leaves_objects_frozen_by_gc_freeze_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        cc.parse(repeated_branches(2).repr())
        # Unfreezing would empty the permanent generation and freezing would grow it; a frozen
        # object freed by its last reference during the parse may shrink it a little (seen when
        # other tests' objects were frozen with ours), which is no fault of the parse.
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


# What the printer writes, one line at a time: [serial] ['name'] [ [shape]] [ Variant [extra]]
PRINTED = re.compile(
    r"(\d+)?(?:(?(1) )'((?:[^'\\]|\\.)*)')?(?: (?:\[((?:\d+(?:,\d+)*)?)\] )?([A-Za-z]+)(?: ([^#]*[^# ]))?)?"
)
LINE_PIECES = [
    "0",
    "12",
    " ",
    "  ",
    "'a b'",
    "'a\\'b'",
    "'x\\\\'",
    "'",
    "\\",
    " [2,3]",
    " []",
    " [2, 3]",
    " Add",
    " Einsum ab,b->a",
    " Array 1f",
    " #c",
    "# c",
    "x",
    "\n",
]


@settings(max_examples=1000)  # microseconds each
@given(st.lists(st.lists(st.sampled_from(LINE_PIECES), max_size=8).map("".join), max_size=12).map("\n".join))
@example("0 'a b' [2,3] Einsum ab,b->a \n  'x'  \n'y' Add #c\n12 Add x  \n''\n  'a\\'b' Array 1f")
def test_the_one_scan_reads_each_line_as_the_printers_pattern_does(text):
    lines = text.split("\n")
    scanned = list(_LINE.finditer(text))
    assert len(scanned) == len(lines)
    for match, line in zip(scanned, lines):
        body = line.lstrip(" ")
        assert match.group(1, 2) == (line[: len(line) - len(body)], body)
        printed = PRINTED.fullmatch(body)
        if printed is None:
            assert match.group(3, 4, 5, 6, 7) == (None,) * 5
        else:
            assert match.group(3, 4, 5, 6, 7) == printed.groups()


@pytest.mark.parametrize(
    "text, line_number, message",
    [
        ("'r' Add\n  'x' [3] Symbol\n  'x'\n    'y' [3] Symbol", 4, "indented under line 3, a repeat"),
        (
            "'r' Add\n  'x' [3] Symbol\n  'x'\n\n  # c\n      'y' [3] Symbol",
            6,
            "indented under line 3, a repeat",
        ),
        ("'r' Add\n  'x' [3] Symbol\n  'x'\n      'x'", 4, "indented under line 3, a repeat"),
        (
            "'r' Add\n  'x' [3] Symbol\n  'x'\n  \u25bc\n  'y' [3] Symbol",
            4,
            "an only-child marker must follow",
        ),
        ("'r' Add\n  'x' Add\n    'x'", 3, "repeat of 'x', which is an enclosing node"),
        ("'r' Add\n  'x' [3] Symbol\n  'z'", 3, "repeat of 'z', which is defined by no earlier line"),
        ("'r' Add\n  'x' [3] Symbol\n 'x'", 3, "indented by 1 spaces"),
        ("'r' Add\n  'x' [3] Symbol\n    'x'", 3, "indented under line 2, a Symbol, which is a leaf"),
        ("'r' Add\n  'x' [3] Symbol\n'x'", 3, "expected one circuit, found 2 top-level circuits"),
        # node lines after such repeats, and lines like them
        (
            "'r' Add\n  'w' [2] Array 000000000000000000000000\n    'y' Add",
            3,
            "line 2, a Array, which is a leaf",
        ),
        ("'r' Add\n  0 'a' Add\n    1 'x' [3] Symbol\n  0 'a' Einsum a->a", 4, "variant 'Einsum' != 'Add'"),
        ("'r' Add\n  0 'a' Add\n    0 'a' Add", 3, "repeat of serial number 0, whose line 2 is an enclosing"),
        ("'r' Add\n  'a' Add\n      'b' Add", 3, "indented to depth 3 but the enclosing node is at depth 1"),
        ("'r' Add\n  'a' Add\n    'x' [3] Symbol\n   'c' Add", 4, "indented by 3 spaces"),
        ("'r' Add\n  'a' Add\n    'x' [3] Symbol\n'b' Add\n  'x'", 4, "found 2 top-level circuits"),
        (
            "'r' Add\n  'a' [3,4] Add\n    'x' [3,4] Symbol\n  'b' [3,4] Add\n    'y' [3,5] Symbol",
            4,
            "the line says shape [3, 4] but the Add computes [3, 5]",
        ),
    ],
)
def test_the_printers_lines_placed_at_once_are_refused_as_the_general_way_refuses(text, line_number, message):
    with pytest.raises(cc.errors.ParseError) as caught:
        cc.parse(text)
    assert caught.value.line_number == line_number
    assert message in str(caught.value)


def test_plain_repeats_closing_their_siblings_land_under_the_right_parent():
    text = "'r' Add\n  'x' [3] Symbol\n  'a' Add\n    'b' Add\n      'x'\n    'x'\n  'b'\n  'a'"
    x = cc.Symbol((3,), name="x")
    b = cc.Add(x, name="b")
    a = cc.Add(b, x, name="a")
    assert cc.parse(text) == cc.Add(x, a, b, a, name="r")
