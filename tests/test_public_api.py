"""The public API (issue 29 item 2): small roots, every name in its home, nothing hidden.

``circuits`` holds what a user types daily (at most 49 names: one more, ``PrintOptions``, comes
from another change); every pass is in ``circuits.passes``, every exception class in
``circuits.errors``; ``circuits.experiments`` holds at most 40 names, TransformerLens's patching
grids in ``circuits.experiments.patching_grids``.  A name is importable from a root only if it
is in that root's ``__all__`` (or is a sub-package): no name stays behind by accident.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import circuits as cc
from circuits import experiments as ex
from circuits import models, passes
from circuits.experiments import patching_grids

ROOTS = [cc, ex, passes, models, patching_grids]


def _public(module: types.ModuleType) -> set[str]:
    return {name for name in vars(module) if not name.startswith("_")}


def test_the_roots_are_small():
    assert len(cc.__all__) <= 49
    assert len(ex.__all__) <= 40  # circuit discovery's other names are in ex.discovery, SAEs' in ex.sae


@pytest.mark.parametrize("module", ROOTS, ids=lambda m: m.__name__)
def test_every_name_in_all_exists_once(module):
    assert len(module.__all__) == len(set(module.__all__))
    assert [name for name in module.__all__ if not hasattr(module, name)] == []


@pytest.mark.parametrize("module", [cc, ex], ids=lambda m: m.__name__)
def test_no_hidden_reexports(module):
    """What a root has besides its ``__all__`` is its sub-modules (Python sets them as attributes)."""
    extra = _public(module) - set(module.__all__)
    assert {name: type(getattr(module, name)).__name__ for name in extra} == {
        name: "module" for name in extra
    }


def test_removed_names_are_gone_from_the_roots():
    """A few of the moves (CHANGELOG.md, "Public API"): the old spelling fails, the new one works."""
    for name, home in [
        ("split_heads", passes),
        ("causal_mask", passes),
        ("simplify", passes),
        ("ParseError", cc.errors),
        ("MatchError", cc.errors),
        ("ExperimentError", cc.errors),
        ("zero_ablate", ex),
        ("sweep", ex),
        ("TensorStore", importlib.import_module("circuits.text.store")),
        ("postorder", importlib.import_module("circuits.core.traversal")),
    ]:
        assert not hasattr(cc, name), name
        assert hasattr(home, name), (name, home.__name__)
    for name in [
        "point",
        "ExperimentError",
        "MissingPointError",
        "Evaluator",
        "act_patch_resid_pre",
        "GRIDS",
    ]:
        assert not hasattr(ex, name), name
    assert not hasattr(passes, "PassError") and issubclass(cc.errors.PassError, cc.CircuitError)


def test_the_only_exception_class_at_the_root_is_circuit_error():
    exceptions = [name for name in cc.__all__ if inspect.isclass(getattr(cc, name))]
    exceptions = [name for name in exceptions if issubclass(getattr(cc, name), BaseException)]
    assert exceptions == ["CircuitError"]
    assert not [
        name
        for name in ex.__all__
        if inspect.isclass(getattr(ex, name)) and issubclass(getattr(ex, name), BaseException)
    ]


def test_no_pass_is_at_the_root():
    assert set(passes.__all__) & set(cc.__all__) == set()
    assert set(passes.__all__) & _public(cc) == set()


def test_every_circuit_error_is_defined_in_circuits_errors():
    """Walk every module of the package: each CircuitError subclass is a class of circuits.errors."""
    for info in pkgutil.walk_packages(cc.__path__, "circuits."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, cc.CircuitError):
                assert value.__module__ == "circuits.errors", (info.name, name)
                assert getattr(cc.errors, value.__name__) is value


def test_the_patching_grids_are_in_their_module():
    grids = [name for name in patching_grids.__all__ if name.startswith("act_patch_")]
    sae_grids = [f"act_patch_{grid}" for grid in patching_grids.SAE_GRIDS]
    # one per TransformerLens get_act_patch_* function, and the two over a spliced SAE's features
    assert len(grids) == 17 + 2 and set(sae_grids) <= set(grids)
    assert not [name for name in _public(ex) if name.startswith("act_patch_")]
    assert "patch_grid" in ex.__all__ and ex.patching_grids is patching_grids


def test_resample_ablate_is_patch():
    """One function, two names; both docstrings say so."""
    assert ex.resample_ablate is ex.patch
    assert "resample_ablate" in ex.__doc__ and "resample_ablate" in ex.patching.__doc__


def test_the_sweep_plan_is_a_function_of_its_own():
    assert "dry_run" not in inspect.signature(ex.sweep).parameters
    assert inspect.signature(ex.sweep).return_annotation in ("SweepResult", ex.SweepResult)
    assert inspect.signature(ex.sweep_plan).return_annotation in ("SweepPlan", ex.SweepPlan)


def test_point_is_the_experiments_spot():
    assert ex.Point is importlib.import_module("circuits.transformer.points").Point
    assert "Point" in ex.__all__ and not hasattr(cc, "Point")
