"""circuit-tracer's attribution graph of a small random Gemma-2 model, saved for tests/test_graph_*.py.

circuit-tracer pins transformers <= 4.57.3 and TransformerLens 3 (its ``HookedTransformer``), so it
cannot share the project's environment; this script runs in one of its own (CPU, float32):

    python3 -m venv /tmp/ct-venv
    /tmp/ct-venv/bin/pip install torch==2.13.0        # the project's torch (CPU build)
    /tmp/ct-venv/bin/pip install circuit-tracer==0.5.0
    ulimit -v 12000000; /tmp/ct-venv/bin/python scripts/circuit_tracer_reference.py tests/data/circuit_tracer

(pip resolved transformer-lens 3.2.1, transformers 4.57.3, nnsight 0.8.1, huggingface-hub 0.36.2,
tokenizers 0.22.2, numpy 2.4.6, pydantic 2.14.4; no other pin was needed.)

The model is built as circuit-tracer's own test does (tests/test_attributions_gemma.py,
``load_dummy_gemma_model`` and ``test_small_gemma_model``'s config): a 2-layer Gemma-2
``HookedTransformerConfig``, every parameter (model and transcoders) uniform in [-1, 1], one
``JumpReLU`` threshold per layer uniform in [0, 1], ``SingleLayerTranscoder`` of 32 features at
every layer reading ``mlp.hook_in`` and writing ``mlp.hook_out``, seed 42, the prompt
``[0, 3, 4, 3, 2, 5, 3, 8]`` (0 is the special token circuit-tracer's attribution skips).  Changes
to that config, each so that ``circuits``' Gemma-2 builder reproduces the model (it refuses the
rest by name): ``normalization_type='RMS'`` (not ``'RMSPre'``, so the pre-norms have weights, also
random), ``attn_scale=2.0`` (sqrt(d_head); the test's 16.0 is Gemma-2-2b's), every bias zeroed
after the random init (a Gemma-2 has none), ``n_ctx=64`` (not 8192: it only sizes buffers), and an
offline 16-word tokenizer (the test names ``gpt2``, a download).  tests/data/circuit_tracer/README.md
says what each file holds and which of circuit-tracer's conventions a graph builder must match.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

SEED = 42
PROMPT = [0, 3, 4, 3, 2, 5, 3, 8]
WORDS = "<bos> the cat sat on mat dog ran a big red ball and then it .".split()
SLUG = "random-gemma2"
SCAN = "random-gemma2-transcoders"

# circuit-tracer's test_small_gemma_model config, with the changes the docstring lists.
CONFIG = {
    "n_layers": 2,
    "d_model": 8,
    "n_ctx": 64,
    "d_head": 4,
    "model_name": "gemma-2-2b",
    "n_heads": 2,
    "d_mlp": 16,
    "act_fn": "gelu_pytorch_tanh",
    "d_vocab": 16,
    "eps": 1e-06,
    "use_attn_result": False,
    "use_attn_scale": True,
    "attn_scale": 2.0,
    "use_split_qkv_input": False,
    "use_hook_mlp_in": False,
    "use_attn_in": False,
    "use_local_attn": True,
    "ungroup_grouped_query_attention": False,
    "original_architecture": "Gemma2ForCausalLM",
    "from_checkpoint": False,
    "checkpoint_index": None,
    "checkpoint_label_type": None,
    "checkpoint_value": None,
    "tokenizer_name": None,
    "window_size": 4096,
    "attn_types": ["global", "local"],
    "init_mode": "gpt2",
    "normalization_type": "RMS",
    "device": "cpu",
    "n_devices": 1,
    "attention_dir": "causal",
    "attn_only": False,
    "seed": None,
    "initializer_range": 0.02,
    "init_weights": False,
    "scale_attn_by_inverse_layer_idx": False,
    "positional_embedding_type": "rotary",
    "final_rms": True,
    "d_vocab_out": 16,
    "parallel_attn_mlp": False,
    "rotary_dim": 4,
    "n_params": 2146959360,
    "use_hook_tokens": False,
    "gated_mlp": True,
    "default_prepend_bos": True,
    "dtype": "float32",
    "tokenizer_prepends_bos": True,
    "n_key_value_heads": 2,
    "post_embedding_ln": False,
    "rotary_base": 10000.0,
    "trust_remote_code": False,
    "rotary_adjacent_pairs": False,
    "load_in_4bit": False,
    "num_experts": None,
    "experts_per_token": None,
    "relative_attention_max_distance": None,
    "relative_attention_num_buckets": None,
    "decoder_start_token_id": None,
    "tie_word_embeddings": False,
    "use_normalization_before_and_after": True,
    "attn_scores_soft_cap": 50.0,
    "output_logits_soft_cap": 0.0,
    "use_NTK_by_parts_rope": False,
    "NTK_by_parts_low_freq_factor": 1.0,
    "NTK_by_parts_high_freq_factor": 4.0,
    "NTK_by_parts_factor": 8.0,
}

# TransformerLens's buffers (derived from the config), not weights.
BUFFER_SUFFIXES = ("attn.mask", "attn.IGNORE", "attn.rotary_sin", "attn.rotary_cos")


def tokenizer(folder: Path):
    """A word-level tokenizer of ``WORDS`` (id = position), ``<bos>`` its special token, saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<bos>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>")
    tok.save_pretrained(str(folder))
    return tok


def build_model(tok_folder: Path):
    """circuit-tracer's ``load_dummy_gemma_model`` on ``CONFIG``, then every bias zeroed."""
    from torch import nn
    from transformer_lens import HookedTransformerConfig

    from circuit_tracer import ReplacementModel
    from circuit_tracer.transcoder import SingleLayerTranscoder, TranscoderSet
    from circuit_tracer.transcoder.activation_functions import JumpReLU

    cfg = HookedTransformerConfig.from_dict(dict(CONFIG, dtype=torch.float32, tokenizer_name=str(tok_folder)))
    transcoders = {
        layer: SingleLayerTranscoder(cfg.d_model, cfg.d_model * 4, JumpReLU(torch.tensor(0.0), 0.1), layer)
        for layer in range(cfg.n_layers)
    }
    for transcoder in transcoders.values():
        for _, param in transcoder.named_parameters():
            nn.init.uniform_(param, a=-1, b=1)
    transcoder_set = TranscoderSet(
        transcoders, feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out", scan=SCAN
    )
    model = ReplacementModel.from_config(cfg, transcoder_set)
    for _, param in model.named_parameters():
        nn.init.uniform_(param, a=-1, b=1)
    for transcoder in model.transcoders:
        nn.init.uniform_(transcoder.activation_function.threshold, a=0, b=1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith("transcoders.") and name.rsplit(".", 1)[-1].lstrip("_").startswith("b_"):
                param.zero_()
    return model


def tl_state_dict(model) -> dict[str, torch.Tensor]:
    """The plain ``HookedTransformer`` state dict: circuit-tracer's wrappers' ``old_mlp``/``old_unembed``
    unwrapped, its transcoders and TransformerLens's buffers left out."""
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("transcoders.") or key.endswith(BUFFER_SUFFIXES) or ".hook_" in key:
            continue
        key = key.replace("mlp.old_mlp.", "mlp.").replace("unembed.old_unembed.", "unembed.")
        state[key] = value.detach().clone().contiguous()
    return state


def save_transcoders(model, out: Path) -> None:
    """Each layer's transcoder in SAELens 6's on-disk format (``circuits.models.sae.load_sae`` reads it)."""
    for layer, transcoder in enumerate(model.transcoders):
        folder = out / "transcoders" / f"layer_{layer}"
        folder.mkdir(parents=True, exist_ok=True)
        d_sae = transcoder.d_transcoder
        weights = {
            "W_enc": transcoder.W_enc.detach().T.contiguous(),  # SAELens: [d_in, d_sae]
            "b_enc": transcoder.b_enc.detach().clone(),
            "W_dec": transcoder.W_dec.detach().clone(),  # [d_sae, d_out] in both
            "b_dec": transcoder.b_dec.detach().clone(),
            "threshold": transcoder.activation_function.threshold.detach().expand(d_sae).contiguous(),
        }
        save_file(weights, str(folder / "sae_weights.safetensors"))
        config = {
            "architecture": "jumprelu_transcoder",
            "d_in": transcoder.d_model,
            "d_sae": d_sae,
            "d_out": transcoder.d_model,
            "dtype": "float32",
            "device": "cpu",
            "apply_b_dec_to_input": False,
            "normalize_activations": "none",
            "reshape_activations": "none",
            "metadata": {
                "model_name": "random-gemma2",
                "hook_name": f"blocks.{layer}.ln2.hook_normalized",
                "hook_name_out": f"blocks.{layer}.mlp.hook_out",
            },
        }
        (folder / "cfg.json").write_text(json.dumps(config, indent=1) + "\n")


def node_records(graph) -> list[list]:
    """The adjacency's node order as ``[kind, layer, pos, feature]`` rows (None where a kind has none)."""
    n_layers, n_pos = graph.cfg.n_layers, graph.n_pos
    rows: list[list] = []
    for index in graph.selected_features.tolist():
        layer, pos, feature = graph.active_features[index].tolist()
        rows.append(["feature", layer, pos, feature])
    rows += [["error", layer, pos, None] for layer in range(n_layers) for pos in range(n_pos)]
    rows += [["embedding", None, pos, int(graph.input_tokens[pos])] for pos in range(n_pos)]
    rows += [["logit", None, n_pos - 1, int(t.vocab_idx)] for t in graph.logit_targets]
    return rows


def attribute_and_save(model, tok_folder: Path, out: Path) -> None:
    """Run circuit-tracer's ``attribute``, ``prune_graph`` and ``create_graph_files``; save what they give."""
    from circuit_tracer import attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.utils.create_graph_files import create_graph_files

    tokens = torch.tensor(PROMPT)
    with torch.no_grad():
        logits = model(tokens.unsqueeze(0))[0]
    graph = attribute(tokens, model)
    graph.cfg.tokenizer_name = str(tok_folder)  # create_graph_files loads the tokenizer by this name
    node_mask, edge_mask, cumulative = prune_graph(graph)  # the defaults: 0.8, 0.98
    replacement, completeness = compute_graph_scores(graph)
    with tempfile.TemporaryDirectory() as files:
        create_graph_files(graph, SLUG, files, scan=SCAN)
        shutil.copy(Path(files) / f"{SLUG}.json", out / "graph.json")
    reference = {
        "tokens": tokens,
        "logits": logits.detach().contiguous(),
        "active_features": graph.active_features.contiguous(),
        "activation_values": graph.activation_values.contiguous(),
        "selected_features": graph.selected_features.contiguous(),
        "logit_token_ids": graph.logit_token_ids.contiguous(),
        "logit_probabilities": graph.logit_probabilities.contiguous(),
        "adjacency_matrix": graph.adjacency_matrix.contiguous(),
        "node_mask": node_mask.contiguous(),
        "edge_mask": edge_mask.contiguous(),
        "cumulative_scores": cumulative.contiguous(),
    }
    save_file({k: v.detach().cpu() for k, v in reference.items()}, str(out / "reference.safetensors"))
    meta = {
        "nodes": node_records(graph),
        "token_strings": [WORDS[t] for t in PROMPT],
        "logit_token_strings": [t.token_str for t in graph.logit_targets],
        "input_string": graph.input_string,
        "slug": SLUG,
        "scan": SCAN,
        "node_threshold": 0.8,
        "edge_threshold": 0.98,
        "replacement_score": replacement,
        "completeness_score": completeness,
    }
    (out / "graph_meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def versions() -> dict[str, str]:
    from importlib.metadata import version

    names = ("circuit-tracer", "torch", "transformer-lens", "transformers", "nnsight", "tokenizers", "numpy")
    return {name: version(name) for name in names}


def main(out: Path) -> None:
    torch.manual_seed(SEED)
    torch.set_default_dtype(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tok_dir:
        tok_folder = Path(tok_dir)
        tokenizer(tok_folder)
        model = build_model(tok_folder)
        save_file(tl_state_dict(model), str(out / "model.safetensors"))
        (out / "tl_config.json").write_text(json.dumps(CONFIG, indent=1) + "\n")
        save_transcoders(model, out)
        attribute_and_save(model, tok_folder, out)
    (out / "versions.json").write_text(json.dumps(versions(), indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/circuit_tracer"))
