"""The library's exception types.

Every error a user can provoke is a ``CircuitError``; the subclasses say what
kind of mistake it was, so notebooks can catch precisely, and every message
names the node (or text line) at fault.
"""

from __future__ import annotations

import unicodedata

#: How much of a user's text a message quotes before cutting it.
SHOWN_CHARACTERS = 200


def shown(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """``text`` as a message may quote it: control characters escaped, cut to ``limit``.

    Messages end up on terminals: a line of a file read by mistake (a binary,
    ``/dev/zero``) must neither flood the screen nor send escape sequences to
    it.  Printable characters are kept as they are, so a name reads as written.
    """
    cut = text[:limit]
    escaped = "".join(
        ch if ch == " " or not unicodedata.category(ch).startswith(("C", "Z")) else _escape(ch) for ch in cut
    )
    if len(text) > limit:
        escaped += f"... ({len(text) - limit} more characters)"
    return escaped


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return repr(ch)[1:-1]  # \\n, \\r, \\t, \\x1b
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class CircuitError(Exception):
    """Base class of every error raised by ``circuits``."""


class NodeTypeError(CircuitError, TypeError):
    """A name that is not a string, or a child that is not a circuit."""


class EinsumError(CircuitError, ValueError):
    """A malformed einsum spec, or operands that do not fit it."""


class BroadcastError(CircuitError, ValueError):
    """Add operands whose shapes do not broadcast."""


class IndexSpecError(CircuitError, ValueError):
    """An Index whose index does not fit its child (bad type or out of range)."""


class TagError(CircuitError, ValueError):
    """A Tag given something other than one child and a uuid (a ``uuid.UUID`` or its text)."""


class FunctionSpecError(CircuitError, ValueError):
    """An unknown GeneralFunction spec, or children that do not fit it."""


class RearrangeError(CircuitError, ValueError):
    """An einops pattern that is malformed or does not fit its child."""


class ConcatError(CircuitError, ValueError):
    """Concat operands whose shapes cannot be joined along the axis."""


class LeafError(CircuitError, ValueError):
    """An Array, Scalar or Symbol given an invalid value or shape."""


class ParseError(CircuitError, ValueError):
    """Malformed circuit text; carries the line number and the line (``message`` and
    ``line`` as given; ``str()`` escapes control characters and cuts long text)."""

    def __init__(self, message: str, line_number: int | None = None, line: str | None = None):
        self.message = message
        self.line_number = line_number
        self.line = line
        if line_number is None:
            text = shown(message, 4 * SHOWN_CHARACTERS)
        else:  # the message and line as a terminal may show them (the attributes keep them raw)
            text = f"line {line_number}: {shown(message, 4 * SHOWN_CHARACTERS)}\n    {shown(line or '')}"
        super().__init__(text)


class StoreError(CircuitError, OSError):
    """A file or tensor store that cannot be read or written: missing,
    unreadable, ambiguous, corrupted, or a path that is not a directory.
    The OS error, if any, is the ``__cause__``."""


class StaleTensorError(CircuitError, RuntimeError):
    """A tensor modified in place after a node was made from it.

    An Array's printed hash and its structural hash describe the values its
    tensor had when the Array was made; torch's version counter
    (``tensor._version``) tells when an in-place op changed them since.
    Reading such a tensor (evaluating, saving) raises this instead of
    computing with, or writing, values the node does not describe.
    ``node`` is the node whose tensor changed (an Array, or an Index with a
    tensor index).
    """

    def __init__(self, message: str, *, node=None):
        super().__init__(message)
        self.node = node


class CacheError(CircuitError, ValueError):
    """An ``Evaluator`` given a budget or option it cannot use, or an experiment's ``memory_bytes``
    below what it needs: then ``memory_bytes`` is the budget and ``needed_bytes`` the prediction
    (both None otherwise)."""

    def __init__(self, message: str, *, memory_bytes: int | None = None, needed_bytes: int | None = None):
        super().__init__(message)
        self.memory_bytes = memory_bytes
        self.needed_bytes = needed_bytes


class MissingTensorError(CircuitError):
    """An Array parsed without its tensor was asked for its value; ``node`` is that Array."""

    def __init__(self, message: str, *, node=None):
        super().__init__(message)
        self.node = node


class EvaluationError(CircuitError):
    """A circuit that could not be evaluated.

    Raised for an unbound or mis-shaped Symbol, an Array without its tensor,
    a device mismatch, an out-of-range checked index, or any exception from
    a torch op or function spec while evaluating.  ``node`` is the node at
    fault and ``path`` the nodes from a root down to it (both None for a bad
    argument to ``evaluate`` itself); the original exception, if any, is the
    ``__cause__``.
    """

    def __init__(self, message: str, node=None, path=None):
        super().__init__(message)
        self.node = node
        self.path = path


class MatcherError(CircuitError, TypeError):
    """Something that cannot be made into a Matcher, or bad IterativeMatcher limits."""


class MatchError(CircuitError, LookupError):
    """``get_unique`` found no node or several; ``count`` and ``nodes`` say which."""

    def __init__(self, message: str, count: int = 0, nodes=()):
        super().__init__(message)
        self.count = count
        self.nodes = list(nodes)


class RewriteError(CircuitError, ValueError):
    """A rewrite that cannot be done: a replacement that is not a node, a
    substitution for a Symbol that is not there or has another shape."""


class NoMatchError(MatchError, RewriteError):
    """A rewrite whose matcher found nothing to rewrite (``update``, ``replace``, an
    ``Updater`` or ``Expander``): catchable as either ``MatchError`` (``count`` 0) or
    ``RewriteError``.  ``keys`` are a ``replace``'s keys that replaced nothing.  The
    message names names that come close."""

    def __init__(self, message: str, keys=()):
        super().__init__(message, count=0, nodes=())
        self.keys = list(keys)


class ExpandError(RewriteError):
    """``expand`` (batching) could not add batch axes: a replacement whose
    trailing shape differs from the node it replaces, batch shapes that
    disagree, or a node (a GeneralFunction spec) that cannot carry them."""


class ModelError(CircuitError, ValueError):
    """A model that cannot be built or loaded: an unknown architecture or
    config option, or weights that are missing, unexpected or misshapen
    (the message lists what was expected).  ``field`` names the build option
    at fault (``"causal"``, ``"options"``, ...), or is None.

    Where weights do not fit, ``missing_keys``, ``unexpected_keys`` and
    ``mismatched_keys`` (of the wrong shape or kind) name them, as Hugging
    Face's loading info does; empty otherwise."""

    def __init__(
        self,
        message: str,
        field: str | None = None,
        *,
        missing_keys=(),
        unexpected_keys=(),
        mismatched_keys=(),
    ):
        super().__init__(message)
        self.field = field
        self.missing_keys = list(missing_keys)
        self.unexpected_keys = list(unexpected_keys)
        self.mismatched_keys = list(mismatched_keys)


class SAEError(ModelError):
    """A sparse autoencoder or transcoder that cannot be read or spliced: an unknown architecture,
    config field or weight, a weight of the wrong shape, or a point it does not fit.  ``field``
    names the config field or weight at fault, ``path`` the file (None for an object in memory)."""

    def __init__(self, message: str, field: str | None = None, *, path=None, **keys):
        super().__init__(message, field, **keys)
        self.path = None if path is None else str(path)


class PassError(CircuitError, ValueError):
    """A pass applied to a circuit that lacks the structure it rewrites
    (no attention scores to mask, no unsplit layer to split), or given a
    mask or head grouping that does not fit."""


class MissingTensorEvaluationError(EvaluationError, MissingTensorError):
    """Evaluating an Array that has no tensor: catchable as either error type."""


class StaleTensorEvaluationError(EvaluationError, StaleTensorError):
    """Evaluating an Array whose tensor was edited in place since: catchable as either error type."""


class ExperimentError(CircuitError, ValueError):
    """An ablation, patch, metric or sweep that cannot be set up as asked
    (inputs that do not fit what they replace, a target that matches
    nothing, a metric node that is not there)."""


class NoCircuitError(ExperimentError):
    """A circuit-discovery threshold that removed every edge (``acdc``): no circuit is left.
    ``threshold`` is the one given, ``largest_delta`` the largest change a tested edge made (as
    compared with the threshold: absolute where ``absolute=True``)."""

    def __init__(self, message: str, *, threshold: float, largest_delta: float):
        super().__init__(message)
        self.threshold, self.largest_delta = threshold, largest_delta


class MissingPointError(CircuitError, KeyError):
    """A point ``(kind, layer, head)`` that an ``ActivationCache`` or ``Gradients`` does not hold
    (or a key that is no point); a ``KeyError`` too, as a mapping's missing key is.  The message
    is shown as written (not quoted, as ``KeyError`` quotes its key)."""

    __str__ = Exception.__str__


class PrintError(CircuitError, ValueError):
    """A printing or diff option that cannot be used: an unknown colour name or
    diff view, or a comment or colour function that returned something other
    than text (the message names the node).  ``field`` names the print option
    at fault (``"depth"``, ``"options"``, ...), or is None."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class CausalScrubbingError(CircuitError, ValueError):
    """A causal scrubbing dataset, sampler or hypothesis that cannot be used as given:
    arrays of different lengths, input names that are not arrays, an index out of
    range, a sampler condition with no matching data (the message names the
    arrays, index or value at fault)."""


class IllegalCorrespondenceError(CausalScrubbingError):
    """A causal scrubbing hypothesis that does not fit the circuit (rust_circuit's name): an
    incomplete correspondence, a matcher that finds no node or several, a branch that does not
    reach the inputs or leaves its parent's, two interpretation nodes claiming one node.  The
    message names the interpretation node and says what is wrong; ``i_node`` is that
    ``InterpNode`` (None where no single one is at fault)."""

    def __init__(self, message: str, *, i_node=None):
        super().__init__(message)
        self.i_node = i_node


class RandomVariableError(CircuitError, ValueError):
    """A DiscreteVar, StoredCumulantVar or Cumulant (rust_circuit's random-variable nodes)
    built from children or fields that do not fit: probabilities of the wrong shape, a
    cumulant of the wrong shape, a missing mean or variance, a bad uuid."""


class RandomVariableEvaluationError(EvaluationError, RandomVariableError):
    """Evaluating a circuit holding a DiscreteVar, StoredCumulantVar or Cumulant: rust_circuit
    samples or expands those, this library does not, so they have no value here."""
