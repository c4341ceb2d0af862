"""Compare our EAP scores with auto-circuit's on the same tiny TransformerLens model.

    .venv/bin/python scripts/compare_auto_circuit.py     # prints the comparison

auto-circuit (``auto-circuit`` on the package index, 1.0.1) needs TransformerLens 2, while the
project's venv has TransformerLens 4: it runs in a venv of its own (``--venv``, default
/tmp/ac-venv), made when missing with ``pip install torch==<this torch> auto-circuit
"transformer-lens>=2,<3" "pyarrow<17" "datasets<3"`` (the last two pins: pip's newest pyarrow
wants numpy 2, which TransformerLens 2 does not allow, and the newest datasets wants a newer
pyarrow).  Stage one, there: a seeded random 2-layer ``HookedTransformer`` (3 heads, an MLP,
layer norms), auto-circuit's EAP (``mask_gradient_prune_scores`` with ``mask_val=0``,
``grad_function="logit"``, ``answer_function="avg_val"``: its documented equivalent of
``edge_attribution_patching_prune_scores``) with resample ablation from the corrupted prompts;
the weights and scores go to a ``.pt`` file.  Stage two, here: the same state dict through
``circuits.models.from_transformer_lens``, ``ex.edge_attribution`` with the metric auto-circuit
differentiates (minus the mean over the batch of the answer's logit at the last position), and
the two score tables side by side, edge for edge (auto-circuit's ``A1.0.Q`` is our
``b1.a.head0.q``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(
    n_layers=2,
    d_model=12,
    n_ctx=12,
    d_head=4,
    n_heads=3,
    d_mlp=32,
    d_vocab=19,
    act_fn="gelu_new",
    normalization_type="LN",
    positional_embedding_type="standard",
    seed=0,
)


def tiny_model():
    """In the auto-circuit venv: the seeded model (TransformerLens) and the prompts: ``model,
    clean, corrupt, answers, wrong``."""
    import torch
    import transformer_lens as tl

    torch.manual_seed(0)
    cfg = tl.HookedTransformerConfig(**CONFIG, device="cpu")
    model = tl.HookedTransformer(cfg)
    for name, param in model.named_parameters():  # random biases and norms too: no zero to hide in
        if name.endswith(("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", ".b", ".w")):
            with torch.no_grad():
                param.add_(0.1 * torch.randn_like(param))
    model.cfg.use_attn_result = True
    model.cfg.use_split_qkv_input = True
    model.cfg.use_hook_mlp_in = True
    model.eval()
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 19, (8, 10), generator=g)
    corrupt = torch.randint(0, 19, (8, 10), generator=g)
    answers = torch.randint(0, 19, (8, 1), generator=g)
    wrong = torch.randint(0, 19, (8, 1), generator=g)
    return model, clean, corrupt, answers, wrong


def stage_auto_circuit(out: Path) -> None:
    """In the auto-circuit venv: the model, the prompts and auto-circuit's EAP scores."""
    import torch
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.types import AblationType
    from auto_circuit.utils.graph_utils import patchable_model

    model, clean, corrupt, answers, wrong = tiny_model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    dataset = PromptDataset(clean, corrupt, list(answers), list(wrong))
    loader = PromptDataLoader(dataset, seq_len=None, diverge_idx=0, batch_size=8, shuffle=False)
    patchable = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True)
    scores = mask_gradient_prune_scores(
        patchable,
        loader,
        None,
        grad_function="logit",
        answer_function="avg_val",
        mask_val=0.0,
        ablation_type=AblationType.RESAMPLE,
    )
    edges = {edge.name: float(edge.prune_score(scores)) for edge in patchable.edges}
    versions = {m.__name__: getattr(m, "__version__", "?") for m in (torch,)}
    from importlib.metadata import version

    versions.update({p: version(p) for p in ("auto-circuit", "transformer-lens")})
    torch.save(
        dict(
            state=state,
            config=CONFIG,
            clean=clean,
            corrupt=corrupt,
            answers=answers,
            edges=edges,
            versions=versions,
        ),
        out,
    )


def our_name(name: str) -> str:
    """auto-circuit's edge name in ours: ``Resid Start`` embeds, ``A1.0`` b1.a.head0, ``A1.0.Q``
    b1.a.head0.q, ``MLP 1`` b1.m, ``Resid End`` t.call."""

    def node(part: str) -> str:
        if part == "Resid Start":
            return "embeds"
        if part == "Resid End":
            return "t.call"
        if part.startswith("MLP "):
            return f"b{part[4:]}.m"
        layer, head, *role = part[1:].split(".")
        return f"b{layer}.a.head{head}" + (f".{role[0].lower()}" if role else "")

    sender, receiver = name.split("->")
    return f"{node(sender)}->{node(receiver)}"


def stage_ours(data: dict) -> None:

    import circuits.experiments as ex
    import circuits.models as cm

    state = {k: v.double() if v.is_floating_point() else v for k, v in data["state"].items()}
    c = cm.from_transformer_lens(state, data["clean"], family="gpt2", convention="prompt")
    answers = data["answers"][:, 0]

    def metric(logits):  # auto-circuit's loss: minus the batch mean of the answer's logit, last position
        return -logits[:, -1].gather(-1, answers[:, None]).mean()

    ours = ex.edge_attribution(c, {"toks_int_var": data["corrupt"]}, metric)
    theirs = {our_name(name): score for name, score in data["edges"].items()}
    print("versions:", data["versions"])
    missing = sorted(set(theirs) ^ {e.name for e in ours.edges})
    print(f"edges: ours {len(ours)}, auto-circuit {len(theirs)}, in one only: {missing[:6]}")
    diffs = sorted(((abs(float(ours[n]) - s), n, float(ours[n]), s) for n, s in theirs.items()), reverse=True)
    largest = max(abs(s) for s in theirs.values())
    print(f"largest |score| {largest:.4g}; largest |ours - auto-circuit| {diffs[0][0]:.3g} on {diffs[0][1]}")
    for _, name, mine, other in diffs[:8]:
        print(f"  {name:28s} ours {mine:+.6g}  auto-circuit {other:+.6g}")
    rank = lambda table: sorted(table, key=lambda n: -abs(table[n]))  # noqa: E731
    mine = {e.name: float(s) for e, s in zip(ours.edges, ours.scores)}
    print("top 10 ours:        ", rank(mine)[:10])
    print("top 10 auto-circuit:", rank(theirs)[:10])


def run_stages(script: str, description: str, data: Path, stage_auto_circuit, stage_ours) -> None:
    """``script``'s command line: ``--stage auto-circuit`` runs that stage (in auto-circuit's venv,
    made here with the pins that import if missing), ``--stage ours`` ours on its saved ``--data``,
    and no stage both in turn."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--venv", type=Path, default=Path("/tmp/ac-venv"))
    parser.add_argument("--stage", choices=["auto-circuit", "ours"], default=None)
    parser.add_argument("--data", type=Path, default=data)
    args = parser.parse_args()
    if args.stage == "auto-circuit":
        stage_auto_circuit(args.data)
        return
    if args.stage is None:
        python = args.venv / "bin" / "python"
        if not python.exists():
            import torch

            subprocess.run([sys.executable, "-m", "venv", str(args.venv)], check=True)
            pins = [
                f"torch=={torch.__version__}",
                "auto-circuit",
                "transformer-lens>=2,<3",
                "pyarrow<17",
                "datasets<3",
            ]
            subprocess.run([str(python), "-m", "pip", "install", *pins], check=True)
        env = dict(os.environ, PYTHONPATH="")
        subprocess.run(
            [str(python), script, "--stage", "auto-circuit", "--data", str(args.data)], check=True, env=env
        )
    import torch

    sys.path.insert(0, str(ROOT))
    stage_ours(torch.load(args.data, weights_only=False))


def main() -> None:
    run_stages(
        __file__, __doc__.splitlines()[0], Path("/tmp/auto_circuit_eap.pt"), stage_auto_circuit, stage_ours
    )


if __name__ == "__main__":
    main()
