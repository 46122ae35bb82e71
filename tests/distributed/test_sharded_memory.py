"""Sharded variables restored one shard at a time, where each shard lives: a lossless cast
(a bfloat16 checkpoint into a float32 table) read and widened shard by shard, each shard
reading only its slice; a read failing half way puts every shard back; the undo log keeps
an old value held where its variable lives (`UndoLog.keep`); the task that reads and writes
a variable's values (`_compat.io_device`).

The sharded variables here live on this process's CPU (tests/distributed/test_sharded.py
makes them); tests/distributed/test_sharded_cluster.py runs parameter servers.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import objckpt
from objckpt import _compat
from objckpt._bundle import undolog as _undolog
from objckpt._planning import sharded as _sharded


def _table(rows, value, dtype="float32") -> tf.Module:
    module = tf.Module()
    parts, start = [], 0
    for count in rows:
        parts.append(tf.Variable(tf.constant(value[start:start + count], dtype=dtype)))
        start += count
    module.table = sharded_variable.ShardedVariable(parts, name="table")
    return module


def _bfloat16_source(tmp_path, rows=(4, 6)):
    """A checkpoint of a bfloat16 table (saved in `rows` shards) and its values widened to
    float32 by NumPy (the oracle)."""
    value = np.random.default_rng(0).normal(size=(sum(rows), 3)).astype("float32")
    source = _table(rows, value, dtype="bfloat16")
    widened = np.concatenate([p.numpy() for p in source.table.variables]).astype("float32")
    return objckpt.save(source, str(tmp_path / "bf16")), widened


@pytest.fixture
def reads(monkeypatch):
    """Every slice `read_slice` reads: (spec, device, rows read)."""
    got = []
    real = _sharded.read_slice

    def spy(prefix, job):
        value = real(prefix, job)
        got.append((job.spec, job.device, tuple(value.shape), value.dtype.name))
        return value

    monkeypatch.setattr(_sharded, "read_slice", spy)
    return got


@pytest.mark.parametrize("saved, restored", [((4, 6), (3, 3, 4)), ((10,), (5, 5)),
                                             ((2, 8), (10,))])
def test_a_bfloat16_checkpoint_widens_into_float32_shards_one_at_a_time(
        tmp_path, reads, saved, restored):
    prefix, widened = _bfloat16_source(tmp_path, saved)
    target = _table(restored, np.zeros((10, 3), "float32"))
    report = objckpt.restore(target, prefix)
    assert report.restored == ("table",) or list(report.restored) == ["table"]
    got = np.concatenate([p.numpy() for p in target.table.variables])
    assert got.dtype == np.float32 and got.tobytes() == widened.tobytes()
    # one read per shard (a ShardedVariable of one shard too), of its rows only, in
    # bfloat16 (widened after the read)
    starts = np.cumsum((0,) + restored[:-1])
    assert reads == [(f"10 3 {s},{n}:0,3", "/cpu:0", (n, 3), "bfloat16")
                     for s, n in zip(starts, restored)]


def test_a_read_failing_half_way_through_a_cast_puts_every_shard_back(tmp_path, monkeypatch):
    prefix, _ = _bfloat16_source(tmp_path)
    old = np.random.default_rng(1).normal(size=(10, 3)).astype("float32")
    target = _table((3, 3, 4), old)
    real, calls = _sharded.read_slice, []

    def failing(prefix, job):
        calls.append(job.spec)
        if len(calls) == 3:
            raise OSError("the disk went away")
        return real(prefix, job)

    monkeypatch.setattr(_sharded, "read_slice", failing)
    with pytest.raises(OSError, match="the disk went away") as caught:
        objckpt.restore(target, prefix)
    assert len(calls) == 3
    assert np.concatenate([p.numpy() for p in target.table.variables]).tobytes() \
        == old.tobytes()
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "Nothing was changed: the 2 variable(s)" in notes


def test_a_lossy_cast_is_not_read_shard_by_shard(tmp_path, reads):
    """float32 into bfloat16 loses bits: the value is fetched whole and checked by the cast
    policy first (here it refuses: nothing read shard by shard, nothing changed)."""
    value = np.random.default_rng(2).normal(size=(10, 3)).astype("float32")
    prefix = objckpt.save(_table((5, 5), value), str(tmp_path / "f32"))
    target = _table((5, 5), np.zeros((10, 3)), dtype="bfloat16")
    with pytest.raises(objckpt.errors.ObjckptError):
        objckpt.restore(target, prefix)
    assert reads == []
    assert all(not p.numpy().astype("float32").any() for p in target.table.variables)


def test_the_undo_log_keeps_a_value_held_elsewhere_and_writes_nothing_for_it():
    variable = tf.Variable([1.0, 2.0, 3.0])
    other = tf.Variable(np.arange(300000, dtype="float32"))
    log = _undolog.UndoLog(background=False)
    try:
        log.keep(variable, variable.read_value(), "kept")
        assert log.nbytes == 0 and len(log) == 1
        log.record(_undolog.Viewed(other), "written")
        written = log.nbytes
        assert written >= other.numpy().nbytes
        variable.assign([7.0, 8.0, 9.0])
        other.assign(tf.zeros_like(other))
        assert log.undo() == []
    finally:
        log.close()
    assert variable.numpy().tolist() == [1.0, 2.0, 3.0]
    assert other.numpy().tobytes() == np.arange(300000, dtype="float32").tobytes()


def test_values_of_this_process_are_read_and_written_here():
    assert _compat.io_device("") == "/cpu:0"
    assert _compat.io_device(tf.Variable(1.0).device) == "/cpu:0"
    here = tf.DeviceSpec.from_string(tf.constant(0).device)
    assert _compat.io_device(here.replace(device_type="GPU", device_index=1).to_string()) \
        == "/cpu:0"


def test_values_of_another_task_are_read_and_written_by_its_cpu():
    assert (_compat.io_device("/job:ps/replica:0/task:1/device:GPU:0")
            == "/job:ps/replica:0/task:1/device:CPU:0")
    assert _compat.io_devices(["/job:ps/task:0", ""]) == ["/job:ps/replica:0/task:0/device:CPU:0",
                                                          "/cpu:0"]


def test_a_slice_its_task_cannot_write_is_written_here(tmp_path, monkeypatch):
    """Each shard's slice is written by the task holding it; where that task cannot write
    it (here: a task that does not exist, as a parameter server whose file system does not
    reach the path), this host writes it, and the checkpoint is the same."""
    value = np.random.default_rng(3).normal(size=(10, 3)).astype("float32")
    module = _table((4, 6), value)
    asked = []

    def elsewhere(devices):
        devices = list(devices)
        asked.append(len(devices))
        return ["/job:ps/replica:0/task:0/device:CPU:0"] * len(devices)

    monkeypatch.setattr(objckpt._compat, "io_devices", elsewhere)
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    monkeypatch.undo()
    assert asked == [2]  # the two slices were given to the (missing) task first
    reader = tf.train.load_checkpoint(prefix)
    assert reader.get_tensor("table/.ATTRIBUTES/VARIABLE_VALUE").tobytes() == value.tobytes()
    target = _table((5, 5), np.zeros((10, 3), "float32"))
    tf.train.Checkpoint(table=target.table).read(prefix).assert_consumed()
    assert np.concatenate([p.numpy() for p in target.table.variables]).tobytes() \
        == value.tobytes()


def test_an_upload_writes_every_slice_here(tmp_path, monkeypatch):
    """The local folder of an upload (a gs:// or s3:// save) is this host's: its slices are
    written here, no other task asked."""
    from objckpt._bundle import fastio as _fastio

    def nowhere(devices):
        raise AssertionError("no task asked")

    monkeypatch.setattr(objckpt._compat, "io_devices", nowhere)
    parts = [tf.constant([[1.0, 2.0]]), tf.constant([[3.0, 4.0], [5.0, 6.0]])]
    temp = str(tmp_path / "bundle")
    _fastio.write_bundle(temp, ["t", "t"], parts, 2, ["3 2 0,1:0,2", "3 2 1,2:0,2"],
                         here=True)
    monkeypatch.undo()
    assert tf.train.load_checkpoint(temp).get_tensor("t").tolist() == [[1, 2], [3, 4], [5, 6]]
