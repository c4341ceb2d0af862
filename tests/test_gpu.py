"""Devices: every entry point that evaluates takes ``device=`` and keeps everything on it.

Two kinds of test:

- on the CPU (always run): a bad ``device`` is a typed error naming the argument, and each entry
  point runs whole on the ``meta`` device.  A meta tensor has a shape, a dtype and a device but no
  numbers, and torch refuses to mix it with a CPU tensor of any rank above 0 as it refuses to mix a
  CUDA one ("Tensor on device cpu is not on the expected device meta"), so a CPU tensor made
  without the device on the way (zeros, a stacked batch, a grid, a detection pattern), or an
  evaluation that forgets ``device=``, fails here as it would on a GPU.  The only numbers the
  library reads back (``.item()``, ``float()``, ``nonzero``) are answered by ``MetaNumbers``
  (zeros, no positions): the values are meaningless, the devices are what is checked.
- marked ``gpu`` (run where ``torch.cuda.is_available()``, skipped elsewhere, CI included: see
  tests/conftest.py): each entry point on ``device="cuda"`` in float32 gives the CPU result, with
  its tensors on the GPU, and a bfloat16 GPT-2 and Llama on the GPU give Hugging Face's own
  bfloat16 forward on the GPU as closely as on the CPU (tests/test_models_bf16.py's bounds).
"""

from __future__ import annotations

import functools

import factories
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.errors import CircuitError
from circuits.evaluation import schedule
from circuits.experiments import patching_grids as grids
from circuits.transformer import names

VOCAB = 17  #: factories.gpt2_config()'s vocabulary
GOOD, BAD = 3, 5


class MetaNumbers(TorchDispatchMode):
    """Meta tensors read back as numbers: ``.item()`` is 0, ``nonzero`` finds nothing.  Every other
    op runs as torch runs it, device checks included."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.device.type == "meta":
            if func is torch.ops.aten._local_scalar_dense.default:
                return 0.0 if first.is_floating_point() else 0
            if func is torch.ops.aten.nonzero.default:
                return torch.zeros((0, first.ndim), dtype=torch.long, device="meta")
        return func(*args, **kwargs)


def _tokens(seed: int, shape=(2, 7)) -> torch.Tensor:
    return factories.token_ids(VOCAB, shape, seed=seed)


@functools.cache
def _gpt2() -> tuple[cc.Circuit, torch.Tensor]:
    """A 2-layer GPT-2 circuit on clean tokens, and corrupted tokens of the same shape."""
    return factories.gpt2_circuit(_tokens(1), factories.gpt2_config(d_mlp=20)), _tokens(2)


class Seen:
    """A metric function of the logits that records the device of every tensor it is given."""

    __name__ = "seen_metric"

    def __init__(self):
        self.devices: list[str] = []

    def __call__(self, logits: torch.Tensor):
        self.devices.append(logits.device.type)
        return logits[..., -1, GOOD].mean() - logits[..., -1, BAD].mean()


def _all_meta(tensors) -> bool:
    tensors = list(tensors)
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)


# ------------------------------------------------------------------ the argument is checked


def _entry_points():
    """Every entry point that evaluates, as ``call(device)`` on the small GPT-2."""
    circuit, corrupted = _gpt2()
    inputs = {"toks_int_var": corrupted}
    diff = ex.logit_diff(-1, GOOD, BAD, push_down=False)
    return {
        "evaluate": lambda d: cc.evaluate(circuit, device=d),
        "Evaluator": lambda d: cc.Evaluator(2**20).evaluate(circuit, device=d),
        "profile": lambda d: cc.profile(circuit, device=d),
        "sweep": lambda d: ex.sweep(circuit, ["b0.a.head0"], progress=False, device=d),
        "patch_grid": lambda d: ex.patch_grid(circuit, inputs, diff, "resid_pre", device=d),
        "act_patch_resid_pre": lambda d: grids.act_patch_resid_pre(circuit, inputs, diff, device=d),
        "attribution_patching": lambda d: ex.attribution_patching(circuit, inputs, diff, device=d),
        "gradients": lambda d: ex.gradients(circuit, diff, [("resid_pre", 0)], device=d),
        "run_with_cache": lambda d: ex.run_with_cache(circuit, [("resid_pre", 0)], device=d),
        "path_terms": lambda d: ex.path_terms(circuit, device=d),
        "mean_ablate": lambda d: ex.mean_ablate(circuit, "b0.m", {"toks_int_var": corrupted}, device=d),
        "Metric": lambda d: ex.mean_loss(circuit, device=d),
        "detect_head": lambda d: ex.detect_head(circuit, "previous_token_head", device=d),
        "logit_lens": lambda d: ex.logit_lens(circuit, device=d),
        "direct_logit_attribution": lambda d: ex.direct_logit_attribution(circuit, GOOD, BAD, device=d),
    }


ENTRY_POINTS = list(_entry_points())


@pytest.mark.parametrize("name", ENTRY_POINTS)
@pytest.mark.parametrize("device", ["nowhere", "cuda:7"])
def test_a_bad_device_is_a_typed_error_naming_the_argument(name, device):
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(CircuitError, match=r"\bdevice\b") as info:
        _entry_points()[name](device)
    assert device in str(info.value)
    why = "is not a torch device" if device == "nowhere" else "is not available here"
    assert why in str(info.value)


def test_experiments_name_themselves_in_a_device_error():
    circuit, corrupted = _gpt2()
    with pytest.raises(cc.errors.ExperimentError, match=r"^sweep: device 'nowhere'"):
        ex.sweep(circuit, ["b0.a.head0"], progress=False, device="nowhere")
    with pytest.raises(cc.errors.ExperimentError, match=r"^attribution_patching: device 'nowhere'"):
        ex.attribution_patching(circuit, {"toks_int_var": corrupted}, ex.mean_loss, device="nowhere")


# ------------------------------------------------------------------ every evaluation is asked on the device


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_every_evaluation_an_entry_point_makes_is_on_its_device(name, monkeypatch):
    """Every plan an entry point compiles (``compile_plan`` checks each call's options with
    ``check_options``) is asked for on the device given: an evaluation that forgets ``device=``
    would run where the Arrays are, and on a GPU meet the tensors made on the device."""
    asked = []
    check_options = schedule.check_options

    def spy(inputs, device, dtype):
        asked.append(device)
        return check_options(inputs, device, dtype)

    monkeypatch.setattr(schedule, "check_options", spy)
    _entry_points()[name](torch.device("cpu"))
    assert asked and all(device is not None and torch.device(device).type == "cpu" for device in asked), asked


# ------------------------------------------------------------------ tensors made on the device (meta)


def test_sweep_evaluates_every_target_on_the_device():
    circuit, _ = _gpt2()
    seen = Seen()
    # two heads of an unsplit layer (the batched path) and an MLP (one rewritten circuit)
    with MetaNumbers():
        table = ex.sweep(
            circuit, ["b0.a.head0", "b1.a.head2", "b0.m"], metric=seen, progress=False, device="meta"
        )
    assert len(table) == 3
    # the clean run, a batch of two heads (or one per head), the MLP's run: every one on meta
    assert len(seen.devices) == 4 and set(seen.devices) == {"meta"}
    assert table.head_grid().device.type == "cpu"


def test_a_sweep_with_a_metric_circuit_runs_on_the_device():
    circuit, _ = _gpt2()
    ev = cc.Evaluator(2**24)
    with MetaNumbers():
        table = ex.sweep(circuit, ["b0.a.head1", "b1.m"], progress=False, device="meta", evaluator=ev)
    # on the CPU these are real losses (about log 17); read back from meta they are MetaNumbers' 0
    assert table.baseline == 0.0 and list(table.values()) == [0.0, 0.0]


def test_attribution_patching_runs_on_the_device():
    circuit, corrupted = _gpt2()
    with MetaNumbers():
        result = ex.attribution_patching(
            circuit, {"toks_int_var": corrupted}, Seen(), ["resid_pre", "z", "mlp_out"], device="meta"
        )
    assert _all_meta(result.values())
    assert result["z"].shape == (2, 3, 6)


def test_a_metric_evaluates_on_the_device():
    circuit, _ = _gpt2()
    assert ex.mean_loss(circuit) > 1.0  # a real loss on the CPU (about log 17)
    with MetaNumbers():
        assert ex.mean_loss(circuit, device="meta") == 0.0
        assert ex.mean_loss(circuit, evaluator=cc.Evaluator(2**20), device="meta") == 0.0


def test_detect_head_scores_on_the_device():
    circuit, _ = _gpt2()
    with MetaNumbers():
        scores = ex.detect_head(circuit, "induction_head", device="meta")
        from_cache = ex.detect_head(ex.run_with_cache(circuit, device="meta"), "duplicate_token_head")
    assert scores.device.type == "meta" and scores.shape == (2, 3)
    assert from_cache.device.type == "meta"


def test_the_cache_analyses_run_on_the_device():
    circuit, _ = _gpt2()
    with MetaNumbers():
        attribution = ex.direct_logit_attribution(circuit, GOOD, BAD, device="meta")
        lens = ex.logit_lens(circuit, device="meta")
        grads = ex.gradients(circuit, Seen(), [("resid_pre", 1), ("z", 0)], device="meta")
        cache = ex.run_with_cache(circuit, device="meta")
        stack = cache.decompose_resid(apply_ln=True, pos_slice=-1)
        made = [
            cache.accumulated_resid(incl_mid=True, apply_ln=True),
            stack,
            cache.stack_head_results(incl_remainder=True, apply_ln=True),
            cache.logit_attrs(stack, [GOOD, GOOD], [BAD, BAD], pos_slice=-1),
        ]
    assert _all_meta([attribution.values, attribution.total, lens.logits, *grads.values(), *made])


# ------------------------------------------------------------------ on a GPU


def _close(ours, reference, what: str) -> None:
    """``ours`` (on the GPU) equals ``reference`` (the CPU run) to 1e-4 relative."""
    assert ours.device.type == "cuda", f"{what} is on {ours.device}"
    torch.testing.assert_close(
        ours.cpu(), reference, rtol=1e-4, atol=1e-4 * float(reference.abs().max()) + 1e-7
    )


@pytest.mark.gpu
def test_on_the_gpu_evaluate_and_the_evaluator_give_the_cpu_values():
    circuit, _ = _gpt2()
    reference = cc.evaluate(circuit.get_unique(names.LOGITS))
    _close(cc.evaluate(circuit.get_unique(names.LOGITS), device="cuda"), reference, "evaluate")
    ev = cc.Evaluator(2**24)
    for _ in range(2):  # the second from the cache
        _close(ev.evaluate(circuit.get_unique(names.LOGITS), device="cuda"), reference, "Evaluator")
    profiled = cc.profile(circuit, device="cuda", synchronize=True)
    assert profiled.seconds > 0 and profiled.nodes


@pytest.mark.gpu
def test_on_the_gpu_a_sweep_gives_the_cpu_table():
    circuit, _ = _gpt2()
    targets = ex.head_names(circuit) + ["b0.m", "b1.m"]
    seen = Seen()
    cpu = ex.sweep(circuit, targets, progress=False)
    gpu = ex.sweep(circuit, targets, progress=False, device="cuda")
    by_function = ex.sweep(circuit, targets, metric=seen, progress=False, device="cuda")
    assert set(seen.devices) == {"cuda"}
    assert gpu.keys() == cpu.keys()
    torch.testing.assert_close(
        torch.tensor(list(gpu.values())), torch.tensor(list(cpu.values())), rtol=1e-4, atol=1e-6
    )
    assert len(by_function) == len(targets)


@pytest.mark.gpu
@pytest.mark.parametrize("grid", ["resid_pre", "attn_head_out_by_pos", "attn_head_pattern_all_pos"])
def test_on_the_gpu_a_patching_grid_gives_the_cpu_grid(grid):
    circuit, corrupted = _gpt2()
    metric = ex.logit_diff(-1, GOOD, BAD)
    cpu = ex.patch_grid(circuit, {"toks_int_var": corrupted}, metric, grid)
    seen = Seen()
    gpu = ex.patch_grid(circuit, {"toks_int_var": corrupted}, metric, grid, device="cuda")
    ex.patch_grid(circuit, {"toks_int_var": corrupted}, seen, grid, device="cuda")
    assert set(seen.devices) == {"cuda"}
    assert gpu.values.device.type == "cpu"  # a table of the runs' numbers, as documented
    torch.testing.assert_close(gpu.values, cpu.values, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_on_the_gpu_attribution_patching_gives_the_cpu_grids():
    circuit, corrupted = _gpt2()
    metric = ex.logit_diff(-1, GOOD, BAD, push_down=False)
    kinds = ["resid_pre", "attn_out", "mlp_out", "z", "attn_probs"]
    cpu = ex.attribution_patching(circuit, {"toks_int_var": corrupted}, metric, kinds)
    gpu = ex.attribution_patching(circuit, {"toks_int_var": corrupted}, metric, kinds, device="cuda")
    for kind in kinds:
        _close(gpu[kind], cpu[kind], f"attribution_patching[{kind!r}]")
    assert gpu.target_metric == pytest.approx(cpu.target_metric, rel=1e-4)


@pytest.mark.gpu
def test_on_the_gpu_gradients_and_the_cache_give_the_cpu_values():
    circuit, _ = _gpt2()
    points = [("resid_pre", 1), ("z", 0), ("attn_probs", 1)]
    metric = ex.logit_diff(-1, GOOD, BAD, push_down=False)
    cpu, gpu = ex.gradients(circuit, metric, points), ex.gradients(circuit, metric, points, device="cuda")
    for point in points:
        _close(gpu[point], cpu[point], f"gradients[{point}]")
    cache = ex.run_with_cache(circuit, points, device="cuda")
    for point in points:
        _close(cache[point], gpu.activations[point].cpu(), f"run_with_cache[{point}]")


@pytest.mark.gpu
def test_on_the_gpu_path_terms_give_the_cpu_terms():
    circuit, _ = _gpt2()
    cpu = ex.path_terms(circuit, order=2)
    gpu = ex.path_terms(circuit, order=2, device="cuda")
    assert gpu.labels == cpu.labels and gpu.compositions == cpu.compositions
    _close(cc.evaluate(gpu.terms, device="cuda"), cc.evaluate(cpu.terms), "path_terms")


@pytest.mark.gpu
def test_on_the_gpu_the_other_analyses_give_the_cpu_values():
    circuit, corrupted = _gpt2()
    cpu_dla = ex.direct_logit_attribution(circuit, GOOD, BAD)
    gpu_dla = ex.direct_logit_attribution(circuit, GOOD, BAD, device="cuda")
    _close(gpu_dla.values, cpu_dla.values, "direct_logit_attribution")
    _close(ex.logit_lens(circuit, device="cuda").logits, ex.logit_lens(circuit).logits, "logit_lens")
    scores = ex.detect_head(circuit, "previous_token_head", device="cuda")
    _close(scores, ex.detect_head(circuit, "previous_token_head"), "detect_head")
    dataset = {"toks_int_var": _tokens(3, (5, 7))}
    ablated = ex.mean_ablate(circuit, "b0.m", dataset, device="cuda")
    _close(
        cc.evaluate(ablated.get_unique(names.LOGITS), device="cuda"),
        cc.evaluate(ex.mean_ablate(circuit, "b0.m", dataset).get_unique(names.LOGITS)),
        "mean_ablate",
    )
    assert ex.mean_loss(circuit, device="cuda") == pytest.approx(ex.mean_loss(circuit), rel=1e-4)


BF16_ACCURACY = 1.2  #: tests/test_models_bf16.py's ACCURACY
BF16_NEAR = {"gpt2": 1.15, "llama": 0.9}  #: tests/test_models_bf16.py's NEAR (GPT-2 is biased)


def _hf_bf16(family: str):
    eager = dict(attn_implementation="eager")
    if family == "gpt2":
        return factories.gpt2(perturb=factories.shifted(0.2), n_positions=32, **eager)
    return factories.llama(perturb=factories.shifted(0.2), rms_norm_eps=1e-5, **eager)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_on_the_gpu_bf16_logits_are_as_close_as_hugging_faces(family):
    """The circuit's bfloat16 logits on the GPU against Hugging Face's bfloat16 and float32
    forwards of the same model on the GPU: as close to float32 as Hugging Face's bfloat16, and
    closer to Hugging Face's bfloat16 than that is to float32 (tests/test_models_bf16.py's bounds)."""
    pytest.importorskip("transformers")
    import copy

    float32 = _hf_bf16(family).cuda()
    bfloat16 = copy.deepcopy(float32).to(torch.bfloat16)
    tokens = factories.token_ids(factories.FAMILY_VOCAB, (8, 17), seed=1)
    with torch.no_grad():
        theirs32 = float32(input_ids=tokens[:, :-1].cuda()).logits.double()
        theirs16 = bfloat16(input_ids=tokens[:, :-1].cuda()).logits.double()
    circuit = cm.from_hf(bfloat16, tokens)  # the weights stay on the GPU; the tokens move there
    ours = cc.evaluate(circuit.get_unique(names.LOGITS), device="cuda")
    assert ours.dtype == torch.bfloat16 and ours.device.type == "cuda"

    def rms(x):
        return x.square().mean().sqrt().item()

    bf16_error = rms(theirs16 - theirs32)
    assert rms(ours.double() - theirs32) <= BF16_ACCURACY * bf16_error
    assert rms(ours.double() - theirs16) <= BF16_NEAR[family] * bf16_error
