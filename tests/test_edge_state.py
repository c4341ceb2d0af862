"""``EdgeState`` (ACDC's incremental evaluation): after any sequence of removed edges, its metric,
its trials and its held receiver inputs equal the edge circuit evaluated whole with the same masks
(``cc.evaluate`` of the rewritten circuit, no state), and the senders that only the metric's one
position reads are evaluated at that position alone."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.experiments as ex
import circuits.models as cm
from circuits.errors import ExperimentError
from circuits.experiments.discovery_metric import DiscoveryMetric
from circuits.experiments.edge_state import EdgeState

import factories as f


@pytest.fixture(scope="module")
def edges():
    hf = f.gpt2(perturb=f.scaled_weights, n_layer=2, n_head=3, n_embd=15).double()
    clean, corrupted = (f.token_ids(f.FAMILY_VOCAB, (3, 7), seed=s) for s in (0, 1))
    c = cm.from_hf(hf, clean)
    return ex.edge_circuit(c, ablation="resample", corrupted_inputs={"toks_int_var": corrupted})


def _state(edges, spec):
    masks = {r.name: r.mask.value.clone() for r in edges.receivers}
    return EdgeState(edges, spec.root(edges.circuit), masks, lambda c, i: cc.evaluate(c, i), spec.value)


def _whole(edges, spec, masks) -> float:
    """The metric of the edge circuit with ``masks``, evaluated whole (the reference)."""
    return spec.value(cc.evaluate(spec.root(edges.with_masks(masks).circuit)))


@pytest.mark.slow  # the whole edge circuit evaluated per trial: ~40 of them
@pytest.mark.parametrize("position", [-1, None])
def test_the_state_matches_the_whole_circuit_after_removals(edges, position):
    spec = DiscoveryMetric("kl", edges, position=position, what="test")
    state = _state(edges, spec)
    assert abs(state.value - _whole(edges, spec, {})) < 1e-12
    masks = {r.name: r.mask.value.clone() for r in edges.receivers}
    generator = torch.Generator().manual_seed(0)
    for receiver in reversed(edges.receivers):  # ACDC's order: from the logits down
        for index in torch.randperm(receiver.n_senders, generator=generator)[: receiver.n_senders // 2]:
            mask = masks[receiver.name].clone()
            mask[index] = 0
            trial = state.trial({receiver.name: mask})
            expected = _whole(edges, spec, {**masks, receiver.name: mask})
            assert abs(trial.value - expected) < 1e-10, (receiver.name, int(index))
            if int(index) % 2 == 0:  # some removals kept, some not: both paths continue
                state.commit(trial)
                masks[receiver.name] = mask
    assert abs(state.value - _whole(edges, spec, masks)) < 1e-10
    rebuilt = edges.with_masks(masks)
    for receiver in rebuilt.receivers:
        if receiver.name in state.used:
            whole = cc.evaluate(receiver.input)
            at = state.held[receiver.name]
            whole = whole if at is None else whole[..., at : at + 1, :]
            assert (state.inputs[receiver.name] - whole).abs().max() < 1e-10, receiver.name
    if position is None:
        assert all(at is None for at in state.sender_at.values())
    else:  # the last layer's heads and MLP only feed the logits: evaluated at the last position
        last, final = edges.senders.index("b1.m"), edges.sender_nodes[0].shape[-2] - 1
        assert state.sender_at[last] == final == 5
        assert state.parts[last][final].template.shape == (3, 1, 15)


def test_every_edge_removed_reads_only_ablated_values(edges):
    spec = DiscoveryMetric("kl", edges, position=-1, what="test")
    state = _state(edges, spec)
    zeros = {r.name: torch.zeros_like(r.mask.value) for r in edges.receivers}
    assert abs(state.trial(zeros).value - _whole(edges, spec, zeros)) < 1e-10


def test_a_position_asked_of_a_value_held_at_another_is_refused():
    from circuits.experiments.edge_state import _at

    with pytest.raises(ExperimentError, match="held at position 3"):
        _at(torch.zeros(2, 1, 4), 3, None)
