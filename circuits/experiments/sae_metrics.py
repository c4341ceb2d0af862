"""SAELens's reconstruction metrics of an SAE on a model circuit, computed through splicing.

``reconstruction_metrics(circuit, sae)`` gives the numbers SAELens's ``evals.run_evals`` reports
(SAELens 6.54.12, ``sae_lens/evals.py``), under its names, from the circuit on its own tokens:

- the model's behaviour with the SAE substituted (``splice_sae`` with its error zeroed: SAELens's
  replacement hook, ``decode(encode(x))`` and no error term) and with the SAE's point
  zero-ablated (``ex.zero_ablate``, every position: SAELens's ``standard_zero_ablate_hook``), against
  the circuit as it is: ``ce_loss_without_sae``, ``ce_loss_with_sae``, ``ce_loss_with_ablation``
  (next-token cross-entropy), ``kl_div_with_sae``, ``kl_div_with_ablation`` (``KL(original || new)``
  of the next-token distributions), and the scores
  ``ce_loss_score = (ablation - sae) / (ablation - without)``,
  ``kl_div_score = (ablation - sae) / ablation``;
- the reconstruction itself (``x`` the activation at the point, ``x_hat`` the SAE's output): ``l0``
  (features != 0 per token), ``l1``, ``mse`` (``||x - x_hat||^2`` summed over the width, per token),
  ``cossim``, ``l2_norm_in``, ``l2_norm_out``, ``l2_ratio`` (a norm below 1e-4 divides as 1, as
  SAELens's), ``explained_variance`` (``1 - mse / Var(x)``, ``Var(x) = E||x||^2 - ||E x||^2`` over
  every token, SAELens's ``ExplainedVarianceCalculator``; 1 or 0 when ``Var(x) < 1e-10``).

Every per-token number is a mean over the tokens kept (SAELens concatenates its batches and takes
one mean, so its batching does not change them), and the scores are taken of those means.
``ignore_tokens`` (SAELens's ``exclude_special_tokens``: token ids, e.g. the BOS) drops the
positions whose input token is one of them from every mean, and the substituted run keeps the
original activation there (SAELens's ``torch.where(mask, sae_out, x)``); the ablation is not masked
(SAELens's is not).  A cross-entropy is the loss at a position with a next token: the circuit's
targets (``'true_toks_int'``), or, built with ``convention='prompt'`` (logits at every position,
as TransformerLens's ``model(tokens)``), the next input token; its mask is its input token's.

Not here: ``explained_variance_legacy`` and ``relative_reconstruction_bias``, which SAELens takes
per batch of its activation store (their value depends on how the tokens are batched), and the
feature-wise statistics.  A transcoder's numbers compare its output with the node it replaces
(``point_out``), which SAELens's evals do not define.  docs/features.md compares the numbers with
SAELens's own (tests/test_sae_metrics.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import torch

from circuits.core.nodes import Array, Circuit, Einsum, check_node
from circuits.errors import SAEError
from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator
from circuits.experiments.ablation import zero_ablate
from circuits.experiments.metrics import find
from circuits.transformer import names
from circuits.transformer.points import as_point, sae_node_name

if TYPE_CHECKING:  # models are imported where an SAE is checked: `import circuits` stays light
    from circuits.models.sae import SAE

__all__ = ["reconstruction_metrics"]


def reconstruction_metrics(
    circuit: Circuit,
    sae: SAE,
    point: Any = None,
    *,
    ignore_tokens: Iterable[int] = (),
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """SAELens's reconstruction metrics of ``sae`` spliced at ``point`` (default: its own; a
    transcoder's output) into ``circuit``, a model circuit on its tokens (module docstring):
    ``{name: float}`` by SAELens's names.  ``device``, ``dtype``: as ``cc.evaluate``."""
    from circuits.experiments.sae import splice_sae

    check_node(circuit, "reconstruction_metrics: the circuit", SAEError)
    from circuits.models.sae import SAE

    if not isinstance(sae, SAE):
        raise SAEError(
            f"reconstruction_metrics: sae is a {type(sae).__name__}, not a circuits SAE (load_sae)"
        )
    where = sae.point_out() if point is None else as_point(point)
    spliced = splice_sae(circuit, sae, point)
    inputs = find(circuit, names.INPUT_TOKENS, "reconstruction_metrics").evaluate()
    keep = _kept(inputs, ignore_tokens)
    substituted = spliced.update(sae_node_name(where, "error"), lambda error: _masked(error, ~keep))
    ablated = zero_ablate(circuit, where)
    targets = circuit.get(names.TARGET_TOKENS)
    roots = [find(c, names.LOGITS, "reconstruction_metrics") for c in (circuit, substituted, ablated)]
    roots += [spliced.get_unique(sae_node_name(where, part)) for part in ("input", "acts", "recon")]
    values = Evaluator(DEFAULT_CACHE_BYTES).evaluate_many(roots, device=device, dtype=dtype)
    original, with_sae, with_ablation, x, acts, x_hat = values
    target = next(iter(targets)).evaluate() if targets else None
    metrics = _downstream(original, with_sae, with_ablation, inputs, target, keep)
    return metrics | _reconstruction(x[keep], acts[keep], x_hat[keep])


def _kept(inputs: torch.Tensor, ignore_tokens: Iterable[int]) -> torch.Tensor:
    """True at the positions whose input token is not one of ``ignore_tokens``."""
    ignored = torch.as_tensor(list(ignore_tokens), dtype=inputs.dtype)
    if ignored.ndim != 1:
        raise SAEError(f"reconstruction_metrics: ignore_tokens must be token ids, got {ignore_tokens!r}")
    return ~torch.isin(inputs, ignored)


def _masked(error: Circuit, mask: torch.Tensor) -> Circuit:
    """``error`` times ``mask`` (1 where the original activation is kept) on its position axes."""
    if tuple(error.shape[:-1]) != tuple(mask.shape):
        raise SAEError(
            f"reconstruction_metrics: the SAE's point {error.describe()} is {list(error.shape)}, not "
            f"[*tokens, width] with tokens {list(mask.shape)} (a point of one vector per token)"
        )
    letters = "abcdefgh"[: mask.ndim]
    scale = Array(mask.to(torch.float32), name=f"{error.name}.kept")
    return Einsum.from_einsum_string(f"{letters}z,{letters}->{letters}z", error, scale, name=error.name)


def _downstream(original, with_sae, with_ablation, inputs, targets, keep) -> dict[str, float]:
    """The cross-entropies and KL divergences of the three runs, and their scores."""
    if targets is None:  # logits at every position: the next input token is the target
        targets, keep_ce = inputs[..., 1:], keep[..., :-1]
        logits = [run[..., :-1, :] for run in (original, with_sae, with_ablation)]
    else:
        keep_ce, logits = keep, [original, with_sae, with_ablation]
    ce = [_cross_entropy(run, targets)[keep_ce].mean() for run in logits]
    kl = [_kl(original, run)[keep].mean() for run in (with_sae, with_ablation)]
    found = {
        "ce_loss_without_sae": float(ce[0]),
        "ce_loss_with_sae": float(ce[1]),
        "ce_loss_with_ablation": float(ce[2]),
        "kl_div_with_sae": float(kl[0]),
        "kl_div_with_ablation": float(kl[1]),
    }
    found["ce_loss_score"] = (found["ce_loss_with_ablation"] - found["ce_loss_with_sae"]) / (
        found["ce_loss_with_ablation"] - found["ce_loss_without_sae"]
    )
    found["kl_div_score"] = (found["kl_div_with_ablation"] - found["kl_div_with_sae"]) / found[
        "kl_div_with_ablation"
    ]
    return found


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    log_probs = logits.float().log_softmax(-1)
    return -log_probs.gather(-1, targets[..., None].long())[..., 0]


def _kl(original: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``KL(original || new)`` per position, as SAELens's ``_kl``."""
    log_new, probs = new.float().log_softmax(-1), original.float().softmax(-1)
    return torch.nn.functional.kl_div(log_new, probs, reduction="none").sum(-1)


def _reconstruction(x: torch.Tensor, acts: torch.Tensor, x_hat: torch.Tensor) -> dict[str, float]:
    """The per-token metrics of ``x [tokens, d]`` and its reconstruction, and the explained variance."""
    residual = (x - x_hat).pow(2).sum(-1)
    norm_in, norm_out = x.norm(dim=-1), x_hat.norm(dim=-1)
    cossim = ((x / norm_in[:, None]) * (x_hat / norm_out[:, None])).sum(-1)
    divisor = torch.where(norm_in.abs() < 1e-4, torch.ones_like(norm_in), norm_in)
    wide = x.double()
    variance = float(wide.pow(2).sum(-1).mean() - wide.mean(0).pow(2).sum())
    mse = float(residual.double().mean())
    if variance < 1e-10:
        explained = 1.0 if mse < 1e-10 else 0.0
    else:
        explained = 1.0 - mse / variance
    return {
        "l0": float((acts != 0).sum(-1).float().mean()),
        "l1": float(acts.abs().sum(-1).mean()),
        "mse": float(residual.mean()),
        "cossim": float(cossim.mean()),
        "l2_norm_in": float(norm_in.mean()),
        "l2_norm_out": float(norm_out.mean()),
        "l2_ratio": float((norm_out / divisor).mean()),
        "explained_variance": explained,
    }
