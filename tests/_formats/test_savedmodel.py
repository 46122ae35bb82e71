"""SavedModel directories as sources: restore, plan, migrate, inspect and verify from them.

Each SavedModel is written by the library that produces it (`tf.saved_model.save` of a
tf.Module in every session, Keras 3 `model.export` in the keras3 session, tf_keras
`model.save(dir, save_format="tf")` in the tf_keras session, Keras 2 `model.save(dir)` in the
keras2 session); restores are checked by outputs. Damaged `saved_model.pb` files and
directories give typed errors and change nothing.
"""

import importlib.util
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._inspect import meta as _meta

from flavours import Dense, build_functional, keras_for, legacy_keras_env
from support import assert_bits, run_cli, values

X = np.random.default_rng(0).normal(size=(4, 6, 6, 3)).astype("float32")


class Block(tf.Module):
    """A Sonnet-like nested module: two linear layers and a scale."""

    def __init__(self, name=None):
        super().__init__(name=name)
        self.layers = [Dense(3, 4), Dense(4, 2)]
        self.scale = tf.Variable(tf.ones((2,), tf.float64))

    @tf.function(input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    def __call__(self, x):
        for layer in self.layers:
            x = tf.nn.relu(layer(x))
        return x * tf.cast(self.scale, tf.float32)


class Net(tf.Module):
    def __init__(self):
        super().__init__(name="net")
        self.encoder = Block()
        self.head = Dense(2, 1)

    @tf.function(input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    def __call__(self, x):
        return self.head(self.encoder(x))


def _randomize(obj, seed):
    rng = np.random.default_rng(seed)
    for variable in obj.variables:
        variable.assign(rng.normal(size=variable.shape).astype(variable.dtype.as_numpy_dtype))


@pytest.fixture(scope="module")
def module_saved(tmp_path_factory):
    net = Net()
    _randomize(net, 1)
    directory = str(tmp_path_factory.mktemp("sm") / "net")
    tf.saved_model.save(net, directory)
    return directory, net(X[:, 0, 0, :]).numpy()


def test_module_saved_model_restores_by_exact_paths_from_each_way_of_naming_it(module_saved):
    directory, expected = module_saved
    for given in (directory, os.path.join(directory, "saved_model.pb"),
                  os.path.join(directory, "variables", "variables")):
        net = Net()
        plan = objckpt.plan(net, given)
        assert plan.complete and plan.strategies() == {"exact": 7}, plan.describe()
        assert plan.source == f"SavedModel `{directory}`"
        assert f"SavedModel `{directory}` holds no optimizer state" in plan.describe()
        report = objckpt.restore(net, given)
        assert report.source == f"SavedModel `{directory}`" and len(report.restored) == 7
        np.testing.assert_array_equal(net(X[:, 0, 0, :]).numpy(), expected)


def test_module_saved_model_migrates_inspects_and_verifies(module_saved, tmp_path):
    directory, expected = module_saved
    net = Net()
    prefix = objckpt.migrate(net, directory, str(tmp_path / "out"))
    fresh = Net()
    tf.train.Checkpoint(root=fresh).read(prefix).assert_existing_objects_matched()
    np.testing.assert_array_equal(fresh(X[:, 0, 0, :]).numpy(), expected)
    meta = _meta.read(directory)
    assert meta.prefix == os.path.join(directory, "variables", "variables")
    assert sorted(meta) == ["encoder/layers/0/b", "encoder/layers/0/w", "encoder/layers/1/b",
                            "encoder/layers/1/w", "encoder/scale", "head/b", "head/w"]
    assert meta["encoder/scale"].dtype.name == "float64"
    assert meta["encoder/scale"].shape == (2,)
    report = objckpt.verify(directory)
    assert report.ok and report.tensors == 7, report.describe()


@pytest.mark.subprocess
def test_command_line_inspects_without_tensorflow_and_verifies(module_saved):
    directory, _ = module_saved
    result = run_cli("inspect", directory)
    assert result.returncode == 0, result.stderr
    assert f"SavedModel `{directory}`: 7 variables" in result.stdout, result.stdout
    assert "scale" in result.stdout, result.stdout
    result = run_cli("verify", directory, blocked=False)
    assert result.returncode == 0 and "OK:" in result.stdout and "7 tensors" in result.stdout


# --- damaged and hostile SavedModels ---------------------------------------------------------

def _broken(module_saved, tmp_path, pb: bytes | None = None, drop_variables=False) -> str:
    directory = str(tmp_path / "broken")
    shutil.copytree(module_saved[0], directory)
    if pb is not None:
        with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
            f.write(pb)
    if drop_variables:
        shutil.rmtree(os.path.join(directory, "variables"))
    return directory


def _pb(module_saved) -> bytes:
    with open(os.path.join(module_saved[0], "saved_model.pb"), "rb") as f:
        return f.read()


BROKEN = {
    "truncated": (lambda pb: pb[: len(pb) // 2], errors.CheckpointCorruptError,
                  "runs past the end"),
    "garbage": (lambda pb: b"\xff" * 64, errors.CheckpointCorruptError,
                "longer than 10 bytes"),
    "huge length": (lambda pb: b"\x12\xff\xff\xff\xff\x0f" + b"\x00" * 32,
                    errors.CheckpointCorruptError, "runs past the end of its message"),
    "wrong wire type": (lambda pb: b"\x10\x01", errors.CheckpointCorruptError,
                        "field 2 has wire type 0, expected 2"),
    "empty": (lambda pb: b"", errors.CheckpointCorruptError, "`saved_model.pb` is empty"),
    "TF1 (no object graph)": (lambda pb: b"\x12\x02\x0a\x00", errors.NotObjectBasedError,
                              "SavedModelBuilder"),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_damaged_saved_model_pb_is_a_typed_error_and_changes_nothing(module_saved, tmp_path,
                                                                     what):
    damage, error, words = BROKEN[what]
    directory = _broken(module_saved, tmp_path, damage(_pb(module_saved)))
    net = Net()
    before = values(objckpt.tree(net))
    with pytest.raises(error) as raised:
        objckpt.restore(net, directory)
    message = str(raised.value)
    assert words in message and f"`{directory}`" in message, message
    assert_bits(before, values(objckpt.tree(net)))
    if error is errors.CheckpointCorruptError:
        report = objckpt.verify(directory)
        assert not report.ok and words in str(report.problems[0]), report.describe()


def test_missing_variables_and_a_saved_model_without_variables(module_saved, tmp_path):
    directory = _broken(module_saved, tmp_path, drop_variables=True)
    net = Net()
    before = values(objckpt.tree(net))
    with pytest.raises(errors.CheckpointCorruptError, match=r"lists 7 variables but their "
                       r"checkpoint `.*variables/variables\.index` is missing"):
        objckpt.restore(net, directory)
    assert_bits(before, values(objckpt.tree(net)))
    assert "`variables/variables.index` is missing" in str(objckpt.verify(directory).problems[0])
    device = _broken(module_saved, tmp_path / "device")
    os.remove(os.path.join(device, "saved_model.pb"))
    os.symlink(os.devnull, os.path.join(device, "saved_model.pb"))
    with pytest.raises(errors.CheckpointCorruptError, match="is a character device, not a "
                       "regular file; not opened"):
        objckpt.restore(net, device)
    assert_bits(before, values(objckpt.tree(net)))

    class Functions(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec((None,), tf.float32)])
        def double(self, x):
            return 2 * x

    empty = str(tmp_path / "functions")
    tf.saved_model.save(Functions(), empty)
    with pytest.raises(errors.StructureMismatchError, match="holds no variables"):
        objckpt.restore(net, empty)
    assert_bits(before, values(objckpt.tree(net)))


def test_saved_model_declaring_another_dtype_than_its_checkpoint(module_saved, tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString(_pb(module_saved))
    (node,) = [n for n in saved.meta_graphs[0].object_graph_def.nodes
               if n.WhichOneof("kind") == "variable" and n.variable.dtype == tf.float64]
    node.variable.dtype = tf.float16.as_datatype_enum  # the checkpoint holds float64
    directory = _broken(module_saved, tmp_path, saved.SerializeToString())
    net = Net()
    before = values(objckpt.tree(net))
    with pytest.raises(errors.CheckpointCorruptError, match=r"is declared .* of DataType 19 but "
                       r"its checkpoint holds .* of DataType 2"):
        objckpt.restore(net, directory)
    assert_bits(before, values(objckpt.tree(net)))


# --- Keras ---------------------------------------------------------------------------------

def _keras3_model(keras):
    images = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3)(images)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Flatten()(x)
    head = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    model = keras.Model(images, head(x))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def _train(model):
    model.fit(X, np.ones((4, 2), "float32"), epochs=1, verbose=0)


@pytest.mark.slow
def test_keras3_export_into_keras3_by_keras_names(tmp_path):
    if legacy_keras_env():
        pytest.skip("Keras 3 exports are tested in the keras3 and tf216 sessions")
    keras = keras_for("keras3")
    keras.utils.clear_session()
    model = _keras3_model(keras)
    _train(model)
    expected = model.predict(X, verbose=0)
    directory = str(tmp_path / "export")
    model.export(directory, verbose=False)
    keras.utils.clear_session()  # the same layer names, as in a new process
    fresh = _keras3_model(keras)
    _train(fresh)  # an optimizer with state: left as is
    plan = objckpt.plan(fresh, directory)
    assert plan.complete and plan.strategies() == {"keras name": 10}, plan.describe()
    assert "10 entries under `_all_variables` are the export's second copy" in plan.describe()
    optimizer_before = {p: v for p, v in values(objckpt.tree(fresh)).items()
                        if p.startswith(("optimizer/_variables/", "optimizer/_iter"))}
    report = objckpt.restore(fresh, directory)
    assert len(report.restored) == 10
    np.testing.assert_array_equal(fresh.predict(X, verbose=0), expected)
    after = values(objckpt.tree(fresh))
    assert_bits(optimizer_before, {p: after[p] for p in optimizer_before})


def test_keras3_tf_saved_model_save_into_keras3_with_optimizer_state(tmp_path):
    if legacy_keras_env():
        pytest.skip("Keras 3 SavedModels are tested in the keras3 and tf216 sessions")
    keras = keras_for("keras3")
    keras.utils.clear_session()
    model = build_functional(keras)  # trained: Adam's m and v exist
    directory = str(tmp_path / "saved")
    tf.saved_model.save(model, directory)
    keras.utils.clear_session()
    fresh = build_functional(keras, train=False)
    fresh.optimizer.build(fresh.trainable_variables)
    plan = objckpt.plan(fresh, directory)
    # A Sequential's SavedModel-only `_layers` edge is walked last: its weights keep the
    # model's own paths, and the optimizer's layout then agrees entry by entry.
    assert plan.complete and plan.strategies() == {"exact": len(objckpt.tree(fresh))}, \
        plan.describe()
    objckpt.restore(fresh, directory)
    assert_bits(values(objckpt.tree(model)), values(objckpt.tree(fresh)))


def _legacy_model(keras):
    inner = keras.Sequential([keras.layers.Dense(5, name="inner_dense")], name="inner")
    images = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(images)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    model = keras.Model(images, keras.layers.Dense(2, name="out")(inner(x)))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.fixture(scope="module")
def legacy_saved(tmp_path_factory):
    """A trained tf_keras (tf_keras session) or Keras 2 (keras2 session) SavedModel."""
    flavour = "tf_keras" if legacy_keras_env() else "keras2"
    keras = keras_for(flavour)
    model = _legacy_model(keras)
    _train(model)
    directory = str(tmp_path_factory.mktemp("legacy") / "saved")
    model.save(directory, save_format="tf")
    return keras, directory, model


def test_legacy_saved_model_into_the_same_flavour_with_optimizer_state(legacy_saved):
    keras, directory, model = legacy_saved
    fresh = _legacy_model(keras)
    _train(fresh)
    plan = objckpt.plan(fresh, directory)
    assert plan.complete, plan.describe()
    assert plan.strategies()["exact"] == len(objckpt.tree(fresh)), plan.describe()
    # The nested model's weights: TF's canonical path runs through the SavedModel's
    # `variables` list; they are found by the model's own path.
    assert "layer_with_weights-2/layer_with_weights-0/kernel" in {m.source for m in plan.matches}
    assert "2 Keras metric variables reachable only through `keras_api`" in plan.describe()
    objckpt.restore(fresh, directory)
    np.testing.assert_array_equal(fresh.predict(X, verbose=0), model.predict(X, verbose=0))
    assert_bits(values(objckpt.tree(model)), values(objckpt.tree(fresh)))


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None or not legacy_keras_env(),
                    reason="needs tf_keras beside Keras 3 (the tf_keras nox session)")
def test_tf_keras_saved_model_into_keras3(legacy_saved):
    _, directory, model = legacy_saved
    keras3 = keras_for("keras3", beside_tf_keras=True)
    fresh = _legacy_model(keras3)
    fresh.optimizer.build(fresh.trainable_variables)
    plan = objckpt.plan(fresh, directory)
    # Keras 3 names the nested weight `inner/inner_dense/kernel`, tf_keras `inner_dense/kernel`:
    # layer by layer; Adam's m and v move by the weight they belong to.
    assert plan.complete and plan.strategies() == {"slot": 18, "structure": 10}, \
        plan.describe()
    owner_of = {m.source: plan.display(m.target)[1] for m in plan.matches}
    assert owner_of["optimizer/_variables/9"] == \
        "m of `_operations/4/_functional/_operations/1/_kernel`"
    objckpt.restore(fresh, directory)
    np.testing.assert_allclose(fresh.predict(X, verbose=0), model.predict(X, verbose=0),
                               rtol=1e-6, atol=1e-6)


def test_export_copies_compare_unknown_shapes_without_error():
    """`_all_variables` is taken for a copy of `variables` by the multiset of (dtype, shape,
    name, trainable): an unknown shape (None) beside a known one of the same dtype is data,
    not a TypeError from sorting."""
    from types import SimpleNamespace as NS

    from objckpt._formats import savedmodel as _savedmodel
    from objckpt._formats.savedobjects import SavedVariable

    def node(*kids):
        return NS(children=[NS(node_id=k, local_name=str(i)) for i, k in enumerate(kids)])

    graph = NS(nodes=[node(), node(3, 4), node(5, 6), None, None, None, None])
    saved = {3: SavedVariable(1, None, "a", True), 4: SavedVariable(1, (2,), "b", True),
             5: SavedVariable(1, (2,), "b", True), 6: SavedVariable(1, None, "a", True)}
    root = {"variables": 1, "_all_variables": 2}
    assert _savedmodel._export_copies(graph, root, saved) == {5, 6}
    saved[6] = SavedVariable(1, (3,), "a", True)
    assert _savedmodel._export_copies(graph, root, saved) == set()
