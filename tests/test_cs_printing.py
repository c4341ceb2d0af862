"""Printing a hypothesis and a scrubbed circuit: the expected text is written out by hand for the
small arithmetic circuit of test_cs_experiment (``out = (a + b) + c``, columns of ``x``)."""

from __future__ import annotations

from test_cs_experiment import circuit, dataset

from circuits.causal_scrubbing import (
    Correspondence,
    ExactSampler,
    Experiment,
    FuncSampler,
    InterpNode,
    corr_root_matcher,
)


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
    assert root.print(sampled, repr=True).splitlines() == [
        f"root  # cond_sampler=ExactSampler(d={first_ref}), "
        f"other_inputs_sampler=UncondSampler(d={sampled.other_inputs_datasets[root][0]})",
        f"  a  # cond_sampler=FuncSampler(d={sampled[a_node][0]}, f(d)={feature})",
    ]


def test_printing_to_the_terminal_colours_by_data(capsys):
    root, result = scrubbed()
    result.print()
    root.print(result.sampled_inputs)
    out = capsys.readouterr().out
    assert "\x1b[" in out and "'out' Add" in out and "root  #" in out
