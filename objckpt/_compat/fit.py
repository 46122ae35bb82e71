"""Whether a value fits a variable: the one rule every assignment and check follows.

`misfit(value, variable)` says what keeps `value` (a tensor, or the `(shape, dtype)` of
one, as metadata gives it) from being assigned to `variable` (a variable of any flavour or
a distributed value: a MirroredVariable, a SyncOnRead variable, whose own shape and dtype
are those of every replica): "shape", "dtype", or "" when it fits. `fits` is its boolean.

Shapes are never cast: a value fits when its shape is compatible with the variable's (equal
when both are fully known; a variable of relaxed shape, such as tf_keras lookups'
`idf_weights`, takes any value it accepts; a value traced without every dimension, such as a
rule's transform traced from metadata, is checked again when it is read). Dtypes must be
equal today; DESIGN.md's casting policy (lossless widening by default, lossy casts only on
request) is a change to `_dtype_fits` and to the options its callers pass, nowhere else.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["fits", "misfit"]


def _spec(value) -> tuple:
    """`(shape, dtype)` of a tensor, a variable or a `(shape, dtype)` pair."""
    if isinstance(value, tuple) and len(value) == 2:
        shape, dtype = value
    else:
        shape, dtype = value.shape, value.dtype
    dtype = tf.as_dtype(dtype)
    return tf.TensorShape(shape), dtype.base_dtype


def _dtype_fits(dtype: tf.DType, wanted: tf.DType) -> bool:
    """Whether a value of `dtype` may be assigned to a variable of `wanted` (the casting
    policy's one place: today only the same dtype)."""
    return dtype == wanted


def misfit(value, variable) -> str:
    """What keeps `value` from being assigned to `variable`: "shape", "dtype", or "".

    Args:
      value: a tensor, a variable, or a `(shape, dtype)` pair (metadata: an index entry,
        a plan's source spec, a transform's traced output).
      variable: the variable it would be assigned to (any flavour, distributed values
        included), or a `(shape, dtype)` pair of one.
    """
    shape, dtype = _spec(value)
    wanted_shape, wanted_dtype = _spec(variable)
    if not wanted_shape.is_compatible_with(shape):
        return "shape"
    if not _dtype_fits(dtype, wanted_dtype):
        return "dtype"
    return ""


def fits(value, variable) -> bool:
    """Whether `value` may be assigned to `variable` (see `misfit`)."""
    return not misfit(value, variable)
