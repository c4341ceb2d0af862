"""A first look at circuits: build one attention pattern, print it, read it back.

Run with ``python -m circuits.demo``.
"""

from __future__ import annotations

import torch

import circuits as cc


def attention_pattern(seq: int = 5, d_model: int = 8, d_head: int = 4) -> cc.Circuit:
    """One attention head's pattern written out of Einsum, Add and GeneralFunction nodes."""
    generator = torch.Generator().manual_seed(0)
    resid = cc.Array(torch.randn(seq, d_model, generator=generator), name="resid")
    w_q = cc.Array(torch.randn(d_head, d_model, generator=generator), name="w.q")
    w_k = cc.Array(torch.randn(d_head, d_model, generator=generator), name="w.k")
    q = cc.Einsum.from_einsum_string("sd,cd->sc", resid, w_q, name="q")
    k = cc.Einsum.from_einsum_string("sd,cd->sc", resid, w_k, name="k")
    scale = cc.Scalar(d_head**-0.5, name="scale")
    mask = cc.Array(torch.tril(torch.ones(seq, seq)), name="causal_mask")
    raw = cc.Einsum.from_einsum_string("qc,kc,,qk->qk", q, k, scale, mask, name="scores_raw")
    not_mask = cc.Add(cc.Scalar(1.0, name="one"), cc.Einsum.from_einsum_string(
        "ab,->ab", mask, cc.Scalar(-1.0, name="neg_one")), name="not_mask")
    bias = cc.Einsum.from_einsum_string("qk,->qk", not_mask, cc.Scalar(-10000.0, name="neg_inf"))
    scores = cc.Add(raw, bias, name="scores")
    return cc.GeneralFunction.new_by_name(scores, spec_name="softmax", name="pattern")


def main() -> None:
    circuit = attention_pattern()
    text = circuit.repr()
    print("A causal attention pattern as a circuit:\n")
    print(text)
    again = cc.parse(text)
    print(f"\nparsed back: equal={again == circuit}, reprint identical={again.repr() == text}")
    print(f"{len(cc.unique_nodes([circuit]))} distinct nodes, output shape {list(circuit.shape)}")


if __name__ == "__main__":
    main()
