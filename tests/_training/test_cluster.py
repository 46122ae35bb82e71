"""Cluster: who trains (None for a single process) and the error a worker raises when
another failed (its type, who failed, the fix)."""

import pytest
import tensorflow as tf

from objckpt import errors
from objckpt._training import cluster as _cluster


def test_error_codes_name_the_types_workers_learn():
    assert _cluster.error_code(None) == 0
    locked = _cluster.error_code(errors.DirectoryLockedError("locked", directory="d"))
    corrupt = _cluster.error_code(errors.CheckpointCorruptError("bad"))
    other = _cluster.error_code(RuntimeError("boom"))
    assert len({0, locked, corrupt, other}) == 4
    assert other == _cluster.error_code(KeyError("k"))


def test_a_single_process_is_no_cluster():
    assert _cluster.Cluster.of([tf.Variable(1.0)]) is None
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        mirrored = tf.Variable(1.0)
    assert _cluster.Cluster.of([mirrored]) is None


def _worker(index=1):
    return _cluster.Cluster(None, index == 0, index, 3, f"worker {index}", 0)


def test_raise_for_raises_the_type_the_first_failed_worker_raised():
    code = _cluster.error_code(errors.CheckpointWriteError("disk full", "d/ckpt-1"))
    with pytest.raises(errors.CheckpointWriteError) as info:
        _worker(1).raise_for({2: code, 0: code}, None, "the save", "d", "d/ckpt-1")
    message = str(info.value)
    assert "the chief (worker #0 of 3) failed the save with CheckpointWriteError" in message
    assert "this worker (worker 1) stops too" in message and "Fix:" in message


def test_raise_for_an_unknown_error_and_the_own_error():
    with pytest.raises(errors.CheckpointDirectoryError, match="another worker .worker #2 of "
                       "3. failed the resume with an unexpected error"):
        _worker(1).raise_for({2: _cluster.error_code(RuntimeError())}, None, "the resume", "d")
    own = errors.CheckpointCorruptError("mine")
    with pytest.raises(errors.CheckpointCorruptError, match="mine"):
        _worker(1).raise_for({1: _cluster.error_code(own)}, own, "the resume", "d")
    assert _worker(1).raise_for({}, None, "the resume", "d") is None
