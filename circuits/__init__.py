"""circuits: transformers as immutable trees of small named nodes.

Build, print, parse, rewrite and evaluate circuits; see README.md.  The root
holds what a user types daily, by concept: the node classes; function specs
(``FunctionSpec``, ``register_function``); text and files (``parse``,
``repr_many``, ``diff``, ``save``, ``load``); evaluation (``evaluate``,
``Evaluator``); finding and rewriting (``Matcher``, ``IterativeMatcher``,
``update``, ``replace``, ``substitute``, ``expand``, ...); cost and profile;
``CircuitError``.  Everything else lives in its home, reached as a
sub-package (docs/api.md lists them): ``cc.passes`` (every rewrite pass),
``cc.errors`` (every exception class), ``cc.experiments`` (ablation,
patching, sweeps, caches; ``from circuits import experiments as ex``) and
``circuits.models`` (builders and loaders: ``from circuits import models``;
not imported here, so that parsing and evaluating a file loads no model
code).  A name is here only if ``__all__`` lists it (0.2.0 moved the rest:
CHANGELOG.md).
"""

# Nodes: the frozen node classes a circuit is made of.
from circuits.core.nodes import (
    Add,
    Array,
    Circuit,
    Concat,
    Cumulant,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scalar,
    Scatter,
    StoredCumulantVar,
    Symbol,
    Tag,
)

# Function specs: what a GeneralFunction computes, and how to add one.
from circuits.core.functions import FunctionSpec, register_function

# Text and files: FORMAT.md text read and written, what a rewrite changed, save/load.
from circuits.text.parsing import parse, parse_many
from circuits.text.printing import repr_many
from circuits.text.print_options import PrintOptions
from circuits.text.diff import circuit_diff, diff
from circuits.text.saving import load, load_many, save

# Evaluation: values with torch; the Evaluator caches across many rewrites of one circuit.
from circuits.evaluation import evaluate, evaluate_many
from circuits.evaluation.cache import Evaluator

# Finding and rewriting: matchers (what, where), the rewrites, walking a circuit, batching.
from circuits.rewriting.matching import IterativeMatcher, Matcher, Regex, chain_excluding, get_paths, restrict
from circuits.rewriting.rewrite import replace, substitute, update
from circuits.rewriting.batching import expand
from circuits.core.traversal import unique_nodes

# Cost and profile: what a circuit costs from shapes alone, and where a real run spends its time.
from circuits.evaluation.costs import cost
from circuits.evaluation.profiling import profile

# Errors: the base class here; every exception class in circuits.errors.
from circuits.errors import CircuitError

# Sub-packages reached as attributes.  Importing the transformer layer registers its naming
# convention with the matcher (circuits.rewriting.hints): the layer and head of a found node,
# "split_heads first", and Point as a matcher form.
from circuits import errors, passes, transformer  # noqa: F401 (transformer: imported to register)
from circuits import experiments

__all__ = [
    # Nodes
    "Add",
    "Array",
    "Circuit",
    "Concat",
    "Cumulant",
    "DiscreteVar",
    "Einsum",
    "GeneralFunction",
    "Index",
    "Rearrange",
    "Scalar",
    "Scatter",
    "StoredCumulantVar",
    "Symbol",
    "Tag",
    # Function specs
    "FunctionSpec",
    "register_function",
    # Text and files
    "PrintOptions",
    "circuit_diff",
    "diff",
    "load",
    "load_many",
    "parse",
    "parse_many",
    "repr_many",
    "save",
    # Evaluation
    "Evaluator",
    "evaluate",
    "evaluate_many",
    # Finding and rewriting
    "IterativeMatcher",
    "Matcher",
    "Regex",
    "chain_excluding",
    "expand",
    "get_paths",
    "replace",
    "restrict",
    "substitute",
    "unique_nodes",
    "update",
    # Cost and profile
    "cost",
    "profile",
    # Errors
    "CircuitError",
    # Sub-packages
    "errors",
    "experiments",
    "passes",
]
