"""Gradient parity: a circuit built with ``attach=True`` against the Hugging Face model's own backward.

``gradient_parity(family, size, dtype)`` builds a Hugging Face
``GPT2LMHeadModel`` or ``LlamaForCausalLM`` (grouped-query attention: fewer
key/value heads than query heads) from a config with random weights (nothing
is downloaded), converts it with ``models.from_hf(model, tokens,
attach=True)``, and backpropagates the mean next-token cross-entropy twice:
through the circuit (the mean of its root ``'t.loss'``, the per-token loss of
inputs ``tokens[:, :-1]`` and targets ``tokens[:, 1:]``), then, gradients
zeroed, through the model (``F.cross_entropy`` of ``model(tokens[:, :-1]).logits``
against ``tokens[:, 1:]``).  It returns one row per entry of
``model.named_parameters()`` (a tied embedding is one parameter, whose
gradient has both uses' parts):

- ``max_abs_diff``: the largest ``|circuit grad - HF grad|`` over the parameter;
- ``rel_diff``: ``max_abs_diff / max |HF grad|`` over the parameter (0 when
  both gradients are zero; infinite when only one is, or when one is missing).

Targets: float64, every ``max_abs_diff <= 1e-9``; float32, every
``rel_diff <= 1e-5``; the loss difference likewise.  Sizes are ``SIZES``
(``tiny``, ``small``).  How the weights are drawn, the float32 margin, and
the float32 round trip in Hugging Face's float64 ``LlamaRMSNorm`` (removed
for the run): docs/trust.md.  ``circuits parity`` prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import types
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from circuits.errors import CircuitError, ModelError
from circuits.evaluation import evaluate
from circuits.models import from_hf
from circuits.models.common import check_seed
from circuits.core.nodes import Circuit

#: Model and input sizes: layers, d_model, query heads, key/value heads (Llama), MLP width, vocabulary,
#: batch rows, sequence length (model positions; the tokens have one more) and the weights' init std
#: (about 1/sqrt(d_model): the loss is above uniform's but not saturated, as in a model being trained).
SIZES = {
    "tiny": {
        "layers": 2,
        "d_model": 32,
        "heads": 4,
        "kv_heads": 2,
        "d_mlp": 64,
        "vocab": 97,
        "batch": 2,
        "seq": 12,
        "init_std": 0.2,
    },
    "small": {
        "layers": 4,
        "d_model": 128,
        "heads": 8,
        "kv_heads": 2,
        "d_mlp": 256,
        "vocab": 512,
        "batch": 4,
        "seq": 32,
        "init_std": 0.1,
    },
}
FAMILIES = ("gpt2", "llama")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: float64: largest absolute difference; float32: largest relative difference (see the module docstring).
TARGETS = {torch.float64: ("max_abs_diff", 1e-9), torch.float32: ("rel_diff", 1e-5)}


@dataclasses.dataclass(frozen=True)
class ParityRow:
    """One parameter's gradient comparison."""

    name: str
    max_abs_diff: float
    rel_diff: float
    ok: bool


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """Every parameter's row, the two losses, and whether all are within target."""

    family: str
    size: str
    dtype: torch.dtype
    rows: list[ParityRow]
    loss_circuit: float
    loss_hf: float
    loss_ok: bool

    @property
    def loss_diff(self) -> float:
        return abs(self.loss_circuit - self.loss_hf)

    @property
    def ok(self) -> bool:
        return self.loss_ok and all(row.ok for row in self.rows)

    @property
    def target(self) -> str:
        measure, limit = TARGETS[self.dtype]
        return f"{measure} <= {limit:g}"

    def worst(self, measure: str) -> ParityRow:
        return max(self.rows, key=lambda row: getattr(row, measure))


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ModelError(
            f"gradient parity needs transformers (pip install 'circuits-interp[hf]'): {error}"
        ) from error
    transformers.logging.set_verbosity_error()
    return transformers


def hf_model(family: str, size: str = "tiny", dtype: torch.dtype = torch.float32, seed: int = 0):
    """A random-weight Hugging Face model of ``family`` and ``size``, in eval mode (no dropout)."""
    if family not in FAMILIES:
        raise ModelError(f"gradient parity: family {family!r} is not one of {', '.join(FAMILIES)}")
    if size not in SIZES:
        raise ModelError(f"gradient parity: size {size!r} is not one of {', '.join(SIZES)}")
    if dtype not in TARGETS:
        raise ModelError(f"gradient parity: dtype {dtype} is not float32 or float64")
    check_seed(seed)
    t, dims = _transformers(), SIZES[size]
    if family == "gpt2":
        config = t.GPT2Config(
            n_layer=dims["layers"],
            n_head=dims["heads"],
            n_embd=dims["d_model"],
            n_inner=dims["d_mlp"],
            vocab_size=dims["vocab"],
            n_positions=dims["seq"],
            initializer_range=dims["init_std"],
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    else:
        config = t.LlamaConfig(
            num_hidden_layers=dims["layers"],
            num_attention_heads=dims["heads"],
            num_key_value_heads=dims["kv_heads"],
            hidden_size=dims["d_model"],
            intermediate_size=dims["d_mlp"],
            vocab_size=dims["vocab"],
            max_position_embeddings=dims["seq"],
            initializer_range=dims["init_std"],
            rms_norm_eps=1e-5,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        )
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(seed)
        model = (t.GPT2LMHeadModel if family == "gpt2" else t.LlamaForCausalLM)(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "ln" in name or "norm" in name:
                    param.add_(torch.randn_like(param) * 0.2)
                elif name.endswith("bias"):
                    param.normal_(0, 0.1)
    return model.to(dtype).eval()


def parity_tokens(size: str = "tiny", seed: int = 0, batch: int | None = None, seq: int | None = None):
    """Random token ids ``[batch, seq + 1]`` for ``size`` (its batch and seq unless given)."""
    dims = SIZES[size]
    shape = (batch or dims["batch"], (seq or dims["seq"]) + 1)
    generator = torch.Generator().manual_seed(check_seed(seed))
    return torch.randint(0, dims["vocab"], shape, generator=generator)


def gradient_parity(
    family: str = "gpt2",
    size: str = "tiny",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    batch: int | None = None,
    seq: int | None = None,
    edit: Callable[[Circuit], Circuit] | None = None,
) -> ParityReport:
    """The gradient of the mean loss through the circuit and through the model, per parameter.

    ``edit`` rewrites the circuit before it is evaluated (an ablation, a
    perturbed weight), to see that a wrong circuit is reported as a miss.
    """
    model = hf_model(family, size, dtype, seed)
    tokens = parity_tokens(size, seed, batch, seq)
    circuit = from_hf(model, tokens, attach=True)
    if edit is not None:
        circuit = edit(circuit)
    loss_circuit = evaluate(circuit).mean()
    loss_circuit.backward()
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    with _exact_rmsnorm(model) if dtype == torch.float64 else contextlib.nullcontext():
        logits = model(input_ids=tokens[:, :-1]).logits
    loss_hf = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss_hf.backward()
    measure, limit = TARGETS[dtype]
    rows = []
    for name, param in model.named_parameters():
        abs_diff, rel_diff = _differences(grads[name], param.grad)
        rows.append(
            ParityRow(
                name, abs_diff, rel_diff, (abs_diff if measure == "max_abs_diff" else rel_diff) <= limit
            )
        )
    model.zero_grad(set_to_none=True)
    loss_diff = abs(loss_circuit.item() - loss_hf.item())
    loss_measure = loss_diff if measure == "max_abs_diff" else loss_diff / abs(loss_hf.item())
    return ParityReport(family, size, dtype, rows, loss_circuit.item(), loss_hf.item(), loss_measure <= limit)


def _differences(ours: torch.Tensor | None, theirs: torch.Tensor | None) -> tuple[float, float]:
    """``(max_abs_diff, rel_diff)``; a gradient missing on one side only is an infinite difference."""
    if ours is None or theirs is None:
        return (0.0, 0.0) if ours is None and theirs is None else (math.inf, math.inf)
    abs_diff = (ours - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    if scale == 0:
        return abs_diff, 0.0 if abs_diff == 0 else math.inf
    return abs_diff, abs_diff / scale


@contextlib.contextmanager
def _exact_rmsnorm(model) -> Iterator[None]:
    """The model's RMSNorms without their float32 round trip, for the run (see the module docstring)."""

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    for norm in norms:
        norm.forward = types.MethodType(forward, norm)
    try:
        yield
    finally:
        for norm in norms:
            del norm.forward


# ------------------------------------------------------------ command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--family",
        choices=(*FAMILIES, "all"),
        default="all",
        help="which Hugging Face model to compare (default all)",
    )
    parser.add_argument(
        "--size",
        choices=tuple(SIZES),
        default="tiny",
        help="tiny: 2 layers, d_model 32, seconds; small: 4 layers, d_model 128 (default tiny)",
    )
    parser.add_argument(
        "--dtype",
        choices=(*DTYPES, "all"),
        default="all",
        help="float64 (target: max abs diff <= 1e-9) or float32 (rel diff <= 1e-5); default all",
    )
    parser.add_argument(
        "--seed", type=seed_argument, default=0, metavar="N", help="seed of weights and tokens (default 0)"
    )


def seed_argument(text: str) -> int:
    """An argparse type: a seed torch takes (``check_seed``), or a usage error saying which."""
    try:
        return check_seed(int(text))
    except (ValueError, ModelError):
        raise argparse.ArgumentTypeError(
            f"expected a whole number from -2**63 to 2**64 - 1, got {text!r}"
        ) from None


def run(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    """Print the parity table for the chosen models and dtypes; 1 if any target is missed."""
    families = FAMILIES if args.family == "all" else (args.family,)
    dtypes = tuple(DTYPES.values()) if args.dtype == "all" else (DTYPES[args.dtype],)
    reports = []
    try:
        for family in families:
            for dtype in dtypes:
                reports.append(gradient_parity(family, args.size, dtype, args.seed))
                _print_report(reports[-1], out)
    except CircuitError as error:
        print(f"circuits parity: {error}", file=sys.stderr)
        return 1
    missed = [f"{r.family} {str(r.dtype).removeprefix('torch.')}" for r in reports if not r.ok]
    if missed:
        out(f"MISSED: {', '.join(missed)} (float64: max_abs_diff <= 1e-9; float32: rel_diff <= 1e-5)")
        return 1
    out(f"All {len(reports)} within target (float64: max_abs_diff <= 1e-9; float32: rel_diff <= 1e-5).")
    return 0


def _print_report(report: ParityReport, out: Callable[[str], None]) -> None:
    dtype = str(report.dtype).removeprefix("torch.")
    out(f"{report.family} {report.size} {dtype}: {len(report.rows)} parameters, target {report.target}")
    width = max(len(row.name) for row in report.rows)
    out(f"  {'parameter':<{width}}  {'max_abs_diff':>12}  {'rel_diff':>9}")
    for row in report.rows:
        out(
            f"  {row.name:<{width}}  {row.max_abs_diff:12.3e}  {row.rel_diff:9.3e}{'' if row.ok else '  <- miss'}"
        )
    worst_abs, worst_rel = report.worst("max_abs_diff"), report.worst("rel_diff")
    out(
        f"  loss: circuit {report.loss_circuit:.10g}, HF {report.loss_hf:.10g}, diff {report.loss_diff:.3e}"
        f"{'' if report.loss_ok else '  <- miss'}"
    )
    out(
        f"  worst: max_abs_diff {worst_abs.max_abs_diff:.3e} ({worst_abs.name}), rel_diff {worst_rel.rel_diff:.3e} "
        f"({worst_rel.name}): {'within target' if report.ok else 'MISSED'}\n"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m circuits.cli.parity [--family ...] [--size ...] [--dtype ...] [--seed N]``."""
    parser = argparse.ArgumentParser(prog="circuits parity", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
