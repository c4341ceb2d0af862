"""A head sweep's predicted peak, and a sweep, a patching grid and attribution patching within a budget
(issue 31 item 4), on the 1B Llama of bench/memory_peak.py in bfloat16.

1. ``sweep_plan``'s peak (less the weights) against the peak torch's profiler measures over the
   sweep (zero-ablating heads 0-7 of layer 0 and of the last layer, mean loss): target within 10%.
2. The same sweep with ``memory_bytes`` (``--budget-mib``; by default halfway between the least it
   accepts and its unbudgeted peak): the
   measured peak against the budget, and the largest difference from the unbudgeted results.
3. A ``resid_pre`` patching grid (layers 0 and the last) within the same budget: the measured peak.
4. Attribution patching (resid_pre, attn_out, mlp_out, z): with a budget below ``cc.cost``'s bound
   (``memory_budget.tracked_bytes``), the ``CacheError`` and how long refusing took; with one above,
   the measured peak against the bound.
Measured: the running sum of the profiler's memory events (what the weights already hold is not
in it).  Tokens: ``--batch`` x ``--seq``, a corrupted copy with one token changed.

    python bench/memory_budget.py            # 1B (several minutes; 10 GB of memory)
    python bench/memory_budget.py --quick    # a 4-layer model of d_model 256, seconds
"""

from __future__ import annotations

import time

import torch
from memory_peak import MiB, TARGET, llama, model_arguments, profiled

from circuits import experiments as ex
from circuits import models
from circuits.errors import CacheError


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 5] - logits[:, -1, 9]).mean()


def main() -> None:
    parser = model_arguments(__doc__)
    parser.add_argument(
        "--budget-mib",
        type=float,
        default=None,
        help="default: halfway between the least the sweep accepts and its unbudgeted peak",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = llama(args.quick, torch.bfloat16)
    tokens = torch.randint(0, 1000, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1))
    corrupted = tokens.clone()
    corrupted[:, args.seq // 2] = (corrupted[:, args.seq // 2] + 7) % 1000
    circuit = models.from_hf(model, tokens)
    last = model.config.num_hidden_layers - 1
    heads = [
        f"b{layer}.a.head{h}" for layer in (0, last) for h in range(min(8, model.config.num_attention_heads))
    ]
    sweep_ratio, sweep_budget, sweep_fit = sweep_peaks(circuit, heads, args.budget_mib)
    budget = int(args.budget_mib * MiB) if args.budget_mib else sweep_budget
    inputs = {"toks_int_var": corrupted}
    _, grid_peak = profiled(
        lambda: ex.patch_grid(circuit, inputs, logit_diff, "resid_pre", layers=[0, last], memory_bytes=budget)
    )
    grid_fit = grid_peak / budget
    print(
        f"resid_pre grid within {budget / MiB:.1f} MiB: measured {grid_peak / MiB:.1f} MiB ({grid_fit:.3f})"
    )
    attribution_fit = attribution_peaks(circuit, inputs, budget)
    fits = all(x <= 1 for x in (sweep_fit, grid_fit, attribution_fit))
    verdict = "within" if abs(sweep_ratio - 1) <= TARGET else "outside"
    print(
        f"headline: sweep peak predicted/measured {sweep_ratio:.3f} ({verdict} {TARGET:.0%}); budgeted peaks / budget: "
        f"sweep {sweep_fit:.3f}, grid {grid_fit:.3f}, attribution {attribution_fit:.3f} of its bound "
        f"({'all within' if fits else 'NOT all within'})"
    )


def sweep_peaks(circuit, heads: list[str], budget_mib: float | None) -> tuple[float, int, float]:
    """``(predicted / measured peak, budget, budgeted peak / budget)`` of the sweep of ``heads``; the
    budget by default halfway between the least it takes and its unbudgeted peak."""
    plan = ex.sweep_plan(circuit, heads)
    weights = ex.sweep_plan(circuit, []).cost.held_bytes
    clean, measured = profiled(lambda: ex.sweep(circuit, heads, progress=False))
    predicted = plan.peak_bytes - weights
    print(
        f"sweep of {len(heads)} heads: peak predicted {predicted / MiB:.1f} MiB, measured {measured / MiB:.1f} MiB, "
        f"ratio {predicted / measured:.3f}",
        flush=True,
    )
    least = _needed(lambda: ex.sweep(circuit, heads, progress=False, memory_bytes=1)) * 20 // 19
    budget = int(budget_mib * MiB) if budget_mib else (least + measured) // 2
    budgeted, peak = profiled(lambda: ex.sweep(circuit, heads, progress=False, memory_bytes=budget))
    worst = max(abs(budgeted[h] - clean[h]) for h in heads)
    print(
        f"sweep within {budget / MiB:.1f} MiB: measured {peak / MiB:.1f} MiB ({peak / budget:.3f} of it); "
        f"largest difference from the unbudgeted sweep {worst:.2e}",
        flush=True,
    )
    return predicted / measured, budget, peak / budget


def attribution_peaks(circuit, inputs, budget: int) -> float:
    """Attribution patching refused below its bound, then run within twice it: measured / bound."""
    start = time.perf_counter()
    try:
        ex.attribution_patching(circuit, inputs, logit_diff, memory_bytes=budget)
        refused = "not refused"
    except CacheError as error:
        refused = f"refused in {time.perf_counter() - start:.2f} s: {error}"
    print(f"attribution patching within {budget / MiB:.1f} MiB: {refused}", flush=True)
    bound = _needed(lambda: ex.attribution_patching(circuit, inputs, logit_diff, memory_bytes=1))
    _, peak = profiled(lambda: ex.attribution_patching(circuit, inputs, logit_diff, memory_bytes=2 * bound))
    print(
        f"attribution patching: bound {bound / MiB:.1f} MiB, measured {peak / MiB:.1f} MiB ({peak / bound:.3f})"
    )
    return peak / bound


def _needed(run) -> int:
    """The bytes an experiment says it needs, read from its refusal of a 1-byte budget."""
    try:
        run()
    except CacheError as error:
        return error.needed_bytes
    raise AssertionError("a 1-byte budget was not refused")


if __name__ == "__main__":
    main()
