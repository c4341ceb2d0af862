"""SAELens's own files and numbers for tests/test_sae_saelens.py (run in a venv with sae-lens).

SAELens pins TransformerLens < 4 and so cannot share the project's environment; this script runs
in one of its own:

    python -m venv /tmp/sae-venv && /tmp/sae-venv/bin/pip install sae-lens torch==<the project's>
    /tmp/sae-venv/bin/python scripts/saelens_reference.py tests/data/sae

For each architecture it makes a small SAE with seeded random weights with SAELens's own classes,
saves it with SAELens's ``save_model`` (``<out>/<name>/cfg.json`` and ``sae_weights.safetensors``),
and records SAELens's ``encode`` and ``decode`` of a fixed input (``reference.safetensors``:
``x``, ``acts``, ``recon``; ``recon`` of a transcoder is its output at ``hook_name_out``) and the
version read (``versions.json``).  The tests read the files with ``circuits.models.sae.load_sae``
and compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

D_IN, D_SAE = 12, 20  # tests/factories.py's gpt2_config(): d_model 12

SAES = {
    # name: (architecture, config fields, hook_name, hook_name_out)
    "standard": ("standard", {}, "blocks.1.hook_resid_pre", None),
    "jumprelu": ("jumprelu", {}, "blocks.0.hook_mlp_out", None),
    "topk": ("topk", {"k": 4, "rescale_acts_by_decoder_norm": True}, "blocks.1.hook_resid_mid", None),
    "topk_plain": ("topk", {"k": 3}, "blocks.0.hook_resid_post", None),
    "standard_no_b_dec": ("standard", {"apply_b_dec_to_input": False}, "blocks.0.hook_attn_out", None),
    "transcoder": (
        "transcoder",
        {"d_out": D_IN, "apply_b_dec_to_input": False},
        "blocks.0.ln2.hook_normalized",
        "blocks.0.hook_mlp_out",
    ),
    "jumprelu_transcoder": (
        "jumprelu_transcoder",
        {"d_out": D_IN, "apply_b_dec_to_input": False},
        "blocks.1.ln2.hook_normalized",
        "blocks.1.hook_mlp_out",
    ),
}


def make(name: str, seed: int):
    import sae_lens
    from sae_lens.registry import get_sae_class
    from sae_lens.saes.sae import SAEMetadata

    architecture, fields, hook, hook_out = SAES[name]
    sae_class, config_class = get_sae_class(architecture)
    metadata = SAEMetadata(
        hook_name=hook, model_name="tiny-gpt2", **({"hook_name_out": hook_out} if hook_out else {})
    )
    sae = sae_class(config_class(d_in=D_IN, d_sae=D_SAE, metadata=metadata, **fields))
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, value in sae.state_dict().items():
        state[key] = torch.randn(value.shape, generator=generator) * (0.5 if key.startswith("b_") else 1.0)
        if key == "threshold":
            state[key] = torch.rand(value.shape, generator=generator) * 1.5
    sae.load_state_dict(state)
    return sae, sae_lens.__version__


def main(out: Path) -> None:
    versions = {}
    for seed, name in enumerate(SAES):
        sae, version = make(name, seed)
        versions[name] = version
        folder = out / name
        sae.save_model(folder)
        x = torch.randn(3, 5, D_IN, generator=torch.Generator().manual_seed(100 + seed)) * 2
        with torch.no_grad():
            acts = sae.encode(x)
            recon = sae.decode(acts)
        save_file({"x": x, "acts": acts, "recon": recon.contiguous()}, str(folder / "reference.safetensors"))
    (out / "versions.json").write_text(
        json.dumps({"sae_lens": versions, "torch": torch.__version__}, indent=1)
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/sae"))
