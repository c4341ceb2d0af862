"""rust_circuit's printing options: serials on every node, minimal shapes, only children below, arrows.

Expected texts are written by hand; the properties compare each layout
with the default text rewritten by small independent functions here
(re-indenting by the text's own tree, dropping shapes by a regex), and
every option's text must parse back to the circuit it was printed from.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as cc
from circuits.text.store import TensorStore
from tests.strategies import random_circuits, root_lists

MARKER = "▼"


def chain() -> cc.Circuit:
    """r = i + j, where i = relu(x + s)[0] and j = x[1]: chains of only children."""
    x = cc.Array(torch.arange(12.0).reshape(3, 4), name="x")
    s = cc.Scalar(2.0, shape=(4,), name="s")
    g = cc.GeneralFunction.new_by_name(cc.Add(x, s, name="a"), spec_name="relu", name="g")
    return cc.Add(cc.Index(g, (0,), name="i"), cc.Index(x, (1,), name="j"), name="r")


X_HASH = chain().get_unique("x").content_hash[:24]


# ------------------------------------------------------------ by hand


def test_only_child_below_writes_the_only_child_at_its_parents_indent():
    assert chain().repr(only_child_below=True) == "\n".join(
        [
            "'r' Add",
            "  'i' [4] Index [0,:]",
            "  ▼",
            "  'g' GeneralFunction relu",
            "  ▼",
            "  'a' Add",
            f"    'x' [3,4] Array {X_HASH}",
            "    's' [4] Scalar 2",
            "  'j' [4] Index [1,:]",
            "  ▼",
            "  'x'",
        ]
    )


def test_only_child_below_at_the_root_and_between_roots():
    x = cc.Symbol((2,), name="x")
    neg = cc.Einsum.from_einsum_string("a->a", x, name="neg")
    twice = cc.Add(neg, neg, name="twice")
    text = cc.repr_many([neg, twice], only_child_below=True)
    assert text == "'neg' Einsum a->a\n▼\n'x' [2] Symbol\n'twice' Add\n  'neg'\n  'neg'"
    assert cc.parse_many(text) == [neg, twice]


def test_serials_number_every_node_and_its_repeats():
    # rust_circuit's force_use_serial_numbers: named nodes too; a repeat is its serial and name
    assert chain().repr(serials=True) == "\n".join(
        [
            "0 'r' Add",
            "  1 'i' [4] Index [0,:]",
            "    2 'g' GeneralFunction relu",
            "      3 'a' Add",
            f"        4 'x' [3,4] Array {X_HASH}",
            "        5 's' [4] Scalar 2",
            "  6 'j' [4] Index [1,:]",
            "    4 'x'",
        ]
    )


def test_minimal_shapes_drops_what_the_parser_works_out(tmp_path):
    # without a store an Array keeps its shape (the parser could not rebuild it); Index never needs one
    assert chain().repr(minimal_shapes=True) == "\n".join(
        [
            "'r' Add",
            "  'i' Index [0,:]",
            "    'g' GeneralFunction relu",
            "      'a' Add",
            f"        'x' [3,4] Array {X_HASH}",
            "        's' [4] Scalar 2",
            "  'j' Index [1,:]",
            "    'x'",
        ]
    )
    store = TensorStore(tmp_path)
    text = chain().repr(minimal_shapes=True, store=store)
    assert f"        'x' Array {X_HASH}" in text.split("\n")
    assert cc.parse(text, store=store) == chain()
    with pytest.raises(cc.errors.ParseError, match="no shape, so it needs its tensor") as info:  # says why
        cc.parse(text)
    assert info.value.line_number == 5 and info.value.line == f"        'x' Array {X_HASH}"


def test_minimal_shapes_keeps_a_placeholders_shape_even_with_a_store(tmp_path):
    placeholder = cc.Array.from_hash((4,), "ab" * 12, name="h")
    text = cc.Add(placeholder, placeholder, name="r").repr(minimal_shapes=True, store=TensorStore(tmp_path))
    assert text == "'r' Add\n  'h' [4] Array abababababababababababab\n  'h'"


def test_minimal_shapes_keeps_scatter_and_symbol_shapes_and_drops_tags():
    uuid = "1a280c74-fa9f-4dd9-94f4-5cca4a0cf243"
    x = cc.Symbol((3, 4), uuid=uuid, name="x")
    padded = cc.Scatter(x, (slice(0, 3), slice(0, 4)), (5, 4), name="padded")
    tagged = cc.Tag(padded, uuid, name="tagged")
    text = tagged.repr(minimal_shapes=True)
    assert text == "\n".join(
        [
            f"'tagged' Tag {uuid}",
            "  'padded' [5,4] Scatter [0:3,0:4]",
            f"    'x' [3,4] Symbol {uuid}",
        ]
    )
    assert cc.parse(text) == tagged
    assert cc.parse(tagged.repr(only_child_below=True)) == tagged


def test_all_three_together():
    text = chain().repr(serials=True, minimal_shapes=True, only_child_below=True)
    assert text == "\n".join(
        [
            "0 'r' Add",
            "  1 'i' Index [0,:]",
            "  ▼",
            "  2 'g' GeneralFunction relu",
            "  ▼",
            "  3 'a' Add",
            f"    4 'x' [3,4] Array {X_HASH}",
            "    5 's' [4] Scalar 2",
            "  6 'j' Index [1,:]",
            "  ▼",
            "  4 'x'",
        ]
    )
    assert cc.parse(text) == chain()


# rust_circuit's test_print_options: this circuit, and its arrows=True text (bijection=False there,
# so its names are unquoted: 'yoyo ' and 'hihi' are quoted here)
RUST_TEXT = """0 [5, 3, 6] Add
  1 [3, 1] Scatter [0:2,0:1]
    2 [2, 1] Scalar 1.0
  10 [5, 3, 6] Scatter [0:5,0:3,0:3]
    4 [5, 3, 3] Concat 0
      5 'yoyo ' [2, 3, 3] Scalar 1.0
      6 'hihi' [3, 3, 3] Scalar 1.0"""
RUST_ARROWS = """0 Add
├‣1 [3,1] Scatter [0:2,0:1]
│ └‣2 [2,1] Scalar 1
└‣3 [5,3,6] Scatter [0:5,0:3,0:3]
  └‣4 Concat 0
    ├‣'yoyo ' [2,3,3] Scalar 1
    └‣'hihi' [3,3,3] Scalar 1"""


def test_arrows_draw_the_tree_as_rust_circuit_does():
    circuit = cc.parse(RUST_TEXT)
    assert circuit.repr(arrows=True) == RUST_ARROWS
    assert cc.parse(RUST_ARROWS) == circuit


def test_arrows_with_only_children_below():
    assert chain().repr(arrows=True, only_child_below=True) == "\n".join(
        [
            "'r' Add",
            "├‣'i' [4] Index [0,:]",
            "│ ▼",
            "│ 'g' GeneralFunction relu",
            "│ ▼",
            "│ 'a' Add",
            f"│ ├‣'x' [3,4] Array {X_HASH}",
            "│ └‣'s' [4] Scalar 2",
            "└‣'j' [4] Index [1,:]",
            "  ▼",
            "  'x'",
        ]
    )
    assert cc.parse(chain().repr(arrows=True, only_child_below=True)) == chain()


def test_arrows_under_a_depth_cut():
    assert chain().repr(arrows=True, depth=2) == "\n".join(
        [
            "'r' Add",
            "├‣'i' [4] Index [0,:]",
            "│ └‣'g' GeneralFunction relu",
            "│     ... 1 children not shown",
            "└‣'j' [4] Index [1,:]",
            f"  └‣'x' [3,4] Array {X_HASH}",
        ]
    )


def einsums() -> cc.Circuit:
    a, b, s = cc.Symbol((2, 3), name="a"), cc.Symbol((3,), name="b"), cc.Scalar(2.0, name="s")
    e = cc.Einsum.from_einsum_string("ab,b,->a", a, b, s, name="e")
    f = cc.Einsum.from_einsum_string("ab,ab->a", a, a, name="f")
    return cc.Add(e, cc.Einsum.from_einsum_string("a->a", e, name="g"), f, name="r")


def test_comment_arg_names_writes_each_einsum_operands_axes():
    text = einsums().repr(comment_arg_names=True)
    assert text == "\n".join(
        [
            "'r' Add",
            "  'e' Einsum ab,b,->a",
            "    'a' [2,3] Symbol  # ab",
            "    'b' [3] Symbol  # b",
            "    's' [] Scalar 2",
            "  'g' Einsum a->a",
            "    'e'  # a",
            "  'f' Einsum ab,ab->a",
            "    'a'  # ab",
            "    'a'  # ab",
        ]
    )
    assert cc.parse(text) == einsums()


def test_comment_arg_names_comes_before_the_comment_and_survives_the_layouts():
    text = einsums().repr(
        comment_arg_names=True, only_child_below=True, arrows=True, comment=lambda n: n.kind
    )
    lines = text.split("\n")
    assert lines[2] == "│ ├‣'a' [2,3] Symbol  # ab  # Symbol"
    assert lines[6:8] == ["│ ▼", "│ 'e'  # a"]
    assert cc.parse(text) == einsums()


def test_depth_counts_nodes_not_indent_under_only_child_below():
    # depth=2 shows r, i, j and their children; the layout does not change what is cut
    assert chain().repr(depth=2, only_child_below=True) == "\n".join(
        [
            "'r' Add",
            "  'i' [4] Index [0,:]",
            "  ▼",
            "  'g' GeneralFunction relu",
            "    ... 1 children not shown",
            "  'j' [4] Index [1,:]",
            "  ▼",
            f"  'x' [3,4] Array {X_HASH}",
        ]
    )


def test_comments_and_colours_stay_on_their_lines_and_read_back():
    text = chain().repr(
        only_child_below=True,
        comment=lambda n: n.kind if n.name == "g" else None,
        color=lambda n: "red" if n.name == "x" else None,
    )
    lines = text.split("\n")
    assert lines[3:5] == ["  'g' GeneralFunction relu  # GeneralFunction", "  ▼"]
    assert lines[-1] == "  \x1b[31m'x'\x1b[0m"
    assert cc.parse(text) == chain()


def test_annotations_after_the_tree_drawing_read_back():
    text = chain().repr(
        arrows=True,
        only_child_below=True,
        serials=True,
        comment=lambda n: n.kind,
        color=lambda n: "red" if n.name in ("x", "g") else None,
    )
    lines = text.split("\n")
    assert lines[3] == "│ \x1b[31m2 'g' GeneralFunction relu  # GeneralFunction\x1b[0m"
    assert lines[6] == f"│ ├‣\x1b[31m4 'x' [3,4] Array {X_HASH}  # Array\x1b[0m"
    assert cc.parse(text) == chain()


@pytest.mark.parametrize("option", ["minimal_shapes", "only_child_below", "arrows", "comment_arg_names"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_non_boolean_option_is_a_print_error(option, value):
    with pytest.raises(cc.errors.PrintError, match=f"{option}={value!r}; expected True or False"):
        chain().repr(**{option: value})


def test_shapes_and_minimal_shapes_together_is_a_print_error():
    with pytest.raises(cc.errors.PrintError, match="pass one"):
        cc.repr_many([chain()], shapes=True, minimal_shapes=True)


# ------------------------------------------------------------ independent references


def relayout(text: str, only_child_below: bool = False, arrows: bool = False) -> str:
    """The default text laid out as rust_circuit's options would, from the text's own tree.

    Children of a line are the following lines one level deeper.  Each line
    is written after its prefix; its children's prefixes extend its column
    string (``│ `` if a later sibling follows, else spaces) with an elbow
    (``├‣``, last ``└‣``).  Without arrows every drawing character is a
    space.  Under only_child_below a line with one child line is followed
    by the marker and the child, both at the line's own column string.
    """
    tee, elbow, bar = ("├‣", "└‣", "│ ") if arrows else ("  ", "  ", "  ")
    lines = text.split("\n")
    levels = [(len(line) - len(line.lstrip(" "))) // 2 for line in lines]
    children: list[list[int]] = [[] for _ in lines]
    open_at: dict[int, int] = {}
    for number, level in enumerate(levels):
        if level:
            children[open_at[level - 1]].append(number)
        open_at[level] = number
    out: list[str] = []
    roots = [number for number, level in enumerate(levels) if level == 0]
    stack = [(number, "", "") for number in reversed(roots)]  # (line, its prefix, its column string)
    while stack:
        number, prefix, columns = stack.pop()
        out.append(prefix + lines[number].lstrip(" "))
        below = children[number]
        if only_child_below and len(below) == 1:
            out.append(columns + MARKER)
            stack.append((below[0], columns, columns))
            continue
        for position in reversed(range(len(below))):
            is_last = position == len(below) - 1
            stack.append(
                (below[position], columns + (elbow if is_last else tee), columns + ("  " if is_last else bar))
            )
    return "\n".join(out)


_SHAPED_LINE = re.compile(r"^( *(?:\d+ ?)?(?:'(?:[^'\\]|\\.)*')?) \[[\d,]*\](?= (?P<kind>[A-Za-z]+))")


def without_shapes(text: str, kinds: tuple[str, ...]) -> str:
    """The text with the ``[shape]`` of every line of the given kinds removed."""

    def drop(line: str) -> str:
        match = _SHAPED_LINE.match(line)
        return line if match is None or match["kind"] not in kinds else match[1] + line[match.end() :]

    return "\n".join(drop(line) for line in text.split("\n"))


def test_the_references_agree_with_the_hand_written_texts():
    assert relayout(chain().repr(), only_child_below=True) == chain().repr(only_child_below=True)
    assert without_shapes(chain().repr(), ("Index",)) == chain().repr(minimal_shapes=True)


# ------------------------------------------------------------ golden file


def test_golden_default_text_is_unchanged(golden_text):
    circuit = cc.parse(golden_text)
    assert circuit.repr(minimal_shapes=False, only_child_below=False) == golden_text


@pytest.mark.parametrize(
    "options",
    [
        {"serials": True},
        {"minimal_shapes": True},
        {"only_child_below": True},
        {"arrows": True},
        {"comment_arg_names": True},
        {
            "serials": True,
            "minimal_shapes": True,
            "only_child_below": True,
            "arrows": True,
            "comment_arg_names": True,
        },
    ],
    ids=lambda options: "+".join(options),
)
def test_golden_round_trips_under_each_option(golden_text, options):
    circuit = cc.parse(golden_text)
    text = circuit.repr(**options)
    assert text != golden_text
    parsed = cc.parse(text)
    assert parsed == circuit
    assert parsed.repr(**options) == text
    assert parsed.repr() == golden_text


def test_golden_layouts_match_the_references(golden_text):
    circuit = cc.parse(golden_text)
    only_child = circuit.repr(only_child_below=True)
    assert only_child == relayout(golden_text, only_child_below=True)
    assert circuit.repr(arrows=True) == relayout(golden_text, arrows=True)
    assert circuit.repr(arrows=True, only_child_below=True) == relayout(golden_text, True, True)
    # one marker per distinct node with exactly one child (each is written in full once)
    one_child = [node for node in cc.unique_nodes([circuit]) if len(node.children) == 1]
    assert only_child.count(MARKER) == len(one_child) > 0
    # golden Arrays are placeholders: their shapes stay; only Index lines lose theirs
    assert circuit.repr(minimal_shapes=True) == without_shapes(golden_text, ("Index",))


def test_golden_arg_names_comment_every_einsum_operand_of_rank_above_zero(golden_text):
    circuit = cc.parse(golden_text)
    text = circuit.repr(comment_arg_names=True)
    operands = [
        child
        for node in cc.unique_nodes([circuit])
        if node.kind == "Einsum"
        for child in node.children
        if child.shape
    ]
    assert text.count("  # ") == len(operands) > 0
    # the comments are the only change
    assert re.sub(r"  # [A-Za-z]+$", "", text, flags=re.M) == golden_text


def test_golden_serials_number_every_full_line(golden_text):
    text = cc.parse(golden_text).repr(serials=True)
    full = [line for line in text.split("\n") if line.rsplit("'", 1)[-1].strip()]
    serials = [int(line.split()[0]) for line in full]
    assert serials == list(range(len(full))) == list(range(312))


# ------------------------------------------------------------ properties


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> TensorStore:
    return TensorStore(tmp_path_factory.mktemp("print_options"))


@settings(max_examples=60)
@given(
    random_circuits(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_every_combination_reads_back(
    store, circuit, serials, minimal_shapes, only_child_below, arrows, arg_names, with_store
):
    options = {
        "serials": serials,
        "minimal_shapes": minimal_shapes,
        "only_child_below": only_child_below,
        "arrows": arrows,
        "comment_arg_names": arg_names,
    }
    used = store if with_store else None
    text = circuit.repr(**options, store=used)
    parsed = cc.parse(text, store=used)
    assert parsed == circuit
    assert parsed.repr(**options) == circuit.repr(**options)


@settings(max_examples=60)
@given(random_circuits(), st.booleans())
def test_layouts_agree_with_the_references(store, circuit, serials):
    plain = circuit.repr(serials=serials)
    for only_child_below, arrows in [(True, False), (False, True), (True, True)]:
        laid_out = circuit.repr(serials=serials, only_child_below=only_child_below, arrows=arrows)
        assert laid_out == relayout(plain, only_child_below, arrows)
    assert circuit.repr(serials=serials, minimal_shapes=True) == without_shapes(plain, ("Index",))
    loaded = all(n.is_loaded for n in cc.unique_nodes([circuit]) if isinstance(n, cc.Array))
    if loaded:
        with_store = circuit.repr(serials=serials, minimal_shapes=True, store=store)
        assert with_store == without_shapes(plain, ("Index", "Array"))


@settings(max_examples=40)
@given(root_lists(), st.booleans(), st.booleans(), st.booleans())
def test_several_roots_read_back(roots, minimal_shapes, only_child_below, arrows):
    options = {"minimal_shapes": minimal_shapes, "only_child_below": only_child_below, "arrows": arrows}
    text = cc.repr_many(roots, serials=True, **options)
    assert cc.parse_many(text) == roots
    assert text == relayout(
        cc.repr_many(roots, serials=True, minimal_shapes=minimal_shapes), only_child_below, arrows
    )


def test_the_docs_example_is_what_the_printer_writes():
    page = (Path(__file__).parent.parent / "docs" / "format.md").read_text()
    section = page.split("## Layout options", 1)[1]
    blocks = section.split("## ", 1)[0].split("```\n")[1::2]
    assert [block.rstrip("\n") for block in blocks] == [
        chain().repr(only_child_below=True),
        chain().repr(only_child_below=True, arrows=True),
    ]
