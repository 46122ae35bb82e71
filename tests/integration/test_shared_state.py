"""Shared state: a layer called twice, a variable reachable by several paths.

The oracle is independent of objckpt: weights are set from NumPy arrays with the
flavour's own API (`set_weights`, `Variable.assign`), expected outputs are computed
by hand in NumPy, and checkpoints are read back with TensorFlow's own reader.
"""

import numpy as np
import pytest
import tensorflow as tf

import objckpt

from flavours import KERAS_FLAVOURS, keras_for

X = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype="float32")
K = np.array([[0.5, -0.1, 0.2], [0.3, 0.4, -0.6], [-0.2, 0.1, 0.7]], dtype="float32")
B = np.array([0.1, -0.2, 0.3], dtype="float32")
H = np.array([[1.0, 0.0], [0.5, -1.0], [-0.5, 2.0]], dtype="float32")
HB = np.array([0.25, -0.75], dtype="float32")
K2 = np.eye(3, dtype="float32") * 2.0
B2 = np.array([1.0, 0.0, -1.0], dtype="float32")


def by_hand(kernel, bias):
    """The shared Dense applied twice, then the head, in NumPy."""
    once = X @ kernel + bias
    return (once @ kernel + bias) @ H + HB


def shared_net(keras):
    """A functional model whose `shared` Dense is called twice (one kernel, two uses)."""
    x = keras.Input((3,), name="x")
    shared = keras.layers.Dense(3, name="shared")
    out = keras.layers.Dense(2, name="head")(shared(shared(x)))
    model = keras.Model(x, out, name="shared_net")
    model.get_layer("shared").set_weights([K, B])
    model.get_layer("head").set_weights([H, HB])
    return model


def run(model):
    return np.asarray(model(X))


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def checkpoint_tensors(prefix) -> list:
    """Every saved value (TF's own reader), bookkeeping entries left out."""
    reader = tf.train.load_checkpoint(str(prefix))
    return [reader.get_tensor(name) for name, _ in tf.train.list_variables(str(prefix))
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and not name.startswith("save_counter")]


def count_equal(tensors, value) -> int:
    return sum(t.shape == value.shape and np.array_equal(t, value) for t in tensors)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_clone_of_a_layer_used_twice_shares_one_kernel(flavour):
    keras = keras_for(flavour)
    model = shared_net(keras)
    close(run(model), by_hand(K, B))
    twin = objckpt.clone(model)
    close(run(twin), by_hand(K, B))
    # New weights through the clone's layer change both of its uses, and only the clone.
    twin.get_layer("shared").set_weights([K2, B2])
    close(run(twin), by_hand(K2, B2))
    close(run(model), by_hand(K, B))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_snapshot_save_and_restore_of_a_layer_used_twice(flavour, tmp_path):
    keras = keras_for(flavour)
    model = shared_net(keras)
    snap = objckpt.snapshot(model)
    prefix = objckpt.save(model, tmp_path / "ckpt")
    # The shared kernel is one variable: saved once, with the values set above.
    tensors = checkpoint_tensors(prefix)
    assert count_equal(tensors, K) == 1 and count_equal(tensors, B) == 1
    assert count_equal(tensors, H) == 1 and len(tensors) == 4
    model.get_layer("shared").set_weights([K2, B2])
    close(run(model), by_hand(K2, B2))
    objckpt.restore(model, snap)
    close(run(model), by_hand(K, B))
    # The written checkpoint loads into a fresh model, by objckpt and by TF itself.
    for load in (lambda m: objckpt.restore(m, prefix),
                 lambda m: tf.train.Checkpoint(root=m).read(prefix).assert_consumed()):
        fresh = shared_net(keras)
        fresh.get_layer("shared").set_weights([K2, B2])
        fresh.get_layer("head").set_weights([np.zeros_like(H), np.zeros_like(HB)])
        load(fresh)
        close(run(fresh), by_hand(K, B))


class Aliased(tf.Module):
    """One variable reachable by four paths: an attribute, an alias, a list and a dict."""

    def __init__(self):
        super().__init__()
        self.v = tf.Variable(np.zeros((3, 3), "float32"))
        self.alias = self.v
        self.items = [self.v]
        self.box = {"again": self.v}

    def __call__(self, x):
        return tf.matmul(tf.matmul(x, self.v), self.alias)


def test_a_variable_reachable_by_four_paths(tmp_path):
    module = Aliased()
    module.v.assign(K)
    close(np.asarray(module(X)), X @ K @ K)
    twin = objckpt.clone(module)
    twin.box["again"].assign(K2)  # through one path of the clone ...
    for path in (twin.v, twin.alias, twin.items[0], twin.box["again"]):  # ... seen by all
        np.testing.assert_array_equal(path.numpy(), K2)
    close(np.asarray(twin(X)), X @ K2 @ K2)
    np.testing.assert_array_equal(module.v.numpy(), K)  # the original keeps its value
    prefix = objckpt.save(module, tmp_path / "ckpt")
    tensors = checkpoint_tensors(prefix)
    assert len(tensors) == 1 and count_equal(tensors, K) == 1  # saved once
    objckpt.restore(twin, prefix)
    for path in (twin.v, twin.alias, twin.items[0], twin.box["again"]):
        np.testing.assert_array_equal(path.numpy(), K)
    fresh = Aliased()
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    close(np.asarray(fresh(X)), X @ K @ K)
