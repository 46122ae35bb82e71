"""Writes a Keras 2 (tf_keras, or TF <= 2.15's tf.keras) checkpoint (run as a subprocess).

Usage: TF_USE_LEGACY_KERAS=1 python keras2_weights.py DIRECTORY --kind sequential --seed 0

Builds `legacy.conv_net(keras, kind)`, compiles it with Adam and MSE, fits 2 epochs on fixed
random data (16 samples, batch size 4, shuffle=False: 8 optimizer steps), then writes
`model.save_weights(DIRECTORY/weights)` (TF checkpoint format) and DIRECTORY/weights.npz with
`x` (4,8,8,3; the same for every seed), `y = model.predict(x)`, the Adam slots `m` and `v` of
the first Conv2D kernel (conv1/kernel) and the optimizer's `iterations`.

Exits with status 3 when no Keras 2 is installed (no tf_keras and TF >= 2.16).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import tensorflow as tf

from legacy import KERAS2_UNAVAILABLE_EXIT, X_SEED, conv_net


def legacy_keras():
    try:
        import tf_keras
        return tf_keras
    except ImportError:
        pass
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    if (major, minor) < (2, 16):
        return tf.keras
    return None


def slot(optimizer, name, variable_path):
    """The optimizer variable named like `Adam/m/conv1/kernel:0` (or `m/conv1/kernel:0`)."""
    suffix = f"/{name}/{variable_path}"
    found = [v for v in optimizer.variables
             if ("/" + v.name.split(":")[0]).endswith(suffix)]
    if len(found) != 1:
        names = [v.name for v in optimizer.variables]
        raise SystemExit(f"expected one optimizer variable ending in {suffix}; have {names}")
    return found[0].numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--kind", default="sequential", choices=("sequential", "functional"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    keras = legacy_keras()
    if keras is None:
        print(f"no Keras 2: tf_keras is not installed and TF {tf.__version__} >= 2.16",
              file=sys.stderr)
        sys.exit(KERAS2_UNAVAILABLE_EXIT)
    if hasattr(tf.config.experimental, "enable_op_determinism"):
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(args.seed)

    rng = np.random.default_rng(args.seed)
    train_x = rng.normal(size=(16, 8, 8, 3)).astype("float32")
    train_y = rng.normal(size=(16, 3)).astype("float32")
    x = np.random.default_rng(X_SEED).normal(size=(4, 8, 8, 3)).astype("float32")

    model = conv_net(keras, args.kind)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(train_x, train_y, epochs=2, batch_size=4, shuffle=False, verbose=0)
    y = model.predict(x, verbose=0)
    prefix = os.path.join(args.directory, "weights")
    model.save_weights(prefix)
    optimizer = model.optimizer
    np.savez(prefix + ".npz", x=x, y=y,
             m=slot(optimizer, "m", "conv1/kernel"), v=slot(optimizer, "v", "conv1/kernel"),
             iterations=np.asarray(optimizer.iterations.numpy()))
    print(prefix)


if __name__ == "__main__":
    main()
