"""ex.sae.reconstruction_metrics against SAELens 6.54.12's own numbers: its ``evals.run_evals`` on a
tiny TransformerLens 3 model with SAEs of tests/data/sae, the model's weights, tokens and numbers
written by scripts/saelens_metrics_reference.py (in a venv with SAELens), read here with
``from_transformer_lens`` and ``load_sae``; and against torch written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

import circuits.experiments as ex
import circuits.models as cm
from circuits.errors import SAEError
from circuits.models.sae import load_sae

DATA = Path(__file__).parent / "data" / "sae"
SAELENS = json.loads((DATA / "metrics" / "saelens_metrics.json").read_text())
TOL = 1e-5  # relative to the number (absolute below 1)
EXCLUDED = {"exclude_bos": [0], "exclude_none": []}
NOT_HERE = {"explained_variance_legacy", "relative_reconstruction_bias"}  # per batch in SAELens


def circuit(convention: str = "prompt"):
    state = load_file(str(DATA / "metrics" / "model.safetensors"))
    tokens = load_file(str(DATA / "metrics" / "tokens.safetensors"))["tokens"]
    return cm.from_transformer_lens(state, tokens, family="gpt2", convention=convention)


@pytest.fixture(scope="module")
def model_circuit():
    return circuit()


def test_the_reference_is_saelens_6():
    assert SAELENS["versions"]["sae_lens"].startswith("6.") and set(SAELENS["metrics"]) == {
        "standard",
        "jumprelu",
        "topk",
    }


@pytest.mark.parametrize("name", ["standard", "jumprelu", "topk"])
@pytest.mark.parametrize("excluded", list(EXCLUDED))
def test_metrics_equal_saelens(model_circuit, name, excluded):
    ours = ex.sae.reconstruction_metrics(
        model_circuit, load_sae(DATA / name), ignore_tokens=EXCLUDED[excluded]
    )
    theirs = SAELENS["metrics"][name][excluded]
    compared = (
        set(theirs) - NOT_HERE - {"total_tokens_eval_reconstruction", "total_tokens_eval_sparsity_variance"}
    )
    assert set(ours) == compared
    for metric in sorted(compared):
        assert abs(ours[metric] - theirs[metric]) <= TOL * max(1.0, abs(theirs[metric])), (
            metric,
            ours[metric],
            theirs[metric],
        )


def test_the_scores_differ_between_exclusions():
    """The exclusion matters (else the BOS test would not test it)."""
    bos, none = (SAELENS["metrics"]["standard"][e] for e in EXCLUDED)
    assert abs(bos["ce_loss_score"] - none["ce_loss_score"]) > 0.1 and bos["l0"] != none["l0"]


def test_the_default_convention_scores_the_same_next_tokens():
    """Built with targets (``[S+1]`` tokens: logits for the first S), the cross-entropies are the
    same positions' as SAELens's on the tokens; the loss without the SAE is the circuit's own."""
    default = circuit("default")
    ours = ex.sae.reconstruction_metrics(default, load_sae(DATA / "standard"), ignore_tokens=[0])
    theirs = SAELENS["metrics"]["standard"]["exclude_bos"]
    for metric in ("ce_loss_without_sae", "ce_loss_with_sae", "ce_loss_with_ablation", "ce_loss_score"):
        assert abs(ours[metric] - theirs[metric]) <= TOL * max(1.0, abs(theirs[metric])), metric
    unmasked = ex.sae.reconstruction_metrics(default, load_sae(DATA / "standard"))
    loss = default.get_unique("t.loss").evaluate()
    assert unmasked["ce_loss_without_sae"] == pytest.approx(float(loss.mean()), rel=1e-6)


def test_refusals(model_circuit):
    with pytest.raises(SAEError, match="not a circuits SAE"):
        ex.sae.reconstruction_metrics(model_circuit, object())
    with pytest.raises(SAEError, match="token ids"):
        ex.sae.reconstruction_metrics(model_circuit, load_sae(DATA / "standard"), ignore_tokens=[[0, 1]])
