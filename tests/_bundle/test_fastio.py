"""objckpt._bundle.fastio: TF's crc32c found and checked, thread counts, balancing, and the restore
that checks every checksum before writing when TF's crc32c cannot be called (RestoreV2 checks
them instead)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._bundle import fastio as _fastio
from objckpt._bundle import index as _bundle
from objckpt._bundle import objgraph as _objgraph


def test_native_crc32c_is_tfs_checksum():
    crc = _fastio.native_crc32c()
    if crc is None:
        pytest.skip("this TF exports no crc32c symbol objckpt knows (the fallback is tested)")
    assert crc(b"123456789") == 0xE3069283  # the standard check value of crc32c
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    assert crc(data) == _objgraph.crc32c(data)
    assert crc(data[50:], crc(data[:50])) == crc(data)  # extends
    assert crc(b"") == 0


def test_the_symbol_table_of_a_file_that_is_not_elf_is_empty(tmp_path):
    path = tmp_path / "not.so"
    path.write_bytes(b"\x7fELF" + b"\x00" * 10)
    assert _fastio._dynamic_strings(str(path)) == b""
    path.write_bytes(b"MZ" + b"\x00" * 100)
    assert _fastio._dynamic_strings(str(path)) == b""


def test_thread_count_from_the_environment(monkeypatch):
    monkeypatch.setenv("OBJCKPT_IO_THREADS", "3")
    assert _fastio.threads() == 3
    monkeypatch.delenv("OBJCKPT_IO_THREADS")
    assert 1 <= _fastio.threads() <= 8
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("OBJCKPT_IO_THREADS", bad)
        with pytest.raises(errors.InvalidArgumentError, match="OBJCKPT_IO_THREADS"):
            _fastio.threads()


def test_balance_covers_every_index_once_in_even_groups():
    sizes = [100, 1, 1, 50, 50, 3, 97, 0]
    groups = _fastio._balance(sizes, 3)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert all(g == sorted(g) for g in groups)
    totals = sorted(sum(sizes[i] for i in g) for g in groups)
    assert totals == [100, 101, 101]  # largest first, each into the least loaded group


@pytest.fixture
def streaming(monkeypatch):
    """Every restore streams, and every tensor of 1 KiB or more is memory-mapped."""
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)
    monkeypatch.setattr(_fastio, "MAP_BYTES", 1 << 10)
    monkeypatch.setattr(_fastio, "MIN_THREAD_BYTES", 1 << 10)


def _module():
    module = tf.Module()
    module.kernels = [tf.Variable(tf.random.normal((64, 32), seed=i)) for i in range(4)]
    module.bias = tf.Variable(tf.range(3, dtype=tf.float32))
    module.step = tf.Variable(5, dtype=tf.int64)
    module.half = tf.Variable(tf.random.normal((40, 16), dtype=tf.float32), dtype=tf.float32)
    module.names = tf.Variable(["a", "bc"])
    return module


def _flip_last_byte(prefix: str, path_prefix: str) -> str:
    index = _bundle.read_index(prefix)
    key = next(k for k in index.entries if k.startswith(path_prefix))
    entry = index.entries[key]
    shard = _bundle.shard_name(prefix, entry.shard, index.num_shards)
    with open(shard, "r+b") as f:
        f.seek(entry.offset + entry.size - 1)
        byte = f.read(1)[0]
        f.seek(entry.offset + entry.size - 1)
        f.write(bytes([byte ^ 0x10]))
    return key


@pytest.mark.parametrize("native", [True, False], ids=["native-crc32c", "restorev2-checks"])
def test_a_damaged_entry_changes_nothing_with_either_checker(tmp_path, monkeypatch, streaming,
                                                            native):
    if not native:
        monkeypatch.setattr(_fastio, "native_crc32c", lambda: None)
    source = _module()
    prefix = objckpt.save(source, str(tmp_path / "ck"))
    assert _files_of(tmp_path, "ck.data-") == ["ck.data-00000-of-00001"]  # objckpt's writer
    target = _module()
    for variable in target.kernels:
        variable.assign(tf.zeros_like(variable))
    report = objckpt.restore(target, prefix)
    assert len(report.restored) == 8
    for a, b in zip(source.variables, target.variables):
        assert np.array_equal(a.numpy(), b.numpy())
    for variable in target.kernels:
        variable.assign(tf.zeros_like(variable))
    before = [v.numpy() for v in target.variables]
    key = _flip_last_byte(prefix, "kernels/3")
    with pytest.raises(errors.CheckpointCorruptError) as caught:
        objckpt.restore(target, prefix)
    message = str(caught.value)
    assert "kernels/3" in message and "Nothing was changed" in message
    if native:
        assert "checksum" in message and key in message
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, target.variables))


def _files_of(directory, start: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(start))


def test_a_truncated_shard_changes_nothing(tmp_path, streaming):
    source = _module()
    prefix = objckpt.save(source, str(tmp_path / "ck"))
    index = _bundle.read_index(prefix)
    entry = index.entries["kernels/2/.ATTRIBUTES/VARIABLE_VALUE"]
    shard = _bundle.shard_name(prefix, entry.shard, index.num_shards)
    os.truncate(shard, entry.offset + entry.size // 2)
    target = _module()
    before = [v.numpy() for v in target.variables]
    # kernels/2 and every entry after it (the object graph, written last) now lie beyond the
    # end of the file: the index check names the first of them it meets.
    with pytest.raises(errors.CheckpointCorruptError,
                       match=r"beyond the end of data shard 0 \(\d+ bytes\)"):
        objckpt.restore(target, prefix)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, target.variables))


def test_part_count_stays_within_the_memory_budget(monkeypatch):
    monkeypatch.setattr(_fastio, "MIN_PART_BYTES", 32 << 20)
    monkeypatch.setattr(_fastio, "PART_BUFFER_BYTES", 10 << 20)
    mib = 1 << 20
    # 100 MiB in 25 x 4 MiB: budget 4 + 20 = 24 MiB holds two 10 MiB write buffers.
    assert _fastio.part_count([4 * mib] * 25, 8) == 2
    # 1 GiB in 16 x 64 MiB: budget 64 + 204.8 MiB; the workers are the limit.
    assert _fastio.part_count([64 * mib] * 16, 4) == 4
    assert _fastio.part_count([64 * mib] * 16, 1) == 1
    # Below MIN_PART_BYTES per part: one SaveV2.
    assert _fastio.part_count([mib] * 20, 8) == 1
    assert _fastio.part_count([], 8) == 1


def _buffer_address(tensor) -> int:
    return np.from_dlpack(_fastio._Exported(tensor)).ctypes.data


def test_streamed_restore_leaves_reads_of_the_variables_free_of_copies(tmp_path, streaming):
    """A variable written by a strided-slice or scatter kernel goes into TF's copy-on-read
    mode for good: every later read copies its buffer (a model restored that way copied
    every weight at every step). After objckpt's streamed restore, two reads of a variable
    held at once share one buffer, as they do before it."""
    source = _module()
    prefix = objckpt.save(source, str(tmp_path / "ck"))
    target = _module()
    kernel = target.kernels[0]
    first, second = kernel.value(), kernel.value()
    assert _buffer_address(first) == _buffer_address(second)
    del first, second
    objckpt.restore(target, prefix)
    np.testing.assert_array_equal(kernel.numpy(), source.kernels[0].numpy())
    first, second = kernel.value(), kernel.value()
    assert _buffer_address(first) == _buffer_address(second)
    # and the variable is not backed by the checkpoint file: a later update lands in memory
    kernel.assign_add(tf.ones_like(kernel))
    np.testing.assert_array_equal(kernel.numpy(), source.kernels[0].numpy() + 1)
