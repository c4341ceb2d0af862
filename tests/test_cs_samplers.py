"""circuits.causal_scrubbing samplers and pools against independent expectations (rust_circuit semantics).

Every draw comes from a seeded torch.Generator, so the counting bounds below are checked on fixed
numbers: they hold or fail the same way on every run.
"""

from __future__ import annotations

import uuid
import warnings
from collections import Counter

import pytest
import torch

from circuits.causal_scrubbing import (
    PNP,
    CausalScrubbingError,
    CondSampler,
    Dataset,
    ExactSampler,
    FixedOtherSampler,
    FuncSampler,
    PoolAnnotation,
    PoolNotPresent,
    TooFewSamplesWarning,
    UncondSampler,
    UncondTogetherSampler,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _source(n: int = 30, classes: int = 3) -> Dataset:
    """Example ``i`` has id ``i`` and class ``i % classes``."""
    return Dataset({"id": torch.arange(n), "cls": torch.arange(n) % classes})


def by_class(d: Dataset) -> torch.Tensor:
    return d.cls.value


def test_func_sampler_draws_only_within_the_class_and_uniformly():
    ds = _source(30, 3)
    ref = ds[[0, 1, 2, 4, 5]]  # classes 0, 1, 2, 1, 2
    sampler = FuncSampler(by_class)
    rng = _gen(3)
    per_row: list[Counter] = [Counter() for _ in range(len(ref))]
    for _ in range(2000):
        drawn = sampler(ref, ds, rng)
        assert len(drawn) == len(ref)
        assert torch.equal(drawn.cls.value, ref.cls.value)  # each row stays in its reference's class
        for row, i in enumerate(drawn.id.value.tolist()):
            per_row[row][i] += 1
    for row, counts in enumerate(per_row):
        cls = int(ref.cls.value[row])
        assert set(counts) == {i for i in range(30) if i % 3 == cls}  # every class member drawn, no other
        assert min(counts.values()) > 140 and max(counts.values()) < 260  # 10 members: 200 each expected


def test_func_sampler_compares_two_dimensional_rows_whole():
    ds = Dataset({"id": torch.arange(12), "f": torch.stack([torch.arange(12) % 2, torch.arange(12) % 3], 1)})
    ref = ds[[0, 1, 5, 6]]
    sampler = FuncSampler(lambda d: d.f.value)
    rng = _gen(1)
    seen: set[tuple[int, int]] = set()
    for _ in range(200):
        drawn = sampler(ref, ds, rng)
        assert torch.equal(drawn.f.value, ref.f.value)
        seen |= {(r, i) for r, i in enumerate(drawn.id.value.tolist())}
    # (i % 2, i % 3) determines i % 6: each row has exactly two matches among 12 examples.
    assert seen == {(0, 0), (0, 6), (1, 1), (1, 7), (2, 5), (2, 11), (3, 0), (3, 6)}


def test_func_sampler_is_deterministic_given_the_generator():
    ds, sampler = _source(), FuncSampler(by_class)
    ref = ds[:7]
    assert sampler(ref, ds, _gen(5)) == sampler(ref, ds, _gen(5))
    draws = {sampler(ref, ds, _gen(seed)) for seed in range(5)}
    assert len(draws) > 1


def test_func_sampler_warns_when_a_class_has_fewer_source_than_reference_examples():
    ds = Dataset({"id": torch.arange(5), "cls": torch.tensor([0, 0, 0, 0, 7])})
    ref = Dataset({"id": torch.arange(3), "cls": torch.tensor([7, 7, 0])})
    with pytest.warns(TooFewSamplesWarning, match=r"only 1 source example\(s\) with value 7 for 2 reference"):
        drawn = FuncSampler(by_class)(ref, ds, _gen())
    assert drawn.id.value.tolist()[:2] == [4, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FuncSampler(by_class)(ref[[2]], ds, _gen())  # class 0: 4 source for 1 reference, no warning


def test_func_sampler_warns_on_every_call_not_only_the_first():
    ds = Dataset({"cls": torch.tensor([0, 1])})
    ref = Dataset({"cls": torch.tensor([1, 1])})
    sampler = FuncSampler(by_class)
    for _ in range(2):  # the second call hits the matching cache
        with pytest.warns(TooFewSamplesWarning):
            sampler(ref, ds, _gen())


def test_func_sampler_names_a_value_no_source_example_has():
    ds = Dataset({"cls": torch.tensor([0, 1, 1])})
    ref = Dataset({"cls": torch.tensor([1, 5])})
    with pytest.raises(CausalScrubbingError, match="no example of the source dataset has the value 5"):
        FuncSampler(by_class)(ref, ds, _gen())


def test_func_sampler_rejects_a_func_without_one_row_per_example():
    ds = _source(6)
    with pytest.raises(CausalScrubbingError, match=r"one row per example.*gave shape \[3\]"):
        FuncSampler(lambda d: torch.zeros(3))(ds, ds, _gen())
    with pytest.raises(CausalScrubbingError, match=r"gave shape \[6, 1, 1\]"):
        FuncSampler(lambda d: torch.zeros(len(d), 1, 1))(ds, ds, _gen())


def test_func_sampler_matching_is_cached_per_func_and_datasets():
    calls = []

    def counted(d: Dataset) -> torch.Tensor:
        calls.append(len(d))
        return d.cls.value

    ds = _source(9)
    sampler = FuncSampler(counted)
    sampler(ds[:4], ds, _gen())
    sampler(ds[:4], ds, _gen(1))  # an equal reference (by content): no new func calls
    assert calls == [4, 9]
    sampler(ds[:5], ds, _gen())
    assert calls == [4, 9, 5, 9]


def test_func_sampler_str_shows_the_datum_and_its_condition():
    ds = _source(6)
    text = FuncSampler(by_class).pretty_str(ds, datum_idx=4)
    assert text == "FuncSampler(d=Dataset(1 example: cls [1]=[1]; id [1]=[4]), f(d)=1)"
    assert FuncSampler(by_class).pretty_str(None) == "FuncSampler"


def test_uncond_sampler_ignores_the_reference_and_draws_uniformly():
    ds = _source(4)
    ref = Dataset({"id": torch.zeros(4000, dtype=torch.int64), "cls": torch.zeros(4000, dtype=torch.int64)})
    drawn = UncondSampler()(ref, ds, _gen(2)).id.value
    counts = torch.bincount(drawn, minlength=4)
    assert counts.min() > 900 and counts.max() < 1100


def test_exact_and_fixed_other_samplers():
    ds = _source(10)
    ref, other = ds[:3], ds[[9, 8, 7]]
    assert ExactSampler()(ref, ds, _gen()) is ref
    assert FixedOtherSampler(other)(ref, ds, _gen()) is other
    assert FixedOtherSampler(other).other is other
    with pytest.raises(CausalScrubbingError, match="has 3 examples but the reference has 2"):
        FixedOtherSampler(other)(ds[:2], ds, _gen())


def _distinct_draws(sampler: CondSampler, ref: Dataset, ds: Dataset, calls: int, pools: dict) -> set:
    rng = _gen(4)
    return {sampler.sample_and_update_pool(ref, ds, rng, pools) for _ in range(calls)}


def test_pool_of_size_one_gives_the_same_dataset_on_every_call():
    ds = _source(50)
    sampler = UncondSampler(pool_annot=PoolAnnotation(1))
    assert len(_distinct_draws(sampler, ds[:5], ds, 20, {})) == 1


def test_pool_of_size_k_gives_at_most_k_distinct_datasets():
    ds = _source(50)
    pooled = _distinct_draws(UncondSampler(pool_annot=PoolAnnotation(3)), ds[:5], ds, 60, {})
    assert 1 < len(pooled) <= 3
    unpooled = _distinct_draws(UncondSampler(), ds[:5], ds, 60, {})
    assert len(unpooled) > 3  # without a pool every call draws afresh


def test_pools_are_per_reference_class():
    ds = _source(30)
    sampler = FuncSampler(by_class, pool_annot=PoolAnnotation(1))
    pools: dict = {}
    rng = _gen()
    first = sampler.sample_and_update_pool(ds[[0]], ds, rng, pools)
    assert sampler.sample_and_update_pool(ds[[3]], ds, rng, pools) is first  # same class value: shared
    other = sampler.sample_and_update_pool(ds[[1]], ds, rng, pools)
    assert other.cls.value.tolist() == [1]  # another class: its own pool, a valid draw


def test_samplers_with_equal_annotations_share_a_pool():
    ds = _source(40)
    annot = PoolAnnotation(1)
    pools: dict = {}
    rng = _gen()
    a = UncondSampler(pool_annot=annot).sample_and_update_pool(ds[:4], ds, rng, pools)
    b = UncondSampler(pool_annot=annot).sample_and_update_pool(ds[4:8], ds, rng, pools)
    c = UncondSampler(pool_annot=PoolAnnotation(1)).sample_and_update_pool(ds[:4], ds, rng, pools)
    assert a is b  # unconditional: one pool for every reference
    assert c is not a  # a fresh annotation has its own id


def test_uncond_together_samplers_share_by_id():
    ds = _source(40)
    pools: dict = {}
    rng = _gen()
    first = UncondTogetherSampler().sample_and_update_pool(ds[:4], ds, rng, pools)
    assert UncondTogetherSampler().sample_and_update_pool(ds[10:14], ds, rng, pools) is first
    assert UncondTogetherSampler() == UncondTogetherSampler()
    group = uuid.UUID(int=7)
    grouped = UncondTogetherSampler(id=group).sample_and_update_pool(ds[:4], ds, rng, pools)
    assert UncondTogetherSampler(id=group).sample_and_update_pool(ds[:4], ds, rng, pools) is grouped
    assert grouped is not first
    assert UncondTogetherSampler().pool_annot.size == 1


def test_no_pool_draws_afresh_and_leaves_the_pools_alone():
    ds = _source(20)
    pools: dict = {}
    FuncSampler(by_class).sample_and_update_pool(ds[:3], ds, _gen(), pools)
    assert pools == {} and FuncSampler(by_class).pool_annot == PNP == PoolNotPresent()


def test_pool_annotation_defaults_and_validation():
    annot = PoolAnnotation()
    assert annot.size == 4 and annot != PoolAnnotation() and annot == PoolAnnotation(4, id=annot.id)
    with pytest.raises(CausalScrubbingError, match="positive int, got 0"):
        PoolAnnotation(0)
    assert UncondSampler(pool_annot=annot).class_str() == f"UncondSampler#{hash(annot) & 1023}"
    assert UncondSampler().class_str() == "UncondSampler"


def test_samplers_are_hashable_and_compare_by_fields():
    assert FuncSampler(by_class) == FuncSampler(by_class) and hash(FuncSampler(by_class))
    assert FuncSampler(by_class) != FuncSampler(lambda d: d.cls.value)
    assert ExactSampler() == ExactSampler() != UncondSampler()
    ds = _source(3)
    assert hash(FixedOtherSampler(ds)) == hash(FixedOtherSampler(_source(3)))


def test_the_base_sampler_says_what_a_subclass_must_define():
    with pytest.raises(NotImplementedError, match=r"CondSampler does not define __call__"):
        CondSampler()(_source(), _source())


def test_func_sampler_is_uniform_within_classes_of_different_sizes():
    ds = Dataset({"id": torch.arange(10), "cls": torch.tensor([0, 0] + [1] * 8)})
    ref = Dataset({"id": torch.zeros(4000, dtype=torch.int64), "cls": torch.tensor([0, 1] * 2000)})
    with pytest.warns(TooFewSamplesWarning):  # 2000 references per class: repeats are the point here
        drawn = FuncSampler(by_class)(ref, ds, _gen(6)).id.value
    small = torch.bincount(drawn[0::2], minlength=10)
    large = torch.bincount(drawn[1::2], minlength=10)
    assert small[2:].sum() == 0 and large[:2].sum() == 0
    assert small[:2].min() > 900  # 2000 draws over 2 members: 1000 expected each
    assert large[2:].min() > 200 and large[2:].max() < 300  # 2000 over 8: 250 expected each
