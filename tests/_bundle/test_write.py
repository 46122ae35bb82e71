"""objckpt's own writer of TF's bundle format: byte for byte what SaveV2 writes,
read by TF's readers, written by several threads."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt._bundle import fastio as _fastio
from objckpt._bundle import index as _bundle
from objckpt._bundle import write as _bundlewrite

import fuzzlib as F

pytestmark = pytest.mark.skipif(_fastio.native_crc32c() is None,
                                reason="this TF exports no crc32c: objckpt writes with SaveV2")


def _tensors(seed: int = 0) -> dict:
    """One tensor of every dtype the writer takes, odd shapes, scalars, empties, strings with
    one- and two-byte varint lengths."""
    rng = np.random.default_rng(seed)
    out = {
        "f32": rng.normal(size=(33, 17)).astype("float32"),
        "f32/large": rng.normal(size=(600, 512)).astype("float32"),  # > a 1 MiB chunk
        "f64": rng.normal(size=(5, 3)),
        "f16": rng.normal(size=(7,)).astype("float16"),
        "i8": rng.integers(-128, 128, size=(11,)).astype("int8"),
        "i16": rng.integers(-999, 999, size=(3, 2)).astype("int16"),
        "i32": rng.integers(-9999, 9999, size=(4, 16)).astype("int32"),
        "i64": np.int64(2 ** 40 + seed),
        "u8": rng.integers(0, 256, size=(13,)).astype("uint8"),
        "u16": rng.integers(0, 2 ** 16, size=(5,)).astype("uint16"),
        "u32": rng.integers(0, 2 ** 32, size=(5,)).astype("uint32"),
        "u64": rng.integers(0, 2 ** 63, size=(5,)).astype("uint64"),
        "bool": rng.integers(0, 2, size=(6,)).astype(bool),
        "c64": (rng.normal(size=(5,)) + 1j * rng.normal(size=(5,))).astype("complex64"),
        "c128": rng.normal(size=(2,)) + 1j * rng.normal(size=(2,)),
        "empty": np.zeros((0, 4), "float32"),
        "scalar": np.float32(seed + 0.5),
        "text": np.array([b"a", b"", b"x" * 200, b"\x00\xff" * 70_000], dtype=object),
        "text/scalar": b"one string",
        "text/empty": np.zeros((0,), dtype=object),
    }
    tensors = {key: tf.constant(value) for key, value in out.items()}
    tensors["bf16"] = tf.cast(rng.normal(size=(9, 2)), tf.bfloat16)
    return tensors


def _files(prefix: str) -> tuple[bytes, bytes]:
    with open(prefix + ".data-00000-of-00001", "rb") as f:
        data = f.read()
    with open(prefix + ".index", "rb") as f:
        return data, f.read()


def _save_v2(prefix: str, keys: list, tensors: list) -> None:
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys),
                          tensors=tensors)


def _bits(value) -> tuple:
    array = np.asarray(value)
    return str(array.dtype), array.shape, (array.tolist() if array.dtype == object
                                           else array.tobytes())


@pytest.mark.parametrize("workers", [1, 3])
def test_data_file_and_entries_are_savev2s_byte_for_byte(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(_fastio, "MIN_THREAD_BYTES", 1)
    tensors = _tensors()
    keys = sorted(tensors, reverse=True)  # not sorted: the data follows the order given
    values = [tensors[k] for k in keys]
    assert _bundlewrite.supported(values)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "tf")
    _fastio.write_bundle(ours, keys, values, workers)
    _save_v2(theirs, keys, values)
    assert _files(ours) == _files(theirs)  # data file and index, byte for byte
    mine, tfs = _bundle.read_index(ours), _bundle.read_index(theirs)
    assert mine.num_shards == tfs.num_shards == 1
    assert set(mine.entries) == set(tfs.entries) == set(keys)
    for key in keys:
        a, b = mine.entries[key], tfs.entries[key]
        assert (a.dtype, tuple(a.shape), a.shard, a.offset, a.size, a.crc32c) == (
            b.dtype, tuple(b.shape), b.shard, b.offset, b.size, b.crc32c), key
    # TF's own readers: the checkpoint reader, RestoreV2 (which checks every crc32c) and
    # MergeV2Checkpoints (which opens the index with TF's BundleReader).
    reader = tf.train.load_checkpoint(ours)
    restored = tf.raw_ops.RestoreV2(prefix=ours, tensor_names=keys,
                                    shape_and_slices=[""] * len(keys),
                                    dtypes=[v.dtype for v in values])
    for key, value, got in zip(keys, values, restored):
        assert _bits(reader.get_tensor(key)) == _bits(value.numpy()), key
        assert _bits(got.numpy()) == _bits(value.numpy()), key
    merged = str(tmp_path / "merged")
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[ours], destination_prefix=merged,
                                  delete_old_dirs=False)
    assert _bits(tf.train.load_checkpoint(merged).get_tensor("text")) == _bits(
        tensors["text"].numpy())


def test_an_index_of_several_blocks_is_tfs_byte_for_byte(tmp_path):
    # ~5,000 entries with long, prefix-sharing keys: an index of several 256 KiB data blocks
    # (TF cuts a block by its size, keys share prefixes between restart points, the index
    # block keys each data block by a shortest separator).
    keys = [f"model/layer_with_a_long_name_{i // 7}/sublayer_{i % 7:03d}/"
            f"{'x' * (i % 40)}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(5000)]
    keys.append("\u00e9t\u00e9/\xff/.ATTRIBUTES/VARIABLE_VALUE")
    values = [tf.constant([float(i)] * (i % 3)) for i in range(len(keys))]
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "tf")
    _fastio.write_bundle(ours, keys, values, 2)
    _save_v2(theirs, keys, values)
    assert _files(ours) == _files(theirs)
    data_blocks = len(F.data_block_handles(_files(ours)[1]))
    assert data_blocks >= 2, data_blocks


def test_several_threads_write_the_same_bytes_as_one(tmp_path, monkeypatch):
    monkeypatch.setattr(_fastio, "MIN_THREAD_BYTES", 1)
    monkeypatch.setattr(_bundlewrite, "CHUNK_BYTES", 1 << 12)
    writers: set = set()
    lock, meet = threading.Lock(), {"barrier": None}
    real = _bundlewrite._pwrite_all

    def spy(fd, view, offset):
        with lock:
            new = threading.get_ident() not in writers
            writers.add(threading.get_ident())
            first_two = new and len(writers) <= 2
        if first_two and meet["barrier"] is not None:
            # The first two writing threads wait for each other: a pool that ran every
            # group on one thread (small groups finish fast) fails here, not by chance.
            meet["barrier"].wait()
        return real(fd, view, offset)

    monkeypatch.setattr(_bundlewrite, "_pwrite_all", spy)
    tensors = _tensors(1)
    keys, values = list(tensors), list(tensors.values())
    _fastio.write_bundle(str(tmp_path / "one"), keys, values, 1)
    assert len(writers) == 1
    writers.clear()
    meet["barrier"] = threading.Barrier(2, timeout=60)
    _fastio.write_bundle(str(tmp_path / "four"), keys, values, 4)
    assert len(writers) > 1
    assert _files(str(tmp_path / "one")) == _files(str(tmp_path / "four"))


def test_objckpt_save_uses_it_and_tf_reads_the_result(tmp_path, monkeypatch):
    calls = []
    real = _bundlewrite.index
    monkeypatch.setattr(_bundlewrite, "index", lambda *a: calls.append(a) or real(*a))
    module = tf.Module()
    module.w = tf.Variable(tf.random.normal((300, 200), seed=1))
    module.names = tf.Variable(["a", "bcd"])
    module.step = tf.Variable(3, dtype=tf.int64)
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    assert len(calls) == 1
    assert sorted(os.listdir(tmp_path)) == ["ck.data-00000-of-00001", "ck.index"]
    fresh = tf.Module()
    fresh.w = tf.Variable(tf.zeros((300, 200)))
    fresh.names = tf.Variable(["", ""])
    fresh.step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    for a, b in zip((module.w, module.names, module.step), (fresh.w, fresh.names, fresh.step)):
        assert _bits(a.numpy()) == _bits(b.numpy())
    assert objckpt.verify(prefix).ok


def test_a_variant_tensor_is_left_to_savev2(tmp_path):
    listed = tf.raw_ops.TensorListFromTensor(tensor=tf.constant([1.0, 2.0]),
                                             element_shape=tf.constant([], tf.int32))
    plain = tf.constant([3.0])
    assert not _bundlewrite.supported([plain, listed])
    prefix = str(tmp_path / "ck")
    _fastio.write_bundle(prefix, ["list", "plain"], [listed, plain], workers=2)
    reader = tf.train.load_checkpoint(prefix)
    assert reader.get_tensor("plain").tolist() == [3.0]


def test_duplicate_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="duplicate checkpoint key"):
        _fastio.write_bundle(str(tmp_path / "ck"), ["a", "a"], [tf.constant(1), tf.constant(2)],
                             1)
