"""save: standard object-based checkpoints, written atomically, over every flavour."""

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._bundle import files as _files

from flavours import (
    CASES,
    build,
    case_id,
    checkpoint_paths,
    train_more,
)
from support import assert_bits, perturb, values


@pytest.fixture(params=CASES, ids=case_id)
def case(request):
    return request.param


@pytest.fixture
def obj(case):
    return build(*case)


# --- snapshot / restore round trips -------------------------------------------


def test_save_is_a_standard_checkpoint(obj, case, tmp_path):
    prefix = objckpt.save(obj, str(tmp_path / "ck"))
    assert prefix == str(tmp_path / "ck")
    assert checkpoint_paths(prefix) == set(objckpt.tree(obj))
    fresh = build(*case)
    perturb(fresh)
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    assert_bits(values(objckpt.tree(obj)), values(objckpt.tree(fresh)))
    assert sorted(os.listdir(tmp_path)) == ["ck.data-00000-of-00001", "ck.index"]


def test_saved_snapshot_has_the_same_layout_as_the_saved_obj(obj, tmp_path):
    snap = objckpt.snapshot(obj)
    train_more(obj, epochs=2)
    a = objckpt.save(snap, str(tmp_path / "snap"))
    objckpt.restore(obj, snap)
    b = objckpt.save(obj, str(tmp_path / "obj"))
    assert tf.train.list_variables(a) == tf.train.list_variables(b)
    assert objckpt.read_tree(a).object_graph == objckpt.read_tree(b).object_graph
    for key, _ in tf.train.list_variables(a):
        if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
            assert np.array_equal(tf.train.load_variable(a, key), tf.train.load_variable(b, key))


# --- atomic writes -------------------------------------------------------------


def test_crash_before_commit_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    module.v.assign([3.0, 4.0])

    def crash(temp, final):
        raise KeyboardInterrupt("simulated crash after the data write")

    monkeypatch.setattr(_files, "commit", crash)
    with pytest.raises(KeyboardInterrupt):
        objckpt.save(module, prefix)
    assert sorted(os.listdir(tmp_path)) == ["ck.data-00000-of-00001", "ck.index"]  # no debris
    module.v.assign([0.0, 0.0])
    objckpt.restore(module, prefix)
    assert module.v.numpy().tolist() == [1.0, 2.0]


def test_crash_between_renames_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    real_rename = _files.rename

    def rename(src, dst):
        if dst.endswith(".index"):
            raise KeyboardInterrupt("simulated crash before the index rename")
        real_rename(src, dst)

    monkeypatch.setattr(_files, "rename", rename)
    module.v.assign([3.0, 4.0])
    with pytest.raises(KeyboardInterrupt):
        objckpt.save(module, prefix)
    # New data but no index: not a checkpoint at all, rather than old index + new data.
    assert not os.path.exists(prefix + ".index")
    with pytest.raises(errors.CheckpointNotFoundError):
        objckpt.restore(module, prefix)
    assert module.v.numpy().tolist() == [3.0, 4.0]
