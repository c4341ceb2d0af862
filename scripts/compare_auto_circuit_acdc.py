"""Compare our ACDC with auto-circuit's on the same tiny TransformerLens model.

    .venv/bin/python scripts/compare_auto_circuit_acdc.py     # prints the comparison

The model, prompts and venv are ``compare_auto_circuit.py``'s (auto-circuit 1.0.1 needs
TransformerLens 2: /tmp/ac-venv).  Stage one, there: the seeded 2-layer model in float64, and
auto-circuit's ACDC (``acdc_prune_scores``, KL at the last position, resample ablation from the
corrupted prompts) at each threshold of ``TAUS``, one run per threshold (``tao_bases=[tau]``,
``tao_exps=[0]``), twice: in auto-circuit's own edge order (``sorted(model.edges, key=dest.layer,
reverse=True)`` over a ``set``: within a layer, the order of the edges' hashes, which differs
from one process to the next even at a fixed ``PYTHONHASHSEED``, since an edge's fields hold
``None`` and Python 3.11 hashes ``None`` by its address), and in ours (the receivers from the
logits down, value before key before query, each one's senders from the latest to the embeddings;
``model.edges`` is given in that order, which the stable sort keeps).  Each run's KL after every
edge is recorded (auto-circuit's ``multibatch_kl_div``, wrapped), and with it each edge's delta
(KL minus the KL of the circuit so far, ACDC's test).  Stage two, here: ``ex.acdc`` on the same
state dict (``from_transformer_lens``) with ``metric="kl", position=-1, ablation="resample"`` at
each threshold; the kept edges, the visit order and each edge's delta side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_auto_circuit as base  # noqa: E402

TAUS = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2)
ROLE = {"V": 0, "K": 1, "Q": 2}


def our_order(edge) -> tuple:
    """Our visit order as a sort key on auto-circuit's ``Edge``: receivers from the logits down
    (auto-circuit's ``layer`` counts attention and MLP as one each), the heads from the last,
    value, key, query; then senders from the latest written."""
    dest, src = edge.dest, edge.src
    role = ROLE[dest.name.rsplit(".", 1)[1]] if dest.name.count(".") == 2 else 0
    return (-dest.layer, -(dest.head_idx or 0), role, -src.layer, -(src.head_idx or 0))


def run_acdc(patchable, loader, tau: float, order) -> dict:
    """auto-circuit's ACDC at ``tau`` with ``model.edges`` in ``order`` (None: its own); the
    visited edges, their deltas and the kept edges."""
    import auto_circuit.prune_algos.ACDC as acdc_module
    import torch

    faiths = []
    kl = acdc_module.multibatch_kl_div

    def recording(out_logprobs, clean_logprobs):
        value = kl(out_logprobs, clean_logprobs)
        faiths.append(float(value))
        return value

    edges = patchable.edges
    if order is not None:
        patchable.edges = sorted(edges, key=order)
    visited = [e.name for e in sorted(patchable.edges, key=lambda x: x.dest.layer, reverse=True)]
    acdc_module.multibatch_kl_div = recording
    try:
        scores = acdc_module.acdc_prune_scores(
            patchable, loader, None, tao_exps=[0], tao_bases=[tau], faithfulness_target="kl_div"
        )
    finally:
        acdc_module.multibatch_kl_div, patchable.edges = kl, edges
    deltas, previous = [], 0.0
    for faith in faiths:  # acdc_prune_scores' own test: faith - prev_faith < tau removes the edge
        deltas.append(faith - previous)
        previous = faith if faith - previous < tau else previous
    kept = sorted(e.name for e in edges if torch.isinf(e.prune_score(scores)))
    return dict(visited=visited, deltas=deltas, kept=kept)


def stage_auto_circuit(out: Path) -> None:
    """In the auto-circuit venv: auto-circuit's ACDC at each of ``TAUS``, in both orders."""
    import torch
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.utils.graph_utils import patchable_model

    model, clean, corrupt, answers, wrong = base.tiny_model()
    model = model.to(torch.float64)
    model.cfg.dtype = torch.float64
    state = {k: v.clone() for k, v in model.state_dict().items()}
    dataset = PromptDataset(clean, corrupt, list(answers), list(wrong))
    loader = PromptDataLoader(dataset, seq_len=None, diverge_idx=0, batch_size=8, shuffle=False)
    patchable = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True)
    runs = {
        (tau, name): run_acdc(patchable, loader, tau, order)
        for tau in TAUS
        for name, order in (("theirs", None), ("ours", our_order))
    }
    from importlib.metadata import version

    versions = {p: version(p) for p in ("torch", "auto-circuit", "transformer-lens")}
    torch.save(dict(state=state, clean=clean, corrupt=corrupt, runs=runs, versions=versions), out)


def stage_ours(data: dict) -> None:
    import circuits.experiments as ex
    import circuits.models as cm
    from circuits.errors import NoCircuitError

    c = cm.from_transformer_lens(data["state"], data["clean"], family="gpt2", convention="prompt")
    edges = ex.edge_circuit(c, ablation="resample", corrupted_inputs={"toks_int_var": data["corrupt"]})
    print("versions:", data["versions"])
    for tau in TAUS:
        try:
            ours = ex.acdc(edges, None, "kl", threshold=tau, position=-1, ablation="resample")
        except NoCircuitError as error:
            print(f"\nthreshold {tau:g}: ours keeps no edge (largest delta {error.largest_delta:.3g})")
            for name in ("ours", "theirs"):
                print(f"  auto-circuit in {name:6s} order: keeps {len(data['runs'][tau, name]['kept'])}")
            continue
        print(f"\nthreshold {tau:g}: ours keeps {len(ours.kept)} of {len(ours.edges.edges)} edges")
        for name in ("ours", "theirs"):
            run = data["runs"][tau, name]
            theirs = {base.our_name(e) for e in run["kept"]}
            visited = [base.our_name(e) for e in run["visited"]]
            same = theirs == set(ours.kept)
            print(
                f"  auto-circuit in {name:6s} order: keeps {len(theirs)}, "
                f"{'the same edges' if same else 'DIFFERENT edges'}"
            )
            if not same:
                print(f"    ours only: {sorted(set(ours.kept) - theirs)}")
                print(f"    auto-circuit only: {sorted(theirs - set(ours.kept))}")
            if name == "ours":
                assert visited == [s.edge for s in ours.steps], "the orders differ"
                delta = dict(zip(visited, run["deltas"]))
                gaps = [abs((s.delta or 0.0) - delta[s.edge]) for s in ours.steps]
                untested = [abs(delta[s.edge]) for s in ours.steps if not s.tested]
                print(
                    f"    same visit order; largest |delta ours - delta auto-circuit| {max(gaps):.3g} "
                    f"(largest |delta| {max(abs(d) for d in delta.values()):.3g}; "
                    f"{sum(not s.tested for s in ours.steps)} edges ours prunes untested, "
                    f"auto-circuit's |delta| there at most {max(untested, default=0.0):.3g})"
                )


def main() -> None:
    base.run_stages(
        __file__, __doc__.splitlines()[0], Path("/tmp/auto_circuit_acdc.pt"), stage_auto_circuit, stage_ours
    )


if __name__ == "__main__":
    main()
