"""``Dataset``: the named input arrays that causal scrubbing samples from.

A dataset is a set of named ``Array`` nodes sharing axis 0, the example axis
(the tokens ``toks_int_var`` ``[N, S+1]``, labels ``[N]``, ...).  Samplers
draw datasets from datasets (``ds[idxs]``, ``ds.sample(n, rng)``), and a
scrubbed circuit gets, for each of its input paths, the arrays named in
``input_names`` swapped for a sampled dataset's arrays of the same name.

As in rust_circuit (``rust_circuit.causal_scrubbing.dataset``): same
constructor (``Dataset(arrs, input_names=...)``, ``input_names`` keyword only,
an empty set meaning all arrays), ``ds.<name>`` access, ``len``, indexing,
``sample`` with ``torch.multinomial``, ``Dataset.unwrap``, subclassable with
attrs.  Differences:

- our circuits are batched: a dataset's rows become the circuit's batch axis
  (one scrubbed evaluation gives one value per reference example), which is
  why every array must have an axis 0 of the same length;
- ``arrs`` may map names to plain tensors (wrapped into Arrays of that name);
- equality and hashing are by content (the Arrays' structural hashes hash
  their tensors), so two datasets holding equal values are the same key in
  the samplers' caches and pools;
- ``Dataset.from_tokens`` builds one from a tokenized batch of the model
  builders;
- mistakes raise ``CausalScrubbingError`` naming the arrays at fault (rust
  asserts), and indexing past the end names the index and the length.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import torch

from circuits.errors import CausalScrubbingError, shown
from circuits.transformer.names import TOKENS
from circuits.core.nodes import Array

TDataset = TypeVar("TDataset", bound="Dataset")

#: Arrays with at most this many elements are shown by value in ``str(ds)``.
SHOWN_ELEMENTS = 64


@attrs.frozen(eq=False, repr=False)
class ArrayMap(Mapping):
    """A read-only name -> Array mapping, hashable so that datasets can key caches and pools.

    Equal to any mapping with the same items (``Mapping.__eq__``), as a dict would be.
    """

    items_: tuple[tuple[str, Array], ...]

    def __hash__(self) -> int:
        return hash(self.items_)

    def __getitem__(self, name: str) -> Array:
        for key, array in self.items_:
            if key == name:
                return array
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{key!r}: <Array {list(a.shape)}>" for key, a in self.items_) + "}"


def arrs_to_map(arrs: Any) -> ArrayMap:
    """``arrs`` (name -> Array or tensor, or Arrays) as an ``ArrayMap`` sorted by name.

    Sorted so that the same arrays given in another order make an equal dataset.
    Several Arrays of one name are allowed only if they are equal, as in rust_circuit.
    """
    if isinstance(arrs, ArrayMap):
        return arrs
    found: dict[str, Array] = {}
    if isinstance(arrs, Mapping):
        for name, value in arrs.items():
            found[name] = _named_array(name, value)
    elif isinstance(arrs, Iterable) and not isinstance(arrs, (str, torch.Tensor)):
        for array in arrs:
            if not isinstance(array, Array) or array.name is None:
                raise CausalScrubbingError(
                    f"Dataset arrays given as a sequence must be named Arrays, got {shown(repr(array))}"
                )
            if array.name in found and found[array.name] != array:
                raise CausalScrubbingError(f"two different Arrays named {array.name!r} in one Dataset")
            found[array.name] = array
    else:
        raise CausalScrubbingError(
            f"Dataset arrays must be a mapping name -> Array or tensor, or named Arrays; "
            f"got {type(arrs).__name__}"
        )
    return ArrayMap(tuple(sorted(found.items())))


def _named_array(name: Any, value: Any) -> Array:
    """The Array a mapping entry stands for, its name checked against the key."""
    if not isinstance(name, str):
        raise CausalScrubbingError(f"Dataset array names must be strings, got {shown(repr(name))}")
    if isinstance(value, Array):
        if value.name != name:
            raise CausalScrubbingError(f"Dataset key {name!r} holds an Array named {value.name!r}")
        return value
    return Array(value, name=name)


def _check_arrays(instance: Dataset, attribute: Any, arrs: ArrayMap) -> None:
    """Every array has a value and an axis 0, all of one length: examples are rows."""
    if not arrs:
        raise CausalScrubbingError("a Dataset needs at least one array")
    for name, array in arrs.items():
        if array.value is None:
            raise CausalScrubbingError(f"Dataset array {name!r} has no tensor (it was parsed without one)")
        if array.rank == 0:
            raise CausalScrubbingError(f"Dataset array {name!r} is a scalar: examples are on axis 0")
    lengths = {name: array.shape[0] for name, array in arrs.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name!r} {length}" for name, length in lengths.items())
        raise CausalScrubbingError(
            f"all arrays of a Dataset must have the same length (axis 0); got {listed}"
        )


def _input_names(names: Iterable[str] | None) -> frozenset[str]:
    """``input_names`` as a frozen set (hashable); empty stands for "all", filled in after init."""
    if names is None:
        return frozenset()
    if isinstance(names, str):  # a lone name, not its characters
        return frozenset((names,))
    return frozenset(names)


def _check_input_names(instance: Dataset, attribute: Any, names: frozenset[str]) -> None:
    missing = sorted(names - set(instance.arrs))
    if missing:
        raise CausalScrubbingError(
            f"input_names {missing} are not arrays of the Dataset (it has {sorted(instance.arrs)})"
        )


def _checked_slice(idxs: slice, n: int) -> slice | torch.Tensor:
    """A slice of ints (or None) as Python reads it: a negative step goes backwards (as indices,
    which torch takes where its slices do not); a zero step is an error naming the slice."""
    start, stop, step = (_slice_part(part, idxs) for part in (idxs.start, idxs.stop, idxs.step))
    if step == 0:
        raise CausalScrubbingError(f"Dataset slice {shown(repr(idxs))}: the step must not be zero")
    if step is not None and step < 0:
        return torch.tensor(range(*slice(start, stop, step).indices(n)), dtype=torch.int64)
    return slice(start, stop, step)


def _slice_part(part: Any, idxs: slice) -> int | None:
    if part is None:
        return None
    if not isinstance(part, bool):
        try:
            return operator.index(part)
        except TypeError:
            pass
    raise CausalScrubbingError(
        f"Dataset slice {shown(repr(idxs))}: start, stop and step must be ints or None"
    )


@attrs.frozen(eq=True, hash=True, repr=False)
class Dataset:
    """Named arrays with examples on axis 0; ``input_names`` are the ones scrubbing replaces.

    ``input_names`` left out (or empty, as in rust_circuit) means every array.
    Arrays are read as ``ds.arrs[name]`` or ``ds.<name>``.
    """

    arrs: Mapping[str, Array] = attrs.field(converter=arrs_to_map, validator=_check_arrays)
    input_names: frozenset[str] = attrs.field(
        default=None, converter=_input_names, validator=_check_input_names, kw_only=True
    )

    def __attrs_post_init__(self):
        if not self.input_names:
            object.__setattr__(self, "input_names", frozenset(self.arrs))

    @classmethod
    def from_tokens(
        cls: type[TDataset],
        tokens: Any,
        name: str = TOKENS,
        *,
        input_names: Iterable[str] | None = None,
        **extra: Any,
    ) -> TDataset:
        """A dataset of a tokenized batch ``[N, S+1]``, as the model builders take it.

        ``extra`` adds per-example arrays (labels, ...) by name; they are not
        inputs unless listed in ``input_names`` (default: the tokens alone).
        The tokens are copied, so the caller may reuse the tensor.
        """
        tokens = torch.as_tensor(tokens)
        if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
            raise CausalScrubbingError(
                f"tokens must be an integer tensor [N, S+1], got {tokens.dtype} {list(tokens.shape)}"
            )
        arrs = {name: tokens.clone(), **extra}
        return cls(arrs, input_names=[name] if input_names is None else input_names)

    def __getattr__(self, name: str) -> Array:
        if name.startswith("__") or name in ("arrs", "input_names"):  # not yet set: no recursion
            raise AttributeError(name)
        try:
            return self.arrs[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no attribute or array {name!r} (arrays: {sorted(self.arrs)})"
            ) from None

    def __len__(self) -> int:
        return next(iter(self.arrs.values())).shape[0]

    def __iter__(self) -> Iterator[TDataset]:
        """One-example datasets, in order (so that iteration does not rely on an IndexError)."""
        return (self[i] for i in range(len(self)))

    def __getitem__(self: TDataset, idxs: Any) -> TDataset:
        """The examples at ``idxs`` (an int gives a one-example dataset, keeping axis 0), same class."""
        idxs = self._checked_index(idxs)
        arrs = {}
        for name, array in self.arrs.items():
            value = array.tensor()
            arrs[name] = Array(
                value[idxs.to(value.device) if isinstance(idxs, torch.Tensor) else idxs], name=name
            )
        return attrs.evolve(self, arrs=arrs)

    def _checked_index(self, idxs: Any) -> slice | torch.Tensor:
        """``idxs`` as a slice or 1-D integer/bool tensor, or an error naming it and the length."""
        n = len(self)
        if isinstance(idxs, torch.Tensor) and idxs.ndim == 0 and not idxs.dtype.is_floating_point:
            idxs = int(idxs)
        if isinstance(idxs, int) and not isinstance(idxs, bool):
            if not -n <= idxs < n:
                raise CausalScrubbingError(f"index {idxs} is out of range for a Dataset of {n} examples")
            idxs %= n
            return slice(idxs, idxs + 1)
        if isinstance(idxs, slice):
            return _checked_slice(idxs, n)
        if isinstance(idxs, (list, range)):
            try:
                idxs = torch.as_tensor(list(idxs), dtype=torch.int64 if len(idxs) == 0 else None)
            except (TypeError, ValueError, RuntimeError):
                raise CausalScrubbingError(f"Dataset indices must be ints, got {shown(repr(idxs))}") from None
        if not isinstance(idxs, torch.Tensor) or idxs.ndim != 1:
            raise CausalScrubbingError(
                f"a Dataset is indexed by an int, a slice, a list or a 1-D tensor of indices, "
                f"got {shown(repr(idxs))}"
            )
        if idxs.dtype == torch.bool:
            if len(idxs) != n:
                raise CausalScrubbingError(
                    f"boolean mask of length {len(idxs)} for a Dataset of {n} examples"
                )
            return idxs
        if idxs.dtype.is_floating_point or idxs.dtype.is_complex:
            raise CausalScrubbingError(f"Dataset indices must be integers, got a {idxs.dtype} tensor")
        bad = idxs[(idxs < -n) | (idxs >= n)]
        if len(bad):
            raise CausalScrubbingError(
                f"indices {bad[:8].tolist()} are out of range for a Dataset of {n} examples"
            )
        return idxs

    def sample(self: TDataset, count: int, rng: torch.Generator | None = None) -> TDataset:
        """``count`` examples drawn uniformly with replacement, from ``rng`` (torch's global one if None)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise CausalScrubbingError(f"sample count must be a non-negative int, got {shown(repr(count))}")
        if len(self) == 0 and count:
            raise CausalScrubbingError(f"cannot sample {count} examples from an empty Dataset")
        if count == 0:
            return self[torch.zeros(0, dtype=torch.int64)]
        weights = torch.ones(len(self), dtype=torch.float32, device=rng.device if rng is not None else None)
        return self[torch.multinomial(weights, num_samples=count, replacement=True, generator=rng)]

    @classmethod
    def unwrap(cls: type[TDataset], d: Dataset) -> TDataset:
        """``d``, checked to be of this class (for samplers' funcs written for a Dataset subclass)."""
        if not isinstance(d, cls):
            raise CausalScrubbingError(f"expected a {cls.__name__}, got a {type(d).__name__}")
        return d

    def __str__(self) -> str:
        parts = []
        for name, array in self.arrs.items():
            role = "" if name in self.input_names else " (not an input)"
            value = array.tensor()
            shown_value = f"={value.tolist()}" if value.numel() <= SHOWN_ELEMENTS else ""
            parts.append(f"{name} {list(array.shape)}{role}{shown_value}")
        count = len(self)
        return f"{type(self).__name__}({count} example{'' if count == 1 else 's'}: {'; '.join(parts)})"

    __repr__ = __str__
