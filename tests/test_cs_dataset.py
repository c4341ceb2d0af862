"""circuits.causal_scrubbing.Dataset: construction, validation, indexing, sampling (rust_circuit semantics)."""

from __future__ import annotations

import attrs
import pytest
import torch

import circuits as cc
from circuits.causal_scrubbing import CausalScrubbingError, Dataset
from circuits.errors import CircuitError


def _ds(n: int = 6, **kwargs) -> Dataset:
    return Dataset({"toks": torch.arange(n * 3).reshape(n, 3), "label": torch.arange(n) % 2}, **kwargs)


def test_built_from_tensors_arrays_or_a_sequence_of_arrays_alike():
    toks = torch.arange(12).reshape(4, 3)
    label = torch.tensor([0, 1, 1, 0])
    from_tensors = Dataset({"toks": toks, "label": label})
    from_arrays = Dataset({"label": cc.Array(label, name="label"), "toks": cc.Array(toks, name="toks")})
    from_sequence = Dataset([cc.Array(toks, name="toks"), cc.Array(label, name="label")])
    assert from_tensors == from_arrays == from_sequence
    assert hash(from_tensors) == hash(from_arrays) == hash(from_sequence)
    assert isinstance(from_tensors.toks, cc.Array) and from_tensors.toks.name == "toks"
    assert torch.equal(from_tensors.arrs["label"].value, label)
    assert len(from_tensors) == 4
    assert from_tensors.input_names == {"toks", "label"}  # default: every array


def test_equality_and_hash_are_by_content():
    assert _ds() == _ds() and hash(_ds()) == hash(_ds())
    assert _ds() != _ds(7)
    assert _ds() != _ds(input_names={"toks"})
    other = Dataset({"toks": torch.arange(18).reshape(6, 3), "label": torch.ones(6, dtype=torch.int64)})
    assert _ds() != other


def test_a_repeated_array_must_be_equal():
    a = cc.Array(torch.arange(3), name="a")
    assert len(Dataset([a, a]).arrs) == 1
    with pytest.raises(CausalScrubbingError, match="two different Arrays named 'a'"):
        Dataset([a, cc.Array(torch.arange(3) + 1, name="a")])


def test_validation_errors_name_the_fault():
    with pytest.raises(CausalScrubbingError, match=r"'a' 3.*'b' 4|'b' 4.*'a' 3"):
        Dataset({"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(CausalScrubbingError, match=r"input_names \['nope'\]"):
        Dataset({"a": torch.zeros(3)}, input_names={"a", "nope"})
    with pytest.raises(CausalScrubbingError, match="key 'a' holds an Array named 'b'"):
        Dataset({"a": cc.Array(torch.zeros(3), name="b")})
    with pytest.raises(CausalScrubbingError, match="'s' is a scalar"):
        Dataset({"s": torch.tensor(1.0)})
    with pytest.raises(CausalScrubbingError, match="at least one array"):
        Dataset({})
    with pytest.raises(CausalScrubbingError, match="named Arrays"):
        Dataset([torch.zeros(3)])
    with pytest.raises(CausalScrubbingError, match="no tensor"):
        Dataset([cc.Array.from_hash((3,), "0" * 32, name="a")])
    assert issubclass(CausalScrubbingError, CircuitError) and issubclass(CausalScrubbingError, ValueError)


def test_input_names_is_keyword_only_and_empty_means_all_as_in_rust_circuit():
    with pytest.raises(TypeError):
        Dataset({"a": torch.zeros(3)}, {"a"})
    assert Dataset({"a": torch.zeros(3), "b": torch.zeros(3)}, input_names=set()).input_names == {"a", "b"}
    assert Dataset({"a": torch.zeros(3), "b": torch.zeros(3)}, input_names="a").input_names == {"a"}


def test_indexing_keeps_axis_0_names_and_input_names():
    ds = _ds(input_names={"toks"})
    one = ds[2]
    assert len(one) == 1 and one.input_names == {"toks"}
    assert one.toks.value.tolist() == [[6, 7, 8]] and one.label.value.tolist() == [0]
    assert ds[-1].toks.value.tolist() == [[15, 16, 17]]
    assert ds[torch.tensor(1)].label.value.tolist() == [1]
    assert ds[1:3].label.value.tolist() == [1, 0]
    assert ds[[5, 0, 0]].toks.value[:, 0].tolist() == [15, 0, 0]
    assert ds[torch.tensor([3, 3])].label.value.tolist() == [1, 1]
    assert ds[torch.tensor([True, False] * 3)].label.value.tolist() == [0, 0, 0]
    assert len(ds[[]]) == 0
    assert ds[1].toks.name == "toks"


def test_slices_read_as_python_reads_them_backwards_included():
    ds = _ds()
    rows = torch.arange(6)
    for cut in (
        slice(None, None, -1),
        slice(4, 0, -2),
        slice(None, None, 2),
        slice(-2, None),
        slice(10, None),
    ):
        assert ds[cut].label.value.tolist() == (rows % 2)[list(range(6))[cut]].tolist(), cut
        assert ds[cut].toks.value.tolist() == torch.arange(18).reshape(6, 3)[list(range(6))[cut]].tolist()
    assert ds[::-1].toks.value.tolist() == torch.flip(torch.arange(18).reshape(6, 3), [0]).tolist()
    assert ds[torch.tensor(1) : torch.tensor(3)].label.value.tolist() == [1, 0]


@pytest.mark.parametrize(
    "cut, message",
    [
        (slice(None, None, 0), "the step must not be zero"),
        (slice(1.5, None), "start, stop and step must be ints or None"),
        (slice(None, None, True), "start, stop and step must be ints or None"),
        (slice(torch.tensor(0.5), None), "start, stop and step must be ints or None"),
    ],
)
def test_a_slice_that_cannot_be_read_names_it(cut, message):
    with pytest.raises(CausalScrubbingError, match=f"Dataset slice slice.*: {message}"):
        _ds()[cut]
    with pytest.raises(CausalScrubbingError, match="Dataset indices must be ints"):
        _ds()[["a", "b"]]


def test_indexing_errors_name_the_index_and_length():
    ds = _ds()
    with pytest.raises(CausalScrubbingError, match="index 6 is out of range for a Dataset of 6"):
        ds[6]
    with pytest.raises(CausalScrubbingError, match=r"indices \[9, -7\] are out of range .* 6"):
        ds[torch.tensor([0, 9, -7])]
    with pytest.raises(CausalScrubbingError, match="must be integers"):
        ds[torch.tensor([0.0])]
    with pytest.raises(CausalScrubbingError, match="mask of length 2"):
        ds[torch.tensor([True, False])]
    with pytest.raises(CausalScrubbingError, match="indexed by"):
        ds["toks"]


def test_iteration_gives_each_example_once():
    ds = _ds(4)
    assert [d.label.value.item() for d in ds] == [0, 1, 0, 1]


class Tagged(Dataset):
    """A subclass, as rust_circuit users write them (for pretty prints, typed funcs)."""


def test_subclass_is_kept_by_indexing_sampling_and_unwrap():
    ds = Tagged({"a": torch.arange(5)})
    assert type(ds[1]) is Tagged and type(ds[[0, 1]]) is Tagged
    assert type(ds.sample(3, torch.Generator().manual_seed(0))) is Tagged
    assert Tagged.unwrap(ds) is ds
    assert Dataset.unwrap(ds) is ds
    with pytest.raises(CausalScrubbingError, match="expected a Tagged, got a Dataset"):
        Tagged.unwrap(Dataset({"a": torch.arange(5)}))
    assert type(attrs.evolve(ds, input_names={"a"})) is Tagged


def test_sample_is_uniform_with_replacement_and_seeded():
    ds = Dataset({"i": torch.arange(4)})
    drawn = ds.sample(4000, torch.Generator().manual_seed(1)).i.value
    again = ds.sample(4000, torch.Generator().manual_seed(1)).i.value
    assert torch.equal(drawn, again)
    counts = torch.bincount(drawn, minlength=4)
    assert counts.min() > 900 and counts.max() < 1100  # expected 1000 each; seeded, so no flake
    assert len(ds.sample(10, torch.Generator().manual_seed(0))) == 10  # with replacement: more than len
    assert len(ds.sample(0)) == 0


def test_sample_errors():
    with pytest.raises(CausalScrubbingError, match="non-negative int"):
        _ds().sample(-1)
    with pytest.raises(CausalScrubbingError, match="empty Dataset"):
        _ds()[[]].sample(2)


def test_attribute_access_names_the_arrays_when_missing():
    with pytest.raises(AttributeError, match=r"no attribute or array 'nope' \(arrays: \['label', 'toks'\]\)"):
        _ds().nope


def test_from_tokens_makes_the_tokens_the_only_input_by_default():
    tokens = torch.randint(0, 7, (5, 4), generator=torch.Generator().manual_seed(0))
    ds = Dataset.from_tokens(tokens, labels=torch.arange(5))
    assert ds.input_names == {cc.transformer.names.TOKENS} == {"toks_int_var"}
    assert torch.equal(ds.toks_int_var.value, tokens) and ds.toks_int_var.value is not tokens
    assert ds.labels.value.tolist() == [0, 1, 2, 3, 4]
    both = Dataset.from_tokens(tokens, name="t", input_names={"t", "labels"}, labels=torch.arange(5))
    assert both.input_names == {"t", "labels"}
    with pytest.raises(CausalScrubbingError, match=r"integer tensor \[N, S\+1\]"):
        Dataset.from_tokens(torch.zeros(5, 4))
    with pytest.raises(CausalScrubbingError, match="same length"):
        Dataset.from_tokens(tokens, labels=torch.arange(3))


def test_str_shows_shapes_roles_and_small_values():
    text = str(_ds(2, input_names={"toks"}))
    assert text == (
        "Dataset(2 examples: label [2] (not an input)=[0, 1]; toks [2, 3]=[[0, 1, 2], [3, 4, 5]])"
    )
    big = str(Dataset({"x": torch.zeros(100, 3)}))
    assert big == "Dataset(100 examples: x [100, 3])"


class IntDataset(Dataset):
    """rust_circuit's testing_utils pattern: a plain subclass caching a derived tensor after init."""

    inp_tensor: torch.Tensor

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        object.__setattr__(self, "inp_tensor", self.xs.value)

    def __str__(self):
        return f"IntDataset(xs.shape={list(self.inp_tensor.shape)})"


def test_a_rust_circuit_style_subclass_works_unchanged():
    xs = torch.arange(16).reshape(8, 2)
    ds = IntDataset({"xs": cc.Array(xs, "xs"), "labels": cc.Array(xs.sum(1) % 2, "labels")})
    assert str(ds) == "IntDataset(xs.shape=[8, 2])"
    picked = ds[[1, 2]]
    assert type(picked) is IntDataset and picked.inp_tensor.tolist() == [[2, 3], [4, 5]]
    assert ds == IntDataset(ds.arrs) and hash(ds) == hash(IntDataset(ds.arrs))
    assert str(ds.sample(3, torch.Generator().manual_seed(0))) == "IntDataset(xs.shape=[3, 2])"
