"""bench/benchtools.py's ``threshold_between``: the attribution-graph bench's JumpReLU threshold.

It must let exactly ``count`` pre-activations through and sit halfway between the two around it,
so that no pre-activation lies within float32 rounding of it (an interpolated quantile put one a
few ulps away per layer, and circuit-tracer and ours then disagreed on 13 features of 1,902).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import benchtools  # noqa: E402


def test_threshold_halfway_between_the_count_th_largest_and_the_next():
    pre = torch.randn(64, 4608, generator=torch.Generator().manual_seed(0)) + 3.0
    descending = sorted(pre.flatten().tolist(), reverse=True)
    threshold = benchtools.threshold_between(pre, 64)
    assert int((pre > threshold).sum()) == 64
    assert abs(threshold - (descending[63] + descending[64]) / 2) <= 1e-6 * abs(threshold)
    gap = descending[63] - descending[64]
    nearest = float((pre - threshold).abs().min())
    assert nearest >= 0.49 * gap


def test_threshold_is_never_negative():
    pre = -torch.arange(1.0, 11.0)
    assert benchtools.threshold_between(pre, 3) == 0.0
