"""TransformerLens's head detector on a model circuit: ``detect_head(circuit, "induction_head")``.

A head's score is how much of its attention falls where a kind of head would put it, computed as
``transformer_lens.head_detector.detect_head`` computes it.  The detection pattern is a
``[query, key]`` matrix of ones and zeros built from the tokens (``detection_pattern``):

- ``"previous_token_head"``: the key just before the query;
- ``"duplicate_token_head"``: every earlier key holding the query's token;
- ``"induction_head"``: the key just after each earlier occurrence of the query's token.

With ``error_measure="mul"`` (the default) the score is ``sum(pattern * detection) / sum(pattern)``
over one row of the batch: the share of the head's attention on the detected pairs; with
``"abs"`` it is ``1 - mean(|pattern - detection|) * positions`` (TransformerLens rounds it to 3
decimals; this does not).  ``exclude_bos`` zeroes the attention to position 0 first,
``exclude_current_token`` the attention of each query to itself.  A batch gives the mean of the
rows' scores, as TransformerLens's ``detect_head`` does for a list of prompts.
"""

from __future__ import annotations

from typing import Any

import torch

from circuits.core.nodes import Circuit, check_node
from circuits.errors import ExperimentError
from circuits.evaluation.leaves import check_device
from circuits.experiments import residual
from circuits.experiments.activations import ActivationCache, run_with_cache
from circuits.transformer import names
from circuits.transformer.points import Point

__all__ = ["HEAD_PATTERNS", "detect_head", "detection_pattern"]

#: The detection patterns by name (TransformerLens's ``HEAD_NAMES``).
HEAD_PATTERNS = ("previous_token_head", "duplicate_token_head", "induction_head")
ERROR_MEASURES = ("mul", "abs")


def detection_pattern(kind: str, tokens: Any) -> torch.Tensor:
    """The ``[S, S]`` detection pattern of ``kind`` for tokens ``[S]`` (``[B, S, S]`` for ``[B, S]``),
    on the tokens' device."""
    if kind not in HEAD_PATTERNS:
        raise ExperimentError(f"detection pattern {kind!r}: the named ones are {', '.join(HEAD_PATTERNS)}")
    ids = torch.as_tensor(tokens)
    if ids.ndim not in (1, 2) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ExperimentError(
            f"tokens: expected integer ids [S] or [B, S], got {ids.dtype} {list(ids.shape)}"
        )
    seq = ids.shape[-1]
    below = torch.ones(seq, seq, device=ids.device).tril(-1)  # strictly earlier keys
    if kind == "previous_token_head":
        pattern = torch.diag(torch.ones(seq - 1, device=ids.device), -1).expand(*ids.shape[:-1], seq, seq)
        return pattern.clone()
    duplicate = (ids[..., :, None] == ids[..., None, :]).float() * below
    if kind == "duplicate_token_head":
        return duplicate
    shifted = torch.zeros_like(duplicate)  # the key after each earlier occurrence (never key 0)
    shifted[..., :, 1:] = duplicate[..., :, :-1]
    return shifted.tril()


def detect_head(
    circuit: Circuit | ActivationCache,
    pattern: str | torch.Tensor,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Every head's score ``[layer, head]`` for ``pattern`` (a name of ``HEAD_PATTERNS`` or a
    ``[S, S]`` / ``[B, S, S]`` tensor of zeros and ones); see the module docstring.

    ``circuit``: a model circuit (its own tokens are read), or its ``ActivationCache`` (the
    attention patterns it lacks are computed with one more run).  Split layers are read head by head.
    ``device``: where a circuit's attention patterns are computed (as ``cc.evaluate``'s; a cache's
    are where they were computed); the scores are on the patterns' device.
    """
    if error_measure not in ERROR_MEASURES:
        raise ExperimentError(f"error_measure={error_measure!r}: expected one of {ERROR_MEASURES}")
    for flag, value in (("exclude_bos", exclude_bos), ("exclude_current_token", exclude_current_token)):
        if not isinstance(value, bool):
            raise ExperimentError(f"{flag}={value!r} is not a bool")
    device = check_device(device, "detect_head", ExperimentError)
    cache = circuit if isinstance(circuit, ActivationCache) else _attention_cache(circuit, device)
    facts = cache.facts
    probs = [_layer_probs(cache, layer, facts.split_heads.get(layer)) for layer in range(facts.n_layers)]
    attention = torch.stack(probs, dim=-4)  # [batch?, layer, head, q, k]
    detection = _detection(pattern, cache.circuit, attention).to(attention.device, attention.dtype)
    detection = detection.unsqueeze(-3).unsqueeze(-3)  # over layers and heads
    if error_measure == "mul":  # the excluded attention is zeroed, then the share is taken
        attention = _excluded(attention, exclude_bos, exclude_current_token)
        scores = (attention * detection).sum((-2, -1)) / attention.sum((-2, -1))
    else:  # the excluded differences are zeroed (but still counted in the mean)
        difference = _excluded((attention - detection).abs(), exclude_bos, exclude_current_token)
        scores = 1 - difference.mean((-2, -1)) * difference.shape[-1]
    return scores.mean(0) if scores.ndim == 3 else scores


def _excluded(values: torch.Tensor, bos: bool, current: bool) -> torch.Tensor:
    """``values`` ``[..., q, k]`` with key 0 (``bos``) and the diagonal (``current``) zeroed, as a copy."""
    values = values.clone()
    if bos:
        values[..., 0] = 0
    if current:
        values.diagonal(dim1=-2, dim2=-1).zero_()
    return values


def _attention_cache(circuit: Circuit, device: torch.device | None) -> ActivationCache:
    check_node(circuit, "detect_head: the circuit (or its ActivationCache)", ExperimentError)
    facts = residual.model_facts(circuit)
    points: list[Point] = []
    for layer in range(facts.n_layers):
        n_heads = facts.split_heads.get(layer)
        heads = [None] if n_heads is None else list(range(n_heads))
        points += [Point("attn_probs", layer, head) for head in heads]
    return run_with_cache(circuit, points, device=device)


def _layer_probs(cache: ActivationCache, layer: int, n_heads: int | None) -> torch.Tensor:
    """A layer's attention probabilities ``[batch?, head, q, k]``, from one node or one per head."""
    if n_heads is None:
        return cache.values_at([Point("attn_probs", layer)])[0]
    return torch.stack(cache.values_at([Point("attn_probs", layer, h) for h in range(n_heads)]), dim=-3)


def _detection(pattern: Any, circuit: Circuit, attention: torch.Tensor) -> torch.Tensor:
    """The detection pattern ``[batch?, q, k]`` for ``attention`` ``[batch?, layer, head, q, k]``."""
    if isinstance(pattern, str):
        found = circuit.get(names.INPUT_TOKENS)
        if len(found) != 1:
            raise ExperimentError(
                f"detect_head: a named pattern is built from the circuit's tokens {names.INPUT_TOKENS!r}; "
                f"{circuit.describe()} has {len(found)} such nodes: give the pattern as a tensor"
            )
        pattern = detection_pattern(pattern, next(iter(found)).evaluate(device=attention.device))
    if not isinstance(pattern, torch.Tensor):
        raise ExperimentError(
            f"detect_head: pattern must be a name or a tensor, got {type(pattern).__name__}"
        )
    wanted = attention.shape[:-4] + attention.shape[-2:]
    if pattern.shape not in (wanted, attention.shape[-2:]):
        raise ExperimentError(
            f"detect_head: the pattern has shape {list(pattern.shape)}; the attention is "
            f"{list(attention.shape[-2:])} per row (batch {list(attention.shape[:-4])})"
        )
    return pattern.expand(wanted)
