"""Names of imported nodes: the module that ran the op, then the op, unique in the circuit; and the
nodes named after the modules themselves.

``transformer.h.0.attn.c_attn.addmm`` is the ``addmm`` that
``transformer.h.0.attn.c_attn`` ran; a second one in the same module is
``...addmm_1``.  Parts of an op written out as several nodes (a layer norm's
mean, an attention's scores) are ``MODULE.OP.PART``.

Each module's output is also a node of its own, a one-child ``Add`` (the
identity) named by the module's path (``transformer.h.1.mlp``), so that a
printed import, ``overview`` and the per-module tables read as the model
does; a second call of the module is ``PATH@1`` (torch's own spelling of a
call, in the export's ``nn_module_stack``), a module returning several
tensors names them ``PATH.out0``, ``PATH.out1``, ...
"""

from __future__ import annotations

from typing import Any

from circuits.core.nodes import Add, Circuit


def module_path(fx_node: Any) -> str:
    """The innermost module the export's ``nn_module_stack`` records for ``fx_node`` ('' at the top)."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return str(path)


def module_calls(fx_node: Any) -> list[tuple[str, str]]:
    """``(call key, module path)`` of each module call ``fx_node`` ran in, outermost first, the top
    module left out (its output is the circuit's root)."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    return [(str(key), str(path)) for key, (path, _) in stack.items() if path]


def call_name(key: str, path: str) -> str:
    """``path`` for a module's first call, ``path@N`` for its call N (the key's ``@N``)."""
    _, at, count = key.rpartition("@")
    return f"{path}@{count}" if at and count.isdigit() else path


def module_outputs(graph: Any) -> dict[Any, list[tuple[str, str]]]:
    """fx node -> ``(call key, node name)`` of each module call it is an output of, innermost first: a
    value a node outside the call uses (or the graph's output)."""
    outputs: dict[str, list[Any]] = {}
    paths: dict[str, str] = {}
    for fx_node in graph.nodes:
        if fx_node.op != "call_function":
            continue
        for key, path in module_calls(fx_node):
            users_outside = any(
                user.op == "output" or key not in (user.meta.get("nn_module_stack") or {})
                for user in fx_node.users
            )
            if users_outside:
                outputs.setdefault(key, []).append(fx_node)
                paths[key] = path
    result: dict[Any, list[tuple[str, str]]] = {}
    for key, nodes in outputs.items():
        base = call_name(key, paths[key])
        for position, fx_node in enumerate(nodes):
            name = base if len(nodes) == 1 else f"{base}.out{position}"
            result.setdefault(fx_node, []).append((key, name))
    for fx_node, calls in result.items():
        depth = {key: position for position, (key, _) in enumerate(module_calls(fx_node))}
        calls.sort(key=lambda call: -depth.get(call[0], -1))
    return result


def module_output_name(node: Circuit) -> str | None:
    """The module path a node an import names after a module has (a one-child Add), or None."""
    if type(node) is Add and len(node.children) == 1 and node.name is not None:
        return node.name
    return None


def op_name(fx_node: Any) -> str:
    """``addmm`` for ``aten.addmm.default``; the fx node's own name for anything else."""
    packet = getattr(fx_node.target, "overloadpacket", None)
    return packet.__name__ if packet is not None else fx_node.name


class Namer:
    """Hands out names, each once: a taken name gets ``_1``, ``_2``, ... (``add``, ``add_1``)."""

    def __init__(self, taken: set[str] | None = None):
        self.taken: set[str] = set(taken or ())
        self.counts: dict[str, int] = {}

    def unique(self, base: str) -> str:
        if base not in self.taken:
            self.taken.add(base)
            return base
        count = self.counts.get(base, 0)
        while True:
            count += 1
            name = f"{base}_{count}"
            if name not in self.taken:
                self.counts[base] = count
                self.taken.add(name)
                return name


def joined(*parts: str) -> str:
    """``a.b.c`` from the non-empty parts (the root module's path is '')."""
    return ".".join(part for part in parts if part)
