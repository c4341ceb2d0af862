"""The caching Evaluator: exactly the uncached values, only changed nodes recomputed, within budget."""

from __future__ import annotations

import pytest
import torch
from experiments_reference import split_circuit, tokens, weights
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import seeded_tensor, seeds

import circuits as cc
from circuits import experiments as ex


def held_bytes(ev: cc.Evaluator) -> int:
    """The storage the cache keeps reachable, counted independently of its own bookkeeping."""
    storages = {}
    for entry in ev._entries.values():
        storage = entry.value.untyped_storage()
        storages[(str(entry.value.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def is_leaf_view(node: cc.Circuit) -> bool:
    return isinstance(node, cc.Index) and isinstance(node.children[0], cc.Array)


@pytest.fixture(scope="module")
def split():
    return split_circuit(weights(0), tokens(1))


def test_rewritten_circuit_recomputes_exactly_the_changed_nodes(split):
    ev = cc.Evaluator(2**26)
    torch.testing.assert_close(ev.evaluate(split), split.evaluate(), rtol=0, atol=0)
    assert ev.stats.last_hits == 0
    before = {node.hash for node in cc.unique_nodes([split])}
    for name in ("b1.a.head2", "b0.a.head0", "a1.norm"):
        ablated = ex.zero_ablate(split, name)
        assert torch.equal(ev.evaluate(ablated, store=False), ablated.evaluate())
        changed = [n for n in cc.unique_nodes([ablated]) if n.hash not in before and n.children]
        # plus views of weights under the changed nodes: free to recompute, so never cached
        views = {c.hash for n in changed for c in n.children if c.hash in before and is_leaf_view(c)}
        assert ev.stats.last_computed == len(changed) + len(views)
        assert ev.stats.last_hits > 0


def test_the_same_circuit_again_is_one_lookup(split):
    ev = cc.Evaluator(2**26)
    first = ev.evaluate(split)
    again = ev.evaluate(split)
    assert again is first and ev.stats.last_computed == 0 and ev.stats.last_hits == 1


def test_store_false_reads_only_and_store_predicate_admits(split):
    ev = cc.Evaluator(2**26)
    ev.evaluate(split, store=False)
    assert len(ev) == 0 and ev.nbytes == 0
    ev.evaluate(split, store=lambda node: node.name == "b0")
    assert len(ev) == 1 and split.get_unique("b0") in ev
    ablated = ex.zero_ablate(split, "b1.a.head0")
    ev.evaluate(ablated, store=False)
    assert ev.stats.last_hits == 1  # layer 1 starts from the cached residual


def test_budget_is_never_exceeded_and_lru_evicts(split):
    full = cc.Evaluator(2**30)
    full.evaluate(split)
    assert full.nbytes == held_bytes(full) and full.stats.evicted == 0
    budget = full.nbytes // 3
    ev = cc.Evaluator(budget)
    ev.evaluate(split)
    assert 0 < ev.nbytes <= budget and ev.nbytes == held_bytes(ev) and ev.stats.evicted > 0
    assert ev.stats.peak_nbytes <= budget
    # the most recent values (near the root) survive: the root itself is cached
    assert split in ev
    nothing = cc.Evaluator(0)
    torch.testing.assert_close(nothing.evaluate(split), split.evaluate(), rtol=0, atol=0)
    assert len(nothing) == 0


def test_views_and_shared_storage_are_charged_once():
    x = cc.Array(torch.randn(4, 256), name="x")
    y = cc.Einsum.from_einsum_string("ab,ab->ab", x, x, name="y")  # a fresh 4 KiB tensor
    rows = [cc.Index(y, (i,), name=f"row{i}") for i in range(4)]  # views of it
    total = cc.Add(*rows, name="total")
    ev = cc.Evaluator(2**20)
    ev.evaluate(total)
    assert {"y", "row0", "row3", "total"} <= {n.name for n in cc.unique_nodes([total]) if n in ev}
    assert ev.nbytes == 4 * 256 * 4 + 256 * 4 == held_bytes(ev)
    # a view of a leaf (an Index of an Array) is not cached: it is free, and would be charged the Array
    view = cc.Index(x, (0,), name="x0")
    ev.evaluate(cc.Einsum.from_einsum_string("a,a->a", view, view, name="sq"))
    assert view not in ev


def test_scalars_follow_the_dtype_of_the_call():
    """A cached value computed with float32 Scalars is not reused where Scalars are float64."""
    a = cc.Array(torch.arange(4, dtype=torch.float32) / 3, name="a")
    y = cc.Add(a, cc.Scalar(0.1, shape=(4,), name="s"), name="y")
    wide = cc.Add(y, cc.Array(torch.zeros(4, dtype=torch.float64), name="z"), name="wide")
    ev = cc.Evaluator(2**20)
    assert ev.evaluate(y).dtype == torch.float32
    for root in (wide, y, wide):
        expected = root.evaluate()
        got = ev.evaluate(root)
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert ev.evaluate(y, dtype=torch.float64).dtype == torch.float64  # options are part of the key


def test_symbols_are_bound_per_call_and_not_cached():
    x = cc.Symbol((3,), name="x")
    w = cc.Array(torch.tensor([1.0, 2.0, 3.0]), name="w")
    wx = cc.Einsum.from_einsum_string("a,a->a", x, w, name="wx")
    ww = cc.Einsum.from_einsum_string("a,a->a", w, w, name="ww")
    root = cc.Add(wx, ww, name="root")
    ev = cc.Evaluator(2**20)
    for value in (torch.ones(3), torch.zeros(3), torch.ones(3)):
        assert torch.equal(ev.evaluate(root, inputs={"x": value}), root.evaluate(inputs={"x": value}))
    assert ww in ev and wx not in ev and root not in ev
    with pytest.raises(cc.errors.EvaluationError) as info:
        ev.evaluate(root)
    assert info.value.node is x


def test_errors_name_the_node_as_without_a_cache():
    bad = cc.GeneralFunction.new_by_name(
        cc.Array(torch.ones(3), name="t"),
        cc.Array(torch.tensor([5]), name="i"),
        spec_name="gen_index_at_0_c",
        name="pick",
    )
    with pytest.raises(cc.errors.EvaluationError) as info:
        cc.Evaluator(2**20).evaluate(bad)
    assert info.value.node is bad and info.value.path == (bad,)


# ------------------------------------------------------- random rewrite sequences

NAMES = [
    "b0.a.head0",
    "b0.a.head2",
    "b1.a.head1",
    "a0.norm",
    "a1.norm",
    "b0",
    "b1",
    "final.call",
    "a.attn_probs",
]


def rewrite(circuit: cc.Circuit, op: str, name: str, seed: int) -> cc.Circuit:
    found = circuit.get(name)
    if not found:
        return circuit
    if op == "zero":
        return circuit.update(name, lambda n: cc.Scalar(0.0, shape=n.shape, name=n.name))
    if op == "scale":

        def scaled(n: cc.Circuit) -> cc.Circuit:
            letters = "abcdef"[: n.rank]
            return cc.Einsum.from_einsum_string(
                f"{letters},->{letters}", n, cc.Scalar(0.5 + seed % 3), name=n.name
            )

        return circuit.update(name, scaled)
    if op == "noise":
        return circuit.update(
            name,
            lambda n: cc.Add(n, cc.Array(seeded_tensor(n.shape, seed, torch.float64)), name=n.name),
        )
    if op == "tokens":
        if not any(node.get("toks_int_var") for node in found):
            return circuit  # nothing below reads the tokens (say, zeroed before): patching it is an error
        return ex.patch(circuit, name, {"toks_int_var": tokens(seed)})
    if op == "weight":
        # an earlier step may have zeroed every node above the weight: then there is nothing to edit
        return circuit.update(
            "a1.w.v", lambda n: cc.Array(n.value + 0.01 * (seed % 5), name=n.name), assert_any_found=False
        )
    raise AssertionError(op)


@settings(max_examples=60)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["zero", "scale", "noise", "tokens", "weight", "revert"]),
            st.sampled_from(NAMES),
            seeds,
        ),
        min_size=1,
        max_size=8,
    ),
    budget_kib=st.sampled_from([0, 4, 16, 64, 4096]),
    dtype=st.sampled_from([None, None, torch.float32]),
)
def test_cached_equals_uncached_over_random_rewrites(split, steps, budget_kib, dtype):
    budget = budget_kib * 1024
    ev = cc.Evaluator(budget)
    current = split
    history = [split]
    for op, name, seed in steps:
        if op == "revert":
            current = history[seed % len(history)]
        else:
            current = rewrite(current, op, name, seed)
        history.append(current)
        expected = cc.evaluate(current, dtype=dtype)
        got = ev.evaluate(current, dtype=dtype, store=seed % 4 != 0)
        assert got.dtype == expected.dtype and torch.equal(got, expected)
        assert ev.nbytes <= budget and held_bytes(ev) == ev.nbytes


# ----------------------------------------------- einsum plans (circuits/evaluate.py)


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("bih,bih,bi->bi", [(2, 3, 5), (2, 3, 5), (2, 3)]),  # layer-norm variance: batched dot, multiplier
        ("bAh,z,bA->bAz", [(2, 3, 5), (1,), (2, 3)]),  # layer-norm mean: a letter only a multiplier has
        ("bqc,bkc,,qk->bqk", [(2, 4, 3), (2, 4, 3), (), (4, 4)]),  # masked attention scores
        ("hqc,hkc,h,qk->hqk", [(3, 4, 2), (3, 4, 2), (3,), (4, 4)]),
        ("ab,ba,b->ab", [(2, 3), (3, 2), (3,)]),  # only multipliers
        ("ij,ij->", [(3, 4), (3, 4)]),  # a full dot
        ("ij,ji->j", [(3, 4), (4, 3)]),  # batched dot, operands in different orders
        ("a,b,c->abc", [(2,), (3,), (4,)]),
    ],
)
def test_planned_einsums_agree_with_torch(equation, shapes):
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]
    node = cc.Einsum.from_einsum_string(equation, *[cc.Array(t) for t in tensors])
    torch.testing.assert_close(node.evaluate(), torch.einsum(equation, *tensors), rtol=1e-12, atol=1e-12)


def test_planned_einsums_promote_mixed_dtypes():
    """A batched dot of float32 and float64 is computed in float64, as ``*`` promotes (torch.einsum
    refuses; a bfloat16 model's norms meet float32 values: tests/test_reduced_precision.py)."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, generator=generator), torch.randn(2, 3, generator=generator, dtype=torch.float64)
    value = cc.Einsum.from_einsum_string("ab,ab->a", cc.Array(x, name="x"), cc.Array(y, name="y")).evaluate()
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, (x.double() * y).sum(-1), rtol=1e-12, atol=1e-12)


def test_threads_sharing_one_evaluator_get_the_values_alone(split):
    """Several threads evaluating through one Evaluator, with a budget small enough that every store
    evicts: each value equals the circuit's own, no thread raises (the cache's dicts used to be
    mutated under another thread's iteration: KeyError, 'OrderedDict mutated during iteration'),
    and the bookkeeping still counts exactly the storage held.  Python switches threads every
    microsecond here, so the interleavings that broke it come in every run."""
    import sys
    import threading

    circuits = [split] + [
        ex.zero_ablate(split, f"b{layer}.a.head{head}") for layer in (0, 1) for head in (0, 2)
    ]
    expected = [c.evaluate() for c in circuits]
    full = cc.Evaluator(2**30)
    full.evaluate_many(circuits)
    ev = cc.Evaluator(full.nbytes // 8)
    threads, rounds = 4, 6
    barrier = threading.Barrier(threads)
    wrong, raised = [], []

    def work(offset: int) -> None:
        barrier.wait()
        try:
            for _ in range(rounds):
                for i in range(len(circuits)):
                    k = (i + offset) % len(circuits)
                    value = ev.evaluate(circuits[k], store=(lambda node: True) if offset % 2 else True)
                    if not torch.equal(value, expected[k]):
                        wrong.append(k)
                if offset == 0:
                    ev.discard([circuits[1]])
        except Exception as error:  # noqa: BLE001 - any error a thread meets is the finding
            raised.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=work, args=(offset,)) for offset in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert raised == [] and wrong == []
    assert ev.stats.evicted > 0  # the budget did force evictions while the threads ran
    assert 0 < ev.nbytes <= ev.cache_bytes and ev.nbytes == held_bytes(ev)
    assert sum(count for _, count in ev._storages.values()) == len(ev._entries)


def test_an_evaluator_pickles_as_an_empty_cache_of_its_budget(split):
    """An executor's worker gets the Evaluator a partial holds (mean_ablate's): empty, the same budget."""
    import pickle

    ev = cc.Evaluator(2**26)
    ev.evaluate(split)
    again = pickle.loads(pickle.dumps(ev))
    assert len(ev) > 0 and len(again) == 0 and again.nbytes == 0 and again.cache_bytes == 2**26
    assert torch.equal(again.evaluate(split), split.evaluate()) and len(again) == len(ev)
