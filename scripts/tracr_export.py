"""Compile RASP programs with tracr and export their weights, true edges and outputs for the tests.

    python scripts/tracr_export.py                # writes tests/data/tracr/<program>.{safetensors,json}

tracr (``tracr-pypi`` on the package index) needs jax and haiku, which the project does not
depend on: the script runs in a venv of its own (``--venv``, default /tmp/tracr-venv), made with
``pip install tracr-pypi safetensors`` when it does not exist, and re-runs itself there.

For each program the script compiles the RASP program as ``compile_rasp_to_model`` does, step by
step, keeping the craft model that the weights are assembled from, and writes:

- ``<program>.safetensors``: tracr's parameters as haiku names them (``'transformer/layer_0/attn/
  query.w'``, ``'token_embed.embeddings'``, ...), the unembedding ``'unembed'`` (``[d_model,
  outputs]``: the projection of the residual stream on the output space, which tracr's model
  applies without storing), the input token ids ``'inputs'`` ``[batch, positions]`` and tracr's own
  outputs on them: the final residual stream ``'tracr.output'`` and the unembedded values
  ``'tracr.unembedded'`` (before the argmax of a categorical output).
- ``<program>.json``: the program, tracr's model config, the residual labels, the token and output
  encodings, the decoded outputs and the true edges.

The true edges are read off the compiled model, not written by hand.  Every component (the
embeddings, each head of each attention block, each MLP) writes a set of residual directions and
each receiver (a head's query, key and value input, an MLP's input, the output readout) reads one:
a head's query reads its ``w_qk.left_space``, its key the ``right_space``, its value the
``w_ov.input_space``, and it writes its ``w_ov.output_space``; an MLP reads its first layer's input
space and writes its second layer's output space; the embeddings write the token, index and
``one`` directions; the readout reads the output space.  An edge ``sender->receiver`` is true when
the sender comes first and writes a direction that the receiver's assembled weights read (a
nonzero row of the receiver's matrix on that direction); the JSON also keeps the edges the
declared spaces alone give (``space_edges``), which the script checks agree.  Edge names are those
of ``circuits.experiments.edge_circuit`` on the circuit ``circuits.models.from_tracr`` builds:
senders ``'embeds'``, ``'b{L}.a.head{h}'``, ``'b{L}.m'``; receivers ``'b{L}.a.head{h}.q'`` (``.k``,
``.v``), ``'b{L}.m'``, ``'t.call'``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["tracr-pypi", "safetensors"]


def ensure_tracr(venv: Path) -> None:
    """Re-run this script in ``venv`` (made and filled when missing) unless tracr imports here."""
    try:
        import tracr  # noqa: F401
        import safetensors  # noqa: F401

        return
    except ImportError:
        pass
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", *PACKAGES], check=True)
    os.execv(str(python), [str(python), *sys.argv])


def programs():
    """name -> (RASP program, vocab, max_seq_len, inputs maker, what it computes)."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    def full_length(vocab, n, count, seed, distinct=False):
        rng = random.Random(seed)
        rows = set()
        while len(rows) < count:
            row = tuple(rng.sample(sorted(vocab), n) if distinct else rng.choices(sorted(vocab), k=n))
            rows.add(row)
        return sorted(rows)

    return {
        "reverse": (
            lib.make_reverse(rasp.tokens),
            {1, 2, 3},
            5,
            # 4 tokens of 5: at full length a zero-ablated length head reads as the full length
            lambda: full_length({1, 2, 3}, 4, 16, 0),
            "the tokens in reverse order (lib.make_reverse(rasp.tokens))",
        ),
        "frac_prevs": (
            lib.make_frac_prevs(rasp.tokens == "x"),
            {"a", "b", "c", "x"},
            5,
            lambda: full_length({"a", "b", "c", "x"}, 5, 16, 1),
            "the fraction of the tokens so far that are 'x' (lib.make_frac_prevs(rasp.tokens == 'x'))",
        ),
        "hist": (
            lib.make_hist(),
            {"a", "b", "c"},
            5,
            lambda: full_length({"a", "b", "c"}, 5, 16, 2),
            "how often each token occurs in the input (lib.make_hist())",
        ),
        "sort_unique": (
            lib.make_sort_unique(rasp.tokens, rasp.tokens),
            {1, 2, 3, 4, 5, 6},
            4,
            lambda: full_length({1, 2, 3, 4, 5, 6}, 4, 16, 3, distinct=True),
            "the distinct tokens sorted (lib.make_sort_unique(rasp.tokens, rasp.tokens))",
        ),
    }


def compile_program(program, vocab, max_seq_len):
    """``compile_rasp_to_model``'s steps, keeping the craft model and the spaces it assembles."""
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        rasp_to_graph,
    )
    from tracr.craft import bases
    from tracr.rasp import rasp

    extracted = rasp_to_graph.extract_rasp_graph(program)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, vocab, max_seq_len)
    bos = "compiler_bos"
    expr_to_craft_graph.add_craft_components_to_rasp_graph(
        graph, bos_dir=bases.BasisDirection(rasp.tokens.label, bos), mlp_exactness=100
    )
    craft_model = craft_graph_to_model.craft_graph_to_model(graph, sources)
    model = craft_model_to_transformer.craft_model_to_transformer(
        craft_model=craft_model,
        graph=graph,
        sink=sink,
        max_seq_len=max_seq_len,
        causal=False,
        compiler_bos=bos,
        compiler_pad="compiler_pad",
    )
    return model, craft_model, sink


def components(model, craft_model):
    """The senders ``[(name, written directions)]`` and receivers ``[(name, read directions,
    reading matrix [d_model, n])]`` in model order (the embeddings first, the readout last)."""
    import numpy as np
    from tracr.compiler import assemble
    from tracr.craft import bases, transformers

    labels = model.residual_labels
    space = bases.VectorSpaceWithBasis([_direction(label) for label in labels])
    assert [str(d) for d in space.basis] == labels

    def dirs(sub):
        return sorted({str(d) for d in sub.basis} & set(labels))

    params = {f"{m}.{p}": np.asarray(v) for m, ps in model.params.items() for p, v in ps.items()}
    embedded = (params["token_embed.embeddings"] != 0).any(0) | (params["pos_embed.embeddings"] != 0).any(0)
    senders = [("embeds", sorted(labels[j] for j in np.nonzero(embedded)[0]), None)]
    receivers = []
    _, module_names = assemble._get_model_config_and_module_names(craft_model)
    key_size = model.model_config.key_size
    for module_name, block in zip(module_names, craft_model.blocks):
        layer = int(module_name.split("/")[1].removeprefix("layer_"))
        prefix = f"transformer/layer_{layer}"
        if isinstance(block, transformers.MLP):
            w_in = params[f"{prefix}/mlp/linear_1.w"]
            receivers.append((f"b{layer}.m", dirs(block.fst.input_space), w_in))
            senders.append((f"b{layer}.m", dirs(block.snd.output_space), None))
            continue
        for head, craft_head in enumerate(block.as_multi().heads()):
            cols = slice(head * key_size, (head + 1) * key_size)
            for role, sub, which in (
                ("q", craft_head.w_qk.left_space, "query"),
                ("k", craft_head.w_qk.right_space, "key"),
                ("v", craft_head.w_ov.input_space, "value"),
            ):
                w = params[f"{prefix}/attn/{which}.w"][:, cols]
                receivers.append((f"b{layer}.a.head{head}.{role}", dirs(sub), w))
            senders.append((f"b{layer}.a.head{head}", dirs(craft_head.w_ov.output_space), None))
    return senders, receivers


def _direction(label: str):
    from tracr.craft import bases

    name, colon, value = label.partition(":")
    if not colon:
        return bases.BasisDirection(name)
    try:
        parsed = int(value)
    except ValueError:
        parsed = value
    return bases.BasisDirection(name, parsed)


def _order(name: str) -> tuple:
    """Where a component sits: the embeddings, then per layer the heads, then the MLP; the readout."""
    if name == "embeds":
        return (-1, 0)
    if name == "t.call":
        return (10**6, 0)
    layer = int(name.split(".")[0].removeprefix("b"))
    return (layer, 1 if name.split(".")[1] == "m" else 0)


def true_edges(model, craft_model, unembed):
    """``(edges by weights, edges by declared spaces, the components' directions)``."""
    senders, receivers = components(model, craft_model)
    labels = model.residual_labels
    output = sorted(labels[j] for j in range(len(labels)) if unembed[j].any())
    receivers.append(("t.call", output, unembed))
    by_weights, by_spaces = [], []
    for r_name, r_dirs, matrix in receivers:
        for s_name, s_dirs, _ in senders:
            if _order(s_name) >= _order(r_name):
                continue
            shared = set(s_dirs) & set(r_dirs)
            if shared:
                by_spaces.append(f"{s_name}->{r_name}")
            rows = [labels.index(d) for d in s_dirs]
            if rows and (matrix[rows] != 0).any():
                by_weights.append(f"{s_name}->{r_name}")
    directions = {
        "writes": {name: dirs for name, dirs, _ in senders},
        "reads": {name: dirs for name, dirs, _ in receivers},
    }
    return by_weights, by_spaces, directions


def export(name, spec, out: Path) -> dict:
    import jax
    import numpy as np
    import safetensors.numpy
    import tracr
    from tracr.craft import bases, vectorspace_fns

    program, vocab, max_seq_len, make_inputs, what = spec
    model, craft_model, sink = compile_program(program, vocab, max_seq_len)
    from tracr.compiler import nodes

    labels = model.residual_labels
    residual = bases.VectorSpaceWithBasis([_direction(label) for label in labels])
    output_space = bases.VectorSpaceWithBasis(sink[nodes.OUTPUT_BASIS])
    unembed = np.asarray(vectorspace_fns.project(residual, output_space).matrix, dtype=np.float32)
    rows = [["compiler_bos", *row] for row in make_inputs()]
    encoded = np.array([model.input_encoder.encode(row) for row in rows], dtype=np.int64)
    outputs = model.forward(model.params, encoded)
    final = np.asarray(outputs.transformer_output.output, dtype=np.float32)
    unembedded = final @ unembed
    assert np.allclose(
        np.asarray(model.forward(model.params, encoded).unembedded_output),
        unembedded.argmax(-1) if unembed.shape[1] > 1 else unembedded[..., 0],
    )
    decoded = [model.apply(row).decoded for row in rows]
    by_weights, by_spaces, directions = true_edges(model, craft_model, unembed)
    assert set(by_weights) <= set(by_spaces), sorted(set(by_weights) - set(by_spaces))
    tensors = {
        f"{m}.{p}": np.asarray(v, dtype=np.float32) for m, ps in model.params.items() for p, v in ps.items()
    }
    tensors.update(
        {"unembed": unembed, "inputs": encoded, "tracr.output": final, "tracr.unembedded": unembedded}
    )
    safetensors.numpy.save_file(tensors, str(out / f"{name}.safetensors"))
    config = model.model_config
    info = {
        "program": name,
        "computes": what,
        "vocab": sorted(vocab, key=str),
        "max_seq_len": max_seq_len,
        "config": {
            "num_heads": config.num_heads,
            "num_layers": config.num_layers,
            "key_size": config.key_size,
            "mlp_hidden_size": config.mlp_hidden_size,
            "activation": "relu",
            "layer_norm": config.layer_norm,
            "causal": config.causal,
        },
        "residual_labels": labels,
        "input_encoding": {str(k): v for k, v in model.input_encoder.encoding_map.items()},
        "output": "categorical" if unembed.shape[1] > 1 else "numerical",
        "output_labels": [str(d) for d in output_space.basis],
        "inputs": [[str(t) for t in row] for row in rows],
        "decoded": [[x if isinstance(x, (int, float)) else str(x) for x in row] for row in decoded],
        "true_edges": by_weights,
        "space_edges": by_spaces,
        "directions": directions,
        "made_with": {
            "tracr-pypi": _version("tracr-pypi"),
            "jax": jax.__version__,
            "dm-haiku": _version("dm-haiku"),
            "tracr_module": tracr.__name__,
            "command": "python scripts/tracr_export.py",
        },
    }
    (out / f"{name}.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/tracr-venv"))
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "tracr")
    parser.add_argument("programs", nargs="*", help="which programs (default: all)")
    args = parser.parse_args()
    ensure_tracr(args.venv)
    args.out.mkdir(parents=True, exist_ok=True)
    table = programs()
    for name in args.programs or table:
        info = export(name, table[name], args.out)
        print(
            f"{name}: {info['config']['num_layers']} layers of {info['config']['num_heads']} heads, "
            f"d_model {len(info['residual_labels'])}, {len(info['true_edges'])} true edges "
            f"({len(info['space_edges'])} by the declared spaces)"
        )


if __name__ == "__main__":
    main()
