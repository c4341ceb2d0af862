"""The shipped SAE (``scripts/train_sae.py``): it loads, and it reconstructs what the script said.

The expected figures are the script's own report (``training.json``), recomputed here on the
same held-out rows: the explained variance and L0 in plain torch from the activations (an
independent reference for ``reconstruction_metrics``), and every metric against the report and
against bounds that say the SAE is trained (a random one's explained variance is far below 0).
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

from circuits import experiments as ex
from circuits.errors import ModelError
from circuits.models import demo_model
from circuits.models.demo_model import BOS, DEMO_SAE_FOLDER, load_demo_model, load_demo_sae, repeated_tokens
from circuits.transformer.points import Point


@pytest.fixture(scope="module")
def report():
    folder = resources.files("circuits").joinpath("data", DEMO_SAE_FOLDER)
    return json.loads(folder.joinpath("training.json").read_text())


@pytest.fixture(scope="module")
def held_out(report):
    """The rows the script scored: its held-out generator (seed + 1), the task's block lengths."""
    settings, task = report["settings"], demo_model.demo_info()["task"]
    generator = torch.Generator().manual_seed(settings["seed"] + 1)
    count = settings["eval_rows"]
    lengths = torch.randint(task["min_block"], task["max_block"] + 1, (count,), generator=generator)
    return repeated_tokens(count, lengths, task["seq_len"], generator=generator)


def test_the_shipped_sae_is_a_topk_sae_on_layer_0s_attention_output(report):
    sae = load_demo_sae()
    assert (sae.architecture, sae.k, sae.d_in, sae.d_sae) == ("topk", 4, 64, 128)
    assert sae.point() == Point("attn_out", 0)
    assert report["settings"]["hook"] == sae.hook_name == "blocks.0.hook_attn_out"


def test_its_reconstruction_is_what_the_script_reported(report, held_out):
    sae, reported = load_demo_sae(), report["metrics"]
    circuit = load_demo_model(held_out)
    found = ex.sae.reconstruction_metrics(circuit, sae, ignore_tokens=[BOS])
    for name, value in found.items():
        assert value == pytest.approx(reported[name], rel=1e-4, abs=1e-5), name
    # the explained variance and L0 in plain torch, from the activations at the SAE's point
    x = ex.run_with_cache(circuit, [sae.point()])[sae.point()][held_out[:, :-1] != BOS]
    acts = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    top = acts.topk(4, dim=-1)
    acts = torch.zeros_like(acts).scatter(-1, top.indices, top.values.relu())
    x_hat = acts @ sae.W_dec + sae.b_dec
    variance = (x - x.mean(0)).pow(2).sum(-1).mean()
    explained = 1 - (x - x_hat).pow(2).sum(-1).mean() / variance
    assert float(explained) == pytest.approx(found["explained_variance"], abs=1e-4)
    assert float((acts != 0).sum(-1).float().mean()) == pytest.approx(found["l0"])
    # trained: most of the variance, and the induction loss nearly as without it
    assert found["explained_variance"] > 0.9 and found["l0"] == 4
    assert found["ce_loss_score"] > 0.99 and found["kl_div_with_sae"] < 0.01
    assert reported["dead_fraction"] < 0.3
    assert float((acts != 0).any(0).float().mean()) > 0.6  # latents firing on these 4,032 tokens


def test_a_missing_demo_sae_says_how_to_make_it(monkeypatch):
    monkeypatch.setattr(demo_model, "DEMO_SAE_FOLDER", "no_such_folder")
    with pytest.raises(ModelError, match="train_sae.py"):
        demo_model.load_demo_sae()
