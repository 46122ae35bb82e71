"""Legacy checkpoints for migration tests: TF1 `Saver` (name-based) and Keras 2 (object-based).

Both are written by a subprocess (tests/helpers/legacy_writers/) so that the writing TF/Keras is set
up exactly like the legacy code was (TF1 graph mode; TF_USE_LEGACY_KERAS=1) whatever the test
process imports. A subprocess costs a TF import (~5 s): share what they write across a test
session with `cached_tf1_checkpoint` / `cached_keras2_checkpoint` and `tmp_path_factory`.

TF1 (`write_tf1_checkpoint`): under `variable_scope(scope)`, names

    {scope}/conv/kernel (3,3,3,4)  {scope}/conv/bias (4,)
    {scope}/bn/gamma  {scope}/bn/beta  {scope}/bn/moving_mean  {scope}/bn/moving_variance (4,)
    {scope}/dense/kernel (144,5)  {scope}/dense/bias (5,)
    global_step ()  and with adam: beta1_power (), beta2_power (),
    {scope}/<each trainable>/Adam, {scope}/<each trainable>/Adam_1 (its shape)

`tf1_rewrite(keras)` and `tf1_rewrite_module()` compute the same function in TF2.

Keras 2 (`write_keras2_checkpoint`): `conv_net(keras2, kind).save_weights(prefix)`; object
paths `layer_with_weights-N/...`, optimizer slots `optimizer/_variables/N`.

This module imports neither pytest nor any Keras at import time (the writers import it).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
WRITERS = os.path.join(HERE, "legacy_writers")

# The seed of the fixed input `x` of both writers (independent of the checkpoint's seed).
X_SEED = 1234
# Exit status of the Keras 2 writer where no Keras 2 is installed.
KERAS2_UNAVAILABLE_EXIT = 3

TF1_LAYERS = {
    "conv": {"kernel": (3, 3, 3, 4), "bias": (4,)},
    "bn": {"gamma": (4,), "beta": (4,), "moving_mean": (4,), "moving_variance": (4,)},
    "dense": {"kernel": (144, 5), "bias": (5,)},
}
# "conv/kernel" -> shape: the TF1 names below the scope, the object paths of the module.
TF1_SHAPES = {f"{layer}/{attr}": shape
              for layer, attrs in TF1_LAYERS.items() for attr, shape in attrs.items()}
TF1_TRAINABLE = tuple(name for name in TF1_SHAPES if "/moving_" not in name)


class LegacyKerasUnavailable(RuntimeError):
    """No Keras 2 here: tf_keras is not installed and TF >= 2.16. Tests skip on it."""


def tf1_names(scope: str = "model_001", *, adam: bool = True) -> list:
    """The sorted variable names `write_tf1_checkpoint` saves (as `tf.train.list_variables`)."""
    names = [f"{scope}/{name}" for name in TF1_SHAPES] + ["global_step"]
    if adam:
        names += ["beta1_power", "beta2_power"]
        names += [f"{scope}/{name}/{slot}" for name in TF1_TRAINABLE for slot in ("Adam", "Adam_1")]
    return sorted(names)


def _run(script: str, args: list, *, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, os.path.join(WRITERS, script), *args],
                          env=full_env, capture_output=True, text=True, check=False)


def _fail(what: str, result: subprocess.CompletedProcess):
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
    raise RuntimeError(f"{what} failed with exit status {result.returncode}:\n{tail}")


def _read_npz(path: str) -> dict:
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    for array in arrays.values():
        array.flags.writeable = False
    return arrays


def write_tf1_checkpoint(directory, *, scope: str = "model_001", seed: int = 0,
                         adam: bool = True) -> dict:
    """Trains the TF1 net 3 steps in graph mode and saves it with `tf.compat.v1.train.Saver`.

    Returns dict(prefix=str, x=(4,8,8,3) float32, y=(4,5) float32 inference output,
    names=sorted list of saved variable names). Also written: {directory}/checkpoint (TF's
    state file, so the directory is a source too), {prefix}.meta and {prefix}.npz (x, y).
    """
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    args = [directory, "--scope", scope, "--seed", str(seed)] + ([] if adam else ["--no-adam"])
    result = _run("tf1_saver.py", args)
    if result.returncode != 0:
        _fail("the TF1 Saver writer", result)
    prefix = os.path.join(directory, "model.ckpt")
    data = _read_npz(prefix + ".npz")
    names = [name for name, _ in tf.train.list_variables(prefix)]
    return dict(prefix=prefix, x=data["x"], y=data["y"], names=names)


def legacy_keras_available() -> bool:
    """Whether a Keras 2 subprocess can run: tf_keras installed, or TF < 2.16 (tf.keras)."""
    if importlib.util.find_spec("tf_keras") is not None:
        return True
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    return (major, minor) < (2, 16)


def legacy_keras():
    """The Keras 2 the writer uses, imported in this process: tf_keras, else `tf.keras` where
    TF < 2.16, else None.

    Not `import keras` on TF 2.12: its `keras.optimizers.Adam` is the legacy OptimizerV2
    (slots as `.OPTIMIZER_SLOT`), while `tf.keras.optimizers.Adam` is the new optimizer that
    the checkpoint's `optimizer/_variables/N` come from.
    """
    try:
        return importlib.import_module("tf_keras")
    except ImportError:
        pass
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    return tf.keras if (major, minor) < (2, 16) else None


def write_keras2_checkpoint(directory, *, kind: str = "sequential", seed: int = 0) -> dict:
    """Fits `conv_net(keras2, kind)` 2 epochs with Adam in a TF_USE_LEGACY_KERAS=1 subprocess.

    Writes `model.save_weights(prefix)` (TF format) and {prefix}.npz. Returns dict(prefix=str,
    x=(4,8,8,3), y=model.predict(x) (4,3), m and v=the Adam slots of conv1/kernel (3,3,3,4),
    iterations=int64 scalar array (8)). Raises LegacyKerasUnavailable without a Keras 2.
    """
    if kind not in ("sequential", "functional"):
        raise ValueError(f"kind must be 'sequential' or 'functional', not {kind!r}")
    if not legacy_keras_available():
        raise LegacyKerasUnavailable(
            f"no Keras 2: tf_keras is not installed and TF {tf.__version__} >= 2.16; "
            "pip install tf_keras")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    result = _run("keras2_weights.py", [directory, "--kind", kind, "--seed", str(seed)],
                  env={"TF_USE_LEGACY_KERAS": "1"})
    if result.returncode == KERAS2_UNAVAILABLE_EXIT:
        raise LegacyKerasUnavailable(result.stderr.strip().splitlines()[-1])
    if result.returncode != 0:
        _fail("the Keras 2 writer", result)
    prefix = os.path.join(directory, "weights")
    return dict(prefix=prefix, **_read_npz(prefix + ".npz"))


_CACHE: dict = {}


def _cached(key, tmp_path_factory, write, **kwargs) -> dict:
    if key not in _CACHE:
        try:
            _CACHE[key] = write(tmp_path_factory.mktemp(key[0]), **kwargs)
        except LegacyKerasUnavailable as error:
            _CACHE[key] = error
    found = _CACHE[key]
    if isinstance(found, Exception):
        raise found
    return dict(found)


def cached_tf1_checkpoint(tmp_path_factory, **kwargs) -> dict:
    """`write_tf1_checkpoint` once per process and keyword arguments (read-only arrays)."""
    key = ("tf1", *sorted(kwargs.items()))
    return _cached(key, tmp_path_factory, write_tf1_checkpoint, **kwargs)


def assert_tf1_adam_state_restored(report, model, prefix) -> list:
    """The TF1 net's Adam state (write_tf1_checkpoint: 6 weights, 3 steps) restored into a
    Keras model: m and v of each weight and the step matched by the `slot` strategy, each
    variable holding its entry's value, iterations 3. Returns the slot matches."""
    import objckpt

    slots = [m for m in report.plan.matches if m.strategy == "slot"]
    assert len(slots) == 2 * 6 + 1, report.plan.describe()  # m and v of 6 weights, the step
    reader = tf.train.load_checkpoint(prefix)
    tree = objckpt.tree(model)
    for match in slots:
        np.testing.assert_array_equal(tree[match.target].numpy(), reader.get_tensor(match.source))
    assert int(model.optimizer.iterations.numpy()) == 3
    return slots


def cached_keras2_checkpoint(tmp_path_factory, **kwargs) -> dict:
    """`write_keras2_checkpoint` once per process and keyword arguments; raises
    LegacyKerasUnavailable (each time) without a Keras 2."""
    key = ("keras2", *sorted(kwargs.items()))
    return _cached(key, tmp_path_factory, write_keras2_checkpoint, **kwargs)


def skip_without_legacy_keras():
    """Skips the calling test where no Keras 2 subprocess can run."""
    if not legacy_keras_available():
        import pytest

        pytest.skip(f"no Keras 2: tf_keras is not installed and TF {tf.__version__} >= 2.16")


# ---------------------------------------------------------------------------------------------
# Models (Keras 3 `keras`, tf_keras, Keras 2 `tf.keras`/`keras` 2.x: pass the module).


def tf1_rewrite(keras):
    """The TF1 net as a built Keras Sequential: layers named conv, bn, dense."""
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, name="conv"),
        keras.layers.BatchNormalization(name="bn", epsilon=1e-3, momentum=0.99),
        keras.layers.ReLU(),
        keras.layers.Flatten(),
        keras.layers.Dense(5, name="dense"),
    ], name="tf1_rewrite")
    return model


class _Conv(tf.Module):
    def __init__(self, name="conv"):
        super().__init__(name=name)
        self.kernel = tf.Variable(tf.random.stateless_normal((3, 3, 3, 4), seed=(1, 1)))
        self.bias = tf.Variable(tf.zeros((4,)))

    def __call__(self, x):
        return tf.nn.conv2d(x, self.kernel, strides=1, padding="VALID") + self.bias


class _BatchNorm(tf.Module):
    def __init__(self, name="bn", epsilon=1e-3):
        super().__init__(name=name)
        self.epsilon = epsilon
        self.gamma = tf.Variable(tf.ones((4,)))
        self.beta = tf.Variable(tf.zeros((4,)))
        self.moving_mean = tf.Variable(tf.zeros((4,)), trainable=False)
        self.moving_variance = tf.Variable(tf.ones((4,)), trainable=False)

    def __call__(self, x):
        return tf.nn.batch_normalization(x, self.moving_mean, self.moving_variance,
                                         self.beta, self.gamma, self.epsilon)


class _Dense(tf.Module):
    def __init__(self, name="dense"):
        super().__init__(name=name)
        self.kernel = tf.Variable(tf.random.stateless_normal((144, 5), seed=(1, 2)))
        self.bias = tf.Variable(tf.zeros((5,)))

    def __call__(self, x):
        return tf.matmul(x, self.kernel) + self.bias


class TF1Net(tf.Module):
    """The TF1 net as nested tf.Modules; object paths conv/kernel, bn/gamma, ..., dense/bias
    (the TF1 names without the scope). Inference only (BN on the moving stats)."""

    def __init__(self):
        super().__init__(name="tf1_net")
        self.conv = _Conv()
        self.bn = _BatchNorm()
        self.dense = _Dense()

    def __call__(self, x):
        x = tf.nn.relu(self.bn(self.conv(tf.convert_to_tensor(x))))
        return self.dense(tf.reshape(x, [-1, 144]))


def tf1_rewrite_module() -> TF1Net:
    """The TF1 net as a plain tf.Module (see TF1Net)."""
    return TF1Net()


def tf1_variables(obj) -> dict:
    """TF1 name below the scope ("conv/kernel", ...) -> variable of a tf1_rewrite model or
    a tf1_rewrite_module."""
    if isinstance(obj, TF1Net):
        layers = {"conv": obj.conv, "bn": obj.bn, "dense": obj.dense}
    else:
        layers = {name: obj.get_layer(name) for name in TF1_LAYERS}
    return {f"{layer}/{attr}": getattr(layers[layer], attr)
            for layer, attrs in TF1_LAYERS.items() for attr in attrs}


def load_tf1_by_hand(obj, prefix: str, scope: str = "model_001"):
    """Assigns a TF1 checkpoint's values into a tf1_rewrite model/module by name, no objckpt."""
    reader = tf.train.load_checkpoint(prefix)
    for name, variable in tf1_variables(obj).items():
        variable.assign(reader.get_tensor(f"{scope}/{name}"))


def conv_net(keras, kind: str = "sequential"):
    """A built conv net on (8,8,3): conv1, bn1, ReLU, MaxPooling2D (no weights), conv2 (same
    padding), Flatten, out (3 units). kind: "sequential" or "functional"."""
    def layers():
        return [
            keras.layers.Conv2D(4, 3, name="conv1"),
            keras.layers.BatchNormalization(name="bn1"),
            keras.layers.ReLU(name="relu"),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Conv2D(6, 2, name="conv2", padding="same"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(3, name="out"),
        ]

    if kind == "sequential":
        return keras.Sequential([keras.Input((8, 8, 3)), *layers()], name="conv_net")
    if kind == "functional":
        inputs = keras.Input((8, 8, 3), name="images")
        x = inputs
        for layer in layers():
            x = layer(x)
        return keras.Model(inputs, x, name="conv_net")
    raise ValueError(f"kind must be 'sequential' or 'functional', not {kind!r}")
