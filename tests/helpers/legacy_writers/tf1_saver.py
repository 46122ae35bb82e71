"""Writes a TF1 name-based checkpoint with `tf.compat.v1.train.Saver` (run as a subprocess).

Usage: python tf1_saver.py DIRECTORY --scope model_001 --seed 0 [--no-adam]

Graph mode, `tf.compat.v1.get_variable` only (no `tf.compat.v1.layers`, which Keras 3
removes on TF >= 2.16). The net, on x of shape (N, 8, 8, 3):

    conv  (3x3, 3 -> 4, VALID, stride 1)  {scope}/conv/kernel (3,3,3,4), {scope}/conv/bias (4,)
    bn    (epsilon 1e-3, momentum 0.99)   {scope}/bn/gamma, beta, moving_mean, moving_variance (4,)
    relu, flatten (6*6*4 = 144)
    dense (144 -> 5)                      {scope}/dense/kernel (144,5), {scope}/dense/bias (5,)

Trains 3 steps (Adam with slots `.../Adam`, `.../Adam_1`, `beta1_power`, `beta2_power`, or
plain SGD with --no-adam) with a `global_step`, BN in training mode updating the moving stats
like Keras (moving -= (moving - batch_stat) * (1 - momentum)) through UPDATE_OPS. Saves
DIRECTORY/model.ckpt and DIRECTORY/model.ckpt.npz with the fixed input `x` (4,8,8,3) and the
inference output `y` (BN on the moving stats).

Initial values come from NumPy with the seed and the training data too, so the same seed
gives bit-identical checkpoints and different seeds different ones. `x` does not depend on
the seed (one input for every checkpoint, e.g. for ensembles).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

EPSILON = 1e-3
MOMENTUM = 0.99
X_SEED = 1234


def initial_values(seed):
    rng = np.random.default_rng(seed)

    def glorot(shape, fan_in, fan_out):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=shape).astype("float32")

    return {
        "conv/kernel": glorot((3, 3, 3, 4), 27, 36),
        "conv/bias": (0.1 * rng.normal(size=(4,))).astype("float32"),
        "bn/gamma": (1.0 + 0.1 * rng.normal(size=(4,))).astype("float32"),
        "bn/beta": (0.1 * rng.normal(size=(4,))).astype("float32"),
        "bn/moving_mean": (0.1 * rng.normal(size=(4,))).astype("float32"),
        "bn/moving_variance": (1.0 + 0.1 * np.abs(rng.normal(size=(4,)))).astype("float32"),
        "dense/kernel": glorot((144, 5), 144, 5),
        "dense/bias": (0.1 * rng.normal(size=(5,))).astype("float32"),
    }, rng


def net(x, v, *, training):
    h = tf.nn.conv2d(x, v["conv/kernel"], strides=1, padding="VALID") + v["conv/bias"]
    if training:
        mean, variance = tf.nn.moments(h, axes=[0, 1, 2])
        for name, stat in (("bn/moving_mean", mean), ("bn/moving_variance", variance)):
            moving = v[name]
            update = moving.assign_sub((moving - stat) * (1.0 - MOMENTUM))
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
    else:
        mean, variance = v["bn/moving_mean"], v["bn/moving_variance"]
    h = tf.nn.batch_normalization(h, mean, variance, v["bn/beta"], v["bn/gamma"], EPSILON)
    h = tf.nn.relu(h)
    h = tf.reshape(h, [-1, 144])
    return tf.matmul(h, v["dense/kernel"]) + v["dense/bias"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--scope", default="model_001")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-adam", dest="adam", action="store_false")
    args = parser.parse_args()

    init, rng = initial_values(args.seed)
    train_x = rng.normal(size=(8, 8, 8, 3)).astype("float32")
    train_y = rng.normal(size=(8, 5)).astype("float32")
    x_fixed = np.random.default_rng(X_SEED).normal(size=(4, 8, 8, 3)).astype("float32")

    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 8, 8, 3), name="x")
        target = tf.compat.v1.placeholder(tf.float32, (None, 5), name="target")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.variable_scope(args.scope):
            variables = {}
            for name, value in init.items():
                layer, attr = name.split("/")
                with tf.compat.v1.variable_scope(layer):
                    trainable = not attr.startswith("moving_")
                    variables[name] = tf.compat.v1.get_variable(
                        attr, initializer=tf.constant(value), trainable=trainable)
        loss = tf.reduce_mean(tf.square(net(x, variables, training=True) - target))
        if args.adam:
            optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
        else:
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01)
        with tf.control_dependencies(tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train = optimizer.minimize(loss, global_step=global_step)
        y = net(x, variables, training=False)
        saver = tf.compat.v1.train.Saver()
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train, {x: train_x, target: train_y})
            y_value = sess.run(y, {x: x_fixed})
            prefix = saver.save(sess, os.path.join(args.directory, "model.ckpt"))
    np.savez(prefix + ".npz", x=x_fixed, y=y_value)
    print(prefix)


if __name__ == "__main__":
    main()
