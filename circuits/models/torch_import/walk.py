"""The walk over an exported graph: each fx node in order becomes circuit nodes.

Nodes whose inputs are all known at import time (``arange``, masks built
from shapes, buffers' derived tables) are computed there and then and kept
as ``Const`` values; one becomes an Array (or a Scalar, if every entry is
the same float) only where a computed node uses it.  Everything else goes
through the op table (``registry.OPS``) or, failing that, becomes an aten
GeneralFunction (``circuits.aten_functions``), recorded as untranslated.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping

import torch
import torch.fx

from circuits import aten_functions
from circuits.errors import CircuitError, ModelError
from circuits.models.torch_import import naming
from circuits.models.torch_import.registry import OPS, UNTRANSLATED, Const
from circuits.nodes import Array, Circuit, GeneralFunction, Scalar

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


class Translator:
    """Translates one exported graph; ``missing`` lists the aten ops kept as GeneralFunctions."""

    def __init__(self, leaves: Mapping[str, Any], namer: naming.Namer):
        self.env: dict[torch.fx.Node, Any] = {}
        self.leaves = leaves
        self.namer = namer
        self.wrapped: dict[int, Circuit] = {}  # id(Const) -> its node, so a constant is one node
        self.missing: dict[str, list[str]] = {}  # "aten.op.overload" -> module paths

    def run(self, graph: torch.fx.Graph) -> list[Any]:
        outputs: list[Any] = []
        for fx_node in graph.nodes:
            if fx_node.op == "placeholder":
                self.env[fx_node] = self.leaves[fx_node.name]
            elif fx_node.op == "call_function":
                self.env[fx_node] = self.call(fx_node)
            elif fx_node.op == "output":
                outputs = [
                    self.env[item] if isinstance(item, torch.fx.Node) else item for item in fx_node.args[0]
                ]
            else:
                raise ModelError(
                    f"exported graph node {fx_node.name!r} is a {fx_node.op!r}, which is not supported"
                )
        return outputs

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
        tensor = const.tensor.detach()
        name = self.namer.unique(const.name)
        if tensor.is_floating_point() and tensor.numel() and bool((tensor == tensor.reshape(-1)[0]).all()):
            return Scalar(float(tensor.reshape(-1)[0]), shape=tuple(tensor.shape), name=name)
        return Array(tensor.clone(), name=name)

    def call(self, fx_node: torch.fx.Node) -> Any:
        target = fx_node.target
        args = torch.fx.node.map_arg(fx_node.args, self.env.__getitem__)
        kwargs = torch.fx.node.map_arg(fx_node.kwargs, self.env.__getitem__)
        if target is operator.getitem:
            return args[0][args[1]]
        path, op = naming.module_path(fx_node), naming.op_name(fx_node)
        if not _has_node((args, kwargs)):
            try:
                return _constants(target(*_values(args), **_values(kwargs)), naming.joined(path, op))
            except Exception as error:  # noqa: BLE001 - any torch error, reported with the node
                raise ModelError(
                    f"computing {fx_node.name!r} ({target}) at import time failed: {error}"
                ) from error
        if not isinstance(target, torch._ops.OpOverload):
            raise ModelError(
                f"exported graph node {fx_node.name!r} calls {target!r} (in module {path!r}), which is not an aten op"
            )
        ctx = OpContext(self, fx_node, path, op)
        translate: Callable | None = OPS.get(op)
        try:
            result = UNTRANSLATED if translate is None else translate(ctx, *args, **kwargs)
            if result is UNTRANSLATED:
                result = self.fallback(ctx, fx_node, args, kwargs)
        except ModelError:
            raise
        except (CircuitError, ValueError) as error:  # a translation bug, said with the op it was on
            raise ModelError(
                f"translating {fx_node.name!r} ({target}, in module {path or '<root>'!r}) failed: {error}"
            ) from error
        _check_shapes(fx_node, result)
        return result

    def fallback(self, ctx: OpContext, fx_node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        """The op as an aten GeneralFunction (one per tensor output), recorded as untranslated."""
        target = fx_node.target
        if target.namespace != "aten":
            raise ModelError(
                f"{fx_node.name!r} calls {target}, outside aten, which has no GeneralFunction form"
            )
        self.missing.setdefault(f"aten.{target.overloadpacket.__name__}.{target._overloadname}", []).append(
            ctx.path or "<root>"
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
                raise ModelError(
                    f"{fx_node.name!r} ({target}) has no GeneralFunction form: {error}"
                ) from None
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
                f"translating {fx_node.name!r} ({fx_node.target}) gave {got.describe()} of shape "
                f"{list(got.shape)}, but torch's is {list(shape)}"
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

    def node(self, value: Any) -> Circuit:
        """``value`` as a node: a Python number is a Scalar named ``MODULE.OP.scalar``."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return Scalar(float(value), name=self.name("scalar"))
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
