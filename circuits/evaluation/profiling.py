"""``cc.profile(c)``: evaluate a circuit timing every node, and where the time went.

The evaluator runs one step per distinct node, in order; ``Plan.run(on_value=...)`` is called
after each.  The time between two calls is the *self* time of the node just computed (its
kernel plus the scheduler's per-step work), so the timer costs one clock read per node
(``bench/profile_overhead.py`` measures the overhead against an unprofiled evaluation).  A node's
*total* time is the self time of every distinct node in its subtree, each counted once, as the
evaluator computes it once.  Steps are sequential on the CPU; on a GPU, kernels are asynchronous,
so ``profile(..., synchronize=True)`` waits for each (slower, but per-node times are then real).

The result prints as the circuit itself with each node's times as ``#`` comments (the text still
parses), as a table per node name (self time, total time, their shares of the run, the time per
call, how many nodes of that name ran: "calls"), sorted by self time, per group of a label
function (``grouped``: ``circuits.experiments.cost_groups.module_table`` makes torch.profiler's module view of
an import from it), and exports to the Chrome trace format torch's profiler writes
(``chrome://tracing``, Perfetto).  docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from circuits.errors import EvaluationError
from circuits.evaluation import compile_plan
from circuits.core.nodes import Circuit, check_node
from circuits.core.traversal import unique_nodes

__all__ = ["Profile", "profile"]


@dataclasses.dataclass(frozen=True)
class Profile:
    """Per distinct node (by hash): ``self_seconds`` and ``started`` (seconds from the run's
    start); ``nodes`` in the order they ran; ``seconds``: the whole run; ``root``: what ran."""

    root: Circuit
    nodes: list[Circuit]
    self_seconds: dict[bytes, float]
    started: dict[bytes, float]
    seconds: float

    def total_seconds(self, *nodes: Circuit) -> float:
        """The self time of every distinct node in the subtrees of ``nodes`` that ran, each
        counted once (one walk of those subtrees)."""
        return sum(self.self_seconds.get(node.hash, 0.0) for node in unique_nodes(list(nodes)))

    def comment(self, node: Circuit) -> str | None:
        """``# self ..., total ...`` for ``c.print(comment=profile.comment)``."""
        if node.hash not in self.self_seconds:
            return None
        return f"self {_ms(self.self_seconds.get(node.hash, 0.0))}, total {_ms(self.total_seconds(node))}"

    def repr(self, depth: int | None = 3) -> str:
        """The circuit, down to ``depth``, each node commented with its times."""
        return self.root.repr(depth=depth, comment=self.comment)

    def rows(self, top: int | None = None) -> list[tuple[str, float, float, int]]:
        """``(name, self seconds, total seconds, calls)`` per node name (unnamed nodes by
        variant), the ``top`` largest self times first; total is the subtrees of all the nodes of
        that name together, each node once; calls is how many such nodes ran."""
        grouped: dict[str, list[Circuit]] = {}
        for node in self.nodes:
            grouped.setdefault(node.name if node.name is not None else f"<{node.kind}>", []).append(node)
        selfs = {name: sum(self.self_seconds[n.hash] for n in nodes) for name, nodes in grouped.items()}
        ranked = sorted(grouped, key=lambda name: -selfs[name])[:top]
        return [
            (name, selfs[name], self.total_seconds(*grouped[name]), len(grouped[name])) for name in ranked
        ]

    def table(self, top: int | None = 20) -> str:
        """The ``rows`` as text, in torch.profiler's ``key_averages().table()`` columns: self time and
        its share of the run's, total time and its share, total time per call, and the calls."""
        rows = self.rows(top)
        run = sum(self.self_seconds.values()) or 1.0  # the run's self times together: 100%
        width = max([len("Node")] + [len(name) for name, *_ in rows])
        header = [
            "Self CPU %",
            "Self CPU total",
            "CPU total %",
            "CPU total",
            "CPU time avg",
            "Number of Calls",
        ]
        lines = [" | ".join([f"{'Node':{width}s}"] + header)]
        lines.append("-|-".join(["-" * width] + ["-" * len(column) for column in header]))
        for name, self_s, total_s, calls in rows:
            cells = [
                f"{100 * self_s / run:.2f}%",
                _ms(self_s),
                f"{100 * total_s / run:.2f}%",
                _ms(total_s),
                _ms(total_s / calls),
                str(calls),
            ]
            lines.append(
                " | ".join([f"{name:{width}s}"] + [f"{c:>{len(h)}s}" for c, h in zip(cells, header)])
            )
        lines.append(f"{len(self.nodes)} nodes ran in {_ms(self.seconds)}")
        return "\n".join(lines)

    def grouped(
        self, label: Callable[[Circuit], str | None], rest: str = "(rest)"
    ) -> dict[str, tuple[float, int]]:
        """``(self seconds, nodes)`` per group: ``label(node)`` starts a group at a node (None: the node
        joins its parent's), as ``CircuitCost.grouped`` groups; a node reached through several groups
        counts once, in the first the pre-order walk from the root reaches it through."""
        groups: dict[str, tuple[float, int]] = {}
        seen: set[bytes] = set()
        stack = [(self.root, rest)]
        while stack:
            node, inherited = stack.pop()
            if node.hash in seen:
                continue
            seen.add(node.hash)
            group = label(node) or inherited
            if node.hash in self.self_seconds:
                seconds, count = groups.get(group, (0.0, 0))
                groups[group] = (seconds + self.self_seconds[node.hash], count + 1)
            stack.extend((child, group) for child in reversed(node.children))
        return groups

    def tree(self, depth: int = 3) -> str:
        """The reference profiler's nested table: one row per node down to ``depth``, indented
        like the circuit (``├──``), each node written once (a shared node's later occurrences
        are left out), with its self and total time."""
        rows: list[tuple[str, str, str]] = []
        seen: set[bytes] = set()
        stack: list[tuple[Circuit, str, str]] = [(self.root, "", "")]
        while stack:
            node, prefix, branch = stack.pop()
            if node.hash in seen:
                continue
            seen.add(node.hash)
            label = prefix + branch + (node.name if node.name is not None else f"<{node.kind}>")
            ran = node.hash in self.self_seconds
            rows.append(
                (label, _ms(self.self_seconds[node.hash]) if ran else "", _ms(self.total_seconds(node)))
            )
            level = len(prefix) + (1 if branch else 0)
            if level >= depth:
                continue
            children = [child for child in node.children if child.hash not in seen and child.children]
            inner = prefix + ("│" if branch == "├── " else "" if not branch else " ")
            for position, child in reversed(list(enumerate(children))):
                stack.append((child, inner, "└── " if position == len(children) - 1 else "├── "))
        width = max(len(label) for label, _, _ in rows)
        lines = [f"{'Node':{width}s} | Self CPU total | CPU total"]
        lines.append(f"{'-' * width}-|----------------|-----------")
        lines += [f"{label:{width}s} | {self_s:>14s} | {total:>9s}" for label, self_s, total in rows]
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The run as Chrome trace events (``ph: X``, microseconds), one per node."""
        events = [
            {
                "name": node.name or f"<{node.kind}>",
                "cat": node.kind,
                "ph": "X",
                "ts": self.started[node.hash] * 1e6,
                "dur": self.self_seconds[node.hash] * 1e6,
                "pid": 0,
                "tid": 0,
                "args": {"shape": list(node.shape)},
            }
            for node in self.nodes
        ]
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str | Path) -> None:
        """Write ``chrome_trace()`` as JSON to ``path`` (as ``torch.profiler``'s export does)."""
        Path(path).write_text(json.dumps(self.chrome_trace()))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}ms"


def profile(
    circuit: Circuit,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    synchronize: bool = False,
) -> Profile:
    """Evaluate ``circuit`` (``cc.evaluate``'s arguments) timing every node; see the module."""
    check_node(circuit, "profile: the circuit", EvaluationError)
    plan = compile_plan([circuit], inputs, device, dtype)
    order: list[Circuit] = []
    self_seconds: dict[bytes, float] = {}
    started: dict[bytes, float] = {}
    cuda = synchronize and torch.cuda.is_available()
    clock = time.perf_counter
    start = last = clock()

    def on_value(node: Circuit, value: torch.Tensor) -> None:
        nonlocal last
        if cuda:
            torch.cuda.synchronize()
        now = clock()
        if node.hash not in self_seconds:
            order.append(node)
            self_seconds[node.hash] = now - last
            started[node.hash] = last - start
        last = now

    plan.run(on_value=on_value)
    return Profile(circuit, order, self_seconds, started, clock() - start)
