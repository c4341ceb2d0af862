"""The loaders spell out the builder options they pass on.

``inspect.signature`` (and so ``help()``) shows every option a loader
forwards, with the builder's default, and no ``**options``.  The expected
options are read off the builders' own signatures, so a builder gaining an
option that a loader does not spell out fails here.
"""

from __future__ import annotations

import inspect

import pytest

import circuits.models as cm
from circuits.models.common import checked_options

#: loader -> (the builders it calls, the builder options it does not take, and why).
LOADERS = {
    "from_hf": ((cm.build_gpt2, cm.build_llama), {"rope": "the model's own rotary tables are used"}),
    "from_hf_state_dict": ((cm.build_gpt2, cm.build_llama), {}),
    "load_hf_checkpoint": (
        (cm.build_gpt2, cm.build_llama),
        {"attach": "the weights read are the circuit's own", "rope": "computed from config.json"},
    ),
    "load_demo_model": ((cm.build_attn_only,), {}),
    "from_transformer_lens": (
        (cm.build_gpt2, cm.build_attn_only, cm.build_llama, cm.build_neox),
        {"rope": "computed from the cfg's rotary_base"},
    ),
}


def builder_options(builders):
    """``{option: [its parameter in each builder that takes it]}``: the keyword-only parameters."""
    options: dict[str, list[inspect.Parameter]] = {}
    for builder in builders:
        for param in inspect.signature(builder).parameters.values():
            if param.kind is param.KEYWORD_ONLY:
                options.setdefault(param.name, []).append(param)
    return options


@pytest.mark.parametrize("name", list(LOADERS))
def test_loaders_spell_out_the_builder_options(name):
    builders, not_taken = LOADERS[name]
    params = inspect.signature(getattr(cm, name)).parameters
    assert not [p for p in params.values() if p.kind is p.VAR_KEYWORD], f"{name} still takes **options"
    options = builder_options(builders)
    assert {"seq_len", "causal", "neg_inf", "attach"} <= set(options)
    assert set(not_taken) <= set(options), "an exemption for an option no builder has"
    for option, in_builders in options.items():
        if option in not_taken:
            assert option not in params, f"{name} takes {option!r}, listed as not taken"
            continue
        assert option in params, f"{name} does not spell out the builder option {option!r}"
        param = params[option]
        assert param.kind is param.KEYWORD_ONLY, (name, option)
        defaults = {repr(p.default) for p in in_builders}
        if len(defaults) == 1:  # the families agree: the same default and annotation
            assert repr(param.default) == defaults.pop(), (name, option)
            assert {p.annotation for p in in_builders} == {param.annotation}, (name, option)
        else:  # the families differ: None stands for the family's default
            assert param.default is None, (name, option)
            assert param.annotation.endswith("| None"), (name, option)


def test_family_defaults_differ_only_in_causal():
    options = builder_options((cm.build_gpt2, cm.build_attn_only))
    differing = [o for o, ps in options.items() if len({repr(p.default) for p in ps}) > 1]
    assert differing == ["causal"]


def test_checked_options_lists_the_signature_and_refuses_kwargs():
    @checked_options()
    def load(path, tokens=None, *, seq_len=None, causal=True):
        return seq_len, causal

    assert load("p", seq_len=3) == (3, True)
    with pytest.raises(
        cm.ModelError, match=r"'cause' \(did you mean 'causal'\?\); accepted: tokens, seq_len, causal"
    ):
        load("p", cause=False)
    with pytest.raises(TypeError, match=r"\*\*kwargs"):

        @checked_options()
        def forwards(path, **options):
            return options
