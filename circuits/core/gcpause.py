"""Pausing Python's cyclic garbage collector around bulk node creation.

Circuits are acyclic and immutable, so the collector finds nothing in them;
but while a parse creates 10^5 nodes it runs full collections over every
live node again and again, a large share of the time at that size
(``bench/format_scale.py`` measures it).  Reference counting still frees
everything as usual while paused.

Paused or not, the young generation holds every object made since the last
collection, and the first allocation after the pause traverses them all
(0.08 s for a 10^5-node parse).  ``long_lived=True`` says that what was made
is kept (a parsed circuit): it is moved to the oldest generation at once, as
the young collections would move it after traversing it twice for nothing.
A few objects made just before the pause move with it (garbage among them is
freed by the next full collection instead of a young one).  Objects frozen by
``gc.freeze()`` stay frozen: then nothing is moved.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused(long_lived: bool = False) -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if long_lived and gc.get_freeze_count() == 0:
            gc.freeze()  # every generation into the permanent one, in O(1); the young count reset
            gc.unfreeze()  # and all of it into the oldest generation, in O(1)
    finally:
        if was_enabled:
            gc.enable()
