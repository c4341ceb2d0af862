"""``from_torch``: any torch module as a circuit, through ``torch.export`` (see docs/from_torch.md).

One module per job: ``exporting`` runs the export and reads its inputs and
outputs, ``walk`` turns the graph into nodes, ``naming`` names them (and
each module's output), ``dtypes`` keeps each op in torch's dtype, and
the op table (``registry``) is filled by ``ops_arith`` (sums, products,
matmuls), ``ops_shape`` (views, slices, lookups) and ``ops_nn``
(functions, norms, attention); ``shaping`` writes views as Rearranges.
"""

from __future__ import annotations

from typing import Any

import torch

from circuits.errors import ModelError
from circuits.models.common import checked_options
from circuits.models.torch_import import dtypes, exporting
from circuits.models.torch_import.naming import Namer
from circuits.models.torch_import.walk import Translator
from circuits.core.nodes import Array, Circuit


@checked_options()
def from_torch(
    module: Any,
    example_inputs: Any = (),
    example_kwargs: dict | None = None,
    *,
    output: Any = None,
    strict: bool = False,
    attach: bool = False,
    copy: bool = False,
) -> Circuit | list[Circuit]:
    """The circuit ``module(*example_inputs, **example_kwargs)`` computes, for these inputs' shapes.

    Parameters become Arrays named by their module path
    (``transformer.h.0.attn.c_attn.weight``), the tensor inputs Arrays of
    the example values named by argument (``input_ids``: swap them with
    ``update``), each op's nodes ``MODULE.OP`` (``transformer.h.0.attn.c_attn.addmm``),
    and each module's output ``MODULE`` (``transformer.h.0.mlp``); each op evaluates to
    torch's dtype.
    ``output`` picks what the root is when the module returns several
    tensors: None the first (a Hugging Face model's ``logits`` or
    ``last_hidden_state``), a key or index one, a list of them a list of
    circuits.  An op with no translation is kept as an aten GeneralFunction
    (``aten.OP.OVERLOAD(ARGS)``); ``strict=True`` refuses them instead, with
    a ModelError listing each and where it ran.  The parameters' Arrays hold them, detached,
    not copies (an in-place edit of one makes the circuit stale, see ``cc.Array``);
    ``copy=True`` gives them copies instead, and ``attach=True`` keeps the parameters
    themselves (gradients reach them).
    """
    for what, flag in (("strict", strict), ("attach", attach), ("copy", copy)):
        if not isinstance(flag, bool):
            raise ModelError(f"from_torch: {what}={flag!r} is not a bool")
    if attach and copy:
        raise ModelError(
            "from_torch: copy=True with attach=True: an attached parameter is not a copy; choose one",
            "copy",
        )
    args, kwargs = (
        exporting.inputs(module, example_inputs, example_kwargs) if _is_module(module) else ((), {})
    )
    program = exporting.export(module, args, kwargs)
    leaves = exporting.leaves(program, args, kwargs, attach, copy)
    positions = exporting.output_positions(exporting.output_structure(program), output)
    translator, outputs = _translate(program, leaves, type(module).__name__)
    if strict and translator.missing:
        listing = "; ".join(
            f"{op} (in {', '.join(sorted(set(paths)))})" for op, paths in sorted(translator.missing.items())
        )
        raise ModelError(
            f"from_torch(strict=True): {len(translator.missing)} ops have no translation: {listing}"
        )
    if isinstance(positions, list):
        return [_root(translator, outputs, position) for position in positions]
    return _root(translator, outputs, positions)


def _translate(program, leaves: dict, top: str) -> tuple[Translator, list]:
    """The graph walked until the dtype its Scalars evaluate to is the one the walk assumed (the casts
    that keep each op in torch's dtype depend on it), and the dtype its numbers were checked against
    before becoming Scalars (``basis``) is no wider: at most three walks (models.torch_import.dtypes).

    The first walk assumes both are the parameters' and inputs' promoted dtype; a parameter the
    outputs do not use can make that too wide (a second walk checks against what they use), a
    number kept as an Array of a wider dtype too narrow (a walk with the right casts follows)."""
    taken = {value.name for value in leaves.values() if isinstance(value, Circuit)}
    basis = assumed = dtypes.promoted(
        value.value.dtype for value in leaves.values() if isinstance(value, Array)
    )
    for _ in range(3):
        translator = Translator(leaves, Namer(taken), top=top, basis=basis, scalar_dtype=assumed)
        outputs = exporting.user_outputs(program, translator.run(program.graph_module.graph))
        found = dtypes.scalar_dtype([value for value in outputs if isinstance(value, Circuit)])
        if torch.promote_types(basis, found) != found:
            basis = assumed = found  # the same numbers checked against what Scalars will be
        elif found != assumed:
            assumed = found  # the same Scalars and Arrays (same basis), cast for the right dtype
        else:
            return translator, outputs
    raise ModelError(
        f"from_torch: the import's Scalars evaluate to {found} after three walks (the last assumed {assumed})"
    )


def _is_module(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.Module)


def _root(translator: Translator, outputs: list, position: int) -> Circuit:
    value = outputs[position]
    if value is None or isinstance(value, (bool, int, float, str)):
        raise ModelError(f"from_torch: output {position} is {value!r}, not a tensor")
    return translator.circuit(value)


__all__ = ["from_torch"]
