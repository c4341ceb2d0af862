"""Mutated rust_circuit-style texts either parse (and round-trip) or raise ParseError.

The base texts use every spelling the parser accepts beyond our own printer's
(comments with colour codes, an indented block, blank lines, spaces in lists,
only-child markers, tree drawing, fancy einsums, sized rearranges, index
tensors by hash, random arrays, rust_circuit's function names, tags, scatters,
symbols with uuids, repeated output letters and the empty einsum, quoted
identifiers with their own names, repeats restating their info, AD, named
axes, digit separators and products in shapes, names with backslashes as
rust_circuit reads them, a reference circuit and a bare Array), so a
mutation lands in each of their code paths.  Nothing else may escape: no
IndexError, ValueError or KeyError from a half-read line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as cc
from circuits.text.store import TensorStore
from parse_helpers import check_parse_or_parse_error as check_text
from parse_helpers import mutated

STORE = TensorStore(Path(tempfile.mkdtemp(prefix="circuits-fuzz-")) / "tensors")
ROWS = STORE.save(torch.tensor([1, 2, 0], dtype=torch.int64))[:10]
WEIGHT = STORE.save(torch.arange(12.0).reshape(3, 4))[:24]

PASTED = f"""
    # a circuit as rust_circuit prints it, pasted from an indented string
    0 'logits' [3] Add   # trailing comment \x1b[31mred\x1b[0m
      1 'proj' [3] Einsum fancy: rows cols, cols -> rows
        'w' [3, 4] Array {WEIGHT}
        2 'v' [4] GeneralFunction gaussian_cdf
          3 'x' [4] Array rand

      4 'picked' [3] Index [t{ROWS} [3], 0]
        5 'table' [3, 2] Rearrange (a:3 b) -> a:3 b
          6 [6] Scalar 0.5
      7 'cat' [3] Concat 0
        8 [1] Scalar 1
        9 'ends' [2] Index [ 1:3 ]
          'v'
    10 'sm' [3] GeneralFunction softmax
    ▼
    11 'neg' Einsum a,->a
      'logits'
      12 [] Scalar -1
"""

ARROWS = "\n".join(
    [
        "0 'r' Add",
        "├‣1 'a' GeneralFunction step",
        "│ ▼",
        "│ 2 'b' Add",
        "│ |/",
        "│ 3 'c' Einsum ab->a",
        "│   4 'x' [3, 4] Symbol",
        "└‣5 'p' [3] GeneralFunction pow",
        "  ├‣6 'y' [3] Symbol",
        "  └‣7 [] Scalar 2",
    ]
)

NODES = """0 'r' Add
  1 [5, 3, 6] Scatter [0:5,0:3,0:3]
    2 'c' Concat 0
      3 [2, 3, 3] Scalar 1.2
      4 Tag 1a280c74-fa9f-4dd9-94f4-5cca4a0cf243
        5 [3, 3, 3] Scalar 1.2
  8 [] Einsum ->
  9 'k' Cumulant
    10 'v' DiscreteVar
      11 [4, 6] Scalar 0.5
      12 [4] Scalar 0.25
  13 StoredCumulantVar 1,2|1a280c74-fa9f-4dd9-94f4-5cca4a0cf243
    14 [6] Scalar 0.1
    15 [6, 6] Scalar 1.2
6 'd' [3,2,3,3] Einsum ab->abaa
  7 's' [3, 2] Symbol 6c6805a0-3aaf-492c-93a3-00851eacaacf"""

# the reference circuit every parse here is given (rust_circuit's reference_circuits)
OUTSIDE = cc.Scalar(0.25, shape=(3, 1), name="outside")

IDENTS = r"""0 'top' AD [3, 1] Add
  1 [rows:3, 1] Scatter [0:2,0:1]
    '  w id' '# w' [2, 1] Scalar 1
  2 'sum' [1] Einsum ab->b
    '  w id'
  2 [1] Einsum
  3 [3_, 1] Scalar 0.5
  3 Scalar
  4 '\\'\\' [3*1, 1] Scalar 2
  4 Scalar
  'outside'
  6 [3, 1] Array
7 [1_000] Scalar 0"""

BASES = [PASTED, ARROWS, NODES, IDENTS]
BASE_LINES = [line for base in BASES for line in base.split("\n")] + ["", "  # c", "▼", "|/"]
RUST_CHARS = "'\\#[]()->,: =\n\t0123456789abcdeftxyzADEIS.é_*!▼|/├└‣│─\x1b"


def check_parse_or_parse_error(text: str, tensors_as_random: bool) -> None:
    """Either parses and round-trips through our printer, or raises ParseError naming a real line."""
    options = dict(store=STORE, tensors_as_random=tensors_as_random, reference_circuits=[OUTSIDE])
    check_text(text, strict=False, **options)


def test_the_base_texts_parse():
    pasted = cc.parse_many(PASTED, store=STORE)
    assert [root.name for root in pasted] == ["logits", "sm"]
    assert cc.parse(ARROWS).name == "r"
    assert [root.name for root in cc.parse_many(NODES)] == ["r", "d"]
    top, thousand = cc.parse_many(IDENTS, tensors_as_random=True, reference_circuits=[OUTSIDE])
    assert top.name == "top" and thousand.shape == (1000,)
    assert OUTSIDE in top.children


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(BASES, RUST_CHARS), st.booleans())
def test_mutated_rust_texts_parse_or_raise_parse_error(text, tensors_as_random):
    check_parse_or_parse_error(text, tensors_as_random)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(BASE_LINES), max_size=12))
def test_shuffled_rust_lines_parse_or_raise_parse_error(lines):
    check_parse_or_parse_error("\n".join(lines), tensors_as_random=False)


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=st.sampled_from(RUST_CHARS), max_size=80))
def test_random_rust_characters_parse_or_raise_parse_error(text):
    check_parse_or_parse_error(text, tensors_as_random=False)
