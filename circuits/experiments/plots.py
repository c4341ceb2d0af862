"""Plots in one call: attention patterns per head, and grids (patching results, sweeps by layer and head).

matplotlib is optional (the ``notebooks`` extra); each function returns the
``matplotlib.figure.Figure`` it drew, so a notebook shows it and a script
can ``fig.savefig(...)``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from circuits.errors import ExperimentError

__all__ = ["plot_attention", "plot_grid"]


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ExperimentError(
            "plotting needs matplotlib: pip install 'circuits-interp[notebooks]' (or matplotlib)"
        ) from None
    return plt


def _matrix(values: Any, what: str, rank: int) -> torch.Tensor:
    tensor = torch.as_tensor(values).detach().to("cpu", torch.float64)
    if tensor.ndim != rank:
        raise ExperimentError(f"{what}: expected a tensor of rank {rank}, got shape {list(tensor.shape)}")
    return tensor


def plot_attention(
    pattern: Any,
    labels: Sequence[str] | None = None,
    *,
    heads: Sequence[int] | None = None,
    title: str = "attention",
    columns: int = 4,
):
    """One heatmap per head of ``pattern`` ``[heads, query, key]`` (a row of a batch: index it first).

    ``labels`` name the positions (``models.to_str_tokens``); ``heads``
    picks which heads to draw (all by default).
    """
    probs = _matrix(pattern, "plot_attention: pattern", 3)
    count, queries, keys = probs.shape
    chosen = list(range(count)) if heads is None else list(heads)
    if not chosen or any(not isinstance(h, int) or not 0 <= h < count for h in chosen):
        raise ExperimentError(f"plot_attention: heads {chosen} are not in range(0, {count})")
    if labels is not None and len(labels) != keys:
        raise ExperimentError(f"plot_attention: {len(labels)} labels for {keys} positions")
    plt = _pyplot()
    cols = min(columns, len(chosen))
    rows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)
    for ax in axes.flat[len(chosen) :]:
        ax.axis("off")
    for ax, h in zip(axes.flat, chosen):
        ax.imshow(probs[h].numpy(), vmin=0.0, vmax=1.0, cmap="Blues")
        ax.set_title(f"{title}: head {h}")
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        if labels is not None:
            ax.set_xticks(range(keys), labels, rotation=90)
            ax.set_yticks(range(queries), labels[:queries])
    fig.tight_layout()
    return fig


def plot_grid(
    values: Any,
    *,
    row_labels: Sequence[Any] | None = None,
    column_labels: Sequence[Any] | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    center: float | None = 0.0,
):
    """A heatmap of ``values`` ``[rows, columns]`` (a patching grid, a sweep's deltas by layer and head).

    With ``center`` (0 by default) the colours diverge around it, symmetric,
    so that sign reads at a glance; ``center=None`` spans min to max.
    """
    grid = _matrix(values, "plot_grid: values", 2)
    for labels, size, what in ((row_labels, grid.shape[0], "row"), (column_labels, grid.shape[1], "column")):
        if labels is not None and len(labels) != size:
            raise ExperimentError(f"plot_grid: {len(labels)} {what} labels for {size} {what}s")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * grid.shape[1] + 2), max(3, 0.4 * grid.shape[0] + 1.5)))
    if center is None:
        image = ax.imshow(grid.numpy(), cmap="viridis", aspect="auto")
    else:
        span = float((grid - center).abs().max()) or 1.0
        image = ax.imshow(grid.numpy(), cmap="RdBu_r", vmin=center - span, vmax=center + span, aspect="auto")
    fig.colorbar(image, ax=ax)
    if row_labels is not None:
        ax.set_yticks(range(grid.shape[0]), [str(label) for label in row_labels])
    if column_labels is not None:
        ax.set_xticks(range(grid.shape[1]), [str(label) for label in column_labels], rotation=90)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    return fig
