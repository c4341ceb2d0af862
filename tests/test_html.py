"""Notebook display: _repr_html_ (collapsible, repeats linked) and _repr_pretty_ (the text)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import torch

import circuits as cc
import circuits.models as cm
from circuits.text.html import PRETTY_DEPTH, PRETTY_MAX_NODES, pretty_text, to_html

SMALL = cm.AttnOnlyConfig(n_layers=2, n_heads=2, d_model=8, d_head=4, vocab_size=11, n_ctx=8)


class _Collector(HTMLParser):
    """Elements with ids, links, open/closed <details>, text per element, and tag balance."""

    def __init__(self):
        super().__init__()
        self.ids: dict[str, str] = {}  # id -> tag
        self.links: list[tuple[str, str]] = []  # (href, link text)
        self.details: list[bool] = []  # open?
        self.stack: list[str] = []
        self.balanced = True
        self._link: list[str] | None = None
        self._href = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.stack.append(tag)
        if "id" in attrs:
            assert attrs["id"] not in self.ids, f"duplicate id {attrs['id']}"
            self.ids[attrs["id"]] = tag
        if tag == "a":
            self._href, self._link = attrs["href"], []
        if tag == "details":
            self.details.append("open" in attrs)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.balanced = False
        if tag == "a":
            self.links.append((self._href, "".join(self._link)))
            self._link = None

    def handle_data(self, data):
        if self._link is not None:
            self._link.append(data)


def _parse(text: str) -> _Collector:
    collector = _Collector()
    collector.feed(text)
    collector.close()
    return collector


def _model() -> cc.Circuit:
    weights = cm.attn_only_random_weights(SMALL, seed=0)
    return cc.passes.split_heads(
        cc.passes.causal_mask(cm.build_attn_only(SMALL, weights, torch.arange(7) % 11))
    )


def test_one_element_per_distinct_node_and_repeats_link_to_them():
    circuit = _model()
    page = circuit._repr_html_()
    found = _parse(page)
    assert found.balanced and not found.stack
    distinct = cc.unique_nodes([circuit])
    assert len(found.ids) == len(distinct)
    # a node with children is a <details>, a leaf a <div>
    assert sorted(found.ids.values()).count("details") == sum(1 for n in distinct if n.children)
    # every repeat line of the text is a link, to an id that exists, showing the same reference
    text_lines = circuit.repr().split("\n")
    repeats = [
        line.strip() for line in text_lines if not re.search(r"(^|\s)[A-Z][a-zA-Z]+( |$)", line.strip())
    ]
    assert len(found.links) == len(repeats) > 0
    for (href, label), repeat in zip(found.links, repeats):
        assert href.startswith("#") and href[1:] in found.ids
        assert label == repeat


def test_collapsed_below_open_depth():
    circuit = _model()
    found = _parse(to_html(circuit, open_depth=1))
    assert found.details[0] is True and found.details.count(True) == 1
    assert _parse(to_html(circuit, open_depth=0)).details.count(True) == 0


def test_names_shapes_variants_and_escaping():
    evil = cc.Array(torch.zeros(2, 3), name="<script>alert('x')</script> & co")
    node = cc.GeneralFunction.new_by_name(cc.Add(evil, evil, name='a"b'), spec_name="softmax", name="p")
    page = node._repr_html_()
    assert "<script>" not in page
    assert "&lt;script&gt;" in page and "&amp; co" in page
    assert "[2,3]" in page and "GeneralFunction" in page and "softmax" in page and "Add" in page
    found = _parse(page)
    assert found.balanced and len(found.ids) == 3 and len(found.links) == 1


def test_ids_differ_between_circuits_and_max_nodes_stops_cleanly():
    a = _parse(_model()._repr_html_()).ids
    b = _parse(cc.Array(torch.ones(1), name="one")._repr_html_()).ids
    assert not set(a) & set(b)
    truncated = to_html(_model(), max_nodes=10)
    found = _parse(truncated)
    assert found.balanced and len(found.ids) == 10 and "stopped after 10 nodes" in truncated


def test_deep_circuit_html_is_iterative():
    node = cc.Array(torch.ones(2), name="x")
    for i in range(5000):
        node = cc.Add(node, name=f"n{i}")
    page = to_html(node)
    assert page.count("<details") == 5000


class _Printer:
    def __init__(self):
        self.parts = []

    def text(self, value):
        self.parts.append(value)


def test_repr_pretty_is_the_text_depth_limited_when_big():
    small = _model()
    printer = _Printer()
    small._repr_pretty_(printer, False)
    assert "".join(printer.parts) == small.repr()

    big = cc.Array(torch.ones(2), name="x")
    for i in range(PRETTY_MAX_NODES + 10):
        big = cc.Add(big, cc.Scalar(float(i)), name=f"n{i}")
    text = pretty_text(big)
    assert text.startswith(big.repr(depth=PRETTY_DEPTH))
    assert "children not shown" in text and text.count("\n") < 3 * PRETTY_DEPTH
