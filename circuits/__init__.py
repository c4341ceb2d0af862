"""circuits: transformers as immutable trees of small named nodes.

Build, print, parse, rewrite and evaluate circuits; see README.md.
"""

from circuits.errors import (
    BroadcastError,
    CircuitError,
    ConcatError,
    EinsumError,
    EvaluationError,
    FunctionSpecError,
    IndexSpecError,
    LeafError,
    MissingTensorError,
    NodeTypeError,
    ParseError,
    PrintError,
    RandomVariableError,
    RandomVariableEvaluationError,
    RearrangeError,
    StaleTensorError,
    StoreError,
    TagError,
)
from circuits.evaluation.costs import CircuitCost, NodeCost, cost
from circuits.evaluation import evaluate, evaluate_many
from circuits.core.functions import FunctionSpec, get_function, register_function, registered_names
from circuits.evaluation.profiling import Profile, profile
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
from circuits.text.parsing import parse, parse_many
from circuits.text.printing import repr_many
from circuits.text.store import TensorStore
from circuits.core.traversal import postorder, unique_nodes

__all__ = [
    "Add",
    "Array",
    "BroadcastError",
    "Circuit",
    "CircuitCost",
    "CircuitError",
    "Concat",
    "ConcatError",
    "Cumulant",
    "DiscreteVar",
    "Einsum",
    "EinsumError",
    "EvaluationError",
    "FunctionSpec",
    "FunctionSpecError",
    "GeneralFunction",
    "Index",
    "IndexSpecError",
    "LeafError",
    "MissingTensorError",
    "NodeCost",
    "NodeTypeError",
    "ParseError",
    "PrintError",
    "Profile",
    "RandomVariableError",
    "RandomVariableEvaluationError",
    "Rearrange",
    "RearrangeError",
    "Scalar",
    "Scatter",
    "StaleTensorError",
    "StoreError",
    "StoredCumulantVar",
    "Symbol",
    "Tag",
    "TagError",
    "TensorStore",
    "cost",
    "evaluate",
    "evaluate_many",
    "get_function",
    "parse",
    "parse_many",
    "postorder",
    "profile",
    "register_function",
    "registered_names",
    "repr_many",
    "unique_nodes",
]

# Finding and rewriting (issue 4): matchers, update/replace/substitute, batching.
from circuits.rewriting.batching import expand  # noqa: E402
from circuits.errors import ExpandError, MatcherError, MatchError, NoMatchError, RewriteError  # noqa: E402
from circuits.rewriting.matching import (  # noqa: E402
    FoundRoutes,
    IterativeMatcher,
    Matcher,
    Regex,
    Route,
    chain_excluding,
    get_all_paths,
    get_paths,
    new_traversal,
    restrict,
    restrict_sl,
)
from circuits.rewriting.operations import BoundGetter, BoundUpdater, Expander, Getter, Updater  # noqa: E402
from circuits.rewriting.rewrite import cast_circuit, replace, substitute, update  # noqa: E402

# Importing the transformer layer registers its naming convention's hints with the matcher
# (circuits.rewriting.hints): which layer and head a found node belongs to, "split_heads first".
from circuits import transformer  # noqa: E402, F401

__all__ += [
    "BoundGetter",
    "BoundUpdater",
    "ExpandError",
    "Expander",
    "FoundRoutes",
    "Getter",
    "IterativeMatcher",
    "MatchError",
    "Matcher",
    "MatcherError",
    "NoMatchError",
    "Regex",
    "RewriteError",
    "Route",
    "Updater",
    "cast_circuit",
    "chain_excluding",
    "expand",
    "get_all_paths",
    "get_paths",
    "new_traversal",
    "replace",
    "restrict",
    "restrict_sl",
    "substitute",
    "update",
]

# Model library (issue 5): ``import circuits.models`` for the builders and
# loaders (not imported here; transformers is only needed by ``from_hf``).
from circuits.errors import ModelError  # noqa: E402

__all__ += ["ModelError"]

# Rewrite passes (issue 6), also at ``circuits.passes``.
from circuits.errors import PassError  # noqa: E402
from circuits.passes import (  # noqa: E402
    causal_mask,
    push_down_index,
    simplify,
    split_heads,
)

__all__ += ["PassError", "causal_mask", "push_down_index", "simplify", "split_heads"]

# Concat rewrites (issue 16): split a node into named position pieces, fuse and undo splits.
from circuits.passes import (  # noqa: E402
    concat_drop_size_zero,
    concat_elim_split,
    concat_fuse,
    pull_concat,
    push_down_concat,
    split_to_concat,
)

__all__ += [
    "concat_drop_size_zero",
    "concat_elim_split",
    "concat_fuse",
    "pull_concat",
    "push_down_concat",
    "split_to_concat",
]

# Algebraic rewrites (issue 16), also at ``circuits.passes``.
from circuits.passes import (  # noqa: E402
    distribute,
    distribute_all,
    extract_add,
    factor,
    flatten_adds,
    flatten_einsums,
    nest_adds,
    nest_einsums,
    residual_rewrite,
)

__all__ += [
    "distribute",
    "distribute_all",
    "extract_add",
    "factor",
    "flatten_adds",
    "flatten_einsums",
    "nest_adds",
    "nest_einsums",
    "residual_rewrite",
]

# Canonical form and diff (issue 16): compare two rewrite routes, show what a rewrite changed.
from circuits.text.diff import CircuitDiff, circuit_diff, diff  # noqa: E402
from circuits.passes import canonicalize  # noqa: E402

__all__ += ["CircuitDiff", "canonicalize", "circuit_diff", "diff"]

# Experiments (issue 7): the cached Evaluator, ablations, patching, sweeps;
# metrics and the rest in ``circuits.experiments``.
from circuits import experiments  # noqa: E402
from circuits.evaluation.cache import Evaluator  # noqa: E402
from circuits.errors import CacheError  # noqa: E402
from circuits.experiments import mean_ablate, patch, resample_ablate, sweep, zero_ablate  # noqa: E402

__all__ += [
    "CacheError",
    "Evaluator",
    "experiments",
    "mean_ablate",
    "patch",
    "resample_ablate",
    "sweep",
    "zero_ablate",
]

# Saving (issue 8): the text plus a tensor store beside it; see circuits/text/saving.py.
from circuits.text.saving import load, load_many, save  # noqa: E402

__all__ += ["load", "load_many", "save"]

# Print options (issue 29): one frozen object for print, repr and repr_many.
from circuits.text.print_options import PrintOptions  # noqa: E402

__all__ += ["PrintOptions"]
