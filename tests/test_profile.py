"""``cc.profile``: every node the evaluator computes is timed once, the times nest as the circuit
does, and the printed, tabled and Chrome-trace forms say the same.  The checks are relations that
hold whatever the clock reads (no timing thresholds)."""

from __future__ import annotations

import json
import math
from collections import Counter

import factories
import pytest
import torch

import circuits as cc
from circuits.errors import EvaluationError
from circuits.evaluation.profiling import profile


@pytest.fixture(scope="module")
def gpt2():
    return factories.gpt2_circuit(torch.randint(0, 17, (2, 7)), factories.gpt2_config(), seed=1)


def computed_nodes(circuit):
    """The nodes the evaluator runs a step for: every distinct node but the leaves."""
    return [n for n in cc.unique_nodes(circuit) if n.children]


def test_every_computed_node_is_timed_once_and_the_value_is_the_evaluation(gpt2):
    result = profile(gpt2)
    assert Counter(n.hash for n in result.nodes) == Counter(n.hash for n in computed_nodes(gpt2))
    assert all(seconds >= 0 for seconds in result.self_seconds.values())
    assert sum(result.self_seconds.values()) <= result.seconds  # disjoint intervals of the run


def test_totals_nest_like_the_circuit(gpt2):
    result = profile(gpt2)
    assert math.isclose(result.total_seconds(gpt2), sum(result.self_seconds.values()), rel_tol=1e-9)
    head = gpt2.get_unique("b1.a")
    below = [n for n in cc.unique_nodes(head) if n.hash in result.self_seconds]
    assert math.isclose(
        result.total_seconds(head), sum(result.self_seconds[n.hash] for n in below), rel_tol=1e-9
    )
    for child in head.children:
        assert result.total_seconds(child) <= result.total_seconds(head)


def test_the_printed_profile_parses_back_to_the_circuit(gpt2):
    result = profile(gpt2)
    text = result.repr(depth=None)
    assert "# self " in text and ", total " in text
    assert cc.parse(text) == gpt2


def test_the_table_counts_nodes_by_name(gpt2):
    result = profile(gpt2)
    names = Counter(n.name if n.name is not None else f"<{n.kind}>" for n in computed_nodes(gpt2))
    rows = result.rows()
    assert {name: calls for name, _, _, calls in rows} == dict(names)
    selfs = [self_s for _, self_s, _, _ in rows]
    assert selfs == sorted(selfs, reverse=True)
    table = result.table(top=5).splitlines()
    assert table[0].split("|")[0].strip() == "Node" and len(table) == 2 + 5 + 1
    assert table[2].split("|")[0].strip() == rows[0][0]


def test_the_chrome_trace_has_one_event_per_node_in_run_order(gpt2, tmp_path):
    result = profile(gpt2)
    path = tmp_path / "trace.json"
    result.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert len(events) == len(result.nodes)
    for event, following in zip(events, events[1:]):
        assert event["ph"] == "X" and event["ts"] + event["dur"] <= following["ts"] + 1e-6


def test_bad_input_is_refused():
    with pytest.raises(EvaluationError, match="profile"):
        profile("not a circuit")


def test_the_nested_table_follows_the_circuit(gpt2):
    result = profile(gpt2)
    lines = result.tree(depth=2).splitlines()
    assert lines[0].split("|")[0].strip() == "Node"
    rows = [line.split("|") for line in lines[2:]]
    assert (
        rows[0][0].strip() == gpt2.name and rows[0][2].strip() == f"{result.total_seconds(gpt2) * 1e3:.3f}ms"
    )
    inner = [child for child in gpt2.children if child.children]
    depth_one = [row[0].strip()[4:] for row in rows if row[0].startswith(("├── ", "└── "))]
    assert depth_one == [child.name for child in inner]
    assert all(len(row[0]) - len(row[0].lstrip(" │")) <= 2 for row in rows)  # nothing below depth 2
    assert lines[-1].split("|")[0].lstrip(" │").startswith("└── ")


def test_the_table_has_torch_profilers_shares_and_averages(gpt2):
    """Self CPU % are the rows' self times over the run's (they sum to 100% over every row), CPU total %
    the total times over it, and CPU time avg the total time per call, as in key_averages().table()."""
    result = profile(gpt2)
    lines = result.table(top=None).splitlines()
    header = [cell.strip() for cell in lines[0].split("|")]
    assert header == [
        "Node",
        "Self CPU %",
        "Self CPU total",
        "CPU total %",
        "CPU total",
        "CPU time avg",
        "Number of Calls",
    ]
    run = sum(result.self_seconds.values())
    cells = [[cell.strip() for cell in line.split("|")] for line in lines[2:-1]]
    assert len(cells) == len(result.rows())
    assert math.isclose(sum(float(row[1].rstrip("%")) for row in cells), 100.0, abs_tol=0.01 * len(cells))
    for (name, self_s, total_s, calls), row in zip(result.rows(), cells):
        assert row[0] == name and row[6] == str(calls)
        assert row[1] == f"{100 * self_s / run:.2f}%" and row[3] == f"{100 * total_s / run:.2f}%"
        assert row[5] == f"{total_s / calls * 1e3:.3f}ms"
