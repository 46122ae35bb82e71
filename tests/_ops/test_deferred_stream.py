"""restore_on_create of a built obj from safetensors: the variables that exist are read one
tensor at a time (checked from metadata first), values bit-equal to
`safetensors.numpy.load_file`, and the memory it holds beyond the obj bounded by the
largest tensor (sampled RssAnon)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt._bundle import fastio as _fastio
from objckpt._formats import safetensors as _st
from tests._formats.test_safetensors_stream import (_bits, _module, _PeakAnon, _values,
                                                    _written)
from tests._ops.test_ensemble_stream import _counted

from flavours import FLAVOURS, keras_for

st_numpy = pytest.importorskip("safetensors.numpy")


def test_existing_variables_streamed_bit_equal_to_load_file(tmp_path, monkeypatch):
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(_written(30), path)
    oracle = st_numpy.load_file(path)
    calls = _counted(monkeypatch)
    module = _module(oracle)
    pending = objckpt.restore_on_create(module, path)
    assert calls["verify"] == 1 and calls["assign"] == 1 and calls["close"] >= 1
    assert pending.done and not pending.pending
    assert sorted(pending.applied) == sorted(oracle)
    assert pending.cast == {}  # every variable has its entry's dtype
    got = _values(module)
    assert {p: _bits(v) for p, v in got.items()} == {p: _bits(v) for p, v in oracle.items()}


def test_below_the_streaming_size_values_are_fetched_whole(tmp_path, monkeypatch):
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(_written(31), path)
    oracle = st_numpy.load_file(path)
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 1 << 40)
    calls = _counted(monkeypatch)
    module = _module(oracle)
    objckpt.restore_on_create(module, path).assert_done()
    assert calls["assign"] == 0
    assert {p: _bits(v) for p, v in _values(module).items()} == {
        p: _bits(v) for p, v in oracle.items()}


def test_a_bad_entry_checked_from_metadata_changes_nothing(tmp_path, monkeypatch):
    written = _written(32)
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(written, path)
    module = _module(written)
    original = _st._Streamer.verify

    def failing(self):  # the last entry's check fails (a file changed under the restore)
        original(self)
        raise objckpt.errors.CheckpointCorruptError("changed under the restore",
                                                    source=path)

    monkeypatch.setattr(_st._Streamer, "verify", failing)
    with pytest.raises(objckpt.errors.CheckpointCorruptError, match="changed under"):
        objckpt.restore_on_create(module, path)
    assert all(not np.any(v) for v in _values(module).values())


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_peak_memory_bounded_by_the_largest_tensor(tmp_path):
    """A 302 MB file of six 50 MB tensors into a built obj: restore_on_create holds at most
    the largest tensor + the streaming slack + 48 MiB of margin beyond the obj; reading
    every value first (the fetched route) holds the file's size."""
    rng = np.random.default_rng(14)
    written = {f"block{i}/kernel": rng.standard_normal((3200, 4096), dtype=np.float32)
               for i in range(6)}
    written.update({f"block{i}/bias": rng.standard_normal(4096, dtype=np.float32)
                    for i in range(6)})
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(written, path)
    largest = max(v.nbytes for v in written.values())
    del written
    module = _module(st_numpy.load_file(path))  # values dropped: only the zeros stay
    with _PeakAnon() as peak:
        objckpt.restore_on_create(module, path).assert_done()
    bound = largest + _st.STREAM_SLACK + (48 << 20)
    assert peak.growth < bound, (peak.growth, bound)
    oracle = st_numpy.load_file(path)
    assert all(_bits(v) == _bits(oracle[p]) for p, v in _values(module).items())


@pytest.mark.parametrize("flavour", [f for f in FLAVOURS if f != "module"])
def test_keras_model_streamed_by_both_doors(flavour, tmp_path, monkeypatch):
    """A built Keras model of each flavour (19 MB of weights, above the streaming size),
    exported to safetensors: load_ensemble's members and restore_on_create into a built
    model stream every tensor and end bit-equal to the exported model."""
    keras = keras_for(flavour)

    def build(seed):
        tf.random.set_seed(seed)
        model = keras.Sequential([keras.layers.Dense(2048), keras.layers.Dense(1024)])
        model(tf.ones((1, 1024)))
        return model

    exported = build(1)
    path = str(tmp_path / "model.safetensors")
    objckpt.export(exported, path)
    want = [_bits(w) for w in exported.get_weights()]
    calls = _counted(monkeypatch)
    ensemble = objckpt.load_ensemble(build(2), [path, path])
    assert calls["assign"] == 0  # members created from values read one at a time
    for member in ensemble.members:
        assert [_bits(w) for w in member.get_weights()] == want
    model = build(3)
    objckpt.restore_on_create(model, path).assert_done()
    assert calls["assign"] == 1
    assert [_bits(w) for w in model.get_weights()] == want
