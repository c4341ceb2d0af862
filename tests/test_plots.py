"""Plots in one call: the images hold the values given, labels where asked, errors typed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import circuits as cc
from circuits.experiments.plots import plot_attention, plot_grid

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def test_plot_attention_draws_one_panel_per_head_with_the_values():
    probs = torch.softmax(torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    labels = ["<bos>", "the", "cat", "sat", "on"]
    fig = plot_attention(probs, labels, heads=[0, 2])
    drawn = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in drawn] == ["attention: head 0", "attention: head 2"]
    np.testing.assert_allclose(drawn[1].images[0].get_array(), probs[2].numpy(), rtol=1e-6)
    assert [t.get_text() for t in drawn[0].get_xticklabels()] == labels


def test_plot_grid_centres_colours_on_zero():
    grid = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    fig = plot_grid(grid, row_labels=["L0", "L1"], column_labels=["h0", "h1"], title="delta")
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), grid.numpy())
    assert ax.images[0].get_clim() == (-2.0, 2.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["L0", "L1"]


def test_bad_plot_arguments_are_refused():
    with pytest.raises(cc.errors.ExperimentError, match="rank 3"):
        plot_attention(torch.zeros(4, 4))
    with pytest.raises(cc.errors.ExperimentError, match="heads \\[5\\] are not in range"):
        plot_attention(torch.zeros(2, 3, 3), heads=[5])
    with pytest.raises(cc.errors.ExperimentError, match="1 row labels for 2 rows"):
        plot_grid(torch.zeros(2, 2), row_labels=["a"])
