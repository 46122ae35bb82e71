"""TF1 name-based checkpoints written by tf-slim, and their keras.applications counterparts.

Each case is a network built from tf-slim's own layers (`slim.conv2d`, `slim.separable_conv2d`,
`slim.batch_norm`, under tf-slim's `arg_scope`), the way TensorFlow's model garden defines it
(`models/research/slim/nets/mobilenet_v1.py`: the same scopes, depths and arg scope), with
every variable given a seeded random value, saved by `tf.compat.v1.train.Saver` into
`tests/fixtures/slim/<case>/model.ckpt`, and its logits on a fixed input saved beside it
(`oracle.safetensors`). The Keras model of the same structure is a keras.applications
network; `rules(case)` is the mapping between them, written by hand, and the test restores
the checkpoint through it into the Keras model and compares the logits with tf-slim's.
tests/helpers/proposal_figures.py measures `objckpt.plan`'s proposals against that mapping.

Writing the fixtures needs tf-slim (`python3 -m pip install tf-slim`; 1.1.0 wrote the
committed ones, on TensorFlow 2.21): run this file as a script. Reading them does not.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures", "slim")


class Case(NamedTuple):
    net: str  # the model garden's name of the network
    keras: str  # its keras.applications counterpart, as called
    size: int  # the input's height and width
    classes: int
    alpha: float  # the depth multiplier (tf-slim) and alpha (Keras)


CASES = {
    "mobilenet_v1_025": Case("mobilenet_v1", "MobileNet", 64, 10, 0.25),
    "mobilenet_v2_035": Case("mobilenet_v2", "MobileNetV2", 64, 10, 0.35),
}


def prefix(name: str) -> str:
    return os.path.join(FIXTURES, name, "model.ckpt")


def oracle(name: str) -> dict:
    """{"input": the fixed input (NHWC), "logits": tf-slim's logits on it}."""
    from safetensors.numpy import load_file

    return load_file(os.path.join(FIXTURES, name, "oracle.safetensors"))


def keras_model(name: str, keras=None):
    """The keras.applications model of the case, logits out, in the Keras flavour `keras`
    (the `keras` or `tf_keras` module; Keras 3 by default)."""
    if keras is None:
        import keras
    case = CASES[name]
    return getattr(keras.applications, case.keras)(
        input_shape=(case.size, case.size, 3), alpha=case.alpha, weights=None,
        classes=case.classes, classifier_activation=None)


def rules(name: str, keras=None) -> list:
    """The mapping from the tf-slim checkpoint's names to the Keras model's variable names
    (a depthwise kernel is `kernel` in Keras 3, `depthwise_kernel` in Keras 2 and tf_keras)."""
    if keras is None:
        import keras
    dw = "kernel" if keras.__version__.startswith("3") else "depthwise_kernel"
    bn = r"BatchNorm/(gamma|beta|moving_mean|moving_variance)$"
    if CASES[name].net == "mobilenet_v2":
        from objckpt.rules import Reshape

        case = CASES[name]
        return [
            (r"^MobilenetV2/Conv/weights$", "Conv1/kernel"),
            (r"^MobilenetV2/Conv/" + bn, r"bn_Conv1/\1"),
            (r"^MobilenetV2/expanded_conv/depthwise/depthwise_weights$",
             f"expanded_conv_depthwise/{dw}"),
            (r"^MobilenetV2/expanded_conv/(depthwise|project)/weights$",
             r"expanded_conv_\1/kernel"),
            (r"^MobilenetV2/expanded_conv/(depthwise|project)/" + bn,
             r"expanded_conv_\1_BN/\2"),
            (r"^MobilenetV2/expanded_conv_(\d+)/depthwise/depthwise_weights$",
             rf"block_\1_depthwise/{dw}"),
            (r"^MobilenetV2/expanded_conv_(\d+)/(expand|project)/weights$",
             r"block_\1_\2/kernel"),
            (r"^MobilenetV2/expanded_conv_(\d+)/(expand|depthwise|project)/" + bn,
             r"block_\1_\2_BN/\3"),
            (r"^MobilenetV2/Conv_1/weights$", "Conv_1/kernel"),
            (r"^MobilenetV2/Conv_1/" + bn, r"Conv_1_bn/\1"),
            (r"^MobilenetV2/Logits/Conv2d_1c_1x1/weights$", "predictions/kernel",
             Reshape((1, 1, 1280, case.classes), (1280, case.classes))),
            (r"^MobilenetV2/Logits/Conv2d_1c_1x1/biases$", "predictions/bias"),
        ]
    return [
        (r"^MobilenetV1/Conv2d_0/weights$", "conv1/kernel"),
        (r"^MobilenetV1/Conv2d_0/" + bn, r"conv1_bn/\1"),
        (r"^MobilenetV1/Conv2d_(\d+)_depthwise/depthwise_weights$", rf"conv_dw_\1/{dw}"),
        (r"^MobilenetV1/Conv2d_(\d+)_depthwise/" + bn, r"conv_dw_\1_bn/\2"),
        (r"^MobilenetV1/Conv2d_(\d+)_pointwise/weights$", r"conv_pw_\1/kernel"),
        (r"^MobilenetV1/Conv2d_(\d+)_pointwise/" + bn, r"conv_pw_\1_bn/\2"),
        (r"^MobilenetV1/Logits/Conv2d_1c_1x1/weights$", "conv_preds/kernel"),
        (r"^MobilenetV1/Logits/Conv2d_1c_1x1/biases$", "conv_preds/bias"),
    ]


# (stride, depth) of each layer after the first (a 3x3 conv, stride 2, depth 32): depthwise
# 3x3 then pointwise 1x1, as the model garden's MOBILENETV1_CONV_DEFS.
_SEPARABLE = ((1, 64), (2, 128), (1, 128), (2, 256), (1, 256), (2, 512), (1, 512), (1, 512),
              (1, 512), (1, 512), (1, 512), (2, 1024), (1, 1024))


def _legacy_layers() -> None:
    """tf-slim's layers are TF's `tensorflow.python.layers`, which load `tf_keras.
    legacy_tf_layers`; tf_keras 2.16 and later keep them under `tf_keras.src`."""
    import importlib

    try:
        importlib.import_module("tf_keras.legacy_tf_layers")
    except ImportError:
        for name in ("", ".base", ".convolutional", ".core", ".normalization", ".pooling",
                     ".variable_scope_shim", ".migration_utils"):
            sys.modules["tf_keras.legacy_tf_layers" + name] = importlib.import_module(
                "tf_keras.src.legacy_tf_layers" + name)


def _mobilenet_v1(images, case: Case):
    """The model garden's mobilenet_v1 (inference), with tf-slim's layers: the logits."""
    import tensorflow.compat.v1 as tf1

    _legacy_layers()
    import tf_slim as slim

    def depth(d):
        return max(int(d * case.alpha), 8)

    bn = {"center": True, "scale": True, "decay": 0.9997, "epsilon": 0.001,
          "is_training": False}
    with tf1.variable_scope("MobilenetV1"):
        with slim.arg_scope([slim.conv2d, slim.separable_conv2d], padding="SAME",
                            normalizer_fn=slim.batch_norm, activation_fn=tf1.nn.relu6), \
                slim.arg_scope([slim.batch_norm], **bn):
            net = slim.conv2d(images, depth(32), [3, 3], stride=2, scope="Conv2d_0")
            for i, (stride, d) in enumerate(_SEPARABLE, start=1):
                net = slim.separable_conv2d(net, None, [3, 3], depth_multiplier=1,
                                            stride=stride, scope=f"Conv2d_{i}_depthwise")
                net = slim.conv2d(net, depth(d), [1, 1], stride=1,
                                  scope=f"Conv2d_{i}_pointwise")
        with tf1.variable_scope("Logits"):
            net = tf1.reduce_mean(net, [1, 2], keepdims=True)  # the avg pool over the map
            net = slim.conv2d(net, case.classes, [1, 1], activation_fn=None,
                              normalizer_fn=None, scope="Conv2d_1c_1x1")
            return tf1.squeeze(net, [1, 2])


def _make_divisible(v, divisor=8, min_value=None):
    """The model garden's (and keras.applications') rounding of a depth."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


# (stride, depth, expansion) of each inverted residual block, as the model garden's V2_DEF.
_INVERTED = ((1, 16, 1), (2, 24, 6), (1, 24, 6), (2, 32, 6), (1, 32, 6), (1, 32, 6),
             (2, 64, 6), (1, 64, 6), (1, 64, 6), (1, 64, 6), (1, 96, 6), (1, 96, 6),
             (1, 96, 6), (2, 160, 6), (1, 160, 6), (1, 160, 6), (1, 320, 6))


def _mobilenet_v2(images, case: Case):
    """The model garden's mobilenet_v2 (inference; `finegrain_classification_mode=True`, as
    keras.applications keeps the last 1280 channels), with tf-slim's layers: the logits.
    Scopes as the model garden's: `Conv`, `expanded_conv[_N]/{expand,depthwise,project}`,
    `Conv_1`, `Logits/Conv2d_1c_1x1`."""
    import tensorflow.compat.v1 as tf1

    _legacy_layers()
    import tf_slim as slim

    bn = {"center": True, "scale": True, "decay": 0.997, "epsilon": 0.001,
          "is_training": False}
    with tf1.variable_scope("MobilenetV2"):
        with slim.arg_scope([slim.conv2d, slim.separable_conv2d], padding="SAME",
                            normalizer_fn=slim.batch_norm, activation_fn=tf1.nn.relu6), \
                slim.arg_scope([slim.batch_norm], **bn):
            net = slim.conv2d(images, _make_divisible(32 * case.alpha), [3, 3], stride=2,
                              scope="Conv")
            for i, (stride, depth, expansion) in enumerate(_INVERTED):
                with tf1.variable_scope("expanded_conv" + (f"_{i}" if i else "")):
                    inputs, given = net, net.shape[3]
                    inner = _make_divisible(given * expansion)
                    if inner > given:
                        net = slim.conv2d(net, inner, [1, 1], scope="expand")
                    net = slim.separable_conv2d(net, None, [3, 3], depth_multiplier=1,
                                                stride=stride, scope="depthwise")
                    out = _make_divisible(depth * case.alpha)
                    net = slim.conv2d(net, out, [1, 1], activation_fn=None, scope="project")
                    if stride == 1 and given == out:
                        net = net + inputs
            net = slim.conv2d(net, 1280, [1, 1], stride=1, scope="Conv_1")
        with tf1.variable_scope("Logits"):
            net = tf1.reduce_mean(net, [1, 2], keepdims=True)
            net = slim.conv2d(net, case.classes, [1, 1], activation_fn=None,
                              normalizer_fn=None, scope="Conv2d_1c_1x1")
            return tf1.squeeze(net, [1, 2])


def write(name: str) -> None:
    import numpy as np
    import tensorflow as tf
    import tensorflow.compat.v1 as tf1
    from safetensors.numpy import save_file

    case = CASES[name]
    rng = np.random.default_rng(0)
    feed = rng.uniform(-1, 1, (2, case.size, case.size, 3)).astype("float32")
    os.makedirs(os.path.dirname(prefix(name)), exist_ok=True)
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, (None, case.size, case.size, 3))
        logits = {"mobilenet_v1": _mobilenet_v1, "mobilenet_v2": _mobilenet_v2}[case.net](
            images, case)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for variable in tf1.global_variables():  # every value its own, BN's too
                shape = variable.shape.as_list()
                last = variable.op.name.rsplit("/", 1)[-1]
                if last in ("gamma", "moving_variance"):
                    value = rng.uniform(0.5, 1.5, shape)
                elif last in ("beta", "moving_mean", "biases"):
                    value = rng.normal(0, 0.1, shape)
                else:  # weights: He-normal, so the activations stay in range
                    fan_in = int(np.prod(shape[:-1])) if "depthwise" not in last else \
                        int(np.prod(shape[:2]))
                    value = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
                variable.load(value.astype("float32"), session)
            tf1.train.Saver(tf1.global_variables()).save(
                session, prefix(name), write_meta_graph=False, write_state=False)
            out = session.run(logits, {images: feed})
    save_file({"input": feed, "logits": out.astype("float32")},
              os.path.join(FIXTURES, name, "oracle.safetensors"))
    print(f"{name}: {prefix(name)} written; logits {out.shape}")


if __name__ == "__main__":
    for name in sys.argv[1:] or CASES:
        write(name)
