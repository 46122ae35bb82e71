"""The legacy checkpoints of tests/helpers/legacy.py are what they claim, proved without objckpt.

TF1: a name-based Saver checkpoint whose values, assigned by hand by name, make the TF2
rewrites (every Keras flavour and a tf.Module) compute the saved output. Keras 2: an
object-based checkpoint that plain `tf.train.Checkpoint(root=conv_net(keras2)).read()`
restores, optimizer state included.
"""

import numpy as np
import pytest
import tensorflow as tf

from flavours import FLAVOURS, keras_for
from legacy import (
    TF1_SHAPES,
    TF1_TRAINABLE,
    X_SEED,
    LegacyKerasUnavailable,
    cached_keras2_checkpoint,
    cached_tf1_checkpoint,
    conv_net,
    legacy_keras,
    load_tf1_by_hand,
    tf1_names,
    tf1_rewrite,
    tf1_rewrite_module,
    tf1_variables,
    write_tf1_checkpoint,
)

SCOPE = "model_001"
ATOL = 1e-6


@pytest.fixture(scope="session")
def tf1(tmp_path_factory):
    return cached_tf1_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session", params=["sequential", "functional"])
def keras2_ckpt(request, tmp_path_factory):
    try:
        return request.param, cached_keras2_checkpoint(tmp_path_factory, kind=request.param)
    except LegacyKerasUnavailable as error:
        pytest.skip(str(error))


def tensors(prefix) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


# --- TF1 Saver checkpoint -------------------------------------------------------------------


def test_tf1_checkpoint_is_name_based_with_the_expected_names(tf1):
    listed = dict(tf.train.list_variables(tf1["prefix"]))
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" not in listed
    assert not any("/.ATTRIBUTES/" in name for name in listed)
    assert sorted(listed) == tf1["names"] == tf1_names(SCOPE)
    assert "model_001/conv/kernel/Adam_1" in listed and "beta2_power" in listed
    for name, shape in TF1_SHAPES.items():
        assert listed[f"{SCOPE}/{name}"] == list(shape), name
    for name in TF1_TRAINABLE:
        for slot in ("Adam", "Adam_1"):
            assert listed[f"{SCOPE}/{name}/{slot}"] == list(TF1_SHAPES[name])
    for name in ("global_step", "beta1_power", "beta2_power"):
        assert listed[name] == []


def test_tf1_checkpoint_records_three_adam_steps(tf1):
    values = tensors(tf1["prefix"])
    assert values["global_step"] == 3
    np.testing.assert_allclose(values["beta1_power"], 0.9 ** 4, rtol=1e-6)
    np.testing.assert_allclose(values["beta2_power"], 0.999 ** 4, rtol=1e-6)
    assert np.all(values[f"{SCOPE}/conv/kernel/Adam_1"] > 0)
    assert tf1["x"].shape == (4, 8, 8, 3) and tf1["x"].dtype == np.float32
    assert tf1["y"].shape == (4, 5) and tf1["y"].dtype == np.float32
    expected_x = np.random.default_rng(X_SEED).normal(size=(4, 8, 8, 3)).astype("float32")
    np.testing.assert_array_equal(tf1["x"], expected_x)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_tf1_values_by_hand_reproduce_y(tf1, flavour):
    if flavour == "module":
        model = tf1_rewrite_module()
        assert set(tf1_variables(model)) == set(TF1_SHAPES)
    else:
        model = tf1_rewrite(keras_for(flavour))
    for name, variable in tf1_variables(model).items():
        assert tuple(variable.shape) == TF1_SHAPES[name], name
    x = tf1["x"]
    before = np.asarray(model(x) if flavour == "module" else model(x, training=False))
    assert not np.allclose(before, tf1["y"], atol=1e-3), "fresh weights must not give y"
    load_tf1_by_hand(model, tf1["prefix"], SCOPE)
    after = np.asarray(model(x) if flavour == "module" else model(x, training=False))
    np.testing.assert_allclose(after, tf1["y"], atol=ATOL)
    if flavour != "module":
        np.testing.assert_allclose(model.predict(x, verbose=0), tf1["y"], atol=ATOL)


def test_tf1_seeds_scope_and_optimizer(tf1, tmp_path_factory, tmp_path):
    again = write_tf1_checkpoint(tmp_path)  # seed 0 again, another process
    first, second = tensors(tf1["prefix"]), tensors(again["prefix"])
    assert list(first) == list(second)
    for name in first:
        assert first[name].tobytes() == second[name].tobytes(), f"{name} not reproducible"
    np.testing.assert_array_equal(again["y"], tf1["y"])

    other = cached_tf1_checkpoint(tmp_path_factory, scope="model_002", seed=1, adam=False)
    assert other["names"] == tf1_names("model_002", adam=False)
    assert "beta1_power" not in other["names"]
    third = tensors(other["prefix"])
    assert third["global_step"] == 3
    for name in TF1_SHAPES:
        assert not np.array_equal(third[f"model_002/{name}"], first[f"{SCOPE}/{name}"]), name
    np.testing.assert_array_equal(other["x"], tf1["x"])
    assert not np.allclose(other["y"], tf1["y"])
    module = tf1_rewrite_module()
    load_tf1_by_hand(module, other["prefix"], "model_002")
    np.testing.assert_allclose(module(other["x"]).numpy(), other["y"], atol=ATOL)


# --- Keras 2 (tf_keras / TF <= 2.15 tf.keras) checkpoint ------------------------------------

KERAS2_SHAPES = {
    "layer_with_weights-0/kernel": [3, 3, 3, 4],
    "layer_with_weights-0/bias": [4],
    "layer_with_weights-1/gamma": [4],
    "layer_with_weights-1/beta": [4],
    "layer_with_weights-1/moving_mean": [4],
    "layer_with_weights-1/moving_variance": [4],
    "layer_with_weights-2/kernel": [2, 2, 4, 6],
    "layer_with_weights-2/bias": [6],
    "layer_with_weights-3/kernel": [54, 3],
    "layer_with_weights-3/bias": [3],
    "optimizer/_iterations": [],
    "optimizer/_learning_rate": [],
}
# Adam's m and v of each trainable variable, in order (BN moving stats have none).
for _i, _shape in enumerate([[3, 3, 3, 4], [4], [4], [4], [2, 2, 4, 6], [6], [54, 3], [3]]):
    KERAS2_SHAPES[f"optimizer/_variables/{2 * _i + 1}"] = _shape
    KERAS2_SHAPES[f"optimizer/_variables/{2 * _i + 2}"] = _shape
SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def test_keras2_checkpoint_is_object_based(keras2_ckpt):
    _, ckpt = keras2_ckpt
    listed = dict(tf.train.list_variables(ckpt["prefix"]))
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" in listed
    assert {k: v for k, v in listed.items() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"} == {
        path + SUFFIX: shape for path, shape in KERAS2_SHAPES.items()}
    values = tensors(ckpt["prefix"])
    assert ckpt["iterations"] == 8 == values["optimizer/_iterations" + SUFFIX]
    np.testing.assert_array_equal(ckpt["m"], values["optimizer/_variables/1" + SUFFIX])
    np.testing.assert_array_equal(ckpt["v"], values["optimizer/_variables/2" + SUFFIX])
    assert ckpt["m"].shape == ckpt["v"].shape == (3, 3, 3, 4)
    assert np.all(ckpt["v"] > 0) and np.any(ckpt["m"] != 0)
    assert ckpt["y"].shape == (4, 3)
    expected_x = np.random.default_rng(X_SEED).normal(size=(4, 8, 8, 3)).astype("float32")
    np.testing.assert_array_equal(ckpt["x"], expected_x)


def _legacy_keras_or_skip():
    keras = legacy_keras()
    if keras is None:
        pytest.skip("no Keras 2 importable in this process (tf_keras or keras 2.x)")
    return keras


def test_keras2_checkpoint_restores_into_conv_net(keras2_ckpt):
    kind, ckpt = keras2_ckpt
    model = conv_net(_legacy_keras_or_skip(), kind)
    assert not np.allclose(model(ckpt["x"], training=False), ckpt["y"], atol=1e-3)
    status = tf.train.Checkpoint(root=model).read(ckpt["prefix"])
    status.assert_existing_objects_matched().expect_partial()  # the optimizer is not built
    np.testing.assert_allclose(model(ckpt["x"], training=False), ckpt["y"], atol=ATOL)
    np.testing.assert_allclose(model.predict(ckpt["x"], verbose=0), ckpt["y"], atol=ATOL)


def test_keras2_checkpoint_restores_optimizer_state(keras2_ckpt):
    kind, ckpt = keras2_ckpt
    keras = _legacy_keras_or_skip()
    model = conv_net(keras, kind)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(root=model).read(ckpt["prefix"]).assert_consumed()
    optimizer = model.optimizer
    assert optimizer.iterations.numpy() == ckpt["iterations"]
    # Named "Adam/m/conv1/kernel:0" or "m/conv1/kernel:0" depending on the name scope.
    slots = {"/" + v.name.split(":")[0]: v for v in optimizer.variables}
    m = [v for name, v in slots.items() if name.endswith("/m/conv1/kernel")]
    w = [v for name, v in slots.items() if name.endswith("/v/conv1/kernel")]
    assert len(m) == len(w) == 1, sorted(slots)
    np.testing.assert_array_equal(m[0].numpy(), ckpt["m"])
    np.testing.assert_array_equal(w[0].numpy(), ckpt["v"])


def test_conv_net_in_keras3_has_the_checkpoint_shapes(keras2_ckpt):
    """The Keras 3 target of a migration: same variables, in the same order, other paths."""
    kind, _ = keras2_ckpt
    model = conv_net(keras_for("keras3", beside_tf_keras=True), kind)
    shapes = [list(v.shape) for v in model.weights]
    per_layer = {"kernel": 0, "bias": 1, "gamma": 0, "beta": 1, "moving_mean": 2,
                 "moving_variance": 3}
    expected = sorted(
        (int(path.split("/")[0].split("-")[1]), per_layer[path.split("/")[1]], shape)
        for path, shape in KERAS2_SHAPES.items() if path.startswith("layer_with_weights-"))
    assert shapes == [shape for _, _, shape in expected]
