"""Whether a value fits a variable: the one rule every assignment and check follows.

`misfit(value, variable)` says what keeps `value` (a tensor, or the `(shape, dtype)` of
one, as metadata gives it) from being assigned to `variable` (a variable of any flavour or
a distributed value: a MirroredVariable, a SyncOnRead variable, whose own shape and dtype
are those of every replica): "shape", "dtype", or "" when it fits. `fits` is its boolean.

Shapes are never cast: a value fits when its shape is compatible with the variable's (equal
when both are fully known; a variable of relaxed shape, such as tf_keras lookups'
`idf_weights`, takes any value it accepts; a value traced without every dimension, such as a
rule's transform traced from metadata, is checked again when it is read).

Dtypes follow the one casting policy (`_dtype_fits`): the same dtype fits; a lossless
widening cast (bfloat16, float16 or float8 to a wider float, float32 to float64, an integer
to a wider integer that holds all its values) fits by default (`cast="lossless"`); a lossy
cast between numeric dtypes (narrowing floats or integers, float to integer, float32 to
bfloat16) fits only when the caller asks for it (`cast="lossy"`). `cast_of` names the cast
a value needs ("bfloat16 -> float32", "" for none) and `cast_value` applies it: the fetch
stage casts every value it produces for assignment, so every door agrees.
"""

from __future__ import annotations

import tensorflow as tf

from objckpt import errors
from objckpt._compat.dtypes import tf_dtype

__all__ = ["CASTS", "cast_of", "cast_value", "check_cast", "fits", "lossless", "misfit"]

# The values of every reading function's `cast` argument.
CASTS = ("lossless", "lossy")

# Floats by (exponent bits, mantissa bits): a float widens losslessly into one with at
# least as many of both.
_FLOATS = {"float8_e4m3fn": (4, 3), "float8_e5m2": (5, 2), "float8_e4m3fnuz": (4, 3),
           "float8_e5m2fnuz": (5, 2), "float8_e4m3b11fnuz": (4, 3), "float16": (5, 10),
           "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
# Integers by (signed, bits).
_INTS = {"int8": (True, 8), "int16": (True, 16), "int32": (True, 32), "int64": (True, 64),
         "uint8": (False, 8), "uint16": (False, 16), "uint32": (False, 32),
         "uint64": (False, 64)}


def _spec(value) -> tuple:
    """`(shape, dtype)` of a tensor, a variable, a NumPy array or a `(shape, dtype)` pair."""
    if isinstance(value, tuple) and len(value) == 2:
        shape, dtype = value
    else:
        shape, dtype = value.shape, value.dtype
    dtype = tf_dtype(dtype)  # ml_dtypes' types too, whatever NumPy types this TF uses
    return tf.TensorShape(shape), dtype.base_dtype


def check_cast(cast) -> str:
    """Validates a reading function's `cast` argument ("lossless" or "lossy")."""
    if isinstance(cast, str) and cast in CASTS:
        return cast
    raise errors.InvalidArgumentError(
        f"cast must be 'lossless' or 'lossy'. Received: cast={cast!r}. 'lossless' (default) "
        "casts values to a wider dtype of their variable (bfloat16 -> float32, int8 -> "
        "int32) and refuses narrowing ones; 'lossy' also casts to narrower dtypes (float32 "
        "-> bfloat16, float -> int). Fix: pass cast='lossless' or cast='lossy'.")


def lossless(dtype: tf.DType, wanted: tf.DType) -> bool:
    """Whether every value of `dtype` is held exactly by `wanted` (a widening cast)."""
    if dtype == wanted:
        return True
    a, b = _FLOATS.get(dtype.name), _FLOATS.get(wanted.name)
    if a is not None and b is not None:
        # float8 types without inf (fn/fnuz) widen into every wider float exactly
        return a[0] <= b[0] and a[1] <= b[1]
    a, b = _INTS.get(dtype.name), _INTS.get(wanted.name)
    if a is not None and b is not None:
        if a[0] == b[0]:
            return a[1] <= b[1]
        return not a[0] and b[0] and a[1] < b[1]  # unsigned into a wider signed
    return (dtype.name, wanted.name) == ("complex64", "complex128")


def _numeric(dtype: tf.DType) -> bool:
    return (dtype.name in _FLOATS or dtype.name in _INTS
            or dtype.name in ("complex64", "complex128"))


def _dtype_fits(dtype: tf.DType, wanted: tf.DType, cast: str = "lossless") -> bool:
    """Whether a value of `dtype` may be assigned to a variable of `wanted` (the casting
    policy's one place): the same dtype or a lossless widening always, any other numeric
    cast (complex only into complex) only with `cast="lossy"`."""
    if lossless(dtype, wanted):
        return True
    return (cast == "lossy" and _numeric(dtype) and _numeric(wanted)
            and dtype.is_complex == wanted.is_complex)


def misfit(value, variable, cast: str = "lossless") -> str:
    """What keeps `value` from being assigned to `variable`: "shape", "dtype", or "".

    Args:
      value: a tensor, a variable, or a `(shape, dtype)` pair (metadata: an index entry,
        a plan's source spec, a transform's traced output).
      variable: the variable it would be assigned to (any flavour, distributed values
        included), or a `(shape, dtype)` pair of one.
      cast: "lossless" (default: widening casts fit) or "lossy" (any numeric cast fits).
    """
    shape, dtype = _spec(value)
    wanted_shape, wanted_dtype = _spec(variable)
    if not wanted_shape.is_compatible_with(shape):
        return "shape"
    if not _dtype_fits(dtype, wanted_dtype, cast):
        return "dtype"
    return ""


def fits(value, variable, cast: str = "lossless") -> bool:
    """Whether `value` may be assigned to `variable` (see `misfit`)."""
    return not misfit(value, variable, cast)


def cast_of(value, variable) -> str:
    """The cast `value` needs to be assigned to `variable`, as plans and reports show it
    ("bfloat16 -> float32"), or "" when the dtypes are equal."""
    _, dtype = _spec(value)
    _, wanted = _spec(variable)
    return "" if dtype == wanted else f"{dtype.name} -> {wanted.name}"


def cast_value(value, variable):
    """`value` cast to `variable`'s dtype (itself when it has it already)."""
    wanted = _spec(variable)[1]
    return value if value.dtype.base_dtype == wanted else tf.cast(value, wanted)
