"""Running torch.export, and reading its program: the leaves of the circuit and its outputs."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind, TensorArgument

from circuits.errors import ModelError, shown
from circuits.models.torch_import.registry import Const
from circuits.core.nodes import Array


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return shown(f"{type(error).__name__}: {text[0] if text else ''}")


def export(module: Any, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    """The module's program for these inputs, functional, its high-level ops (linear, layer_norm,
    attention) kept; any failure a ModelError naming the module and torch's reason."""
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"from_torch: module is a {type(module).__name__}, not a torch.nn.Module")
    name = type(module).__name__
    try:
        with warnings.catch_warnings():  # torch's own deprecation notices, about its own pytree code
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.export.export(module, args, kwargs, strict=False)
            return program.run_decompositions({})
    except Exception as error:  # noqa: BLE001 - torch.export raises many kinds; all are reported
        raise ModelError(
            f"from_torch: torch.export could not export {name} with the example inputs: {_first_line(error)}"
        ) from error


def inputs(module: torch.nn.Module, example_inputs: Any, example_kwargs: Any) -> tuple[tuple, dict]:
    """The call's positional and keyword inputs; a Hugging Face-style ``use_cache`` is turned off
    (a cache object is an output export cannot return, and a circuit is one forward)."""
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if example_kwargs is not None and not isinstance(example_kwargs, Mapping):
        raise ModelError(f"from_torch: example_kwargs is a {type(example_kwargs).__name__}, not a dict")
    kwargs = dict(example_kwargs or {})
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        parameters = {}
    if "use_cache" in parameters and "use_cache" not in kwargs:
        kwargs["use_cache"] = False
    return args, kwargs


def leaves(
    program: torch.export.ExportedProgram, args: tuple, kwargs: dict, attach: bool, copy: bool = False
) -> dict[str, Any]:
    """Placeholder name -> its value: parameters as Arrays named by module path (detached unless
    ``attach``, copied if ``copy``), buffers and lifted constants as Consts of that name, user inputs
    as Arrays of their example values, named by argument."""
    values = list(pytree.tree_leaves((args, kwargs), is_leaf=lambda x: x is None))
    user = iter(values)
    result: dict[str, Any] = {}
    for spec in program.graph_signature.input_specs:
        arg = spec.arg
        if spec.kind == InputKind.PARAMETER:
            tensor = program.state_dict[spec.target]
            tensor = tensor if attach else tensor.detach().clone() if copy else tensor.detach()
            result[arg.name] = Array(tensor, name=spec.target)
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            tensor = program.state_dict.get(spec.target)
            tensor = program.constants[spec.target] if tensor is None else tensor
            result[arg.name] = Const(tensor.detach(), spec.target)
        elif spec.kind == InputKind.USER_INPUT:
            value = next(user)
            if isinstance(arg, TensorArgument):
                result[arg.name] = Array(value.detach().clone(), name=arg.name)
            elif isinstance(arg, ConstantArgument):
                result[arg.name] = arg.value
            else:
                raise ModelError(
                    f"from_torch: input {arg.name!r} is a {type(arg).__name__}, which is not supported"
                )
        else:
            raise ModelError(
                f"from_torch: the program has a {spec.kind.name} input {arg.name!r}, which is not supported"
            )
    return result


def user_outputs(program: torch.export.ExportedProgram, values: list) -> list:
    """The module's own outputs among the graph's (which first lists buffers the forward updates,
    as training-mode batch norm does: the circuit computes the output, not the update)."""
    kinds = [spec.kind for spec in program.graph_signature.output_specs]
    return [value for value, kind in zip(values, kinds) if kind == OutputKind.USER_OUTPUT]


def output_structure(program: torch.export.ExportedProgram) -> Any:
    """The module's output with each tensor replaced by its position among the program's outputs."""
    spec = program.call_spec.out_spec
    return pytree.tree_unflatten(list(range(spec.num_leaves)), spec)


def _first(structure: Any) -> Any:
    while not isinstance(structure, int):
        if isinstance(structure, Mapping) and structure:
            structure = next(iter(structure.values()))
        elif isinstance(structure, (list, tuple)) and structure:
            structure = structure[0]
        else:
            raise ModelError(f"from_torch: the module's output {structure!r} holds no tensor")
    return structure


def output_positions(structure: Any, output: Any) -> list[int] | int:
    """Which outputs ``output`` picks: None the first (a Hugging Face model's logits or
    last_hidden_state), a key or an index one, a list of them several."""
    if isinstance(output, list):
        return [output_positions(structure, item) for item in output]
    if output is None:
        return _first(structure)
    if isinstance(structure, Mapping):
        keys = list(structure)
        if isinstance(output, int) and not isinstance(output, bool) and -len(keys) <= output < len(keys):
            return _first(structure[keys[output]])
        if output in structure:
            return _first(structure[output])
        raise ModelError(f"from_torch: output={output!r} is not one of the module's outputs {keys}")
    if isinstance(structure, (list, tuple)):
        if (
            isinstance(output, int)
            and not isinstance(output, bool)
            and -len(structure) <= output < len(structure)
        ):
            return _first(structure[output])
        raise ModelError(
            f"from_torch: output={output!r} is not an index of the module's {len(structure)} outputs"
        )
    raise ModelError(
        f"from_torch: the module returns one tensor; output={output!r} picks nothing (leave it None)"
    )
