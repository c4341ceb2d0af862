"""Conditional samplers: how an interpretation node draws data "equivalent" to its parent's.

A ``CondSampler`` is called as ``sampler(ref, ds, rng)``: for each example of
the reference dataset ``ref`` it picks one example of the source dataset
``ds``, and returns those picks as a dataset of ``len(ref)`` rows (row ``i``
replaces reference example ``i`` on the paths the node stands for).

- ``FuncSampler(func)``: row ``i`` is drawn uniformly among the examples of
  ``ds`` whose ``func`` value equals that of ``ref[i]`` (the feature the node
  claims to compute); the standard causal scrubbing resampling.
- ``UncondSampler()``: drawn uniformly from ``ds``, ignoring ``ref``.
- ``UncondTogetherSampler(id=...)``: as ``UncondSampler``, but every
  instance with the same ``id`` returns the same draw (a shared pool of one).
- ``ExactSampler()``: ``ref`` itself (the path keeps its reference inputs).
- ``FixedOtherSampler(other)``: always the given dataset ``other``.

Pools (``PoolAnnotation(size, id)``): a sampler with a pool reuses draws.
``sample_and_update_pool`` keeps, per (sampler, source dataset) and per
equivalence class of the reference (``ds_eq_class``), ``size`` slots; it
picks a slot at random and samples into it only if it is empty.  Size 1
forces every node sharing the pool to see the same data; a small size (4-10)
bounds how many distinct inputs a treeified circuit gets, so fewer distinct
subtrees are evaluated.

Names, arguments and semantics are rust_circuit's
(``rust_circuit.causal_scrubbing.hypothesis``).  Differences: all randomness
comes from the ``torch.Generator`` passed (torch's global one if None); a
``FuncSampler`` value of ``ref`` that no example of ``ds`` has raises
``CausalScrubbingError`` naming it (rust asserts); the "too few examples"
warning is a ``TooFewSamplesWarning`` given on every call that meets the
small class, not only when the matching is first computed; ``FuncSampler``
draws each row's pick in one vectorized step, so its draws are uniform
within a class as in rust but not the same numbers for the same seed.
"""

from __future__ import annotations

import functools
import uuid
import warnings
from collections.abc import Callable, Hashable
from typing import Any, Optional, Union

import attrs
import torch

from circuits.causal_scrubbing.dataset import Dataset
from circuits.errors import CausalScrubbingError, shown
from circuits.core.hashing import tensor_content_hash


class TooFewSamplesWarning(UserWarning):
    """A FuncSampler class with fewer source examples than reference examples needing one.

    The draws repeat examples, which is expected when ``func`` is injective (a
    reference dataset sampled with replacement repeats examples) but may
    also mean the source dataset is too small for the condition.
    """


@attrs.define(eq=True, hash=True, init=False)
class PoolAnnotation:
    """Which pool a sampler draws from: ``size`` slots, shared by every sampler with this ``id``.

    A size of 1 means "sampled together"; 4-10 bounds the number of distinct
    draws, for speed.  ``id`` defaults to a fresh one (a pool of its own).
    """

    size: int
    id: uuid.UUID

    def __init__(self, size: int = 4, id: Optional[uuid.UUID] = None):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise CausalScrubbingError(f"pool size must be a positive int, got {shown(repr(size))}")
        self.size = size
        self.id = uuid.uuid4() if id is None else id


@attrs.define(eq=True, hash=True)
class PoolNotPresent:
    """The annotation of a sampler without a pool: every call draws afresh."""


PNP = PoolNotPresent()
MaybePoolAnnotation = Union[PoolAnnotation, PoolNotPresent]

DsEqClassT = Hashable
Pool = list[Optional[Dataset]]
PoolPerDsEqClass = dict[DsEqClassT, Pool]
SharedPoolKey = tuple["CondSampler", Dataset]
PoolsPerSampler = dict[SharedPoolKey, PoolPerDsEqClass]


@attrs.define(eq=True, hash=True)
class CondSampler:
    """Samples a dataset of ``len(ref)`` rows from ``ds`` given a reference dataset ``ref``.

    Subclasses (attrs classes, as in rust_circuit) define ``__call__``, and
    ``ds_eq_class`` if references other than equal ones may share a pool.
    """

    pool_annot: MaybePoolAnnotation = PNP

    def __call__(self, ref: Dataset, ds: Dataset, rng: torch.Generator | None = None) -> Dataset:
        raise NotImplementedError(f"{type(self).__name__} does not define __call__(ref, ds, rng)")

    def ds_eq_class(self, ds: Dataset) -> Hashable:
        """What reference datasets share a pool: equal values share one (default: equal datasets).

        Not checked against ``__call__``: it is up to the sampler's author.
        """
        return ds

    def sample_and_update_pool(
        self, ref: Dataset, ds: Dataset, rng: torch.Generator | None, pools_per_sampler: PoolsPerSampler
    ) -> Dataset:
        """A draw for ``ref``: from this sampler's pool if it has one (filled lazily), else afresh.

        ``pools_per_sampler`` is the caller's state, updated in place: one
        scrub keeps one, so pools do not outlive the sampling they speed up.
        """
        if isinstance(self.pool_annot, PoolNotPresent):
            return self(ref, ds, rng)
        pools = pools_per_sampler.setdefault((self, ds), {})
        pool = pools.setdefault(self.ds_eq_class(ref), [None] * self.pool_annot.size)
        slot = int(torch.randint(0, len(pool), (), generator=rng))
        if pool[slot] is None:
            pool[slot] = self(ref, ds, rng)
        return pool[slot]

    def pretty_str(self, data: Optional[Dataset], datum_idx: int = 0) -> str:
        """The sampler, and the ``datum_idx``-th datum it drew if ``data`` is given (for printing)."""
        if data is None:
            return self.class_str()
        datum = data[datum_idx]
        extra = f"d={datum}"
        condition = self.str_cond(datum)
        if condition:
            extra += ", " + condition
        return f"{self.class_str()}({extra})"

    def class_str(self) -> str:
        """The class name, with a short tag of the pool when there is one (equal tags: shared pool)."""
        pooled = not isinstance(self.pool_annot, PoolNotPresent)
        return type(self).__name__ + (f"#{hash(self.pool_annot) & 1023}" if pooled else "")

    def str_cond(self, datum: Dataset) -> str:
        """What the sampler conditions on for one datum (nothing by default)."""
        return ""


@attrs.frozen
class MatchedClasses:
    """``FuncSampler``'s matching of ``ref`` to ``ds``, computed once per (func, ref, ds).

    ``ref_class[i]`` is the class of reference row ``i``; class ``c``'s source
    examples are ``ds_order[starts[c] : starts[c] + counts[c]]``.
    ``too_small`` lists (value, source count, reference count) of the classes
    with fewer source than reference examples.
    """

    ref_class: torch.Tensor
    ds_order: torch.Tensor
    starts: torch.Tensor
    counts: torch.Tensor
    too_small: tuple[tuple[Any, int, int], ...]


def _as_values(func: Callable[[Dataset], Any], data: Dataset) -> torch.Tensor:
    """``func(data)`` as a tensor, or an error naming func and what it returned (strings, say)."""
    returned = func(data)
    try:
        return torch.as_tensor(returned)
    except (TypeError, ValueError, RuntimeError) as error:
        raise CausalScrubbingError(
            f"FuncSampler func {shown(repr(func))} must return a tensor (or numbers torch.as_tensor "
            f"reads), got {shown(repr(returned), 80)}: {error}"
        ) from None


def _func_values(func: Callable[[Dataset], Any], data: Dataset, which: str) -> torch.Tensor:
    """``func(data)`` as a 2-D tensor of one row per example, or an error naming func."""
    values = _as_values(func, data)
    if values.ndim not in (1, 2) or values.shape[0] != len(data):
        raise CausalScrubbingError(
            f"FuncSampler func {shown(repr(func))} must give a 1-D or 2-D tensor with one row per "
            f"example; on the {which} dataset ({len(data)} examples) it gave shape {list(values.shape)}"
        )
    return values[:, None] if values.ndim == 1 else values


def _value_text(row: torch.Tensor) -> str:
    return str(row.item() if row.numel() == 1 else row.tolist())


@functools.lru_cache(maxsize=128)
def matching_classes(func: Callable[[Dataset], Any], ref: Dataset, ds: Dataset) -> MatchedClasses:
    """Group ``ref`` and ``ds`` rows by ``func`` value (rows compared whole).

    Cached on (func, ref, ds), as rust_circuit does: datasets hash by content.
    A reference value no source example has raises (and is not cached).
    """
    ref_values = _func_values(func, ref, "reference")
    ds_values = _func_values(func, ds, "source").to(ref_values.device)
    if ref_values.shape[1] != ds_values.shape[1]:
        raise CausalScrubbingError(
            f"FuncSampler func {shown(repr(func))} gives rows of {ref_values.shape[1]} values on the "
            f"reference dataset but {ds_values.shape[1]} on the source dataset"
        )
    unique, inverse = torch.unique(torch.cat([ref_values, ds_values]), dim=0, return_inverse=True)
    ref_class, ds_class = inverse[: len(ref)], inverse[len(ref) :]
    ref_counts = torch.bincount(ref_class, minlength=len(unique))
    counts = torch.bincount(ds_class, minlength=len(unique))
    missing = ((ref_counts > 0) & (counts == 0)).nonzero().flatten()
    if len(missing):
        values = ", ".join(_value_text(unique[c]) for c in missing[:8])
        raise CausalScrubbingError(
            f"FuncSampler func {shown(repr(func))}: no example of the source dataset has the value "
            f"{values} that {len(missing)} reference value(s) need"
        )
    short = ((counts < ref_counts) & (ref_counts > 0)).nonzero().flatten().tolist()
    return MatchedClasses(
        ref_class=ref_class,
        ds_order=torch.argsort(ds_class, stable=True),
        starts=torch.cumsum(counts, 0) - counts,
        counts=counts,
        too_small=tuple((_value_text(unique[c]), int(counts[c]), int(ref_counts[c])) for c in short),
    )


@attrs.define(eq=True, hash=True, init=False)
class FuncSampler(CondSampler):
    """Each reference example's draw is uniform among the source examples with equal ``func`` value.

    ``func(dataset)`` gives a 1-D or 2-D tensor with one row per example
    (rows compared whole): the feature the interpretation node computes.
    This is the standard causal scrubbing resampling.  A class with fewer
    source than reference examples gives a ``TooFewSamplesWarning``.
    """

    func: Callable[[Dataset], torch.Tensor] = attrs.field(kw_only=True)

    def __init__(self, func: Callable[[Dataset], torch.Tensor], pool_annot: MaybePoolAnnotation = PNP):
        self.__attrs_init__(pool_annot=pool_annot, func=func)

    def __call__(self, ref: Dataset, ds: Dataset, rng: torch.Generator | None = None) -> Dataset:
        matched = matching_classes(self.func, ref, ds)
        for value, have, need in matched.too_small:
            warnings.warn(
                f"FuncSampler func {shown(repr(self.func))}: only {have} source example(s) with value "
                f"{value} for {need} reference example(s)",
                TooFewSamplesWarning,
                stacklevel=2,
            )
        # Uniform in [0, count) per row in one step: float64 keeps the bias far below sampling noise.
        device = rng.device if rng is not None else matched.counts.device
        uniform = torch.rand(len(ref), dtype=torch.float64, generator=rng, device=device)
        counts = matched.counts[matched.ref_class].to(device)
        offsets = (uniform * counts).floor().long().minimum(counts - 1)
        picks = matched.ds_order.to(device)[matched.starts[matched.ref_class].to(device) + offsets]
        return ds[picks]

    def ds_eq_class(self, ds: Dataset) -> Hashable:
        """References with equal ``func`` values (all rows, in order) share a pool."""
        return tensor_content_hash(_as_values(self.func, ds).detach().cpu())

    def str_cond(self, datum: Dataset) -> str:
        out = _func_values(self.func, datum, "printed")[0]
        return f"f(d)={out.item() if out.numel() == 1 else out}"


@attrs.define(eq=True, hash=True)
class UncondSampler(CondSampler):
    """Uniform draws from the source dataset, ignoring the reference (all references share a pool)."""

    def __call__(self, ref: Dataset, ds: Dataset, rng: torch.Generator | None = None) -> Dataset:
        return ds.sample(len(ref), rng)

    def ds_eq_class(self, ds: Dataset) -> Hashable:
        return ()


#: The id every ``UncondTogetherSampler()`` shares by default (rust_circuit's, so pools key alike).
TOGETHER_ID = uuid.UUID("566ae005-4a34-4e37-9383-731e1a722ef2")


@attrs.define(eq=True, hash=True, init=False)
class UncondTogetherSampler(UncondSampler):
    """An ``UncondSampler`` with a pool of one: every instance with the same ``id`` gets the same draw.

    By default all instances are equal, so all nodes using one see the same
    data; pass another ``id`` to make separate groups.
    """

    def __init__(self, id: uuid.UUID = TOGETHER_ID):
        self.__attrs_init__(pool_annot=PoolAnnotation(1, id=id))


@attrs.define(eq=True, hash=True)
class ExactSampler(CondSampler):
    """The reference itself: the node's paths keep their reference inputs."""

    def __call__(self, ref: Dataset, ds: Dataset, rng: torch.Generator | None = None) -> Dataset:
        return ref


@attrs.define(eq=True, hash=True, init=False)
class FixedOtherSampler(UncondSampler):
    """Always ``other`` (which must have one row per reference example), whatever the reference."""

    other: Dataset = attrs.field(kw_only=True)

    def __init__(self, other: Dataset):
        self.__attrs_init__(other=other)

    def __call__(self, ref: Dataset, ds: Dataset, rng: torch.Generator | None = None) -> Dataset:
        if len(self.other) != len(ref):
            raise CausalScrubbingError(
                f"FixedOtherSampler's dataset has {len(self.other)} examples but the reference has "
                f"{len(ref)}: it must give one per reference example"
            )
        return self.other
