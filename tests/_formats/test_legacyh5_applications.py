"""keras.applications saved as Keras 2 / tf_keras HDF5 (`save_weights("x.h5")`), restored as
Keras's own `load_weights` restores them.

The files are written once per module by the session's legacy Keras (tf_keras in the tf_keras
session, Keras 2.12 in the keras2 session) after its `clear_session()`, so their
auto-generated names are the first of a process (`conv2d`, `conv2d_1`, ...). Targets are built
later, after a throwaway model with the same layer classes, so their names drift (`conv2d_5`):
matching by name would pair the wrong layers; "topological order" pairs layers as Keras does.

- into Keras 3 beside tf_keras (tf_keras session): MobileNetV3Small (layer names with `/`:
  `Conv/BatchNorm`, which Keras 3 spells `conv_bn`), MobileNet (`depthwise_kernel` ->
  `kernel`), InceptionResNetV2 (drifting `conv2d_N` names); outputs and weights equal, bit for
  bit, to Keras 3's own `load_weights` of the same file into an identical fresh model;
- into the writing flavour itself (tf_keras, Keras 2): the `/` names, and the drift;
- all or nothing: one layer of another shape leaves every variable as it was, and the plan
  says why topological order was not used.

MobileNetV3Small rather than Large (the same `/` names, a third of the layers); small inputs,
`weights=None` and random (seeded) values, BatchNorm moving variances kept positive.
"""

from __future__ import annotations

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt._inspect import meta as _meta

from flavours import keras_for, legacy_keras_env

# name -> keyword arguments of keras.applications.<name> (both flavours accept them all).
APPS = {
    "MobileNetV3Small": dict(input_shape=(32, 32, 3), alpha=0.75, classes=10,
                             include_preprocessing=False),
    "MobileNet": dict(input_shape=(32, 32, 3), alpha=0.25, classes=10),
    "InceptionResNetV2": dict(input_shape=(75, 75, 3), include_top=False),
}
# Into Keras 3: how many variables each strategy matched. MobileNet names its layers itself
# (no drift): its 13 depthwise kernels are found by layer name through the role rename.
KERAS3_STRATEGIES = {"MobileNetV3Small": {"topological order": 210},
                     "MobileNet": {"name": 124, "layer name": 13},
                     "InceptionResNetV2": {"topological order": 896}}
# The first name that differs, file vs Keras 3 obj (the note of the plan names it).
KERAS3_DRIFT = {"MobileNetV3Small": ("Conv", "conv"), "InceptionResNetV2": ("conv2d", "conv2d_")}


def writer_keras():
    """The legacy Keras that writes the files: tf_keras, or Keras 2 (TF 2.12); else skip."""
    if legacy_keras_env():
        return keras_for("tf_keras")
    keras = keras_for("keras2")  # skips in the Keras 3 sessions, which have no legacy Keras
    return keras


def _randomise(model, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = rng.normal(scale=0.05, size=tuple(variable.shape))
        if "variance" in variable.name:
            value = 1.0 + np.abs(value)
        variable.assign(value.astype("float32"))


def _throwaway(keras):
    """A model with the layer classes the applications use, so later names drift."""
    return keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 1), keras.layers.BatchNormalization(),
        keras.layers.DepthwiseConv2D(1), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2)])


def _app(keras, name, **changes):
    return getattr(keras.applications, name)(weights=None, **{**APPS[name], **changes})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: (path of the .h5, x, the writer's outputs)}: each file written once."""
    keras = writer_keras()
    keras.backend.clear_session()  # the file's names: the first of a process
    directory = tmp_path_factory.mktemp("h5_applications")
    out = {}
    for i, name in enumerate(APPS):
        model = _app(keras, name)
        _randomise(model, i)
        x = np.random.default_rng(10 + i).uniform(
            size=(2, *APPS[name]["input_shape"])).astype("float32")
        path = str(directory / f"{name}.h5")
        model.save_weights(path)
        out[name] = (path, x, np.asarray(model(x, training=False)))
    return out


def weights_of(model) -> list:
    return [np.array(v.numpy()) for v in model.weights]


def assert_bitwise(left: list, right: list) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", list(APPS))
def test_into_keras3_equals_keras3_load_weights(files, name):
    if not legacy_keras_env():
        pytest.skip("Keras 3 reads tf_keras HDF5 files in the tf_keras session (beside it)")
    keras = keras_for("keras3", beside_tf_keras=True)
    path, x, _ = files[name]
    _throwaway(keras)
    model, oracle = _app(keras, name), _app(keras, name)
    plan = objckpt.plan(model, path)
    assert plan.complete and plan.strategies() == KERAS3_STRATEGIES[name]
    table = plan.describe()
    assert all(strategy in table for strategy in KERAS3_STRATEGIES[name])
    if name in KERAS3_DRIFT:
        file_name, obj_name = KERAS3_DRIFT[name]
        note = next(n for n in plan.notes if n.startswith("topological order: "))
        assert f"(`{file_name}` in the file is `{obj_name}" in note, note
        assert "every shape and dtype was checked" in note
    else:
        assert [m.source for m in plan.matches if m.strategy == "layer name"] == \
            [f"conv_dw_{i}/depthwise_kernel" for i in range(1, 14)]
    report = objckpt.restore(model, path)
    assert len(report.restored) == sum(KERAS3_STRATEGIES[name].values())
    assert not report.missing and not report.unexpected
    oracle.load_weights(path)
    assert_bitwise(weights_of(model), weights_of(oracle))
    y, y_oracle = np.asarray(model(x, training=False)), np.asarray(oracle(x, training=False))
    assert y.tobytes() == y_oracle.tobytes(), float(np.max(np.abs(y - y_oracle)))


def test_names_with_a_slash_into_the_writing_flavour(files):
    """`Conv/BatchNorm` is a group nested in `Conv` (h5py nests names with `/`): found, and
    each weight matched by its own name."""
    keras = writer_keras()
    path, x, y = files["MobileNetV3Small"]
    model = _app(keras, "MobileNetV3Small")
    report = objckpt.restore(model, path)
    assert report.plan.strategies() == {"name": 210}
    sources = {m.source for m in report.plan.matches}
    assert {"Conv/BatchNorm/gamma", "expanded_conv/depthwise/BatchNorm/moving_variance",
            "Conv/kernel"} <= sources
    listed = _meta.read(path)  # what `objckpt inspect` lists
    assert listed["Conv/BatchNorm/gamma"].key == "Conv/BatchNorm/Conv/BatchNorm/gamma:0"
    assert tuple(listed["Conv/BatchNorm/gamma"].shape) == (16,)
    verified = objckpt.verify(path)
    assert verified.ok and verified.tensors == 210
    assert np.asarray(model(x, training=False)).tobytes() == y.tobytes()


def test_drifting_names_into_the_writing_flavour(files):
    """Built second in its process, the model's names are `conv2d_203`, ...: a few layers
    named by hand match by name, the rest would not; the whole file goes by topological
    order, as Keras's `load_weights` goes."""
    keras = writer_keras()
    path, x, y = files["InceptionResNetV2"]
    _throwaway(keras)
    model = _app(keras, "InceptionResNetV2")
    report = objckpt.restore(model, path)
    assert report.plan.strategies() == {"topological order": 896}
    note = next(n for n in report.plan.notes if n.startswith("topological order: "))
    assert "the file's 448 layers with weights were paired with the obj's" in note
    assert np.asarray(model(x, training=False)).tobytes() == y.tobytes()


@pytest.mark.parametrize("target", ["keras3", "writer"])
def test_one_layer_of_another_shape_changes_nothing(files, target):
    if target == "keras3":
        if not legacy_keras_env():
            pytest.skip("Keras 3 reads tf_keras HDF5 files in the tf_keras session")
        keras = keras_for("keras3", beside_tf_keras=True)
        logits = "logits"
    else:
        keras = writer_keras()
        logits = "Logits"
    path, _, _ = files["MobileNetV3Small"]
    _throwaway(keras)
    model = _app(keras, "MobileNetV3Small", classes=11)  # the last layer: 11 classes, not 10
    before = weights_of(model)
    with pytest.raises(errors.StructureMismatchError) as raised:
        objckpt.restore(model, path)
    assert_bitwise(weights_of(model), before)
    message = str(raised.value)
    assert "Nothing was restored" in message
    plan = objckpt.plan(model, path)
    assert not plan.complete
    if target == "keras3":  # names differ: the order was tried, and the note says where
        note = next(n for n in plan.notes if n.startswith("topological order: not used: "))
        assert (f"layer #87 (`Logits` in the file, `{logits}` in the obj): `Logits/kernel` "
                "is (1, 1, 1024, 10) float32 in the file") in note, note
        assert "(1, 1, 1024, 11) float32 in the obj" in note
        assert "topological order: not used" in message
    else:  # names agree: the one layer of another shape is named
        assert any("Logits/kernel" in str(problem) for problem in plan.mismatched)
    with pytest.raises(ValueError):  # Keras's own loader refuses it too
        model.load_weights(path)
