"""Pausing Python's cyclic garbage collector around bulk node creation.

Circuits are acyclic and immutable, so the collector finds nothing in them;
but while a parse creates 10^5 nodes it runs full collections over every
live node again and again, a large share of the time at that size
(``bench/format_scale.py`` measures it).  Reference counting still frees
everything as usual while paused.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
