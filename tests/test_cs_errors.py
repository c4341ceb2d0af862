"""Causal scrubbing mistakes that used to escape as a KeyError, a torch error or a wrong shape later:
each is a ``CausalScrubbingError`` (a ``CircuitError``) naming the argument at fault, raised where
the mistake is made.  The arithmetic circuit of test_cs_experiment (``out = (a + b) + c``, columns
of ``x``) is used throughout."""

from __future__ import annotations

import pytest
import torch
from test_cs_experiment import circuit, column, dataset, two_level

import circuits as cc
from circuits.causal_scrubbing import (
    CausalScrubbingError,
    Correspondence,
    Dataset,
    ExactSampler,
    Experiment,
    ExperimentEvalSettings,
    FuncSampler,
    IllegalCorrespondenceError,
    InterpNode,
    UncondSampler,
    corr_root_matcher,
    scrub_losses,
)
from circuits.errors import CircuitError


def exact_a() -> Correspondence:
    return two_level(corr_root_matcher.chain("a"))


# ------------------------------------------------------------------ reference datasets


def test_a_reference_dataset_missing_an_input_names_it():
    experiment = Experiment(circuit(7), dataset(), exact_a())
    ref = Dataset({"y": torch.zeros(4, 3)})
    with pytest.raises(CausalScrubbingError, match="ref_ds_or_num has no array 'x'"):
        experiment.scrub(ref)


def test_a_reference_dataset_with_rows_of_another_shape_names_it():
    experiment = Experiment(circuit(7), dataset(), exact_a())
    with pytest.raises(
        CausalScrubbingError, match=r"ref_ds_or_num's 'x' has rows of shape \[4\], the dataset's \[3\]"
    ):
        experiment.scrub(Dataset({"x": torch.zeros(5, 4, dtype=torch.float64)}))


def test_a_given_reference_dataset_is_scrubbed_row_for_row():
    ref = dataset()[[3, 1, 4]]
    scrubbed = Experiment(circuit(7), dataset(), exact_a()).scrub(ref)
    other = scrubbed.sampled_inputs[scrubbed.nodes.get_root()]
    expected = column(ref, 0) + column(other, 1) + column(other, 2)
    torch.testing.assert_close(scrubbed.evaluate(), expected, rtol=0, atol=0)


# ------------------------------------------------------------------ seeds


@pytest.mark.parametrize("seed", [None, 1.5, 2**70, -1, True, "3"])
def test_a_seed_torch_cannot_take_names_random_seed(seed):
    with pytest.raises(CausalScrubbingError, match=r"random_seed must be an int in \[0, 2\*\*64\)"):
        Experiment(circuit(7), dataset(), exact_a(), random_seed=seed)


@pytest.mark.parametrize(
    "seeds, where", [(None, "seeds must"), (1.5, "seeds must"), ([0, 2**70], r"seeds\[1\]")]
)
def test_seeds_torch_cannot_take_are_named_by_scrub_losses(seeds, where):
    with pytest.raises(CausalScrubbingError, match=where):
        scrub_losses(
            circuit(7), dataset(), {"scrambled": exact_a()}, 5, metric=lambda v: v.mean(), seeds=seeds
        )


def test_the_largest_seed_torch_takes_is_accepted_and_differs_from_zero():
    big = Experiment(circuit(7), dataset(), exact_a(), random_seed=2**64 - 1).scrub(20)
    zero = Experiment(circuit(7), dataset(), exact_a(), random_seed=0).scrub(20)
    assert big.seed == 2**64 - 1 and not torch.equal(big.ref_ds.x.value, zero.ref_ds.x.value)


# ------------------------------------------------------------------ evaluation settings


@pytest.mark.parametrize(
    "device_dtype, message",
    [
        ("nowhere", "device 'nowhere' is not a torch device"),
        (f"cuda:{torch.cuda.device_count()}", "is not available here"),
        (("cpu", torch.int64), "dtype torch.int64 is not a floating torch dtype"),
        (("cpu", "float33"), "dtype 'float33' is not a floating"),
        (3, "device_dtype must be None, a device or a"),
        (("cpu", None, None), "device_dtype must be None, a device or a"),
    ],
)
def test_a_bad_device_dtype_is_refused_by_the_settings(device_dtype, message):
    with pytest.raises(CausalScrubbingError, match=message):
        ExperimentEvalSettings(device_dtype=device_dtype)


def test_device_dtype_takes_a_device_a_pair_or_a_dtype_name():
    scrubbed = Experiment(circuit(7), dataset(), exact_a()).scrub(6)
    clean = scrubbed.evaluate()
    assert clean.dtype == torch.float64
    for device_dtype in (("cpu", "float32"), (None, torch.float32), [torch.device("cpu"), "torch.float32"]):
        value = scrubbed.evaluate(ExperimentEvalSettings(device_dtype=device_dtype))
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, clean.float(), rtol=0, atol=0)
    assert scrubbed.evaluate(ExperimentEvalSettings(device_dtype="cpu")).dtype == torch.float64
    with pytest.raises(CausalScrubbingError, match="eval_settings must be an ExperimentEvalSettings"):
        scrubbed.evaluate("cpu")


# ------------------------------------------------------------------ correspondences, samplers, metrics


@pytest.mark.filterwarnings("ignore:check=False")
def test_a_child_left_out_is_named_even_with_check_false():
    corr = exact_a()
    corr.get_root().make_descendant(ExactSampler(), "forgotten")
    experiment = Experiment(circuit(7), dataset(), corr, check=False)
    with pytest.raises(IllegalCorrespondenceError, match="a child of 'root'") as info:  # names the parent too
        experiment.scrub(5, check=False)
    assert info.value.i_node.name == "forgotten"


def test_a_func_sampler_returning_strings_names_its_func():
    def named(d):
        return ["odd" if v % 2 else "even" for v in d.x.value[:, 0].tolist()]

    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    corr.add(root.make_descendant(FuncSampler(named), "a"), corr_root_matcher.chain("a"))
    with pytest.raises(CausalScrubbingError, match="FuncSampler func .*named.* must return a tensor"):
        Experiment(circuit(7), dataset(), corr).scrub(5)


def hypotheses() -> dict[str, Correspondence]:
    scrambled = Correspondence()
    scrambled.add(InterpNode(UncondSampler(), "root"), corr_root_matcher)
    return {"scrambled": scrambled, "a": exact_a()}


@pytest.mark.parametrize(
    "metric", [lambda v: v, lambda v: v.tolist(), lambda v: "low", lambda v: v.mean() > 0]
)
def test_a_metric_that_does_not_return_one_number_is_named(metric):
    with pytest.raises(CausalScrubbingError, match="metric .* must return one number; on the clean model"):
        scrub_losses(circuit(7), dataset(), hypotheses(), 5, metric=metric, seeds=[0])


def test_a_metric_may_return_a_one_element_tensor_or_array():
    """The report's numbers are the metric of each hypothesis scrubbed by hand with the same seed."""
    report = scrub_losses(circuit(7), dataset(), hypotheses(), 8, metric=lambda v: v.mean(), seeds=[3])
    scrubbed = Experiment(circuit(7), dataset(), exact_a(), random_seed=3).scrub(8)
    assert report.losses["a"] == [scrubbed.evaluate().mean().item()]
    assert report.clean == [scrubbed.ref_ds.x.value.sum(-1).mean().item()]
    by_array = scrub_losses(
        circuit(7), dataset(), hypotheses(), 8, metric=lambda v: v.numpy().mean(keepdims=True), seeds=[3]
    )
    assert by_array.losses["a"] == pytest.approx(report.losses["a"], rel=1e-12)


def test_every_error_here_is_a_circuit_error():
    assert issubclass(CausalScrubbingError, CircuitError) and issubclass(
        IllegalCorrespondenceError, CircuitError
    )


# ------------------------------------------------------------------ circuits on one example or a batch


def test_an_input_of_neither_shape_is_named():
    x = cc.Array(torch.zeros(7, 4, dtype=torch.float64), name="x")
    with pytest.raises(
        CausalScrubbingError,
        match=r"input Array 'x' has shape \[7, 4\].*one row, \[3\], or a batch of rows, \[batch, 3\]",
    ):
        Experiment(cc.Index(x, (slice(None), 0), name="a"), dataset(), exact_a())


def test_inputs_on_one_example_and_on_a_batch_are_not_mixed():
    data = Dataset({"x": torch.zeros(6, 3), "y": torch.zeros(6)})
    one_x = cc.Index(cc.Array(torch.zeros(3), name="x"), (0,))
    batch_of_y = cc.Index(cc.Array(torch.zeros(2), name="y"), (0,))
    mixed = cc.Add(one_x, batch_of_y, name="out")
    with pytest.raises(CausalScrubbingError, match="is one example but .* is a batch"):
        Experiment(mixed, data, exact_a())
