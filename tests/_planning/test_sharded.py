"""Sharded variables restored from a local TF checkpoint one shard at a time: each shard reads
its slice of the stored tensor (whatever shard count wrote it) and is assigned before the
next is read; a failure half way puts every shard back (the undo log)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker

import objckpt
from objckpt._planning import sharded as _sharded

KEY = "table/.ATTRIBUTES/VARIABLE_VALUE"


def module_of(rows, value, dtype="float32"):
    module = tf.Module()
    parts, start = [], 0
    for count in rows:
        parts.append(tf.Variable(value[start:start + count].astype(dtype)))
        start += count
    module.table = sharded_variable.ShardedVariable(parts, name="table")
    module.bias = tf.Variable(np.ones(value.shape[1], dtype))
    return module


def shard_bytes(module):
    return [part.numpy().tobytes() for part in module.table.variables]


def value_of(seed, rows=10):
    return np.random.default_rng(seed).normal(size=(rows, 3)).astype("float32")


@pytest.fixture
def reads(monkeypatch):
    """Every read the loader makes: (key, spec, shape of what it read)."""
    seen = []
    real = _sharded.read_slice

    def recording(prefix, job):
        value = real(prefix, job)
        seen.append((job.key, job.spec, tuple(value.shape)))
        return value

    monkeypatch.setattr(_sharded, "read_slice", recording)
    return seen


@pytest.mark.parametrize("writer", ["objckpt", "tf"])
def test_each_shard_reads_its_own_slice(reads, writer, tmp_path):
    value = value_of(0)
    source = module_of((5, 5), value)
    prefix = (objckpt.save(source, str(tmp_path / "ck")) if writer == "objckpt"
              else tf.train.Checkpoint(root=source).write(str(tmp_path / "ck")))
    target = module_of((2, 3, 5), np.zeros_like(value))
    report = objckpt.restore(target, prefix)
    assert sorted(report.restored) == ["bias", "table"]
    assert np.concatenate([p.numpy() for p in target.table.variables]).tobytes() == \
        value.tobytes()
    table_reads = [(spec, shape) for key, spec, shape in reads if key == KEY]
    assert table_reads == [("10 3 0,2:0,3", (2, 3)), ("10 3 2,3:0,3", (3, 3)),
                           ("10 3 5,5:0,3", (5, 3))]
    assert [(spec, shape) for key, spec, shape in reads if key != KEY] == [("", (3,))]


def test_a_failure_half_way_puts_every_shard_back(monkeypatch, tmp_path):
    value = value_of(1)
    prefix = objckpt.save(module_of((5, 5), value), str(tmp_path / "ck"))
    target = module_of((4, 3, 3), value_of(2))
    before, bias = shard_bytes(target), target.bias.numpy().tobytes()
    real, count = _sharded.read_slice, []

    def failing(prefix_, job):
        count.append(job.spec)
        if len(count) == 3:  # two reads assigned already
            raise OSError("the data file went away")
        return real(prefix_, job)

    monkeypatch.setattr(_sharded, "read_slice", failing)
    with pytest.raises(OSError, match="the data file went away") as caught:
        objckpt.restore(target, prefix)
    said = " ".join([str(caught.value), *getattr(caught.value, "__notes__", ())])
    if hasattr(caught.value, "add_note"):  # Python 3.11+: the note says what was undone
        assert "Nothing was changed: the 2 variable(s) objckpt.restore had assigned" in said
    assert len(count) == 3
    assert shard_bytes(target) == before
    assert target.bias.numpy().tobytes() == bias


def test_a_lossless_cast_reads_shard_by_shard(reads, tmp_path):
    """A lossless cast (float32 stored, float64 shards) is done shard by shard: each shard
    reads its slice in the stored dtype, widened before it is assigned."""
    value = value_of(3)
    prefix = objckpt.save(module_of((5, 5), value), str(tmp_path / "ck"))
    target = module_of((3, 7), np.zeros((10, 3)), "float64")
    objckpt.restore(target, prefix)
    got = np.concatenate([p.numpy() for p in target.table.variables])
    assert got.tobytes() == value.astype("float64").tobytes()
    assert [(spec, shape) for key, spec, shape in reads if key == KEY] == [
        ("10 3 0,3:0,3", (3, 3)), ("10 3 3,7:0,3", (7, 3))]
