"""The demo (``circuits demo``): induction heads in the shipped 2-layer model, found by ablation.

1. Load the shipped attention-only model (``circuits.models.load_demo_model``,
   causal as it was trained) on rows of ``BOS + block + block`` (a random
   block of tokens, repeated) and print the top of the circuit.
2. ``split_heads``: each layer's attention output
   ``'b{L}.a'`` becomes a sum of one branch per head, ``'b{L}.a.head{h}'``.
3. Evaluate the per-token loss: high on the first half (random tokens),
   near zero on the second (each token is predictable from its previous
   occurrence).
4. Zero-ablate each head in turn (``c.update('b1.a.head2', lambda n:
   cc.Scalar(0.0, shape=n.shape))``) and tabulate the loss increase on the
   second half, beside two attention scores read off ``'a.attn_probs'``:
   *prev-token* (attention to the position before, in the first copy) and
   *induction* (attention to the token after the previous occurrence of
   the current token, in the second); see ``attention_scores``.

``head_effects()`` returns the table's data; ``main()`` prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import time
from typing import Callable

import torch

import circuits as cc
from circuits.transformer import names
from circuits.errors import ModelError
from circuits.models.demo_model import demo_config, demo_info, load_demo_model, repeated_tokens
from circuits.cli.parity import seed_argument
from circuits.passes import layer_of, split_heads


@dataclasses.dataclass(frozen=True)
class HeadEffect:
    """One row of the ablation table."""

    layer: int
    head: int
    loss: float  # mean loss on the second half with this head zero-ablated
    increase: float  # loss - the unablated loss on the second half
    prev_token: float  # mean attention from a token's first occurrence to the position before it
    induction: float  # mean attention to the token after the current token's previous occurrence

    @property
    def name(self) -> str:
        return names.head(self.layer, self.head)


@dataclasses.dataclass(frozen=True)
class DemoResult:
    tokens: torch.Tensor  # [B, 2*block_len + 1]
    circuit: cc.Circuit  # masked and split, root 't.loss' [B, 2*block_len]
    first_half_loss: float
    second_half_loss: float
    heads: list[HeadEffect]  # every head, in layer and head order

    def ranked(self) -> list[HeadEffect]:
        """The heads by loss increase, biggest first."""
        return sorted(self.heads, key=lambda h: h.increase, reverse=True)


def attention_scores(probs: torch.Tensor, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head (prev-token, induction) scores of attention ``probs [B,h,q,k]`` on ``inputs [B,S]``.

    prev-token: the mean attention on ``q - 1`` over the queries ``q >= 1``
    whose token occurs there for the first time (the first copy of the
    block: the keys an induction head reads; in the second copy a
    previous-token head has no job and the trained heads look elsewhere).
    induction: the mean, over the queries whose token occurred before, of
    the attention on every key ``k`` such that the token at ``k - 1`` is the
    query's token (``k - 1 < q``): the token after a previous occurrence.
    """
    seq = inputs.shape[-1]
    same = inputs[:, :, None] == inputs[:, None, :]  # [B, q, j]: token j equals token q
    earlier = same & torch.ones(seq, seq, dtype=torch.bool).tril(-1)  # ... and j < q
    seen = earlier.any(-1)  # [B, q]: the query's token occurred before

    fresh = ~seen
    fresh[:, 0] = False
    to_previous = probs.diagonal(offset=-1, dim1=-2, dim2=-1)  # [B, h, q-1]: q -> q - 1 for q >= 1
    prev = (to_previous * fresh[:, None, 1:]).sum(dim=(0, -1)) / fresh.sum().clamp(min=1)

    after = torch.zeros_like(same)
    after[:, :, 1:] = earlier[:, :, :-1]  # key k = j + 1
    mass = (probs * after[:, None].to(probs.dtype)).sum(-1)  # [B, h, q]
    induction = (mass * seen[:, None]).sum(dim=(0, -1)) / seen.sum().clamp(min=1)
    return prev, induction


@contextlib.contextmanager
def _one_thread():
    """Torch on one thread for the demo's small tensors, restored after.

    Every op here takes microseconds; a second thread only adds hand-offs,
    which cost seconds when the other core is busy (measured: 0.2s on one
    thread, 10s on two, on a loaded 2-core machine).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def head_effects(batch_size: int = 16, block_len: int = 32, seed: int = 0) -> DemoResult:
    """Build, split, evaluate and ablate every head; see the module docstring."""
    with _one_thread():
        return _head_effects(batch_size, block_len, seed)


def _head_effects(batch_size: int, block_len: int, seed: int) -> DemoResult:
    tokens = repeated_tokens(batch_size, block_len, seed=seed)
    masked = load_demo_model(tokens)  # causal, as trained
    split = split_heads(masked)
    inputs = tokens[:, :-1]

    probs = {layer_of(node): node for node in masked.get(names.PROBS)}
    values = cc.evaluate_many([split] + [probs[layer] for layer in sorted(probs)])
    loss, patterns = values[0], values[1:]
    first, second = loss[:, :block_len].mean().item(), loss[:, block_len:].mean().item()

    config = demo_config()
    heads = []
    for layer in range(config.n_layers):
        prev, induction = attention_scores(patterns[layer], inputs)
        for head in range(config.n_heads):
            ablated = split.update(names.head(layer, head), lambda n: cc.Scalar(0.0, shape=n.shape))
            ablated_loss = ablated.evaluate()[:, block_len:].mean().item()
            heads.append(
                HeadEffect(
                    layer,
                    head,
                    ablated_loss,
                    ablated_loss - second,
                    prev[head].item(),
                    induction[head].item(),
                )
            )
    return DemoResult(tokens, split, first, second, heads)


def run(
    batch_size: int = 16,
    block_len: int = 32,
    seed: int = 0,
    depth: int = 5,
    out: Callable[[str], None] = print,
) -> DemoResult:
    """Print the demo (through ``out``) and return its data."""
    start = time.perf_counter()
    config, info = demo_config(), demo_info()
    if not 1 <= block_len <= config.n_ctx // 2:
        raise ModelError(
            f"block_len {block_len}: two copies of the block must fit the model's {config.n_ctx} positions, "
            f"so it is 1 to {config.n_ctx // 2}"
        )
    out(
        f"The shipped model: attention-only, {config.n_layers} layers x {config.n_heads} heads, "
        f"d_model {config.d_model}, d_head {config.d_head}, vocab {config.vocab_size}, {config.n_ctx} positions;\n"
        f"trained by scripts/train_induction.py (seed {info['seed']}) on rows of BOS + random block, repeated.\n"
    )
    sample = repeated_tokens(1, block_len, seed=seed)
    out(
        f"As a circuit on one row of BOS + {block_len} random tokens + the same {block_len} again, "
        f"top {depth} levels:\n"
    )
    out(load_demo_model(sample[0]).repr(depth=depth))

    result = head_effects(batch_size, block_len, seed)
    out(
        f"\nAfter split_heads: {len(cc.unique_nodes([result.circuit]))} distinct nodes; "
        "'b0.a' and 'b1.a' are now sums of\nper-head branches 'b{L}.a.head{h}'. "
        f"Mean loss per token over {batch_size} rows:\n"
        f"  first half  {result.first_half_loss:.3f}   (random tokens; chance is ln {config.vocab_size - 1} "
        f"= {math.log(config.vocab_size - 1):.3f})\n"
        f"  second half {result.second_half_loss:.3f}   (repeats)\n"
    )
    out("Zero-ablating one head at a time (update 'b{L}.a.head{h}' -> Scalar 0), loss on the second half:\n")
    out(f"  {'head':<12} {'loss':>7} {'increase':>9}   {'prev-token':>10} {'induction':>9}")
    top = result.ranked()[0]
    prev = max((row for row in result.heads if row.layer == 0), key=lambda row: row.increase)
    for row in result.heads:
        mark = "  <- most needed" if row is top else "  <- most needed in layer 0" if row is prev else ""
        out(
            f"  {row.name:<12} {row.loss:7.3f} {row.increase:+9.3f}   {row.prev_token:10.2f} "
            f"{row.induction:9.2f}{mark}"
        )
    induction_mark = ", the mark of an induction head" if top.induction > 0.5 else ""
    prev_mark = ", the mark of a previous-token head" if prev.prev_token > 0.5 else ""
    out(
        f"\n{top.name} matters most: {top.induction:.0%} of its attention on a repeated token goes to the token\n"
        f"after that token's previous occurrence{induction_mark}.\n"
        f"In layer 0, {prev.name} matters most: {prev.prev_token:.0%} of its attention on a new token goes to the "
        f"position\nbefore it{prev_mark}: it writes each token's predecessor where the\n"
        "induction head's keys can read it (positions enter queries and keys only, never the residual stream).\n"
        f"The branch of {top.name} after split_heads, top levels:\n"
    )
    out(result.circuit.get_unique(top.name).repr(depth=2))
    out(f"\n(finished in {time.perf_counter() - start:.1f}s)")
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m circuits.cli.demo ARGS``: the same as ``circuits demo ARGS``."""
    from circuits.cli import main as cli_main

    return cli_main(["demo", *(sys.argv[1:] if argv is None else argv)])


#: The most rows ``circuits demo`` evaluates (512 take about 0.5 GB and 10 s).
MAX_BATCH_SIZE = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-size",
        type=_at_least(1, MAX_BATCH_SIZE),
        default=16,
        metavar="N",
        help=f"rows to evaluate, at most {MAX_BATCH_SIZE} (default 16)",
    )
    parser.add_argument(
        "--block-len",
        type=_at_least(1),
        default=32,
        metavar="N",
        help="random tokens per half (default 32; two copies must fit the model's 64 positions)",
    )
    parser.add_argument(
        "--seed", type=seed_argument, default=0, metavar="N", help="seed of the random rows (default 0)"
    )
    parser.add_argument(
        "--depth",
        type=_at_least(0),
        default=5,
        metavar="N",
        help="levels of the circuit to print (default 5)",
    )


def _at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {low} or more, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"expected at most {high}, got {value}")
        return value

    return parse


if __name__ == "__main__":
    sys.exit(main())
