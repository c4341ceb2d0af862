"""``Evaluator``: evaluation that keeps node values across calls, within a memory budget.

Every experiment is "rewrite the circuit, evaluate it again", and a rewrite
keeps every unchanged subtree (same ``node.hash``), so only the nodes whose
hash changed are computed again::

    ev = cc.Evaluator(cache_bytes=2**30)
    clean = ev.evaluate(circuit)                  # computes and keeps every value
    ablated = circuit.update("b3.a.head7", lambda n: cc.Scalar(0.0, shape=n.shape))
    ev.evaluate(ablated)                          # recomputes only the ancestors of 'b3.a.head7'

Built on the evaluation seams alone: cached values are ``known`` values of
``compile_plan``, and each computed value is offered to the cache by
``Plan.run(on_value=...)``.  Results are identical to ``cc.evaluate``.
What is cached, how bytes are charged and the eviction policy are in
docs/evaluation.md.  Threads may share one Evaluator: a lock guards the
cache's bookkeeping (lookups, stores, evictions), not the torch work.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from typing import Any, Callable, Iterable

import torch

from circuits.errors import CacheError
from circuits.evaluation import KnownValue, compile_plan
from circuits.core.nodes import Add, Array, Circuit, Einsum, Scalar, Symbol

__all__ = ["DEFAULT_CACHE_BYTES", "CacheStats", "Evaluator"]

#: The cache an experiment makes for itself when not given an ``evaluator``: 2 GiB.
DEFAULT_CACHE_BYTES = 2 * 2**30


def _version(tensor: torch.Tensor) -> int | None:
    """torch's in-place edit counter; None for inference tensors, which have none (see the docstring)."""
    return None if tensor.is_inference() else tensor._version


def check_cache_bytes(cache_bytes: Any, what: str) -> int:
    """A cache budget: a non-negative int of bytes (``CacheError`` otherwise)."""
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
        raise CacheError(f"{what}: cache_bytes must be a non-negative int (bytes), got {cache_bytes!r}")
    return cache_bytes


@dataclasses.dataclass
class CacheStats:
    """Counters since the evaluator was made (or ``reset_stats()``).

    ``computed``: nodes computed (steps run); ``hits``: cached values used;
    ``stored``: values admitted; ``evicted``: entries evicted to fit the
    budget; ``rejected``: values offered but not cached (too big, views of
    leaves, requiring grad); ``peak_nbytes``: the most bytes charged at
    once.  ``last_computed`` and ``last_hits`` are for the last call only.
    """

    computed: int = 0
    hits: int = 0
    stored: int = 0
    evicted: int = 0
    rejected: int = 0
    peak_nbytes: int = 0
    last_computed: int = 0
    last_hits: int = 0


class _Entry:
    __slots__ = ("key", "known", "scalar_dtype", "storage", "value", "version")

    def __init__(self, key, value, storage, scalar_dtype, float_dtype):
        self.key = key  # (node hash, call options)
        # the value, and the promoted floating dtype of the Arrays below it (None: none)
        self.known = KnownValue(value, float_dtype)
        self.value = value
        self.version = _version(value)  # a caller editing a returned value in place bumps it
        self.storage = storage  # the storage key charged for this value
        self.scalar_dtype = scalar_dtype  # the Scalars' dtype it was computed with; None: no Scalar below


def _promote(a, b):
    if a is None or a is b:
        return b if a is None else a
    if b is None:
        return a
    return torch.promote_types(a, b)


def _storage_key(tensor: torch.Tensor) -> tuple[Any, int]:
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr()), storage.nbytes()


class Evaluator:
    """Evaluates circuits, keeping node values by structural hash within ``cache_bytes``.

    See the module docstring for what is cached, how bytes are counted and
    the eviction policy.  ``evaluate``/``evaluate_many`` take the same
    arguments as ``cc.evaluate``/``cc.evaluate_many``, plus ``store``.
    Safe to share across threads: each call's lookups and stores hold a lock
    (the torch work runs outside it, in parallel); ``stats.last_*`` are then
    those of the call planned last.
    """

    def __init__(self, cache_bytes: int):
        self.cache_bytes = check_cache_bytes(cache_bytes, "Evaluator")
        self._lock = threading.RLock()  # guards every structure below (not the torch work)
        self._entries: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()
        self._storages: dict[Any, list[int]] = {}  # storage key -> [nbytes, entries using it]
        self._nbytes = 0
        self._by_hash: dict[bytes, list[tuple]] = {}  # node hash -> its entry keys (one per option set)
        # id(tensor) -> (weak reference, version) of every Array tensor read by a storing run: a
        # cached value computed from a tensor edited in place since must not be served
        self._leaves: dict[int, tuple[weakref.ref, int]] = {}
        self.stats = CacheStats()

    def __reduce__(self):
        """Pickled as an empty cache of the same budget (an executor's worker fills its own): the
        values are only a cache, and their bookkeeping (storage addresses, tensor versions) would
        not hold in another process."""
        return (Evaluator, (self.cache_bytes,))

    # ----------------------------------------------------------- reading

    @property
    def nbytes(self) -> int:
        """Bytes of storage charged to the cache now (never more than ``cache_bytes``)."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, node: object) -> bool:
        """Whether a value of ``node`` (under any call options) is cached."""
        return isinstance(node, Circuit) and node.hash in self._by_hash

    def __repr__(self) -> str:
        return (
            f"Evaluator({len(self)} values, {self._nbytes / 2**20:.1f} MiB of "
            f"{self.cache_bytes / 2**20:.1f} MiB)"
        )

    def reset_stats(self) -> None:
        self.stats = CacheStats()

    # ---------------------------------------------------------- evaluate

    def evaluate(
        self,
        circuit: Circuit,
        inputs: Any = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        store: bool | Callable[[Circuit], bool] = True,
    ) -> torch.Tensor:
        """The value of ``circuit``, as ``cc.evaluate`` gives it, reusing cached values.

        ``store``: True offers every computed value to the cache, False only
        reads it, a predicate ``node -> bool`` offers the nodes it accepts.
        """
        return self.evaluate_many([circuit], inputs, device, dtype, store=store)[0]

    def evaluate_many(
        self,
        circuits: Iterable[Circuit],
        inputs: Any = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        store: bool | Callable[[Circuit], bool] = True,
    ) -> list[torch.Tensor]:
        """The values of several circuits (common subtrees computed once), reusing cached values."""
        if not (isinstance(store, bool) or callable(store)):
            raise TypeError(
                f"Evaluator: store must be True, False or a predicate node -> bool, got {store!r}"
            )
        roots = list(circuits)
        options = (None if device is None else str(device), dtype)
        with self._lock:
            plan, storer = self._planned(roots, inputs, device, dtype, options, store)
        return plan.run() if storer is None else plan.run(on_value=storer)

    def _planned(self, roots, inputs, device, dtype, options, store):
        """The call's plan over the cache, and its storer (None: nothing to store); under the lock."""
        self._drop_if_leaves_changed()
        excluded: set[bytes] = set()
        while True:
            probe = _Probe(self._entries, options, excluded)
            plan = compile_plan(roots, inputs, device, dtype, known=probe)
            stale = [
                entry.key[0] for entry in probe.hits if entry.scalar_dtype not in (None, plan.scalar_dtype)
            ]
            if not stale:
                break
            # cached with Scalars of another dtype than this call gives them: not valid here; the
            # Arrays below them count the same either way, so the second compile settles it
            excluded.update(stale)
        for key in probe.edited:
            if key in self._entries:
                self._drop(key)
        for entry in probe.hits:
            self._entries.move_to_end(entry.key)
        stats = self.stats
        stats.hits += len(probe.hits)
        stats.last_hits = len(probe.hits)
        stats.computed += plan.computed
        stats.last_computed = plan.computed
        if store is False or self.cache_bytes == 0 or not plan.computed:
            return plan, None
        return plan, _Storer(self, plan, probe, options, store)

    # ---------------------------------------------------------- storing

    def _put(
        self, key: tuple, value: torch.Tensor, storage: Any, size: int, scalar_dtype, float_dtype
    ) -> None:
        with self._lock:
            self._put_locked(key, value, storage, size, scalar_dtype, float_dtype)

    def _put_locked(
        self, key: tuple, value: torch.Tensor, storage: Any, size: int, scalar_dtype, float_dtype
    ) -> None:
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
            return
        record = self._storages.get(storage)
        if record is None:
            if size > self.cache_bytes:
                self.stats.rejected += 1
                return
            while self._nbytes + size > self.cache_bytes:  # make room first: least recently used out
                self._drop(next(iter(entries)))
                self.stats.evicted += 1
            self._storages[storage] = [size, 1]
            self._nbytes += size
        else:
            record[1] += 1  # shares storage already charged: adds nothing
        entries[key] = _Entry(key, value, storage, scalar_dtype, float_dtype)
        keys = self._by_hash.get(key[0])
        if keys is None:
            self._by_hash[key[0]] = [key]
        else:
            keys.append(key)
        self.stats.stored += 1
        if self._nbytes > self.stats.peak_nbytes:
            self.stats.peak_nbytes = self._nbytes

    def _drop(self, key: tuple) -> None:
        entry = self._entries.pop(key)
        keys = self._by_hash[key[0]]
        keys.remove(key)
        if not keys:
            del self._by_hash[key[0]]
        record = self._storages[entry.storage]
        record[1] -= 1
        if record[1] == 0:
            del self._storages[entry.storage]
            self._nbytes -= record[0]

    def _drop_if_leaves_changed(self) -> None:
        """Clear the cache if a tensor read into it was edited in place since.

        A cached value stands for its node's hash; if an Array's tensor
        changed, that node can no longer be evaluated (its reading raises
        ``StaleTensorError``), and neither may a value computed from it be
        served.  Which entries depend on which tensor is not tracked, so
        all go: editing wrapped tensors is a mistake, not a workflow.
        """
        for reference, version in self._leaves.values():
            tensor = reference()
            if tensor is not None and tensor._version != version:
                self.clear()
                return

    def _remember_leaf(self, tensor: torch.Tensor) -> None:
        key = id(tensor)
        known = self._leaves.get(key)
        if known is None or known[0]() is not tensor:
            self._leaves[key] = (weakref.ref(tensor), tensor._version)

    def discard(self, nodes: Iterable[Circuit | bytes]) -> int:
        """Drop the cached values of ``nodes`` (nodes or their hashes); returns how many were dropped."""
        dropped = 0
        with self._lock:
            for node in nodes:
                node_hash = node.hash if isinstance(node, Circuit) else node
                for key in list(self._by_hash.get(node_hash, ())):
                    self._drop(key)
                    dropped += 1
        return dropped

    def clear(self) -> None:
        """Drop every cached value."""
        with self._lock:
            self._entries.clear()
            self._storages.clear()
            self._by_hash.clear()
            self._leaves.clear()
            self._nbytes = 0


class _Probe:
    """The ``known`` hook of a compile: a node's cached value (as a ``KnownValue``), or None."""

    __slots__ = ("edited", "entries", "excluded", "hits", "options")

    def __init__(self, entries, options, excluded):
        self.entries = entries
        self.options = options
        self.excluded = excluded
        self.edited: list[tuple] = []  # keys of entries whose value was modified in place
        self.hits: list[_Entry] = []

    def __call__(self, node: Circuit) -> KnownValue | None:
        if not node.children:
            return None
        entry = self.entries.get((node.hash, self.options))
        if entry is None or node.hash in self.excluded:
            return None
        if _version(entry.value) != entry.version:  # the caller edited a value we returned: recompute
            self.excluded.add(node.hash)
            self.edited.append(entry.key)
            return None
        self.hits.append(entry)
        return entry.known


class _Storer:
    """The ``on_value`` hook of a run: offers each computed value to the cache.

    For each computed node it works out, from its children's, whether a
    Symbol is below it (then it is not cached), the promoted floating dtype
    of the Arrays below it, and whether a Scalar is below it.
    """

    def __init__(self, evaluator: Evaluator, plan, probe: _Probe, options, store):
        self.evaluator = evaluator
        self.scalar_dtype = plan.scalar_dtype
        self.options = options
        self.admit = None if store is True else store
        hits = {entry.key[0]: entry for entry in probe.hits}
        # node hash -> (Symbol below, float dtype of Arrays below, Scalar below)
        self.meta: dict[bytes, tuple] = {}
        for node in plan.nodes:
            if node.children:
                entry = hits.get(node.hash)
                if entry is not None:
                    self.meta[node.hash] = (False, entry.known.float_dtype, entry.scalar_dtype is not None)
            else:
                self.meta[node.hash] = _leaf_meta(node, evaluator)
        self.leaf_storages = {
            _storage_key(value)[0]
            for node, value in plan.initial_values()
            if not node.children and type(node) is not Scalar
        }

    def __call__(self, node: Circuit, value: Any) -> None:
        if not node.children:  # an Array moved or cast by the call: its storage is a leaf's
            if isinstance(value, torch.Tensor):
                self.leaf_storages.add(_storage_key(value)[0])
            return
        meta = self.meta
        symbol, dtype, scalar = False, None, False
        for child in node.children:
            m = meta[child.hash]
            symbol, dtype, scalar = symbol or m[0], _promote(dtype, m[1]), scalar or m[2]
        meta[node.hash] = (symbol, dtype, scalar)
        if symbol or not isinstance(value, torch.Tensor) or value.requires_grad:
            return
        if self.admit is not None and not self.admit(node):
            return
        storage, size = _storage_key(value)
        evaluator = self.evaluator
        if storage in self.leaf_storages:
            with evaluator._lock:
                evaluator.stats.rejected += 1
            return
        evaluator._put(
            (node.hash, self.options), value, storage, size, self.scalar_dtype if scalar else None, dtype
        )


def _leaf_meta(node: Circuit, evaluator: Evaluator) -> tuple:
    if isinstance(node, Array):
        tensor = node.value
        if tensor is None:
            return (False, None, False)
        evaluator._remember_leaf(tensor)
        return (False, tensor.dtype if tensor.is_floating_point() else None, False)
    # Scalars, and empty sums and products, take the call's Scalar dtype
    return (isinstance(node, Symbol), None, isinstance(node, (Scalar, Add, Einsum)))
