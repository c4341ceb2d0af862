"""The closed-form gradient through a shared norm (``circuits.experiments.norm_vjp``) against
autograd's product through the norm's own nodes, and the norms it must leave to autograd."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import circuits.experiments as ex
import circuits.models as cm
from circuits.evaluation import compile_plan
from circuits.experiments.norm_vjp import NormVJP

import factories as f


def _tokens(seed: int) -> torch.Tensor:
    return f.token_ids(f.FAMILY_VOCAB, (2, 5), seed=seed)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma"])
def test_equals_autograds_product_through_each_shared_norm(family):
    """A layer norm (GPT-2), an RMS norm (Llama) and Gemma's ``1 + w`` weight, float64: every
    receiver group's closed-form product equals autograd's through the norm's nodes (1e-12)."""
    hf = {"gpt2": lambda: f.gpt2(perturb=f.scaled_weights), "llama": f.perturbed_llama, "gemma": f.gemma}
    model = hf[family]() if family != "llama" else f.perturbed_llama(kv_heads=2)
    edges = ex.edge_circuit(cm.from_hf(model.double(), _tokens(0)), masked=False)
    groups = {r.norm.hash: r for r in edges.receivers}
    n_layers = len({r.layer for r in edges.receivers if r.layer is not None})
    assert len(groups) == 2 * n_layers + 1  # each layer's two norms and the final one
    for receiver in groups.values():
        vjp = NormVJP.of(receiver.norm, receiver.stream)
        assert vjp is not None, receiver.name  # the fast form is the one these families take
        stream = receiver.stream.evaluate().requires_grad_()
        plan = compile_plan([receiver.norm], known={receiver.stream: stream})
        values = {}
        with torch.enable_grad():
            output = plan.run(on_value=lambda node, value: values.__setitem__(node.hash, value))[0]
        grads = torch.randn(
            (3, *output.shape), dtype=torch.float64, generator=torch.Generator().manual_seed(1)
        )
        expected = torch.stack([torch.autograd.grad(output, stream, g, retain_graph=True)[0] for g in grads])
        rsqrt = values[vjp.rsqrt.hash]
        assert vjp.accepts(stream, rsqrt)
        torch.testing.assert_close(vjp(grads.clone(), stream, rsqrt), expected, rtol=0, atol=1e-12)


def test_a_scale_that_does_not_read_the_input_is_left_to_autograd():
    """tracr's identity norm, ``x * rsqrt(1)``: read as an RMS norm, but its scale does not depend
    on the input, so the closed form (which differentiates the scale) is not taken."""
    export = cm.load_tracr_export(Path(__file__).parent / "data" / "tracr" / "reverse")
    edges = ex.edge_circuit(export.circuit(), masked=False)
    assert all(NormVJP.of(r.norm, r.stream) is None for r in edges.receivers)


def test_a_scale_of_other_values_is_refused_at_run_time():
    """``accepts`` compares the run's scale with ``1/sqrt(var + eps)`` of the run's input."""
    edges = ex.edge_circuit(cm.from_hf(f.gpt2(perturb=f.scaled_weights).double(), _tokens(0)), masked=False)
    receiver = edges.receivers[0]
    vjp = NormVJP.of(receiver.norm, receiver.stream)
    x = receiver.stream.evaluate()
    rsqrt = torch.rsqrt((x - x.mean(-1, keepdim=True)).square().mean(-1) + vjp.eps)
    assert vjp.accepts(x, rsqrt)
    assert not vjp.accepts(x, rsqrt * 1.001)
    assert not vjp.accepts(x.float(), rsqrt.float())  # another dtype than the weight's
