"""The TF checkpoint as a registered format: what it recognises, its TF-free listing (paths
people know, values as flat NumPy), its write role, and the error where structure is needed of a
name-based checkpoint."""

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._formats import checkpoint as _checkpoint

from tests._planning.test_tree import write_name_based


def _saved(tmp_path):
    module = tf.Module()
    module.dense = tf.Module()
    module.dense.kernel = tf.Variable(np.arange(6, dtype="float32").reshape(2, 3))
    module.step = tf.Variable(7, dtype=tf.int64)
    return objckpt.save(module, str(tmp_path / "ck"))


def test_recognise_prefixes_directories_and_urls_not_other_files(tmp_path):
    prefix = _saved(tmp_path)
    assert _checkpoint.recognise(prefix) and _checkpoint.recognise(prefix + ".index")
    assert _checkpoint.recognise(str(tmp_path)) and _checkpoint.recognise("gs://b/ck")
    other = tmp_path / "w.safetensors"
    other.write_bytes(b"\0" * 8)
    assert not _checkpoint.recognise(str(other))


def test_listing_gives_object_paths_and_numpy_values(tmp_path):
    prefix = _saved(tmp_path)
    listed = _checkpoint.listing(prefix)
    assert listed["prefix"] == prefix and listed["graph"] is not None
    by_path = {v[0]: v for v in listed["variables"]}
    assert set(by_path) == {"dense/kernel", "step"}
    assert tuple(by_path["dense/kernel"][2]) == (2, 3)
    key = by_path["dense/kernel"][4]
    assert key == "dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"
    value = listed["read"](key)  # the stored values, flat, as NumPy (no TF)
    assert isinstance(value, np.ndarray) and value.dtype == np.float32
    assert value.tolist() == [0, 1, 2, 3, 4, 5]
    assert listed["read"](by_path["step"][4]).tolist() == [7]
    assert sorted(_checkpoint.top_level_names(listed["graph"])) == ["dense", "step"]


def test_write_then_read_back_by_tf(tmp_path):
    path = str(tmp_path / "written")
    assert _checkpoint.write(path, {"a": tf.constant([1.0, 2.0]), "b/c": tf.constant(3)}) == path
    assert dict(tf.train.list_variables(path)) == {"a": [2], "b/c": []}
    assert tf.train.load_variable(path, "a").tolist() == [1.0, 2.0]


def test_a_name_based_checkpoint_lists_by_name_and_refuses_structure(tmp_path):
    prefix = write_name_based(str(tmp_path / "tf1"))
    listed = _checkpoint.listing(prefix)
    assert listed["graph"] is None
    assert all(v[0] == v[1] == v[4] for v in listed["variables"])
    err = _checkpoint.name_based(prefix, listed["index"])
    assert isinstance(err, errors.NotObjectBasedError) and prefix in str(err)
    with pytest.raises(errors.NotObjectBasedError):
        objckpt.read_tree(prefix)
