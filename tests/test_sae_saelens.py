"""load_sae against SAELens's own files and numbers (tests/data/sae, written by SAELens 6.54.12 with
scripts/saelens_reference.py in a venv of its own: SAELens needs TransformerLens < 4), and the
refusals of what is not read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from circuits.errors import SAEError
from circuits.experiments.sae import splice_sae
from circuits.models.sae import load_sae, save_sae
from circuits.transformer.points import Point
from factories import gpt2_circuit

DATA = Path(__file__).parent / "data" / "sae"
NAMES = [
    "standard",
    "jumprelu",
    "topk",
    "topk_plain",
    "standard_no_b_dec",
    "transcoder",
    "jumprelu_transcoder",
]


def test_fixtures_are_saelens_6():
    versions = json.loads((DATA / "versions.json").read_text())
    assert set(versions["sae_lens"]) == set(NAMES)
    assert all(version.startswith("6.") for version in versions["sae_lens"].values())


@pytest.mark.parametrize("name", NAMES)
def test_encode_and_decode_equal_saelens(name):
    sae = load_sae(DATA / name)
    reference = load_file(str(DATA / name / "reference.safetensors"))
    acts = sae.encode(reference["x"])
    assert (reference["acts"] != 0).any() and (reference["acts"] == 0).any()
    torch.testing.assert_close(acts, reference["acts"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sae.decode(acts), reference["recon"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_the_spliced_nodes_equal_saelens(name):
    """The spliced circuit computes what SAELens does: the SAE spliced into a model circuit, the node
    it reads replaced by SAELens's input, and its features and reconstruction read as Points."""
    import circuits as cc
    import circuits.experiments as ex

    sae = load_sae(DATA / name)
    reference = load_file(str(DATA / name / "reference.safetensors"))  # x: [3, 5, 12]
    spliced = splice_sae(gpt2_circuit(torch.zeros(3, 6, dtype=torch.int64)), sae)
    out = sae.point_out()
    read = sae.point() if sae.is_transcoder else Point(f"{out.kind}.sae_input", out.layer)
    node = spliced.get_unique(read)
    fed = spliced.replace({node: cc.Array(reference["x"], node.name)})
    acts, recon = (Point(f"{out.kind}.sae_{part}", out.layer) for part in ("acts", "recon"))
    cache = ex.run_with_cache(fed, [acts, recon])
    torch.testing.assert_close(cache[acts], reference["acts"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache[recon], reference["recon"], atol=1e-5, rtol=1e-5)


def test_config_and_points():
    standard, transcoder = load_sae(DATA / "standard"), load_sae(DATA / "transcoder")
    assert (standard.architecture, standard.d_in, standard.d_sae, standard.k) == ("standard", 12, 20, None)
    assert standard.point() == Point("resid_pre", 1) and standard.point_out() == Point("resid_pre", 1)
    assert transcoder.is_transcoder and not transcoder.apply_b_dec_to_input
    assert (transcoder.point(), transcoder.point_out()) == (Point("ln2", 0), Point("mlp_out", 0))
    assert load_sae(DATA / "topk").k == 4


def test_transcoder_splice_keeps_value_and_replaces_the_mlp():
    tokens = torch.randint(0, 17, (2, 6), generator=torch.Generator().manual_seed(0))
    circuit = gpt2_circuit(tokens)
    transcoder = load_sae(DATA / "transcoder")
    torch.testing.assert_close(
        splice_sae(circuit, transcoder).evaluate(), circuit.evaluate(), atol=1e-5, rtol=1e-5
    )
    import circuits.experiments as ex

    cache = ex.run_with_cache(circuit, [Point("ln2", 0)])
    substituted = ex.run_with_cache(splice_sae(circuit, transcoder, error=False), [Point("mlp_out", 0)])
    expected = transcoder_reference(transcoder, cache[Point("ln2", 0)])
    torch.testing.assert_close(substituted[Point("mlp_out", 0)], expected, atol=1e-5, rtol=1e-5)


def transcoder_reference(sae, x):
    pre = x @ sae.W_enc + sae.b_enc
    return pre.clamp(min=0) @ sae.W_dec + sae.b_dec


def test_save_sae_round_trips(tmp_path):
    for name in NAMES:
        sae = load_sae(DATA / name)
        again = load_sae(save_sae(sae, tmp_path / name))
        reference = load_file(str(DATA / name / "reference.safetensors"))
        torch.testing.assert_close(
            again.decode(again.encode(reference["x"])), reference["recon"], atol=1e-5, rtol=1e-5
        )


def copy_with(tmp_path, name="standard", config=None, weights=None) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(DATA / name, folder)
    if config is not None:
        (folder / "cfg.json").write_text(json.dumps(config(json.loads((folder / "cfg.json").read_text()))))
    if weights is not None:
        save_file(
            weights(load_file(str(folder / "sae_weights.safetensors"))),
            str(folder / "sae_weights.safetensors"),
        )
    return folder


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda c: c | {"architecture": "gated"}, "architecture"),
        (lambda c: c | {"architecture": "matryoshka_batchtopk"}, "architecture"),
        (lambda c: c | {"frobnicate": 1}, "frobnicate"),
        (lambda c: c | {"normalize_activations": "layer_norm"}, "normalize_activations"),
        (lambda c: c | {"reshape_activations": "hook_z"}, "reshape_activations"),
        (lambda c: c | {"k": 3}, "k"),
        (lambda c: c | {"dtype": "int8"}, "dtype"),
        (lambda c: c | {"d_sae": 21}, "W_dec"),
    ],
)
def test_unknown_or_unread_config_is_refused_by_name(tmp_path, edit, field):
    folder = copy_with(tmp_path, config=edit)
    with pytest.raises(SAEError) as caught:
        load_sae(folder)
    assert (
        caught.value.field in (field, "W_enc", "b_enc") if field == "W_dec" else caught.value.field == field
    )
    assert str(folder) in str(caught.value)


def test_unknown_or_missing_weights_are_refused_by_name(tmp_path):
    folder = copy_with(tmp_path, weights=lambda w: w | {"W_skip": torch.zeros(12, 12)})
    with pytest.raises(SAEError) as caught:
        load_sae(folder)
    assert caught.value.unexpected_keys == ["W_skip"]
    folder = copy_with(
        tmp_path / "b", name="jumprelu", weights=lambda w: {k: v for k, v in w.items() if k != "threshold"}
    )
    with pytest.raises(SAEError) as caught:
        load_sae(folder)
    assert caught.value.missing_keys == ["threshold"]


def test_saelens_5_configs_are_read(tmp_path):
    """A 5.x config: hook_point at the top level, activation_fn 'topk' with its k, training fields."""

    def old(config):
        return {
            "d_in": 12,
            "d_sae": 20,
            "hook_point": "blocks.0.hook_resid_post",
            "hook_point_layer": 0,
            "activation_fn": "topk",
            "activation_fn_kwargs": {"k": 3},
            "l1_coefficient": 8e-5,
            "lr": 4e-4,
            "dtype": "torch.float32",
            "apply_b_dec_to_input": True,
        }

    sae = load_sae(copy_with(tmp_path, name="topk_plain", config=old))
    assert (sae.architecture, sae.k, sae.point()) == ("topk", 3, Point("resid_post", 0))
    reference = load_file(str(DATA / "topk_plain" / "reference.safetensors"))
    torch.testing.assert_close(sae.encode(reference["x"]), reference["acts"], atol=1e-5, rtol=1e-5)


def test_missing_files_are_refused(tmp_path):
    with pytest.raises(SAEError, match="cfg.json"):
        load_sae(tmp_path)
