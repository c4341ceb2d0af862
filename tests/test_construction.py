"""One way to build a node: constructors, ``evolve``, ``with_children`` and rewrites agree.

A node rebuilt over new children (by ``with_children``, hence by every
rewrite) must be the node its constructor gives for those children: same
class, every derived field recomputed, the same checks and typed errors.
And the delegating methods of ``Circuit`` spell out the parameters of the
functions they call.
"""

from __future__ import annotations

import inspect
import pickle

import attrs
import pytest
import torch

import circuits as cc
from circuits.text import printing
from circuits.rewriting import matching, rewrite

x = cc.Symbol((3, 4), name="x")
y = cc.Symbol((3, 4), name="y")
z = cc.Array(torch.arange(12.0).reshape(3, 4), name="z")  # x's shape: the same-shape path
wide = cc.Symbol((3, 6), name="wide")  # another shape: the rebuild-from-scratch path

# Every node type with children, as a function of its children.
BUILDERS = {
    "Einsum": lambda *c: cc.Einsum.from_einsum_string("ab,ab->a", *c, name="e"),
    "Add": lambda *c: cc.Add(*c, name="a"),
    "GeneralFunction": lambda *c: cc.GeneralFunction(*c, spec="softmax", name="f"),
    "Index": lambda *c: cc.Index(*c, (torch.tensor([2, 0]), slice(1, 3)), name="i"),
    "Rearrange": lambda *c: cc.Rearrange(*c, "a (b c) -> c a b", name="r", c=2),
    "Concat": lambda *c: cc.Concat(*c, axis=-1, name="c"),
}
ARITY = {"Einsum": 2, "Add": 2, "GeneralFunction": 1, "Index": 1, "Rearrange": 1, "Concat": 2}


def same_node(a: cc.Circuit, b: cc.Circuit) -> None:
    assert type(a) is type(b)
    assert (a.hash, a.shape, a.extra, a.name) == (b.hash, b.shape, b.extra, b.name)
    assert a.repr() == b.repr()


@pytest.mark.parametrize("kind", BUILDERS)
@pytest.mark.parametrize("replacement", [z, wide], ids=["same shape", "other shape"])
def test_a_node_over_new_children_is_the_node_its_constructor_builds(kind, replacement):
    build, arity = BUILDERS[kind], ARITY[kind]
    old = build(*[x] * arity)
    new_children = [replacement] + [x] * (arity - 1)
    if replacement is wide and kind in ("Einsum", "Add"):
        new_children = [wide] * arity  # both operands, so that the shapes still fit
    direct = build(*new_children)
    same_node(old.with_children(new_children), direct)
    same_node(old.evolve(children=tuple(new_children)), direct)
    rewritten = cc.Add(old, name="root").update("x", lambda n: new_children[0])
    if all(child is new_children[0] for child in new_children):
        same_node(rewritten.children[0], direct)


def test_with_children_of_the_same_objects_is_the_node_itself():
    node = cc.Add(x, y)
    assert node.with_children([x, y]) is node
    assert node.with_children(node.children) is node


@pytest.mark.parametrize("kind", BUILDERS)
def test_a_bad_child_is_refused_with_the_constructors_error(kind):
    build, arity = BUILDERS[kind], ARITY[kind]
    node = build(*[x] * arity)
    # a tensor of the child's very shape: refused although its .shape matches
    bad = [torch.zeros(3, 4)] + [x] * (arity - 1)
    with pytest.raises(cc.errors.NodeTypeError) as built:
        build(*bad)
    with pytest.raises(cc.errors.NodeTypeError) as rebuilt:
        node.with_children(bad)
    assert str(rebuilt.value) == str(built.value)
    assert "while rebuilding" in "".join(rebuilt.value.__notes__)


def test_a_child_that_does_not_fit_is_refused_with_the_constructors_error():
    node = cc.Einsum.from_einsum_string("ab,ab->a", x, y, name="e")
    with pytest.raises(cc.errors.EinsumError) as built:
        cc.Einsum.from_einsum_string("ab,ab->a", x, wide, name="e")
    with pytest.raises(cc.errors.EinsumError) as rebuilt:
        node.with_children([x, wide])
    assert str(rebuilt.value) == str(built.value)
    with pytest.raises(cc.errors.EinsumError):
        node.update("y", lambda n: wide)


# ------------------------------------------------- a subclass with a derived field


@attrs.frozen(init=False, eq=False, repr=False)
class NamedAdd(cc.Add):
    """An Add that also derives its children's names: more than their shapes, so a shortcut
    that kept derived data over children of the same shape would leave it stale."""

    child_names: tuple = attrs.field(init=False)

    def _set_derived(self, shape, extra):
        super()._set_derived(shape, extra)
        object.__setattr__(self, "child_names", tuple(child.name for child in self.children))


def test_a_subclass_keeps_its_class_and_its_derived_fields_through_rewrites():
    node = NamedAdd(x, y, name="n")
    assert node.child_names == ("x", "y")
    renamed = cc.Symbol((3, 4), name="x2")  # the same shape as x
    for rebuilt in (
        node.with_children([renamed, y]),
        node.evolve(children=(renamed, y)),
        cc.Add(node, name="root").update("x", lambda n: renamed).children[0],
        cc.Add(node, name="root").replace({x: renamed}).children[0],
        cc.expand(cc.Add(node, name="root"), {"x": renamed}).children[0],
    ):
        assert type(rebuilt) is NamedAdd
        assert rebuilt.child_names == ("x2", "y")
        same_node(rebuilt, NamedAdd(renamed, y, name="n"))
    assert node.rename("m").child_names == ("x", "y") and type(node.rename("m")) is NamedAdd


def test_a_subclass_survives_pickling_and_deepcopy_with_its_derived_fields():
    node = cc.Add(NamedAdd(x, z, name="n"), name="root")
    for copied in (pickle.loads(pickle.dumps(node)), __import__("copy").deepcopy(node)):
        assert copied == node
        assert type(copied.children[0]) is NamedAdd and copied.children[0].child_names == ("x", "z")


def test_evolve_of_every_leaf_goes_through_its_constructor():
    for leaf in (z, cc.Array.from_hash((2,), "ab" * 12, name="h"), cc.Scalar(2.0, (3,), name="s"), x):
        same_node(leaf.evolve(), leaf)
        assert leaf.evolve(name="other").name == "other"
        with pytest.raises(cc.errors.LeafError, match="leaf"):
            leaf.evolve(children=(x,))
    with pytest.raises(cc.errors.LeafError, match="not a real number"):
        cc.Scalar(1.0).evolve(value="one")


# --------------------------------------------------------- honest signatures


def parameters(function, skip_first: bool = True) -> list[tuple]:
    found = list(inspect.signature(function).parameters.values())
    return [(p.name, p.kind, p.default) for p in found[1 if skip_first else 0 :]]


@pytest.mark.parametrize(
    ("method", "function"),
    [
        (cc.Circuit.evaluate, cc.evaluate),
        (cc.Circuit.repr, printing.repr_many),
        (cc.Circuit.print, printing.repr_many),
        (cc.Circuit.update, rewrite.update),
        (cc.Circuit.replace, rewrite.replace),
        (cc.Circuit.get, matching.get),
        (cc.Circuit.get_unique, matching.get_unique),
        (cc.Circuit.are_any_found, matching.are_any_found),
    ],
    ids=lambda f: getattr(f, "__qualname__", None),
)
def test_delegating_methods_spell_out_the_parameters_they_forward(method, function):
    """``self`` stands where the function takes the circuit(s): the rest must agree exactly."""
    assert parameters(method) == parameters(function)
    assert not any(kind is inspect.Parameter.VAR_KEYWORD for _, kind, _ in parameters(method))


def test_the_spelled_out_options_reach_the_function():
    node = cc.Add(x, z, name="n")
    assert node.repr(shapes=True, serials=True) == cc.repr_many([node], shapes=True, serials=True)
    assert node.repr(depth=0).endswith("children not shown")
    value = node.evaluate(inputs={"x": torch.ones(3, 4)}, dtype=torch.float64)
    assert value.dtype == torch.float64 and torch.equal(value, 1 + z.value.double())
    with pytest.raises(TypeError):
        node.update("x", lambda n: n, bogus=1)


# ------------------------------------------------------- one "is it a node" check


def test_check_node_names_what_was_expected_and_what_was_got():
    from circuits.core.nodes import check_node

    assert check_node(x, "here") is x
    with pytest.raises(cc.errors.NodeTypeError, match=r"^here is a int, not a circuit node$"):
        check_node(3, "here")
    with pytest.raises(
        cc.errors.RewriteError, match=r"^f returned a str for x, not a circuit node \(a hint\)$"
    ):
        check_node("s", "f returned {got} for x", cc.errors.RewriteError, hint="a hint")


def test_every_entry_point_refuses_a_non_node_with_its_own_error_type(tmp_path):
    from circuits import experiments as ex

    cases = [
        (cc.errors.NodeTypeError, lambda: cc.save([x, 3], tmp_path / "c.circ"), "save: root 1 is a int"),
        (cc.errors.NodeTypeError, lambda: cc.Index(3, 0), "child is a int"),
        (cc.errors.NodeTypeError, lambda: cc.Concat(x, 3, axis=0), "child 1 is a int"),
        (cc.errors.ExpandError, lambda: cc.expand(3, {}), "expand: the circuit is a int"),
        (cc.errors.ExpandError, lambda: cc.expand(x, {"x": lambda n: 3}), "returned a int for Symbol 'x'"),
        (cc.errors.MatcherError, lambda: matching.get(3, "x"), "get: the circuit to search is a int"),
        (cc.errors.MatcherError, lambda: matching.are_any_found(3, "x"), "is a int"),
        (cc.errors.MatcherError, lambda: matching.walk(3, "x"), "is a int"),
        (cc.errors.RewriteError, lambda: cc.update(3, "x", lambda n: n), "update: the circuit is a int"),
        (cc.errors.RewriteError, lambda: cc.replace(x, {"x": y}), "key 'x' is a str"),
        (cc.errors.RewriteError, lambda: cc.substitute(x, {"x": 3}), "the value for Symbol 'x' is a int"),
        (cc.errors.ExperimentError, lambda: ex.zero_ablate(3, "x"), "zero_ablate: the circuit is a int"),
        (cc.errors.ExperimentError, lambda: ex.mean_ablate(3, "x", {}), "mean_ablate: the circuit is a int"),
        (cc.errors.ExperimentError, lambda: ex.patch(3, "x", {}), "patch: the circuit is a int"),
        (cc.errors.ExperimentError, lambda: ex.Metric(lambda c: None, "m").circuit(x), "returned a NoneType"),
    ]
    for error, call, text in cases:
        with pytest.raises(error) as info:
            call()
        assert text in str(info.value) and "not a circuit node" in str(info.value), (text, info.value)
