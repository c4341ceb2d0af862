"""SAELens's own reconstruction metrics, for tests/test_sae_metrics.py (run in a venv with sae-lens).

As scripts/saelens_reference.py, this runs in a venv of its own (SAELens pins TransformerLens < 4):

    /tmp/sae-venv/bin/python scripts/saelens_metrics_reference.py tests/data/sae

It builds a tiny TransformerLens 3 ``HookedTransformer`` (GPT-2's layout: d_model 12, 2 layers of
3 heads, d_mlp 20, vocabulary 17, context 16) with seeded random weights, and runs SAELens's
``evals.run_evals`` (every metric, ``get_eval_everything_config``) with three of the SAEs in
``tests/data/sae`` (read with SAELens's ``SAE.load_from_disk``) on fixed token batches, twice:
excluding token 0 (the BOS here) as a special token, and excluding none.  ``run_evals`` takes an
``ActivationsStore`` only for ``get_batch_tokens``, ``store_batch_size_prompts``,
``context_size`` and ``reset_input_dataset``: a store of the fixed batches stands in for it (no
dataset, nothing downloaded).  Written to ``<out>/metrics/``: ``model.safetensors`` (the model's
state dict, TransformerLens's layout), ``tokens.safetensors`` (``[8, 8]``, two batches of 4) and
``saelens_metrics.json`` (SAELens's numbers, by SAE and exclusion, and the versions).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

SAES = (
    "standard",
    "jumprelu",
    "topk",
)  # blocks.1.hook_resid_pre, blocks.0.hook_mlp_out, blocks.1.hook_resid_mid
BATCHES, BATCH_SIZE, CONTEXT, BOS = 2, 4, 8, 0


class FixedBatches:
    """The parts of SAELens's ``ActivationsStore`` that ``run_evals`` reads, over fixed batches."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens
        self.store_batch_size_prompts = BATCH_SIZE
        self.context_size = CONTEXT
        self.next = 0

    def get_batch_tokens(self, batch_size: int) -> torch.Tensor:
        batch = self.tokens[self.next : self.next + batch_size]
        assert batch.shape[0] == batch_size, "more batches asked for than made"
        self.next += batch_size
        return batch

    def reset_input_dataset(self) -> None:
        self.next = 0


def model():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=12,
        n_heads=3,
        d_head=4,
        d_mlp=20,
        d_vocab=17,
        n_ctx=16,
        act_fn="gelu_new",
        normalization_type="LN",
        seed=0,
        device="cpu",
    )
    tl = HookedTransformer(cfg)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every weight (biases and norms too), so wiring mistakes show
        for _, parameter in tl.named_parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return tl.eval()


def tokens() -> torch.Tensor:
    generator = torch.Generator().manual_seed(2)
    found = torch.randint(1, 17, (BATCHES * BATCH_SIZE, CONTEXT), generator=generator)
    found[:, 0] = BOS
    found[1, 5] = BOS  # a special token inside a prompt, too
    return found


def main(out: Path) -> None:
    import sae_lens
    from importlib.metadata import version
    from sae_lens import SAE
    from sae_lens.evals import get_eval_everything_config, run_evals
    from sae_lens.training.activation_scaler import ActivationScaler

    folder = out / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    tl, batch = model(), tokens()
    state = {
        k: v.detach().contiguous() for k, v in tl.state_dict().items() if not k.endswith(("mask", "IGNORE"))
    }
    save_file(state, str(folder / "model.safetensors"))
    save_file({"tokens": batch}, str(folder / "tokens.safetensors"))
    config = get_eval_everything_config(
        batch_size_prompts=BATCH_SIZE,
        n_eval_reconstruction_batches=BATCHES,
        n_eval_sparsity_variance_batches=BATCHES,
    )
    found = {}
    for name in SAES:
        sae = SAE.load_from_disk(str(out / name), device="cpu")
        for label, exclude in (("exclude_bos", [BOS]), ("exclude_none", False)):
            metrics, _ = run_evals(
                sae, FixedBatches(batch), tl, ActivationScaler(), config, exclude_special_tokens=exclude
            )
            flat = {key: value for group in metrics.values() for key, value in group.items()}
            found.setdefault(name, {})[label] = flat
    versions = {"sae_lens": sae_lens.__version__, "transformer_lens": version("transformer_lens")}
    versions["torch"] = torch.__version__
    (folder / "saelens_metrics.json").write_text(
        json.dumps({"versions": versions, "metrics": found}, indent=1)
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/sae"))
