"""Every model entry point spells out the build options, each defined once in ``ModelOptions``.

``inspect.signature`` (and so ``help()``) shows every option an entry point takes, with
``ModelOptions``'s default, as a keyword-only parameter after ``options``, and no
``**options``.  The expected options are read off ``ModelOptions``'s own fields, so a
field that an entry point neither takes nor lists as not taken (with why) fails here.
"""

from __future__ import annotations

import inspect

import attrs
import pytest

import circuits.models as cm
from circuits.models.common import checked_options
from circuits.models.options import takes_model_options

#: entry point -> the ModelOptions fields it does not take, and why.
ENTRY_POINTS = {
    "build_attn_only": {"rope": "not rotary"},
    "build_gpt2": {"rope": "not rotary"},
    "build_llama": {},
    "build_neox": {"rope": "its rotary tables come from its config"},
    "from_hf": {"rope": "the model's own rotary tables are used"},
    "from_hf_state_dict": {},
    "load_hf_checkpoint": {
        "attach": "the weights read are the circuit's own",
        "rope": "computed from config.json",
    },
    "load_demo_model": {"rope": "not rotary"},
    "from_transformer_lens": {"rope": "computed from the cfg's rotary_base"},
    "build_bert": {"convention": "all inputs", "causal": "bidirectional", "rope": "learned positions"},
    "from_hf_bert": {"convention": "all inputs", "causal": "bidirectional", "rope": "learned positions"},
    "load_sentence_transformer": {
        "convention": "all inputs",
        "causal": "bidirectional",
        "rope": "learned positions",
        "attach": "the weights read are the circuit's own",
    },
}

FIELDS = attrs.fields(cm.ModelOptions)


def test_the_options_are_the_eight_build_keywords():
    assert [f.name for f in FIELDS] == [
        "seq_len",
        "batch_size",
        "convention",
        "causal",
        "neg_inf",
        "rope",
        "attach",
        "tokenizer",
    ]
    assert cm.ModelOptions().causal is True


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_entry_points_spell_out_the_options(name):
    not_taken = ENTRY_POINTS[name]
    params = inspect.signature(getattr(cm, name)).parameters
    assert not [p for p in params.values() if p.kind is p.VAR_KEYWORD], f"{name} still shows **options"
    options = params["options"]
    assert options.default is None and options.kind is options.POSITIONAL_OR_KEYWORD
    for field in FIELDS:
        if field.name in not_taken:
            assert field.name not in params, f"{name} takes {field.name!r}, listed as not taken"
            continue
        param = params[field.name]
        assert param.kind is param.KEYWORD_ONLY, (name, field.name)
        assert repr(param.default) == repr(field.default), (name, field.name)
        assert param.annotation == field.type, (name, field.name)


@pytest.mark.parametrize("name", [name for name in ENTRY_POINTS if "causal" not in ENTRY_POINTS[name]])
def test_one_causal_default_everywhere(name):
    assert inspect.signature(getattr(cm, name)).parameters["causal"].default is True


def test_takes_model_options_refuses_a_function_without_options_or_with_kwargs():
    with pytest.raises(TypeError, match="needs a parameter options"):

        @takes_model_options()
        def no_options(path, tokens=None):
            return path

    with pytest.raises(TypeError, match="needs a parameter options"):

        @takes_model_options()
        def forwards(path, options=None, **more):
            return more


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
