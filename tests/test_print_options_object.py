"""One frozen ``cc.PrintOptions`` for ``repr``, ``print``, ``repr_many``, ``to_html`` and the
causal scrubbing printers, with keywords as overrides of its fields.

The expected texts are written by hand (the layouts themselves are tested in
test_print_options.py); here the point is that the object and the keywords say the same
thing, that a keyword overrides the object, and that a bad option is a typed error naming it.
"""

from __future__ import annotations

import inspect

import attrs
import pytest
import torch
from test_cs_printing import scrubbed

import circuits as cc
from circuits.errors import MatcherError, PrintError
from circuits.text.html import to_html
from circuits.text.printing import repr_many

#: Today's print keywords (before the object they were spelled out on repr, print and repr_many).
KEYWORDS = (
    "depth",
    "shapes",
    "serials",
    "store",
    "traversal",
    "comment",
    "color",
    "costs",
    "minimal_shapes",
    "only_child_below",
    "arrows",
    "comment_arg_names",
)


def small() -> cc.Circuit:
    x = cc.Array(torch.arange(6.0).reshape(2, 3), name="x")
    return cc.Add(cc.Index(x, (0,), name="i"), cc.Scalar(1.0, shape=(3,), name="one"), name="r")


X_HASH = small().get_unique("x").content_hash[:24]


def test_the_fields_are_the_print_keywords_each_once():
    assert tuple(f.name for f in attrs.fields(cc.PrintOptions)) == KEYWORDS
    assert "PrintOptions" in cc.__all__
    # help() shows them as keywords, with their defaults, after the options object
    for function in (cc.Circuit.repr, cc.Circuit.print, repr_many):
        params = list(inspect.signature(function).parameters.values())[2:]
        assert [(p.name, p.kind, p.default) for p in params] == [
            (f.name, inspect.Parameter.KEYWORD_ONLY, f.default) for f in attrs.fields(cc.PrintOptions)
        ]
    assert list(inspect.signature(to_html).parameters)[-3:] == ["comment", "color", "costs"]


def test_the_object_and_the_keywords_print_the_same_text():
    c = small()
    options = cc.PrintOptions(shapes=True, arrows=True)
    expected = "\n".join(
        [
            "'r' [3] Add",
            "├‣'i' [3] Index [0,:]",
            f"│ └‣'x' [2,3] Array {X_HASH}",
            "└‣'one' [3] Scalar 1",
        ]
    )
    assert c.repr(options) == c.repr(shapes=True, arrows=True) == expected
    assert repr_many([c], options) == options.repr(c) == expected


def test_a_keyword_overrides_the_objects_field(capsys):
    c = small()
    options = cc.PrintOptions(shapes=True, depth=0)
    assert c.repr(options) == "'r' [3] Add\n  ... 2 children not shown"
    assert c.repr(options, depth=1) == "\n".join(
        ["'r' [3] Add", "  'i' [3] Index [0,:]", "    ... 1 children not shown", "  'one' [3] Scalar 1"]
    )
    assert c.repr(options, depth=None, shapes=False) == c.repr()
    c.print(options, depth=None)
    assert capsys.readouterr().out == c.repr(shapes=True) + "\n"
    assert options.depth == 0  # the object itself is unchanged


def test_options_are_frozen_and_evolve_into_new_objects():
    options = cc.PrintOptions(depth=2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        options.depth = 3
    deeper = options.evolve(depth=3, shapes=True)
    assert (options.depth, deeper.depth, deeper.shapes) == (2, 3, True)
    assert options.evolve() is options
    assert repr(deeper) == "PrintOptions(depth=3, shapes=True)"
    assert options == cc.PrintOptions(depth=2) != deeper


@pytest.mark.parametrize(
    "make",
    [
        lambda: cc.PrintOptions(dpeth=2),
        lambda: cc.PrintOptions().evolve(dpeth=2),
        lambda: small().repr(dpeth=2),
        lambda: small().repr(cc.PrintOptions(), dpeth=2),
        lambda: repr_many([small()], dpeth=2),
        lambda: to_html(small(), dpeth=2),
    ],
)
def test_an_unknown_keyword_is_a_print_error_naming_it(make):
    with pytest.raises(PrintError) as info:
        make()
    assert info.value.field == "dpeth"
    assert "did you mean 'depth'?" in str(info.value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("depth", "2"),
        ("depth", -1),
        ("depth", True),
        ("shapes", 1),
        ("arrows", "yes"),
        ("store", "a directory"),
        ("comment", "text"),
        ("color", 3),
    ],
)
def test_a_wrong_typed_field_is_a_print_error_naming_it(field, value):
    with pytest.raises(PrintError) as info:
        cc.PrintOptions(**{field: value})
    assert info.value.field == field
    with pytest.raises(PrintError) as info:
        small().repr(cc.PrintOptions(), **{field: value})
    assert info.value.field == field


def test_options_that_contradict_each_other_or_no_options_object_are_refused():
    with pytest.raises(PrintError) as info:
        cc.PrintOptions(shapes=True, minimal_shapes=True)
    assert info.value.field == "minimal_shapes"
    with pytest.raises(PrintError) as info:
        small().repr(cc.PrintOptions(costs=True), comment=lambda n: "x")
    assert info.value.field == "costs"
    with pytest.raises(PrintError) as info:
        small().repr({"depth": 2})
    assert info.value.field == "options"
    with pytest.raises(MatcherError, match="traversal="):
        cc.PrintOptions(traversal=3.5)


def test_the_html_page_reads_the_annotations_of_the_object():
    c = small()
    comment = lambda node: f"<{node.name}>"  # noqa: E731
    page = to_html(c, cc.PrintOptions(comment=comment, color=lambda n: "red"))
    assert page == to_html(c, comment=comment, color=lambda n: "red")
    assert "&lt;i&gt;" in page and "&lt;x&gt;" in page
    assert to_html(c, cc.PrintOptions(costs=True)) == to_html(c, comment=cc.cost(c).comment)
    with pytest.raises(PrintError) as info:
        to_html(c, cc.PrintOptions(depth=1))  # the page opens and closes levels itself
    assert info.value.field == "depth"


def test_the_causal_scrubbing_printers_read_the_object():
    root, result = scrubbed()
    stopped = result.print(cc.PrintOptions(depth=1), repr=True, print_data=False)
    assert stopped == result.print({"depth": 1}, repr=True, print_data=False)
    assert stopped.splitlines()[:3] == ["'out' Add  # root", "  's' Add", "    ... 2 children not shown"]
    upper = cc.PrintOptions(comment=lambda node: node.name.upper())
    assert root.print(upper, result.sampled_inputs, print_data=False, repr=True).splitlines() == [
        "root  # ROOT",
        "  a  # A",
    ]
    with pytest.raises(PrintError) as info:
        root.print(cc.PrintOptions(arrows=True), repr=True)  # a hypothesis is no circuit
    assert info.value.field == "arrows"
