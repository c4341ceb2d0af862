"""Weights are never copied unless asked (issue 31 item 1).

A circuit built from a Hugging Face model, a TransformerLens state dict, a torch module or a
checkpoint holds the model's tensors (detached views of its parameters, or the checkpoint's
memory-mapped file); an Array of a large tensor computes its content hash when first needed.
Immutability stays guaranteed by the version counter: a weight edited in place after building
makes the circuit stale (``StaleTensorError``), whether its hash was computed already or not.
``copy=True`` copies.  The hashes computed late are those computed at once: printed text,
parsing back, saving and comparing are unchanged.
"""

from __future__ import annotations

import hashlib
import sys

import factories
import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits.core import hashing, nodes
from factories import transformer_lens_state
from hf_reference import hf_logits

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = factories.FAMILY_VOCAB
#: what reads /proc/self/maps to see where a tensor's bytes are
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
#: a Llama whose embedding and unembedding (8192 x 64 float32: 2 MiB each) are over
#: ``nodes.EAGER_HASH_BYTES``, so that their content hashes wait; the rest is tiny
BIG_VOCAB = 8192


@pytest.fixture
def all_lazy(monkeypatch):
    """Every Array made from here on waits for its content hash, whatever its size."""
    monkeypatch.setattr(nodes, "EAGER_HASH_BYTES", -1)


def tokens(vocab: int = VOCAB) -> torch.Tensor:
    return factories.token_ids(vocab, (2, 7), seed=5)


def weight_arrays(circuit: cc.Circuit) -> dict[str, cc.Array]:
    return {n.name: n for n in cc.unique_nodes([circuit]) if isinstance(n, cc.Array) and ".w." in n.name}


def storages(model: torch.nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def big_llama() -> torch.nn.Module:
    return factories.llama(vocab_size=BIG_VOCAB, hidden_size=64, intermediate_size=32)


def logits_of(circuit: cc.Circuit) -> torch.Tensor:
    return cc.evaluate(circuit.get_unique("t.call"))


# ------------------------------------------------------------------ the default: no copy


@pytest.mark.parametrize("make", [factories.gpt2, factories.llama], ids=["gpt2", "llama"])
def test_from_hf_holds_the_parameters_out_of_autograd(make):
    model, toks = make(), tokens()
    arrays = weight_arrays(cm.from_hf(model, toks))
    assert arrays and all(a.value.untyped_storage().data_ptr() in storages(model) for a in arrays.values())
    assert not any(a.value.requires_grad for a in arrays.values())
    torch.testing.assert_close(logits_of(cm.from_hf(model, toks)), hf_logits(model, toks[:, :-1]))


@pytest.mark.parametrize("lazy", [False, True], ids=["hashed-at-once", "hash-waiting"])
@pytest.mark.parametrize("make", [factories.gpt2, factories.llama], ids=["gpt2", "llama"])
def test_a_weight_edited_after_building_makes_the_circuit_stale(make, lazy, monkeypatch):
    if lazy:
        monkeypatch.setattr(nodes, "EAGER_HASH_BYTES", -1)
    model, toks = make(), tokens()
    circuit = cm.from_hf(model, toks)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(2.0)
    edited = model.get_input_embeddings().weight.data_ptr()
    with pytest.raises(cc.errors.StaleTensorError) as info:
        cc.evaluate(circuit)
    assert info.value.node.value.data_ptr() == edited  # the embedding's Array (or the tied unembedding's)
    if lazy:  # nothing hashed the edited tensor before: hashing the circuit is refused too
        with pytest.raises(cc.errors.StaleTensorError) as info:
            circuit.hash
        assert info.value.node.value.data_ptr() == edited
        assert "not computed yet" in str(info.value)
    rebuilt = cm.from_hf(model, toks)  # the model as it is now
    torch.testing.assert_close(logits_of(rebuilt), hf_logits(model, toks[:, :-1]))


def test_an_optimizer_step_makes_the_default_circuit_stale_as_an_attached_one():
    model, toks = factories.llama(), tokens()
    detached, attached = cm.from_hf(model, toks), cm.from_hf(model, toks, attach=True)
    cc.evaluate(attached).mean().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    for circuit in (detached, attached):
        with pytest.raises(cc.errors.StaleTensorError):
            cc.evaluate(circuit)


def test_copy_copies():
    model, toks = factories.llama(), tokens()
    circuit = cm.from_hf(model, toks, copy=True)
    arrays = weight_arrays(circuit)
    assert not any(a.value.untyped_storage().data_ptr() in storages(model) for a in arrays.values())
    before = logits_of(circuit)
    torch.testing.assert_close(before, hf_logits(model, toks[:, :-1]))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(2.0)
    torch.testing.assert_close(logits_of(circuit), before, rtol=0, atol=0)  # no error, the old values


def test_copy_and_attach_together_are_refused():
    with pytest.raises(cc.errors.ModelError) as info:
        cm.ModelOptions(attach=True, copy=True)
    assert info.value.field == "copy"
    with pytest.raises(cc.errors.ModelError) as info:
        cm.from_hf(factories.gpt2(), tokens(), attach=True, copy=True)
    assert info.value.field == "copy"
    with pytest.raises(cc.errors.ModelError) as info:
        cm.from_torch(torch.nn.Linear(3, 2), (torch.ones(3),), attach=True, copy=True)
    assert info.value.field == "copy"


def test_the_builders_copy_only_when_asked():
    config = factories.gpt2_config()
    weights = cm.gpt2_random_weights(config)
    held = weight_arrays(cm.build_gpt2(config, weights, seq_len=4))
    assert all(held[name].value.data_ptr() == weights[name].data_ptr() for name in weights)
    copied = weight_arrays(cm.build_gpt2(config, weights, seq_len=4, copy=True))
    assert not any(copied[name].value.data_ptr() == weights[name].data_ptr() for name in weights)


def test_transformer_lens_state_dict_is_held_not_copied():
    model, toks = factories.gpt2(), tokens()
    state = transformer_lens_state(model)
    circuit = cm.from_transformer_lens(state, toks, family="gpt2")
    held = {a.value.untyped_storage().data_ptr() for a in weight_arrays(circuit).values()}
    assert held <= storages(model) and held
    torch.testing.assert_close(logits_of(circuit), hf_logits(model, toks[:, :-1]))
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.add_(1.0)  # W_in is this parameter itself
    with pytest.raises(cc.errors.StaleTensorError):
        cc.evaluate(circuit)
    copied = cm.from_transformer_lens(transformer_lens_state(model), toks, family="gpt2", copy=True)
    assert not {a.value.untyped_storage().data_ptr() for a in weight_arrays(copied).values()} & storages(
        model
    )


def test_a_transformer_bridge_is_held_not_copied():
    model = factories.tl_model()
    toks = factories.token_ids(17, (1, 6), seed=2)
    circuit = cm.from_transformer_lens(model, toks)
    arrays = weight_arrays(circuit)
    assert arrays and all(a.value.untyped_storage().data_ptr() in storages(model) for a in arrays.values())
    copied = weight_arrays(cm.from_transformer_lens(model, toks, copy=True))
    assert not any(a.value.untyped_storage().data_ptr() in storages(model) for a in copied.values())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(cc.errors.StaleTensorError):
        cc.evaluate(circuit)


def test_a_bert_is_held_not_copied():
    model = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24
        )
    ).eval()
    ids = factories.token_ids(VOCAB, (1, 5), seed=3)
    circuit = cm.from_hf_bert(model, ids)
    arrays = weight_arrays(circuit)
    assert arrays and all(a.value.untyped_storage().data_ptr() in storages(model) for a in arrays.values())
    torch.testing.assert_close(cc.evaluate(circuit), model(input_ids=ids).last_hidden_state.detach())
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(2.0)
    with pytest.raises(cc.errors.StaleTensorError):
        cc.evaluate(circuit)


def test_from_torch_holds_the_parameters():
    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    circuit = cm.from_torch(layer, (x,))
    assert circuit.get_unique("weight").value.data_ptr() == layer.weight.data_ptr()
    torch.testing.assert_close(cc.evaluate(circuit), layer(x).detach())
    copied = cm.from_torch(layer, (x,), copy=True)
    with torch.no_grad():
        layer.weight.mul_(3.0)
    with pytest.raises(cc.errors.StaleTensorError):
        cc.evaluate(circuit)
    torch.testing.assert_close(cc.evaluate(copied), x @ (layer.weight / 3).T + layer.bias.detach())


# ------------------------------------------------------------------ checkpoints: memory-mapped


def mapped_files(tensor: torch.Tensor) -> set[str]:
    """The files mapped where ``tensor``'s bytes are (``/proc/self/maps``): the file a tensor
    backed by a memory-mapped file reads from, none for one in ordinary memory."""
    address = tensor.data_ptr()
    files = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high and len(fields) == 6:
                files.add(fields[5].strip())
    return files


@LINUX
def test_a_checkpoint_is_memory_mapped_unless_copied(tmp_path):
    model, toks = factories.llama(), tokens()
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = {str(p.resolve()) for p in tmp_path.glob("*.safetensors")}
    assert len(shards) > 1
    circuit = cm.load_hf_checkpoint(tmp_path, toks)
    arrays = weight_arrays(circuit)
    assert all(mapped_files(a.value) & shards for a in arrays.values())
    torch.testing.assert_close(logits_of(circuit), hf_logits(model, toks[:, :-1]))
    copied = weight_arrays(cm.load_hf_checkpoint(tmp_path, toks, copy=True))
    assert not any(mapped_files(a.value) & shards for a in copied.values())
    assert copied.keys() == arrays.keys()
    assert all(copied[name] == arrays[name] for name in arrays)  # the same content hashes


@LINUX
def test_a_pytorch_model_bin_checkpoint_is_memory_mapped(tmp_path):
    model, toks = factories.gpt2(), tokens()
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # the zip format: mappable
    circuit = cm.load_hf_checkpoint(tmp_path, toks)
    bin_file = str((tmp_path / "pytorch_model.bin").resolve())
    assert any(bin_file in mapped_files(a.value) for a in weight_arrays(circuit).values())
    torch.testing.assert_close(logits_of(circuit), hf_logits(model, toks[:, :-1]))


def test_a_legacy_pytorch_model_bin_is_read(tmp_path):
    model, toks = factories.gpt2(), tokens()
    model.config.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    torch.testing.assert_close(
        logits_of(cm.load_hf_checkpoint(tmp_path, toks)), hf_logits(model, toks[:, :-1])
    )


# ------------------------------------------------------------------ content hashes when first needed


def test_a_large_array_hashes_its_tensor_when_first_needed():
    big, small = torch.randn(600, 600), torch.randn(4)  # 1.4 MB, past EAGER_HASH_BYTES; 16 bytes
    big_array, small_array = cc.Array(big, name="big"), cc.Array(small, name="small")
    big.add_(1.0)
    small.add_(1.0)
    assert small_array.hash  # hashed at once: the hash is of the values it was made with
    with pytest.raises(cc.errors.StaleTensorError) as info:
        big_array.hash  # never hashed, and its bytes are no longer the ones it was made of
    assert info.value.node is big_array
    for read in (lambda: big_array.extra, lambda: big_array.content_hash, lambda: cc.Add(big_array).hash):
        with pytest.raises(cc.errors.StaleTensorError):
            read()


def test_building_hashes_no_large_tensor(monkeypatch):
    hashed: list[int] = []

    def counting(tensor: torch.Tensor) -> str:
        hashed.append(tensor.numel() * tensor.element_size())
        return original(tensor)

    original = hashing.tensor_content_hash
    monkeypatch.setattr(hashing, "tensor_content_hash", counting)
    monkeypatch.setattr(nodes, "tensor_content_hash", counting)
    model = big_llama()
    toks = tokens(BIG_VOCAB)
    circuit = cm.from_hf(model, toks)
    assert max(hashed) <= nodes.EAGER_HASH_BYTES
    hashed.clear()
    circuit.hash  # now: the embedding and the unembedding, once each
    assert sorted(hashed) == [BIG_VOCAB * 64 * 4] * 2


def test_late_hashes_are_the_hashes_made_at_once(monkeypatch, tmp_path):
    model = big_llama()
    toks = tokens(BIG_VOCAB)
    monkeypatch.setattr(nodes, "EAGER_HASH_BYTES", 2**62)
    eager = cm.from_hf(model, toks)
    monkeypatch.setattr(nodes, "EAGER_HASH_BYTES", -1)
    late = cm.from_hf(model, toks)
    assert late.hash == eager.hash
    assert late.repr() == eager.repr()
    arrays = weight_arrays(late)
    unembed = arrays["t.w.unembed"]
    want = hashlib.blake2b(digest_size=32)
    want.update(f"{unembed.value.dtype}|{list(unembed.shape)}|".encode())
    want.update(unembed.value.contiguous().numpy().tobytes())
    assert unembed.content_hash == want.hexdigest()  # the documented bytes, computed here
    late = cm.from_hf(model, toks)
    assert cc.parse(late.repr()) == late  # comparing computes them
    late = cm.from_hf(model, toks)
    cc.save(late, tmp_path / "m.circ")  # saving computes them, and names the files by them
    assert cc.load(tmp_path / "m.circ") == eager
    torch.testing.assert_close(logits_of(cc.load(tmp_path / "m.circ")), hf_logits(model, toks[:, :-1]))


def test_a_rename_keeps_the_hash_waiting(all_lazy):
    tensor = torch.randn(3, 4)
    renamed = cc.Array(tensor, name="a").rename("b")
    tensor.mul_(2.0)
    with pytest.raises(cc.errors.StaleTensorError):
        renamed.hash  # the rename did not compute it from the edited bytes
    assert cc.Array(torch.ones(2), name="a").rename("b") == cc.Array(torch.ones(2), name="b")


def test_waiting_variables_stay_distinct_nodes(all_lazy):
    a, b = (cc.Array(torch.ones(3, requires_grad=True), name="w") for _ in range(2))
    assert a != b and a.extra == b.extra
    assert cc.Array(torch.ones(3), name="w") == cc.Array(torch.ones(3), name="w")


def chain(depth: int) -> cc.Circuit:
    node = cc.Array(torch.ones(2), name="x")
    for _ in range(depth):
        node = cc.Add(node, name="a")
    return node


def test_waiting_hashes_under_a_deep_circuit(monkeypatch):
    eager = chain(20_000)
    monkeypatch.setattr(nodes, "EAGER_HASH_BYTES", -1)
    late = chain(20_000)  # far past the recursion limit: the hashes are computed without recursion
    assert late._hash is None
    assert late.hash == eager.hash


@pytest.mark.parametrize("block", [hashing.HASH_BLOCK_BYTES, 1000], ids=["whole", "by-blocks-of-rows"])
def test_content_hashes_in_threads_are_the_documented_bytes(block, monkeypatch):
    monkeypatch.setattr(hashing, "HASH_BLOCK_BYTES", block)
    base = torch.randn(64, 48, dtype=torch.float64)
    tensors = [
        base,
        base.T,  # not contiguous
        base.reshape(4, 16, 48).permute(1, 2, 0),  # rows of 1,536 bytes: one a block
        base[:, 5],  # a strided column
        base.to(torch.bfloat16),
        torch.zeros(0, 3),
        base,  # the same tensor twice
    ]
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = hashing.content_hashes(tensors)
    finally:
        torch.set_num_threads(previous)
    want = []
    for tensor in tensors:
        hasher = hashlib.blake2b(digest_size=32)
        hasher.update(f"{tensor.dtype}|{list(tensor.shape)}|".encode())
        hasher.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        want.append(hasher.hexdigest())
    assert got == want
