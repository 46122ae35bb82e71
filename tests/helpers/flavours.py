"""Model builders for every flavour the tests iterate over.

Each flavour imports its Keras explicitly (`keras` or `tf_keras`, never
`tf.keras`, which resolves to either) and is skipped with a reason where it
is not installed. Every builder returns a trained obj: real layers (Conv2D,
BatchNormalization, Embedding, Dense, a nested model, a shared layer) and an
optimizer whose slot variables exist.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os

import numpy as np
import pytest
import tensorflow as tf

FLAVOURS = ("keras3", "tf_keras", "keras2", "module")
KERAS_FLAVOURS = ("keras3", "tf_keras", "keras2")
KINDS = ("functional", "subclassed")
# (flavour, kind) pairs every structural test iterates; a module has one kind.
CASES = [(flavour, kind) for flavour in FLAVOURS for kind in ("functional", "subclassed")
         if not (flavour == "module" and kind == "subclassed")]


def case_id(case) -> str:
    return f"{case[0]}-{case[1]}"


def keras_for(flavour: str, *, beside_tf_keras: bool = False):
    """Returns the Keras module of a flavour, or skips the test with a reason.

    The tf_keras session (TF_USE_LEGACY_KERAS=1) has Keras 3 installed too, but the keras3
    flavour is tested by the keras3 and tf216 sessions; here it skips, unless
    `beside_tf_keras`: a test about Keras 3 next to tf_keras in one process (a tf_keras or
    Keras 2 checkpoint restored into Keras 3), which only this session can run.
    """
    if flavour == "keras3" and legacy_keras_env() and not beside_tf_keras:
        pytest.skip("the keras3 flavour runs in the keras3 and tf216 sessions; this one "
                    "(TF_USE_LEGACY_KERAS=1) tests tf_keras and Keras 3 beside it")
    if flavour == "tf_keras":
        try:
            return importlib.import_module("tf_keras")
        except ImportError:
            pytest.skip("tf_keras is not installed in this environment")
    try:
        keras = importlib.import_module("keras")
    except ImportError:
        pytest.skip("keras is not installed in this environment")
    major = keras.__version__.split(".")[0]
    if flavour == "keras3" and major != "3":
        pytest.skip(f"Keras 3 flavour needs keras 3; this environment has {keras.__version__}")
    if flavour == "keras2" and major != "2":
        pytest.skip(f"Keras 2 flavour needs TF <= 2.15's keras 2; this has {keras.__version__}")
    return keras


def _data(seed=0):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(8, 6, 6, 3)).astype("float32")
    tokens = rng.integers(0, 10, size=(8, 4)).astype("int32")
    targets = rng.normal(size=(8, 2)).astype("float32")
    return images, tokens, targets


def build_functional(keras, *, train=True):
    """Conv2D + BatchNorm + Embedding + a shared Dense + a nested Sequential."""
    images = keras.Input((6, 6, 3), name="images")
    tokens = keras.Input((4,), dtype="int32", name="tokens")
    x = keras.layers.Conv2D(4, 3, name="conv")(images)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    e = keras.layers.Flatten()(keras.layers.Embedding(10, 3, name="embed")(tokens))
    shared = keras.layers.Dense(5, name="shared")
    x = keras.layers.Add()([shared(keras.layers.Dense(6, name="proj_x")(x)),
                            shared(keras.layers.Dense(6, name="proj_e")(e))])
    head = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)],
                            name="head")
    model = keras.Model([images, tokens], head(x), name="functional")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    if train:
        images_, tokens_, targets = _data()
        model.fit([images_, tokens_], targets, epochs=1, batch_size=4, verbose=0)
    return model


def build_subclassed(keras, *, train=True, call=True):
    """A subclassed model with nested and shared layers, built by calling it."""

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.conv = keras.layers.Conv2D(4, 3)
            self.bn = keras.layers.BatchNormalization()
            self.flat = keras.layers.Flatten()
            self.hidden = keras.layers.Dense(6)
            self.alias = self.hidden  # the same layer under a second name
            self.block = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])

        def call(self, x, training=False):
            x = self.flat(self.bn(self.conv(x), training=training))
            return self.block(self.hidden(x))

    model = Net()
    if call:
        model(_data()[0])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        if train:
            images, _, targets = _data()
            model.fit(images, targets, epochs=1, batch_size=4, verbose=0)
    return model


class Dense(tf.Module):
    def __init__(self, n_in, n_out, name=None):
        super().__init__(name=name)
        self.w = tf.Variable(tf.random.stateless_normal((n_in, n_out), seed=(n_in, n_out)))
        self.b = tf.Variable(tf.zeros((n_out,)))

    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


class ModuleNet(tf.Module):
    """A plain tf.Module tree: nested modules, a shared submodule, an int step."""

    def __init__(self):
        super().__init__(name="module_net")
        self.encoder = Dense(3, 4)
        self.layers = [Dense(4, 4), Dense(4, 2)]
        self.shared = self.layers[0]  # reachable twice
        self.step = tf.Variable(0, dtype=tf.int64)

    def __call__(self, x):
        x = tf.nn.relu(self.encoder(x))
        for layer in self.layers:
            x = layer(x)
        return x


def build_module(*, train=True):
    """Returns tf.train.Checkpoint(model=ModuleNet, optimizer=TF1 Adam with slots)."""
    net = ModuleNet()
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    if train:
        module_step(net, optimizer)
    return tf.train.Checkpoint(model=net, optimizer=optimizer)


def module_step(net, optimizer, x=None) -> None:
    """One training step of a ModuleNet (on ones((2, 3)) unless x): weights, slots and step
    change."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(net(tf.ones((2, 3)) if x is None else x) ** 2)
    variables = [v for v in net.trainable_variables if v.dtype.is_floating]
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    net.step.assign_add(1)


def train_more(obj, epochs: int = 1) -> None:
    """More training through the flavour's own machinery, on other data than the builders'
    (seed 1): a module's one step, or `epochs` of Keras fit. Weights, the optimizer's slots
    and iterations all change."""
    if isinstance(obj, tf.train.Checkpoint):
        module_step(obj.model, obj.optimizer)
        return
    images, tokens, targets = _data(seed=1)
    inputs = images if obj.name == "net" else [images, tokens]
    obj.fit(inputs, targets, epochs=epochs, batch_size=4, verbose=0)


def build(flavour: str, kind: str = "functional", **kwargs):
    """Builds a trained obj of a flavour: 'functional' or 'subclassed' Keras, or a module."""
    if flavour == "module":
        return build_module(**{k: v for k, v in kwargs.items() if k == "train"})
    keras = keras_for(flavour)
    if kind == "subclassed":
        return build_subclassed(keras, **kwargs)
    return build_functional(keras, **kwargs)


def checkpoint_paths(prefix: str) -> set:
    """Object paths in a checkpoint, from TF's own list_variables."""
    return {name.split("/.ATTRIBUTES/")[0] for name, _ in tf.train.list_variables(prefix)
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
            and not name.startswith("save_counter/")}


def legacy_keras_env() -> bool:
    """TF_USE_LEGACY_KERAS=1: `tf.keras` is tf_keras (the tf_keras nox session)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") == "1"


def _keras_major() -> str | None:
    """The major version of the installed `keras` ("3", "2"), None where there is none;
    read from its metadata, so that importing this module imports no Keras."""
    try:
        return importlib.metadata.version("keras").split(".")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def session_flavour() -> str:
    """The Keras flavour this environment's tests are about (its nox session): tf_keras
    where TF_USE_LEGACY_KERAS=1, else what `import keras` gives (keras3 or keras2)."""
    if legacy_keras_env():
        return "tf_keras"
    return "keras3" if _keras_major() == "3" else "keras2"


# Keras 3 as the Keras of this session (TF_USE_LEGACY_KERAS unset or 0 and keras 3
# installed): the keras3 and tf216 sessions. The tf_keras session has keras 3 installed
# too, but there tf.keras is tf_keras.
# (major, minor) of TensorFlow: the keras3 session has the latest, tf216 has (2, 16).
TF_VERSION = tuple(int(part) for part in tf.__version__.split(".")[:2])
KERAS3_SESSION = not legacy_keras_env() and _keras_major() == "3"
requires_keras3_session = pytest.mark.skipif(
    not KERAS3_SESSION, reason="needs Keras 3 as this session's Keras (the keras3 and tf216 "
    "nox sessions); here " + ("TF_USE_LEGACY_KERAS=1" if legacy_keras_env()
                              else f"keras is {_keras_major() or 'not installed'}"))


_STRATEGIES: dict = {}


def mirrored(replicas: int = 2) -> tf.distribute.MirroredStrategy:
    """The MirroredStrategy of this test process over `replicas` logical CPU devices
    ("/cpu:0", "/cpu:1", ...); conftest.py splits the CPU into two before TF initializes
    its devices.

    One strategy per replica count and process, as in a real program: each MirroredStrategy
    numbers its collective all-reduces from the same start, and two strategies over the same
    devices in one process collide ("Shape mismatch in the collective instance 100") once
    test modules of both share a pytest-xdist worker.
    """
    if replicas not in _STRATEGIES:
        _STRATEGIES[replicas] = _new_mirrored(replicas)
    return _STRATEGIES[replicas]


def _new_mirrored(replicas: int) -> tf.distribute.MirroredStrategy:
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:replicas]
    assert len(devices) == replicas, f"{replicas} logical CPUs wanted, found {devices}"
    return tf.distribute.MirroredStrategy(devices)


def dense_bn(seed: int = 0, *, train: bool = True):
    """Dense + BatchNorm + Dense in this session's Keras (Keras 3; tf_keras under
    TF_USE_LEGACY_KERAS=1), compiled with Adam; one training step (optimizer slots)."""
    keras = keras_for(session_flavour())
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="d"),
                              keras.layers.BatchNormalization(name="bn"),
                              keras.layers.Dense(2, name="o")], name="net")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    if train:
        rng = np.random.default_rng(seed)
        model.train_on_batch(rng.normal(size=(4, 3)).astype("float32"),
                             rng.normal(size=(4, 2)).astype("float32"))
    return model
