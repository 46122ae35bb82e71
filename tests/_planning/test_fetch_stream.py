"""The fetch stage's route choice for sources read one tensor at a time (safetensors): a
loader above `_fastio.STREAM_BYTES`, values fetched whole below it and for distributed
variables; every streamed value passes `converted` just before it is assigned."""

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt._bundle import fastio as _fastio
from objckpt._planning import fetch as _fetch
from objckpt._planning import match as _match
from objckpt._planning import sources as _sources
from objckpt._planning import tree as _tree

st_numpy = pytest.importorskip("safetensors.numpy")


def _module(rows: int) -> tf.Module:
    module = tf.Module()
    module.kernel = tf.Variable(tf.zeros((rows, 1024)))
    module.bias = tf.Variable(tf.zeros((1024,)))
    return module


def _file(tmp_path, rows: int) -> tuple[str, dict]:
    rng = np.random.default_rng(rows)
    values = {"kernel": rng.standard_normal((rows, 1024), dtype=np.float32),
              "bias": rng.standard_normal(1024, dtype=np.float32)}
    path = str(tmp_path / f"m{rows}.safetensors")
    st_numpy.save_file(values, path)
    return path, values


def _planned(module, path):
    src = _sources.open_source(path)
    variables = _tree.tree(module)
    return src, variables, _match.make_plan(src, module, variables)


def test_loader_above_stream_bytes_and_none_below(tmp_path):
    rows = _fastio.STREAM_BYTES // 4096 + 16  # just over STREAM_BYTES of float32
    big = _module(rows)
    src, variables, the_plan = _planned(big, _file(tmp_path, rows)[0])
    loader = _fetch.streamed(src, the_plan, variables)
    assert loader is not None and len(loader.specs) == 2
    loader.close()
    small = _module(8)
    src, variables, the_plan = _planned(small, _file(tmp_path, 8)[0])
    assert _fetch.streamed(src, the_plan, variables) is None


def test_every_streamed_value_passes_converted_before_assignment(tmp_path, monkeypatch):
    rows = _fastio.STREAM_BYTES // 4096 + 16
    path, values = _file(tmp_path, rows)
    module = _module(rows)
    seen = []
    converted = _fetch.converted

    def spy(value, variable):
        seen.append((variable.shape.as_list(), bool(np.any(variable.numpy()))))
        return converted(value, variable)

    monkeypatch.setattr(_fetch, "converted", spy)
    objckpt.restore(module, path)
    # each value went through the hook once, while its variable still held its zeros
    assert sorted(seen) == sorted([([rows, 1024], False), ([1024], False)])
    assert module.kernel.numpy().tobytes() == values["kernel"].tobytes()
    assert module.bias.numpy().tobytes() == values["bias"].tobytes()


def test_distributed_variables_fetched_whole(tmp_path):
    rows = _fastio.STREAM_BYTES // 4096 + 16
    path, values = _file(tmp_path, rows)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        module = _module(rows)
    src, variables, the_plan = _planned(module, path)
    assert _fetch.streamed(src, the_plan, variables) is None
    objckpt.restore(module, path)
    assert module.kernel.numpy().tobytes() == values["kernel"].tobytes()


def test_a_streamed_bfloat16_file_widens_into_float32_and_a_lossy_cast_is_fetched_whole(
        tmp_path, monkeypatch):
    """The casting policy on the streamed route: bfloat16 values stream into float32
    variables exactly as NumPy widens them; float16 variables (a lossy cast) are refused
    without cast="lossy", nothing changed, and with it take the fetched route."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rows = 64
    rng = np.random.default_rng(3)
    values = {"kernel": rng.standard_normal((rows, 1024)).astype(ml_dtypes.bfloat16),
              "bias": rng.standard_normal(1024).astype(ml_dtypes.bfloat16)}
    path = str(tmp_path / "bf16.safetensors")
    st_numpy.save_file(values, path)
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1)
    wide = _module(rows)
    src, variables, the_plan = _planned(wide, path)
    loader = _fetch.streamed(src, the_plan, variables)
    assert loader is not None
    loader.close()
    report = objckpt.restore(wide, path)
    assert report.cast == {"kernel": "bfloat16 -> float32", "bias": "bfloat16 -> float32"}
    for name, value in values.items():
        assert getattr(wide, name).numpy().tobytes() == value.astype(np.float32).tobytes()

    narrow = tf.Module()
    narrow.kernel = tf.Variable(tf.zeros((rows, 1024), tf.float16))
    narrow.bias = tf.Variable(tf.zeros((1024,), tf.float16))
    src, variables, the_plan = _planned(narrow, path)
    with pytest.raises(objckpt.errors.StructureMismatchError, match=r"cast='lossy'"):
        objckpt.restore(narrow, path)
    assert not narrow.kernel.numpy().any()
    lossy_plan = _match.make_plan(src, narrow, variables, cast="lossy")
    assert _fetch.streamed(src, lossy_plan, variables) is None  # fetched whole
    objckpt.restore(narrow, path, cast="lossy")
    for name, value in values.items():
        expected = value.astype(np.float32).astype(np.float16)
        assert getattr(narrow, name).numpy().tobytes() == expected.tobytes()
