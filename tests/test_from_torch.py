"""models.from_torch on plain torch modules: a CNN, control flow the exporter specializes, strict
mode, bad input, text round trips of every node an import emits, and the passes that apply."""

from __future__ import annotations

import subprocess
import sys

import factories
import pytest
import torch

import circuits as cc
from circuits import models
from circuits.errors import ModelError, PassError
from circuits.text.store import TensorStore

TOL = dict(atol=1e-5, rtol=1e-5)


class SmallCNN(torch.nn.Module):
    """Two convolutions, max and average pooling, a spatial mean and a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 5, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.conv2 = torch.nn.Conv2d(5, 7, 3)
        self.head = torch.nn.Linear(7, 4)

    def forward(self, images):
        x = self.pool(torch.relu(self.conv1(images)))
        x = torch.nn.functional.avg_pool2d(torch.relu(self.conv2(x)), 2)
        return self.head(x.mean(dim=(2, 3)))


class ControlFlow(torch.nn.Module):
    """Python control flow on shapes and ints, which the exporter runs once and specializes."""

    def __init__(self, steps: int = 3):
        super().__init__()
        self.steps = steps
        self.lin = torch.nn.Linear(5, 5)

    def forward(self, x):
        if x.shape[0] > 2:
            x = x * 2
        else:
            x = x - 1
        for _ in range(self.steps):
            x = torch.tanh(self.lin(x))
        return x.sum(-1), x


class Mixed(torch.nn.Module):
    """Ops with translations of every kind: views, slices, cat, softmax over a middle axis, matmul,
    division, a buffer, and ones without (cumsum, where on a computed mask)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6, bias=False)
        self.register_buffer("offset", torch.arange(6.0))

    def forward(self, x):
        y = self.proj(x).reshape(2, 3, 3, 2).permute(0, 2, 1, 3)  # [2,3,3,2]
        z = torch.cat([y[..., :1], -y[..., 1:]], dim=-1) / 3.0
        attn = torch.softmax(z.sum(-1), dim=1)  # over a middle axis
        mixed = torch.matmul(attn, x.reshape(2, 3, 6)) + self.offset
        mixed = mixed - torch.cumsum(mixed, dim=-1) * 0.1
        return torch.where(mixed > 0, mixed, mixed * 0.5).flatten(1)


def test_cnn_equals_torch():
    model = SmallCNN().eval()
    images = torch.randn(2, 3, 10, 10)
    circuit = models.from_torch(model, (images,))
    with torch.no_grad():
        expected = model(images)
    torch.testing.assert_close(circuit.evaluate(), expected, **TOL)
    specs = {n.spec.name for n in cc.unique_nodes([circuit]) if isinstance(n, cc.GeneralFunction)}
    assert "aten.max_pool2d.default(_,[2,2],[2,2])" in specs
    assert circuit.get_unique("conv1.conv2d").spec.name == "aten.conv2d.default(_,_,_,[1,1],[1,1])"


@pytest.mark.parametrize("rows", [2, 3])
def test_control_flow_is_specialized_to_the_example(rows):
    model = ControlFlow()
    x = torch.randn(rows, 5)
    circuit = models.from_torch(model, (x,))
    with torch.no_grad():
        summed, last = model(x)
    torch.testing.assert_close(circuit.evaluate(), summed, **TOL)
    # the branch taken and three unrolled steps of the loop, each named by the module that ran it
    assert circuit.are_any_found("mul") == (rows > 2)
    assert circuit.are_any_found("sub") == (rows <= 2)
    assert {"lin.linear", "lin.linear_1", "lin.linear_2"} <= {n.name for n in cc.unique_nodes([circuit])}
    second = models.from_torch(model, (x,), output=1)
    torch.testing.assert_close(second.evaluate(), last, **TOL)


def test_mixed_ops_equal_torch_and_untranslated_ones_are_aten_functions():
    model = Mixed()
    x = torch.randn(2, 3, 6)
    circuit = models.from_torch(model, (x,))
    torch.testing.assert_close(circuit.evaluate(), model(x).detach(), **TOL)
    aten = sorted(
        n.spec.name
        for n in cc.unique_nodes([circuit])
        if isinstance(n, cc.GeneralFunction) and n.spec.name.startswith("aten.")
    )
    assert [name.split("(")[0] for name in aten] == [
        "aten.cumsum.default",
        "aten.gt.Scalar",
        "aten.where.self",
    ]
    assert circuit.are_any_found("offset")  # the buffer, named by its path


def test_strict_lists_every_missing_op():
    with pytest.raises(ModelError) as caught:
        models.from_torch(SmallCNN().eval(), (torch.randn(1, 3, 8, 8),), strict=True)
    message = str(caught.value)
    for op in ("aten.conv2d.default", "aten.max_pool2d.default", "aten.avg_pool2d.default"):
        assert op in message
    assert "conv1" in message and "conv2" in message and "pool" in message
    # a module whose ops all translate passes strict
    circuit = models.from_torch(ControlFlow(), (torch.randn(3, 5),), strict=True)
    assert circuit.shape == (3,)


def test_bad_inputs_raise_model_errors():
    with pytest.raises(ModelError, match="not a torch.nn.Module"):
        models.from_torch(lambda x: x, (torch.randn(2),))

    class Unexportable(torch.nn.Module):
        def forward(self, x):
            return x[x > 0].sum() if x.sum().item() > 0 else x  # data-dependent control flow

    with pytest.raises(ModelError, match="torch.export could not export Unexportable"):
        models.from_torch(Unexportable(), (torch.randn(4),))
    with pytest.raises(ModelError, match="output='nope'"):
        models.from_torch(ControlFlow(), (torch.randn(3, 5),), output="nope")
    with pytest.raises(ModelError, match="strict="):
        models.from_torch(ControlFlow(), (torch.randn(3, 5),), strict="yes")
    with pytest.raises(ModelError, match="example_kwargs"):
        models.from_torch(ControlFlow(), (torch.randn(3, 5),), ["x"])


def test_every_imported_node_prints_and_parses_back(tmp_path):
    """Arrays through a tensor store, and every GeneralFunction (aten ones included) by its name."""
    model = Mixed()
    x = torch.randn(2, 3, 6)
    circuits = [
        models.from_torch(model, (x,)),
        models.from_torch(SmallCNN().eval(), (torch.randn(2, 3, 10, 10),)),
    ]
    store = TensorStore(tmp_path / "tensors")
    for circuit in circuits:
        text = circuit.repr(store=store)
        back = cc.parse(text, store=store)
        assert back == circuit
        torch.testing.assert_close(back.evaluate(), circuit.evaluate(), atol=0, rtol=0)
    kinds = {type(n).__name__ for c in circuits for n in cc.unique_nodes([c])}
    assert kinds >= {"Array", "Scalar", "Einsum", "Add", "GeneralFunction", "Index", "Rearrange", "Concat"}


def test_aten_names_parse_in_a_fresh_process():
    """Nothing registered, the importer never imported: the name alone gives the function."""
    text = (
        "'p' GeneralFunction aten.max_pool2d.default(_,[2,2],[2,2])\n"
        "  'x' [1,2,4,4] Scalar 1.5\n"
        "'w' GeneralFunction aten.where.Scalar(_bool,0.0,-inf)\n"
        "  'm' GeneralFunction aten.gt.Scalar(_,0)\n"
        "    'y' [3] Scalar -2\n"
    )
    script = (
        "import sys, circuits as cc\n"
        "p, w = cc.parse_many(sys.stdin.read())\n"
        "assert 'circuits.models' not in sys.modules\n"
        "print(p.evaluate().shape, w.evaluate().tolist())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], input=text, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "torch.Size([1, 2, 2, 2]) [-inf, -inf, -inf]"


def test_aten_names_refuse_what_is_not_an_aten_call():
    x = cc.Scalar(1.0, shape=(2, 2), name="x")
    with pytest.raises(cc.errors.FunctionSpecError, match="no op aten.nope.default"):
        cc.GeneralFunction(x, spec="aten.nope.default(_)")
    with pytest.raises(cc.errors.FunctionSpecError, match="not a literal"):
        cc.GeneralFunction(x, spec='aten.relu.default(__import__("os"))')
    with pytest.raises(cc.errors.FunctionSpecError, match="takes 2 children"):
        cc.GeneralFunction(x, spec="aten.add.Tensor(_,_)")
    with pytest.raises(cc.errors.FunctionSpecError, match="reserved"):
        cc.register_function(cc.FunctionSpec("aten.relu.default(_)", 1, lambda s: s[0], torch.relu))


@pytest.fixture(scope="module")
def gpt2_import():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    model = factories.gpt2(seed=None, n_embd=15, n_head=3, vocab_size=41, n_positions=19)
    tokens = torch.randint(0, 41, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(tokens).logits
    return models.from_torch(model, (tokens,)), expected


def test_gpt2_import_through_passes_keeps_its_value(gpt2_import):
    """simplify, canonicalize and push_down_index apply and keep the value; causal_mask (by default)
    and split_heads look for the builders' names ('a.attn_scores', 'b{L}.a'), which an import has not."""
    circuit, expected = gpt2_import
    for rewrite in (cc.passes.simplify, cc.passes.canonicalize, cc.passes.push_down_index):
        rewritten = rewrite(circuit)
        assert rewritten != circuit
        torch.testing.assert_close(rewritten.evaluate(), expected, **TOL)
    picked = cc.Index(circuit, (1, slice(2, 5)), name="picked")
    pushed = cc.passes.push_down_index(picked)
    assert pushed != picked
    torch.testing.assert_close(pushed.evaluate(), expected[1, 2:5], **TOL)
    with pytest.raises(PassError, match="a.attn_scores"):
        cc.passes.causal_mask(circuit)  # the builders' names by default
    with pytest.raises(PassError, match="b\\{L\\}.a"):
        cc.passes.split_heads(circuit)


def test_causal_mask_on_an_import_finds_its_scores_by_matcher(gpt2_import):
    """The import's scores already carry the causal mask (as '.mask_bias'): masking them again through
    scores= keeps the value (the issue's "passes through causal_mask unchanged in value")."""
    circuit, expected = gpt2_import
    scores = cc.Matcher.regex(r"scaled_dot_product_attention\.scores$")
    masked = cc.passes.causal_mask(circuit, scores=scores)
    assert len(masked.get(cc.Matcher.regex(r"\.scores_raw$"))) == 2  # both layers
    torch.testing.assert_close(masked.evaluate(), expected, **TOL)
    knockout = torch.ones(7, 7).tril()
    knockout[3, 1] = 0
    knocked = cc.passes.causal_mask(circuit, mask=knockout, scores=scores).evaluate()
    torch.testing.assert_close(knocked[:, :3], expected[:, :3], **TOL)  # earlier queries never see it
    assert not torch.allclose(knocked[:, 3], expected[:, 3], atol=1e-4)


def test_gpt2_import_round_trips_through_text(gpt2_import, tmp_path):
    circuit, expected = gpt2_import
    store = TensorStore(tmp_path / "tensors")
    back = cc.parse(circuit.repr(store=store), store=store)
    assert back == circuit
    torch.testing.assert_close(back.evaluate(), expected, **TOL)


def test_attach_gives_the_parameters_their_gradients():
    """attach=True: the circuit's Arrays are the parameters, so backward fills the same grads as
    the module's own backward."""
    model = ControlFlow()
    x = torch.randn(3, 5)
    circuit = models.from_torch(model, (x,), attach=True)
    circuit.evaluate().square().sum().backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x)[0].square().sum().backward()
    for got, expected in zip(ours, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, expected, **TOL)
    copied = models.from_torch(model, (x,))
    assert not copied.get_unique("lin.weight").value.requires_grad


def test_imported_names_are_unique(gpt2_import):
    circuit, _ = gpt2_import
    nodes = cc.unique_nodes([circuit])
    named = [n.name for n in nodes]
    assert len(named) == len(set(named))
    assert None not in named


class Lookups(torch.nn.Module):
    """An op with two outputs (max over an axis), a lookup by a computed index tensor, and causal
    grouped-query attention."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.kv = torch.nn.Linear(8, 4)

    def forward(self, x, ids):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 2).transpose(1, 2)
        k = self.kv(x).view(b, s, 2, 2).transpose(1, 2)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        mixed = attended.transpose(1, 2).reshape(b, s, 8)
        picked = mixed[:, ids]  # rows chosen by an input
        return picked + x.max(dim=1).values[:, None, :]


def test_lookups_and_causal_grouped_attention_equal_torch():
    model = Lookups()
    x, ids = torch.randn(2, 5, 8), torch.tensor([4, 0, 2])
    circuit = models.from_torch(model, (x, ids))
    torch.testing.assert_close(circuit.evaluate(), model(x, ids).detach(), **TOL)
    specs = {n.spec.name for n in cc.unique_nodes([circuit]) if isinstance(n, cc.GeneralFunction)}
    assert "aten.max.dim(_,1)[0]" in specs  # the first of max's two outputs
    assert "gen_index_at_1_no_batch_index" in specs
    assert circuit.are_any_found("scaled_dot_product_attention.causal_bias")
    other = torch.tensor([1, 1, 3])
    swapped = circuit.update("ids", lambda n: cc.Array(other, name="ids"))
    torch.testing.assert_close(swapped.evaluate(), model(x, other).detach(), **TOL)


def test_an_unknown_option_is_a_model_error_naming_the_accepted_ones():
    with pytest.raises(ModelError, match="did you mean 'strict'"):
        models.from_torch(ControlFlow(), (torch.randn(3, 5),), strcit=True)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_batch_norm_in_either_mode_equals_torch(mode):
    """Eval: the running statistics (buffers, constants of the import); train: the batch's, the
    running-statistics update (an output of the export besides the module's) left out."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(144, 3),
    )
    with torch.no_grad():
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
    getattr(model, mode)()
    x = torch.randn(2, 3, 8, 8)
    circuit = models.from_torch(model, (x,))
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(circuit.evaluate(), expected, **TOL)
    assert circuit.shape == (2, 3)
    # eval: written out from the running statistics; train: kept as the aten op
    assert circuit.are_any_found("1._native_batch_norm_legit_no_training.inv_std") == (mode == "eval")


class Gathers(torch.nn.Module):
    """torch.gather along the last axis (a gen_index) and along another (kept as the aten op)."""

    def forward(self, x, cols):
        return torch.gather(x, 2, cols) + torch.gather(x, 1, cols[:, :2, :]).sum(1, keepdim=True)


def test_gather_equals_torch():
    x = torch.randn(2, 5, 6)
    cols = torch.randint(0, 5, (2, 5, 3), generator=torch.Generator().manual_seed(4))
    circuit = models.from_torch(Gathers(), (x, cols))
    torch.testing.assert_close(circuit.evaluate(), Gathers()(x, cols), **TOL)
    specs = {n.spec.name for n in cc.unique_nodes([circuit]) if isinstance(n, cc.GeneralFunction)}
    assert "gen_index_at_0_batch_x_no_batch_index_c" in specs
    assert "aten.gather.default(_,1,_int64)" in specs


def test_imported_circuits_pickle_and_deep_copy():
    """aten GeneralFunctions pickle by name (their functions are closures), like the other families."""
    import copy
    import pickle

    model = SmallCNN().eval()
    images = torch.randn(2, 3, 10, 10)
    circuit = models.from_torch(model, (images,))
    for clone in (pickle.loads(pickle.dumps(circuit)), copy.deepcopy(circuit)):
        assert clone == circuit
        torch.testing.assert_close(clone.evaluate(), circuit.evaluate(), atol=0, rtol=0)


class Products(torch.nn.Module):
    """torch.einsum with an ellipsis, matmul by a vector and with broadcast batch axes, a batched
    dot, and baddbmm with beta and alpha."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 6))
        self.v = torch.nn.Parameter(torch.randn(6))

    def forward(self, x, y):
        a = torch.einsum("...ij,jk->...ik", x, self.w.T)
        b = torch.matmul(x, self.v)
        c = torch.matmul(y, x)  # [3,4,5] @ [2,3,5,6]
        d = torch.einsum("bhij,bhij->bh", x, x)
        e = torch.baddbmm(x[0] @ x[1].transpose(1, 2), x[1], x[0].transpose(1, 2), beta=0.5, alpha=2.0)
        return a.sum() + b.sum() + c.sum() + d.sum(), e


def test_products_are_einsums_equal_to_torch():
    x, y = torch.randn(2, 3, 5, 6), torch.randn(3, 4, 5)
    model = Products()
    total, baddbmm = models.from_torch(model, (x, y), output=[0, 1], strict=True)
    expected_total, expected_baddbmm = model(x, y)
    torch.testing.assert_close(total.evaluate(), expected_total.detach(), **TOL)
    torch.testing.assert_close(baddbmm.evaluate(), expected_baddbmm.detach(), **TOL)
