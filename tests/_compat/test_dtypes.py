"""ml_dtypes' bfloat16 and float8 arrays as this TF's NumPy types (`_compat.dtypes`): a view of
the same bits (no copy), which TF takes on every TF (2.12's own NumPy types included), its
casts equal to ml_dtypes'; a dtype this TF has none of is a typed error naming the fix."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from objckpt import _compat, errors

NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _every_bit_pattern(name: str) -> np.ndarray:
    """Every value of an ml_dtypes type (NaNs, infinities, subnormals), as ml_dtypes'."""
    width = np.dtype(getattr(ml_dtypes, name)).itemsize
    bits = np.arange(1 << (8 * width), dtype=np.uint16 if width == 2 else np.uint8)
    return bits.reshape(-1, 8).view(getattr(ml_dtypes, name))


@pytest.mark.parametrize("name", NAMES)
def test_an_ml_dtypes_array_reaches_tf_as_a_view_of_its_bits(name):
    array = _every_bit_pattern(name)
    seen = _compat.tf_array(array, "t")
    assert np.shares_memory(seen, array)  # no copy
    assert seen.dtype == _compat.numpy_dtype(name) == np.dtype(tf.as_dtype(name).as_numpy_dtype)
    assert _compat.tf_dtype(array.dtype) == tf.as_dtype(name) == _compat.tf_dtype(name)
    tensor = tf.constant(seen)
    assert tensor.dtype.name == name and tensor.shape == array.shape
    assert tensor.numpy().tobytes() == array.tobytes()
    # TF's casts of it equal ml_dtypes' (every value of the narrow type, NaNs included)
    np.testing.assert_array_equal(tf.cast(tensor, tf.float32).numpy(),
                                  array.astype(np.float32))
    if name == "bfloat16":  # TF 2.12 has no CPU kernel to assign a float8 variable
        variable = tf.Variable(seen)
        assert variable.dtype.name == name and variable.numpy().tobytes() == array.tobytes()


def test_numpy_arrays_and_other_values_pass_unchanged():
    floats = np.arange(6, dtype=np.float32)
    assert _compat.tf_array(floats) is floats and _compat.tf_array(3.5) == 3.5
    assert _compat.tf_dtype(np.float16) == tf.float16 == _compat.tf_dtype("float16")
    assert _compat.tf_dtype(tf.bfloat16) is tf.bfloat16


def test_the_casting_policy_reads_ml_dtypes_values():
    """`misfit` and `cast_of` take ml_dtypes' NumPy values on every TF (TF 2.12 included)."""
    value = np.zeros((3, 2), ml_dtypes.bfloat16)
    assert _compat.misfit(value, ((3, 2), "float32")) == ""
    assert _compat.cast_of(value, ((3, 2), "float32")) == "bfloat16 -> float32"
    assert _compat.misfit(((3, 2), np.dtype(ml_dtypes.float8_e5m2)), ((3, 2), "float16")) == ""
    assert _compat.misfit(((3, 2), "float32"), value) == "dtype"


def _one_tf_lacks():
    """An ml_dtypes type this ml_dtypes has and this TF has no dtype for (ml_dtypes versions
    differ: TF 2.16's has no float8_e8m0fnu)."""
    for name in ("float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn", "float8_e4m3b11fnuz",
                 "int2", "int4"):
        found = getattr(ml_dtypes, name, None)
        if found is None:
            continue
        try:
            tf.as_dtype(np.dtype(found))
        except TypeError:
            return name
    pytest.skip("every ml_dtypes type here has a TF dtype")


def test_a_dtype_no_tf_has_is_refused_naming_the_fix():
    name = _one_tf_lacks()
    array = np.zeros(4, getattr(ml_dtypes, name))
    with pytest.raises(errors.InvalidArgumentError,
                       match=rf"`scale/w` has dtype {name}, which TensorFlow .* has no "
                             r"dtype for\. Fix: .*astype\('float32'\)"):
        _compat.tf_array(array, "`scale/w`")
    with pytest.raises(errors.InvalidArgumentError, match=name):
        _compat.tf_dtype(array.dtype)
