"""What the tests of the Hugging Face model families share: random token rows, the model's own
logits (the independent reference, in float64 without Hugging Face's float32 round trips), and
the circuit's logits node."""

from __future__ import annotations

import torch

from circuits.transformer import names
from circuits.transformer.points import HEAD_KINDS, Point


def random_tokens(vocab: int, batched: bool, length: int = 13, seed: int = 1) -> torch.Tensor:
    """``[3, length]`` (or ``[length]``) token ids below ``vocab``, from a seeded generator."""
    shape = (3, length) if batched else (length,)
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def hf_logits(model, inputs: torch.Tensor) -> torch.Tensor:
    """The Hugging Face model's own logits on ``inputs`` (one row or a batch)."""
    with torch.no_grad():
        out = model(input_ids=inputs if inputs.ndim == 2 else inputs[None])
    return out.logits if inputs.ndim == 2 else out.logits[0]


def logits_of(circuit) -> torch.Tensor:
    """The circuit's logits, ``'t.call'``."""
    return circuit.get_unique(names.LOGITS).evaluate()


def logits_with_head_zeroed(model, inputs: torch.Tensor, projection, head: int, d_head: int) -> torch.Tensor:
    """The model's logits with head ``head``'s slice of ``projection``'s input zeroed (a forward
    pre-hook on the attention's output projection): the reference for zero-ablating a head."""

    def zero_head(module, args):
        (x,) = args
        x = x.clone()
        x[..., head * d_head : (head + 1) * d_head] = 0
        return (x,)

    handle = projection.register_forward_pre_hook(zero_head)
    try:
        return hf_logits(model, inputs)
    finally:
        handle.remove()


def check_heads_and_points(model, circuit, tokens, projection, head: int, d_head: int, kinds) -> None:
    """``split_heads`` keeps the value; zero-ablating head ``head`` of layer 1 equals the model with
    that head's slice of ``projection`` (layer 1's output projection) zeroed; each point of ``kinds``
    finds one node of layer 1 (and of the head, after splitting)."""
    from circuits import experiments as ex
    from circuits.passes import split_heads

    split = split_heads(circuit)
    torch.testing.assert_close(split.evaluate(), circuit.evaluate(), rtol=1e-10, atol=1e-10)
    ablated = ex.zero_ablate(split, names.head(1, head))
    want = logits_with_head_zeroed(model, tokens[..., :-1], projection, head, d_head)
    assert (logits_of(ablated) - want).abs().max().item() < 1e-10
    assert (logits_of(circuit) - want).abs().max().item() > 1e-3
    for kind in kinds:
        assert len(circuit.get(Point(kind, 1))) == 1, kind
        if kind in HEAD_KINDS:
            assert len(split.get(Point(kind, 1, head))) == 1, kind


def check_logits_and_loss(model, circuit, tokens: torch.Tensor, tol: float) -> float:
    """The circuit's logits equal the model's own within ``tol`` (and are not all near zero), and its
    per-token loss equals the cross entropy of the model's logits within ``10 * tol``; returns the
    largest logits difference."""
    logits = logits_of(circuit)
    want = hf_logits(model, tokens[..., :-1])
    assert logits.dtype == want.dtype and logits.shape == want.shape
    assert want.abs().max() > 1.0  # the comparison is not between near-zero logits
    diff = (logits - want).abs().max().item()
    assert diff < tol
    targets = tokens[..., 1:]
    want_loss = torch.nn.functional.cross_entropy(
        want.reshape(-1, want.shape[-1]), targets.reshape(-1), reduction="none"
    ).reshape(targets.shape)
    assert (circuit.evaluate() - want_loss).abs().max().item() < 10 * tol
    return diff


def _rmsnorm(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _gemma_rmsnorm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


class _NnWith:
    """``torch.nn`` as ``modeling_gemma2`` sees it, with its own ``functional.softmax``."""

    def __init__(self, softmax):
        self.functional = type(
            "F", (), {"softmax": staticmethod(softmax), "dropout": torch.nn.functional.dropout}
        )

    def __getattr__(self, name):
        return getattr(torch.nn, name)


def without_float32_round_trips(monkeypatch, family: str) -> None:
    """Hugging Face's float64 forward of ``family`` without its float32 round trips: the RMSNorm's
    (Llama, Mistral, Qwen2, Gemma, Gemma 2) and Gemma 2's upcast softmax, so that a float64
    reference is float64-exact."""
    import importlib

    if family == "gemma2":
        from transformers.models.gemma2 import modeling_gemma2

        original = modeling_gemma2.nn.functional.softmax

        def softmax(x, dim, dtype=None):  # Hugging Face upcasts the scores to float32
            return original(x, dim=dim)

        monkeypatch.setattr(modeling_gemma2.Gemma2RMSNorm, "forward", _gemma_rmsnorm)
        monkeypatch.setattr(modeling_gemma2, "nn", _NnWith(softmax))
        return
    norm = {
        "llama": "LlamaRMSNorm",
        "mistral": "MistralRMSNorm",
        "qwen2": "Qwen2RMSNorm",
        "gemma": "GemmaRMSNorm",
    }
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    forward = _gemma_rmsnorm if family == "gemma" else _rmsnorm
    monkeypatch.setattr(getattr(module, norm[family]), "forward", forward)
