"""The gradient through a norm for many output gradients at once, in closed form.

EAP's receivers of one residual stream share its norm (``edge_circuit(masked=False)``): each
receiver's gradient at the norm's output is carried to the stream by the norm's vector-Jacobian
product.  For ``y = w * xhat + b`` with ``xhat = (x - mean x) r`` (a layer norm; an RMS norm does
not centre) and ``r = 1/sqrt(var + eps)`` per position::

    dx = r (g w - mean(g w) - xhat mean(g w xhat))     (an RMS norm: without the mean(g w) term)

one pass over all the receivers' gradients stacked, rather than one autograd backward through the
norm's nodes per receiver.  Norms in float32 or float64 only: a reduced-precision norm rounds
where this form does not, and takes autograd's product.
"""

from __future__ import annotations

import dataclasses

import torch

from circuits.core.nodes import Circuit
from circuits.errors import ExperimentError
from circuits.evaluation import evaluate
from circuits.experiments.stream import read_norm

__all__ = ["NormVJP"]

_FULL = (torch.float32, torch.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class NormVJP:
    """One norm's closed-form product: ``stream`` (its input node), ``rsqrt`` (its scale node, whose
    value a run records), ``weight`` (its value, ``[d]``), ``centred`` and ``eps``.  Used only
    where the scale reads the input and its value is ``1/sqrt(var + eps)`` of the run's input
    (``accepts``): otherwise autograd's product, which is right for any norm."""

    stream: Circuit
    rsqrt: Circuit
    weight: torch.Tensor
    centred: bool
    eps: float

    @staticmethod
    def of(output: Circuit, stream: Circuit) -> NormVJP | None:
        """The product for the norm whose output is ``output`` over ``stream``; None for a norm
        this form does not cover (another structure, a cast, reduced precision)."""
        try:
            norm = read_norm(output)
        except ExperimentError:
            return None
        if norm.input.hash != stream.hash:  # a cast between them
            return None
        if not _reads(norm.rsqrt, stream):
            return None  # a scale that does not depend on the input (tracr's identity norm, a frozen one)
        weight = evaluate(norm.weight)
        if weight.dtype not in _FULL or weight.dim() != 1 or weight.shape[0] != stream.shape[-1]:
            return None
        return NormVJP(stream, norm.rsqrt, weight, norm.centred, norm.eps)

    def accepts(self, x: torch.Tensor, rsqrt: torch.Tensor | None) -> bool:
        """Whether a run's values ``x`` (the input) and ``rsqrt`` (the scale) are this form's: one
        dtype, float32 or float64."""
        if rsqrt is None or not x.dtype == rsqrt.dtype == self.weight.dtype or x.dtype not in _FULL:
            return False
        with torch.no_grad():  # the scale is the one this form differentiates, on these values
            centred = x - x.mean(-1, keepdim=True) if self.centred else x
            expected = torch.rsqrt(centred.square().mean(-1) + self.eps)
            tolerance = 1e-5 if x.dtype == torch.float32 else 1e-10
            return torch.allclose(rsqrt.reshape(expected.shape), expected, rtol=tolerance, atol=0)

    def __call__(self, grads: torch.Tensor, x: torch.Tensor, rsqrt: torch.Tensor) -> torch.Tensor:
        """``[k, ..., d]`` gradients at the output (overwritten: the caller's stack) to ``[k, ..., d]``
        at the input; ``x`` the input's value, ``rsqrt`` the scale's (``accepts`` them)."""
        x, rsqrt = x.detach(), rsqrt.detach()
        if rsqrt.dim() < x.dim():
            rsqrt = rsqrt.unsqueeze(-1)
        xhat = (x - x.mean(-1, keepdim=True) if self.centred else x) * rsqrt
        scaled = grads.mul_(self.weight.to(grads.device))
        if self.centred:
            scaled.sub_(scaled.mean(-1, keepdim=True))
        along = torch.einsum("k...d,...d->k...", scaled, xhat).unsqueeze(-1) / x.shape[-1]
        return scaled.addcmul_(xhat, along, value=-1).mul_(rsqrt)


def _reads(node: Circuit, target: Circuit) -> bool:
    """Whether ``target`` is below ``node``: a walk that does not descend below ``target`` (the
    stream a norm's scale reads holds the whole model under it)."""
    seen, stack = {node.hash}, [node]
    while stack:
        current = stack.pop()
        if current.hash == target.hash:
            return True
        for child in current.children:
            if child.hash not in seen:
                seen.add(child.hash)
                stack.append(child)
    return False
