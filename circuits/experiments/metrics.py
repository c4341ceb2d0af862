"""Metrics: circuits built on top of the circuit they measure.

Each metric here is a ``Metric``: a small *circuit builder*.  Given a
circuit (clean or ablated) it returns a new circuit of shape ``[]`` whose
children are nodes of the given one (``'t.loss'``, ``'t.call'``,
``'log_probs'``), so evaluating it with a cached ``Evaluator`` reuses
everything the experiment did not change, and the metric itself is a
handful of nodes.  Calling a metric evaluates it to a float::

    mean_loss(circuit)                                  # float
    mean_loss.circuit(circuit)                          # the scalar circuit
    logit_diff(-1, good=42, bad=7)(circuit)             # a Metric made by a function
    kl_div(clean)(ablated)

``sweep`` takes these (or any function of the evaluated root tensor).

Which next tokens a metric scores: a circuit's loss reads them from its own token Array
(``'true_toks_int'``), so an experiment that runs the model on other tokens (a patching
grid's corrupted run) would score those.  Each Metric says which run's next tokens it scores
in such an experiment: ``metric.targets``, ``"clean"`` by default (what TransformerLens users
build their metrics on), or ``"corrupted"`` (``mean_loss.with_targets("corrupted")``).  Metrics
that read no next tokens (``logit_diff``, ``kl_div``) are the same either way.

============================  =========================================================
``mean_loss``                 mean of ``'t.loss'`` (the per-token loss) over every axis; in a
                              grid, on the clean prompt's next tokens (``targets``, below)
``logit_diff(pos, good, bad)``  mean over the batch of ``logits[..., pos, good] - logits[..., pos, bad]``
                              (``'t.call'``); the Index is pushed down through the last
                              layer, so only that position's logits are computed
``kl_div(clean)``             mean over batch and positions of KL(clean || circuit) of the
                              next-token distributions (``'log_probs'`` of both)
============================  =========================================================
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

from circuits.transformer import names
from circuits.evaluation.cache import Evaluator
from circuits.evaluation import evaluate
from circuits.evaluation.leaves import check_device
from circuits.errors import ExperimentError, shown
from circuits.core.nodes import (
    Add,
    Array,
    Circuit,
    Einsum,
    GeneralFunction,
    Index,
    Scalar,
    check_node,
)
from circuits.core.traversal import unique_nodes
from circuits.core.shapes import EINSUM_LETTERS

__all__ = ["TARGETS", "Metric", "kl_div", "logit_diff", "mean_loss"]

#: Which run's next tokens a metric scores in a two-run experiment (the module docstring).
TARGETS = ("clean", "corrupted")


class Metric:
    """A metric as a circuit builder: ``build(circuit) -> circuit of shape []``.

    ``metric.circuit(c)`` builds it; ``metric(c)`` (or ``metric(c,
    evaluator=ev, device="cuda")``) evaluates it to a float.  ``targets``: which run's next tokens it scores
    when an experiment compares two runs (the module docstring); ``with_targets`` changes it.
    """

    def __init__(self, build: Callable[[Circuit], Circuit], name: str, *, targets: str = "clean"):
        if targets not in TARGETS:
            raise ExperimentError(f"metric {name}: targets must be 'clean' or 'corrupted', got {targets!r}")
        self.build = build
        self.name = name
        self.targets = targets

    def with_targets(self, targets: str) -> Metric:
        """This metric scoring the next tokens of the ``targets`` run (``"clean"`` or ``"corrupted"``)."""
        base = self.name.removesuffix(f"[targets={self.targets}]")
        name = base if targets == "clean" else f"{base}[targets={targets}]"
        return Metric(self.build, name, targets=targets)

    def circuit(self, circuit: Circuit) -> Circuit:
        node = check_node(
            self.build(circuit), f"metric {self.name}: the builder returned {{got}}", ExperimentError
        )
        if node.shape != ():
            raise ExperimentError(
                f"metric {self.name}: its circuit {node.describe()} has shape {list(node.shape)}; a metric "
                "gives one number (shape []): reduce it, e.g. with a mean"
            )
        return node

    def __call__(
        self,
        circuit: Circuit,
        *,
        evaluator: Evaluator | None = None,
        device: torch.device | str | None = None,
    ) -> float:
        """The metric of ``circuit``, evaluated on ``device`` (as ``cc.evaluate``'s), through
        ``evaluator`` if given."""
        device = check_device(device, f"metric {self.name}", ExperimentError)
        node = self.circuit(circuit)
        with torch.no_grad():
            if evaluator is not None:
                value = evaluator.evaluate(node, device=device)
            else:
                value = evaluate(node, device=device)
        return float(value)

    def __repr__(self) -> str:
        return f"<Metric {self.name}>"


def find(circuit: Circuit, name: str, what: str) -> Circuit:
    """The node called ``name`` (the root itself if it is), or an ExperimentError saying what is missing."""
    if circuit.name == name:
        return circuit
    found = circuit.get(name)
    if len(found) != 1:
        raise ExperimentError(
            f"{what}: expected one node named {name!r} in {circuit.describe()}, found {len(found)}"
            + (
                ""
                if found
                else " (is this a model circuit? the builders name the loss 't.loss', the logits 't.call')"
            )
        )
    return next(iter(found))


def _mean(node: Circuit, name: str) -> Einsum:
    """The mean of every element of ``node``: one Einsum with a Scalar ``1/numel``."""
    letters = EINSUM_LETTERS[: node.rank]
    count = 1
    for size in node.shape:
        count *= size
    return Einsum.from_einsum_string(
        f"{letters},->", node, Scalar(1.0 / max(count, 1), name=f"{name}.recip_count"), name=name
    )


def _mean_loss(circuit: Circuit) -> Circuit:
    return _mean(find(circuit, names.LOSS, "mean_loss"), "metric.mean_loss")


#: Mean of the per-token loss ``'t.loss'``.
mean_loss = Metric(_mean_loss, "mean_loss")


def logit_diff(
    position: int, good: Any, bad: Any, *, logits: str = names.LOGITS, push_down: bool = True
) -> Metric:
    """Mean over the batch of ``logits[..., position, good] - logits[..., position, bad]``.

    ``good`` and ``bad`` are token ids: ints, or one per batch row (a
    sequence or 1-D tensor of length B, for prompts with different answers).
    The logits are the node named ``logits`` (``'t.call'``), ``[S, V]`` or
    ``[B, S, V]``.  The circuit picks ``Index(logits, [..., position, :])``,
    gathers the two ids per row (``gen_index``) and averages the difference;
    with ``push_down`` (the default) the Index is pushed toward the leaves
    (``circuits.passes.push_index``), so the unembedding runs for that one
    position only.  The metric pickles, so an executor can send it to its workers.
    """
    try:
        position = operator.index(position)
    except TypeError:
        raise ExperimentError(f"logit_diff: position must be an int, got {shown(repr(position))}") from None
    good, bad = _token_ids(good, "good"), _token_ids(bad, "bad")
    build = _LogitDiff(position, good, bad, logits, push_down)
    return Metric(build, f"logit_diff(position={position}, good={_shown_ids(good)}, bad={_shown_ids(bad)})")


def _token_ids(ids: Any, argument: str) -> torch.Tensor:
    """``good`` or ``bad`` as a 1-D int64 tensor; anything but integer ids is an ExperimentError naming it."""
    items = ids if isinstance(ids, (list, tuple)) else [ids]
    try:
        tensor = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError):
        tensor = None
    if (
        tensor is None
        or tensor.dtype == torch.bool
        or tensor.is_floating_point()
        or tensor.is_complex()
        or any(isinstance(item, bool) for item in items)
    ):
        raise ExperimentError(
            f"logit_diff: {argument} must be integer token ids (an int, or one per batch row), got "
            f"{shown(repr(ids))}" + ("" if tensor is None else f" ({tensor.dtype})")
        )
    return tensor.reshape(-1).to(torch.int64).clone()  # the caller may edit theirs later


def _shown_ids(ids: torch.Tensor) -> Any:
    return ids.item() if ids.numel() == 1 else ids.tolist()


class _LogitDiff:
    """``logit_diff``'s builder: an object, not a closure, so that the metric pickles."""

    def __init__(self, position: int, good: Any, bad: Any, logits: str, push_down: bool):
        self.position, self.good, self.bad = position, good, bad
        self.logits, self.push_down = logits, push_down

    def __call__(self, circuit: Circuit) -> Circuit:
        position, good, bad, push_down = self.position, self.good, self.bad, self.push_down
        node = find(circuit, self.logits, "logit_diff")
        if node.rank not in (2, 3):
            raise ExperimentError(
                f"logit_diff: {node.describe()} has shape {list(node.shape)}; expected [S, V] or [B, S, V]"
            )
        seq, vocab = node.shape[-2:]
        if not -seq <= position < seq:
            raise ExperimentError(f"logit_diff: position {position} is out of range for {seq} positions")
        batched = node.rank == 3
        rows = node.shape[0] if batched else 1
        at = Index(node, (slice(None),) * (node.rank - 2) + (position, slice(None)), name="metric.logits_at")
        if push_down:
            at = _pushed_above_the_last_layer(at, node)
        picked = []
        for ids, label in ((good, "good"), (bad, "bad")):
            if ids.numel() == 1:
                ids = ids.expand(rows)
            if ids.numel() != rows:
                raise ExperimentError(
                    f"logit_diff: {label} has {ids.numel()} token ids for {rows} batch rows; give one id, "
                    "or one per row"
                )
            if bool(((ids < 0) | (ids >= vocab)).any()):
                raise ExperimentError(
                    f"logit_diff: {label} token ids {ids.tolist()[:8]} out of range [0, {vocab})"
                )
            index = Array(ids.clone() if batched else ids[0].clone(), name=f"metric.{label}_ids")
            spec = "gen_index_at_0_batch_x_c" if batched else "gen_index_at_0_c"
            picked.append(
                GeneralFunction.new_by_name(at, index, spec_name=spec, name=f"metric.{label}_logits")
            )
        letters = EINSUM_LETTERS[: picked[1].rank]
        negated = Einsum.from_einsum_string(
            f"{letters},->{letters}", picked[1], Scalar(-1.0, name="metric.neg"), name="metric.neg_bad_logits"
        )
        return _mean(Add(picked[0], negated, name="metric.logit_diffs"), "metric.logit_diff")


def _pushed_above_the_last_layer(at: Index, logits: Circuit) -> Circuit:
    """``at`` with its index pushed down through the unembedding, the final norm and the last layer,
    stopping at the residual stream the last layer reads (``'b{n-2}'``): every position of that
    stream is computed anyway, for the last layer's keys and values, so pushing further would compute
    the measured position a second time through every layer below (SmolLM2's 30 layers: 6 times
    the CPU time of the whole forward).  A circuit without two named layers is pushed all the way.
    """
    from circuits.passes import push_index

    blocks: dict[int, list[Circuit]] = {}
    for node in unique_nodes([logits]):
        parsed = names.parse(node.name) if node.name is not None else None
        if parsed is not None and parsed.kind == "block":
            blocks.setdefault(parsed.layer, []).append(node)
    below = [layer for layer in blocks if layer < max(blocks, default=0)]
    return push_index(at, stop_at=blocks[max(below)] if below else ())


def kl_div(clean: Circuit, *, log_probs: str = "log_probs") -> Metric:
    """Mean over batch and positions of KL(clean || circuit) between next-token distributions.

    ``clean`` is the unablated circuit; both it and the measured circuit
    must have a node named ``log_probs`` (``[..., V]`` log-softmax of the
    logits, as the builders make).  The circuit is
    ``Einsum(exp(lp_clean), lp_clean - lp, 1/N)``: the clean nodes are the
    very nodes of ``clean``, so a cached evaluator computes them once.
    """
    clean_lp = find(clean, log_probs, "kl_div")
    clean_p = GeneralFunction.new_by_name(clean_lp, spec_name="exp", name="metric.clean_probs")

    def build(circuit: Circuit) -> Circuit:
        lp = find(circuit, log_probs, "kl_div")
        if lp.shape != clean_lp.shape:
            raise ExperimentError(
                f"kl_div: {log_probs!r} has shape {list(lp.shape)} here but {list(clean_lp.shape)} "
                "in the clean circuit"
            )
        letters = EINSUM_LETTERS[: lp.rank]
        neg = Einsum.from_einsum_string(
            f"{letters},->{letters}", lp, Scalar(-1.0, name="metric.neg"), name="metric.neg_lp"
        )
        diff = Add(clean_lp, neg, name="metric.log_ratio")
        positions = 1
        for size in lp.shape[:-1]:
            positions *= size
        return Einsum.from_einsum_string(
            f"{letters},{letters},->",
            clean_p,
            diff,
            Scalar(1.0 / max(positions, 1), name="metric.recip_positions"),
            name="metric.kl_div",
        )

    return Metric(build, "kl_div")
