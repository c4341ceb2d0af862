"""``EdgeState``: a masked edge circuit held as tensors, a mask change propagated through what it changes.

ACDC tests one edge at a time against the circuit so far.  Evaluating the whole edge circuit per
test (even through a cache) recomputes every receiver's masked sum above the tested one; this state
holds instead, for the current masks ``m``:

- every sender's value ``S_s`` (the component evaluated on its receivers' current inputs);
- every receiver's input ``X_r = sum_s m_rs S_s + (1 - m_rs) A_s + B_r`` (``A``: the senders'
  ablated values, ``'edges.ablated'``, 0 under zero ablation; ``B_r``: the attention output biases).

A test changes one receiver's mask, so its input by ``(m' - m)(S_s - A_s)`` for the flipped senders;
its component is evaluated again (its circuit, the receivers' inputs bound as Symbols), and the
change of its output ``S' - S`` is added to every later receiver that reads it (mask entry not 0),
component after component, up to the metric.  A component no kept edge reads is not evaluated (its
value can change nothing: ACDC only ever removes edges).  What a test costs is the components on a
kept path above the receiver, and no masked sum.

Positions: the metric may read one position of the logits receiver's input (``"kl"`` at a
``position``: an Index pushed down to it).  Each component is then evaluated at the positions its
readers read (``push_index`` through its circuit, from the metric down): with KL at the last
position, the last layer runs on one query position, its MLP on one position, and the logits on one.

An input is updated by adding the change (one add per flipped sender or changed component), not
summed again: its rounding differs from a fresh sum's by a few ulps after a run's updates.
"""

from __future__ import annotations

import heapq
from typing import Callable

import torch

from circuits.core.nodes import Add, Circuit, Index, Symbol
from circuits.core.traversal import unique_nodes
from circuits.errors import ExperimentError
from circuits.evaluation import evaluate
from circuits.rewriting.passes.push_down import push_index
from circuits.rewriting.rewrite import replace

__all__ = ["EdgeState", "Trial"]


class _Part:
    """A component (a sender, or the metric) as a circuit over Symbols bound to its receivers' inputs:
    ``symbols`` maps each receiver it reads to (its Symbol, the position it reads or None: all);
    ``at``: the position it is evaluated at (None: all)."""

    def __init__(self, template: Circuit, symbols: dict[str, tuple[Symbol, int | None]], at: int | None):
        self.template, self.symbols, self.at = template, symbols, at


class Trial:
    """A tested mask change: the ``value`` of the metric under it, and the inputs and sender values
    it changed (``EdgeState.commit`` makes them the state)."""

    def __init__(self, value: float, masks: dict, inputs: dict, senders: dict):
        self.value, self.masks, self.inputs, self.senders = value, masks, inputs, senders


class EdgeState:
    """``edges`` (a masked ``EdgeCircuit``) at ``masks`` with the metric circuit ``root`` over it;
    ``evaluate(circuit, inputs)`` evaluates a component (an ``Evaluator``'s, or ``cc.evaluate``);
    ``value(tensor)`` turns the metric's value into a number."""

    def __init__(
        self, edges, root: Circuit, masks: dict[str, torch.Tensor], evaluate_fn: Callable, value: Callable
    ):
        self.evaluate_fn, self.value_of = evaluate_fn, value
        self.receivers = {r.name: r for r in edges.receivers}
        self.top = len(edges.senders)  # the metric's key among the components (the senders: 0, 1, ...)
        self.masks = {name: [float(x) for x in mask] for name, mask in masks.items()}
        inputs = {r.input.name: r.name for r in edges.receivers}
        self.parts: dict[int, _Part] = {}
        self.readers: dict[int, list[str]] = {j: [] for j in range(len(edges.senders))}
        for r in edges.receivers:
            for s in range(r.n_senders):
                self.readers[s].append(r.name)
        self.reads: dict[str, list[int]] = {r.name: [] for r in edges.receivers}  # parts reading r
        self._build_parts(edges, root, inputs)
        self.sender_at: dict[int, int | None] = dict.fromkeys(range(self.top))  # None: every position
        self.held: dict[str, int | None] = dict.fromkeys(self.receivers)  # each input's position
        self.sender_at, self.held, self.used = self._positions()
        self.ablated = None if edges.ablated is None else edges.ablated.value
        self.ablated_sums: dict[int, torch.Tensor] = {}
        self.biases = {r.name: self._bias(r) for r in edges.receivers}
        self.senders: dict[int, torch.Tensor] = {}
        self.inputs: dict[str, torch.Tensor] = {}
        embeds = evaluate_fn(edges.sender_nodes[0], {})
        self.senders[0] = _at(embeds, None, self.sender_at[0])
        for j in range(1, self.top):
            part = self._part_of(j)
            for name in part.symbols:
                if name not in self.inputs:
                    self.inputs[name] = self._summed(name, self.masks[name])
            self.senders[j] = self._run(part, self.inputs)
        for name in self._part_of(self.top).symbols:
            self.inputs.setdefault(name, self._summed(name, self.masks[name]))
        self.value = self._metric(self.inputs)

    # ------------------------------------------------------------------ building

    def _build_parts(self, edges, root: Circuit, inputs: dict[str, str]) -> None:
        """Each component's circuit over its receivers' inputs, at every position and, where the
        metric reads one position of the logits, at that one (``push_index`` through it)."""
        metric = _part(root, inputs, None)
        self.parts: dict[int, dict[int | None, _Part]] = {self.top: {None: metric}}
        self.point = _one({position for _, position in metric.symbols.values()})
        for j in range(1, self.top):
            node = edges.sender_nodes[j]
            self.parts[j] = {None: _part(node, inputs, None)}
            if self.point is not None:
                self.parts[j][self.point] = _part(node, inputs, self.point)
        for key, variants in self.parts.items():
            for name in variants[None].symbols:
                self.reads[name].append(key)

    def _part_of(self, key: int) -> _Part:
        return self.parts[key][None if key == self.top else self.sender_at[key]]

    def _positions(self):
        """Where each sender is evaluated and each input held, from the kept edges down: a sender
        whose kept readers all read one position is evaluated at that one.  Also the receivers
        whose input some kept path reads (``used``)."""
        need: dict[str, set] = {name: set() for name in self.receivers}
        for name, (_, position) in self._part_of(self.top).symbols.items():
            need[name].add(position)
        sender_at = dict(self.sender_at)
        for j in reversed(range(self.top)):
            wanted = set().union(*(need[r] for r in self.readers[j] if self.masks[r][j] != 0.0))
            if not wanted:
                continue  # no kept path reads it: its value changes nothing
            at = _one(wanted)
            if at is None and sender_at[j] is not None:
                raise ExperimentError(
                    f"EdgeState: sender {j} is read at every position again (masks only go to 0)"
                )
            sender_at[j] = at
            if j:
                for name, (_, position) in self.parts[j][at].symbols.items():
                    need[name].add(position)
        held = {name: _one(wanted) if wanted else self.held[name] for name, wanted in need.items()}
        return sender_at, held, {name for name, wanted in need.items() if wanted}

    def _narrow(self) -> None:
        """Hold each value at the positions the kept edges still read (after a commit)."""
        sender_at, held, self.used = self._positions()
        for j, at in sender_at.items():
            if at != self.sender_at[j]:
                self.senders[j] = _at(self.senders[j], self.sender_at[j], at)
        for name, at in held.items():
            if at != self.held[name] and name in self.inputs:
                self.inputs[name] = _at(self.inputs[name], self.held[name], at)
        self.sender_at, self.held = sender_at, held

    def _bias(self, receiver) -> torch.Tensor | None:
        """The receiver's constant term (the attention output biases), at every position; None: none."""
        node = receiver.input
        sums = {f"edges.{kind}->{receiver.name}" for kind in ("kept", "ablated", "masked")}
        biases = [c for c in node.children if c.name not in sums] if isinstance(node, Add) else []
        if not biases:
            return None
        total = evaluate(biases[0] if len(biases) == 1 else Add(*biases))
        return total.expand(node.shape)

    # ------------------------------------------------------------------ evaluating

    def _run(self, part: _Part, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        bound = {
            symbol: _at(inputs[name], self.held[name], position)
            for name, (symbol, position) in part.symbols.items()
        }
        if part.at is not None:  # one position: too small for a cache to pay
            return evaluate(part.template, bound)
        return self.evaluate_fn(part.template, bound)

    def _metric(self, inputs) -> float:
        return self.value_of(self._run(self._part_of(self.top), inputs))

    def _summed(self, name: str, mask: list[float]) -> torch.Tensor:
        """Receiver ``name``'s input from the sender values, at its positions: its bias, every
        sender's ablated value (one cumulative sum), and ``m_s (S_s - A_s)`` for the kept senders."""
        receiver, at = self.receivers[name], self.held[name]
        total = torch.zeros(_shape_at(receiver.input.shape, at), dtype=receiver.mask.value.dtype)
        for term in (self.biases[name], self._ablated_sum(receiver.n_senders)):
            if term is not None:
                total.add_(_at(term, None, at))
        for s, m in enumerate(mask):
            if m != 0.0:
                total.add_(m * self._difference(s, at))
        return total

    def _ablated_sum(self, n: int) -> torch.Tensor | None:
        """The sum of the first ``n`` senders' ablated values, at every position (None: zero ablation)."""
        if self.ablated is None:
            return None
        if n not in self.ablated_sums:
            self.ablated_sums[n] = self.ablated[:n].sum(0)
        return self.ablated_sums[n]

    def _difference(self, s: int, at: int | None) -> torch.Tensor:
        """Sender ``s``'s value less its ablated value, at position ``at``: what its edge adds."""
        sender = _at(self.senders[s], self.sender_at[s], at)
        return sender if self.ablated is None else sender - _at(self.ablated[s], None, at)

    # ------------------------------------------------------------------ testing

    def trial(self, changes: dict[str, torch.Tensor]) -> Trial:
        """The metric with the masks of ``changes`` (receiver name -> mask) rebound."""
        masks = {name: [float(x) for x in mask] for name, mask in changes.items()}
        inputs: dict[str, torch.Tensor] = {}
        dirty: list[int] = []
        for name, mask in masks.items():
            inputs[name] = self._changed_input(name, mask)
            for key in self.reads[name]:
                heapq.heappush(dirty, key)
        senders: dict[int, torch.Tensor] = {}
        done: set[int] = set()
        metric_dirty = False
        while dirty:
            key = heapq.heappop(dirty)
            if key in done:
                continue
            done.add(key)
            if key == self.top:
                metric_dirty = True
                continue
            live = [
                r for r in self.readers[key] if r in self.used and masks.get(r, self.masks[r])[key] != 0.0
            ]
            if not live:
                continue  # no kept edge reads it: its value changes nothing
            merged = {**self.inputs, **inputs}
            value = self._run(self._part_of(key), merged)
            delta = value - self.senders[key]
            senders[key] = value
            for r in live:
                weight = masks.get(r, self.masks[r])[key]
                term = _at(delta, self.sender_at[key], self.held[r])
                updated = inputs[r] if r in inputs else self.inputs[r].clone()
                inputs[r] = updated.add_(term if weight == 1.0 else weight * term)
                for reader in self.reads[r]:
                    heapq.heappush(dirty, reader)
        value = self._metric({**self.inputs, **inputs}) if metric_dirty else self.value
        return Trial(value, masks, inputs, senders)

    def _changed_input(self, name: str, mask: list[float]) -> torch.Tensor:
        """Receiver ``name``'s input under ``mask``: its held input plus the flipped senders' change
        (summed again where most of it changes: ``check_depends``'s every edge at once)."""
        if name not in self.used:
            return self.inputs[name]  # no kept path reads it: left as it is
        old = self.masks[name]
        flipped = [s for s, (a, b) in enumerate(zip(old, mask)) if a != b]
        if 2 * len(flipped) > len(mask) + 2:
            return self._summed(name, mask)
        total = self.inputs[name].clone()
        for s in flipped:
            total.add_((mask[s] - old[s]) * self._difference(s, self.held[name]))
        return total

    def commit(self, trial: Trial) -> None:
        """Make ``trial`` the state: its masks, inputs and sender values."""
        self.masks.update(trial.masks)
        self.senders.update(trial.senders)
        self.inputs.update(trial.inputs)
        self.value = trial.value
        self._narrow()


def _part(node: Circuit, inputs: dict[str, str], at: int | None) -> _Part:
    """``node`` over Symbols where it reads receiver inputs (``inputs``: input name -> receiver),
    at position ``at`` (None: every position)."""
    reads = _frontier(node, inputs)
    full = {name: Symbol(n.shape, name=f"edges.state->{inputs[name]}") for name, n in reads.items()}
    template = replace(node, {reads[name]: full[name] for name in reads}) if reads else node
    if at is not None:
        index = (slice(None),) * (template.rank - 2) + (slice(at, at + 1), slice(None))
        template = push_index(Index(template, index))
    template, symbols = _restrict_reads(template, {inputs[n]: s for n, s in full.items()})
    return _Part(template, symbols, at)


def _one(positions: set) -> int | None:
    """One position where every reader reads the same one; None (all) otherwise."""
    return next(iter(positions)) if len(positions) == 1 else None


def _at(tensor: torch.Tensor, held: int | None, want: int | None) -> torch.Tensor:
    """``tensor`` (held at position ``held``, None: all) at position ``want``."""
    if held == want:
        return tensor
    if held is None:
        return tensor[..., want : want + 1, :]
    raise ExperimentError(f"EdgeState: a value held at position {held} was asked for at {want}")


def _shape_at(shape, at: int | None) -> tuple:
    return tuple(shape) if at is None else (*shape[:-2], 1, shape[-1])


def _frontier(node: Circuit, inputs: dict[str, str]) -> dict[str, Circuit]:
    """The receiver inputs ``node`` reads directly (not through another receiver input), by name."""
    found: dict[str, Circuit] = {}
    seen: set[bytes] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current.hash in seen:
            continue
        seen.add(current.hash)
        if current.name in inputs:
            found[current.name] = current
        else:
            stack.extend(current.children)
    return found


def _restrict_reads(template: Circuit, full: dict[str, Symbol]):
    """``template`` reading a one-position Symbol where it reads a receiver's input only at one
    position (every reader an Index of it at that position), and which position each reads."""
    parents: dict[bytes, list[Circuit]] = {symbol.hash: [] for symbol in full.values()}
    for node in unique_nodes([template]):
        for child in node.children:
            if child.hash in parents:
                parents[child.hash].append(node)
    mapping: dict[Circuit, Circuit] = {}
    symbols: dict[str, tuple[Symbol, int | None]] = {}
    for name, symbol in full.items():
        at = _read_position(symbol, parents[symbol.hash])
        if at is None:
            symbols[name] = (symbol, None)
            continue
        small = Symbol(_shape_at(symbol.shape, at), name=symbol.name)
        for index in parents[symbol.hash]:
            step = index.index[-2]
            mapping[index] = (
                small if isinstance(step, slice) else Index(small, index.index[:-2] + (0, slice(None)))
            )
        symbols[name] = (small, at)
    return (replace(template, mapping) if mapping else template), symbols


def _read_position(symbol: Symbol, parents: list[Circuit]) -> int | None:
    """The one position every parent (an Index) reads of ``symbol``'s position axis; None otherwise."""
    length = symbol.shape[-2]
    found = set()
    for parent in parents:
        if not isinstance(parent, Index):
            return None
        *rest, step, last = parent.index
        if any(s != slice(None) for s in (*rest, last)):
            return None
        if isinstance(step, int):
            found.add(step % length)
        elif isinstance(step, slice) and step.step in (None, 1) and step.start is not None:
            start = step.start % length
            stop = length if step.stop is None else (step.stop if step.stop >= 0 else step.stop + length)
            if stop - start != 1:
                return None
            found.add(start)
        else:
            return None
    return next(iter(found)) if len(found) == 1 else None
