"""Sparse autoencoders and transcoders as data: SAELens's files and objects, read and checked.

An ``SAE`` holds what encode and decode compute with (the weights, as tensors) and where the
SAE reads and writes (TransformerLens hook names, as SAELens's config gives them).  It is made
by ``load_sae(path)`` from SAELens's on-disk format (a folder with ``cfg.json`` and
``sae_weights.safetensors``), or by ``from_saelens(sae)`` from a SAELens object in memory.
``circuits.experiments.sae`` splices one into a circuit.  docs/features.md has the formats and
the arithmetic, and what each architecture computes.

What is read, from SAELens 6 (``SAE.save_model``; 5.x files, with their field names, too):

- architectures ``standard`` (ReLU), ``jumprelu``, ``topk``, ``transcoder`` and
  ``jumprelu_transcoder`` (a transcoder reads one point and writes another: ``hook_name``,
  ``hook_name_out``); any other is refused by name.
- weights ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_out]``, ``b_dec [d_out]``,
  and ``threshold [d_sae]`` (or SAELens's older ``log_threshold``) for the JumpReLU ones; a
  missing, unexpected or misshapen weight is refused by name.
- config fields that change the arithmetic (``apply_b_dec_to_input``, ``k``,
  ``rescale_acts_by_decoder_norm``, ``normalize_activations``, ``reshape_activations``,
  ``activation_fn``, ...) are read and checked; values this module does not compute
  (``normalize_activations`` other than ``'none'``, ``reshape_activations='hook_z'``) are refused
  naming the field.  Fields SAELens keeps only for training or bookkeeping are passed over; a field
  SAELens does not know is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import attrs
import torch

from circuits.errors import SAEError
from circuits.transformer.points import TRANSFORMER_LENS_HOOKS, Point

__all__ = ["ARCHITECTURES", "SAE", "from_saelens", "load_sae", "save_sae"]

#: The architectures read: SAELens's names.
ARCHITECTURES = ("standard", "jumprelu", "topk", "transcoder", "jumprelu_transcoder")
_TRANSCODERS = ("transcoder", "jumprelu_transcoder")
_JUMPRELU = ("jumprelu", "jumprelu_transcoder")

CONFIG_FILE = "cfg.json"  #: SAELens's SAE_CFG_FILENAME
WEIGHTS_FILE = "sae_weights.safetensors"  #: SAELens's SAE_WEIGHTS_FILENAME

_DTYPES = {name: getattr(torch, name) for name in ("float16", "bfloat16", "float32", "float64")}

# Fields that change what encode and decode compute: read and checked below.
_ARITHMETIC = {
    "architecture",
    "d_in",
    "d_sae",
    "d_out",
    "dtype",
    "apply_b_dec_to_input",
    "normalize_activations",
    "reshape_activations",
    "k",
    "rescale_acts_by_decoder_norm",
    "activation_fn",  # SAELens 5: 'relu' or 'topk'
    "activation_fn_str",
    "activation_fn_kwargs",  # SAELens 5: {'k': ...} with 'topk'
    "finetuning_scaling_factor",  # SAELens 5: False (True needs a weight this module does not read)
    "metadata",
}
# Where the SAE sits, and bookkeeping: read for the hook names, else passed over.
_WHERE = {
    "hook_name",
    "hook_point",
    "hook_name_out",
    "hook_layer",
    "hook_point_layer",
    "hook_head_index",
    "hook_point_head_index",
    "hook_head_index_out",
    "hf_hook_name",
    "hf_hook_name_out",
    "model_name",
    "model_class_name",
    "model_from_pretrained_kwargs",
    "device",
    "sae_lens_version",
    "sae_lens_training_version",
    "neuronpedia_id",
    "prepend_bos",
    "exclude_special_tokens",
    "context_size",
    "seqpos_slice",
    "dataset_path",
    "dataset_trust_remote_code",
}
# SAELens's training fields (its runner and training configs, 5.x and 6.x), which a saved config
# may carry and which inference does not use.
_TRAINING = frozenset(
    """adam_beta1 adam_beta2 b_dec_init_method autocast autocast_lm act_store_device
    checkpoint_path compile_llm compile_sae dead_feature_estimation_method dead_feature_threshold
    dead_feature_window decoder_heuristic_init decoder_orthogonal_init eval_batch_size_prompts
    eval_every_n_wandb_logs expansion_factor feature_sampling_method feature_sampling_window
    feature_reinit_scale from_pretrained_path init_encoder_as_decoder_transpose is_dataset_tokenized
    jumprelu_bandwidth jumprelu_init_threshold l1_coefficient l1_warm_up_steps llm_compilation_mode
    log_activations_store_to_wandb log_optimizer_state_to_wandb log_to_wandb lp_norm lr lr_decay_steps
    lr_end lr_scheduler_name lr_warm_up_steps mse_loss_normalization n_batches_in_buffer n_checkpoints
    n_eval_batches noise_scale normalize_sae_decoder resample_batches run_name sae_compilation_mode
    scale_sparsity_penalty_by_decoder_norm seed store_batch_size store_batch_size_prompts streaming
    tokens_per_buffer total_training_steps total_training_tokens train_batch_size_tokens
    train_batch_size use_cached_activations cached_activations_path use_ghost_grads wandb_entity
    wandb_id wandb_log_frequency wandb_project l0_coefficient l0_warm_up_steps pre_act_loss_coefficient
    aux_loss_coefficient decoder_init_norm dtype_str""".split()
)


@attrs.frozen(eq=False)
class SAE:
    """One sparse autoencoder (or transcoder): its weights and where it reads and writes.

    ``encode(x) = act(pre)``, ``pre = (x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc``, with
    ``act`` ReLU (``standard``, ``transcoder``), ReLU zeroed where ``pre <= threshold``
    (``jumprelu``, ``jumprelu_transcoder``) or the ``k`` largest of ``pre``, ReLU'd (``topk``);
    ``decode(acts) = acts @ W_dec + b_dec``.  A ``topk`` SAE with
    ``rescale_acts_by_decoder_norm`` is held with it folded in (``W_enc``, ``b_enc`` times the
    decoder rows' norms, ``W_dec`` divided by them), which is what SAELens computes.
    ``hook_name`` is the TransformerLens hook it reads, ``hook_name_out`` the one it writes
    (a transcoder's; the same hook for an SAE); ``source`` the folder or object it came from.
    """

    architecture: str
    W_enc: torch.Tensor
    b_enc: torch.Tensor
    W_dec: torch.Tensor
    b_dec: torch.Tensor
    threshold: torch.Tensor | None = None
    k: int | None = None
    apply_b_dec_to_input: bool = True
    hook_name: str | None = None
    hook_name_out: str | None = None
    source: str | None = None

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    @property
    def d_out(self) -> int:
        return self.W_dec.shape[1]

    @property
    def is_transcoder(self) -> bool:
        return self.architecture in _TRANSCODERS

    def point(self) -> Point:
        """The ``Point`` it reads (``hook_name`` as a point); refused when the hook has none."""
        return hook_point(self.hook_name, "hook_name", self.source)

    def point_out(self) -> Point:
        """The ``Point`` it writes: a transcoder's ``hook_name_out``, else the point it reads."""
        if not self.is_transcoder:
            return self.point()
        return hook_point(self.hook_name_out, "hook_name_out", self.source)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The feature activations of ``x [..., d_in]`` (plain torch, as SAELens computes them)."""
        centered = x - self.b_dec if self.apply_b_dec_to_input else x
        pre = centered @ self.W_enc + self.b_enc
        if self.architecture == "topk":
            values, indices = torch.topk(pre, self.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, indices, values.relu())
        acts = pre.relu()
        return acts * (pre > self.threshold).to(acts.dtype) if self.threshold is not None else acts

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        """The reconstruction ``acts @ W_dec + b_dec``."""
        return acts @ self.W_dec + self.b_dec


def hook_point(hook: str | None, field: str, source: str | None = None) -> Point:
    """The ``Point`` of a TransformerLens hook name (``'blocks.1.hook_resid_pre'``)."""
    for kind, pattern in TRANSFORMER_LENS_HOOKS.items():
        if pattern is None or "{last}" in pattern:
            continue
        if "{layer}" not in pattern:
            if hook == pattern:
                return Point(kind)
            continue
        prefix, suffix = pattern.split("{layer}")
        if isinstance(hook, str) and hook.startswith(prefix) and hook.endswith(suffix):
            middle = hook[len(prefix) : len(hook) - len(suffix)]
            if middle.isdigit():
                return Point(kind, int(middle))
    raise SAEError(
        f"{field} {hook!r} ({source or 'the SAE'}) is no TransformerLens hook a Point stands for "
        "(e.g. 'blocks.1.hook_resid_pre'); give the point to splice at: point=Point(...)",
        field,
        path=source,
    )


def load_sae(path: str | Path, *, dtype: torch.dtype | None = None) -> SAE:
    """The SAE saved in SAELens's format in the folder ``path`` (``cfg.json`` and
    ``sae_weights.safetensors``); ``dtype``: its weights in that dtype (default: the config's)."""
    from safetensors.torch import load_file

    folder = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise SAEError(f"load_sae: {folder / name} is not there (SAELens saves {name})", path=folder)
    config_path = folder / CONFIG_FILE
    try:
        config = json.loads(config_path.read_text())
    except ValueError as error:
        raise SAEError(f"load_sae: {config_path} is not JSON: {error}", path=config_path) from None
    if not isinstance(config, dict):
        raise SAEError(
            f"load_sae: {config_path} holds a {type(config).__name__}, not an object", path=config_path
        )
    weights = load_file(str(folder / WEIGHTS_FILE))
    return sae_from_parts(config, weights, source=str(folder), dtype=dtype)


def from_saelens(sae: Any, *, dtype: torch.dtype | None = None) -> SAE:
    """The ``SAE`` of a SAELens SAE object (``sae_lens.SAE``): its config and weights, checked as
    ``load_sae`` checks a file's (SAELens need only be importable where such an object exists)."""
    cfg, state = getattr(sae, "cfg", None), getattr(sae, "state_dict", None)
    if cfg is None or not hasattr(cfg, "to_dict") or state is None:
        raise SAEError(
            f"from_saelens: {type(sae).__name__} is not a SAELens SAE (no cfg.to_dict, state_dict)"
        )
    config = cfg.to_dict()
    metadata = config.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        config["metadata"] = metadata.to_dict() if hasattr(metadata, "to_dict") else dict(vars(metadata))
    weights = {name: value.detach() for name, value in state().items()}
    return sae_from_parts(config, weights, source=f"SAELens {type(sae).__name__}", dtype=dtype)


def save_sae(sae: SAE, path: str | Path) -> Path:
    """Write ``sae`` in SAELens 6's format (``cfg.json``, ``sae_weights.safetensors``) in ``path``.

    A ``topk`` SAE is written with its decoder-norm rescaling folded in
    (``rescale_acts_by_decoder_norm: false``), which computes the same."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    if sae.threshold is not None:
        weights["threshold"] = sae.threshold
    save_file(
        {name: value.detach().contiguous() for name, value in weights.items()}, str(folder / WEIGHTS_FILE)
    )
    dtype = next(name for name, value in _DTYPES.items() if value == sae.W_enc.dtype)
    config = {"architecture": sae.architecture, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": dtype}
    config |= {"apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none"}
    config["reshape_activations"] = "none"
    if sae.architecture == "topk":
        config |= {"k": sae.k, "rescale_acts_by_decoder_norm": False}
    if sae.is_transcoder:
        config["d_out"] = sae.d_out
    config["metadata"] = {"hook_name": sae.hook_name, "hook_name_out": sae.hook_name_out}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    return folder


def sae_from_parts(
    config: Mapping[str, Any], weights: Mapping[str, torch.Tensor], *, source: str, dtype=None
) -> SAE:
    """An ``SAE`` from SAELens's config dict and state dict, every field and weight checked."""
    where = Path(source) / CONFIG_FILE if Path(source).is_dir() else source
    _check_fields(config, where)
    architecture = _architecture(config, where)
    settings = _settings(config, architecture, where)
    dtype = dtype if dtype is not None else settings.pop("dtype")
    settings.pop("dtype", None)
    rescale = settings.pop("rescale")
    tensors = _weights(weights, architecture, config, source, dtype)
    if rescale:
        norms = tensors["W_dec"].norm(dim=-1)
        tensors |= {"W_enc": tensors["W_enc"] * norms, "b_enc": tensors["b_enc"] * norms}
        tensors["W_dec"] = tensors["W_dec"] / norms[:, None]
    hooks = _hooks(config, architecture)
    return SAE(architecture=architecture, **tensors, **settings, **hooks, source=source)


def _check_fields(config: Mapping[str, Any], where: Any) -> None:
    unknown = sorted(set(config) - _ARITHMETIC - _WHERE - _TRAINING)
    if unknown:
        raise SAEError(
            f"{where}: unknown config field(s) {', '.join(map(repr, unknown))}: not a field of SAELens's "
            "configs (5.x, 6.x); what they change cannot be known, so the SAE is not read",
            unknown[0],
            path=where,
        )
    if "metadata" in config and not isinstance(config["metadata"], Mapping):
        raise SAEError(
            f"{where}: 'metadata' is a {type(config['metadata']).__name__}, not an object", "metadata"
        )


def _architecture(config: Mapping[str, Any], where: Any) -> str:
    """SAELens's architecture; a 5.x config without one is ``standard`` (``topk`` with
    ``activation_fn: 'topk'``), as SAELens's ``handle_pre_6_0_config`` reads it."""
    activation = config.get("activation_fn", config.get("activation_fn_str"))
    default = "topk" if activation == "topk" else "standard"
    architecture = config.get("architecture", default)
    if architecture not in ARCHITECTURES:
        raise SAEError(
            f"{where}: architecture {architecture!r} is not read here; the architectures read are "
            f"{', '.join(ARCHITECTURES)}",
            "architecture",
            path=where,
        )
    if activation is not None and (
        activation not in ("relu", "topk") or (activation == "topk") != (architecture == "topk")
    ):
        raise SAEError(
            f"{where}: activation_fn {activation!r} with architecture {architecture!r}: a {architecture} "
            f"SAE's activation is {'topk' if architecture == 'topk' else 'relu'}",
            "activation_fn",
            path=where,
        )
    return architecture


def _settings(config: Mapping[str, Any], architecture: str, where: Any) -> dict[str, Any]:
    """``k``, ``apply_b_dec_to_input``, ``dtype`` and the topk rescaling, each checked."""
    refused = {
        "normalize_activations": ("none", None),
        "reshape_activations": ("none", None),
        "finetuning_scaling_factor": (False, None),
    }
    for field, allowed in refused.items():
        if config.get(field) not in allowed:
            raise SAEError(
                f"{where}: {field} {config[field]!r} is not computed here (only {allowed[0]!r}); "
                "fold it into the weights first (SAELens: fold_activation_norm_scaling_factor)",
                field,
                path=where,
            )
    apply = config.get("apply_b_dec_to_input", architecture not in _TRANSCODERS)
    if not isinstance(apply, bool) or (apply and architecture in _TRANSCODERS):
        raise SAEError(
            f"{where}: apply_b_dec_to_input {apply!r} (a transcoder's is false)", "apply_b_dec_to_input"
        )
    settings: dict[str, Any] = {"apply_b_dec_to_input": apply, "rescale": False, "k": None}
    if architecture == "topk":
        k = config.get("k", (config.get("activation_fn_kwargs") or {}).get("k"))
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SAEError(f"{where}: a topk SAE's k must be an int >= 1, got {k!r}", "k", path=where)
        rescale = config.get("rescale_acts_by_decoder_norm", False)
        if not isinstance(rescale, bool):
            raise SAEError(
                f"{where}: rescale_acts_by_decoder_norm {rescale!r} is no bool",
                "rescale_acts_by_decoder_norm",
            )
        settings |= {"k": k, "rescale": rescale}
    else:
        for field in ("k", "rescale_acts_by_decoder_norm", "activation_fn_kwargs"):
            if config.get(field) not in (None, {}, False):
                raise SAEError(
                    f"{where}: {field} belongs to topk SAEs, not {architecture!r}", field, path=where
                )
    if "d_out" in config and architecture not in _TRANSCODERS:
        raise SAEError(f"{where}: d_out belongs to transcoders, not {architecture!r}", "d_out", path=where)
    name = str(config.get("dtype", "float32")).removeprefix("torch.")
    if name not in _DTYPES:
        raise SAEError(
            f"{where}: dtype {config.get('dtype')!r}; known: {', '.join(_DTYPES)}", "dtype", path=where
        )
    settings["dtype"] = _DTYPES[name]
    return settings


def _weights(weights: Mapping[str, torch.Tensor], architecture: str, config, source: str, dtype) -> dict:
    """The weights by SAELens's names, each of its shape (``log_threshold``: ``threshold = exp``)."""
    weights = dict(weights)
    if "log_threshold" in weights and "threshold" not in weights:
        weights["threshold"] = weights.pop("log_threshold").exp()
    d_in, d_sae = config.get("d_in"), config.get("d_sae")
    d_out = config.get("d_out", d_in) if architecture in _TRANSCODERS else d_in
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_out), "b_dec": (d_out,)}
    if architecture in _JUMPRELU:
        shapes["threshold"] = (d_sae,)
    file = Path(source) / WEIGHTS_FILE if Path(source).is_dir() else source
    for field, size in (("d_in", d_in), ("d_sae", d_sae), ("d_out", d_out)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SAEError(f"{source}: {field} must be an int >= 1, got {size!r}", field, path=source)
    missing, unexpected = sorted(set(shapes) - set(weights)), sorted(set(weights) - set(shapes))
    mismatched = sorted(n for n in set(shapes) & set(weights) if tuple(weights[n].shape) != shapes[n])
    if missing or unexpected or mismatched:
        shown = "; ".join(
            [f"missing {missing}"] * bool(missing)
            + [f"unexpected {unexpected}"] * bool(unexpected)
            + [f"{n} is {list(weights[n].shape)}, not {list(shapes[n])}" for n in mismatched]
        )
        raise SAEError(
            f"{file}: the weights do not fit a {architecture} SAE of d_in={d_in}, d_sae={d_sae}"
            f"{f', d_out={d_out}' if d_out != d_in else ''}: {shown}",
            (missing + unexpected + mismatched)[0],
            path=file,
            missing_keys=missing,
            unexpected_keys=unexpected,
            mismatched_keys=mismatched,
        )
    return {name: weights[name].to(dtype) for name in shapes}


def _hooks(config: Mapping[str, Any], architecture: str) -> dict[str, str | None]:
    """The hooks read and written: SAELens 6 keeps them in ``metadata``, 5.x at the top level."""
    metadata = config.get("metadata") or {}

    def first(*fields: str) -> str | None:
        for field in fields:
            for holder in (metadata, config):
                if holder.get(field) is not None:
                    return holder[field]
        return None

    hook = first("hook_name", "hook_point")
    out = first("hook_name_out") if architecture in _TRANSCODERS else hook
    return {"hook_name": hook, "hook_name_out": out}
