"""The walk over an exported graph: each fx node in order becomes circuit nodes.

Nodes whose inputs are all known at import time (``arange``, masks built
from shapes, buffers' derived tables) are computed there and then and kept
as ``Const`` values; one becomes an Array (or a Scalar, if every entry is
the same float) only where a computed node uses it.  Everything else goes
through the op table (``registry.OPS``) or, failing that, becomes an aten
GeneralFunction (``circuits.core.aten_functions``), recorded as untranslated.
Each result is checked against the shape torch recorded for the op and cast
to its dtype where evaluation would give another (``dtypes``); each
module's output gets a node named after the module (``naming``).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping

import torch
import torch.fx
import torch.utils._pytree as pytree

from circuits.core import aten_functions
from circuits.errors import CircuitError, ModelError
from circuits.models.torch_import import dtypes, naming
from circuits.models.torch_import.registry import OPS, UNTRANSLATED, Const
from circuits.core.nodes import Add, Array, Circuit, GeneralFunction, Scalar

# the translators register themselves on import
from circuits.models.torch_import import ops_arith, ops_nn, ops_shape  # noqa: F401, E402  isort: skip


def _has_node(value: Any) -> bool:
    if isinstance(value, Circuit):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_node(item) for item in value)
    if isinstance(value, dict):
        return any(_has_node(item) for item in value.values())
    return False


def _values(value: Any) -> Any:
    """``value`` with every Const replaced by its tensor (to compute an op at import time)."""
    if isinstance(value, Const):
        return value.tensor
    if isinstance(value, (list, tuple)):
        return type(value)(_values(item) for item in value)
    if isinstance(value, dict):
        return {key: _values(item) for key, item in value.items()}
    return value


def _constants(result: Any, name: str) -> Any:
    """An op's result computed at import time, its tensors as Consts."""
    if isinstance(result, torch.Tensor):
        return Const(result, name)
    if isinstance(result, (list, tuple)):
        return tuple(_constants(item, f"{name}.{i}") for i, item in enumerate(result))
    return result


def _shape_of(value: Any) -> tuple | None:
    return tuple(int(size) for size in value.shape) if isinstance(value, torch.Tensor) else None


def _check_static(fx_node: torch.fx.Node, where: str) -> None:
    """Refuse an op whose result depends on the data in a way a circuit cannot hold: a Python number
    read from a tensor (``.item()``), or a shape (a boolean mask's ``x[mask]``, ``nonzero``)."""
    for item in pytree.tree_leaves(fx_node.meta.get("val")):
        if isinstance(item, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise ModelError(
                f"from_torch: {where} reads a tensor's value into a Python number (.item(), "
                "float(t), int(t) or a comparison of one), which a circuit, computed from tensors, cannot "
                "hold; keep it a tensor (x * t, not x * t.item())"
            )
        if isinstance(item, torch.Tensor) and any(isinstance(size, torch.SymInt) for size in item.shape):
            raise ModelError(
                f"from_torch: {where} gives a tensor of shape {[str(s) for s in item.shape]}, which depends "
                "on the data (a boolean mask x[mask], nonzero, masked_select, unique); a circuit's shapes "
                "are fixed: keep the shape (torch.where(mask, x, 0))"
            )


class Translator:
    """Translates one exported graph; ``missing`` lists the aten ops kept as GeneralFunctions.

    ``top`` names the top module in messages; ``basis`` is the dtype a constant is checked against
    before it becomes a Scalar (``dtypes.exact_in``), ``scalar_dtype`` the one Scalars evaluate to.
    """

    def __init__(
        self,
        leaves: Mapping[str, Any],
        namer: naming.Namer,
        *,
        top: str = "module",
        basis: torch.dtype = torch.float32,
        scalar_dtype: torch.dtype = torch.float32,
    ):
        self.env: dict[torch.fx.Node, Any] = {}
        self.leaves = leaves
        self.namer = namer
        self.top = top
        self.basis = basis
        self.dtypes = dtypes.Dtypes(scalar_dtype)
        self.wrapped: dict[int, Circuit] = {}  # id(Const) -> its node, so a constant is one node
        self.missing: dict[str, list[str]] = {}  # "aten.op.overload" -> modules it ran in
        self.made_in: dict[bytes, frozenset[str]] = {}  # node hash -> the module calls that computed it

    def run(self, graph: torch.fx.Graph) -> list[Any]:
        outputs: list[Any] = []
        module_outputs = naming.module_outputs(graph)
        for fx_node in graph.nodes:
            if fx_node.op == "placeholder":
                self.env[fx_node] = self.leaves[fx_node.name]
            elif fx_node.op == "call_function":
                self.env[fx_node] = self.named_after_modules(
                    self.call(fx_node), module_outputs.get(fx_node, ())
                )
            elif fx_node.op == "output":
                outputs = [
                    self.env[item] if isinstance(item, torch.fx.Node) else item for item in fx_node.args[0]
                ]
            else:
                raise ModelError(
                    f"from_torch: exported graph node {fx_node.name!r} is a {fx_node.op!r}, which is not supported"
                )
        return outputs

    def module(self, path: str) -> str:
        """How messages name a module: ``module 'transformer.h.0'``, or the top module by its class."""
        return f"module {path!r}" if path else f"the top module ({self.top})"

    def where(self, fx_node: torch.fx.Node, path: str) -> str:
        return f"{fx_node.name!r} ({fx_node.target}) in {self.module(path)}"

    def circuit(self, value: Any) -> Circuit:
        """``value`` (a node or a Const) as a circuit node."""
        if isinstance(value, Circuit):
            return value
        if isinstance(value, Const):
            node = self.wrapped.get(id(value))
            if node is None:
                node = self.wrapped[id(value)] = self._constant_node(value)
            return node
        raise ModelError(f"cannot make a circuit node of a {type(value).__name__} ({value!r})")

    def _constant_node(self, const: Const) -> Circuit:
        """A Scalar if every entry is the same float and a Scalar holds it as torch does; else an Array."""
        tensor = const.tensor.detach()
        name = self.namer.unique(const.name)
        if tensor.is_floating_point() and tensor.numel() and bool((tensor == tensor.reshape(-1)[0]).all()):
            value = float(tensor.reshape(-1)[0])
            if dtypes.exact_in(value, tensor.dtype, self.basis):
                return Scalar(value, shape=tuple(tensor.shape), name=name)
        return Array(tensor.clone(), name=name)

    def call(self, fx_node: torch.fx.Node) -> Any:
        target = fx_node.target
        args = torch.fx.node.map_arg(fx_node.args, self.env.__getitem__)
        kwargs = torch.fx.node.map_arg(fx_node.kwargs, self.env.__getitem__)
        if target is operator.getitem:
            return args[0][args[1]]
        path, op = naming.module_path(fx_node), naming.op_name(fx_node)
        where = self.where(fx_node, path)
        _check_static(fx_node, where)
        if not _has_node((args, kwargs)):
            try:
                return _constants(target(*_values(args), **_values(kwargs)), naming.joined(path, op))
            except Exception as error:  # noqa: BLE001 - any torch error, reported with the node
                raise ModelError(f"from_torch: computing {where} at import time failed: {error}") from error
        if not isinstance(target, torch._ops.OpOverload):
            raise ModelError(f"from_torch: {where} calls {target!r}, which is not an aten op")
        ctx = OpContext(self, fx_node, path, op)
        translate: Callable | None = OPS.get(op)
        try:
            result = UNTRANSLATED if translate is None else translate(ctx, *args, **kwargs)
            if result is UNTRANSLATED:
                result = self.fallback(ctx, fx_node, args, kwargs)
            _check_shapes(fx_node, result)
            result = self.in_torch_dtypes(ctx, result)
        except (CircuitError, ValueError) as error:  # a refusal or a translation bug, said with the op
            raise ModelError(f"from_torch: translating {where} failed: {error}") from error
        self._record_made(fx_node, result)
        return result

    def _record_made(self, fx_node: torch.fx.Node, result: Any) -> None:
        calls = frozenset(key for key, _ in naming.module_calls(fx_node))
        for node in result if isinstance(result, tuple) else (result,):
            if isinstance(node, Circuit) and node.hash not in self.made_in and node.children:
                self.made_in[node.hash] = calls

    def named_after_modules(self, value: Any, calls) -> Any:
        """``value`` under a one-child Add named after each module call it is the output of (innermost
        first), leaving out a call that computed nothing (an eval-mode dropout hands on its input)."""
        if not isinstance(value, Circuit):
            return value
        for key, name in calls:
            made = self.made_in.get(value.hash, frozenset())
            if key in made:
                value = Add(value, name=self.namer.unique(name))
                self.made_in[value.hash] = made
        return value

    def in_torch_dtypes(self, ctx: OpContext, result: Any) -> Any:
        """``result`` with each node that would evaluate to another dtype than torch's cast to torch's."""
        val = ctx.fx_node.meta.get("val")
        if isinstance(result, Circuit) and isinstance(val, torch.Tensor):
            return self._cast(ctx, result, val.dtype)
        if isinstance(result, tuple) and isinstance(val, (list, tuple)):
            return tuple(
                self._cast(ctx, node, expected.dtype)
                if isinstance(node, Circuit) and isinstance(expected, torch.Tensor)
                else node
                for node, expected in zip(result, val)
            )
        return result

    def _cast(self, ctx: OpContext, node: Circuit, dtype: torch.dtype) -> Circuit:
        """``node`` cast to ``dtype`` if it evaluates to another; the op's own node gives its name to
        the cast and is renamed ``MODULE.OP.DTYPE`` (``mul.float32`` under ``mul``, a float16)."""
        got = self.dtypes.of(node)
        if got == dtype:
            return node
        spec = dtypes.cast_spec(dtype)
        if spec is None:
            raise ModelError(f"it evaluates to {got}, torch's op gives {dtype}, and there is no cast to it")
        if node.name is not None and node.name == ctx.own_name:
            inner = node.rename(self.namer.unique(f"{node.name}.{str(got).removeprefix('torch.')}"))
            self.dtypes.known[inner.hash] = got
            cast = GeneralFunction(inner, spec=spec, name=node.name)
        else:
            cast = GeneralFunction(node, spec=spec, name=ctx.name("cast"))
        self.dtypes.known[cast.hash] = dtype
        return cast

    def fallback(self, ctx: OpContext, fx_node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        """The op as an aten GeneralFunction (one per tensor output), recorded as untranslated."""
        target = fx_node.target
        if target.namespace != "aten":
            raise ModelError(f"{target} is outside aten, and has no GeneralFunction form")
        self.missing.setdefault(f"aten.{target.overloadpacket.__name__}.{target._overloadname}", []).append(
            self.module(ctx.path)
        )
        children: list[Circuit] = []

        def dtype_of(value: Any) -> torch.dtype | None:
            if isinstance(value, Const):
                children.append(self.circuit(value))
                return value.tensor.dtype
            if isinstance(value, Circuit):
                children.append(value)
                return ctx.dtype_of(value)
            return None

        # the circuit runs where evaluation puts it: the export's device is not part of the call
        kwargs = {key: value for key, value in kwargs.items() if key not in ("device", "pin_memory")}
        val = fx_node.meta.get("val")
        outputs = [None] if isinstance(val, torch.Tensor) else list(range(len(val or ())))
        used = _used_outputs(fx_node)
        results = []
        for out in outputs:
            if out is not None and used is not None and out not in used:
                results.append(None)  # an output nobody reads (batch norm's saved statistics)
                continue
            children.clear()
            try:
                spec = aten_functions.call_name(target, args, kwargs, out, dtype_of)
            except ValueError as error:
                raise ModelError(f"it has no GeneralFunction form: {error}") from None
            is_tensor = out is None or isinstance(val[out], torch.Tensor)
            results.append(GeneralFunction(*children, spec=spec, name=ctx.name()) if is_tensor else None)
        return results[0] if val is not None and outputs == [None] else tuple(results)


def _used_outputs(fx_node: torch.fx.Node) -> set[int] | None:
    """Which outputs of a several-output op are read (by ``getitem``); None if it is used whole."""
    used = set()
    for user in fx_node.users:
        if user.target is not operator.getitem:
            return None
        used.add(user.args[1])
    return used


def _check_shapes(fx_node: torch.fx.Node, result: Any) -> None:
    """The translation has the shape torch recorded for the op (a wrong one is a bug, said here)."""
    val = fx_node.meta.get("val")
    pairs = [(val, result)] if not isinstance(val, (list, tuple)) else list(zip(val, result))
    for expected, got in pairs:
        shape = _shape_of(expected)
        if shape is not None and isinstance(got, Circuit) and got.shape != shape:
            raise ModelError(
                f"the translation gave {got.describe()} of shape {list(got.shape)}, but torch's is {list(shape)}"
            )


class OpContext:
    """What a translator may ask about the op it translates: names, dtypes, the output's shape."""

    def __init__(self, translator: Translator, fx_node: torch.fx.Node, path: str, op: str):
        self.translator = translator
        self.fx_node = fx_node
        self.path = path
        self.op = op
        self._base: str | None = None  # MODULE.OP made unique, reserved by the first name asked for
        self._base_given = False  # whether the op's own node has it
        val = fx_node.meta.get("val")
        self.out_shape = _shape_of(val)
        first = val[0] if isinstance(val, (list, tuple)) and val else val  # the main output of several
        self.out_dtype = first.dtype if isinstance(first, torch.Tensor) else None
        self._dtypes = {}
        for arg in fx_node.all_input_nodes:
            value, meta = translator.env.get(arg), arg.meta.get("val")
            if isinstance(value, Circuit) and isinstance(meta, torch.Tensor):
                self._dtypes[id(value)] = meta.dtype

    @property
    def own_name(self) -> str | None:
        """``MODULE.OP`` as made unique, once the op's own node has it."""
        return self._base if self._base_given else None

    def name(self, part: str | None = None) -> str:
        """``MODULE.OP`` for the op's result, ``MODULE.OP.PART`` for a part of it; a second call of
        the same module's op is ``MODULE.OP_1`` with parts ``MODULE.OP_1.PART``."""
        namer = self.translator.namer
        if self._base is None:
            self._base = namer.unique(naming.joined(self.path, self.op))
        if part is not None:
            return namer.unique(f"{self._base}.{part}")
        if not self._base_given:
            self._base_given = True
            return self._base
        return namer.unique(self._base)

    def constant(self, value: float, part: str = "scalar", shape: tuple[int, ...] = ()) -> Circuit:
        """The number ``value`` in this op, ``MODULE.OP.PART``: a Scalar (of the dtype evaluation gives
        Scalars), or an Array of the op's dtype where a Scalar would round it otherwise than torch
        does (``1e-8`` in a float32 op of a float16 model); where Scalars are wider than the dtype
        torch computes the op in, the number is the one torch computes with (``float32(0.3)``)."""
        dtype = self.out_dtype
        if dtype is None or not dtype.is_floating_point:
            return Scalar(float(value), shape=shape, name=self.name(part))
        value = dtypes.as_torch_computes(float(value), dtype, self.translator.dtypes.scalar_dtype)
        if not dtypes.exact_in(value, dtype, self.translator.basis):
            return Array(torch.full(shape, value, dtype=dtype), name=self.name(part))
        return Scalar(value, shape=shape, name=self.name(part))

    def node(self, value: Any) -> Circuit:
        """``value`` as a node: a Python number (a bool too, as torch reads it) is a ``constant``."""
        if isinstance(value, (int, float)):
            return self.constant(float(value))
        return self.translator.circuit(value)

    def dtype_of(self, value: Any) -> torch.dtype | None:
        if isinstance(value, Const):
            return value.tensor.dtype
        return self._dtypes.get(id(value))

    def all_float(self, *values: Any) -> bool:
        """Whether every tensor among ``values`` and the output have the output's floating dtype
        (so an Einsum or Add computes what torch's op does, with no type promotion)."""
        dtype = self.out_dtype
        if dtype is None or not dtype.is_floating_point:
            return False
        return all(self.dtype_of(v) == dtype for v in values if isinstance(v, (Circuit, Const)))
