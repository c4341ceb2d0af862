"""What the parser's tests share: parse a text and check that it round-trips, the ParseError a
text raises, and the fuzzing check with its text mutations."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

import circuits as cc
from circuits.errors import ParseError
from circuits.text.store import TensorStore


def parsed(
    text: str, store: TensorStore | None = None, *, same_reprint: bool = False, **options
) -> cc.Circuit:
    """Parse (``options`` as for ``cc.parse``), and check that our reprint of it reads back to the
    same circuit; ``same_reprint``: and that the circuit read back reprints the same text."""
    circuit = cc.parse(text, store=store, **options)
    again = cc.parse(circuit.repr(), store=store)
    assert again == circuit
    if same_reprint:
        assert again.repr() == circuit.repr()
    return circuit


def parse_error(text: str, store: TensorStore | None = None, **options) -> ParseError:
    """The ParseError that ``cc.parse`` raises on ``text``."""
    with pytest.raises(ParseError) as info:
        cc.parse(text, store=store, **options)
    return info.value


def parse_error_message(text: str, line_number: int, *, many: bool = False, **options) -> str:
    """The message of the ParseError that ``cc.parse`` (``cc.parse_many`` if ``many``) raises on
    ``text``, after checking that it names line ``line_number``."""
    with pytest.raises(ParseError) as info:
        (cc.parse_many if many else cc.parse)(text, **options)
    assert info.value.line_number == line_number
    return str(info.value)


def check_parse_or_parse_error(text: str, *, strict: bool = True, **options) -> None:
    """Either parses (``cc.parse_many``, ``options`` as for it) and round-trips through our printer,
    or raises ParseError naming a line of the text.  ``strict``: moreover the error quotes that line,
    the reprint reads back to the same text, and ``cc.parse`` refuses only a text of other than
    one root."""
    try:
        roots = cc.parse_many(text, **options)
    except ParseError as error:
        if error.line_number is not None:
            lines = text.split("\n")
            assert 1 <= error.line_number <= len(lines)
            if strict and not error.line.startswith("<"):  # very deep indents are abbreviated
                assert error.line == lines[error.line_number - 1]
        return
    printed = cc.repr_many(roots)
    assert cc.parse_many(printed) == roots  # without a store, Arrays by hash: equal by content hash
    if not strict:
        return
    assert cc.repr_many(cc.parse_many(printed)) == printed
    try:
        cc.parse(text)
    except ParseError as error:
        assert len(roots) != 1
        assert len(roots) == 0 or error.line_number is not None


MUTATION_CHARS = "'\\#[]()->,: =\n\t0123456789abcdefxyzAEIS.é_"


@st.composite
def mutated(draw, base_texts, chars=MUTATION_CHARS):
    """One of ``base_texts`` with 1 to 4 mutations: a character deleted, inserted or replaced
    (from ``chars`` or any), or a line deleted, duplicated or swapped."""
    text = draw(st.sampled_from(base_texts))
    for _ in range(draw(st.integers(1, 4))):
        lines = text.split("\n")
        kind = draw(st.sampled_from(["delete", "insert", "replace", "del_line", "dup_line", "swap_lines"]))
        if kind in ("delete", "insert", "replace"):
            at = draw(st.integers(0, len(text)))
            char = draw(st.one_of(st.sampled_from(chars), st.characters()))
            if kind == "delete":
                text = text[:at] + text[at + 1 :]
            elif kind == "insert":
                text = text[:at] + char + text[at:]
            else:
                text = text[:at] + char + text[at + 1 :]
        else:
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if kind == "del_line":
                del lines[i]
            elif kind == "dup_line":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text
