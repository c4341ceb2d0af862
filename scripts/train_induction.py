"""Train the shipped demo model: a 2-layer attention-only transformer that forms induction heads.

    .venv/bin/python scripts/train_induction.py            # writes circuits/data/induction_2l.*

The task (``circuits.models.demo_model.repeated_tokens``): each row is a
BOS token, then a block of distinct random tokens, repeated until the row
is full.  The block length varies per row (``--min-block`` to
``--max-block``), so no fixed offset predicts the repeats: the model has
to find the previous occurrence of the current token and copy the token
after it, which is what an induction head (layer 1) does with the help of
a previous-token head (layer 0).  Training minimises the loss at every
position (``--loss all``; ``--loss repeats`` counts only the predictable
ones); the losses reported are on the predictable positions.

Left alone, every head of a layer learns the same job, and ablating any
one of them barely matters.  So after the first 30% of training a
group-lasso penalty (``--head-l1``, ramped in over the next 20%) on each
head's value and output weight norms makes the model do the task with as
few heads as it can: one induction head, and the previous-token work in
one or two layer-0 heads.  Unused heads keep their attention weights but
their outputs shrink to nothing.

The model here is plain torch written to mirror ``build_attn_only`` step by
step (layer norm, shortformer positions added to the query/key input only,
``1/sqrt(d_head)`` scores, causal mask with a -10000 score, no biases but
the layer norms'), with the same weight names, so the trained tensors load
straight into the builder.  After training the script checks that the
circuit built from the weights gives the torch model's loss.

Everything is seeded (``--seed``) and runs on one thread by default, so a
rerun reproduces the shipped weights; it takes about two minutes on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import safetensors.torch
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from circuits.models import AttnOnlyConfig, build_attn_only  # noqa: E402
from circuits.models.demo_model import INFO_FILE, WEIGHTS_FILE, repeat_mask, repeated_tokens  # noqa: E402
from circuits.passes import causal_mask  # noqa: E402

NEG_INF = -10000.0  # the builder's masked score


class AttnOnly(torch.nn.Module):
    """``build_attn_only``'s math in plain torch; parameters named as the circuit's weights."""

    def __init__(self, config: AttnOnlyConfig, generator: torch.Generator):
        super().__init__()
        self.config = config
        self.names = [n for n in config.weight_shapes() if n != "t.w.unembed_bias"]
        for name in self.names:
            shape = config.weight_shapes()[name]
            if name.endswith(".ln.w.scale"):
                tensor = torch.ones(shape)
            elif name.endswith(".ln.w.bias"):
                tensor = torch.zeros(shape)
            else:
                fan_in = {"t.w.tok_embeds": 1, "t.w.pos_embeds": 1}.get(name, shape[-1])
                std = 1.0 if fan_in == 1 else 1 / math.sqrt(fan_in)
                if name == "t.w.pos_embeds":
                    std = 0.1
                tensor = torch.randn(shape, generator=generator) * std
            self.register_parameter(self._key(name), torch.nn.Parameter(tensor))

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "__")

    def w(self, name: str) -> torch.Tensor:
        return getattr(self, self._key(name))

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: self.w(name).detach().clone().contiguous() for name in self.names}

    def head_norms(self) -> torch.Tensor:
        """The group-lasso penalty: each head's value and output weight norms, summed over heads."""
        total = 0
        for layer in range(self.config.n_layers):
            for which in "vo":
                total = total + self.w(f"a{layer}.w.{which}").flatten(1).norm(dim=1).sum()
        return total

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-token loss ``[B, S]`` of int tokens ``[B, S+1]`` (inputs ``[:-1]``, targets ``[1:]``)."""
        c = self.config
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        seq = inputs.shape[1]
        w = self.w
        resid = w("t.w.tok_embeds")[inputs]
        pos = w("t.w.pos_embeds")[:seq]
        allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
        for layer in range(c.n_layers):
            norm = F.layer_norm(
                resid, (c.d_model,), w(f"a{layer}.ln.w.scale"), w(f"a{layer}.ln.w.bias"), c.ln_eps
            )
            qk_input = norm + pos
            q = torch.einsum("bqd,hcd->bhqc", qk_input, w(f"a{layer}.w.q"))
            k = torch.einsum("bkd,hcd->bhkc", qk_input, w(f"a{layer}.w.k"))
            v = torch.einsum("bkd,hVd->bhkV", norm, w(f"a{layer}.w.v"))
            scores = torch.einsum("bhqc,bhkc->bhqk", q, k) * c.d_head**-0.5
            scores = scores.masked_fill(~allowed, NEG_INF)
            probs = scores.softmax(-1)
            comb_v = torch.einsum("bhqk,bhkV->bhqV", probs, v)
            resid = torch.einsum("bhsV,hdV->bsd", comb_v, w(f"a{layer}.w.o")) + resid
        final = F.layer_norm(resid, (c.d_model,), w("final.ln.w.scale"), w("final.ln.w.bias"), c.ln_eps)
        logits = torch.einsum("bsh,vh->bsv", final, w("t.w.unembed"))
        return -logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def batch(args, generator: torch.Generator, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Task rows with block lengths drawn from ``--min-block .. --max-block``, and their repeat mask."""
    size = size or args.batch_size
    lengths = torch.randint(args.min_block, args.max_block + 1, (size,), generator=generator)
    tokens = repeated_tokens(size, lengths, args.seq_len, vocab_size=args.vocab_size, generator=generator)
    return tokens, repeat_mask(lengths, size, args.seq_len)


def masked_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (loss * mask).sum() / mask.sum()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--d-head", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=64, help="model positions per row (also n_ctx)")
    parser.add_argument("--min-block", type=int, default=8)
    parser.add_argument("--max-block", type=int, default=32)
    parser.add_argument(
        "--head-l1",
        type=float,
        default=1.5e-2,
        help="group-lasso weight on each head's value/output norms (0 to turn off)",
    )
    parser.add_argument(
        "--head-l1-start",
        type=float,
        default=0.3,
        help="fraction of training after which the head penalty ramps up (over 0.2 of it)",
    )
    parser.add_argument(
        "--loss",
        choices=["all", "repeats"],
        default="all",
        help="train on every position, or on the predictable (repeated) ones only",
    )
    parser.add_argument("--out", type=Path, default=REPO / "circuits" / "data")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 keeps runs bit-reproducible)"
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = AttnOnlyConfig(
        n_layers=2,
        n_heads=args.n_heads,
        d_model=args.d_model,
        d_head=args.d_head,
        vocab_size=args.vocab_size,
        n_ctx=args.seq_len,
    )
    init_generator = torch.Generator().manual_seed(args.seed)
    data_generator = torch.Generator().manual_seed(args.seed + 1)
    model = AttnOnly(config, init_generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    start = time.perf_counter()
    recent: list[float] = []
    for step in range(args.steps):
        tokens, mask = batch(args, data_generator)
        per_token = model(tokens)
        loss = per_token.mean() if args.loss == "all" else masked_mean(per_token, mask)
        ramp = min(1.0, max(0.0, (step / args.steps - args.head_l1_start) / 0.2))
        loss = loss + args.head_l1 * ramp * model.head_norms()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        recent = (recent + [masked_mean(per_token.detach(), mask).item()])[-100:]
        if step % 250 == 0 or step == args.steps - 1:
            print(
                f"step {step:5d}  loss on repeats {sum(recent) / len(recent):.4f}  "
                f"({time.perf_counter() - start:.0f}s)",
                flush=True,
            )
    seconds = time.perf_counter() - start
    train_loss = sum(recent) / len(recent)

    # held-out rows from another seed: the varied-length task, and the demo's BOS + block + block
    model.eval()
    test_generator = torch.Generator().manual_seed(args.seed + 12345)
    with torch.no_grad():
        tokens, mask = batch(args, test_generator, 512)
        test_loss = masked_mean(model(tokens), mask).item()
        half = args.seq_len // 2
        two_copies = repeated_tokens(256, half, vocab_size=args.vocab_size, seed=args.seed + 54321)
        per_token = model(two_copies)
        first_half, second_half = per_token[:, :half].mean().item(), per_token[:, half:].mean().item()
    print(
        f"train loss {train_loss:.4f}, test loss {test_loss:.4f} (repeats, block {args.min_block}-{args.max_block})"
    )
    print(
        f"BOS + block + block ({half} tokens each): first half {first_half:.4f}, second half {second_half:.4f}"
    )

    # the circuit built from the weights must agree with the torch model
    weights = model.weights()
    check = two_copies[:16]
    circuit = causal_mask(build_attn_only(config, weights, check))
    from_circuit = circuit.evaluate()
    with torch.no_grad():
        from_torch = model(check)
    gap = (from_circuit - from_torch).abs().max().item()
    print(f"circuit vs torch model: max |loss difference| {gap:.2e}")
    if gap > 1e-4:
        raise SystemExit(f"the circuit disagrees with the torch model by {gap}")

    args.out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(weights, str(args.out / WEIGHTS_FILE), metadata={"seed": str(args.seed)})
    info = {
        "config": dataclasses.asdict(config),
        "seed": args.seed,
        "task": {
            "description": "BOS, then a block of distinct random tokens (1..vocab-1) repeated to fill the row; "
            "trained on the loss at every position (--loss), losses below are on the predictable positions "
            "(circuits.models.demo_model.repeat_mask)",
            "bos": 0,
            "seq_len": args.seq_len,
            "min_block": args.min_block,
            "max_block": args.max_block,
        },
        "training": {
            "command": "python scripts/train_induction.py"
            + "".join(f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
            "steps": args.steps,
            "batch_size": args.batch_size,
            "optimizer": f"AdamW(lr={args.lr}, weight_decay={args.weight_decay}), warmup then cosine",
            "seconds": round(seconds, 1),
            "threads": args.threads,
            "torch": torch.__version__,
        },
        "results": {
            "train_loss": round(train_loss, 5),
            "test_loss": round(test_loss, 5),
            "two_copies_first_half_loss": round(first_half, 5),
            "two_copies_second_half_loss": round(second_half, 5),
            "circuit_vs_torch_max_gap": gap,
        },
    }
    (args.out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {args.out / WEIGHTS_FILE} and {args.out / INFO_FILE} in {seconds:.0f}s of training")


if __name__ == "__main__":
    main()
