"""Printing a hypothesis and a scrubbed circuit: the expected text is written out by hand for the
small arithmetic circuit of test_cs_experiment (``out = (a + b) + c``, columns of ``x``)."""

from __future__ import annotations

import pytest
import torch
from test_cs_experiment import circuit, dataset

import circuits as cc
from circuits.causal_scrubbing import (
    Correspondence,
    Dataset,
    ExactSampler,
    Experiment,
    FuncSampler,
    InterpNode,
    corr_root_matcher,
)
from circuits.errors import PrintError


def scrubbed():
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    corr.add(root.make_descendant(FuncSampler(lambda d: d.x.value[:, 0]), "a"), corr_root_matcher.chain("a"))
    return root, Experiment(circuit(7), dataset(), corr, random_seed=0).scrub(4)


def test_the_scrubbed_circuit_stops_below_mapped_leaves_and_names_whose_data_each_input_is():
    _, result = scrubbed()
    assert result.print(repr=True, print_data=False).splitlines() == [
        "'out' Add  # root",
        "  's' Add",
        "    'a' [4] Index [:,0]  # a",
        "      ... 1 children not shown",
        "    'b' [4] Index [:,1]",
        "      ... 1 children not shown",
        "  'c' [4] Index [:,2]",
        "    ... 1 children not shown",
    ]
    assert result.print(repr=True, print_data=False, show_inputs=True).splitlines()[4:] == [
        "    'b' [4] Index [:,1]",
        "      'x' [4,3] Array "
        + result.sampled_inputs.other_inputs_datasets[result.nodes.get_root()].x.repr()[-24:]
        + "  # data of other inputs of root",
        "  'c' [4] Index [:,2]",
        "    'x'",
    ]


def test_comments_show_each_sampler_and_the_datum_it_drew():
    root, result = scrubbed()
    sampled = result.sampled_inputs
    a_node = root.children[0]
    text = result.print(repr=True)
    first_ref = str(result.ref_ds[0])
    assert f"# root: cond_sampler=ExactSampler(d={first_ref}), other_inputs_sampler=UncondSampler(d=" in text
    feature = sampled[a_node].x.value[0, 0].item()
    assert f"# a: cond_sampler=FuncSampler(d={sampled[a_node][0]}, f(d)={feature})" in text
    assert "\x1b[" not in text  # repr=True: no colour codes
    assert root.print(None, sampled, repr=True).splitlines() == [
        f"root  # cond_sampler=ExactSampler(d={first_ref}), "
        f"other_inputs_sampler=UncondSampler(d={sampled.other_inputs_datasets[root][0]})",
        f"  a  # cond_sampler=FuncSampler(d={sampled[a_node][0]}, f(d)={feature})",
    ]


def test_printing_to_the_terminal_colours_by_data(capsys):
    root, result = scrubbed()
    result.print()
    root.print(sampled_inputs=result.sampled_inputs)
    out = capsys.readouterr().out
    assert "\x1b[" in out and "'out' Add" in out and "root  #" in out


# ------------------------------------------------------------------ print options (rust_circuit's first argument)


def test_print_options_come_first_and_are_circuit_repr_keywords():
    _, result = scrubbed()
    stopped = [
        "'out' Add  # root",
        "  's' Add",
        "    ... 2 children not shown",
        "  'c' [4] Index [:,2]",
        "    ... 1 children not shown",
    ]
    assert result.print({"depth": 1}, repr=True, print_data=False).splitlines() == stopped
    # a traversal stops the printout where it or the mapped nodes stop
    one_level = {"traversal": cc.IterativeMatcher(True, max_depth=1)}
    assert result.print(one_level, repr=True, print_data=False).splitlines() == stopped
    assert result.print({"arrows": True, "shapes": True}, False, repr=True).splitlines() == [
        "'out' [4] Add  # root",
        "├‣'s' [4] Add",
        "│ ├‣'a' [4] Index [:,0]  # a",
        "│ │   ... 1 children not shown",
        "│ └‣'b' [4] Index [:,1]",
        "│     ... 1 children not shown",
        "└‣'c' [4] Index [:,2]",
        "    ... 1 children not shown",
    ]
    # a comment of the caller's comes before the scrubbing one
    commented = result.print({"comment": lambda node: node.name.upper()}, repr=True, print_data=False)
    assert commented.splitlines()[:3] == [
        "'out' Add  # OUT; root",
        "  's' Add  # S",
        "    'a' [4] Index [:,0]  # A; a",
    ]
    coloured = result.print(
        {"color": lambda node: "red" if node.name == "s" else None},
        color_by_data=False,
        repr=True,
        print_data=False,
    )
    assert coloured.splitlines()[:2] == ["'out' Add  # root", "  \x1b[31m's' Add\x1b[0m"]


def test_interp_node_print_takes_options_then_sampled_inputs_as_rust_circuit():
    root, result = scrubbed()
    text = root.print(
        {"comment": lambda node: node.name.upper(), "color": lambda node: "red" if node is root else None},
        result.sampled_inputs,
        print_data=False,
        color_by_data=False,
        repr=True,
    )
    assert text.splitlines() == ["\x1b[31mroot  # ROOT\x1b[0m", "  a  # A"]


def test_print_options_that_cannot_be_used_are_errors_naming_options():
    root, result = scrubbed()
    with pytest.raises(PrintError, match="options .*got SampledInputs"):  # the call before rust's order
        root.print(result.sampled_inputs)
    with pytest.raises(PrintError, match="options .*got bool"):
        result.print(True)
    with pytest.raises(PrintError, match=r"options \['nope'\] are not among"):
        result.print({"nope": 1}, repr=True)
    with pytest.raises(PrintError, match=r"options \['arrows'\] are not among \['comment', 'color'\]"):
        root.print({"arrows": True}, repr=True)
    for printer in (root.print, result.print):
        with pytest.raises(PrintError, match=r"options\['color'\] is used with color_by_data=False only"):
            printer({"color": lambda node: "red"}, repr=True)
    with pytest.raises(PrintError, match=r"options\['comment'\] must return a str or None, got int"):
        root.print({"comment": lambda node: 3}, repr=True)


def test_a_scrubbed_circuit_on_one_example_prints_as_rust_circuits_test_print():
    """rust_circuit's test_print: the circuit on one example, the inputs variables of the group."""
    first = cc.Index(cc.Array(torch.zeros(2), name="xs"), (0,))
    times = [
        cc.Einsum.from_einsum_string(",->", first, cc.Scalar(k), name=n) for k, n in ((2.0, "A"), (3.0, "B"))
    ]
    data = Dataset(
        {
            "xs": torch.randint(10, (100, 2), generator=torch.Generator().manual_seed(11)),
            "labels": torch.arange(100, 200),
        }
    )
    corr = Correspondence()
    c_t = InterpNode(FuncSampler(lambda d: d.xs.value[:, 0]), "Ct")
    a_t = c_t.make_descendant(FuncSampler(lambda d: d.xs.value[:, 0]), "A")
    corr.add(c_t, corr_root_matcher)
    corr.add(a_t, corr_root_matcher.chain("A"))
    result = Experiment(cc.Add(*times, name="C"), data, corr, random_seed=11).scrub(1)
    sampled = result.sampled_inputs
    ct_data, other, a_data = sampled.datasets[c_t], sampled[c_t], sampled[a_t]
    x0 = a_data.xs.value[0, 0].item()
    assert result.print(None, color_by_data=False, repr=True).splitlines() == [
        f"'C' Add  # Ct: cond_sampler=FuncSampler(d={ct_data}, f(d)={ct_data.xs.value[0, 0].item()}), "
        f"other_inputs_sampler=UncondSampler(d={other})",
        f"  'A' Einsum ,->  # A: cond_sampler=FuncSampler(d={a_data}, f(d)={x0})",
        "    ... 2 children not shown",
        "  'B' Einsum ,->",
        "    ... 2 children not shown",
    ]
    assert x0 == ct_data.xs.value[0, 0].item() == result.ref_ds.xs.value[0, 0].item()
    torch.testing.assert_close(result.evaluate(), 2.0 * x0 + 3.0 * other.xs.value[:, 0])
