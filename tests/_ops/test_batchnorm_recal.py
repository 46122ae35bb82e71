"""objckpt.recalibrate_batchnorm and the BatchNorm warning of averages.

The recomputed statistics are checked against NumPy (batch statistics averaged by batch size)
in every Keras flavour; the failure it exists for is reproduced: two differently trained
CNNs with BatchNorm averaged with their moving statistics lose most of their accuracy, and
recalibration gives it back.
"""

import warnings

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.callbacks import SWA

from flavours import KERAS_FLAVOURS, keras_for, session_flavour


def dense_bn(keras, momentum=0.7):
    inputs = keras.Input((3,))
    z = keras.layers.Dense(4, name="dense")(inputs)
    h = keras.layers.BatchNormalization(momentum=momentum, name="bn")(z)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(h))
    model.compile(optimizer="sgd", loss="mse")
    return model


def conv_bn(keras):
    inputs = keras.Input((4, 4, 2))
    z = keras.layers.Conv2D(3, 1, name="conv")(inputs)
    return keras.Model(inputs, keras.layers.BatchNormalization(name="bn")(z))


def expected(z: np.ndarray, sizes, axes, ddof) -> tuple:
    """The batch-size weighted mean of each batch's mean and variance of z (float64)."""
    means, variances, start = [], [], 0
    for size in sizes:
        batch = z[start:start + size]
        means.append(batch.mean(axis=axes))
        count = batch.size // batch.shape[-1]
        variances.append(batch.var(axis=axes) * count / (count - ddof))
        start += size
    weights = np.array(sizes, np.float64) / sum(sizes)
    return (np.tensordot(weights, np.stack(means), 1),
            np.tensordot(weights, np.stack(variances), 1))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_statistics_are_the_batch_statistics_averaged_by_batch_size(flavour):
    keras = keras_for(flavour)
    keras.utils.set_random_seed(1)
    model = dense_bn(keras)
    bn = model.get_layer("bn")
    bn.trainable = False  # a frozen layer is recomputed too, and stays frozen
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(21, 3)).astype("float32")
    kernel, bias = (w.numpy().astype(np.float64) for w in model.get_layer("dense").weights)
    head = [w.numpy() for w in model.get_layer("head").weights]
    report = objckpt.recalibrate_batchnorm(model, x, batch_size=8)
    assert report == (("bn",), 3, 21)
    mean, variance = expected(x.astype(np.float64) @ kernel + bias, [8, 8, 5], 0, ddof=0)
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-5, atol=1e-6)
    assert bn.momentum == 0.7 and bn.trainable is False
    assert all((a == w.numpy()).all() for a, w in zip(head, model.get_layer("head").weights))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_images_from_a_dataset_with_labels_and_steps(flavour):
    import tensorflow as tf

    keras = keras_for(flavour)
    keras.utils.set_random_seed(2)
    model = conv_bn(keras)
    x = np.random.default_rng(1).normal(-1.0, 2.0, size=(12, 4, 4, 2)).astype("float32")
    y = np.zeros((12, 1), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)  # (x, y) batches: x is used
    report = objckpt.recalibrate_batchnorm(model, data, steps=2)  # the first 8 examples
    assert (report.batches, report.samples) == (2, 8)
    kernel, bias = (w.numpy().astype(np.float64) for w in model.get_layer("conv").weights)
    z = x[:8].astype(np.float64) @ kernel[0, 0] + bias
    # The variance each layer averages is its own: the biased batch variance, but tf_keras's
    # fused kernel (4-D inputs) gives the Bessel-corrected one.
    ddof = 0 if flavour == "keras3" else 1
    mean, variance = expected(z, [4, 4], (0, 1, 2), ddof)
    bn = model.get_layer("bn")
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-5, atol=1e-6)
    assert bn.momentum == 0.99


def test_a_model_without_batchnorm_and_empty_data():
    keras = keras_for(session_flavour())
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert objckpt.recalibrate_batchnorm(plain, np.zeros((4, 3), "float32")) == ((), 0, 0)
    model = dense_bn(keras)
    bn = model.get_layer("bn")
    bn.moving_mean.assign(np.full(4, 5.0, "float32"))
    with pytest.raises(errors.InvalidArgumentError, match="yielded no batch"):
        objckpt.recalibrate_batchnorm(model, [])
    assert (bn.moving_mean.numpy() == 5.0).all() and bn.moving_variance.numpy().tolist() == [1] * 4
    with pytest.raises(errors.InvalidArgumentError, match="steps must be an int >= 1"):
        objckpt.recalibrate_batchnorm(model, np.zeros((4, 3), "float32"), steps=0)
    with pytest.raises(errors.InvalidArgumentError, match="data must be a tf.data.Dataset"):
        objckpt.recalibrate_batchnorm(model, 3)


# --- the averaged-statistics failure, reproduced and fixed -----------------------------------

CLASSES = 4


def synthetic(seed: int, count: int):
    """Noisy copies of one fixed template per class (8x8x1), labels in turn."""
    templates = np.random.default_rng(0).normal(size=(CLASSES, 8, 8, 1))
    labels = np.arange(count) % CLASSES
    noise = np.random.default_rng(seed).normal(size=(count, 8, 8, 1)) * 1.5
    return (templates[labels] + noise).astype("float32"), labels


def cnn(keras):
    """Four Conv2D + BatchNorm + ReLU blocks, pooled, and a linear head."""
    inputs = keras.Input((8, 8, 1))
    h = inputs
    for _ in range(4):
        h = keras.layers.Conv2D(8, 3, padding="same")(h)
        h = keras.layers.BatchNormalization(momentum=0.8)(h)
        h = keras.layers.ReLU()(h)
    logits = keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inputs, logits)
    model.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def accuracy(model, x, labels) -> float:
    return float(np.mean(np.argmax(model.predict(x, batch_size=256, verbose=0), -1) == labels))


def rescaled(keras, model, scale: float) -> None:
    """The same function at other scales: each BatchNorm's gamma and beta times `scale`, the
    kernel after it divided by `scale` (ReLU and pooling commute with a positive factor).
    Runs trained with other weight decay or learning rates end at such different scales."""
    layers = [layer for layer in model.layers
              if isinstance(layer, (keras.layers.BatchNormalization, keras.layers.Conv2D,
                                    keras.layers.Dense))]
    for norm, following in zip(layers, layers[1:]):
        if isinstance(norm, keras.layers.BatchNormalization):
            norm.gamma.assign(norm.gamma * scale)
            norm.beta.assign(norm.beta * scale)
            following.kernel.assign(following.kernel / scale)


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_averaged_statistics_collapse_accuracy_and_recalibration_restores_it(flavour):
    """Two CNNs fine-tuned from one base (data in other orders), the second at other scales
    of its BatchNorm outputs and the kernels after them (the same function): their average,
    moving statistics included, falls to about chance; recalibrated, it scores like them."""
    keras = keras_for(flavour)
    x, labels = synthetic(1, 512)
    test_x, test_labels = synthetic(2, 256)
    keras.utils.set_random_seed(0)
    base = cnn(keras)
    base.fit(x, labels, epochs=2, batch_size=32, shuffle=False, verbose=0)
    members = []
    for seed in (1, 2):  # fine-tuned from one base on the data in different orders
        member = cnn(keras)
        objckpt.restore(member, objckpt.snapshot(base))
        keras.utils.set_random_seed(seed)
        order = np.random.default_rng(seed).permutation(len(x))
        member.fit(x[order], labels[order], epochs=8, batch_size=32, shuffle=False, verbose=0)
        members.append(member)
    before = accuracy(members[1], test_x, test_labels)
    rescaled(keras, members[1], 100.0)
    scores = [accuracy(m, test_x, test_labels) for m in members]
    assert scores[1] == before and min(scores) >= 0.8, scores

    soup = cnn(keras)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.BatchNormStatisticsWarning)
        objckpt.average(soup, [objckpt.snapshot(m) for m in members], optimizer_state=False)
    averaged = accuracy(soup, test_x, test_labels)
    assert averaged <= min(scores) - 0.4 and averaged <= 0.5, (averaged, scores)  # chance: 0.25

    report = objckpt.recalibrate_batchnorm(soup, x, batch_size=64)
    assert len(report.layers) == 4 and report.samples == len(x)
    recalibrated = accuracy(soup, test_x, test_labels)
    assert recalibrated >= min(scores) - 0.05, (recalibrated, scores)


# --- the warning ------------------------------------------------------------------------------


def test_swa_warns_without_recalibration_and_recalibrates_with_data():
    keras = keras_for(session_flavour())
    x = np.random.default_rng(3).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(4).normal(size=(16, 2)).astype("float32")
    keras.utils.set_random_seed(0)
    model = dense_bn(keras)
    swa = SWA()
    with pytest.warns(errors.BatchNormStatisticsWarning,
                      match=r"SWA: the averaged model .* holds averaged BatchNorm moving "
                            r"statistics \(1 layer\(s\): bn\).*recalibrate_batchnorm"):
        model.fit(x, y, epochs=2, batch_size=4, shuffle=False, verbose=0, callbacks=[swa])
    assert swa.recalibrated is None

    keras.utils.set_random_seed(0)
    model = dense_bn(keras)
    batches = [x[i:i + 4] for i in range(0, 16, 4)]
    swa = SWA(recalibrate=batches, recalibrate_steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.BatchNormStatisticsWarning)
        model.fit(x, y, epochs=2, batch_size=4, shuffle=False, verbose=0, callbacks=[swa])
    assert swa.recalibrated == (("bn",), 3, 12)
    averaged_bn = swa.averaged_model.get_layer("bn")
    statistics = averaged_bn.moving_mean.numpy(), averaged_bn.moving_variance.numpy()
    objckpt.recalibrate_batchnorm(swa.averaged_model, batches, steps=3)  # the same again
    np.testing.assert_array_equal(averaged_bn.moving_mean.numpy(), statistics[0])
    np.testing.assert_array_equal(averaged_bn.moving_variance.numpy(), statistics[1])


def test_no_warning_for_a_model_without_batchnorm():
    keras = keras_for(session_flavour())
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.BatchNormStatisticsWarning)
        model.fit(np.zeros((8, 3), "float32"), np.zeros((8, 2), "float32"), epochs=2,
                  verbose=0, callbacks=[SWA()])
