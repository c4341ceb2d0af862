"""circuit-tracer's side of bench/attribution_graph.py, run with the Python of circuit-tracer's own venv.

circuit-tracer pins TransformerLens 3 and transformers 4, so it cannot share the project's
environment (tests/data/circuit_tracer/README.md: how to make ``/tmp/ct-venv``).  Given a folder and
the sizes, this script: builds a Llama-layout ``HookedTransformerConfig`` (RMSNorm, rotary,
grouped-query attention, gated SiLU MLP) with TransformerLens's random initialization (seed 0) and
an offline word-level tokenizer (token 0 its special token); makes one random JumpReLU
``SingleLayerTranscoder`` per layer reading ``mlp.hook_in`` and writing ``mlp.hook_out``, each
layer's threshold halfway between its ``l0 x pos``-th largest pre-activation on the prompt and the
next (``benchtools.threshold_between``; all seeded: every call builds the same).  With ``--make``
it writes ``model.safetensors``, ``tl_config.json``, the transcoders in SAELens's format
(``transcoders/layer_L``) and the prompt, which the project side reads to build the same model;
without, it runs ``circuit_tracer.attribute`` twice, the first call warm-up, and prints
``{"seconds", "rss_before", "peak_bytes", "features", "nodes"}`` as JSON: the second call's seconds
and its own peak in resident memory (``benchtools.resident_peak``); ``--allocations`` adds
``"allocated_bytes"``, torch's peak allocations over a third call under torch's profiler (costly at
large sizes).  When the graph has at most ``--save-limit`` nodes it saves the adjacency
(``adjacency.safetensors``) and, for ``bench/attribution_compare.py``, the active features, their
activations, the logit tokens and the transcoders' inputs (``mlp.hook_in``, from the calibrating
run: ``theirs_features.safetensors``).  The project side calls it once per round, alternating, in
a fresh process each time.

    /tmp/ct-venv/bin/python bench/circuit_tracer_side.py FOLDER --make --layers 30 --d-model 576 ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchtools import peak_bytes, print_json, resident_peak, threshold_between

BUFFER_SUFFIXES = ("attn.mask", "attn.IGNORE", "attn.rotary_sin", "attn.rotary_cos")


def config(args, tokenizer_folder: Path) -> dict:
    """The Llama-layout ``HookedTransformerConfig`` fields (JSON-able: dtype as text)."""
    return dict(
        n_layers=args.layers,
        d_model=args.d_model,
        n_ctx=max(64, args.seq),
        d_head=args.d_head,
        n_heads=args.heads,
        n_key_value_heads=args.kv_heads,
        d_mlp=args.d_mlp,
        d_vocab=args.vocab,
        d_vocab_out=args.vocab,
        act_fn="silu",
        eps=1e-5,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=args.d_head,
        rotary_base=10000.0,
        rotary_adjacent_pairs=False,
        gated_mlp=True,
        final_rms=True,
        original_architecture="LlamaForCausalLM",
        tokenizer_name=str(tokenizer_folder),
        dtype="float32",
        seed=0,
        init_weights=True,
        device="cpu",
    )


def tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer of ``vocab`` made-up words, ``<bos>`` (id 0) its special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<bos>"] + [f"w{i}" for i in range(1, vocab)]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<bos>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>").save_pretrained(str(folder))


def replacement_model(cfg_fields: dict, args):
    """circuit-tracer's ``ReplacementModel`` on the config, transcoders of threshold 0 for now."""
    from transformer_lens import HookedTransformerConfig

    from circuit_tracer import ReplacementModel
    from circuit_tracer.transcoder import SingleLayerTranscoder, TranscoderSet
    from circuit_tracer.transcoder.activation_functions import JumpReLU

    cfg = HookedTransformerConfig.from_dict(dict(cfg_fields, dtype=torch.float32))
    generator = torch.Generator().manual_seed(2)
    transcoders = {}
    for layer in range(args.layers):
        tc = SingleLayerTranscoder(
            args.d_model, args.features, JumpReLU(torch.zeros(()), 0.1), layer, dtype=torch.float32
        )
        with torch.no_grad():
            tc.W_enc.copy_(torch.randn(args.features, args.d_model, generator=generator) / args.d_model**0.5)
            tc.b_enc.copy_(torch.randn(args.features, generator=generator) * 0.1)
            tc.W_dec.copy_(torch.randn(args.features, args.d_model, generator=generator) / args.features**0.5)
            tc.b_dec.zero_()
        transcoders[layer] = tc
    transcoder_set = TranscoderSet(
        transcoders, feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out"
    )
    return ReplacementModel.from_config(cfg, transcoder_set)


def calibrate(model, prompt: torch.Tensor, l0: float) -> torch.Tensor:
    """Each layer's threshold: halfway between its ``l0 x pos``-th largest pre-activation on ``prompt``
    and the next (``threshold_between``: none within rounding of it);
    returns the transcoders' inputs ``[layers, pos, d_model]`` on it."""
    inputs = {}
    hooks = [
        (f"blocks.{layer}.mlp.hook_in", lambda acts, hook, layer=layer: inputs.__setitem__(layer, acts))
        for layer in range(model.cfg.n_layers)
    ]
    with torch.no_grad():
        model.run_with_hooks(prompt[None], fwd_hooks=hooks)
        for layer, tc in enumerate(model.transcoders):
            pre = tc.encode(inputs[layer][0], apply_activation_function=False)
            threshold = threshold_between(pre, max(1, round(l0 * pre.shape[0])))
            tc.activation_function.threshold.data = torch.full((tc.d_transcoder,), threshold)
    return torch.stack([inputs[layer][0] for layer in range(model.cfg.n_layers)])


def _jsonable(value):
    """A cfg field JSON cannot write: a dtype as its name (``'float32'``), a number as a float."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def save(model, prompt: torch.Tensor, out: Path) -> None:
    """The model (TransformerLens 3 keys, circuit-tracer's wrappers unwrapped), its cfg, the
    transcoders (SAELens 6's format) and the prompt."""
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("transcoders.") or key.endswith(BUFFER_SUFFIXES) or ".hook_" in key:
            continue
        key = key.replace("mlp.old_mlp.", "mlp.").replace("unembed.old_unembed.", "unembed.")
        state[key] = value.detach().clone().contiguous()
    save_file(state, str(out / "model.safetensors"))
    fields = dict(model.cfg.to_dict(), tokenizer_name=None, device="cpu")
    (out / "tl_config.json").write_text(json.dumps(fields, indent=1, default=_jsonable))
    save_file({"tokens": prompt}, str(out / "prompt.safetensors"))
    for layer, tc in enumerate(model.transcoders):
        folder = out / "transcoders" / f"layer_{layer}"
        folder.mkdir(parents=True, exist_ok=True)
        weights = {"W_enc": tc.W_enc.detach().T, "b_enc": tc.b_enc, "W_dec": tc.W_dec, "b_dec": tc.b_dec}
        weights["threshold"] = tc.activation_function.threshold
        save_file(
            {k: v.detach().contiguous() for k, v in weights.items()}, str(folder / "sae_weights.safetensors")
        )
        sae_config = dict(architecture="jumprelu_transcoder", d_in=tc.d_model, d_sae=tc.d_transcoder)
        sae_config |= dict(d_out=tc.d_model, dtype="float32", apply_b_dec_to_input=False)
        sae_config["metadata"] = {
            "hook_name": f"blocks.{layer}.ln2.hook_normalized",
            "hook_name_out": f"blocks.{layer}.mlp.hook_out",
        }
        (folder / "cfg.json").write_text(json.dumps(sae_config, indent=1))


def main() -> None:
    from circuit_tracer import attribute

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument(
        "--make", action="store_true", help="build and save the model, transcoders and prompt"
    )
    for flag in ("layers", "d-model", "heads", "kv-heads", "d-head", "d-mlp", "vocab", "seq", "features"):
        parser.add_argument(f"--{flag}", type=int, required=True)
    parser.add_argument("--l0", type=float, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument(
        "--allocations",
        action="store_true",
        help="also torch's peak allocations, one more call under its profiler",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save-limit", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = args.folder
    if args.make:
        out.mkdir(parents=True, exist_ok=True)
        tokenizer(out / "tokenizer", args.vocab)
    cfg_fields = config(args, out / "tokenizer")
    model = replacement_model(cfg_fields, args)  # the same weights every time: seeded
    prompt = torch.randint(1, args.vocab, (args.seq,), generator=torch.Generator().manual_seed(1))
    prompt[0] = 0  # the special token: circuit-tracer prepends nothing
    inputs = calibrate(model, prompt, args.l0)
    if args.make:
        save(model, prompt, out)
        return

    def run():
        return attribute(prompt, model, batch_size=args.batch_size)

    run()  # warm, as ours is: the first call's one-time costs unmeasured
    result, graph = resident_peak(run, on_start=lambda rss: print_json({"rss_before": rss}))
    result["features"] = int(graph.active_features.shape[0])
    result["nodes"] = nodes = graph.adjacency_matrix.shape[0]
    if args.allocations:
        result["allocated_bytes"] = peak_bytes(run)
    if nodes <= args.save_limit:
        save_file(
            {"adjacency_matrix": graph.adjacency_matrix.contiguous()}, str(out / "adjacency.safetensors")
        )
        features = {"active_features": graph.active_features, "activation_values": graph.activation_values}
        features |= {"inputs": inputs, "logit_tokens": graph.logit_tokens}
        save_file(
            {k: v.detach().contiguous() for k, v in features.items()},
            str(out / "theirs_features.safetensors"),
        )
    print_json(result)


if __name__ == "__main__":
    main()
