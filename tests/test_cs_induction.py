"""Causal scrubbing on the shipped induction model: the known mechanism recovers the loss, a wrong
hypothesis does not, on each of 5 seeds; and the report's numbers are what scrubbing each
hypothesis by hand gives.

The mechanism (found in notebooks 02 and 05): head 1.1 reads the current token's embedding into
its queries and the token embeddings into its values, and finds the key position through the
outputs of the previous-token heads 0.1 and 0.2 in its keys.  The loss is the mean loss on the
repeated half of ``BOS + block + block`` rows.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits import models
from circuits.causal_scrubbing import (
    Correspondence,
    Dataset,
    ExactSampler,
    Experiment,
    InterpNode,
    corr_root_matcher,
    scrub_losses,
)
from circuits.models.demo_model import repeat_mask, repeated_tokens

BLOCK = 8
REPEAT = repeat_mask(BLOCK, 1, 2 * BLOCK)[0]


def repeat_loss(per_token: torch.Tensor) -> float:
    return per_token[:, REPEAT].mean().item()


@pytest.fixture(scope="module")
def setup():
    tokens = repeated_tokens(256, BLOCK, seed=1)
    circuit = cc.passes.split_heads(cc.passes.causal_mask(models.load_demo_model(tokens[:2])))
    return circuit, Dataset.from_tokens(tokens)


def with_targets() -> tuple[Correspondence, InterpNode]:
    """The root, and the labels (the targets' path) exact: the scrambled baseline."""
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    corr.add(root.make_descendant(ExactSampler(), "targets"), corr_root_matcher.chain("true_toks_int"))
    return corr, root


def induction(head: str = "b1.a.head1", previous: tuple[str, ...] = ("b0.a.head1", "b0.a.head2")):
    corr, root = with_targets()
    branch = corr_root_matcher.chain(head)
    node = root.make_descendant(ExactSampler(), "induction")
    corr.add(node, branch)

    def role(reader):  # the head's own reader, not a layer-0 head's below the norm
        return branch.then(reader, term_early_at="a1.norm")

    direct = cc.Matcher.regex(r"^b0\.a$")  # the embeddings' direct route, not through layer 0
    corr.add(
        node.make_descendant(ExactSampler(), "q.embed"),
        cc.chain_excluding(role("a.q"), "idxed_embeds", direct),
    )
    corr.add(
        node.make_descendant(ExactSampler(), "v.embed"),
        cc.chain_excluding(role("a.v"), "idxed_embeds", direct),
    )
    for prev in previous:
        corr.add(node.make_descendant(ExactSampler(), f"k.{prev}"), role("a.k").then(prev))
    return corr


def test_the_mechanism_recovers_the_loss_and_a_wrong_one_does_not(setup):
    circuit, dataset = setup
    hypotheses = {
        "scrambled": with_targets()[0],
        "induction": induction(),
        "wrong head": induction(head="b1.a.head2"),
        "wrong keys": induction(previous=("b0.a.head0",)),
    }
    report = scrub_losses(circuit, dataset, hypotheses, 64, metric=repeat_loss, seeds=range(5))
    assert all(kept > 0.95 for kept in report.recovered("induction")), report
    assert all(kept < 0.05 for kept in report.recovered("wrong head")), report
    assert all(kept < 0.7 for kept in report.recovered("wrong keys")), report
    assert all(loss > 5 for loss in report.losses["scrambled"]) and max(report.clean) < 0.1, report
    assert "induction" in str(report) and len(report.rows()) == 5


def test_the_report_is_each_hypothesis_scrubbed_by_hand(setup):
    circuit, dataset = setup
    report = scrub_losses(
        circuit,
        dataset,
        {"scrambled": with_targets()[0], "induction": induction()},
        32,
        metric=repeat_loss,
        seeds=[7],
    )
    scrubbed = Experiment(circuit, dataset, induction(), random_seed=7).scrub(32)
    ref_tokens = scrubbed.ref_ds.toks_int_var.value
    clean = cc.passes.split_heads(cc.passes.causal_mask(models.load_demo_model(ref_tokens))).evaluate()
    assert report.clean == [repeat_loss(clean)]
    assert report.losses["induction"] == [repeat_loss(scrubbed.evaluate())]
    base = report.losses["scrambled"][0]
    assert report.recovered("induction") == [
        (base - report.losses["induction"][0]) / (base - report.clean[0])
    ]
