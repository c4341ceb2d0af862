"""Jobs an executor runs in another process, safe when that process was forked.

A process forked from one whose torch has started its OpenMP thread pool inherits the pool's
bookkeeping but not its threads, and its first parallel torch op (an einsum) waits for them
forever: ``fork`` is the default start method of ``ProcessPoolExecutor`` on Linux before Python
3.14.  torch's own DataLoader workers run on one thread for this reason; the jobs here do the
same (``sweep``'s shards, a patching grid's layers), in a forked process only: a spawned or
remote worker keeps its threads.
"""

from __future__ import annotations

import os

import torch

__all__ = ["one_thread_if_forked"]

_forked = False


def _mark_forked() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_mark_forked)


def one_thread_if_forked() -> None:
    """Run torch on one thread if this process was forked (from one that imported this module)."""
    if _forked and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
