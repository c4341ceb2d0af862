"""The model naming convention: every name the model builders give, built and parsed here alone.

The builders (``circuits.models``), the passes (``causal_mask``, ``split_heads``), the experiments
(``sweep``'s head names) and the demo take their names from this module, so that the convention is
written once (as rust_circuit states its ``'x.w.y'`` rule once, and TransformerLens its hook names in
``get_act_name``).  Pure strings: no torch, no circuit, no other module of the package.

- Names with a layer (and heads) are built by functions: ``block(3) == 'b3'``,
  ``attn_out(3) == 'b3.a'``, ``head(3, 7) == 'b3.a.head7'``, ``head(3, 4, 7) == 'b3.a.head4-7'``,
  ``resid_mid``, ``mlp_out``, ``attn_norm``, ``mlp_norm``, ``attn_weight(3, 'q') == 'a3.w.q'``,
  ``head_weight('a3.w.q', 7)``, ``mlp_weight``, ``norm_weight``, ``layer_mask``.
- Every other name is the same in each layer (``Q == 'a.q'``, ``PROBS == 'a.attn_probs'``,
  ``norm_node(LN, 'var') == 'ln.var'``) or is the model's own (``TOKENS == 'toks_int_var'``,
  ``LOGITS == 't.call'``, ``LOSS == 't.loss'``): constants, all listed in ``FIXED``.  Which layer a
  shared name's node belongs to is told by what lies below it (``circuits.passes.layer_of``).
- ``parse(name)`` reads any of them back into a ``Name`` (kind, layer, part, heads), or None;
  ``parse_head``, ``parse_head_group``, ``parse_attn_out`` and ``parse_attn_weight`` are its
  common questions.  Layers and heads are decimal without leading zeros and ``parse`` reads
  nothing else, so ``parse(name).text == name``.
- A mixture-of-experts MLP (Mixtral) names its router per layer (``router(3) == 'b3.m.router'``, the
  logits; ``router(3, 'router_probs')``, their softmax; ``router(3, 'routing')``, the top-k weights)
  and each expert's weighted output (``expert(3, 5) == 'b3.m.expert5'``); inside an expert the
  names are shared (``EXPERT_OUT``, ``EXPERT_WEIGHT`` and the gated MLP's ``MLP_GATE`` etc.).
- An encoder (BERT) adds its token types, attention mask and position-wise pooling (``TOKEN_TYPES``,
  ``ATTENTION_MASK``, ``POOLED``, ``SENTENCE_EMBEDDING``, ...) and, its norms coming after each
  sublayer, names the sum a layer norm reads ``pre_norm(3) == 'b3.pre_norm'`` (``'b3'`` is the norm's
  output, the stream the next layer reads).
- ``ACTIVATION_KINDS`` lists, per kind of activation (``resid_pre``, ``q``, ``attn_probs``, ``z``,
  ``mlp_post``, ``logits``, ...), the node each model family gives it today; ``activation_name``
  resolves one for a family, layer and head.

The convention and the activation kinds as tables: docs/models.md.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping, NamedTuple, Union

# ---------------------------------------------------------------- model-wide names

TOKENS = "toks_int_var"  #: the token Array, ``[S+k]`` or ``[B,S+k]``
INPUT_TOKENS = "input_toks_int"  #: its Index: the model's inputs
TARGET_TOKENS = "true_toks_int"  #: its Index: the next tokens to predict

TOK_EMBEDS_WEIGHT = "t.w.tok_embeds"
POS_EMBEDS_WEIGHT = "t.w.pos_embeds"
UNEMBED_WEIGHT = "t.w.unembed"
UNEMBED_BIAS_WEIGHT = "t.w.unembed_bias"

TOKEN_EMBEDS = "idxed_embeds"  #: the token embeddings of the inputs
POS_EMBEDS = "t.w.pos_embeds_idxed"  #: the position embeddings of the inputs
EMBEDS = "embeds"  #: their sum (GPT-2: the residual stream before layer 0)

FINAL = "final"  #: the final norm's weight prefix (``'final.ln.w.scale'``)
FINAL_NORM = "final.call"  #: the final norm's output
UNEMBED = "t.unembed"  #: the logits before the unembedding bias (when there is one)
LOGITS = "t.call"
LOG_PROBS = "log_probs"
LOG_LIKELIHOOD = "ll"  #: the targets' log-probabilities
NLL_NEG = "nll.neg"  #: the Scalar -1 that turns them into the loss
LOSS = "t.loss"  #: the per-token loss, the root of every model circuit

# ------------------------------------------------------- attention (every layer alike)

QK_INPUT = "a.qk_input"  #: attention-only models: the norm plus the position embeddings
Q, K, V = "a.q", "a.k", "a.v"  #: queries, keys, values, heads as an axis ``[h, q|k, c]``
Q_NOBIAS, K_NOBIAS, V_NOBIAS = "a.q_nobias", "a.k_nobias", "a.v_nobias"  #: GPT-2, before the bias
Q_UNROTATED, K_UNROTATED = "a.q_unrot", "a.k_unrot"  #: Llama, before the rotary embedding
K_KV, V_KV = "a.k_kv", "a.v_kv"  #: Llama with grouped-query attention: the key/value heads
Q_NORM, K_NORM = "a.q_norm", "a.k_norm"  #: Qwen3, Gemma 3: each head's RMSNormed queries and keys, unrotated
SCORES = "a.attn_scores"  #: ``[h, q, k]``, masked (when masked) and scaled
RAW_SCORES = "a.attn_scores_raw"  #: the masked form's scores before the bias
PROBS = "a.attn_probs"
COMB_V = "a.comb_v"  #: the probabilities applied to the values (``z``), ``[h, q, c]``
BIAS_FOR_HEAD_SIZE = "a.c.bias_for_head_size"
HEAD_SIZE = "a.c.head_size"
DIV_HEAD_SIZE = "a.c.div_head_size"  #: ``1/sqrt(d_head)`` per head
QUERY_SCALE_FACTOR = "a.c.query_scale_factor"  #: Gemma 2/3: ``sqrt(d_head / query_pre_attn_scalar)``
QUERY_SCALE = "a.c.div_query_scalar"  #: Gemma 2/3: ``1/sqrt(query_pre_attn_scalar)`` per head

# The masked form (the golden file's): raw scores + (1 - mask) * neg_inf.
CAUSAL_MASK = "t.a.c.causal_mask"
SCORE_BIAS = "a.score_neg_inf_bias"
NOT_MASK = "a.not_mask"
NEG_MASK = "not_mask.neg_mask"
NEG_INF_SCALAR = "a.neg_inf"  #: the Scalar that masked scores get (its value is masks.NEG_INF)
ONE = "one"
NEG_ONE = "neg_one"  #: the Scalar -1 (mask flip, rotate_half)

ROPE_COS, ROPE_SIN = "t.a.c.rope_cos", "t.a.c.rope_sin"  #: Llama's rotary tables ``[S, d_head]``
#: Gemma 3's tables of its local (sliding-window) layers, another rotary base
ROPE_COS_LOCAL, ROPE_SIN_LOCAL = "t.a.c.rope_cos_local", "t.a.c.rope_sin_local"
ROPE_PARTS = ("cos", "sin", "rot_half")


def rope_part(name: str, part: str) -> str:
    """``'a.q_cos'``: a node of the rotation of ``'a.q'`` (``part`` one of ``ROPE_PARTS``)."""
    if part not in ROPE_PARTS:
        raise ValueError(f"rope part {part!r} is not one of {ROPE_PARTS}")
    return f"{name}_{part}"


# ------------------------------------------------------------- MLP (every layer alike)

MLP_PROJ_IN = "m.proj_in"  #: GPT-2
MLP_PRE = "m.pre"  #: GPT-2: proj_in plus its bias, before the activation
MLP_ACT = "m.act"  #: the activation (Llama: of the gate)
MLP_PROJ_OUT = "m.proj_out"  #: GPT-2, before the output bias
MLP_GATE = "m.gate"  #: Llama
MLP_UP = "m.up"  #: Llama
MLP_GATED = "m.gated"  #: Llama: act(gate) * up

# ------------------------------------------- mixture of experts (every expert alike)

EXPERT_OUT = "m.expert_out"  #: an expert's gated MLP output ``[s, d]``, before its routing weight
EXPERT_WEIGHT = "m.expert_weight"  #: an expert's routing weight per token ``[s]`` (a column of ``routing``)
ROUTER_PARTS = ("router", "router_probs", "routing")  #: the logits, their softmax, the top-k weights

# ---------------------------------------------------------------- encoders (BERT)

TOKEN_TYPES = "token_type_ids"  #: the segment ids, an int64 Array shaped like the tokens
ATTENTION_MASK = "attention_mask"  #: 1 where a token is attended to (and pooled), 0 for padding
KEY_BIAS = "a.key_bias"  #: ``(1 - ATTENTION_MASK) * neg_inf`` per key, added to every query's scores
TOKEN_TYPE_EMBEDS_WEIGHT = "t.w.token_type_embeds"
TOKEN_TYPE_EMBEDS = "t.w.token_type_embeds_idxed"  #: the token types' embeddings
EMBEDS_PRE_NORM = "embeds.pre_norm"  #: the embeddings' sum, before the layer norm whose output is ``EMBEDS``
POOLER_WEIGHT, POOLER_BIAS_WEIGHT = "t.w.pooler", "t.w.pooler_bias"  #: BERT's pooler (dense + tanh on [CLS])
POOL_PARTS = ("cls", "sum", "count", "recip_count", "dense", "sq_norm", "rsqrt_norm")  #: ``'pool.sum'``, ...
POOLED = "pooled"  #: the sequence as one vector: [CLS]'s, the pooler's or the mean
SENTENCE_EMBEDDING = "sentence_embedding"  #: ``POOLED`` scaled to unit length (sentence-transformers)

# -------------------------------------------------------------- norms (every norm alike)

LN, RMS = "ln", "rms"  #: layer norm (attention-only, GPT-2) and RMSNorm (Llama)
NORM_PARTS = {
    LN: (
        "c.hidden_size",
        "c.recip_hidden_size",
        "neg",
        "neg_mean",
        "mean_subbed",
        "var",
        "c.eps",
        "var_p_eps",
        "rsqrt",
        "y",
        "y_scaled",
        "upcast",
    ),
    RMS: (
        "c.hidden_size",
        "c.recip_hidden_size",
        "var",
        "c.eps",
        "var_p_eps",
        "rsqrt",
        "y",
        "upcast",
        "rounded",
    ),
}


def float32_value(name: str) -> str:
    """``'a3.norm_float32'``: in a bfloat16 or float16 model, the float32 value rounded to the model's
    dtype as ``name`` (a norm's output, an expert's weighted output), where Hugging Face's code
    computes in float32; ``'t.call_float32'``: the logits the loss reads, in float32 as there."""
    return f"{name}_float32"


def norm_node(norm: str, part: str) -> str:
    """``'ln.var'``: a node inside a norm (``norm`` is ``LN`` or ``RMS``, ``part`` in ``NORM_PARTS``)."""
    if part not in NORM_PARTS.get(norm, ()):
        raise ValueError(f"{part!r} is not a part of the {norm!r} norm: {NORM_PARTS.get(norm)}")
    return f"{norm}.{part}"


# ------------------------------------------------------------------- per-layer names


def block(layer: int) -> str:
    """``'b3'``: the residual stream after layer 3."""
    return f"b{_index(layer)}"


def attn_out(layer: int) -> str:
    """``'b3.a'``: layer 3's attention output, the Einsum summing its heads."""
    return f"{block(layer)}.a"


def head_label(first: int, last: int | None = None) -> str:
    """``'head7'``, or ``'head4-7'`` for the heads 4 to 7 (``last`` is included)."""
    if last is None or last == _index(first):
        return f"head{_index(first)}"
    if _index(last) < first:
        raise ValueError(f"head group {first}-{last}: the last head is before the first")
    return f"head{first}-{last}"


def head(layer: int, first: int, last: int | None = None) -> str:
    """``'b3.a.head7'`` (or ``'b3.a.head4-7'``): a head's (or group's) branch after ``split_heads``."""
    return f"{attn_out(layer)}.{head_label(first, last)}"


def head_weight(weight: str, first: int, last: int | None = None) -> str:
    """``'a3.w.q.head7'``: head 7's slice of ``weight`` (an Array: an attention weight, or a mask with
    a head axis) after ``split_heads``."""
    return f"{weight}.{head_label(first, last)}"


def resid_mid(layer: int) -> str:
    """``'b3.resid_mid'``: the residual stream between layer 3's attention and its MLP."""
    return f"{block(layer)}.resid_mid"


def mlp_out(layer: int) -> str:
    """``'b3.m'``: layer 3's MLP output."""
    return f"{block(layer)}.m"


def router(layer: int, part: str = "router") -> str:
    """``'b3.m.router'``: layer 3's router logits ``[s, experts]``; ``part`` ``'router_probs'`` their
    softmax, ``'routing'`` each expert's weight (top-k of the softmax, zero for the experts not chosen)."""
    if part not in ROUTER_PARTS:
        raise ValueError(f"router part {part!r} is not one of {ROUTER_PARTS}")
    return f"{mlp_out(layer)}.{part}"


def expert(layer: int, index: int) -> str:
    """``'b3.m.expert5'``: expert 5's output in layer 3, times its routing weight (zero where the
    token is not routed to it); ``'b3.m'`` is the Add of every expert's."""
    return f"{mlp_out(layer)}.expert{_index(index)}"


def pool(part: str) -> str:
    """``'pool.sum'``: a node of an encoder's pooling (``part`` one of ``POOL_PARTS``)."""
    if part not in POOL_PARTS:
        raise ValueError(f"pooling part {part!r} is not one of {POOL_PARTS}")
    return f"pool.{part}"


def pre_norm(layer: int) -> str:
    """``'b3.pre_norm'``: in a post-norm layer (BERT), the sum of the MLP's output and its input that
    the layer's last norm reads; that norm's output is ``'b3'``."""
    return f"{block(layer)}.pre_norm"


def attn_prefix(layer: int) -> str:
    """``'a3'``: the prefix of layer 3's attention weights and norm."""
    return f"a{_index(layer)}"


def mlp_prefix(layer: int) -> str:
    """``'m3'``: the prefix of layer 3's MLP weights and norm."""
    return f"m{_index(layer)}"


def attn_norm(layer: int) -> str:
    """``'a3.norm'``: the norm of the residual stream before layer 3's attention."""
    return f"{attn_prefix(layer)}.norm"


def mlp_norm(layer: int) -> str:
    """``'m3.norm'``: the norm of the residual stream before layer 3's MLP."""
    return f"{mlp_prefix(layer)}.norm"


def attn_weight(layer: int, part: str) -> str:
    """``'a3.w.q'``: an attention weight (``q``, ``k``, ``v``, ``o``, ``q_bias``, ..., ``o_bias``)."""
    return f"{attn_prefix(layer)}.w.{_part(part)}"


def mlp_weight(layer: int, part: str) -> str:
    """``'m3.w.proj_in'``: an MLP weight (``proj_in``, ``in_bias``, ..., ``gate``, ``up``, ``down``)."""
    return f"{mlp_prefix(layer)}.w.{_part(part)}"


def norm_weight(prefix: str, which: str, norm: str = LN) -> str:
    """``'a3.ln.w.scale'``: a norm's weight; ``prefix`` is ``attn_prefix(L)``, ``mlp_prefix(L)`` or
    ``FINAL``, ``which`` is ``'scale'`` or ``'bias'``, ``norm`` is ``LN`` or ``RMS``."""
    if norm not in NORM_PARTS or which not in ("scale", "bias"):
        raise ValueError(f"no norm weight {norm!r} {which!r}: norms are {tuple(NORM_PARTS)}, scale or bias")
    return f"{prefix}.{norm}.w.{which}"


def layer_mask(layer: int) -> str:
    """``'t.a3.c.mask'``: layer 3's ``[heads, q, k]`` mask, from ``causal_mask`` given a function."""
    return f"t.{attn_prefix(layer)}.c.mask"


def _index(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a layer or head number is an int >= 0, got {value!r}")
    return value


def _part(part: str) -> str:
    if not isinstance(part, str) or not _PART.fullmatch(part):
        raise ValueError(f"a weight part is letters, digits and '_', got {part!r}")
    return part


# ----------------------------------------------------------------------- parsing

_NUM = r"(0|[1-9][0-9]*)"
_PART = re.compile(r"[A-Za-z0-9_]+")
_HEADS = rf"head{_NUM}(?:-{_NUM})?"


class Name(NamedTuple):
    """A name of the convention, read by ``parse``; ``text`` writes it back.

    ``kind`` is one of ``KINDS``; ``layer`` the layer (None for a ``'fixed'`` name);
    ``part`` the weight's part (``'q'``, ``'proj_in'``), the norm weight's ``'ln.w.scale'``,
    the router's part (``'routing'``), the expert's number (``'5'``), or the fixed name itself;
    ``heads`` is ``(first, last)`` for a head branch, or for the heads' slice that ``split_heads``
    takes of an attention weight or a mask (``first == last`` for one head).
    """

    kind: str
    layer: int | None = None
    part: str | None = None
    heads: tuple[int, int] | None = None

    @property
    def text(self) -> str:
        text = _WRITERS[self.kind](self)
        return text if self.heads is None or self.kind == "head" else head_weight(text, *self.heads)


_WRITERS = {
    "block": lambda n: block(n.layer),
    "attn_out": lambda n: attn_out(n.layer),
    "head": lambda n: head(n.layer, *n.heads),
    "resid_mid": lambda n: resid_mid(n.layer),
    "pre_norm": lambda n: pre_norm(n.layer),
    "mlp_out": lambda n: mlp_out(n.layer),
    "attn_norm": lambda n: attn_norm(n.layer),
    "mlp_norm": lambda n: mlp_norm(n.layer),
    "attn_weight": lambda n: attn_weight(n.layer, n.part),
    "mlp_weight": lambda n: mlp_weight(n.layer, n.part),
    "attn_norm_weight": lambda n: f"{attn_prefix(n.layer)}.{n.part}",
    "mlp_norm_weight": lambda n: f"{mlp_prefix(n.layer)}.{n.part}",
    "layer_mask": lambda n: layer_mask(n.layer),
    "router": lambda n: router(n.layer, n.part),
    "expert": lambda n: expert(n.layer, int(n.part)),
    "fixed": lambda n: n.part,
}

#: Every kind of name ``parse`` returns.
KINDS = tuple(_WRITERS)

_NORM_WEIGHT = r"((?:ln|rms)\.w\.(?:scale|bias))"
_PATTERNS = [
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("block", rf"b{_NUM}"),
        ("attn_out", rf"b{_NUM}\.a"),
        ("head", rf"b{_NUM}\.a\.{_HEADS}"),
        ("resid_mid", rf"b{_NUM}\.resid_mid"),
        ("pre_norm", rf"b{_NUM}\.pre_norm"),
        ("mlp_out", rf"b{_NUM}\.m"),
        ("attn_norm", rf"a{_NUM}\.norm"),
        ("mlp_norm", rf"m{_NUM}\.norm"),
        ("attn_weight", rf"a{_NUM}\.w\.([A-Za-z0-9_]+)"),
        ("mlp_weight", rf"m{_NUM}\.w\.([A-Za-z0-9_]+)"),
        ("attn_norm_weight", rf"a{_NUM}\.{_NORM_WEIGHT}"),
        ("mlp_norm_weight", rf"m{_NUM}\.{_NORM_WEIGHT}"),
        ("layer_mask", rf"t\.a{_NUM}\.c\.mask"),
        ("router", rf"b{_NUM}\.m\.({'|'.join(ROUTER_PARTS)})"),
        ("expert", rf"b{_NUM}\.m\.expert{_NUM}"),
    )
]


def parse(name: str | None) -> Name | None:
    """The ``Name`` that ``name`` is in the convention, or None if it is none of its names.

    ``parse('b3.a.head7') == Name('head', 3, heads=(7, 7))``; ``parse('a.q') == Name('fixed',
    part='a.q')``; ``parse(n).text == n`` for every ``n`` that parses.
    """
    if not isinstance(name, str):
        return None
    whole = _parse_whole(name)
    if whole is not None:
        return whole
    sliced = _SLICE.fullmatch(name)  # a heads' slice that split_heads took of an Array
    if sliced is None:
        return None
    base, heads = _parse_whole(sliced.group(1)), _heads(*sliced.groups()[1:])
    if base is None or heads is None or base.heads is not None or not _sliceable(base):
        return None
    return base._replace(heads=heads)


def _parse_whole(name: str) -> Name | None:
    if name in FIXED:
        return Name("fixed", part=name)
    for kind, pattern in _PATTERNS:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        groups = match.groups()
        layer, rest = int(groups[0]), groups[1:]
        if kind == "head":
            heads = _heads(*rest)
            return None if heads is None else Name(kind, layer, heads=heads)
        return Name(kind, layer, rest[0] if rest else None)
    return None


_SLICE = re.compile(rf"(.+)\.{_HEADS}")


def _sliceable(name: Name) -> bool:
    """The Arrays with a head axis that ``split_heads`` slices: attention weights and masks."""
    return name.kind in ("attn_weight", "layer_mask") or (name.kind == "fixed" and name.part == CAUSAL_MASK)


def _heads(first: str | None, last: str | None) -> tuple[int, int] | None:
    """``(first, last)``, or None for a group that is not written the one way (``'head3-3'``, ``'head4-2'``)."""
    if first is None:
        return None
    if last is None:
        return int(first), int(first)
    return (int(first), int(last)) if int(last) > int(first) else None


def parse_head(name: str | None) -> tuple[int, int] | None:
    """``(layer, head)`` of a single head's branch ``'b{L}.a.head{h}'``, else None."""
    parsed = parse(name)
    if parsed is None or parsed.kind != "head" or parsed.heads[0] != parsed.heads[1]:
        return None
    return parsed.layer, parsed.heads[0]


def parse_head_group(name: str | None) -> tuple[int, int, int] | None:
    """``(layer, first, last)`` of a head branch, ``'b{L}.a.head{h}'`` (first == last) or
    ``'b{L}.a.head{h}-{h2}'``, else None."""
    parsed = parse(name)
    if parsed is None or parsed.kind != "head":
        return None
    return (parsed.layer, *parsed.heads)


def parse_attn_out(name: str | None) -> int | None:
    """The layer of ``'b{L}.a'``, else None."""
    parsed = parse(name)
    return parsed.layer if parsed is not None and parsed.kind == "attn_out" else None


def parse_expert(name: str | None) -> tuple[int, int] | None:
    """``(layer, expert)`` of an expert's output ``'b{L}.m.expert{e}'``, else None."""
    parsed = parse(name)
    return (parsed.layer, int(parsed.part)) if parsed is not None and parsed.kind == "expert" else None


def parse_attn_weight(name: str | None) -> tuple[int, str] | None:
    """``(layer, part)`` of an attention weight ``'a{L}.w.{part}'`` (or its head slice), else None."""
    parsed = parse(name)
    return (parsed.layer, parsed.part) if parsed is not None and parsed.kind == "attn_weight" else None


# ------------------------------------------------------------------- the fixed names

#: Every name without a layer that the builders and passes give.
FIXED = frozenset(
    [
        TOKENS,
        INPUT_TOKENS,
        TARGET_TOKENS,
        TOK_EMBEDS_WEIGHT,
        POS_EMBEDS_WEIGHT,
        UNEMBED_WEIGHT,
        UNEMBED_BIAS_WEIGHT,
        TOKEN_EMBEDS,
        POS_EMBEDS,
        EMBEDS,
        FINAL_NORM,
        UNEMBED,
        LOGITS,
        LOG_PROBS,
        LOG_LIKELIHOOD,
        NLL_NEG,
        LOSS,
        QK_INPUT,
        Q,
        K,
        V,
        Q_NOBIAS,
        K_NOBIAS,
        V_NOBIAS,
        Q_UNROTATED,
        K_UNROTATED,
        K_KV,
        V_KV,
        Q_NORM,
        K_NORM,
        SCORES,
        RAW_SCORES,
        PROBS,
        COMB_V,
        BIAS_FOR_HEAD_SIZE,
        HEAD_SIZE,
        DIV_HEAD_SIZE,
        QUERY_SCALE_FACTOR,
        QUERY_SCALE,
        CAUSAL_MASK,
        SCORE_BIAS,
        NOT_MASK,
        NEG_MASK,
        NEG_INF_SCALAR,
        ONE,
        NEG_ONE,
        ROPE_COS,
        ROPE_SIN,
        ROPE_COS_LOCAL,
        ROPE_SIN_LOCAL,
        MLP_PROJ_IN,
        MLP_PRE,
        MLP_ACT,
        MLP_PROJ_OUT,
        MLP_GATE,
        MLP_UP,
        MLP_GATED,
        EXPERT_OUT,
        EXPERT_WEIGHT,
        TOKEN_TYPES,
        ATTENTION_MASK,
        KEY_BIAS,
        TOKEN_TYPE_EMBEDS_WEIGHT,
        TOKEN_TYPE_EMBEDS,
        EMBEDS_PRE_NORM,
        POOLER_WEIGHT,
        POOLER_BIAS_WEIGHT,
        POOLED,
        SENTENCE_EMBEDDING,
    ]
    + [pool(part) for part in POOL_PARTS]
    + [rope_part(name, part) for name in (Q, K, K_KV) for part in ROPE_PARTS]
    + [norm_node(norm, part) for norm, parts in NORM_PARTS.items() for part in parts]
    + [
        norm_weight(prefix, which, norm)
        for prefix in (FINAL, EMBEDS)
        for norm in NORM_PARTS
        for which in ("scale", "bias")
    ]
)


# ---------------------------------------------------------------- activation kinds

FAMILIES = ("attn_only", "gpt2", "llama")

#: A family's node for a kind: a fixed name, a function of the layer (of the layer and the head
#: for a per-head kind; of the number of layers for ``resid_final``), or None: the family has none.
NameRule = Union[str, Callable[..., str], None]


@dataclasses.dataclass(frozen=True)
class ActivationKind:
    """One kind of activation and the node each family gives it (``activation_name`` resolves it).

    ``scope`` is ``'model'`` (one node), ``'layer'`` or ``'head'``.  ``shared``: every layer's
    node has this one name, with heads as an axis; tell the layers apart by what is below
    (``layer_of``) or, for a norm's scale, by the norm it sits in: ``within`` (a rule as in
    ``names``).
    """

    kind: str
    scope: str
    names: Mapping[str, NameRule]
    shared: bool = False
    within: NameRule = None
    note: str = ""


def _every(rule: NameRule, **overrides: NameRule) -> dict[str, NameRule]:
    return {family: overrides.get(family, rule) for family in FAMILIES}


def _after_layer(embeds: str) -> Callable[[int], str]:
    """The residual stream entering layer ``L``: ``'b{L-1}'``, or the embeddings for layer 0."""
    return lambda layer: block(layer - 1) if _index(layer) else embeds


_RESID = _every(_after_layer(TOKEN_EMBEDS), gpt2=_after_layer(EMBEDS))
_SCALE = _every(norm_node(LN, "rsqrt"), llama=norm_node(RMS, "rsqrt"))
_ALL = [
    ActivationKind("embed", "model", _every(TOKEN_EMBEDS)),
    ActivationKind("pos_embed", "model", _every(POS_EMBEDS, llama=None), note="Llama: rotary, in q and k"),
    ActivationKind("resid_pre", "layer", _RESID, note="layer 0: the embeddings ('embeds' in GPT-2)"),
    ActivationKind("ln1", "layer", _every(attn_norm), note="after the norm's weights"),
    ActivationKind("ln1_scale", "layer", _SCALE, shared=True, within=attn_norm, note="1/sqrt(var + eps)"),
    ActivationKind("q", "layer", _every(Q), shared=True, note="Llama: after the rotary embedding"),
    ActivationKind("k", "layer", _every(K), shared=True, note="Llama: after the rotary embedding"),
    ActivationKind("v", "layer", _every(V), shared=True),
    ActivationKind("attn_scores", "layer", _every(SCORES), shared=True, note="scaled; masked if masked"),
    ActivationKind("attn_probs", "layer", _every(PROBS), shared=True),
    ActivationKind("z", "layer", _every(COMB_V), shared=True),
    ActivationKind("head_out", "head", _every(head), note="after split_heads only"),
    ActivationKind("attn_out", "layer", _every(attn_out), note="GPT-2: without the output bias"),
    ActivationKind("resid_mid", "layer", _every(resid_mid, attn_only=None)),
    ActivationKind("ln2", "layer", _every(mlp_norm, attn_only=None), note="after the norm's weights"),
    ActivationKind(
        "ln2_scale", "layer", dict(_SCALE, attn_only=None), shared=True, within=mlp_norm, note="1/sqrt(..)"
    ),
    ActivationKind("mlp_pre", "layer", _every(MLP_PRE, attn_only=None, llama=MLP_GATE), shared=True),
    ActivationKind(
        "mlp_post",
        "layer",
        _every(MLP_ACT, attn_only=None, llama=MLP_GATED),
        shared=True,
        note="Llama: gated",
    ),
    ActivationKind("mlp_out", "layer", _every(mlp_out, attn_only=None)),
    ActivationKind("resid_post", "layer", _every(block)),
    ActivationKind("resid_final", "model", _RESID, note="the residual after the last layer"),
    ActivationKind("ln_final", "model", _every(FINAL_NORM), note="after the norm's weights"),
    ActivationKind("ln_final_scale", "model", _SCALE, within=FINAL_NORM, note="1/sqrt(var + eps)"),
    ActivationKind("logits", "model", _every(LOGITS)),
    ActivationKind("log_probs", "model", _every(LOG_PROBS)),
    ActivationKind("loss", "model", _every(LOSS), note="per token"),
]

#: kind -> ``ActivationKind``, in the order of a forward pass.
ACTIVATION_KINDS: dict[str, ActivationKind] = {entry.kind: entry for entry in _ALL}


def activation_name(
    kind: str, family: str, layer: int | None = None, head_index: int | None = None
) -> str | None:
    """The name of the node of ``kind`` in ``family`` at ``layer`` (and head), or None if it has none.

    ``layer`` is needed for a ``'layer'`` or ``'head'`` kind; for ``'resid_final'`` it is the
    number of layers (the residual after the last one: ``'b{n-1}'``, or the embeddings).  A
    ``shared`` kind's name is every layer's: see ``ActivationKind``.
    """
    if kind not in ACTIVATION_KINDS:
        raise ValueError(f"unknown activation kind {kind!r}; known: {', '.join(ACTIVATION_KINDS)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    entry = ACTIVATION_KINDS[kind]
    rule = entry.names[family]
    if rule is None or isinstance(rule, str):
        return rule
    if layer is None:
        raise ValueError(f"activation kind {kind!r} needs a layer")
    if entry.scope == "head":
        if head_index is None:
            raise ValueError(f"activation kind {kind!r} needs a head")
        return rule(layer, head_index)
    return rule(layer)
