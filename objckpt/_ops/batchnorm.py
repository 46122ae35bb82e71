"""BatchNormalization statistics recomputed from data, as an averaged model needs them.

The mean of N models' weights is a model of its own; the mean of their BatchNorm moving
statistics is not that model's statistics, and its accuracy can collapse (a soup of Keras
models fell from 91% to 2%). SWA's remedy (`bn_update`) runs data through the averaged model
in training mode and keeps, for every BatchNormalization layer, the average of the batch
statistics over all the batches seen. `recalibrate_batchnorm` does that for every flavour:
each layer's momentum is set before each batch so that its own moving-average update yields
the running mean weighted by batch size, then restored.

`warn_averaged_statistics` is the warning the averaging operations give when their result
holds averaged BatchNorm statistics and no recalibration follows
(`errors.BatchNormStatisticsWarning`).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

from objckpt import _compat, errors
from objckpt._base import options as _options

__all__ = ["Recalibration", "batchnorm_layers", "recalibrate_batchnorm",
           "warn_averaged_statistics"]

_BN_CLASSES = ("BatchNormalization", "SyncBatchNormalization", "BatchNormalizationV1",
               "BatchNormalizationV2")


class Recalibration(NamedTuple):
    """What `recalibrate_batchnorm` did.

    Attributes:
      layers: the names of the BatchNormalization layers recomputed, in model order.
      batches: how many batches were run through the model.
      samples: how many examples they held.
    """

    layers: tuple[str, ...]
    batches: int
    samples: int


def batchnorm_layers(obj) -> list:
    """The BatchNormalization layers of a Keras model or layer (any flavour), in order."""
    found, seen = [], set()
    for layer in _compat.keras_layers(obj):
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if any(cls.__name__ in _BN_CLASSES for cls in type(layer).__mro__) and all(
                hasattr(layer, a) for a in ("moving_mean", "moving_variance", "momentum")):
            found.append(layer)
    return found


def _batches(data, batch_size: int):
    """Batches of `data`: an array or tensor is cut into batches of batch_size; a
    tf.data.Dataset or any other iterable is taken as batches."""
    if hasattr(data, "shape") and hasattr(data, "dtype") and not hasattr(data, "element_spec"):
        total = int(data.shape[0])
        for start in range(0, total, batch_size):
            yield data[start:start + batch_size]
        return
    try:
        iterator = iter(data)
    except TypeError:
        raise errors.InvalidArgumentError(
            f"recalibrate_batchnorm: data must be a tf.data.Dataset, an iterable of batches or "
            f"an array of inputs. Received: a {type(data).__name__}. Fix: pass the training "
            "inputs, e.g. train_ds or x_train.") from None
    yield from iterator


def _inputs(batch):
    """The model inputs of a batch, as Keras unpacks it: `x`, `(x,)`, `(x, y)`, `(x, y, w)`."""
    if isinstance(batch, list):
        batch = tuple(batch)
    if isinstance(batch, tuple) and 1 <= len(batch) <= 3:
        return batch[0]
    return batch


def _batch_size(x) -> int:
    import tensorflow as tf

    first = tf.nest.flatten(x)[0]
    shape = getattr(first, "shape", None)
    if shape is None or len(shape) == 0 or shape[0] is None:
        return int(tf.shape(first)[0])
    return int(shape[0])


@errors.about_arguments(obj="model")
def recalibrate_batchnorm(model, data, *, steps: int | None = None,
                          batch_size: int = 32) -> Recalibration:
    """Recomputes the moving mean and variance of every BatchNormalization layer from data.

    Runs the batches of `data` through `model` in training mode (eagerly), after resetting
    each BatchNormalization layer's moving statistics; before each batch every such layer's
    momentum is set to n / (n + b) (n examples seen so far, b in this batch), so that its own
    update leaves the average of the batch statistics weighted by batch size: the mean of the
    batch means (the exact mean of all the examples) and the mean of the batch variances, as
    SWA's `bn_update` computes them. Each batch variance is the one the layer itself uses for
    its moving average (the biased batch variance; tf_keras's fused kernel for 4-D inputs
    uses the Bessel-corrected one). Momentum and `trainable` (a frozen layer is recomputed
    too) are restored afterwards. Other layers run in training mode as well, as in SWA
    (dropout included); their weights are not changed, only random-generator states advance.

    Args:
      model: a built Keras model of any flavour (an averaged model: `swa.averaged_model`, the
        model a soup or `objckpt.average` wrote into).
      data: a tf.data.Dataset or an iterable of batches (`x`, or `(x, y)` / `(x, y, w)` as
        fit takes them: only x is used), or an array (or tensor) of inputs, cut into batches
        of `batch_size`. The training data, without augmentation, suits best.
      steps: use the first this many batches (None: all of them).
      batch_size: the batch size for an array `data`.

    Returns:
      A `Recalibration`: the layers recomputed, the batches and examples used.

    Raises:
      InvalidArgumentError: steps or batch_size is not a positive int, or data yields no batch
        while the model has BatchNormalization layers (their statistics are left as they were).
    """
    if steps is not None:
        _options.check_count("steps", steps, 1, "the number of batches to use")
    _options.check_count("batch_size", batch_size, 1, "examples per batch of an array")
    layers = batchnorm_layers(model)
    if not layers:
        return Recalibration((), 0, 0)
    saved = [(layer, layer.momentum, layer.trainable) for layer in layers]
    before = [(layer.moving_mean.numpy(), layer.moving_variance.numpy()) for layer in layers]
    seen = batches = 0
    try:
        for layer in layers:
            layer.trainable = True
            layer.moving_mean.assign(_zeros_like(layer.moving_mean))
            layer.moving_variance.assign(_zeros_like(layer.moving_variance) + 1)
        for batch in _batches(data, batch_size):
            if steps is not None and batches >= steps:
                break
            x = _inputs(batch)
            size = _batch_size(x)
            if size == 0:
                continue
            for layer in layers:
                layer.momentum = seen / (seen + size)
            model(x, training=True)
            seen += size
            batches += 1
        if batches == 0:
            for layer, (mean, variance) in zip(layers, before):
                layer.moving_mean.assign(mean)
                layer.moving_variance.assign(variance)
            raise errors.InvalidArgumentError(
                f"recalibrate_batchnorm: data yielded no batch, so the statistics of "
                f"{len(layers)} BatchNormalization layer(s) cannot be recomputed; they are left "
                "as they were. Fix: pass the training inputs (a non-empty dataset or array).")
    finally:
        for layer, momentum, trainable in saved:
            layer.momentum = momentum
            if layer.trainable != trainable:
                layer.trainable = trainable
    return Recalibration(tuple(layer.name for layer in layers), batches, seen)


def _zeros_like(variable):
    import tensorflow as tf

    return tf.zeros(variable.shape, variable.dtype)


def warn_averaged_statistics(model, what: str, fix: str, *, stacklevel: int = 2) -> list:
    """Warns (`errors.BatchNormStatisticsWarning`) when `model`, an average, has BatchNorm
    layers, whose moving statistics are then averages too; returns those layers.

    Args:
      model: the averaged model.
      what: the subject of the message, e.g. "SWA: the averaged model".
      fix: what to do, e.g. "call objckpt.recalibrate_batchnorm(model, train_data)".
      stacklevel: as `warnings.warn`'s, counted from the caller of this function.
    """
    layers = batchnorm_layers(model)
    if layers:
        names = ", ".join(layer.name for layer in layers[:5]) + (", ..." if len(layers) > 5
                                                                 else "")
        warnings.warn(errors.BatchNormStatisticsWarning(
            f"{what} holds averaged BatchNorm moving statistics ({len(layers)} layer(s): "
            f"{names}). The mean of the members' statistics is not the statistics of the "
            "averaged weights, and accuracy can collapse (a known soup fell from 91% to 2%). "
            f"Fix: {fix}."), stacklevel=stacklevel + 1)
    return layers
