"""Pieces every model builder shares: tokens, norms, attention, the loss head.

Each piece writes its computation out of the ordinary node types, with the
names of ../shared/golden/attn_only_2l.circ (``circuits.transformer.names``).  Einsum specs are written for
the unbatched model; ``einsum`` adds a batch letter to every operand that
carries one more (leading) axis than its letters, so one builder serves both
the ``[S+1]`` and the ``[B,S+1]`` token layouts.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import operator
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.transformer.masks import NEG_INF, neg_inf_bias
from circuits.core.functions import REDUCED_DTYPES
from circuits.core.nodes import Add, Array, Circuit, Concat, Einsum, GeneralFunction, Index, Scalar
from circuits.core.shapes import format_slice

if TYPE_CHECKING:  # only annotations here (options.py imports this module)
    from circuits.models.options import ModelOptions

#: How the token array is cut into model inputs and targets.
#: ``"default"``: ``[S+1]`` tokens, inputs ``[:-1]``, targets ``[1:]``.
#: ``"golden"``: ``[S+2]`` tokens, inputs ``[:-2]``, targets ``[1:-1]`` (the golden file's 302 -> 300).
#: convention -> (tokens per row beyond the positions, inputs slice, targets slice or None).
#: ``"prompt"``: the tokens are the inputs alone, and the circuit's root is the logits ``'t.call'``.
CONVENTIONS = {
    "default": (1, slice(None, -1), slice(1, None)),
    "golden": (2, slice(None, -2), slice(1, -1)),
    "prompt": (0, slice(None), None),
}

_BATCH_LETTERS = "bBxXyYzZ" + string.ascii_letters

#: MLP activations as Hugging Face spells them -> the GeneralFunction computing them (GPT-2 and Llama).
ACTIVATIONS = {
    "gelu_new": "gelu_new",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}

_F = TypeVar("_F", bound=Callable[..., Any])


# ----------------------------------------------------------------- options


def checked_options() -> Callable[[_F], _F]:
    """Refuse an unknown option or a bad call with a ModelError listing what is accepted.

    Python's own TypeError is no ``CircuitError`` and names no alternatives.
    The listing is the function's optional and keyword-only parameters, read
    off its signature, so every option must be a parameter: a function taking
    ``**kwargs`` is refused when decorated.
    """

    def decorate(function: _F) -> _F:
        signature = inspect.signature(function)
        params = list(signature.parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            raise TypeError(f"checked_options: {function.__name__} takes **kwargs; spell its options out")
        accepted = [p.name for p in params if p.default is not p.empty or p.kind is p.KEYWORD_ONLY]
        known = {p.name for p in params}
        listing = ", ".join(accepted) or "none"

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            unknown = [key for key in kwargs if key not in known]
            if unknown:
                close = difflib.get_close_matches(unknown[0], accepted, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ModelError(
                    f"{function.__name__}: unknown option {', '.join(repr(shown(k)) for k in unknown)}{hint}; "
                    f"accepted: {listing}"
                )
            try:
                signature.bind(*args, **kwargs)
            except TypeError as error:
                raise ModelError(f"{function.__name__}: {error}; options accepted: {listing}") from error
            return function(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


# ------------------------------------------------------------------ einsum


def einsum(spec: str, *nodes: Circuit, name: str | None = None) -> Einsum:
    """``Einsum.from_einsum_string`` with a leading batch axis added where present.

    An operand whose rank is one more than its letters gets a batch letter
    (one the spec does not use) in front; the output gets it too.
    """
    inputs, output = spec.split("->")
    parts = inputs.split(",")
    batch = next(letter for letter in _BATCH_LETTERS if letter not in spec)
    batched = False
    written = []
    for part, node in zip(parts, nodes):
        if node.rank == len(part) + 1:
            written.append(batch + part)
            batched = True
        elif node.rank == len(part):
            written.append(part)
        else:  # a builder bug, not a user mistake; still say what happened
            raise ModelError(
                f"einsum {spec!r} for {name!r}: operand {node.describe()} has shape {list(node.shape)}, "
                f"which fits neither {part!r} nor a batched {batch + part!r}"
            )
    out = batch + output if batched else output
    return Einsum.from_einsum_string(",".join(written) + "->" + out, *nodes, name=name)


def fn(spec_name: str, *nodes: Circuit, name: str | None = None) -> GeneralFunction:
    return GeneralFunction.new_by_name(*nodes, spec_name=spec_name, name=name)


def last_axis_index(node: Circuit, item: Any, name: str | None = None) -> Index:
    """``node[..., item]``: Index pads at the end, so leading axes are spelled out."""
    return Index(node, (slice(None),) * (node.rank - 1) + (item,), name=name)


def batch_prefix(batched: bool) -> tuple:
    return (slice(None),) if batched else ()


# ------------------------------------------------------------------ tokens


class Tokens:
    """The token nodes every family shares.

    ``var`` is ``'toks_int_var'`` (an int64 Array, ``[S+k]`` or ``[B,S+k]``),
    ``inputs`` is ``'input_toks_int'`` and ``targets`` is ``'true_toks_int'``
    (None for prompts: the ``"prompt"`` convention has no targets).
    """

    def __init__(self, var: Array, inputs: Index, targets: Index | None, seq_len: int, batched: bool):
        self.var = var
        self.inputs = inputs
        self.targets = targets
        self.seq_len = seq_len
        self.batched = batched


def make_tokens(
    tokens: Any, options: ModelOptions, *, vocab_size: int, max_positions: int | None = None
) -> Tokens:
    """The token Array and its two Index views, as ``options`` (``seq_len``, ``batch_size``,
    ``convention``) say.

    ``tokens`` is an integer tensor ``[S+k]`` or ``[B,S+k]`` (``k`` is 1 for the
    ``"default"`` convention, 2 for ``"golden"``), or None for an all-zero
    placeholder of ``seq_len`` positions (and ``batch_size`` rows if given),
    to be swapped later with ``update('toks_int_var', ...)``.  Given tokens
    are copied: the caller may reuse the tensor without changing the circuit.
    """
    seq_len, batch_size, convention = options.seq_len, options.batch_size, options.convention
    if not isinstance(convention, str) or convention not in CONVENTIONS:
        raise ModelError(f"convention {shown(repr(convention))} is not one of {sorted(CONVENTIONS)}")
    extra, input_slice, target_slice = CONVENTIONS[convention]
    if tokens is None:
        if seq_len is None:
            raise ModelError(
                "pass tokens (an int tensor [S+1] or [B,S+1]) or seq_len= to build a placeholder"
            )
        _check_positive("seq_len", seq_len)
        shape = (
            (seq_len + extra,)
            if batch_size is None
            else (_check_positive("batch_size", batch_size), seq_len + extra)
        )
        tokens = torch.zeros(shape, dtype=torch.int64)
    else:
        tokens = _token_copy(tokens, convention)
        if seq_len is not None and seq_len != tokens.shape[-1] - extra:
            raise ModelError(
                f"seq_len={seq_len} but tokens of shape {list(tokens.shape)} give "
                f"{tokens.shape[-1] - extra} positions (convention {convention!r})"
            )
        if batch_size is not None and (tokens.ndim != 2 or tokens.shape[0] != batch_size):
            raise ModelError(f"batch_size={batch_size} but tokens have shape {list(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise ModelError(
                f"token ids range over [{int(tokens.min())}, {int(tokens.max())}] but the vocabulary has "
                f"{vocab_size} entries"
            )
    positions = tokens.shape[-1] - extra
    if max_positions is not None and positions > max_positions:
        raise ModelError(
            f"{positions} positions, but the model's position table has only {max_positions} rows"
        )
    batched = tokens.ndim == 2
    var = Array(tokens, name=names.TOKENS)
    prefix = batch_prefix(batched)
    inputs = Index(var, prefix + (input_slice,), name=names.INPUT_TOKENS)
    targets = None if target_slice is None else Index(var, prefix + (target_slice,), name=names.TARGET_TOKENS)
    return Tokens(var, inputs, targets, positions, batched)


def _token_copy(tokens: Any, convention: str) -> torch.Tensor:
    """A private int64 copy of the caller's token ids, or a ModelError saying why there is none.

    Wrapping the caller's tensor would let a later ``tokens.fill_(...)``
    change what the circuit computes; a tensor without readable values
    (``meta``, sparse) cannot be hashed or indexed.
    """
    extra, input_slice, target_slice = CONVENTIONS[convention]
    if not isinstance(tokens, torch.Tensor):
        try:
            tokens = torch.as_tensor(tokens)
        except Exception as error:
            raise ModelError(f"tokens of type {type(tokens).__name__} are not a tensor ({error})") from error
    if tokens.is_meta or tokens.layout != torch.strided or tokens.is_quantized or tokens.is_nested:
        kind = "meta" if tokens.is_meta else f"{tokens.layout}, quantized or nested"
        raise ModelError(
            f"tokens are a {kind} tensor, whose values cannot be read; give a dense tensor of token ids"
        )
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ModelError(f"tokens have dtype {tokens.dtype}; expected an integer tensor of token ids")
    if tokens.ndim not in (1, 2):
        raise ModelError(
            f"tokens have shape {list(tokens.shape)}; expected [S+{extra}] or [B,S+{extra}] "
            f"(convention {convention!r})"
        )
    if tokens.shape[-1] <= extra:
        targets = "none" if target_slice is None else f"[{format_slice(target_slice)}]"
        raise ModelError(
            f"tokens have shape {list(tokens.shape)}: the {convention!r} convention needs more than "
            f"{extra} tokens per row (inputs [{format_slice(input_slice)}], targets {targets})"
        )
    try:
        return tokens.detach().to(torch.int64, copy=True)
    except Exception as error:  # a tensor subclass or device whose values cannot be read
        raise ModelError(f"tokens of type {type(tokens).__name__} cannot be read ({error})") from error


def check_config(
    config: Any,
    sizes: Iterable[str],
    *,
    counts: Iterable[str] = ("n_layers",),
    epsilons: Iterable[str] = (),
    flags: Iterable[str] = (),
) -> None:
    """Refuse a config field of the wrong kind, naming it: a str or a float size would
    fail deep inside the build, and a zero or negative one build a wrong model.

    ``sizes`` are positive ints (or None where the dataclass's default is None),
    ``counts`` non-negative ints (a 0-layer model is a model), ``epsilons``
    finite non-negative numbers, ``flags`` bools.
    """
    kind = type(config).__name__
    for field in sizes:
        value = getattr(config, field)
        if value is not None and not _is_int(value, 1):
            raise ModelError(f"{kind}: {field}={shown(repr(value))} is not a positive int")
    for field in counts:
        if not _is_int(getattr(config, field), 0):
            raise ModelError(f"{kind}: {field}={shown(repr(getattr(config, field)))} is not an int >= 0")
    for field in epsilons:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ModelError(f"{kind}: {field}={shown(repr(value))} is not a finite number >= 0")
    for field in flags:
        if not isinstance(getattr(config, field), bool):
            raise ModelError(f"{kind}: {field}={shown(repr(getattr(config, field)))} is not a bool")


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _check_positive(what: str, value: Any) -> int:
    if not _is_int(value, 1):
        raise ModelError(f"{what}={value!r} is not a positive int")
    return value


# ------------------------------------------------------------------- norms


def _recip_hidden_size(x: Circuit, norm: str) -> Circuit:
    hidden_size = fn("last_dim_size", x, name=names.norm_node(norm, "c.hidden_size"))
    return fn("reciprocal", hidden_size, name=names.norm_node(norm, "c.recip_hidden_size"))


def reduced_precision(weight: Circuit) -> bool:
    """Whether ``weight`` is an Array of a bfloat16 or float16 tensor: then the norm (or router)
    it belongs to computes in float32 and rounds back, as Hugging Face's code does (torch's
    ``layer_norm``, ``LlamaRMSNorm``, ``GemmaRMSNorm``, Mixtral's router).  A float32 or float64
    model's circuit has no such upcast."""
    return isinstance(weight, Array) and weight.value is not None and weight.value.dtype in REDUCED_DTYPES


def upcast(x: Circuit, name: str) -> GeneralFunction:
    """``x`` in float32 (``'upcast_float32'``: a float32 or float64 value passes unchanged)."""
    return fn("upcast_float32", x, name=name)


def type_as(x: Circuit, like: Circuit, name: str) -> GeneralFunction:
    """``x`` in ``like``'s dtype (torch's ``x.type_as(like)``): the way back from ``upcast``."""
    return fn("type_as", x, like, name=name)


def layer_norm(x: Circuit, scale: Circuit, bias: Circuit, eps: float, name: str) -> Circuit:
    """Layer norm written out exactly as in the golden file (``'ln.*'`` names).

    With bfloat16 or float16 weights, in float32 from ``'ln.upcast'`` (``x`` in float32) to
    ``names.float32_value(name)``, rounded once to ``x``'s dtype as ``name`` (``type_as``): torch's
    ``layer_norm`` computes so, and Hugging Face's GPT-2, OPT and GPT-NeoX call it.
    """
    part = functools.partial(names.norm_node, names.LN)
    reduced = reduced_precision(scale)
    x_in = upcast(x, part("upcast")) if reduced else x
    recip = _recip_hidden_size(x_in, names.LN)
    neg_mean = einsum(
        "Ah,z,A->Az", x_in, Scalar(-1.0, shape=(1,), name=part("neg")), recip, name=part("neg_mean")
    )
    mean_subbed = Add(x_in, neg_mean, name=part("mean_subbed"))
    var = einsum("ih,ih,i->i", mean_subbed, mean_subbed, recip, name=part("var"))
    var_p_eps = Add(Scalar(eps, name=part("c.eps")), var, name=part("var_p_eps"))
    rsqrt = fn("rsqrt", var_p_eps, name=part("rsqrt"))
    y = einsum("ih,i->ih", mean_subbed, rsqrt, name=part("y"))
    y_scaled = einsum("ih,h->ih", y, scale, name=part("y_scaled"))
    if not reduced:
        return Add(bias, y_scaled, name=name)
    return type_as(Add(bias, y_scaled, name=names.float32_value(name)), x, name)


def norm_weights(w: Mapping[str, Circuit], prefix: str) -> tuple[Circuit, Circuit]:
    """The scale and bias of the layer norm ``prefix`` (``'a3'``, ``'m3'``, ``'final'``) among ``w``."""
    return w[names.norm_weight(prefix, "scale")], w[names.norm_weight(prefix, "bias")]


def rms_norm(
    x: Circuit,
    scale: Circuit,
    eps: float,
    name: str,
    lead: str = "i",
    reduced: bool = False,
    scale_in_float32: bool = False,
) -> Circuit:
    """RMSNorm (Llama): ``scale * x * rsqrt(mean(x^2) + eps)`` over the last axis, with ``'rms.*'`` names.

    ``lead`` letters the other axes of the unbatched ``x`` (``'hq'`` for queries ``[h, q, c]``:
    Qwen3's and Gemma 3's norms of each head).  ``reduced`` (a bfloat16 or float16 model): in
    float32 from ``'rms.upcast'`` (``x`` in float32), as Hugging Face's RMSNorms compute; then
    ``'rms.y'`` is rounded to ``x``'s dtype as ``'rms.rounded'`` before the scale (Llama's
    ``weight * x.to(input_dtype)``), or with ``scale_in_float32`` (Gemma: ``(x * (1 + w)).type_as(x)``,
    ``scale`` a float32 node) the scaled ``names.float32_value(name)`` is rounded as ``name``.
    """
    part = functools.partial(names.norm_node, names.RMS)
    x_in = upcast(x, part("upcast")) if reduced else x
    recip = _recip_hidden_size(x_in, names.RMS)
    a, f = lead, "c" if "h" in lead else "h"  # the other axes, the normalized one
    var = einsum(f"{a}{f},{a}{f},{a}->{a}", x_in, x_in, recip, name=part("var"))
    var_p_eps = Add(Scalar(eps, name=part("c.eps")), var, name=part("var_p_eps"))
    rsqrt = fn("rsqrt", var_p_eps, name=part("rsqrt"))
    y = einsum(f"{a}{f},{a}->{a}{f}", x_in, rsqrt, name=part("y"))
    scaled = f"{a}{f},{f}->{a}{f}"
    if not reduced:
        return einsum(scaled, y, scale, name=name)
    if scale_in_float32:
        return type_as(einsum(scaled, y, scale, name=names.float32_value(name)), x, name)
    return einsum(scaled, type_as(y, x, part("rounded")), scale, name=name)


# --------------------------------------------------------------- attention


def div_head_size(weight: Circuit) -> GeneralFunction:
    """``1/sqrt(d_head)`` per head, read off a ``[heads, d_head, d_model]`` weight as in the golden file."""
    bias_for_head_size = einsum("hjk->hj", weight, name=names.BIAS_FOR_HEAD_SIZE)
    head_size = fn("last_dim_size", bias_for_head_size, name=names.HEAD_SIZE)
    return fn("rsqrt", head_size, name=names.DIV_HEAD_SIZE)


def attend(
    q: Circuit,
    k: Circuit,
    v: Circuit,
    div: Circuit,
    w_o: Circuit,
    layer: int,
    mask: Circuit | None,
    neg_inf: float = NEG_INF,
    softcap: float | None = None,
) -> Einsum:
    """Scores, softmax, values and the head-summing output ``'b{L}.a'``.

    ``q`` is ``[h,q,c]``, ``k`` ``[h,k,c]``, ``v`` ``[h,k,V]`` (each with a
    leading batch axis if batched), ``w_o`` ``[h,d,V]``.  Without ``mask`` the
    scores are the unmasked ``'a.attn_scores'`` Einsum; with it they are the
    golden file's masked form.  ``softcap`` (Gemma 2) caps the scores before the mask's bias,
    as Hugging Face does (``tanh(0) = 0`` keeps the masked entries zero).
    """
    if mask is None:
        name = names.SCORES if softcap is None else names.RAW_SCORES
        scores = softcapped(einsum("hqc,hkc,h->hqk", q, k, div, name=name), softcap, names.SCORES)
    else:
        raw = einsum("hqc,hkc,h,qk->hqk", q, k, div, mask, name=names.RAW_SCORES)
        raw = softcapped(raw, softcap, f"{names.RAW_SCORES}_capped")
        scores = Add(raw, neg_inf_bias(mask, neg_inf), name=names.SCORES)
    probs = fn("softmax", scores, name=names.PROBS)
    comb_v = einsum("hqk,hkV->hqV", probs, v, name=names.COMB_V)
    return einsum("hsV,hdV->sd", comb_v, w_o, name=names.attn_out(layer))


# ------------------------------------------------------------------- head


def softcapped(x: Circuit, cap: float | None, name: str) -> Circuit:
    """``cap * tanh(x / cap)`` named ``name`` (Gemma 2's soft-capping), or ``x`` itself when ``cap`` is None."""
    if cap is None:
        return x
    letters = "abcdefgh"[: x.rank]
    shrunk = fn(
        "tanh",
        einsum(f"{letters},->{letters}", x, Scalar(1.0 / cap, name="c.recip_softcap")),
        name=f"{name}_tanh",
    )
    return einsum(f"{letters},->{letters}", shrunk, Scalar(float(cap), name="c.softcap"), name=name)


def loss_head(
    final: Circuit,
    unembed: Circuit,
    targets: Circuit | None,
    unembed_bias: Circuit | None = None,
    softcap: float | None = None,
) -> Circuit:
    """Logits ``'t.call'``, ``'log_probs'``, ``'ll'`` and the per-token loss ``'t.loss'``.

    Without targets (prompts), the logits are the root.  With ``softcap`` (Gemma 2) ``'t.call'`` is
    ``softcap * tanh(x / softcap)`` of the unembedding ``'t.unembed'`` (plus the bias, if any: then
    ``x`` is ``'t.call_uncapped'``).  A bfloat16 or float16 model's loss reads the logits in float32
    (``'t.call_float32'``), as Hugging Face's loss does.
    """
    uncapped = names.LOGITS if softcap is None else f"{names.LOGITS}_uncapped"
    if unembed_bias is None:
        logits = einsum("sh,vh->sv", final, unembed, name=names.UNEMBED if softcap else names.LOGITS)
    else:
        logits = Add(einsum("sh,vh->sv", final, unembed, name=names.UNEMBED), unembed_bias, name=uncapped)
    logits = softcapped(logits, softcap, names.LOGITS)
    if targets is None:
        return logits
    if reduced_precision(unembed):  # Hugging Face's loss reads the logits in float32
        logits = upcast(logits, names.float32_value(names.LOGITS))
    log_probs = fn("log_softmax", logits, name=names.LOG_PROBS)
    ll = fn("gen_index_at_0_batch_x_c", log_probs, targets, name=names.LOG_LIKELIHOOD)
    return einsum("a,->a", ll, Scalar(-1.0, name=names.NLL_NEG), name=names.LOSS)


def embed(tok_embeds: Circuit, tokens: Tokens) -> GeneralFunction:
    return fn("gen_index_at_0_c", tok_embeds, tokens.inputs, name=names.TOKEN_EMBEDS)


def positions(pos_embeds: Circuit, seq_len: int) -> Index:
    return Index(pos_embeds, (slice(None, seq_len), slice(None)), name=names.POS_EMBEDS)


# ----------------------------------------------------------------- weights


def check_weights(
    family: str,
    weights: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...]],
    optional: Iterable[str] = (),
    attach: bool = False,
    copy: bool = False,
) -> dict[str, torch.Tensor]:
    """The weights as tensors, or one ModelError listing every problem.

    Missing names, names the model does not use, wrong shapes and
    non-floating tensors are all reported together, each with the shape
    that was expected.  The tensors are the caller's (no copy), detached
    unless ``attach``, so that gradients reach them only when asked for;
    with ``copy``, private contiguous copies (the model may change after).
    """
    if not isinstance(weights, Mapping):
        raise ModelError(
            f"{family}: weights must be a mapping from name to tensor, got {type(weights).__name__}"
        )
    optional = set(optional)
    problems: list[str] = []
    missing = [n for n in expected if n not in weights and n not in optional]
    if missing:
        problems.append("missing: " + ", ".join(f"{n!r} {list(expected[n])}" for n in missing))
    unknown = sorted((n for n in weights if n not in expected), key=str)
    if unknown:
        problems.append("not used by this model: " + ", ".join(shown(repr(n)) for n in unknown))
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        if name not in weights:
            continue
        value = weights[name]
        if not isinstance(value, torch.Tensor):
            try:
                value = torch.as_tensor(value)
            except (TypeError, ValueError, RuntimeError):
                problems.append(f"{name!r} is a {type(value).__name__}, not a tensor")
                continue
        if tuple(value.shape) != tuple(shape):
            problems.append(f"{name!r} has shape {list(value.shape)}, expected {list(shape)}")
            continue
        if not value.is_floating_point():
            problems.append(f"{name!r} has dtype {value.dtype}, expected a floating dtype")
            continue
        if value.is_meta:
            problems.append(f"{name!r} is a meta tensor, which has a shape but no values")
            continue
        tensors[name] = _own_copy(value) if copy else value if attach else value.detach()
    if problems:
        raise ModelError(
            f"{family} weights do not fit the config:\n  " + "\n  ".join(problems),
            missing_keys=missing,
            unexpected_keys=unknown,
            mismatched_keys=[n for n in expected if n in weights and n not in tensors],
        )
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        raise ModelError(
            f"{family} weights mix dtypes {sorted(str(d) for d in dtypes)}; convert them to one dtype "
            "(or evaluate with dtype=...) "
        )
    return tensors


def _own_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy: the circuit shares no storage with a model that may change."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def check_activation(family: str, act: Any) -> str:
    """``act`` if it names one of ``ACTIVATIONS``; else a ``ModelError`` naming the family and it."""
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ModelError(
            f"{family}: activation {shown(repr(act))} is not supported; supported: {sorted(ACTIVATIONS)}"
        )
    return act


def weight_arrays(tensors: Mapping[str, torch.Tensor]) -> dict[str, Circuit]:
    """The checked weights as Arrays named like them; without an unembedding, the token
    embedding's tensor serves as one (tied embeddings), named ``'t.w.unembed'``."""
    w: dict[str, Circuit] = {name: Array(tensor, name=name) for name, tensor in tensors.items()}
    if names.UNEMBED_WEIGHT not in w:
        w[names.UNEMBED_WEIGHT] = Array(tensors[names.TOK_EMBEDS_WEIGHT], name=names.UNEMBED_WEIGHT)
    return w


def weights_dtype(tensors: Mapping[str, torch.Tensor]) -> torch.dtype:
    for tensor in tensors.values():
        return tensor.dtype
    return torch.get_default_dtype()


#: The seeds torch takes (``torch.manual_seed``, ``Generator.manual_seed``): 64 bits, signed or not.
SEED_RANGE = (-(2**63), 2**64 - 1)


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` as an int, or a ModelError naming ``what``: torch's own refusal is a bare ``ValueError``
    ("Overflow when unpacking long long")."""
    try:
        value = operator.index(seed) if not isinstance(seed, bool) else None
    except TypeError:
        value = None
    if value is None or not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise ModelError(
            f"{what}={shown(repr(seed))} is not a seed: expected a whole number from -2**63 to 2**64 - 1"
        )
    return value


def random_weights(
    expected: Mapping[str, tuple[int, ...]],
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    std: float = 0.02,
    ones: Sequence[str] = (),
) -> dict[str, torch.Tensor]:
    """Normal(0, std) weights of the expected shapes, drawn in float64 from ``seed``.

    Names in ``ones`` (norm scales) are ``1 + Normal(0, 5 * std)``: near one, but
    not exactly, so that a mis-wired scale still shows in an equivalence test.
    """
    generator = torch.Generator().manual_seed(check_seed(seed))
    out = {}
    for name, shape in expected.items():
        tensor = torch.randn(shape, generator=generator, dtype=torch.float64) * std
        if name in ones:
            tensor = 1.0 + tensor * 5
        out[name] = tensor.to(dtype)
    return out


def rotate_half(x: Circuit, name: str, dims: int | None = None) -> Concat:
    """``cat(-x2, x1)`` over the last axis (Hugging Face's ``rotate_half``), from Index/Einsum/Concat.

    ``x`` is ``[h,q,c]`` (or ``[B,h,q,c]``); the negation is an Einsum with the
    Scalar -1, exact in floating point.  With ``dims`` (partial rotary, GPT-NeoX)
    only the first ``dims`` entries are rotated and the rest follow unchanged,
    so that tables with cos 1 and sin 0 there leave them exactly as they were.
    """
    size = x.shape[-1] if dims is None else dims
    if size % 2:
        raise ModelError(f"rotary embedding needs an even number of rotated dims, got {size}")
    half = size // 2
    whole = size == x.shape[-1]
    second = last_axis_index(x, slice(half, None if whole else size))
    first = last_axis_index(x, slice(None, half))
    negated = einsum("hqc,->hqc", second, Scalar(-1.0, name=names.NEG_ONE))
    if whole:
        return Concat(negated, first, axis=x.rank - 1, name=name)
    rest = last_axis_index(x, slice(size, None))
    return Concat(negated, first, rest, axis=x.rank - 1, name=name)
