"""``ScrubbedExperiment``: a scrubbed circuit and what it was scrubbed with; ``ExperimentEvalSettings``.

rust_circuit's names and arguments.  A scrubbed circuit built on one example (rust_circuit's way)
holds its inputs as ``DiscreteVar``s of the experiment's group, the reference examples as their
values; ``evaluate`` runs it on all of them, as rust_circuit's ``run_on_all=True``: every variable
of the group becomes its values, a batch axis in front (``circuits.rewriting.batching.expand``), so row ``i``
is the circuit run on reference example ``i``'s draws.  A batched circuit has the reference rows
as its batch axis already and no variables.  Either way the group's probabilities play no part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import attrs
import torch

from circuits.rewriting.batching import expand
from circuits.causal_scrubbing.correspondence import Correspondence
from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.hypothesis import SampledInputs
from circuits.errors import CausalScrubbingError, shown
from circuits.evaluation.leaves import check_device
from circuits.rewriting.matching import Matcher, are_any_found
from circuits.core.nodes import Circuit, DiscreteVar

if TYPE_CHECKING:  # only annotations here
    from circuits.text.print_options import PrintOptions

__all__ = ["ExperimentEvalSettings", "ScrubbedExperiment", "run_on_all"]


def _checked_device_dtype(device_dtype: Any) -> tuple[torch.device | None, torch.dtype | None]:
    """``device_dtype`` (None, a device, or a ``(device, dtype)`` pair; a dtype may be named, as
    ``"float32"``) as a pair, or an error naming it: a device torch does not know or does not
    have here, or a dtype that is not a floating one (evaluation casts floating tensors only)."""
    if device_dtype is None:
        return None, None
    if isinstance(device_dtype, (str, torch.device)):
        device, dtype = device_dtype, None
    elif isinstance(device_dtype, (tuple, list)) and len(device_dtype) == 2:
        device, dtype = device_dtype
    else:
        raise CausalScrubbingError(
            "ExperimentEvalSettings: device_dtype must be None, a device or a (device, dtype) pair, "
            f"got {shown(repr(device_dtype))}"
        )
    return _checked_device(device), _checked_dtype(dtype)


def _checked_device(device: Any) -> torch.device | None:
    return check_device(device, "ExperimentEvalSettings: device_dtype", CausalScrubbingError)


def _checked_dtype(dtype: Any) -> torch.dtype | None:
    if dtype is None:
        return None
    named = getattr(torch, dtype.removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if not isinstance(named, torch.dtype) or not named.is_floating_point:
        raise CausalScrubbingError(
            f"ExperimentEvalSettings: device_dtype's dtype {shown(repr(dtype))} is not a floating torch dtype"
        )
    return named


class ExperimentEvalSettings:
    """How ``ScrubbedExperiment.evaluate`` runs, with rust_circuit's arguments.

    ``device_dtype``: a device (a str or ``torch.device``) or a ``(device, dtype)`` pair, either
    part None for the default, the dtype a floating one (a ``torch.dtype`` or its name); checked
    here, so a mistake is met where it is made.  ``optimize`` and ``optim_settings`` are accepted
    and have no effect (our evaluator has no separate optimiser).  rust_circuit's batching and
    sampling options (``batch_size``, ``run_on_all=False``, ``num_samples``) are not supported:
    anything but their defaults raises, rather than being silently ignored.  Every reference
    example is run once, in order.
    """

    def __init__(
        self,
        optimize: bool = True,
        optim_settings: Any = None,
        batch_size: int | None = None,
        run_on_all: bool = True,
        num_samples: int | None = None,
        device_dtype: Any = None,
    ):
        unsupported = {"batch_size": batch_size, "num_samples": num_samples}
        for name, value in unsupported.items():
            if value is not None:
                raise CausalScrubbingError(
                    f"ExperimentEvalSettings: {name}={value!r} is not supported (give None)"
                )
        if run_on_all is not True:
            raise CausalScrubbingError("ExperimentEvalSettings: only run_on_all=True is supported")
        self.optimize, self.optim_settings = optimize, optim_settings
        self.device_dtype = _checked_device_dtype(device_dtype)


def run_on_all(circuit: Circuit, group: Circuit) -> Circuit:
    """``circuit`` with every ``DiscreteVar`` of ``group`` (its ``probs_and_group``) replaced by its
    values, a batch axis in front: rust_circuit's ``RunDiscreteVarAllSpec([group])``."""
    in_group = Matcher.from_predicate(
        lambda node: isinstance(node, DiscreteVar) and node.probs_and_group.hash == group.hash,
        "Matcher(DiscreteVar of the group)",
    )
    if not are_any_found(circuit, in_group):
        return circuit
    return expand(circuit, {in_group: lambda var: var.values})


@attrs.define(frozen=True)
class ScrubbedExperiment:
    """The scrubbed circuit, the reference data, what was sampled for each node, and the group
    (rust_circuit's fields, in its order)."""

    circuit: Circuit
    ref_ds: Dataset
    sampled_inputs: SampledInputs
    group: Circuit
    seed: int
    nodes: Correspondence

    def evaluate(
        self, eval_settings: ExperimentEvalSettings | None = None, *, evaluator=None
    ) -> torch.Tensor:
        """The scrubbed circuit's value, one row per reference example (through ``evaluator``, a
        ``cc.Evaluator``, when given, so what earlier runs computed is reused)."""
        settings = eval_settings or ExperimentEvalSettings()
        if not isinstance(settings, ExperimentEvalSettings):
            raise CausalScrubbingError(
                f"evaluate: eval_settings must be an ExperimentEvalSettings, got {type(settings).__name__}"
            )
        device, dtype = settings.device_dtype
        circuit = run_on_all(self.circuit, self.group)
        if evaluator is not None:
            return evaluator.evaluate(circuit, device=device, dtype=dtype)
        return circuit.evaluate(device=device, dtype=dtype)

    def print(
        self,
        options: PrintOptions | Mapping[str, Any] | None = None,
        print_data: bool = True,
        color_by_data: bool = True,
        repr: bool = False,
        datum_idx: int = 0,
        show_inputs: bool = False,
    ):
        """Print the scrubbed circuit down to the mapped nodes (``show_inputs``: and down to every
        input outside the mapped leaves), each mapped node commented with its interpretation node
        and samplers, each input with whose data it is (colours by dataset); ``repr=True``
        returns the text, without colours.  ``options`` comes first, as rust_circuit's print
        options do: None, a ``cc.PrintOptions`` or a mapping of its keywords (``causal_scrubbing.printing``)."""
        from circuits.causal_scrubbing.printing import scrubbed_repr

        text = scrubbed_repr(
            self,
            options,
            print_data=print_data,
            color_by_data=color_by_data,
            datum_idx=datum_idx,
            color=not repr,
            show_inputs=show_inputs,
        )
        if repr:
            return text
        print(text)
        return None
