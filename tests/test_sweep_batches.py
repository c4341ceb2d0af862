"""The batched path of ``ex.sweep`` (``circuits.experiments.sweep_batches``) on a deep model.

A float64 Hugging Face Llama of 5 layers (grouped-query attention, tied embeddings): zero-ablating
every head through the batched path must give what the model gives with that head's slice of
``o_proj``'s input zeroed (a forward pre-hook, TransformerLens's way), and what each ablated
circuit gives evaluated alone, for a Metric, a pushed-down one (``logit_diff``) and a plain
function of the root; targets the path cannot take go the general way with the same results.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from factories import FAMILY_VOCAB as VOCAB
from factories import llama, scaled_weights
from hf_reference import logits_with_head_zeroed, random_tokens, without_float32_round_trips
from torch.utils.flop_counter import FlopCounterMode

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.experiments import sweep_batches
from circuits.experiments.metrics import Metric, find

pytest.importorskip("transformers")

LAYERS, HEADS, D_HEAD = 5, 4, 8
TOL = 1e-10


@pytest.fixture(scope="module")
def deep():
    """The float64 model, its tokens ``[3, 9]`` and the unsplit circuit."""
    model = llama(
        2, tied=True, perturb=scaled_weights, dtype=torch.float64, num_hidden_layers=LAYERS, rms_norm_eps=1e-5
    )
    tokens = random_tokens(VOCAB, True, length=9, seed=3)
    return model, tokens, cm.from_hf(model, tokens)


@pytest.fixture(scope="module")
def split(deep):
    """The circuit with every layer split, as the general path ablates heads."""
    return cc.passes.split_heads(deep[2])


@pytest.fixture(autouse=True)
def float64_reference(monkeypatch):
    without_float32_round_trips(monkeypatch, "llama")


def zeroed_logits(model, tokens, layer: int, head: int) -> torch.Tensor:
    projection = model.model.layers[layer].self_attn.o_proj
    return logits_with_head_zeroed(model, tokens[:, :-1], projection, head, D_HEAD)


def every_head() -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]


def alone(split, name: str, metric) -> float:
    """The metric of ``name`` zero-ablated in the split circuit, evaluated by itself."""
    return float(metric.circuit(ex.zero_ablate(split, name)).evaluate())


def test_every_head_of_an_unsplit_deep_model_is_batched(deep):
    _, _, circuit = deep
    items = [(name, name) for name in ex.head_names(circuit)]
    chunks, rest = sweep_batches.batched_chunks(circuit, items, ex.zero_ablate, ex.mean_loss.circuit)
    assert rest == [] and len(chunks) == LAYERS
    assert [label for chunk in chunks for label in chunk.labels] == [name for name, _ in items]
    # another ablation takes the general path: one rewritten circuit per target
    assert sweep_batches.batched_chunks(circuit, items, ex.mean_ablate, ex.mean_loss.circuit) == ([], items)


def test_mean_loss_sweep_equals_the_hooked_model_and_each_ablation_alone(deep, split):
    model, tokens, circuit = deep
    table = ex.sweep(circuit, ex.head_names(circuit), progress=False)
    targets = tokens[:, 1:].reshape(-1)
    for layer, head in every_head():
        logits = zeroed_logits(model, tokens, layer, head)
        hooked = F.cross_entropy(logits.reshape(-1, VOCAB), targets).item()
        assert table[f"b{layer}.a.head{head}"] == pytest.approx(hooked, abs=TOL)
    for name in ["b0.a.head0", "b2.a.head3", "b4.a.head1"]:
        assert table[name] == pytest.approx(alone(split, name, ex.mean_loss), abs=TOL)
    assert table.baseline == pytest.approx(float(circuit.evaluate().mean()), abs=TOL)


def test_logit_diff_sweep_pushes_its_index_down_to_the_layer_input(deep, split):
    """``logit_diff`` pushes its Index toward the leaves, through every layer to the ablated
    one's input: the batched circuit reads it at the last position as the ablated one does."""
    model, tokens, circuit = deep
    good, bad = torch.tensor([3, 5, 7]), torch.tensor([11, 13, 2])
    metric = ex.logit_diff(-1, good, bad)
    table = ex.sweep(circuit, ex.head_names(circuit), ex.zero_ablate, metric, progress=False)
    rows = torch.arange(3)
    for layer, head in every_head():
        last = zeroed_logits(model, tokens, layer, head)[:, -1]
        want = (last[rows, good] - last[rows, bad]).mean().item()
        assert table[f"b{layer}.a.head{head}"] == pytest.approx(want, abs=TOL)
    assert table["b1.a.head2"] == pytest.approx(alone(split, "b1.a.head2", metric), abs=TOL)
    # below the top layer every position is computed for the next layer's keys: the index stops there
    chunks, _ = sweep_batches.batched_chunks(circuit, [("b0.a.head0",) * 2], ex.zero_ablate, metric.circuit)
    mlps = [node.name for node in cc.unique_nodes(chunks[0].batched) if (node.name or "").endswith(".m")]
    assert sorted(mlps) == [f"b{layer}.m" for layer in range(LAYERS)]


def test_a_function_of_the_root_and_chunks_smaller_than_a_layer(deep, monkeypatch):
    """A plain function gets each target's root value; a small budget splits a layer's heads
    into several batches, with the same values."""
    model, tokens, circuit = deep
    monkeypatch.setattr(sweep_batches, "BATCH_BYTES", 1)  # one target per batch
    names = ["b1.a.head0", "b1.a.head1", "b1.a.head3", "b3.a.head2"]
    items = [(name, name) for name in names]
    chunks, _ = sweep_batches.batched_chunks(circuit, items, ex.zero_ablate, lambda c: c)
    assert [len(chunk.labels) for chunk in chunks] == [1, 1, 1, 1]
    table = ex.sweep(circuit, names, metric=lambda loss: loss[:, -1].mean(), progress=False)
    for name in names:
        layer, head = int(name[1]), int(name[-1])
        last = zeroed_logits(model, tokens, layer, head)[:, -1]
        want = F.cross_entropy(last, tokens[:, -1]).item()
        assert table[name] == pytest.approx(want, abs=TOL)


def test_head_groups_and_a_partly_split_circuit(deep, split):
    model, tokens, circuit = deep
    partly = cc.passes.split_heads(circuit, layers=[2])
    table = ex.sweep(partly, ["b2.a.head1", "b1.a.head0-1", "b3.a.head3"], progress=False)
    assert table["b2.a.head1"] == pytest.approx(alone(split, "b2.a.head1", ex.mean_loss), abs=TOL)
    assert table["b3.a.head3"] == pytest.approx(alone(split, "b3.a.head3", ex.mean_loss), abs=TOL)
    grouped = cc.passes.split_heads(circuit, layers=[1], heads=[[0, 1], [2], [3]])
    want = float(ex.mean_loss.circuit(ex.zero_ablate(grouped, "b1.a.head0-1")).evaluate())
    assert table["b1.a.head0-1"] == pytest.approx(want, abs=TOL)


def test_what_the_batched_path_cannot_take_goes_the_general_way(deep):
    """A metric that reads a node only the ablated layer reaches cannot be built over the
    layer as an input; a head branch used outside its layer's sum is not zeroed by zeroing the
    sum.  Both are measured on their own rewritten circuits, as before."""
    _, _, circuit = deep
    split = cc.passes.split_heads(circuit, layers=[1])
    branch = split.get_unique("b1.a.head2")
    reads_head2 = Metric(lambda c: _mean_of(find(c, "b1.a.head2", "head2")), "head2")
    items = [("b1.a.head0", "b1.a.head0")]
    chunks, rest = sweep_batches.batched_chunks(split, items, ex.zero_ablate, reads_head2.circuit)
    assert chunks == [] and rest == items
    table = ex.sweep(split, ["b1.a.head0"], ex.zero_ablate, reads_head2, progress=False)
    assert table["b1.a.head0"] == pytest.approx(float(branch.evaluate().mean()), abs=TOL)

    shared = cc.Add(_mean_of(split), _mean_of(branch), name="shared")
    items = [("b1.a.head2", "b1.a.head2")]
    assert sweep_batches.batched_chunks(shared, items, ex.zero_ablate, lambda c: c) == ([], items)
    table = ex.sweep(shared, ["b1.a.head2"], metric=lambda value: value, progress=False)
    assert table["b1.a.head2"] == pytest.approx(
        float(ex.zero_ablate(shared, "b1.a.head2").evaluate()), abs=TOL
    )


def _mean_of(node: cc.Circuit) -> cc.Circuit:
    letters = "abcdefgh"[: node.rank]
    return cc.Einsum.from_einsum_string(f"{letters},->", node, cc.Scalar(1.0 / math.prod(node.shape)))


@pytest.mark.parametrize("budget", [None, 1], ids=["a-layer-per-chunk", "a-head-per-chunk"])
def test_the_plan_counts_the_flops_the_batched_sweep_runs(deep, monkeypatch, budget):
    _, _, circuit = deep
    if budget is not None:
        monkeypatch.setattr(sweep_batches, "BATCH_BYTES", budget)
    names = ex.head_names(circuit)
    plan = ex.sweep_plan(circuit, names)
    with FlopCounterMode(display=False) as counter:
        ex.sweep(circuit, names, progress=False)
    assert plan.cost.total.flops["matmul"] == counter.get_total_flops()
    assert plan.circuits == len(names) + 1
