"""Wide object graphs: cost linear in graph nodes and checkpoint entries.

A checkpoint whose root has many children (`tf.train.Checkpoint(model=m, **many)`, or a crafted
file of 200,000 root children) used to restore in quadratic time: `at=` was found by computing
the subtree of every top-level name, each by scanning the root's children. No wall clock here:
the per-candidate subtree work and the graph walks are counted, and a budget far below the
quadratic count makes a regression fail at once instead of hanging.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._bundle import files as _files
from objckpt._formats import checkpoint as _checkpoint
from objckpt._planning import match as _match
from objckpt._planning import tree as _tree

from flavours import FLAVOURS, keras_for

WIDE = 200_000


class _Model(tf.Module):
    def __init__(self, seed: float = 0.0):
        super().__init__()
        self.dense = tf.Module()
        self.dense.kernel = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) + seed)
        self.dense.bias = tf.Variable(np.ones(4, np.float32) + seed)


def _craft(prefix: str, extra: int, model, *, shared: bool) -> int:
    """Writes `model` under `model/` plus `extra` root children: empty nodes, or (shared)
    further edges to the model's own node. Returns the number of graph nodes."""
    tree = objckpt.tree(model)
    paths = [f"model/{p}" for p in tree]
    graph = _tree.build_object_graph(paths, [""] * len(paths))
    model_node = next(c.node_id for c in graph.nodes[0].children if c.local_name == "model")
    first = len(graph.nodes)
    root = graph.nodes[0]
    for i in range(extra):
        child = root.children.add()
        child.local_name = f"o{i}"
        if shared:
            child.node_id = model_node
        else:
            graph.nodes.add()
            child.node_id = first + i
    keys = [_paths.checkpoint_key(p) for p in paths] + [_compat.OBJECT_GRAPH_KEY]
    tensors = [tf.convert_to_tensor(v) for v in tree.values()]
    tensors.append(tf.constant(graph.SerializeToString()))
    _files.write_tensors(prefix, keys, tensors)
    return len(graph.nodes)


class _Budget:
    """Counts the subtree computations and the nodes graph walks reach; fails past a bound."""

    def __init__(self, monkeypatch, subtrees: int, walked: int):
        self.subtrees, self.walked = 0, 0
        subtree_from, walk = _tree.subtree_paths_from, _paths.graph_walk

        def counted_subtree(*args, **kwargs):
            self.subtrees += 1
            assert self.subtrees <= subtrees, "a subtree per top-level name: quadratic"
            return subtree_from(*args, **kwargs)

        def counted_walk(*args, **kwargs):
            for edge in walk(*args, **kwargs):
                self.walked += 1
                assert self.walked <= walked, "graph walks beyond a linear bound"
                yield edge

        monkeypatch.setattr(_checkpoint, "subtree_paths_from", counted_subtree)
        monkeypatch.setattr(_paths, "graph_walk", counted_walk)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A 200,000-child checkpoint of empty root children beside `model`."""
    prefix = str(tmp_path_factory.mktemp("wide") / "ckpt")
    nodes = _craft(prefix, WIDE, _Model(seed=5.0), shared=False)
    return prefix, nodes


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """200,000 root children that all lead to the model's node."""
    prefix = str(tmp_path_factory.mktemp("shared") / "ckpt")
    nodes = _craft(prefix, WIDE, _Model(seed=5.0), shared=True)
    return prefix, nodes


def test_wide_crafted_restores_at_model_in_linear_work(wide, monkeypatch):
    prefix, nodes = wide
    model = _Model()
    budget = _Budget(monkeypatch, subtrees=8, walked=4 * nodes)
    report = objckpt.restore(model, prefix)
    assert sorted(report.restored) == ["dense/bias", "dense/kernel"]
    assert report.at == "model"
    assert any("used at='model'" in note for note in report.notes)
    np.testing.assert_array_equal(model.dense.kernel.numpy(),
                                  np.arange(12, dtype=np.float32).reshape(3, 4) + 5.0)
    np.testing.assert_array_equal(model.dense.bias.numpy(), np.full(4, 6.0, np.float32))
    # The root's network walk, and the two walks of the one subtree that fits: never one
    # subtree per top-level name.
    assert budget.subtrees <= 3
    assert budget.walked <= 2 * nodes + 10


def test_wide_shared_children_pick_nothing(shared, monkeypatch):
    """200,001 names of one node: more than _MAX_AT_CANDIDATES subtrees may hold the obj, so
    none is picked (never a guess) and the note counts them; the root's entries then match
    by structure, as they do when a few subtrees match."""
    prefix, nodes = shared
    model = _Model()
    budget = _Budget(monkeypatch, subtrees=8, walked=4 * nodes)
    report = objckpt.restore(model, prefix)
    assert report.at is None
    note = next(n for n in report.notes if "several source subtrees" in n)
    assert "('model', 'o0', 'o1'" in note
    assert f"and {WIDE + 1 - _match._MAX_AT_LISTED:,} more); pass at=..." in note
    assert {m.strategy for m in report.plan.matches} == {"structure"}
    np.testing.assert_array_equal(model.dense.bias.numpy(), np.full(4, 6.0, np.float32))
    assert budget.subtrees <= 2
    # With an explicit at= the same file restores from that name.
    report = objckpt.restore(_Model(), prefix, at="o7")
    assert report.at == "o7" and sorted(report.restored) == ["dense/bias", "dense/kernel"]


def test_wide_strict_mismatch_is_refused_with_a_typed_error(wide, monkeypatch):
    """An obj the 200,000-child file does not hold: a typed error naming the path, nothing
    changed, and no quadratic work on the way to the message."""
    prefix, nodes = wide
    model = _Model()
    model.extra = tf.Variable(np.zeros(2, np.float32))
    before = model.dense.kernel.numpy().copy()
    _Budget(monkeypatch, subtrees=8, walked=4 * nodes)
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(model, prefix)
    assert "extra" in str(caught.value)
    np.testing.assert_array_equal(model.dense.kernel.numpy(), before)


def test_several_below_the_cap_are_listed_in_full(tmp_path):
    prefix = str(tmp_path / "ckpt")
    _craft(prefix, 3, _Model(seed=1.0), shared=True)
    the_plan = objckpt.plan(_Model(), prefix, strict=False)
    assert ("several source subtrees match the obj ('model', 'o0', 'o1', 'o2'); pass at=... "
            "to pick one") in the_plan.notes


def test_holding_drops_names_by_shape_and_dtype(tmp_path):
    """The one-pass filter: a subtree whose paths exist with another shape is dropped, one
    with the paths and shapes is kept (its full check follows)."""
    prefix = str(tmp_path / "ckpt")
    root = tf.train.Checkpoint(model=_Model(1.0), twin=_Model(2.0), other=tf.Module())
    root.other.dense = tf.Module()
    root.other.dense.kernel = tf.Variable(np.zeros((4, 3), np.float32))
    root.other.dense.bias = tf.Variable(np.zeros(4, np.float32))
    objckpt.save(root, prefix)
    source = objckpt._planning.sources.open_source(prefix)
    wanted = {p: (tuple(v.shape), v.dtype.base_dtype)
              for p, v in objckpt.tree(_Model()).items()}
    assert source.holding(wanted) == ["model", "twin"]
    wanted["dense/bias"] = ((4,), tf.float64)
    assert source.holding(wanted) == []
    snap = objckpt.snapshot(root).as_source()
    assert snap.holding({"dense/kernel": ((3, 4), tf.float32)}) == ["model", "twin"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_wide_tf_checkpoint_restores_each_flavour(flavour, tmp_path, monkeypatch):
    """`tf.train.Checkpoint(model=m, **2,000 variables)`: the model restores from it by
    itself (at='model' found), computing one subtree, in every flavour."""
    if flavour == "module":
        model, fresh = _Model(3.0), _Model()
    else:
        keras = keras_for(flavour)

        def build():
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
            return m

        model, fresh = build(), build()
        model.layers[-1].kernel.assign(np.full((3, 4), 3.0, np.float32))
    many = {f"o{i}": tf.Variable(float(i)) for i in range(2000)}
    prefix = tf.train.Checkpoint(model=model, **many).write(str(tmp_path / "ckpt"))
    budget = _Budget(monkeypatch, subtrees=8, walked=100_000)
    report = objckpt.restore(fresh, prefix)
    for path, variable in objckpt.tree(fresh).items():
        np.testing.assert_array_equal(variable.numpy(), objckpt.tree(model)[path].numpy())
    assert len(report.restored) == len(objckpt.tree(fresh))
    assert budget.subtrees <= 3


def test_wide_entries_mismatch_error_is_linear(tmp_path, monkeypatch):
    """20,000 variables as root children and an obj that fits no subtree: the error's fixes
    (`pass at=...` among them) are found in one pass over the entries, not one per name."""
    prefix = str(tmp_path / "ckpt")
    tree = objckpt.tree(_Model(seed=2.0))
    # The model's name last: the fix `pass at='model'` is found after every other name.
    paths = [f"o{i}" for i in range(20_000)] + [f"model/{p}" for p in tree]
    graph = _tree.build_object_graph(paths, [""] * len(paths))
    one = tf.constant(1.0)
    tensors = [one] * 20_000 + [tf.convert_to_tensor(v) for v in tree.values()]
    _files.write_tensors(prefix, [_paths.checkpoint_key(p) for p in paths]
                         + [_compat.OBJECT_GRAPH_KEY],
                         [*tensors, tf.constant(graph.SerializeToString())])
    model = _Model()
    model.extra = tf.Variable(np.zeros(2, np.float32))  # fits no subtree
    before = objckpt.snapshot(model).numpy()
    starts = []
    real = str.startswith

    class _Key(str):
        def startswith(self, *args):
            starts.append(1)
            assert len(starts) <= 20_000, "one scan of the entries per top-level name"
            return real(self, *args)

    from objckpt._planning import checks as _checks
    _Budget(monkeypatch, subtrees=8, walked=4 * len(graph.nodes))
    at_fix, sizes = _checks._at_fix, []

    def counted_at_fix(plan, source, extra, missing):
        sizes.append(len(extra))
        return at_fix(plan, source, [_Key(k) for k in extra], missing)

    monkeypatch.setattr(_checks, "_at_fix", counted_at_fix)
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(model, prefix)
    assert "dense/kernel" in str(caught.value)
    assert "pass at='model'" in str(caught.value)
    assert sizes and sizes[0] >= 20_000  # every root entry is unexpected
    assert len(starts) <= 20_000  # was one scan of the entries per top-level name
    for path, value in objckpt.snapshot(model).numpy().items():
        np.testing.assert_array_equal(value, before[path])


class _Counted(str):
    """A key that counts the suffix tests made on it (all keys share one list)."""

    calls: ClassVar[list] = []

    def endswith(self, *args):
        self.calls.append(1)
        assert len(self.calls) <= 50_000, "one test per (key, variable) pair: quadratic"
        return str.endswith(self, *args)


def _example(extra, missing, shapes, specs):
    from types import SimpleNamespace

    from objckpt._planning import checks as _checks

    plan = SimpleNamespace(display=lambda path: (path.replace("_", ""), ""))
    variables = {path: SimpleNamespace(shape=shape) for path, shape in shapes.items()}
    return _checks._example_rule(extra, missing, plan, SimpleNamespace(specs=specs), variables)


def test_example_rule_of_wide_sources_is_linear_and_unchanged():
    """The rule an error suggests, for 20,000 unexpected keys and 20,000 missing variables,
    without a test per pair; on small inputs, the pick of a scan of every pair."""
    _Counted.calls = []
    extra = [_Counted(f"old/o{i}/w") for i in range(20_000)]
    missing = [f"n_{i}/v" for i in range(20_000)]
    specs = {k: ((2,), tf.float32) for k in extra}
    shapes = {p: (3,) for p in missing}
    shapes[missing[-1]] = (2,)  # the only variable of a source key's shape
    assert _example(extra, missing, shapes, specs) == repr(("^old/o0/w$", "n19999/v"))
    extra.append(_Counted("ckpt/x/n_7/v"))  # ends with a variable's path
    assert _example(extra, missing, shapes, specs) == repr(("^ckpt/x/", ""))
    # The first key with a suffix; then the first variable (its shown path before its path).
    assert _example(["a/b", "p/q/b", "z/c/b"], ["c/b", "b"], {"c/b": (1,), "b": (1,)},
                    {}) == repr(("^a/", ""))
    assert _example(["k/c/b"], ["b", "c/b"], {"b": (1,), "c/b": (1,)},
                    {}) == repr(("^k/c/", ""))
    assert _example(["m/n_1"], ["n_1"], {"n_1": (1,)}, {}) == repr(("^m/", ""))
    assert _example(["x", "y"], ["u", "v"], {"u": (1,), "v": (2,)},
                    {"x": ((3,), tf.float32), "y": ((2,), tf.float32)}) == repr(("^y$", "v"))
    assert _example(["x"], ["u"], {"u": (1,)}, {}) == repr(("^x$", "u"))


def test_node_of_many_children_reached_by_many_edges(tmp_path):
    """A crafted DAG: 20,000 root edges to one node of 20,000 children (its `iter` child, the
    mark of an optimizer, last). Each node's optimizer test runs once, not once per edge
    (4e8 child visits before), so restore, read_tree and inspect's walk answer."""
    from objckpt._inspect import meta as _meta

    count = 20_000
    prefix = str(tmp_path / "ckpt")
    tree = objckpt.tree(_Model(seed=4.0))
    paths = [f"model/{p}" for p in tree]
    graph = _tree.build_object_graph(paths, [""] * len(paths))
    hub = len(graph.nodes)
    graph.nodes.add()
    for i in range(count):
        graph.nodes.add()
        graph.nodes[hub].children.add(node_id=hub + 1 + i, local_name=f"c{i}")
    graph.nodes.add()
    graph.nodes[hub].children.add(node_id=len(graph.nodes) - 1, local_name="iter")
    for i in range(count):
        graph.nodes[0].children.add(node_id=hub, local_name=f"e{i}")
    _files.write_tensors(prefix, [_paths.checkpoint_key(p) for p in paths]
                         + [_compat.OBJECT_GRAPH_KEY],
                         [*(tf.convert_to_tensor(v) for v in tree.values()),
                          tf.constant(graph.SerializeToString())])
    model = _Model()
    report = objckpt.restore(model, prefix)
    assert report.at == "model"
    np.testing.assert_array_equal(model.dense.bias.numpy(), np.full(4, 5.0, np.float32))
    assert sorted(objckpt.read_tree(prefix)) == ["model/dense/bias", "model/dense/kernel"]
    assert sorted(_meta.read(prefix)) == ["model/dense/bias", "model/dense/kernel"]
    edges = _paths.OptimizerEdges(graph)
    assert edges(hub, "e1") and edges(hub, "e2") and not edges(hub + 1, "c0")


def test_other_formats_sources_have_the_one_pass_filter(tmp_path):
    """Sources of the other formats (a Keras 3 weights file here; SavedModel and Keras 2 HDF5
    through the same `open_source` branch) drop top-level names that cannot hold the obj in
    one pass too, so `at=` is found in linear time for them as for TF checkpoints."""
    keras = keras_for("keras3")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="d")])
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    source = objckpt._planning.sources.open_source(path)
    assert source.kind == "object" and source.holding is not None
    specs = dict(source.specs)
    top = source.top_level_names
    wanted = {key.split("/", 1)[1]: (tuple(spec[0]), spec[1])
              for key, spec in specs.items() if key.startswith(top[0] + "/")}
    assert source.holding(wanted) == [top[0]]
    wrong = {path: ((99,), dtype) for path, (_, dtype) in wanted.items()}
    assert source.holding(wrong) == []


def test_savedmodel_walk_tests_each_node_once(monkeypatch):
    """A SavedModel's object graph is walked with the same memoized optimizer test: 2,000
    edges to one node of 2,000 children scan its children once, not once per edge."""
    from objckpt._formats import savedmodel as _savedmodel

    count = 2_000
    graph = _tree.build_object_graph(["model/dense/kernel"], [""])
    hub = len(graph.nodes)
    graph.nodes.add()
    for i in range(count):
        graph.nodes.add()
        graph.nodes[hub].children.add(node_id=hub + 1 + i, local_name=f"c{i}")
    for i in range(count):
        graph.nodes[0].children.add(node_id=hub, local_name=f"e{i}")
    tested = []
    real = _paths._optimizer_node
    monkeypatch.setattr(_paths, "_optimizer_node",
                        lambda node: tested.append(len(node.children)) or real(node))
    shown = _savedmodel._walk(graph)
    assert shown[hub] == "e0" and len(shown) == len(graph.nodes)
    assert not _savedmodel._has_optimizer(graph, shown)  # 4,000 edges, 2,002 nodes
    # children scanned: each node's once per pass (two passes), not once per edge (4e6)
    assert sum(tested) <= 4 * 2 * count, sum(tested)
