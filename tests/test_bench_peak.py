"""bench/benchtools.py's peak-memory method (resident high-water mark) and its watchdog.

The attribution-graph benchmark reports each side's peak as ``resident_peak`` measures it; these
tests check the method against allocations of known size: a touched tensor inside the measured
region reads as its size, one held from before reads as nothing, an earlier higher peak does not
leak into a later measurement, and the watchdog kills a child that passes its limit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import benchtools  # noqa: E402

MiB = 2**20
pytestmark = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs"
)


def touched(mib: int) -> torch.Tensor:
    """``mib`` MiB of float32, every page written (``torch.ones``), so all of it is resident."""
    return torch.ones(mib * MiB // 4)


def test_a_touched_tensor_reads_as_its_size():
    measured, tensor = benchtools.resident_peak(lambda: touched(200))
    assert tensor.numel() * 4 == 200 * MiB
    assert 195 * MiB <= measured["peak_bytes"] <= 215 * MiB
    assert measured["rss_before"] > 0 and measured["seconds"] >= 0


def test_the_peak_is_the_high_water_mark_not_the_end_state():
    def freed_then_smaller():
        big = touched(200)
        del big
        return touched(50)

    measured, _ = benchtools.resident_peak(freed_then_smaller)
    assert 195 * MiB <= measured["peak_bytes"] <= 265 * MiB


def test_memory_held_from_before_and_an_earlier_peak_are_not_counted():
    held = touched(200)  # resident before the region: not the region's own
    earlier = touched(300)
    del earlier  # an earlier, higher mark the reset must clear
    measured, _ = benchtools.resident_peak(lambda: touched(50))
    assert 45 * MiB <= measured["peak_bytes"] <= 65 * MiB
    assert measured["rss_before"] >= 200 * MiB
    del held


def test_the_watchdog_kills_a_child_past_its_limit_and_says_so():
    grow = (
        "import time, sys; print('{\"rss_before\": 1}', flush=True); x = b'a' * (400 << 20); time.sleep(60)"
    )
    done = benchtools.run_watched([sys.executable, "-c", grow], rss_limit=150 * MiB)
    assert done.killed_rss is not None and done.killed_rss > 150 * MiB
    assert done.returncode != 0
    assert done.records() == {"rss_before": 1}


def test_the_watchdog_leaves_a_child_under_its_limit_alone():
    done = benchtools.run_watched(
        [sys.executable, "-c", "print('{\"seconds\": 2}'); print('{\"a\": 3}')"], 2**30
    )
    assert done.killed_rss is None and done.returncode == 0
    assert done.records() == {"seconds": 2, "a": 3}
