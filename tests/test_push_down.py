"""push_down_index: an Index moved below the nodes under it keeps the value and does less work.

References are torch expressions written here: the indexed value of the
whole computation (``full[index]``) against evaluation of the pushed circuit.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from strategies import indexed_circuits

import circuits as cc
from circuits.passes import push_down_index, push_index

TOL = {"rtol": 1e-10, "atol": 1e-10}


def arr(*shape, name=None, seed=0):
    generator = torch.Generator().manual_seed(seed + 17 * len(shape))
    return cc.Array(torch.randn(*shape, generator=generator, dtype=torch.float64), name=name)


def indexed(value: torch.Tensor, items) -> torch.Tensor:
    """The selection written in torch, axis by axis (tensor items index their axis alone)."""
    axis = 0
    for item in items:
        if isinstance(item, int):
            value = value.select(axis, item)
            continue
        if isinstance(item, slice):
            start, stop, _ = item.indices(value.shape[axis])
            value = value.narrow(axis, start, max(0, stop - start))
        else:
            value = value.index_select(axis, item % value.shape[axis])
        axis += 1
    return value


def check(node: cc.Index) -> cc.Circuit:
    """float64 throughout: a circuit of Scalars alone would run in float32, far coarser than TOL."""
    pushed = push_index(node)
    expected = indexed(node.node.evaluate(dtype=torch.float64), node.index)
    torch.testing.assert_close(pushed.evaluate(dtype=torch.float64), expected, **TOL)
    assert pushed.shape == node.shape
    return pushed


def test_einsum_index_reaches_the_operands():
    x, w = arr(5, 4, name="x"), arr(3, 4, name="w")
    mm = cc.Einsum.from_einsum_string("sd,ed->se", x, w, name="mm")
    pushed = check(cc.Index(mm, (2, slice(1, 3))))
    assert isinstance(pushed, cc.Einsum) and pushed.name == "mm"
    assert pushed.einsum_string == "d,ed->e"
    assert {c.kind for c in pushed.children} == {"Index"}


def test_add_respects_broadcast_axes():
    a, b, c = arr(4, 3, name="a"), arr(1, 3, name="b"), arr(3, name="c")
    total = cc.Add(a, b, c, name="total")
    for items in [(2,), (slice(1, 3), 0), (torch.tensor([3, 0]), slice(None, 2)), (1, 2)]:
        check(cc.Index(total, items))


def test_last_axis_function_keeps_last_axis_item_above():
    x = arr(4, 6, name="x")
    probs = cc.GeneralFunction.new_by_name(x, spec_name="softmax", name="probs")
    pushed = check(cc.Index(probs, (1, slice(0, 3)), name="top"))
    assert pushed.kind == "Index" and pushed.name == "top"  # the last-axis part stays above
    assert pushed.node.kind == "GeneralFunction" and pushed.node.children[0].kind == "Index"
    only_rows = check(cc.Index(probs, (slice(1, 3),)))
    assert only_rows.kind == "GeneralFunction" and only_rows.name == "probs"


def test_gen_index_embedding_and_batched_lookup():
    emb = arr(10, 4, name="emb")
    toks = cc.Array(torch.tensor([3, 1, 4, 1, 5, 9]), name="toks")
    looked = cc.GeneralFunction.new_by_name(emb, toks, spec_name="gen_index_at_0_c", name="embeds")
    pushed = check(cc.Index(looked, (slice(2, 5), 1)))
    assert pushed.kind == "GeneralFunction"
    log_probs = arr(6, 10, name="lp")
    picked = cc.GeneralFunction.new_by_name(log_probs, toks, spec_name="gen_index_at_0_batch_x_c", name="ll")
    for items in [(3,), (slice(1, 4),), (torch.tensor([5, 0]),)]:
        check(cc.Index(picked, items))
    x = arr(3, 5, 7, name="x")
    idx = cc.Array(torch.tensor([[0, 4], [2, 2], [1, 3]]), name="idx")
    in_place = cc.GeneralFunction.new_by_name(x, idx, spec_name="gen_index_at_0_batch_x_no_batch_index_c")
    for items in [(1,), (slice(0, 2), 1), (2, 0, slice(1, 5))]:
        check(cc.Index(in_place, items))
    columns = cc.Array(torch.tensor([0, 5, 2, 5]), name="columns")
    plain = cc.GeneralFunction.new_by_name(
        arr(4, 6, 3, name="y"), columns, spec_name="gen_index_at_1_no_batch_index"
    )
    for items in [(1,), (slice(1, 3), 3), (0, slice(None), 2)]:
        check(cc.Index(plain, items))


def test_index_over_index_composes():
    x = arr(10, 8, name="x")
    inner = cc.Index(x, (slice(2, -1), torch.tensor([7, 0, 3])), name="inner")
    pushed = check(cc.Index(inner, (slice(1, 4), 2)))
    assert pushed.kind == "Index" and pushed.node == x


def test_concat_selects_the_right_children():
    a, b = arr(3, 4, name="a"), arr(5, 4, name="b")
    joined = cc.Concat(a, b, axis=0, name="joined")
    assert check(cc.Index(joined, (4, 1))).node == b
    sliced = check(cc.Index(joined, (slice(1, 6),)))
    assert sliced.kind == "Concat"
    check(cc.Index(joined, (slice(None), 2)))
    check(cc.Index(joined, (torch.tensor([0, 7]),)))  # stays above the Concat


def test_rearrange_moves_plain_axes():
    x = arr(2, 3, 4, name="x")
    moved = cc.Rearrange(x, "a b c -> c a b", name="moved")
    pushed = check(cc.Index(moved, (1, slice(0, 1), 2)))
    assert pushed.kind == "Rearrange" and "c" not in pushed.pattern
    grouped = cc.Rearrange(x, "a b c -> a (b c)", name="grouped")
    check(cc.Index(grouped, (1, slice(2, 5))))  # the grouped axis stays above


def test_loss_at_one_position_equals_full_loss_there():
    toks = cc.Array(torch.tensor([0, 3, 2, 5, 1, 4]), name="toks_int_var")
    inputs = cc.Index(toks, slice(None, -1), name="input_toks_int")
    targets = cc.Index(toks, slice(1, None), name="true_toks_int")
    embeds = cc.GeneralFunction.new_by_name(arr(6, 4, name="emb"), inputs, spec_name="gen_index_at_0_c")
    hidden = cc.GeneralFunction.new_by_name(
        cc.Einsum.from_einsum_string("sd,ed->se", embeds, arr(4, 4, name="w")), spec_name="gelu"
    )
    logits = cc.Einsum.from_einsum_string("sd,vd->sv", hidden, arr(6, 4, name="unembed"), name="t.call")
    log_probs = cc.GeneralFunction.new_by_name(logits, spec_name="log_softmax", name="log_probs")
    ll = cc.GeneralFunction.new_by_name(log_probs, targets, spec_name="gen_index_at_0_batch_x_c", name="ll")
    loss = cc.Einsum.from_einsum_string("a,->a", ll, cc.Scalar(-1.0), name="t.loss")
    at_two = push_down_index(cc.Index(loss, (2,), name="loss@2"))
    assert at_two.name == "loss@2"
    torch.testing.assert_close(at_two.evaluate(), loss.evaluate()[2], **TOL)
    # the work is now one row: the logits Einsum computes [vocab], not [seq, vocab]
    assert [n.shape for n in at_two.get("t.call")] == [(6,)]


# ------------------------------------------------------------------ property


@settings(max_examples=150)
@given(indexed_circuits())
def test_pushing_any_index_keeps_the_value(node):
    check(node)


def test_an_index_already_in_the_circuit_stays_where_it_is():
    """Pushing one Index leaves the circuit's own Indexes below it alone: grouped-query
    attention's pick of key heads stays one node over the key/value projection, shared with the
    unpushed circuit, instead of being pushed into the projection (keys once per query head)."""
    x, w = arr(5, 6, name="x"), arr(2, 3, 6, name="w", seed=1)
    keys = cc.Einsum.from_einsum_string("kd,hcd->hkc", x, w, name="k_kv")
    picked = cc.Index(keys, (torch.tensor([0, 0, 1, 1]),), name="k")
    scores = cc.Einsum.from_einsum_string("hqc,hkc->hqk", arr(4, 5, 3, name="q", seed=2), picked)
    pushed = check(cc.Index(scores, (slice(None), -1, slice(None))))
    assert picked in cc.unique_nodes(pushed) and keys in cc.unique_nodes(pushed)
    # an Index the push goes through is merged with the pushed one and goes on down
    through = check(cc.Index(picked, (1,)))
    assert keys not in cc.unique_nodes(through)


def test_stop_at_keeps_the_index_above_a_node_computed_whole_anyway():
    """``x = relu(a @ w)`` is read whole by one branch and at one row by the indexed one: stopped
    at ``x``, the index does not compute that row a second time below it."""
    a, w, v = arr(5, 3, name="a"), arr(3, 4, name="w", seed=1), arr(4, name="v", seed=2)
    x = cc.GeneralFunction.new_by_name(
        cc.Einsum.from_einsum_string("ij,jk->ik", a, w), spec_name="relu", name="x"
    )
    total = cc.Einsum.from_einsum_string("ik,k->i", x, v, name="total")  # reads every row of x
    both = cc.Add(
        cc.Index(x, (2,), name="row"), cc.Einsum.from_einsum_string("i,k->k", total, v), name="both"
    )
    expected = both.evaluate()
    stopped = push_index(cc.Index(both, (slice(1, 3),)), stop_at=[x])
    torch.testing.assert_close(stopped.evaluate(), indexed(expected, (slice(1, 3),)), **TOL)
    assert [
        n for n in cc.unique_nodes([stopped]) if isinstance(n, cc.Index) and n.node == x
    ]  # stayed above x
    assert not [n for n in cc.unique_nodes([stopped]) if isinstance(n, cc.Index) and n.node == a]
    unstopped = push_index(cc.Index(both, (slice(1, 3),)))
    assert [n for n in cc.unique_nodes([unstopped]) if isinstance(n, cc.Index) and n.node == a]  # pushed to a
