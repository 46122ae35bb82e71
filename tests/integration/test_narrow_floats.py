"""bfloat16 and float8 weights as safetensors and Keras 3 weights files ship them, read on every
TF, TF 2.12 included (its NumPy types of bfloat16 and float8 are its own, not ml_dtypes'):
restored bit-exact into variables of their dtype, widened exactly into wider ones (the plan
and the report list the cast), and averaged as the float64 mean rounded once."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt._bundle import fastio as _fastio
from objckpt._formats import safetensors as _st

from flavours import keras_for

ml_dtypes = pytest.importorskip("ml_dtypes")
st_numpy = pytest.importorskip("safetensors.numpy")

FLOAT8 = ("float8_e4m3fn", "float8_e5m2")


def _every_float8(name: str) -> np.ndarray:
    """Every bit pattern of a float8 type (NaNs, infinities, subnormals), 32 x 8."""
    return np.arange(256, dtype=np.uint8).reshape(32, 8).view(getattr(ml_dtypes, name))


def _module(dtype, shapes: dict) -> tf.Module:
    """A tf.Module with a zero variable of `dtype` at each `a/b` path of `shapes`."""
    module = tf.Module()
    for path, shape in shapes.items():
        owner, leaf = path.split("/")
        if not hasattr(module, owner):
            setattr(module, owner, tf.Module())
        setattr(getattr(module, owner), leaf, tf.Variable(tf.zeros(shape, dtype)))
    return module


def _route(route: str, monkeypatch) -> list:
    """Restores take `route` ("read at once" or "streamed": one tensor at a time); returns
    the streamed loader's assign passes, counted."""
    if route == "streamed":
        monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)
    calls = []
    assign = _st._Streamer.assign

    def counted(self):
        calls.append(len(self.entries))
        return assign(self)

    monkeypatch.setattr(_st._Streamer, "assign", counted)
    return calls


@pytest.mark.parametrize("route", ["read at once", "streamed"])
@pytest.mark.parametrize("wide", ["float16", "bfloat16", "float32", "float64"])
def test_float8_safetensors_widen_exactly_into_every_wider_float(wide, route, tmp_path,
                                                                 monkeypatch):
    calls = _route(route, monkeypatch)
    written = {f"{name}/w": _every_float8(name) for name in FLOAT8}
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(written, path)
    casts = {f"{name}/w": f"{name} -> {wide}" for name in FLOAT8}
    obj = _module(wide, {p: v.shape for p, v in written.items()})
    assert objckpt.plan(obj, path).casts == casts
    report = objckpt.restore(obj, path)
    assert report.cast == casts
    assert calls == ([2] if route == "streamed" else [])
    for name in FLOAT8:
        got = getattr(obj, name).w.numpy().astype(np.float64)
        want = written[f"{name}/w"].astype(getattr(ml_dtypes, wide) if wide == "bfloat16"
                                           else wide).astype(np.float64)
        np.testing.assert_array_equal(got, want)  # every value, NaN where NaN
    assert {str(v.dtype) for v in objckpt.read_tree(path).values()} == \
        {"<dtype: 'float8_e4m3fn'>", "<dtype: 'float8_e5m2'>"}


@pytest.mark.parametrize("route", ["read at once", "streamed"])
def test_bfloat16_safetensors_bit_exact_and_widened(route, tmp_path, monkeypatch):
    calls = _route(route, monkeypatch)
    rng = np.random.default_rng(3)
    values = rng.normal(size=(64, 5)).astype(ml_dtypes.bfloat16)
    values.view(np.uint16)[0, :3] = (0x7FC1, 0xFF80, 0x0001)  # a NaN payload, -inf, subnormal
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file({"dense/kernel": values}, path)
    same = _module(tf.bfloat16, {"dense/kernel": values.shape})
    assert objckpt.restore(same, path).cast == {}
    assert same.dense.kernel.numpy().tobytes() == values.tobytes()  # every bit
    wider = _module(tf.float32, {"dense/kernel": values.shape})
    assert objckpt.restore(wider, path).cast == {"dense/kernel": "bfloat16 -> float32"}
    np.testing.assert_array_equal(wider.dense.kernel.numpy(), values.astype(np.float32))
    assert calls == ([1, 1] if route == "streamed" else [])


def test_average_of_bfloat16_safetensors_is_the_float64_mean_rounded_once(tmp_path):
    rng = np.random.default_rng(4)
    members = [rng.normal(size=(16, 3)).astype(ml_dtypes.bfloat16) for _ in range(3)]
    paths = []
    for k, value in enumerate(members):
        paths.append(str(tmp_path / f"m{k}.safetensors"))
        st_numpy.save_file({"dense/kernel": value}, paths[-1])
    weights = (0.2, 0.3, 0.5)
    mean = sum(w * m.astype(np.float64) for w, m in zip(weights, members))
    for dtype, rounded in ((tf.bfloat16, mean.astype(ml_dtypes.bfloat16)),
                           (tf.float32, mean.astype(np.float32))):
        obj = _module(dtype, {"dense/kernel": (16, 3)})
        report = objckpt.average(obj, paths, weights=weights)
        assert report.averaged == ("dense/kernel",)
        assert obj.dense.kernel.numpy().tobytes() == rounded.tobytes(), dtype


def _keras3_weights_file(path: str, kernel: np.ndarray, bias: np.ndarray) -> str:
    """A `.weights.h5` of a Sequential's one Dense as Keras 3 writes it in bfloat16: 2-byte
    opaque datasets with the attribute `dtype="bfloat16"` (written with h5py, so every TF's
    session has it)."""
    with h5py.File(path, "w") as h5:
        for k, value in enumerate((kernel, bias)):
            dataset = h5.create_dataset(f"layers/dense/vars/{k}", data=value.view("V2"))
            dataset.attrs["dtype"] = "bfloat16"
    return path


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras", "keras2"])
def test_bfloat16_keras_weights_file_in_every_flavour(flavour, tmp_path):
    keras = keras_for(flavour)
    rng = np.random.default_rng(5)
    kernel = rng.normal(size=(3, 2)).astype(ml_dtypes.bfloat16)
    bias = rng.normal(size=(2,)).astype(ml_dtypes.bfloat16)
    path = _keras3_weights_file(str(tmp_path / "m.weights.h5"), kernel, bias)
    for dtype in ("bfloat16", "float32"):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, dtype=dtype)])
        report = objckpt.restore(model, path)
        layer = model.layers[-1]
        if dtype == "bfloat16":
            assert report.cast == {}
            assert layer.kernel.numpy().tobytes() == kernel.tobytes()
            assert layer.bias.numpy().tobytes() == bias.tobytes()
        else:
            assert sorted(report.cast.values()) == ["bfloat16 -> float32"] * 2
            np.testing.assert_array_equal(layer.kernel.numpy(), kernel.astype(np.float32))
            np.testing.assert_array_equal(layer.bias.numpy(), bias.astype(np.float32))
