"""ml_dtypes' NumPy types (bfloat16, the float8s) and the ones this TF takes.

From TF 2.13 on, TF's NumPy types of `tf.bfloat16` and of the float8 dtypes are ml_dtypes'.
TF 2.12 has its own NumPy types for them, other types with the same layout: `tf.as_dtype`,
`tf.constant` and `tf.Variable` refuse ml_dtypes' arrays there. safetensors, h5py and NumPy
users hand objckpt ml_dtypes' arrays; this module is the one conversion to what TF takes, a
view of the same bits (no copy):

- `tf_dtype(dtype)`: `tf.as_dtype`, also for ml_dtypes' types on a TF whose NumPy types are
  others (a dtype this TF has none of, such as float8_e8m0fnu: a typed error naming the fix);
- `numpy_dtype(dtype)`: the NumPy type this TF uses for a dtype;
- `tf_array(array)`: an array as this TF's NumPy type of its dtype (what TF takes).

The other way needs no conversion: what objckpt writes from TF's arrays (safetensors,
averages) it writes from their bytes, or casts with NumPy, which casts TF 2.12's types as it
casts ml_dtypes'. On TF >= 2.13 `tf_array` returns its argument: behaviour there is
unchanged. The float8 dtypes have no `tf.float8_*` attribute in any TF (2.12 included):
`tf.as_dtype` names them. TF 2.12 has no CPU kernel to assign a float8 variable.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from objckpt import errors

__all__ = ["numpy_dtype", "tf_array", "tf_dtype"]


def _ml_name(dtype) -> str:
    """The name of a NumPy dtype that NumPy does not define (ml_dtypes' types, TF 2.12's own
    bfloat16 and float8), or "" (NumPy's own, names, `tf.DType`s). Not by `kind`: some of
    ml_dtypes' types are of kind "V", others of kind "f"."""
    if isinstance(dtype, (str, tf.DType)):
        return ""
    try:
        found = np.dtype(dtype)
    except TypeError:
        return ""
    return "" if found.type.__module__ == "numpy" else found.name


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
    if not isinstance(array, np.ndarray) or not _ml_name(array.dtype):
        return array  # NumPy's own dtypes
    wanted = numpy_dtype(tf_dtype(array.dtype, what))
    return array if array.dtype == wanted else array.view(wanted)

