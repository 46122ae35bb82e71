"""ml_dtypes' NumPy types (bfloat16, the float8s) and the ones this TF takes.

From TF 2.13 on, TF's NumPy types of `tf.bfloat16` and of the float8 dtypes are ml_dtypes'.
TF 2.12 has its own NumPy types for them, other types with the same layout: `tf.as_dtype`,
`tf.constant` and `tf.Variable` refuse ml_dtypes' arrays there. safetensors, h5py and NumPy
users hand objckpt ml_dtypes' arrays; this module is the one conversion between the two, a
view of the same bits either way (no copy):

- `tf_dtype(dtype)`: `tf.as_dtype`, also for ml_dtypes' types on a TF whose NumPy types are
  others (a dtype no TF has, such as float8_e8m0fnu: a typed error naming the fix);
- `numpy_dtype(dtype)`: the NumPy type this TF uses for a dtype;
- `tf_array(array)`: an array as this TF's NumPy type of its dtype (what TF takes);
- `from_tf(array)`: the other way, TF's array as ml_dtypes' type (what the TF-free writers,
  averages and safetensors take).

On TF >= 2.13 `tf_array` and `from_tf` return their argument: behaviour there is unchanged.
The float8 dtypes have no `tf.float8_*` attribute in any TF (2.12 included): `tf.as_dtype`
names them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from objckpt import errors

__all__ = ["from_tf", "numpy_dtype", "tf_array", "tf_dtype"]

# The ml_dtypes types TF knows by name (TF 2.12 and later; its NumPy types before 2.13 are
# its own).
_ML_NAMES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2"})


def _ml_name(dtype) -> str:
    """The name of a NumPy dtype of ml_dtypes' (or TF 2.12's) kind, or ""."""
    if isinstance(dtype, (str, tf.DType)):
        return ""
    try:
        found = np.dtype(dtype)
    except TypeError:
        return ""
    return found.name if found.kind == "V" else ""


def tf_dtype(dtype, what: str = "") -> tf.DType:
    """`tf.as_dtype(dtype)`, also for ml_dtypes' bfloat16 and float8 types on a TF whose NumPy
    types are other ones (TF 2.12).

    Args:
      dtype: a `tf.DType`, a NumPy or ml_dtypes dtype or type, or a dtype name.
      what: the tensor it is the dtype of, for the error.

    Raises:
      InvalidArgumentError: an ml_dtypes type TensorFlow has no dtype for.
    """
    name = _ml_name(dtype)
    if not name:
        return tf.as_dtype(dtype)
    try:
        return tf.as_dtype(name)
    except TypeError:
        raise errors.InvalidArgumentError(
            f"{what or 'A value'} has dtype {name}, which TensorFlow {tf.__version__} has no "
            "dtype for. Fix: pass it cast to a dtype TensorFlow has (`array.astype('float32')` "
            "holds every value of an 8-bit float).") from None


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy type this TF uses for `dtype` (any form `tf_dtype` takes): on TF 2.12 TF's own
    bfloat16 and float8 types, from TF 2.13 on ml_dtypes'."""
    return np.dtype(tf_dtype(dtype).as_numpy_dtype)


def tf_array(array, what: str = ""):
    """`array` as this TF's NumPy type of its dtype, which `tf.constant` and `tf.Variable`
    take: `array` itself, or a view of the same bits (no copy) where TF's type is another
    (ml_dtypes' bfloat16 and float8 on TF 2.12). Arrays of NumPy's own dtypes (and anything
    not a NumPy array) are returned as they are.

    Args:
      array: a NumPy or ml_dtypes array.
      what: the tensor it holds, for the error.

    Raises:
      InvalidArgumentError: an ml_dtypes type TensorFlow has no dtype for.
    """
    if not isinstance(array, np.ndarray) or array.dtype.kind != "V":
        return array  # NumPy's own dtypes (ml_dtypes' are of kind "V")
    wanted = numpy_dtype(tf_dtype(array.dtype, what))
    return array if array.dtype == wanted else array.view(wanted)


def from_tf(array):
    """TF's NumPy array of a bfloat16 or float8 value as ml_dtypes' type (a view, no copy)
    where the two differ (TF 2.12); any other array as it is."""
    if not isinstance(array, np.ndarray) or array.dtype.kind != "V" \
            or array.dtype.name not in _ML_NAMES:
        return array
    import ml_dtypes

    wanted = np.dtype(getattr(ml_dtypes, array.dtype.name))
    return array if array.dtype == wanted else array.view(wanted)
