"""What a circuit costs to evaluate, worked out from shapes, dtypes and einsum strings without running it.

``cost(c)`` counts, per distinct node (the evaluator computes each once, so
leaves and shared subtrees count once):

- floating-point operations by kind, following what the evaluator's kernels
  run: ``matmul`` for an einsum's pairwise contractions that sum an index
  (torch runs them as ``bmm``; one multiply-add counts 2 FLOPs, as
  ``torch.utils.flop_counter`` counts), ``mul`` for products that sum
  nothing (and an einsum's multipliers, and the product of a batched dot),
  ``add`` for sums (an Add's operands, an einsum's single-operand
  reductions, a batched dot's sum), and per element for the library's
  functions (``exp``, ``log``, ``tanh``, ``sqrt``, ``div``, ``compare``...;
  ``FUNCTION_FLOPS``; ``pow`` per output element) and the aten ops an
  import keeps (``circuits.core.aten_functions.flops``).  A function whose cost
  is not known (a user's, an aten op without a rule) is never a guess and
  never 0: it is listed in ``unknown_functions``, counted in each total's
  ``unknown_nodes``, and every table and comment shows it (``1.2 MFLOP + ?``).
  Index, Rearrange, Concat, Scatter and casts do no arithmetic; they move
  bytes (a Tag is its child).
- bytes read (the children's outputs) and written (its own output), and the
  output's size.  Views (an Index by slices, a Rearrange that torch can
  express as a view, a one-child Add, an einsum that only permutes) read
  and write nothing and allocate nothing.
- the peak memory of evaluating the circuit under the evaluator's schedule:
  the schedule is ``traversal.postorder`` (tests pin it to
  ``compile_plan(...).nodes``), every value is released after its last
  consumer (roots are kept), and a view keeps its base's storage alive.
  Arrays (weights) and bound inputs are held by the caller, so they count
  as alive throughout; Scalars are stride-0 views of one 0-d tensor and
  count as nothing.  An einsum's own temporaries count at its step
  (``workspace_bytes``): copies of operands promoted to a common dtype, the
  contracted core before its multipliers, and where evaluation contracts
  bfloat16 or float16 in float32 (a CPU without kernels for them,
  ``circuits.evaluation.reduced``) the float32 copies; the float32 buffer
  that path keeps between evaluations is ``scratch_bytes``.  Other kernels'
  temporaries are not counted.  The device decides the float32 path: ``cost(c,
  device=...)``, by default the Arrays' (the CPU if none has a tensor).

Dtypes: an Array's is its tensor's; Scalars, Symbols and Arrays without a
tensor take the promoted floating dtype of the circuit's Arrays (the
default dtype if none), as Scalars do in ``evaluate``.  Grouping by layer
or head needs the naming convention, a higher layer: ``circuits.experiments.cost_groups``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import einops
import opt_einsum
import torch

from circuits.core import aten_functions
from circuits.errors import NodeTypeError, RandomVariableError, shown
from circuits.evaluation.einsum import einsum_workspace, is_batched_dot, split_multipliers
from circuits.core.functions import CAST_NAME, EXPLICIT_INDEX_NAME, GEN_INDEX_NAME, get_function
from circuits.core.gcpause import gc_paused
from circuits.core.nodes import (
    Add,
    Array,
    Circuit,
    Concat,
    Cumulant,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scatter,
    StoredCumulantVar,
    Symbol,
    Tag,
)
from circuits.core.shapes import format_shape
from circuits.core.traversal import postorder

__all__ = [
    "FUNCTION_FLOPS",
    "CircuitCost",
    "NodeCost",
    "Totals",
    "cost",
    "format_bytes",
    "format_flops",
]


#: FLOPs per input element of each library function, by kind.  softmax: the
#: max (compare), subtracting it and summing (add), exp, and the division.
#: log_exp_p_1 is ``max(x, 0) + log(1 + exp(-|x|))``; min and max one compare per entry.
FUNCTION_FLOPS: Mapping[str, Mapping[str, int]] = MappingProxyType(
    {
        "rsqrt": {"sqrt": 1, "div": 1},
        "reciprocal": {"div": 1},
        "gelu": {"erf": 1, "mul": 3, "add": 1},
        "gelu_new": {"tanh": 1, "mul": 6, "add": 2},
        "relu": {"compare": 1},
        "silu": {"exp": 1, "add": 1, "div": 1, "mul": 1},
        "sigmoid": {"exp": 1, "add": 1, "div": 1},
        "tanh": {"tanh": 1},
        "exp": {"exp": 1},
        "log": {"log": 1},
        "sqrt": {"sqrt": 1},
        "sin": {"sin": 1},
        "cos": {"cos": 1},
        "abs": {"compare": 1},
        "softmax": {"compare": 1, "add": 2, "exp": 1, "div": 1},
        "log_softmax": {"compare": 1, "add": 3, "exp": 1},
        "last_dim_size": {},
        "step": {"compare": 1},
        "logit": {"add": 1, "div": 1, "log": 1},
        "log_exp_p_1": {"compare": 1, "exp": 1, "log": 1, "add": 2},
        "gaussian_pdf": {"mul": 3, "exp": 1},
        "gaussian_cdf": {"erf": 1, "mul": 2, "add": 1},
        "min": {"compare": 1},
        "max": {"compare": 1},
        "upcast_float32": {},  # conversions: bytes moved, no arithmetic
        "type_as": {},
    }
)
#: FLOPs per row (over the last axis) of the input, for a function's row-wise part: log_softmax's log of the sum.
_PER_ROW_FLOPS: Mapping[str, Mapping[str, int]] = {"log_softmax": {"log": 1}}
#: FLOPs per output element, for a function whose inputs broadcast: ``pow(x, exponent)``.
_PER_OUTPUT_FLOPS: Mapping[str, Mapping[str, int]] = {"pow": {"pow": 1}}


@dataclass(frozen=True, eq=False)
class Totals:
    """FLOPs by kind and bytes moved, summed over some nodes (each distinct node once);
    ``unknown_nodes`` counts those among them whose FLOPs are not known (not in ``flops``)."""

    flops: Mapping[str, int] = field(default_factory=dict)
    read_bytes: int = 0
    written_bytes: int = 0
    unknown_nodes: int = 0

    @property
    def flop_count(self) -> int:
        """The FLOPs of the nodes whose cost is known, every kind together (see ``unknown_nodes``)."""
        return sum(self.flops.values())

    @property
    def flops_text(self) -> str:
        """``1.20 MFLOP``, or ``1.20 MFLOP + ?`` when some nodes' FLOPs are unknown."""
        return format_flops(self.flop_count) + (" + ?" if self.unknown_nodes else "")

    def __add__(self, other: Totals) -> Totals:
        flops = dict(self.flops)
        for kind, count in other.flops.items():
            flops[kind] = flops.get(kind, 0) + count
        return Totals(
            flops,
            self.read_bytes + other.read_bytes,
            self.written_bytes + other.written_bytes,
            self.unknown_nodes + other.unknown_nodes,
        )


@dataclass(frozen=True, eq=False)
class NodeCost(Totals):
    """One distinct node's own cost (not its subtree's): FLOPs, bytes, its output, and how it is held."""

    node: Circuit | None = None
    out_elements: int = 0
    out_bytes: int = 0  # the output's size in its dtype
    allocated_bytes: int = 0  # new memory for it: 0 for a view or a Scalar; an Array's or input's own
    dtype: torch.dtype = torch.float32
    view: bool = False  # the output is a view of a child's storage: nothing allocated
    workspace_bytes: int = 0  # the kernel's temporaries beside the output, freed when it returns
    scratch_bytes: int = 0  # a buffer the kernel keeps between evaluations (``reduced``'s float32 chunks)
    unknown_function: bool = False  # a function whose FLOPs are not known: ``unknown_nodes`` is 1


def cost(circuit: Circuit | Iterable[Circuit], device: torch.device | str | None = None) -> CircuitCost:
    """The static cost of evaluating ``circuit`` (or several roots together), per distinct node.

    Nothing is run and no tensor is needed: a circuit parsed without its
    tensors costs the same.  ``device``: where it will be evaluated (by
    default the Arrays' device, the CPU if none has a tensor); it decides
    only the temporaries of reduced-precision contractions.  See the module
    docstring for what is counted.
    """
    roots = [circuit] if isinstance(circuit, Circuit) else list(circuit)
    with gc_paused():  # one NodeCost per node: no cyclic garbage, but full collections at 10^5 nodes
        return _cost(roots, device)


def _cost(roots: list[Circuit], device: torch.device | str | None) -> CircuitCost:
    order = postorder(roots)
    float_dtype = _float_dtype(order)
    where = _device(order, device)
    dtypes: dict[bytes, torch.dtype] = {}
    sizes: dict[bytes, int] = {}  # output bytes by node hash, for the parents' reads
    costs: list[NodeCost] = []
    for node in order:
        dtype = dtypes[node.hash] = _dtype(node, dtypes, float_dtype)
        own = _node_cost(node, dtype, sizes)
        if isinstance(node, Einsum):
            child_dtypes = tuple(dtypes[c.hash] for c in node.children)
            shapes = tuple(c.shape for c in node.children)
            workspace = einsum_workspace(node.einsum_string, shapes, child_dtypes, where)
            own = dataclasses.replace(own, workspace_bytes=workspace[0], scratch_bytes=workspace[1])
        sizes[node.hash] = own.out_bytes
        costs.append(own)
    return CircuitCost(roots, costs)


def _device(order: list[Circuit], device: torch.device | str | None) -> torch.device:
    """Where the circuit is evaluated: ``device``, else its first Array's tensor's, else the CPU."""
    if device is not None:
        return torch.device(device)
    for node in order:
        if type(node) is Array and node.value is not None:
            return node.value.device
    return torch.device("cpu")


def _float_dtype(order: list[Circuit]) -> torch.dtype:
    """The dtype Scalars take: the promoted floating dtype of the Arrays (as ``evaluate`` picks it)."""
    found = {
        n.value.dtype
        for n in order
        if type(n) is Array and n.value is not None and n.value.dtype.is_floating_point
    }
    if not found:
        return torch.get_default_dtype()
    return functools.reduce(torch.promote_types, found)


def _dtype(node: Circuit, dtypes: dict[bytes, torch.dtype], float_dtype: torch.dtype) -> torch.dtype:
    children = node.children
    if not children:
        return node.value.dtype if isinstance(node, Array) and node.value is not None else float_dtype
    first = dtypes[children[0].hash]
    if isinstance(node, (Index, Rearrange, Tag, Scatter)):
        return first
    if isinstance(node, GeneralFunction):
        name = node.spec.name
        if node.spec.dtype_fn is not None:
            return node.spec.dtype_fn([dtypes[c.hash] for c in children])
        if GEN_INDEX_NAME.fullmatch(name) or EXPLICIT_INDEX_NAME.fullmatch(name):
            return first
        cast = CAST_NAME.fullmatch(name)
        if cast is not None:
            target = cast.group("out_dtype")
            return first if target == "None" else getattr(torch, target)
        if aten_functions.ATEN_NAME.fullmatch(name):
            return _aten_dtype(node, [dtypes[c.hash] for c in children])
    dtype = functools.reduce(torch.promote_types, (dtypes[c.hash] for c in children[1:]), first)
    if isinstance(node, GeneralFunction) and not dtype.is_floating_point:
        return float_dtype
    return dtype


def _aten_dtype(node: GeneralFunction, child_dtypes: list[torch.dtype]) -> torch.dtype:
    """What an aten call gives, from its function run on meta tensors (no data)."""
    metas = [torch.empty(c.shape, dtype=d, device="meta") for c, d in zip(node.children, child_dtypes)]
    try:
        return get_function(node.spec.name).function(*metas).dtype
    except Exception:  # noqa: BLE001 - an op that reads values: its inputs' promoted dtype
        return functools.reduce(torch.promote_types, child_dtypes)


def _node_cost(node: Circuit, dtype: torch.dtype, sizes: dict[bytes, int]) -> NodeCost:
    if isinstance(node, (DiscreteVar, StoredCumulantVar, Cumulant)):
        raise RandomVariableError(
            f"cost: {node.describe()} is one of rust_circuit's random-variable nodes, which this library "
            "does not evaluate, so it has no cost"
        )
    elements = math.prod(node.shape)
    out_bytes = elements * dtype.itemsize
    if not node.children:  # Scalars and constants are stride-0 views of one 0-d tensor: nothing allocated
        held = out_bytes if isinstance(node, (Array, Symbol)) else 0
        return NodeCost(
            node=node, out_elements=elements, out_bytes=out_bytes, allocated_bytes=held, dtype=dtype
        )
    flops, view, unknown = _flops(node, elements)
    moved = 0 if view else out_bytes
    return NodeCost(
        flops=MappingProxyType(flops),
        read_bytes=0 if view else sum([sizes[c.hash] for c in node.children]),
        written_bytes=moved,
        node=node,
        out_elements=elements,
        out_bytes=out_bytes,
        allocated_bytes=moved,
        dtype=dtype,
        view=view,
        unknown_function=unknown,
        unknown_nodes=int(unknown),
    )


def _flops(node: Circuit, elements: int) -> tuple[dict[str, int], bool, bool]:
    """``(FLOPs by kind, is a view, is an unknown function)`` of a computed node."""
    if isinstance(node, Einsum):
        shapes = tuple(c.shape for c in node.children)
        counts, view = _einsum_flops(node.einsum_string, shapes)
        return dict(counts), view, False
    if isinstance(node, Add):
        count = len(node.children)
        return ({"add": elements * (count - 1)} if count > 1 else {}), count == 1, False
    if isinstance(node, GeneralFunction):
        return _function_flops(node)
    if isinstance(node, Index):
        return {}, not any(isinstance(item, torch.Tensor) for item in node.index), False
    if isinstance(node, Rearrange):
        return {}, _rearrange_is_view(node.pattern, tuple(node.sizes), node.children[0].shape), False
    if isinstance(node, Concat):
        return {}, False, False
    if isinstance(node, Tag):
        return {}, True, False
    if isinstance(node, Scatter):  # zeros around the child; the child itself when there is no room
        return {}, node.shape == node.children[0].shape, False
    raise NodeTypeError(f"cost: no cost rule for {node.describe()} (node type {type(node).__name__})")


def _function_flops(node: GeneralFunction) -> tuple[dict[str, int], bool, bool]:
    name = node.spec.name
    if GEN_INDEX_NAME.fullmatch(name) or EXPLICIT_INDEX_NAME.fullmatch(name) or CAST_NAME.fullmatch(name):
        return {}, False, False  # a gather or a conversion: bytes moved, no arithmetic
    if aten_functions.ATEN_NAME.fullmatch(name):
        counted = aten_functions.flops(name, [c.shape for c in node.children], node.shape)
        return ({}, False, True) if counted is None else (counted, False, False)
    if name in _PER_OUTPUT_FLOPS:
        outputs = math.prod(node.shape)
        return {kind: count * outputs for kind, count in _PER_OUTPUT_FLOPS[name].items()}, False, False
    per_input = FUNCTION_FLOPS.get(name)
    if per_input is None:
        return {}, False, True
    inputs = math.prod(node.children[0].shape)
    flops = {kind: count * inputs for kind, count in per_input.items()}
    for kind, count in _PER_ROW_FLOPS.get(name, {}).items():
        rows = inputs // max(1, node.children[0].shape[-1])
        flops[kind] = flops.get(kind, 0) + count * rows
    return flops, False, False


@functools.lru_cache(maxsize=4096)
def _einsum_flops(
    equation: str, shapes: tuple[tuple[int, ...], ...]
) -> tuple[tuple[tuple[str, int], ...], bool]:
    """FLOPs by kind of ``einsum_kernel(equation)`` on operands of ``shapes``, and whether it is a view.

    Mirrors the kernel: a batched dot is a product and a sum; with three or
    more operands the multipliers are products over the output after the
    core is contracted; the core is contracted pairwise along opt_einsum's
    ``auto`` path, as torch.einsum does.
    """
    inputs, out = equation.split("->")
    if len(set(out)) != len(out):  # a diagonal embedding: the einsum into each letter once, then a write
        return _einsum_flops(inputs + "->" + "".join(dict.fromkeys(out)), shapes)[0], False
    operands = inputs.split(",")
    sizes = {letter: size for op, shape in zip(operands, shapes) for letter, size in zip(op, shape)}
    counts: dict[str, int] = {}
    diagonal = any(len(set(op)) != len(op) for op in operands)  # torch.einsum as written
    if not diagonal and is_batched_dot(operands, out):
        space = math.prod(sizes[letter] for letter in operands[0])
        return (("mul", space), ("add", space)), False
    core, multipliers = list(range(len(operands))), []
    if not diagonal and len(operands) >= 3:
        core, multipliers = split_multipliers(operands, out)
    if multipliers:  # the kernel runs the core as an einsum of its own, then multiplies
        core_out = "".join(letter for letter in out if any(letter in operands[i] for i in core))
        core_equation = ",".join(operands[i] for i in core) + "->" + core_out
        counts.update(_einsum_flops(core_equation, tuple(shapes[i] for i in core))[0])
        counts["mul"] = counts.get("mul", 0) + len(multipliers) * math.prod(sizes[letter] for letter in out)
    else:
        _contract(operands, out, sizes, counts)
    view = len(operands) == 1 and set(operands[0]) == set(out) and len(operands[0]) == len(out)
    return tuple(counts.items()), view


def _contract(operands: list[str], out: str, sizes: dict[str, int], counts: dict[str, int]) -> None:
    """Add to ``counts`` the FLOPs of contracting ``operands`` into ``out`` pairwise, as torch.einsum does."""
    if len(operands) == 1:
        summed = set(operands[0]) - set(out)
        if summed:
            counts["add"] = counts.get("add", 0) + math.prod(sizes[letter] for letter in set(operands[0]))
        return
    path = [(0, 1)] if len(operands) == 2 else _path(",".join(operands) + "->" + out, sizes)
    terms = list(operands)
    for pair in path:
        picked = [terms[i] for i in pair]
        terms = [t for i, t in enumerate(terms) if i not in pair]
        kept = set(out).union(*terms)
        letters = set().union(*picked)
        result = "".join(sorted(letters & kept))
        if len(picked) == 1:
            _contract(picked, result, sizes, counts)
        else:
            # torch.einsum first sums a letter that is in one of the two operands only (and
            # needed nowhere else), then multiplies: only shared summed letters make a matmul
            for position, term in enumerate(picked):
                other = picked[1 - position]
                alone = {letter for letter in term if letter not in kept and letter not in other}
                if alone:
                    counts["add"] = counts.get("add", 0) + math.prod(sizes[letter] for letter in set(term))
                    picked[position] = "".join(letter for letter in term if letter not in alone)
            letters = set().union(*picked)
            space = math.prod(sizes[letter] for letter in letters)
            kind, factor = ("matmul", 2) if letters - kept else ("mul", 1)
            counts[kind] = counts.get(kind, 0) + factor * space
        terms.append(result)


def _path(equation: str, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    operands = equation.split("->")[0].split(",")
    shapes = [tuple(sizes[letter] for letter in op) for op in operands]
    path, _ = opt_einsum.contract_path(equation, *shapes, shapes=True, optimize="auto")
    return path


@functools.lru_cache(maxsize=1024)
def _rearrange_is_view(pattern: str, sizes: tuple, shape: tuple[int, ...]) -> bool:
    """Whether the evaluator's ``einops.repeat`` returns a view, found by running it on a meta tensor."""
    base = torch.empty(shape, device="meta")
    result = einops.repeat(base, pattern, **dict(sizes))
    return result._base is base or result is base


class CircuitCost:
    """The cost of a circuit: ``nodes`` (one ``NodeCost`` per distinct node, in schedule order),
    ``total``, ``peak_bytes``, and views of them (``table``, ``grouped``, ``comment``, ``to_pandas``)."""

    def __init__(self, roots: list[Circuit], nodes: list[NodeCost]):
        self.roots = roots
        self.nodes = nodes
        self.by_hash: dict[bytes, NodeCost] = {c.node.hash: c for c in nodes}
        self.total: Totals = _sum(nodes)
        self.unknown_functions: list[Circuit] = [c.node for c in nodes if c.unknown_function]
        self.held_bytes, self.peak_value_bytes = _replay(nodes, roots)
        #: the float32 buffer reduced-precision contractions keep (the largest they ask for), 0 if none
        self.scratch_bytes: int = max((c.scratch_bytes for c in nodes), default=0)
        self.peak_bytes: int = self.held_bytes + self.scratch_bytes + self.peak_value_bytes

    def __getitem__(self, node: Circuit) -> NodeCost:
        return self.by_hash[node.hash]

    def subtree(self, node: Circuit) -> Totals:
        """Totals over ``node``'s subtree, each distinct node once."""
        return _sum([self.by_hash[n.hash] for n in postorder(node)])

    def grouped(self, label: Callable[[Circuit], str | None], rest: str = "(rest)") -> dict[str, Totals]:
        """Totals per group: ``label(node)`` starts a group at a node (None: the node joins its parent's).

        A node shared by several groups is counted once, in the group of the
        first parent the pre-order walk from the roots reaches it through.
        """
        groups: dict[str, Totals] = {}
        seen: set[bytes] = set()
        stack = [(root, rest) for root in reversed(self.roots)]
        while stack:
            node, inherited = stack.pop()
            if node.hash in seen:
                continue
            seen.add(node.hash)
            group = label(node) or inherited
            groups[group] = groups.get(group, Totals()) + self.by_hash[node.hash]
            stack.extend((child, group) for child in reversed(node.children))
        return groups

    def comment(self, node: Circuit) -> str | None:
        """A node's own cost as a one-line comment: ``c.print(comment=cost(c).comment)``."""
        own = self.by_hash.get(node.hash)
        if own is None or (not node.children and not own.allocated_bytes):
            return None
        if not node.children:
            return format_bytes(own.allocated_bytes)
        if own.view:
            return "view"
        if own.unknown_function:
            return f"? FLOP (not known for {node.spec.name}), {format_bytes(own.out_bytes)} out"
        return f"{format_flops(own.flop_count)}, {format_bytes(own.out_bytes)} out"

    def table(self, depth: int = 2, label: Callable[[Circuit], str | None] | None = None) -> str:
        """The totals, the peak, then per subtree (to ``depth``) or per group (``label``, see ``grouped``).

        Groups that cost nothing (a weight's own group, say) are left out.
        """
        lines = self._header()
        lines.append(f"{'':<44}{'FLOPs':>16}{'read':>12}{'written':>12}{'out':>12}")
        if label is not None:
            groups = sorted(self.grouped(label).items(), key=lambda item: _natural(item[0]))
            rows = [
                (group, totals, None)
                for group, totals in groups
                if totals.flop_count or totals.read_bytes or totals.unknown_nodes
            ]
        else:
            rows = self._tree_rows(depth)
        for text, totals, own in rows:
            out = format_bytes(own.out_bytes) if own is not None else ""
            lines.append(
                f"{shown(text)[:43]:<44}{totals.flops_text:>16}"
                f"{format_bytes(totals.read_bytes):>12}{format_bytes(totals.written_bytes):>12}{out:>12}"
            )
        return "\n".join(lines)

    def _header(self) -> list[str]:
        lines = [
            f"Peak memory: {format_bytes(self.peak_bytes)} (Arrays and inputs {format_bytes(self.held_bytes)}, "
            f"values at most {format_bytes(self.peak_value_bytes)}"
            + (f", float32 scratch {format_bytes(self.scratch_bytes)})" if self.scratch_bytes else ")"),
            f"Total cost: {self.total.flops_text}",
            f"  read: {format_bytes(self.total.read_bytes)}",
            f"  write: {format_bytes(self.total.written_bytes)}",
        ]
        lines += [f"  {kind}: {count:.6g}" for kind, count in sorted(self.total.flops.items())]
        if self.unknown_functions:
            counts: dict[str, int] = {}
            for node in self.unknown_functions:
                counts[node.spec.name] = counts.get(node.spec.name, 0) + 1
            listed = ", ".join(
                f"{name} x{count}" if count > 1 else name for name, count in sorted(counts.items())
            )
            lines.append(f"  unknown: the FLOPs of {len(self.unknown_functions)} nodes (+ ?): {listed}")
        return lines

    def _tree_rows(self, depth: int) -> list[tuple[str, Totals, NodeCost | None]]:
        """Each node to ``depth`` with its subtree's totals; a node met again is marked, not recounted."""
        rows = []
        seen: set[bytes] = set()
        stack = [(root, 0) for root in reversed(self.roots)]
        while stack:
            node, level = stack.pop()
            label = "  " * level + (repr(node.name) if node.name is not None else node.kind)
            if node.hash in seen:
                rows.append((label + " (above)", Totals(), None))
                continue
            seen.add(node.hash)
            rows.append((f"{label} {format_shape(node.shape)}", self.subtree(node), self.by_hash[node.hash]))
            if level < depth:
                stack.extend((child, level + 1) for child in reversed(node.children) if child.children)
        return rows

    def to_pandas(self):
        """One row per distinct node, in schedule order (needs pandas); a node whose FLOPs are not
        known has NaN in ``flops`` and each ``flops_KIND`` column, and ``flops_unknown`` set."""
        import pandas as pd

        frame = pd.DataFrame(
            [
                {
                    "name": c.node.name,
                    "kind": c.node.kind,
                    "shape": c.node.shape,
                    "dtype": str(c.dtype),
                    "flops": math.nan if c.unknown_function else c.flop_count,
                    "flops_unknown": c.unknown_function,
                    **{f"flops_{kind}": count for kind, count in c.flops.items()},
                    "read_bytes": c.read_bytes,
                    "written_bytes": c.written_bytes,
                    "out_bytes": c.out_bytes,
                    "allocated_bytes": c.allocated_bytes,
                    "view": c.view,
                }
                for c in self.nodes
            ]
        )
        kinds = [
            column for column in frame.columns if column.startswith("flops_") and column != "flops_unknown"
        ]
        frame[kinds] = frame[kinds].fillna(0)
        frame.loc[frame["flops_unknown"], kinds] = math.nan
        return frame


def _sum(costs: Iterable[Totals]) -> Totals:
    """The totals of ``costs``, added into one dict (not a new ``Totals`` per term)."""
    flops: dict[str, int] = {}
    read = written = unknown = 0
    for c in costs:
        for kind, count in c.flops.items():
            flops[kind] = flops.get(kind, 0) + count
        read += c.read_bytes
        written += c.written_bytes
        unknown += c.unknown_nodes
    return Totals(flops, read, written, unknown)


def _replay(nodes: list[NodeCost], roots: list[Circuit]) -> tuple[int, int]:
    """``(bytes held by the caller, peak bytes of values)`` over the schedule, without running it.

    Each value is released after its last consumer, as ``compile_plan``
    releases it; a view keeps its base's storage, which is freed when no
    live value refers to it.
    """
    slot_of = {c.node.hash: slot for slot, c in enumerate(nodes)}
    releases: dict[int, list[int]] = {}
    last_use: dict[int, int] = {}
    for position, c in enumerate(nodes):
        for child in c.node.children:
            last_use[slot_of[child.hash]] = position
    for root in roots:
        last_use.pop(slot_of[root.hash], None)
    for slot, position in last_use.items():
        releases.setdefault(position, []).append(slot)
    storage = list(range(len(nodes)))  # slot -> the slot whose allocation holds its value
    refs = [0] * len(nodes)
    held = live = peak = 0
    tensors_held: set[tuple] = set()
    for position, c in enumerate(nodes):
        if not c.node.children:
            tensor = _held_tensor(c)
            if tensor is None or tensor not in tensors_held:
                held += c.allocated_bytes
            if tensor is not None:
                tensors_held.add(tensor)
            refs[position] = 1
            continue
        if c.view:
            storage[position] = storage[slot_of[c.node.children[0].hash]]
        else:
            live += c.allocated_bytes
        refs[storage[position]] += 1
        peak = max(peak, live + c.workspace_bytes)
        for slot in releases.get(position, ()):
            base = storage[slot]
            refs[base] -= 1
            if refs[base] == 0 and nodes[base].node.children:
                live -= nodes[base].allocated_bytes
    return held, peak


def _held_tensor(c: NodeCost) -> tuple | None:
    """Which memory an Array's tensor is, when evaluation uses it as it is (its dtype the cost's):
    two Arrays of one tensor, or of a tensor and its transpose (a tied embedding and unembedding),
    hold it once.  None for anything else (each Array converted to another dtype is a copy)."""
    value = getattr(c.node, "value", None) if isinstance(c.node, Array) else None
    if not isinstance(value, torch.Tensor) or value.dtype != c.dtype:
        return None
    return (value.untyped_storage().data_ptr(), value.device, value.storage_offset(), value.numel())


def _natural(text: str) -> list:
    """A sort key putting ``layer 2`` before ``layer 10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def format_flops(count: float) -> str:
    """``2.10 GFLOP``: SI prefixes (1 GFLOP = 10^9)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {prefix}FLOP"
    return f"{count:.0f} FLOP"


def format_bytes(count: float) -> str:
    """``12.0 MiB``: binary prefixes (1 MiB = 2^20 bytes)."""
    for prefix, scale in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {prefix}B"
    return f"{count:.0f} B"
