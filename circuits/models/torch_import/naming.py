"""Names of imported nodes: the module that ran the op, then the op, unique in the circuit.

``transformer.h.0.attn.c_attn.addmm`` is the ``addmm`` that
``transformer.h.0.attn.c_attn`` ran; a second one in the same module is
``...addmm_1``.  Parts of an op written out as several nodes (a layer norm's
mean, an attention's scores) are ``MODULE.OP.PART``.
"""

from __future__ import annotations

from typing import Any


def module_path(fx_node: Any) -> str:
    """The innermost module the export's ``nn_module_stack`` records for ``fx_node`` ('' at the top)."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return str(path)


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
