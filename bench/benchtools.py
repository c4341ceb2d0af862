"""What the benchmark scripts share: timing, and the GPT-2-small size flags.

Scripts run as ``python bench/NAME.py``, so this directory is on the path.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any


def best_time(action: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The fastest of ``repeat`` runs (the usual guard against a busy machine) and its result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - start)
    return best, result


def add_gpt2_size_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """Flags for the model and batch size; the defaults are GPT-2 small on 8 x 128 tokens."""
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=2)
