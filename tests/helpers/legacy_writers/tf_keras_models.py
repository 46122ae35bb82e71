"""Writes tf_keras checkpoints of code other people write (run as a subprocess).

Usage: TF_USE_LEGACY_KERAS=1 python tf_keras_models.py DIRECTORY WHAT [WHAT ...]
       [--nested] [--compile]

Each WHAT is one of
- `lists`: `legacy_models.ListNet` (blocks in a list, heads in a dict), trained with Adam;
- `order`: `legacy_models.bias_free_mlp(keras, 3)`, trained with Adam;
- an application name (`MobileNetV2`, `ResNet50`, ...): `keras.applications.<name>` at
  96x96 with random weights (BatchNorm statistics and Normalization moments randomised
  too); with --compile, also one Adam step.
Writes `tf.train.Checkpoint(root=model).write(DIRECTORY/ckpt)` (DIRECTORY/WHAT/ckpt with
--nested) and ckpt.npz beside it with
`x`, `y = model(x)` and, when an optimizer ran, `iterations` and `m:<variable name>` /
`v:<variable name>` for each trained variable (`<variable name>` without `:0`).

Exits with status 3 when tf_keras is not installed.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import tensorflow as tf

UNAVAILABLE_EXIT = 3


def _randomise(model, seed):
    """Random values for every float variable (moving variances kept positive)."""
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        if not variable.dtype.is_floating:
            continue
        value = rng.normal(scale=0.05, size=variable.shape)
        if "variance" in variable.name:
            value = 1.0 + np.abs(value)
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))


def _moments(model):
    out = {"iterations": np.asarray(model.optimizer.iterations.numpy())}
    optimizer = model.optimizer
    for variable in model.trainable_variables:
        index = optimizer._index_dict[optimizer._var_key(variable)]
        name = variable.name.split(":")[0]
        out[f"m:{name}"] = optimizer._momentums[index].numpy()
        out[f"v:{name}"] = optimizer._velocities[index].numpy()
    return out


def write(keras, what, directory, compile_):
    import legacy_models

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    extra = {}
    if what == "lists":
        model = legacy_models.ListNet(keras)
        x = rng.normal(size=(4, 6)).astype("float32")
        train = True
    elif what == "order":
        model = legacy_models.bias_free_mlp(keras, 3)
        x = rng.normal(size=(4, 5)).astype("float32")
        train = True
    else:
        model = getattr(keras.applications, what)(input_shape=(96, 96, 3), weights=None)
        x = rng.uniform(size=(2, 96, 96, 3)).astype("float32")
        _randomise(model, 2)
        train = compile_
    if train:
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        y_train = np.asarray(model(x[:1]))
        targets = rng.normal(size=(len(x), *y_train.shape[1:])).astype("float32")
        model.fit(x, targets, epochs=1, batch_size=len(x), verbose=0)
        extra = _moments(model)
    y = np.asarray(model(x, training=False))
    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "ckpt")
    tf.train.Checkpoint(root=model).write(prefix)
    np.savez(prefix + ".npz", x=x, y=y, **extra)
    print(prefix)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("what", nargs="+")
    parser.add_argument("--nested", action="store_true")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    try:
        import tf_keras as keras
    except ImportError:
        print("tf_keras is not installed", file=sys.stderr)
        sys.exit(UNAVAILABLE_EXIT)
    for what in args.what:
        directory = os.path.join(args.directory, what) if args.nested else args.directory
        write(keras, what, directory, args.compile)


if __name__ == "__main__":
    main()
