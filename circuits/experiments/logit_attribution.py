"""Direct logit attribution and the logit lens, each one call on a model circuit (or its cache).

``direct_logit_attribution`` splits the logit of the answer (or the logit difference between the
answer and a wrong token) at one position into the direct contribution of every path to the final
residual stream: embeddings, each head, each attention bias, each MLP, and ``'bias'`` (the final
norm's bias and the unembedding bias).  The final norm's scale is the clean run's, so the parts
sum to the logit the circuit computes.  A soft-capped logit (Gemma 2) has no such parts: it is
refused unless ``uncapped=True`` asks for the parts of the logit before the cap.  ``logit_lens``
recomputes the final norm on the residual stream entering each layer and reads it out as the
model does (unembedding, bias, soft-cap).  Both return small result objects with ``records()``
(tidy rows) for a notebook.  Semantics and shapes: docs/analyses.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from circuits.errors import ExperimentError
from circuits.experiments import residual
from circuits.experiments.activations import ActivationCache, run_with_cache
from circuits.core.nodes import Circuit, check_node
from circuits.experiments.tables import records_frame

__all__ = ["LogitAttribution", "LogitLens", "direct_logit_attribution", "logit_lens"]


@dataclasses.dataclass(frozen=True)
class LogitAttribution:
    """Direct contributions ``values[component, batch]`` labelled ``labels``; ``total[batch]`` is the
    logit (difference) the circuit computes, which they sum to (with ``uncapped=True``, the logit
    before the model's soft-cap)."""

    values: torch.Tensor
    labels: list[str]
    total: torch.Tensor

    def records(self) -> list[dict]:
        """One row per (component, batch row): ``{'component', 'batch', 'value'}``."""
        return [
            {"component": label, "batch": row, "value": float(value)}
            for label, values in zip(self.labels, self.values.tolist())
            for row, value in enumerate(values)
        ]

    def to_pandas(self):
        """``records()`` as a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        return records_frame(self.records(), "LogitAttribution")


@dataclasses.dataclass(frozen=True)
class LogitLens:
    """Per layer (``labels``: ``'0_pre'``, ..., ``'final_post'``) the residual stream through the
    final norm and unembedding: ``logits`` and ``log_probs`` ``[layer, batch, vocab]`` (with a pos axis
    before vocab when ``pos`` is None), and the ``top_k`` tokens and their log-probs."""

    labels: list[str]
    logits: torch.Tensor
    log_probs: torch.Tensor
    top_tokens: torch.Tensor
    top_log_probs: torch.Tensor

    def records(self) -> list[dict]:
        """One row per (layer, batch row, rank) of the top tokens (for an int ``pos``)."""
        if self.top_tokens.ndim != 3:
            raise ExperimentError("records(): the lens was taken at every position; take it at one pos")
        return [
            {"layer": label, "batch": row, "rank": rank, "token": token, "log_prob": log_prob}
            for label, tokens, log_probs in zip(
                self.labels, self.top_tokens.tolist(), self.top_log_probs.tolist()
            )
            for row, (row_tokens, row_log_probs) in enumerate(zip(tokens, log_probs))
            for rank, (token, log_prob) in enumerate(zip(row_tokens, row_log_probs))
        ]

    def to_pandas(self):
        """``records()`` as a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        return records_frame(self.records(), "LogitLens")


def _cache(
    source: Circuit | ActivationCache,
    inputs: Mapping[Circuit | str, Any] | None,
    device: Any,
    dtype: Any,
) -> ActivationCache:
    if isinstance(source, ActivationCache):
        return source
    check_node(source, "the circuit (or its ActivationCache)", ExperimentError)
    points = residual.analysis_points(residual.model_facts(source))
    return run_with_cache(source, points, inputs=inputs, device=device, dtype=dtype)


def _position(pos: Any, seq: int) -> int:
    if isinstance(pos, bool) or not isinstance(pos, int) or not -seq <= pos < seq:
        raise ExperimentError(f"pos={pos!r}: give one position, an int in [{-seq}, {seq})")
    return pos


def direct_logit_attribution(
    circuit: Circuit | ActivationCache,
    answer_tokens: Any,
    wrong_tokens: Any = None,
    *,
    pos: int = -1,
    uncapped: bool = False,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> LogitAttribution:
    """Every direct path's share of the logit of ``answer_tokens`` at ``pos`` (minus ``wrong_tokens``'s).

    ``circuit``: a batched model circuit, or the ``ActivationCache`` of one.  ``answer_tokens`` and
    ``wrong_tokens``: one id, or one per batch row (``[batch]``).  Components: ``'embed'``,
    ``'pos_embed'`` (GPT-2), ``'L{l}H{h}'``, ``'{l}_attn_bias'`` (GPT-2), ``'{l}_mlp_out'``, ``'bias'``.
    A model that soft-caps its logits (Gemma 2) is refused unless ``uncapped=True``: then ``total`` is
    the logit before the cap (the final norm's output unembedded), which the components sum to.
    """
    cache = _cache(circuit, inputs, device, dtype)
    residual.check_uncapped(cache.facts, uncapped, "direct_logit_attribution")
    logits = cache.values_at([("logits",)])[0]
    if logits.ndim != 3:
        raise ExperimentError("direct_logit_attribution needs a batched circuit (tokens [batch, positions])")
    pos = _position(pos, logits.shape[1])
    batch = torch.Size([logits.shape[0]])
    vocab = logits.shape[-1]
    answers = residual.token_ids(answer_tokens, batch, vocab, "answer_tokens").expand(batch)
    wrong = (
        None
        if wrong_tokens is None
        else residual.token_ids(wrong_tokens, batch, vocab, "wrong_tokens").expand(batch)
    )
    stack, labels = residual.direct_components(cache, pos)
    values = residual.logit_attrs(cache, stack, answers, wrong, pos, None, True, uncapped)
    bias = residual.output_bias_logits(cache, answers, wrong, batch)
    if cache.facts.readout.softcap is not None:  # uncapped: the logits before the cap
        logits = residual.unembed(cache, cache.values_at([("ln_final",)])[0])
    rows = torch.arange(batch[0])
    total = logits[rows, pos, answers]
    if wrong is not None:
        total = total - logits[rows, pos, wrong]
    return LogitAttribution(torch.cat([values, bias[None]]), [*labels, "bias"], total)


def logit_lens(
    circuit: Circuit | ActivationCache,
    *,
    pos: int | None = -1,
    top_k: int = 5,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> LogitLens:
    """The logits each layer's residual stream would give: the final norm recomputed on the stream
    entering each layer (and on the final stream), unembedded and soft-capped as the model's logits
    are (Gemma 2), at ``pos`` (None: every position).  The last layer's logits are the model's."""
    cache = _cache(circuit, inputs, device, dtype)
    seq = cache.values_at([("logits",)])[0].shape[-2]
    if pos is not None:
        pos = _position(pos, seq)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ExperimentError(f"top_k={top_k!r}: give an int >= 1")
    stack, labels = residual.accumulated_resid(cache, None, False, False, pos, False)
    logits = residual.softcapped(cache, residual.unembed(cache, residual.final_norm(cache, stack)))
    log_probs = torch.log_softmax(logits, dim=-1)
    top = log_probs.topk(min(top_k, log_probs.shape[-1]), dim=-1)
    return LogitLens(labels, logits, log_probs, top.indices, top.values)
