"""An import names each module's output after the module: the node's value is what the module returned
(a forward hook's), and overview, the cost and the profile read the model's structure off those nodes,
as torch.profiler's module view does."""

from __future__ import annotations

import math

import factories
import pytest
import torch

import circuits as cc
from circuits import models
from circuits.experiments.cost_groups import by_module, cost_table, module_table
from circuits.experiments.overview import overview

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
TOL = dict(atol=1e-5, rtol=1e-5)
N_EMBD, BATCH, SEQ = 15, 2, 7


def _hooked(model: torch.nn.Module, *inputs) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """The model's output and each module's outputs (one per call), recorded by forward hooks."""
    seen: dict[str, list[torch.Tensor]] = {}
    handles = [
        module.register_forward_hook(
            lambda _, __, out, path=path: seen.setdefault(path, []).append(
                out if isinstance(out, torch.Tensor) else out[0]
            )
        )
        for path, module in model.named_modules()
        if path
    ]
    with torch.no_grad():
        result = model(*inputs)
    for handle in handles:
        handle.remove()
    return result, seen


@pytest.fixture(scope="module")
def gpt2():
    model = factories.gpt2(seed=None, n_embd=N_EMBD, n_head=3, vocab_size=41, n_positions=19)
    tokens = torch.randint(0, 41, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    output, seen = _hooked(model, tokens)
    return models.from_torch(model, (tokens,)), output.logits, seen


def test_each_modules_node_is_what_the_module_returned(gpt2):
    circuit, logits, seen = gpt2
    torch.testing.assert_close(circuit.evaluate(), logits, **TOL)
    named = {node.name: node for node in cc.unique_nodes([circuit]) if node.name in seen}
    for layer in range(2):
        for part in (
            "",
            ".ln_1",
            ".attn",
            ".attn.c_attn",
            ".attn.c_proj",
            ".ln_2",
            ".mlp",
            ".mlp.c_fc",
            ".mlp.act",
        ):
            assert f"transformer.h.{layer}{part}" in named
    assert {"transformer", "transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"} <= set(named)
    for path, node in named.items():
        assert isinstance(node, cc.Add) and len(node.children) == 1  # the identity, named after the module
        torch.testing.assert_close(node.evaluate(), seen[path][0], **TOL)
    # modules that compute nothing (eval-mode dropouts hand on their input) get no node of their own
    assert not {
        "transformer.drop",
        "transformer.h.0.mlp.dropout",
        "transformer.h.0.attn.resid_dropout",
    } & set(named)


def test_print_to_a_depth_reads_as_the_modules(gpt2):
    circuit, _, _ = gpt2
    lines = circuit.repr(depth=4).splitlines()
    assert [line.split("'")[1] for line in lines[:5]] == [
        "lm_head",
        "lm_head.linear",
        "transformer",
        "transformer.ln_f",
        "transformer.ln_f.layer_norm",
    ]


def test_overview_of_an_import_finds_its_layers(gpt2):
    circuit, _, _ = gpt2
    text = overview(circuit)
    lines = text.splitlines()
    assert lines[0].startswith(
        "Add 'lm_head' [2,7,41]: 2 layers (modules transformer.h.0 to transformer.h.1)"
    )
    for layer in range(2):
        assert f"  ({layer}) 'transformer.h.{layer}' [2,7,15] Add" in lines
        assert f"    mlp: 'transformer.h.{layer}.mlp' [2,7,15] Add" in lines
        assert f"    attn: 'transformer.h.{layer}.attn' [2,7,15] Add" in lines
    assert lines.index("  transformer.wte: 'transformer.wte' [2,7,15] Add") < lines.index(
        "  (0) 'transformer.h.0' [2,7,15] Add"
    )
    assert lines[-1] == "  lm_head: 'lm_head' [2,7,41] Add"


def test_cost_by_module_counts_each_node_once_in_the_module_that_computed_it(gpt2):
    circuit, _, _ = gpt2
    result = cc.cost(circuit)
    groups = result.grouped(by_module(circuit))
    assert sum(t.flop_count for t in groups.values()) == result.total.flop_count
    rows, d = BATCH * SEQ, N_EMBD
    # c_fc: [rows, d] @ [d, 4d] (2 FLOPs a multiply-add) and its bias; the GELU around it is `act`'s
    assert groups["transformer.h.0.mlp.c_fc"].flops == {"matmul": 2 * rows * d * 4 * d, "add": rows * 4 * d}
    assert groups["transformer.h.1.mlp.act"].flops["pow"] == rows * 4 * d
    table = module_table(result).splitlines()
    assert table[0].split("|")[0].strip() == "Module"
    assert any(line.startswith("││││├── c_fc ") for line in table)
    whole = next(line for line in table if line.startswith("├── transformer "))
    assert whole.split("|")[2].strip() == cc.evaluation.costs.format_flops(
        sum(t.flop_count for g, t in groups.items() if g.startswith("transformer"))
    )
    assert cost_table(circuit, by="module", depth=2).splitlines()[-1].startswith("│├── ")


def test_profile_by_module_sums_to_the_run(gpt2):
    circuit, _, _ = gpt2
    result = cc.profile(circuit)
    groups = result.grouped(by_module(circuit))
    assert math.isclose(sum(s for s, _ in groups.values()), sum(result.self_seconds.values()), rel_tol=1e-9)
    assert sum(count for _, count in groups.values()) == len(result.nodes)
    lines = module_table(result, depth=3).splitlines()
    assert lines[0].split("|")[0].strip() == "Module" and "Self CPU total" in lines[0]
    assert any(line.startswith("││├── 1 ") for line in lines)
    assert not any(line.startswith("│││├── ") for line in lines)  # nothing below depth 3


class Repeated(torch.nn.Module):
    """One module called three times, and one returning two tensors."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 5)
        self.pair = Pair()

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.lin(x))
        a, b = self.pair(x)
        return a * b


class Pair(torch.nn.Module):
    def forward(self, x):
        return x + 1, x * 2


def test_a_module_called_again_is_named_by_its_call():
    model = Repeated()
    x = torch.randn(3, 5)
    expected, seen = _hooked(model, x)
    circuit = models.from_torch(model, (x,))
    torch.testing.assert_close(circuit.evaluate(), expected, **TOL)
    for call, name in enumerate(["lin", "lin@1", "lin@2"]):
        torch.testing.assert_close(circuit.get_unique(name).evaluate(), seen["lin"][call], **TOL)
    torch.testing.assert_close(circuit.get_unique("pair.out0").evaluate(), _pair_outputs(model, x)[0], **TOL)
    torch.testing.assert_close(circuit.get_unique("pair.out1").evaluate(), _pair_outputs(model, x)[1], **TOL)
    lin_row = next(
        line for line in module_table(cc.cost(circuit)).splitlines() if line.startswith("├── lin ")
    )
    assert lin_row.split("|")[-1].strip() == "3"  # three calls


def _pair_outputs(model: Repeated, x: torch.Tensor):
    with torch.no_grad():
        for _ in range(3):
            x = torch.tanh(model.lin(x))
        return x + 1, x * 2
