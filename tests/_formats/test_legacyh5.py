"""Keras 2 / tf_keras HDF5 files (`save_weights("w.h5")`, `model.save("m.h5")`) as sources.

The files are written by the real library in a subprocess
(tests/helpers/legacy_writers/keras2_h5.py: tf_keras in the tf_keras session, Keras 2.12 in the
keras2 session) and restored into the same architecture in tf_keras, Keras 2 and Keras 3
(beside tf_keras); Keras 3's own `.h5` saving writes this layout too (keras3 session).
Damaged and hostile files are made with h5py here.
"""

import importlib.util
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._inspect import meta as _meta

from flavours import keras_for, legacy_keras_env
from legacy import legacy_keras_available
from support import HELPERS, run_cli

WRITER = os.path.join(HELPERS, "legacy_writers", "keras2_h5.py")
_spec = importlib.util.spec_from_file_location("keras2_h5_writer", WRITER)
writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writer)  # h5_net and moments only; its main() runs in a subprocess

# Keys of h5_net's weights: `<top-level layer>/<weight name relative to it>`.
NETWORK_KEYS = ["conv/kernel", "conv/bias", "bn/gamma", "bn/beta", "bn/moving_mean",
                "bn/moving_variance", "head/hidden/kernel", "head/hidden/bias",
                "head/logits/kernel", "head/logits/bias"]
SLOTS = 2 * 8  # Adam m and v of the 8 trainable weights


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{"new"|"legacy": dict(dir=..., x, y, iterations, m<i>, v<i>)} written by Keras 2."""
    if not legacy_keras_available():
        pytest.skip(f"no Keras 2: tf_keras is not installed and TF {tf.__version__} >= 2.16")
    directory = tmp_path_factory.mktemp("keras2_h5")
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, WRITER, str(directory)], env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise RuntimeError(f"the Keras 2 HDF5 writer failed ({result.returncode}):\n{tail}")
    out = {}
    for variant in ("new", "legacy"):
        with np.load(directory / variant / "out.npz") as data:
            out[variant] = dict(dir=str(directory / variant), **{k: data[k] for k in data.files})
    return out


def keras_of(flavour: str):
    """The Keras of a flavour here; Keras 3 only beside tf_keras (where the writer ran)."""
    if flavour == "keras3" and not legacy_keras_env():
        pytest.skip("Keras 3 reads Keras 2 HDF5 files in the tf_keras session (beside it)")
    return keras_for(flavour, beside_tf_keras=True)


def session_keras():
    """The Keras this session tests: tf_keras, Keras 2 (TF 2.12) or Keras 3."""
    if legacy_keras_env():
        return keras_for("tf_keras")
    import keras

    return keras


def values(model) -> list:
    return [np.array(v.numpy()) for v in model.variables]


def slot_values(optimizer, variable):
    """(m, v) the obj's optimizer keeps for a variable, in every flavour (the oracle)."""
    if hasattr(optimizer, "_get_variable_index"):  # Keras 3
        index = optimizer._get_variable_index(variable)
        return optimizer._momentums[index].numpy(), optimizer._velocities[index].numpy()
    m, v = writer.moments(optimizer, variable)
    return m.numpy(), v.numpy()


def with_adam(keras, model, legacy: bool = False):
    """Compiles with Adam and makes its state exist (one zero step: weights stay)."""
    adam = keras.optimizers.Adam
    if legacy:  # Keras 2.12 exports it from the submodule only
        adam = getattr(keras.optimizers.legacy, "Adam", None) or keras.optimizers.legacy.adam.Adam
    model.compile(optimizer=adam(0.01), loss="mse")
    variables = model.trainable_variables
    model.optimizer.apply_gradients(zip([tf.zeros_like(v) for v in variables], variables))
    return model


def assert_outputs(model, data, flavour):
    y = np.asarray(model(data["x"], training=False))
    if flavour == "keras3":  # other kernels: equal to the last float32 bit or two
        np.testing.assert_allclose(y, data["y"], rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(y, data["y"])


# Strategies per target flavour: tf_keras / Keras 2 name the top-level layers' weights as
# saved (`conv/kernel`) and the nested model's without it (`hidden/kernel`): found by the
# layer names the file records; Keras 3 names them all by path (`head/hidden/kernel`).
STRATEGIES = {"tf_keras": {"name": 6, "layer name": 4}, "keras2": {"name": 6, "layer name": 4},
              "keras3": {"name": 10}}


@pytest.mark.parametrize("flavour", ["tf_keras", "keras2", "keras3"])
@pytest.mark.subprocess
def test_save_weights_file_restores_into_every_flavour(written, flavour):
    keras = keras_of(flavour)
    data = written["new"]
    path = os.path.join(data["dir"], "w.h5")
    model = writer.h5_net(keras)
    plan = objckpt.plan(model, path)
    assert plan.complete and plan.strategies() == STRATEGIES[flavour]
    assert [m.source for m in plan.matches if m.source.startswith("head/")] == NETWORK_KEYS[6:]
    report = objckpt.restore(model, path)
    assert report.source == f"Keras 2 HDF5 weights `{path}`"
    assert len(report.restored) == 10 and not report.missing and not report.unexpected
    assert_outputs(model, data, flavour)


@pytest.mark.parametrize("variant", ["new", "legacy"])
@pytest.mark.parametrize("flavour", ["tf_keras", "keras2", "keras3"])
@pytest.mark.subprocess
def test_full_model_moves_adam_state_by_owner(written, flavour, variant):
    keras = keras_of(flavour)
    data = written[variant]
    path = os.path.join(data["dir"], "m.h5")
    model = with_adam(keras, writer.h5_net(keras), legacy=variant == "legacy" and
                      flavour != "keras3")
    report = objckpt.restore(model, path)
    assert report.source == f"Keras 2 HDF5 model `{path}` (weights only; its config is not read)"
    assert report.plan.strategies()["slot"] == SLOTS + 1  # and the step counter
    assert_outputs(model, data, flavour)
    for i, variable in enumerate(model.trainable_variables):  # by position in one architecture
        m, v = slot_values(model.optimizer, variable)
        np.testing.assert_array_equal(m, data[f"m{i}"])
        np.testing.assert_array_equal(v, data[f"v{i}"])
    assert int(model.optimizer.iterations.numpy()) == int(data["iterations"]) == 1


@pytest.mark.subprocess
def test_structure_carries_it_into_a_keras3_model_named_otherwise(written):
    """No name or path lines up (a subclassed Keras 3 model, attributes and layers named
    otherwise): the file's layers with weights pair with `model.layers` in order, as Keras's
    `load_weights` pairs them, every shape checked."""
    keras = keras_of("keras3")

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.a, self.b = keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization()
            self.f = keras.layers.Flatten()
            self.h = keras.Sequential([keras.layers.Dense(5, activation="relu"),
                                       keras.layers.Dense(2)])

        def call(self, x, training=False):
            return self.h(self.f(self.b(self.a(x), training=training)))

    data = written["new"]
    model = Net()
    model(data["x"])
    report = objckpt.restore(model, os.path.join(data["dir"], "w.h5"))
    assert report.plan.strategies() == {"topological order": 10}
    assert [m.source for m in report.plan.matches] == NETWORK_KEYS
    assert any(note.startswith("topological order: the file's layer names differ from the "
                               "obj's (`conv` in the file is `conv2d") and "and 2 more" in note
               for note in report.plan.notes), report.plan.notes
    assert_outputs(model, data, "keras3")


@pytest.mark.subprocess
def test_optimizer_state_is_skipped_and_listed_without_an_optimizer(written):
    keras = session_keras()
    data = written["legacy"]
    model = writer.h5_net(keras)
    report = objckpt.restore(model, os.path.join(data["dir"], "m.h5"))
    assert len(report.restored) == 10
    skipped = [s for s in report.skipped if "the obj has no optimizer to put it in" in s]
    assert len(skipped) == SLOTS + 1
    assert any(s.startswith("optimizer/Adam/conv/kernel/m: optimizer state") for s in skipped)


@pytest.mark.subprocess
def test_inspect_verify_and_migrate(written, tmp_path):
    data = written["new"]
    path = os.path.join(data["dir"], "m.h5")
    listed = _meta.read(path)
    assert list(listed)[:10] == NETWORK_KEYS
    assert listed["head/hidden/kernel"].shape == (64, 5)
    assert listed["head/hidden/kernel"].name == "hidden/kernel"
    assert listed["head/hidden/kernel"].key == "model_weights/head/hidden/kernel:0"
    assert listed["optimizer/iterations"].dtype.name == "int64"
    assert len(listed) == 10 + SLOTS + 1
    report = objckpt.verify(path)
    assert report.ok and report.tensors == 10 + SLOTS + 1
    keras = session_keras()
    prefix = objckpt.migrate(writer.h5_net(keras), os.path.join(data["dir"], "w.h5"),
                             str(tmp_path / "migrated"))
    model = writer.h5_net(keras)
    tf.train.Checkpoint(root=model).read(prefix).assert_existing_objects_matched()
    # written by tf_keras / Keras 2; in the Keras 3 session its other kernels may differ in
    # the last float32 bit or two (4.5e-7 seen on one machine), as in assert_outputs' tests
    assert_outputs(model, data, "tf_keras" if legacy_keras_env() else "keras3")


def test_keras3_h5_model_restores_with_its_optimizer_state(tmp_path):
    keras = keras_for("keras3")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 6, 6, 3)).astype("float32")
    model = writer.h5_net(keras)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x, rng.normal(size=(4, 2)).astype("float32"), batch_size=4, verbose=0)
    path = str(tmp_path / "k3.h5")
    model.save(path)
    target = with_adam(keras, writer.h5_net(keras))
    report = objckpt.restore(target, path)
    assert report.notes[0].startswith("written by Keras 3.")
    np.testing.assert_array_equal(np.asarray(target(x, training=False)),
                                  np.asarray(model(x, training=False)))
    for mine, theirs in zip(target.trainable_variables, model.trainable_variables):
        for a, b in zip(slot_values(target.optimizer, mine), slot_values(model.optimizer, theirs)):
            np.testing.assert_array_equal(a, b)
    # Keras 3 saves its learning rate as a variable too: it moves with the step counter
    assert report.plan.strategies() == {"name": 10, "slot": SLOTS + 2}


# --- damaged and hostile files ------------------------------------------------------------


def dense_model(keras):
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(2, name="dense")(inputs))


def write_h5(path, *, kernel=None, weight_names=(b"dense/kernel:0", b"dense/bias:0"),
             layer_names=(b"dense",), huge=False, chunked=False):
    """A Keras 2 `save_weights` file of dense_model, with one thing changed (chunked: the
    names split into `layer_names0`, ..., `weight_names0`, `weight_names1`, as Keras does
    past 64 KiB)."""
    with h5py.File(path, "w", libver="latest" if huge else "earliest") as f:
        if chunked:  # both lists split, as Keras does past 64 KiB
            for i, name in enumerate(layer_names):
                f.attrs[f"layer_names{i}"] = np.array([name])
        else:
            f.attrs["layer_names"] = np.full(2**20 + 1, b"x", dtype="S1") if huge else \
                np.array(layer_names)
        f.attrs["backend"], f.attrs["keras_version"] = b"tensorflow", b"2.12.0"
        group = f.create_group("dense")
        if chunked:
            for i, name in enumerate(weight_names):
                group.attrs[f"weight_names{i}"] = np.array([name])
        else:
            group.attrs["weight_names"] = np.array(weight_names)
        inner = group.create_group("dense")
        inner["kernel:0"] = np.ones((3, 2), "float32") if kernel is None else kernel
        inner["bias:0"] = np.ones((2,), "float32")
    return str(path)


def truncated(path):
    write_h5(path, kernel=np.ones((3, 2), "float32"))
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.truncate(size // 2)
    return str(path)


HOSTILE = {
    "truncated": (truncated, errors.CheckpointCorruptError, "cannot be read"),
    "missing dataset": (
        lambda p: write_h5(p, weight_names=(b"dense/kernel:0", b"dense/gamma:0")),
        errors.CheckpointCorruptError,
        "`weight_names` lists `dense/gamma:0`, but there is no dataset `dense/dense/gamma:0`"),
    "missing layer": (
        lambda p: write_h5(p, layer_names=(b"dense", b"conv")), errors.CheckpointCorruptError,
        "`layer_names` lists layer `conv`, but the file has no group of that name"),
    "layer through a dataset": (  # names with `/` are nested groups; never a dataset
        lambda p: write_h5(p, layer_names=(b"dense", b"dense/dense/kernel:0")),
        errors.CheckpointCorruptError,
        "lists layer `dense/dense/kernel:0`, but the file has no group of that name"),
    "layer named `.`": (  # HDF5's own group: not a layer's
        lambda p: write_h5(p, layer_names=(b"dense", b".")), errors.CheckpointCorruptError,
        "lists layer `.`, but the file has no group of that name"),
    "wrong shape": (
        lambda p: write_h5(p, kernel=np.ones((3, 3), "float32")), errors.StructureMismatchError,
        "shape (3, 3) in the source but (3, 2) in the obj"),
    "wrong dtype": (
        lambda p: write_h5(p, kernel=np.ones((3, 2), "float64")), errors.StructureMismatchError,
        "dtype float64 in the source but float32 in the obj"),
    "text dataset": (
        lambda p: write_h5(p, kernel=np.array([b"import os"] * 6).reshape(3, 2)),
        errors.CheckpointCorruptError, "is not a number type"),
    "huge layer_names": (
        lambda p: write_h5(p, huge=True), errors.CheckpointCorruptError, "too large"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_damaged_and_hostile_files_change_nothing(case, tmp_path):
    make, error, words = HOSTILE[case]
    path = make(tmp_path / "w.h5")
    model = dense_model(session_keras())
    before = values(model)
    with pytest.raises(error) as raised:
        objckpt.restore(model, path)
    assert words in str(raised.value)
    assert os.path.basename(path) in str(raised.value)
    for old, new in zip(before, values(model)):
        np.testing.assert_array_equal(old, new)


def test_intact_synthetic_file_restores_and_verify_names_the_damage(tmp_path):
    keras = session_keras()
    model = dense_model(keras)
    path = write_h5(tmp_path / "w.h5", chunked=True)
    report = objckpt.restore(model, path)  # a Keras 2 file, though it has no `layer_names`
    assert report.plan.strategies() == {"name": 2}
    assert report.source.startswith("Keras 2 HDF5"), report.source
    np.testing.assert_array_equal(model.layers[-1].kernel.numpy(), np.ones((3, 2)))
    damaged = objckpt.verify(HOSTILE["missing dataset"][0](tmp_path / "bad.h5"))
    assert not damaged.ok and len(damaged.problems) == 1
    assert "`dense/gamma:0`" in str(damaged.problems[0])


@pytest.mark.parametrize("flavour", ["tf_keras", "keras2"])
def test_subclassed_model_and_its_own_weight(flavour, tmp_path):
    """A subclassed model names its layers' weights under its own name (`scaled/trunk/kernel`,
    keyed `trunk/kernel`; its object path is `body/kernel`) and keeps a weight of its own in
    `top_level_model_weights`."""
    keras = keras_for(flavour)

    class Scaled(keras.Model):
        def __init__(self):
            super().__init__(name="scaled")
            self.body = keras.layers.Dense(3, name="trunk")
            self.scale = self.add_weight(name="scale", shape=(3,), initializer="ones")

        def call(self, x):
            return self.body(x) * self.scale

    x = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    saved, model = Scaled(), Scaled()
    saved(x), model(x)
    for variable in saved.variables:
        variable.assign(np.random.default_rng(1).normal(size=variable.shape))
    path = str(tmp_path / "scaled.h5")
    saved.save_weights(path)
    report = objckpt.restore(model, path)
    assert report.plan.strategies() == {"name": 2, "layer name": 1}
    assert [m.source for m in report.plan.matches if m.strategy == "layer name"] == \
        ["top_level_model_weights/scale"]
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(saved(x)))


@pytest.mark.subprocess
def test_command_line_reads_it_without_tensorflow(tmp_path):
    """inspect, graph and verify of a Keras 2 `.h5` in a process where TF cannot import."""
    path = write_h5(tmp_path / "w.h5")

    def run(*args):
        done = run_cli(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(run("inspect", path, "--format", "json"))["variables"]
    assert [(v["path"], v["shape"], v["dtype"], v["name"], v["key"]) for v in listed] == [
        ("dense/kernel", [3, 2], "float32", "dense/kernel", "dense/dense/kernel:0"),
        ("dense/bias", [2], "float32", "dense/bias", "dense/dense/bias:0")]
    assert run("inspect", path).startswith(f"Keras 2 HDF5 weights `{path}`: 2 variables, 8 ")
    assert 'label="kernel\\n(3, 2) float32"' in run("graph", path)
    assert run("verify", path).splitlines()[-1].startswith(f"OK: {path}: 2 tensors")


def _auto_named(keras):
    """Conv2D + BatchNorm + Dense with the names Keras makes up (`conv2d`, `conv2d_1`, ...)."""
    return keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3),
                             keras.layers.BatchNormalization(), keras.layers.Flatten(),
                             keras.layers.Dense(2)])


@pytest.mark.parametrize("flavour", ["writer", "keras3"])
def test_drifting_names_move_adam_state_by_owner(flavour, tmp_path):
    """A full model `.h5` written first in its process (`conv2d`, `dense`) into the same
    architecture built later (`conv2d_1`, `dense_1`): topological order pairs the layers, and
    Adam's state follows the variable it belongs to, as `load_model` would put it."""
    if not legacy_keras_available() or not (legacy_keras_env() or
                                            keras_for("keras2") is not None):
        pytest.skip("needs tf_keras or Keras 2 to write the file")
    writer_keras = session_keras()
    writer_keras.backend.clear_session()  # the file's names: the first of a process
    images = np.random.default_rng(0).normal(size=(4, 6, 6, 3)).astype("float32")
    targets = np.random.default_rng(1).normal(size=(4, 2)).astype("float32")
    source = with_adam(writer_keras, _auto_named(writer_keras))
    source.fit(images, targets, batch_size=4, epochs=2, verbose=0)
    path = str(tmp_path / "m.h5")
    source.save(path)
    keras = keras_of("keras3") if flavour == "keras3" else writer_keras
    _auto_named(keras)  # a throwaway: the target's names drift from the file's
    model = with_adam(keras, _auto_named(keras))
    report = objckpt.restore(model, path)
    assert report.plan.strategies() == {"topological order": 8, "slot": 2 * 6 + 1}
    note = next(n for n in report.plan.notes if n.startswith("topological order: "))
    assert note.startswith("topological order: the file's layer names differ from the obj's "
                           "(`conv2d` in the file is `conv2d_")
    for variable, saved in zip(model.trainable_variables, source.trainable_variables):
        assert np.array(variable).tobytes() == np.array(saved).tobytes()
        for got, want in zip(slot_values(model.optimizer, variable),
                             slot_values(source.optimizer, saved)):
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert int(model.optimizer.iterations.numpy()) == int(source.optimizer.iterations.numpy()) == 3
    if flavour == "writer":  # the next step equals the uninterrupted run's
        model.train_on_batch(images, targets)
        source.train_on_batch(images, targets)
        for a, b in zip(model.weights, source.weights):
            assert np.array(a).tobytes() == np.array(b).tobytes()


def test_nested_layer_group_into_every_session_keras(tmp_path):
    """A layer named `blk/dense` (tf_keras allows `/`; h5py nests the groups) restores into a
    model whose layer is `dense`: the names differ, the order and shapes agree."""
    path = str(tmp_path / "nested.h5")
    kernel = np.arange(6, dtype="float32").reshape(3, 2)
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = np.array([b"blk/dense"])
        f.attrs["backend"], f.attrs["keras_version"] = b"tensorflow", b"2.15.0"
        group = f.create_group("blk/dense")
        group.attrs["weight_names"] = np.array([b"blk/dense/kernel:0", b"blk/dense/bias:0"])
        group["blk/dense/kernel:0"] = kernel
        group["blk/dense/bias:0"] = np.full((2,), 7.0, "float32")
    assert list(_meta.read(path)) == ["blk/dense/kernel", "blk/dense/bias"]
    model = dense_model(session_keras())
    report = objckpt.restore(model, path)
    assert report.plan.strategies() == {"topological order": 2}
    assert [m.source for m in report.plan.matches] == ["blk/dense/kernel", "blk/dense/bias"]
    np.testing.assert_array_equal(model.layers[-1].kernel.numpy(), kernel)
    np.testing.assert_array_equal(model.layers[-1].bias.numpy(), [7.0, 7.0])
