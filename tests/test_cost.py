"""``cc.cost``: FLOPs against hand counts and torch's flop counter, peak memory against the profiler.

The references are independent of ``circuits.evaluation.costs``: FLOPs of single
einsums are counted by hand here; the GPT-2 circuit's matmul FLOPs are
``torch.utils.flop_counter.FlopCounterMode`` on the Hugging Face model's own
forward; the peak memory is what torch's profiler records while
``cc.evaluate`` runs (its allocation and free events, summed in time order).
"""

from __future__ import annotations

import importlib.util
import math
import threading
from pathlib import Path

import factories
import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import circuits as cc
import circuits.models as cm
from circuits.evaluation import reduced
from circuits.experiments.cost_groups import by_head, by_layer, cost_table
from circuits.evaluation.costs import format_bytes
from circuits.evaluation import compile_plan
from circuits.transformer import names

GOLDEN = Path(__file__).resolve().parent / "data" / "attn_only_2l.circ"
GOLDEN_DIMS = cm.AttnOnlyConfig(n_layers=2, n_heads=8, d_model=256, d_head=32, vocab_size=50259, n_ctx=2048)


def _array(*shape: int, name: str) -> cc.Array:
    return cc.Array(torch.zeros(shape), name=name)


def _flops(string: str, *shapes: tuple[int, ...]) -> dict[str, int]:
    nodes = [_array(*shape, name=f"x{i}") for i, shape in enumerate(shapes)]
    einsum = cc.Einsum.from_einsum_string(string, *nodes, name="e")
    return dict(cc.cost(einsum)[einsum].flops)


# ------------------------------------------------------------- hand counts


def test_matmul_is_two_flops_per_multiply_add():
    assert _flops("ij,jk->ik", (3, 4), (4, 5)) == {"matmul": 2 * 3 * 4 * 5}


def test_three_operand_chain_takes_the_cheaper_order():
    # (ab)c: 2*3*4*5 + 2*3*5*6 = 300; a(bc) would be 2*4*5*6 + 2*3*4*6 = 384
    assert _flops("ij,jk,kl->il", (3, 4), (4, 5), (5, 6)) == {"matmul": 300}
    # the other way round, a(bc) is cheaper: 2*5*4*3 + 2*6*5*3 = 300 against 2*6*5*4 + 2*6*4*3 = 384
    assert _flops("ij,jk,kl->il", (6, 5), (5, 4), (4, 3)) == {"matmul": 2 * 5 * 4 * 3 + 2 * 6 * 5 * 3}


def test_reduction_is_one_add_per_input_element():
    assert _flops("ij->i", (3, 4)) == {"add": 12}


def test_batched_matmul():
    assert _flops("bij,bjk->bik", (2, 3, 4), (2, 4, 5)) == {"matmul": 2 * 2 * 3 * 4 * 5}


def test_products_without_a_sum_and_multipliers():
    assert _flops("ih,h->ih", (3, 4), (4,)) == {"mul": 12}  # torch.einsum runs a mul, not a bmm
    # the kernel contracts qc,kc->qk, then multiplies by the scale and the mask over the output
    assert _flops("qc,kc,,qk->qk", (5, 2), (7, 2), (), (5, 7)) == {"matmul": 2 * 5 * 7 * 2, "mul": 2 * 5 * 7}
    # a batched dot is a product then a sum (the kernel does not call bmm)
    assert _flops("bih,bih->bi", (2, 3, 4), (2, 3, 4)) == {"mul": 24, "add": 24}


@pytest.mark.parametrize(
    "string, shapes",
    [("ij,->", ((3, 8), ())), ("ijk,jl->il", ((2, 3, 5), (3, 7))), ("ij,j->", ((3, 8), (8,)))],
)
def test_a_letter_of_one_operand_is_summed_before_the_product(string, shapes):
    """torch.einsum sums a letter found in one operand only before multiplying: the mean of a
    metric (``ij,->`` with a Scalar) is no matmul.  The reference is torch's flop counter."""
    operands = [torch.randn(shape) for shape in shapes]
    with FlopCounterMode(display=False) as counter:
        torch.einsum(string, *operands)
    assert _flops(string, *shapes).get("matmul", 0) == counter.get_total_flops()
    assert _flops(string, *shapes)["add"] == math.prod(shapes[0])


def test_permutation_is_a_view():
    x = _array(3, 4, name="x")
    einsum = cc.Einsum.from_einsum_string("ij->ji", x)
    result = cc.cost(einsum)
    assert result[einsum].view and result[einsum].flop_count == 0 and result.peak_value_bytes == 0
    assert result[einsum].out_bytes == 48 and result[einsum].allocated_bytes == 0


def test_adds_functions_and_data_movement():
    x, y = _array(3, 4, name="x"), _array(3, 4, name="y")
    three = cc.Add(x, y, x, name="three")
    soft = cc.GeneralFunction.new_by_name(three, spec_name="softmax", name="soft")
    cut = cc.Index(soft, (slice(None), slice(0, 2)), name="cut")
    picked = cc.Index(soft, (torch.tensor([0, 2]),), name="picked")
    both = cc.Concat(cut, cut, axis=0, name="both")
    result = cc.cost([both, picked])
    assert dict(result[three].flops) == {"add": 2 * 12}
    assert dict(result[soft].flops) == {"compare": 12, "add": 24, "exp": 12, "div": 12}
    assert result[cut].view and result[cut].read_bytes == 0
    assert not result[picked].view and result[picked].written_bytes == 2 * 4 * 4
    assert result[both].flop_count == 0 and result[both].written_bytes == 6 * 2 * 4
    assert result[three].read_bytes == 3 * 12 * 4 and result[three].out_bytes == 12 * 4


def test_a_function_of_unknown_cost_is_listed_as_unknown_never_as_zero():
    """Not registered: a user's function is only known by its spec."""
    spec = cc.FunctionSpec("cost_test_square", 1, lambda shapes: shapes[0], lambda t: t * t)
    x = _array(3, name="x")
    node = cc.GeneralFunction(x, spec=spec, name="sq")
    total = cc.Add(node, cc.Einsum.from_einsum_string("a,a->a", x, x, name="x2"), name="total")
    result = cc.cost(total)
    assert result[node].unknown_function and result[node].unknown_nodes == 1
    assert result.unknown_functions == [node]
    assert result.total.unknown_nodes == 1 and result.total.flops == {"mul": 3, "add": 3}
    table = result.table()
    assert "Total cost: 6 FLOP + ?" in table
    assert "unknown: the FLOPs of 1 nodes (+ ?): cost_test_square" in table
    assert "? FLOP (not known for cost_test_square)" in result.comment(node)
    assert result.subtree(node).flops_text == "0 FLOP + ?"
    assert "+ ?" in cost_table(total, by="node")  # the group holding it says so too
    if importlib.util.find_spec("pandas") is not None:
        frame = result.to_pandas().set_index("name")
        assert math.isnan(frame.loc["sq", "flops"]) and frame.loc["sq", "flops_unknown"]
        assert frame.loc["x2", "flops"] == 3 and not frame.loc["x2", "flops_unknown"]


def test_pow_and_casts_are_counted():
    x = _array(4, 1, name="x")
    exponent = _array(5, name="e")
    power = cc.GeneralFunction.new_by_name(x, exponent, spec_name="pow", name="pow")  # broadcast to [4,5]
    half = cc.GeneralFunction(
        power, spec="cast_from_{device:None,dtype:None}_to_{device:None,dtype:float16}", name="half"
    )
    result = cc.cost(half)
    assert dict(result[power].flops) == {"pow": 20} and not result[power].unknown_function
    assert result[half].flop_count == 0 and not result[half].unknown_function
    assert result[half].dtype == torch.float16 and result[half].out_bytes == 20 * 2
    assert result.total.unknown_nodes == 0


def test_shared_subtrees_count_once():
    x, w = _array(4, 8, name="x"), _array(8, 8, name="w")
    h = cc.Einsum.from_einsum_string("ij,jk->ik", x, w, name="h")
    twice = cc.Add(h, h, name="twice")
    assert cc.cost(twice).total.flops == {"matmul": 2 * 4 * 8 * 8, "add": 32}


def test_float64_arrays_and_integer_tokens():
    x = cc.Array(torch.zeros(3, 4, dtype=torch.float64), name="x")
    tokens = cc.Array(torch.zeros(5, dtype=torch.int64), name="toks")
    scaled = cc.Einsum.from_einsum_string("ij,->ij", x, cc.Scalar(2.0, name="two"), name="scaled")
    result = cc.cost([scaled, cc.Index(tokens, (slice(0, 2),), name="first")])
    assert result[scaled].dtype == torch.float64 and result[scaled].out_bytes == 12 * 8
    assert result[tokens].dtype == torch.int64 and result.held_bytes == 12 * 8 + 5 * 8


# ----------------------------------------------------------- peak memory


def test_peak_against_a_schedule_worked_by_hand():
    # x (held) -> a = x@w (alive until c), b = gelu(a), c = a + b, root d = sum(c).
    # after a: 64; after b: 128; after c: 192, then a and b are released; d: 64 + 4 -> peak 192
    x, w = _array(4, 4, name="x"), _array(4, 4, name="w")
    a = cc.Einsum.from_einsum_string("ij,jk->ik", x, w, name="a")
    b = cc.GeneralFunction.new_by_name(a, spec_name="gelu", name="b")
    c = cc.Add(a, b, name="c")
    d = cc.Einsum.from_einsum_string("ij->i", c, name="d")
    result = cc.cost(d)
    assert result.held_bytes == 2 * 64 and result.peak_value_bytes == 192
    assert result.peak_bytes == 128 + 192


def test_arrays_of_one_tensor_are_held_once():
    """A tied embedding and unembedding are two Arrays of one tensor (one its transpose): held
    once, as in memory.  Slices of one fused weight are each held (together, the whole)."""
    weight = torch.randn(5, 7)
    embed, unembed = cc.Array(weight, name="embed"), cc.Array(weight.T, name="unembed")
    tied = cc.Einsum.from_einsum_string("ij,jk->ik", embed, unembed, name="tied")
    assert cc.cost(tied).held_bytes == 5 * 7 * 4
    fused = torch.randn(6, 4)
    q, k = cc.Array(fused[:3], name="q"), cc.Array(fused[3:], name="k")
    scores = cc.Einsum.from_einsum_string("id,jd->ij", q, k, name="scores")
    assert cc.cost(scores).held_bytes == 6 * 4 * 4
    copied = cc.Einsum.from_einsum_string("ij,jk->ik", embed, cc.Array(weight.T.clone(), name="u2"))
    assert cc.cost(copied).held_bytes == 2 * 5 * 7 * 4


def test_a_view_keeps_its_base_alive():
    x, w = _array(4, 4, name="x"), _array(4, 4, name="w")
    a = cc.Einsum.from_einsum_string("ij,jk->ik", x, w, name="a")
    row = cc.Index(a, (0,), name="row")  # a view of a: a's 64 bytes stay until row is released
    big = cc.Einsum.from_einsum_string("i,j->ij", row, row, name="big")
    assert cc.cost(big).peak_value_bytes == 64 + 64


def _gpt2(n_embd: int, seq: int, batch: int, n_layer: int = 2):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    model = factories.gpt2(
        seed=None,
        n_layer=n_layer,
        n_embd=n_embd,
        vocab_size=101,
        n_positions=256,
        attn_implementation="eager",  # attention as matmuls, which the flop counter sees (not fused SDPA)
    )
    tokens = torch.randint(0, 101, (batch, seq))
    return model, tokens, cm.from_hf(model, tokens)


def test_gpt2_matmul_flops_equal_torch_flop_counter_on_hugging_face():
    """Like with like: torch counts matmuls only (addmm, mm, bmm: 2 FLOPs per multiply-add), so we
    compare our ``matmul`` kind: the einsums that sum an index, which torch runs as bmm.  Layer
    norms, the softmax and the attention's scale and mask are elementwise on both sides and
    counted by neither.  The circuit is the next-token loss, so it runs the model on all tokens but
    the last: the Hugging Face forward is run on those same positions."""
    model, tokens, circuit = _gpt2(64, 20, 3)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(tokens[:, :-1])
    ours = cc.cost(circuit).total.flops["matmul"]
    assert abs(ours - counter.get_total_flops()) <= 0.01 * counter.get_total_flops()
    assert ours == counter.get_total_flops()  # in fact exactly


def test_an_imported_gpt2s_gelu_counts_its_pow():
    """Hugging Face's GPT-2 GELU is ``0.5 x (1 + tanh(c (x + 0.044715 pow(x, 3))))``: imported, its pow
    is an aten function, one ``pow`` per element of each layer's MLP input, none of unknown cost."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    model = factories.gpt2(seed=None, n_head=3, n_embd=15, vocab_size=41, n_positions=19)
    config = model.config
    circuit = cm.from_torch(model, (torch.randint(0, 41, (2, 7)),))
    result = cc.cost(circuit)
    assert result.total.flops["pow"] == config.n_layer * 2 * 7 * 4 * config.n_embd
    assert result.total.unknown_nodes == 0 and not result.unknown_functions


def test_imported_aten_convolutions_and_pooling_are_counted():
    """A CNN's convolutions (kept as aten ops) counted as torch's flop counter counts them."""

    class CNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 5, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(5, 4, 3, groups=1, bias=False)

        def forward(self, x):
            return self.conv2(torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2))

    model, images = CNN().eval(), torch.randn(2, 3, 10, 10)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    result = cc.cost(cm.from_torch(model, (images,)))
    assert result.total.flops["matmul"] == counter.get_total_flops()
    assert result.total.unknown_nodes == 0
    assert result.total.flops["compare"] == 2 * 5 * 10 * 10 + 2 * 5 * 5 * 5 * 4  # relu, then a 2x2 max


def test_gpt2_flops_equal_the_flop_counter_on_our_own_evaluation():
    _, _, circuit = _gpt2(32, 12, 2)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        cc.evaluate(circuit)
    assert cc.cost(circuit).total.flops["matmul"] == counter.get_total_flops()


def _measured_peak(circuit: cc.Circuit) -> int:
    """Peak bytes allocated while ``cc.evaluate`` runs, from the profiler's memory events in time order.

    Tensors that exist before the run (the Arrays) are not in it, so it is
    compared with ``peak_value_bytes``; the run's own temporaries inside
    kernels are in it, which the prediction does not count.
    """
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        cc.evaluate(circuit)
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def test_gpt2_peak_memory_against_the_profiler():
    _, _, circuit = _gpt2(256, 128, 4)
    predicted, measured = cc.cost(circuit).peak_value_bytes, _measured_peak(circuit)
    assert abs(predicted - measured) <= 0.10 * measured, (format_bytes(predicted), format_bytes(measured))


def test_golden_attention_only_peak_memory_against_the_profiler():
    weights = cm.attn_only_random_weights(GOLDEN_DIMS, seed=1)
    tokens = torch.randint(0, GOLDEN_DIMS.vocab_size, (302,), generator=torch.Generator().manual_seed(0))
    circuit = cm.build_attn_only(GOLDEN_DIMS, weights, tokens, convention="golden")
    predicted, measured = cc.cost(circuit).peak_value_bytes, _measured_peak(circuit)
    assert abs(predicted - measured) <= 0.10 * measured, (format_bytes(predicted), format_bytes(measured))


def test_bfloat16_llama_peak_and_float32_scratch_against_the_profiler(monkeypatch):
    """A bfloat16 forward, where this CPU contracts bfloat16 in float32 chunks (``reduced``): the
    chunks' copies count at their step and the kept buffer as ``scratch_bytes``.  Small chunks so
    that the unembedding and the MLP are cut in several."""
    monkeypatch.setattr(reduced, "CHUNK_BYTES", 96 << 10)
    monkeypatch.setattr(reduced, "_SCRATCH", threading.local())
    model = factories.llama(hidden_size=64, intermediate_size=160, vocab_size=700, dtype=torch.bfloat16)
    circuit = cm.from_hf(model, factories.token_ids(700, (2, 25), seed=0)).get_unique(names.LOGITS)
    predicted = cc.cost(circuit)
    with torch.no_grad():
        cc.evaluate(circuit)  # makes the kept buffer, which the measured run then reuses
    measured = _measured_peak(circuit)
    assert abs(predicted.peak_value_bytes - measured) <= 0.10 * measured, (
        format_bytes(predicted.peak_value_bytes),
        format_bytes(measured),
    )
    assert predicted.scratch_bytes == reduced.scratch_bytes()
    if not reduced.native_reduced_matmul(torch.bfloat16):  # the float32 path ran: its bytes were counted
        assert predicted.scratch_bytes > 0
        assert (
            predicted.peak_bytes
            == predicted.held_bytes + predicted.scratch_bytes + predicted.peak_value_bytes
        )
    assert cc.cost(circuit, device="meta").scratch_bytes == 0  # only a CPU takes the float32 path


def test_the_replayed_schedule_is_the_evaluators():
    """The cost replays ``postorder``; the evaluator's plan lists its nodes in the same order."""
    _, _, circuit = _gpt2(16, 6, 2)
    assert [c.node.hash for c in cc.cost(circuit).nodes] == [n.hash for n in compile_plan([circuit]).nodes]


# ------------------------------------------------------- printing, tables


def test_costs_print_as_comments_and_parse_back():
    golden = cc.parse(GOLDEN.read_text())
    result = cc.cost(golden)
    text = golden.repr(comment=result.comment)
    assert "GFLOP" in text and "MiB out" in text
    assert cc.parse(text) == golden
    assert golden.repr(costs=True) == text


def test_table_by_layer_and_head_sums_to_the_total():
    golden = cc.parse(GOLDEN.read_text())
    result = golden.cost()
    for label in (by_layer, by_head):
        groups = result.grouped(label)
        assert sum(t.flop_count for t in groups.values()) == result.total.flop_count
    assert {"layer 0", "layer 1", "layer 1 head 7"} <= set(result.grouped(by_head))
    table = cost_table(golden, by="layer")
    assert table.splitlines()[0].startswith("Peak memory: ") and "layer 1" in table


def test_table_by_subtree():
    golden = cc.parse(GOLDEN.read_text())
    lines = cc.cost(golden).table(depth=2).splitlines()
    assert any(line.startswith("'t.loss' [300]") and "GFLOP" in line for line in lines)
    assert any(line.startswith("    'log_probs'") for line in lines)


def test_costs_and_comment_together_are_refused():
    x = _array(2, name="x")
    with pytest.raises(cc.errors.PrintError, match="costs=True"):
        x.repr(costs=True, comment=lambda node: "mine")


def test_costs_in_the_html_view():
    from circuits.text.html import to_html

    golden = cc.parse(GOLDEN.read_text())
    assert "GFLOP" in to_html(golden, comment=golden.cost().comment)


def test_to_pandas_has_a_row_per_distinct_node():
    pytest.importorskip("pandas")
    golden = cc.parse(GOLDEN.read_text())
    result = golden.cost()
    frame = result.to_pandas()
    assert len(frame) == len(cc.unique_nodes(golden))
    assert frame["flops"].sum() == result.total.flop_count
    assert frame["flops_matmul"].sum() == result.total.flops["matmul"]
