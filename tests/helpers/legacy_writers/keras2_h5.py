"""Writes Keras 2 / tf_keras HDF5 files (run as a subprocess).

Usage: TF_USE_LEGACY_KERAS=1 python keras2_h5.py DIRECTORY

Builds `h5_net(keras)` with tf_keras (or TF <= 2.15's tf.keras) twice: compiled with Adam
(DIRECTORY/new: slots saved as `Adam/m/conv/kernel:0`, the step as `iteration:0`) and with
`optimizers.legacy.Adam` (DIRECTORY/legacy: `Adam/conv/kernel/m:0`, `Adam/iter:0`); each is
trained one step, then written as w.h5 (`model.save_weights`), m.h5 (`model.save`, optimizer
included) and out.npz with `x`, `y = model(x, training=False)`, `iterations`, and
`m<i>`/`v<i>`: the Adam moments of the i-th trainable variable (the oracle: the same
architecture lists its variables in the same order).

Exits with status 3 when no Keras 2 is installed (no tf_keras and TF >= 2.16). Importing
this module changes no environment variable: tests/_formats/test_legacyh5.py imports `h5_net`
from it.
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

UNAVAILABLE_EXIT = 3


def h5_net(keras):
    """Conv2D, BatchNormalization, Flatten and a nested Sequential `head` (two Dense)."""
    inputs = keras.Input((6, 6, 3), name="images")
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    head = keras.Sequential([keras.layers.Dense(5, activation="relu", name="hidden"),
                             keras.layers.Dense(2, name="logits")], name="head")
    return keras.Model(inputs, head(x), name="h5_net")


def legacy_keras():
    try:
        import tf_keras
        return tf_keras
    except ImportError:
        pass
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    return tf.keras if (major, minor) < (2, 16) else None


def moments(optimizer, variable):
    """(m, v) of a trained variable, from either optimizer API (the oracle)."""
    if hasattr(optimizer, "get_slot") and hasattr(optimizer, "get_slot_names"):
        return optimizer.get_slot(variable, "m"), optimizer.get_slot(variable, "v")
    index = optimizer._index_dict[optimizer._var_key(variable)]
    return optimizer._momentums[index], optimizer._velocities[index]


def write(keras, directory, legacy):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 6, 6, 3)).astype("float32")
    model = h5_net(keras)
    adam = keras.optimizers.legacy.Adam if legacy else keras.optimizers.Adam
    model.compile(optimizer=adam(0.01), loss="mse")
    model.fit(x, rng.normal(size=(4, 2)).astype("float32"), batch_size=4, epochs=1, verbose=0)
    os.makedirs(directory, exist_ok=True)
    model.save_weights(os.path.join(directory, "w.h5"))
    model.save(os.path.join(directory, "m.h5"))
    extra = {}
    for i, variable in enumerate(model.trainable_variables):
        m, v = moments(model.optimizer, variable)
        extra[f"m{i}"], extra[f"v{i}"] = m.numpy(), v.numpy()
    np.savez(os.path.join(directory, "out.npz"), x=x, y=np.asarray(model(x, training=False)),
             iterations=np.asarray(model.optimizer.iterations.numpy()), **extra)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    args = parser.parse_args()
    keras = legacy_keras()
    if keras is None:
        print(f"no Keras 2: tf_keras is not installed and TF {tf.__version__} >= 2.16",
              file=sys.stderr)
        sys.exit(UNAVAILABLE_EXIT)
    for variant in ("new", "legacy"):
        write(keras, os.path.join(args.directory, variant), variant == "legacy")
    print(args.directory)


if __name__ == "__main__":
    main()
