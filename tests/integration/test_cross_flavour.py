"""tf_keras checkpoints of code other people wrote, restored into Keras 3 in one call.

The tf_keras side runs in a subprocess (tests/helpers/legacy_writers/tf_keras_models.py) with
TF_USE_LEGACY_KERAS=1, as the legacy code did. These tests need tf_keras and Keras 3 in one
environment (the tf_keras nox session) and skip elsewhere.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import objckpt

from flavours import keras_for
from legacy_models import ListNet, bias_free_mlp
from support import HELPERS, ROOT

WRITER = os.path.join(HELPERS, "legacy_writers", "tf_keras_models.py")
# The applications the issue names; small inputs (96x96) and random weights.
APPLICATIONS = ("ResNet50", "MobileNetV2", "EfficientNetB0", "DenseNet121", "InceptionV3",
                "NASNetMobile")

pytestmark = [pytest.mark.subprocess, pytest.mark.skipif(
    importlib.util.find_spec("tf_keras") is None,
    reason="needs tf_keras beside Keras 3 (the tf_keras nox session)")]


def write(what: str, directory, *extra) -> dict:
    """Runs the writer for one model into `directory`; returns prefix, x, y, moments."""
    return write_many(directory, [what], *extra, nested=False)[what]


def write_many(directory, names, *extra, nested=True) -> dict:
    """Runs the writer once for several models (directory/<name>/ckpt each)."""
    os.makedirs(directory, exist_ok=True)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    flags = ["--nested"] if nested else []
    result = subprocess.run([sys.executable, WRITER, str(directory), *names, *flags, *extra],
                            env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise RuntimeError(f"the tf_keras writer failed ({result.returncode}):\n{tail}")
    out = {}
    for name in names:
        prefix = os.path.join(str(directory), *([name] if nested else []), "ckpt")
        with np.load(prefix + ".npz") as data:
            out[name] = dict(prefix=prefix, **{key: data[key] for key in data.files})
    return out


@pytest.fixture(scope="module")
def keras3():
    return keras_for("keras3", beside_tf_keras=True)


def compiled(keras, model, x):
    model(x)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def assert_moments_by_owner(model, written: dict, names: dict):
    """Every first and second moment equals the one tf_keras kept for the same weight.

    names: id(variable) -> the tf_keras variable name it corresponds to (the oracle,
    independent of how objckpt matched them).
    """
    optimizer = model.optimizer
    checked = 0
    for variable in model.trainable_variables:
        name = names.get(id(objckpt._compat.as_variable(variable)))
        if name is None:
            continue
        index = optimizer._get_variable_index(variable)
        np.testing.assert_array_equal(optimizer._momentums[index].numpy(), written["m:" + name])
        np.testing.assert_array_equal(optimizer._velocities[index].numpy(),
                                      written["v:" + name])
        checked += 1
    return checked


def test_list_and_dict_layers_restore_from_tf_keras(keras3, tmp_path):
    written = write("lists", tmp_path / "lists")
    model = compiled(keras3, ListNet(keras3), written["x"])
    report = objckpt.restore(model, written["prefix"])
    assert not report.missing and not report.unexpected
    np.testing.assert_allclose(np.asarray(model(written["x"])), written["y"], atol=1e-6)
    # tf_keras and Keras 3 name the weights of this code alike (`list_net/block/dense/kernel`)
    names = {id(objckpt._compat.as_variable(v)): v.path for v in model.trainable_weights}
    assert assert_moments_by_owner(model, written, names) == len(model.trainable_weights)
    assert int(model.optimizer.iterations.numpy()) == int(written["iterations"])


def test_adam_moments_never_land_on_another_variable(keras3, tmp_path):
    """tf_keras: 3 bias-free Dense + Adam; Keras 3: 4. Positions differ, owners decide."""
    written = write("order", tmp_path / "order")
    x = written["x"]
    model = compiled(keras3, bias_free_mlp(keras3, 4), x)
    report = objckpt.restore(model, written["prefix"], strict=False, optimizer_state=True)
    names = {id(objckpt._compat.as_variable(getattr(model, f"d{i}").kernel)):
             ("mlp/dense/kernel" if i == 0 else f"mlp/dense_{i}/kernel") for i in range(3)}
    assert assert_moments_by_owner(model, written, names) == 3
    index = model.optimizer._get_variable_index(model.d3.kernel)
    assert not model.optimizer._momentums[index].numpy().any()
    assert report.missing == ("d3/_kernel",)
    assert sum("left as is" in s for s in report.skipped) == 2


@pytest.fixture(scope="module")
def applications(tmp_path_factory):
    directory = tmp_path_factory.mktemp("applications")
    out = write_many(directory, APPLICATIONS)  # one subprocess: one TF import
    out["MobileNetV2+adam"] = write("MobileNetV2", directory / "adam", "--compile")
    return out


@pytest.mark.parametrize("name", APPLICATIONS)
def test_keras_applications_restore_from_tf_keras(keras3, applications, name):
    written = applications[name]
    model = getattr(keras3.applications, name)(input_shape=(96, 96, 3), weights=None)
    report = objckpt.restore(model, written["prefix"])
    assert len(report.restored) == len(objckpt.tree(model)) - sum(
        "random generator" in s for s in report.skipped)
    np.testing.assert_allclose(np.asarray(model(written["x"], training=False)), written["y"],
                               atol=1e-5, rtol=1e-5)


def test_keras_application_with_adam_moves_its_moments(keras3, applications):
    written = applications["MobileNetV2+adam"]
    model = keras3.applications.MobileNetV2(input_shape=(96, 96, 3), weights=None)
    model.compile(optimizer=keras3.optimizers.Adam(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    report = objckpt.restore(model, written["prefix"])
    # two moments per weight, the iteration count and the learning rate
    assert report.plan.strategies()["slot"] == 2 * len(model.trainable_variables) + 2
    names = {}  # the tf_keras name of each weight; DepthwiseConv2D's kernel was renamed
    for layer in model.layers:
        for weight in layer.trainable_weights:
            leaf = weight.path.rsplit("/", 1)[-1]
            if isinstance(layer, keras3.layers.DepthwiseConv2D) and leaf == "kernel":
                leaf = "depthwise_kernel"
            names[id(objckpt._compat.as_variable(weight))] = f"{layer.name}/{leaf}"
    assert assert_moments_by_owner(model, written, names) == len(model.trainable_variables)
    np.testing.assert_allclose(np.asarray(model(written["x"], training=False)), written["y"],
                               atol=1e-5, rtol=1e-5)


def test_structure_reads_renamed_roles_through_the_alias_table(keras3, applications, tmp_path):
    """Without saved names (a checkpoint rewritten from its values alone), MobileNetV2's
    DepthwiseConv2D `depthwise_kernel` still finds Keras 3's `kernel` by structure."""
    written = applications["MobileNetV2"]
    reader = tf.train.load_checkpoint(written["prefix"])
    values = {path: reader.get_tensor(entry.key)  # in the object graph's order
              for path, entry in objckpt.read_tree(written["prefix"]).items()
              if path.startswith("layer_with_weights-")}
    assert any(path.endswith("/depthwise_kernel") for path in values)
    prefix = objckpt.save(objckpt.Snapshot(values), tmp_path / "nameless")
    assert not any(e.name for e in objckpt.read_tree(prefix).values())
    model = keras3.applications.MobileNetV2(input_shape=(96, 96, 3), weights=None)
    report = objckpt.restore(model, prefix)
    assert set(report.plan.strategies()) == {"structure"}
    np.testing.assert_allclose(np.asarray(model(written["x"], training=False)), written["y"],
                               atol=1e-5, rtol=1e-5)


def test_role_alias_table_is_generated_and_current():
    script = os.path.join(HELPERS, "make_role_aliases.py")
    path = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TF_USE_LEGACY_KERAS="0", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path)
    result = subprocess.run([sys.executable, script, "--check"], env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    from objckpt._base.roles import ROLE_ALIASES

    assert ROLE_ALIASES["DepthwiseConv2D"] == {"depthwise_kernel": "kernel"}
    assert ROLE_ALIASES["Normalization"]["mean"] == "adapt_mean"
