"""Parallel checkpoint I/O: parallel writes TF reads, parallel all-or-nothing
restores, durable (fsync) mode.

Small models are written and read by `THREADS` threads (OBJCKPT_IO_THREADS) by making
`_fastio.MIN_THREAD_BYTES` tiny: objckpt's own bundle writer (one data file, several threads)
by default, or, with the `parts` fixture (the fallback for dtypes it does not write), several
`SaveV2` parts merged into K shards, by making `_fastio.MIN_PART_BYTES` tiny too.
`_fastio.MAP_BYTES` is made tiny where a test wants every tensor to take the direct restore
path (checked through a memory map, read straight into a new tensor its variable adopts).
"""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._bundle import fastio as _fastio
from objckpt._bundle import index as _bundle
from objckpt._bundle import write as _bundlewrite

from flavours import CASES, FLAVOURS, _data, build, case_id, keras_for, session_flavour
from support import assert_bits, bits, perturb, run_cli, values

THREADS = 4
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@pytest.fixture(scope="module", autouse=True)
def _small_parts():
    """Every checkpoint of this module is written and read by THREADS threads (and, with
    `parts`, as several SaveV2 parts), whatever its size."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_fastio, "MIN_THREAD_BYTES", 1)
        patch.setattr(_fastio, "MIN_PART_BYTES", 1)
        patch.setattr(_fastio, "PART_BUFFER_BYTES", 1)
        patch.setenv("OBJCKPT_IO_THREADS", str(THREADS))
        yield


@pytest.fixture
def parts(monkeypatch):
    """Saves take the SaveV2-parts path (objckpt's writer's fallback): K data shards."""
    monkeypatch.setattr(_bundlewrite, "supported", lambda tensors: False)


READ_PATHS = ("whole", "streamed", "in-place")


def _read_path(monkeypatch, path: str) -> str:
    if path != "whole":
        monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)
    if path == "in-place":
        monkeypatch.setattr(_fastio, "MAP_BYTES", 1)
    return path


@pytest.fixture(params=READ_PATHS)
def read_path(request, monkeypatch):
    """How a restore reads: "whole" (the library's choice for these small models: every
    value read, then assigned), "streamed" (every checksum checked, then one tensor at a
    time through a copy), "in-place" (streamed, every tensor checked through a memory map
    and read straight into a new tensor its variable adopts)."""
    return _read_path(monkeypatch, request.param)


@pytest.fixture
def streamed(monkeypatch):
    """The streamed, in-place restore (the path of large models) for the tests of the
    generic path; the whole-read path is the one restore took before parallel I/O."""
    return _read_path(monkeypatch, "in-place")


# --- helpers ---------------------------------------------------------------------------


def data_files(prefix: str) -> list[str]:
    """Names of the data shards beside prefix (TF's names, any count), sorted."""
    directory, name = os.path.split(prefix)
    shard = re.compile(re.escape(name) + r"\.data-[0-9]{5}-of-[0-9]{5}")
    return sorted(n for n in os.listdir(directory) if shard.fullmatch(n))


def assert_layout(prefix: str, count: int | None = None) -> int:
    """prefix is K data shards `prefix.data-0000k-of-0000K` and one index, nothing else in its
    directory under its name (no temporary debris); returns K."""
    directory, name = os.path.split(prefix)
    shards = data_files(prefix)
    k = len(shards)
    assert shards == [f"{name}.data-{i:05d}-of-{k:05d}" for i in range(k)], shards
    if count is not None:
        assert k == count, shards
    index = _bundle.read_index(prefix)
    assert index.num_shards == k
    debris = [n for n in os.listdir(directory) if ".tmp-" in n or ".part-" in n
              or ".tempstate" in n]
    assert not debris, debris
    assert os.path.isfile(prefix + ".index")
    return k


def variable_entries(prefix: str) -> dict:
    """key -> index entry for every tensor but the object graph."""
    return {k: e for k, e in _bundle.read_index(prefix).entries.items() if k != GRAPH_KEY}


def network(obj):
    return obj.model if isinstance(obj, tf.train.Checkpoint) else obj


def traced_call(obj):
    """A tf.function calling obj's network on fixed inputs (traced at its first call: it
    holds the variables' handles, so it sees what a restore writes into them)."""
    net = network(obj)
    if isinstance(obj, tf.train.Checkpoint):
        return tf.function(lambda: net(tf.ones((2, 3))))
    images, tokens, _ = _data(seed=3)
    x = images if net.name == "net" else [images, tokens]
    return tf.function(lambda: net(x, training=False))


class Zoo(tf.Module):
    """One variable of each dtype, odd sizes next to a large one (so that unaligned data
    offsets, scalars and strings sit beside aligned, memory-mappable tensors)."""

    def __init__(self, seed: int = 0, device: str | None = None, empty: bool = True):
        super().__init__(name="zoo")
        rng = np.random.default_rng(seed)
        with tf.device(device) if device else _nothing():
            self.odd = tf.Variable(rng.normal(size=(3,)).astype("float32"))
            self.large = tf.Variable(rng.normal(size=(520, 512)).astype("float32"))  # > 1 MiB
            self.mid = tf.Variable(rng.normal(size=(33, 17)).astype("float32"))
            self.f64 = tf.Variable(rng.normal(size=(5, 3)))
            self.f16 = tf.Variable(rng.normal(size=(7,)).astype("float16"))
            self.bf16 = tf.Variable(tf.cast(rng.normal(size=(9, 2)), tf.bfloat16))
            self.i8 = tf.Variable(rng.integers(-128, 128, size=(11,)).astype("int8"))
            self.i32 = tf.Variable(rng.integers(-9999, 9999, size=(4, 16)).astype("int32"))
            self.i64 = tf.Variable(np.int64(seed + 2 ** 40))
            self.u8 = tf.Variable(rng.integers(0, 256, size=(13,)).astype("uint8"))
            self.flags = tf.Variable(rng.integers(0, 2, size=(6,)).astype(bool))
            self.c64 = tf.Variable((rng.normal(size=(5,)) + 1j * rng.normal(size=(5,)))
                                   .astype("complex64"))
            self.text = tf.Variable([b"a", b"bc" * (seed + 1), b"\x00\xff" * seed])
            self.scalar = tf.Variable(float(seed) + 0.5, dtype=tf.float32)
            if empty:
                self.empty = tf.Variable(tf.zeros((0, 4)))
            self.aligned = tf.Variable(rng.normal(size=(16, 4)).astype("float32"))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def zoo_keys() -> list[str]:
    return [_paths.checkpoint_key(p) for p in objckpt.tree(Zoo())]


# --- writing: K shards that TF and objckpt read ------------------------------------------


_TARGETS: dict = {}


def target_for(case, *, fresh: bool = False):
    """A built, trained obj of a case to restore into, perturbed (every value differs from
    every saved one); one per case and module unless `fresh` (builds take a second)."""
    if fresh or case not in _TARGETS:
        obj = build(*case)
        if fresh:
            perturb(obj)
            return obj
        _TARGETS[case] = obj
    obj = _TARGETS[case]
    perturb(obj)
    return obj


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def saved(request, tmp_path_factory):
    """(case, trained obj, its values, the prefix objckpt.save wrote it to in parallel)."""
    obj = build(*request.param)
    prefix = objckpt.save(obj, str(tmp_path_factory.mktemp("saved") / "ck"))
    return request.param, obj, values(obj), prefix


def test_parallel_save_is_one_data_file_tf_reads(saved):
    case, _, before, prefix = saved
    assert assert_layout(prefix) == 1  # objckpt's writer: one data file, several threads
    # TF's own readers: tf.train.Checkpoint.read consumes everything, load_checkpoint reads
    # every entry with the value saved.
    fresh = target_for(case, fresh=True)
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    assert_bits(before, values(fresh), "tf.train.Checkpoint.read")
    reader = tf.train.load_checkpoint(prefix)
    for path, value in before.items():
        assert bits(reader.get_tensor(_paths.checkpoint_key(path))) == bits(value), path
    report = objckpt.verify(prefix)
    assert report.ok, report.describe()
    assert report.tensors >= len(before)


def test_parallel_save_restores_bit_exact(saved, read_path):
    case, obj, before, prefix = saved
    fresh = target_for(case)
    call = traced_call(fresh)
    perturbed_out = call().numpy()
    report = objckpt.restore(fresh, prefix)
    assert_bits(before, values(fresh))
    out = call().numpy()  # the traced function reads the restored values
    assert not np.array_equal(out, perturbed_out)
    np.testing.assert_array_equal(out, traced_call(obj)().numpy())
    assert set(report.restored) == set(before)
    assert report.missing == () and report.unexpected == ()


@pytest.mark.parametrize("writer", ["own", "parts"])
def test_dtype_zoo_round_trip(tmp_path, read_path, writer, monkeypatch):
    if writer == "parts":
        monkeypatch.setattr(_bundlewrite, "supported", lambda tensors: False)
    zoo = Zoo(1)
    before = values(zoo)
    prefix = objckpt.save(zoo, str(tmp_path / "zoo"))
    k = assert_layout(prefix)
    assert (k == 1) if writer == "own" else 1 < k <= THREADS, k
    entries = variable_entries(prefix)
    assert set(entries) == set(zoo_keys())
    # objckpt restores every dtype bit-exact...
    target = Zoo(2)
    assert not any(bits(before[p]) == bits(v) for p, v in values(target).items()
                   if p != "empty")
    objckpt.restore(target, prefix)
    assert_bits(before, values(target), "objckpt.restore")
    # ...and TF's own readers read it
    plain = Zoo(3)
    tf.train.Checkpoint(root=plain).read(prefix).assert_consumed()
    assert_bits(before, values(plain), "tf.train.Checkpoint.read")
    reader = tf.train.load_checkpoint(prefix)
    for path, value in before.items():
        assert bits(reader.get_tensor(_paths.checkpoint_key(path))) == bits(value), path
    assert objckpt.verify(prefix).ok


@pytest.mark.subprocess
def test_cli_verify_reads_a_sharded_checkpoint(tmp_path, parts):
    prefix = objckpt.save(Zoo(1), str(tmp_path / "zoo"))
    assert assert_layout(prefix) > 1
    done = run_cli("verify", prefix, blocked=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_tf_written_checkpoint_with_unaligned_offsets_restores_bit_exact(tmp_path, read_path):
    source = Zoo(1)
    prefix = tf.train.Checkpoint(root=source).write(str(tmp_path / "ck"))
    assert assert_layout(prefix) == 1
    assert any(e.offset % 64 for e in variable_entries(prefix).values())
    target = Zoo(2)
    objckpt.restore(target, prefix)
    assert_bits(values(source), values(target))


@pytest.mark.skipif(not hasattr(tf.train.experimental, "MaxShardSizePolicy"),
                    reason="TF writes sharded checkpoints of one device from TF 2.15 on")
def test_tf_written_sharded_checkpoint_restores_bit_exact(tmp_path, read_path):
    # No empty tensor: TF's MaxShardSizePolicy leaves it out of the index (TF 2.21), and
    # tf.train.Checkpoint.read then fails too.
    source = Zoo(1, empty=False)
    options = tf.train.CheckpointOptions(
        experimental_sharding_callback=tf.train.experimental.MaxShardSizePolicy(
            max_shard_size=256 << 10))
    prefix = tf.train.Checkpoint(root=source).write(str(tmp_path / "ck"), options=options)
    assert assert_layout(prefix) > 2
    target = Zoo(2, empty=False)
    objckpt.restore(target, prefix)
    assert_bits(values(source), values(target))
    assert objckpt.verify(prefix).ok


def test_io_threads_1_writes_one_shard(tmp_path, monkeypatch):
    monkeypatch.setenv("OBJCKPT_IO_THREADS", "1")
    zoo = Zoo(1)
    prefix = objckpt.save(zoo, str(tmp_path / "one"))
    assert assert_layout(prefix) == 1
    target = Zoo(2)
    objckpt.restore(target, prefix)
    assert_bits(values(zoo), values(target))


def test_small_checkpoint_at_the_default_part_size_is_one_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(_fastio, "MIN_PART_BYTES", 32 << 20)
    objckpt.save(Zoo(1), str(tmp_path / "small"))
    assert sorted(os.listdir(tmp_path)) == ["small.data-00000-of-00001", "small.index"]


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_io_threads_is_a_typed_error(tmp_path, monkeypatch, value):
    monkeypatch.setenv("OBJCKPT_IO_THREADS", value)
    with pytest.raises(errors.InvalidArgumentError, match="OBJCKPT_IO_THREADS"):
        objckpt.save(Zoo(1), str(tmp_path / "ck"))
    assert not os.path.exists(tmp_path / "ck.index")


def test_saving_over_a_prefix_with_another_shard_count_leaves_no_stale_shard(tmp_path,
                                                                             monkeypatch):
    prefix = str(tmp_path / "ck")
    (tmp_path / "ck.data-00000-of-00001.bak").write_bytes(b"keep me")
    own = _bundlewrite.supported
    for seed, threads, writer in ((1, "4", "parts"), (2, "1", "parts"), (3, "3", "parts"),
                                  (4, "4", "own"), (5, "2", "parts"), (6, "3", "own")):
        monkeypatch.setenv("OBJCKPT_IO_THREADS", threads)
        monkeypatch.setattr(_bundlewrite, "supported",
                            own if writer == "own" else lambda tensors: False)
        zoo = Zoo(seed)
        objckpt.save(zoo, prefix)
        k = assert_layout(prefix)
        assert (k == 1) if threads == "1" or writer == "own" else 1 < k <= int(threads), k
        assert sorted(os.listdir(tmp_path)) == sorted(
            [*data_files(prefix), "ck.index", "ck.data-00000-of-00001.bak"])
        target = Zoo(0)
        objckpt.restore(target, prefix)
        assert_bits(values(zoo), values(target), f"seed {seed}")
        tf.train.Checkpoint(root=Zoo(0)).read(prefix).assert_consumed()
    assert (tmp_path / "ck.data-00000-of-00001.bak").read_bytes() == b"keep me"


# --- crash safety ------------------------------------------------------------------------


class Crash(BaseException):
    """Stands for the process dying (not an Exception: nothing may catch it)."""


def crash_at(monkeypatch, module, name: str, after: int = 0):
    """Makes `module.name` raise Crash on its call number `after` (0: the first)."""
    original = getattr(module, name)
    calls = []

    def crashing(*args, **kwargs):
        calls.append(args)
        if len(calls) > after:
            raise Crash(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, crashing)
    return calls


def _write_points():
    """(writer, module, function) the parallel writes pass through, in order."""
    from objckpt._bundle import files as _files

    return [("own", _bundlewrite, "_pwrite_all"), ("own", _bundlewrite, "index"),
            ("parts", _fastio, "_save"), ("parts", tf.raw_ops, "MergeV2Checkpoints"),
            ("own", _files, "commit"), ("own", _files, "rename")]


@pytest.mark.parametrize("point", range(6), ids=["data", "index", "part", "merge", "commit",
                                                 "rename"])
def test_crash_during_a_parallel_save_leaves_the_old_or_the_new_checkpoint(tmp_path,
                                                                          monkeypatch, point):
    prefix = str(tmp_path / "ck")
    old, new = Zoo(1), Zoo(2)
    writer, module, name = _write_points()[point]
    if writer == "parts":
        monkeypatch.setattr(_bundlewrite, "supported", lambda tensors: False)
    objckpt.save(old, prefix)
    # every call of the function in turn, until a save goes through without reaching it
    for after in range(64):
        with monkeypatch.context() as patch:
            calls = crash_at(patch, module, name, after)
            try:
                objckpt.save(new, prefix)
                crashed = False
            except Crash:
                crashed = True
        assert calls, f"a parallel save no longer calls {name}: update _write_points"
        target = Zoo(0)
        if os.path.exists(prefix + ".index"):
            assert_layout(prefix)
            objckpt.restore(target, prefix)
            got = values(target)
            assert bits(got["large"]) in (bits(values(old)["large"]), bits(values(new)["large"]))
            assert_bits(values(old) if bits(got["large"]) == bits(values(old)["large"])
                        else values(new), got, f"{name} #{after}")
        else:  # none: only a crash inside the final renames may leave that
            assert name == "rename" and crashed, f"{name} #{after}: no checkpoint left"
        leftovers = [n for n in os.listdir(tmp_path) if ".tmp-" in n]
        assert not leftovers, (name, after, leftovers)  # cleaned up on the way out
        if not crashed:
            break
        objckpt.save(old, prefix)  # back to the old one for the next crash point
    assert not crashed, f"{name} crashed on every call"


# --- all-or-nothing restores -------------------------------------------------------------


def _copy(prefix: str, directory) -> str:
    os.makedirs(directory, exist_ok=True)
    src_dir, name = os.path.split(prefix)
    for file in os.listdir(src_dir):
        if file.startswith(name + "."):
            shutil.copy(os.path.join(src_dir, file), os.path.join(directory, file))
    return os.path.join(str(directory), name)


def last_in_each_shard(prefix: str) -> dict[int, tuple[str, object]]:
    """shard -> (key, entry) of the non-empty variable tensor stored last in it."""
    last: dict = {}
    for key, entry in variable_entries(prefix).items():
        if entry.size and (entry.shard not in last or entry.offset > last[entry.shard][1].offset):
            last[entry.shard] = (key, entry)
    return last


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x20]))


@pytest.mark.parametrize("read_path", ["whole", "streamed"], indirect=True)  # one check
@pytest.mark.parametrize("damage", ["bitflip", "truncate", "missing"])
def test_damaged_shard_raises_and_changes_nothing(saved, tmp_path, damage, read_path):
    case, _, _, saved_prefix = saved
    prefix = _copy(saved_prefix, tmp_path / "copy")
    k = _bundle.read_index(prefix).num_shards
    target = target_for(case)
    guarded = values(target)
    snap = objckpt.snapshot(target)
    for shard, (key, entry) in sorted(last_in_each_shard(prefix).items()):
        prefix = _copy(saved_prefix, tmp_path / f"{damage}{shard}")
        path = _bundle.shard_name(prefix, shard, k)
        if damage == "bitflip":
            _flip(path, entry.offset + entry.size - 1)  # the last byte of the last tensor
        elif damage == "truncate":
            os.truncate(path, entry.offset + entry.size // 2)
        else:
            os.remove(path)
        with pytest.raises(errors.CheckpointCorruptError) as info:
            objckpt.restore(target, prefix)
        message = str(info.value)
        assert prefix in message, message
        if damage == "bitflip":  # names the entry (its object path, or its key)
            path = key.split("/.ATTRIBUTES/")[0]
            shown = message.replace(prefix, "<prefix>")
            assert f"`{path}`" in shown or f"`{key}`" in shown, message
        elif damage == "missing":
            assert os.path.basename(path) in message or f"shard {shard}" in message, message
        assert_bits(guarded, values(target), f"{damage} in shard {shard}")
        assert_bits(guarded, snap.numpy(), "the snapshot")
        assert not objckpt.verify(prefix).ok
    # the intact checkpoint still restores
    objckpt.restore(target, saved_prefix)
    assert_bits(saved[2], values(target))


def test_damaged_zoo_tensor_of_every_dtype_raises_and_changes_nothing(tmp_path, read_path):
    zoo = Zoo(1)
    saved_prefix = objckpt.save(zoo, str(tmp_path / "zoo"))
    target = Zoo(2)
    guarded = values(target)
    for number, (key, entry) in enumerate(variable_entries(saved_prefix).items()):
        if not entry.size:
            continue
        prefix = _copy(saved_prefix, tmp_path / f"copy{number}")  # no key in the path
        k = _bundle.read_index(prefix).num_shards
        _flip(_bundle.shard_name(prefix, entry.shard, k), entry.offset + entry.size // 2)
        with pytest.raises(errors.CheckpointCorruptError) as info:
            objckpt.restore(target, prefix)
        message = str(info.value).replace(prefix, "<prefix>")
        assert f"`{key.split('/.ATTRIBUTES/')[0]}`" in message or f"`{key}`" in message, message
        assert_bits(guarded, values(target), key)


def test_snapshot_taken_before_a_restore_keeps_its_values(saved, read_path):
    case, _, saved_values, prefix = saved
    target = target_for(case)
    before = values(target)
    snap = objckpt.snapshot(target)
    objckpt.restore(target, prefix)
    assert_bits(saved_values, values(target), "restored")
    assert_bits(before, snap.numpy(), "the snapshot after the restore")
    objckpt.restore(target, snap)
    assert_bits(before, values(target), "restored from the snapshot")
    # the variables may now share their buffers with the snapshot's tensors (a fused
    # assign aliases them): a restore from the prefix writes none of them
    objckpt.restore(target, prefix)
    assert_bits(saved_values, values(target), "restored again")
    assert_bits(before, snap.numpy(), "the snapshot after a restore over its buffers")


def test_zoo_snapshot_taken_before_a_restore_keeps_its_values(tmp_path, read_path):
    prefix = objckpt.save(Zoo(1), str(tmp_path / "zoo"))
    target = Zoo(2)
    before = values(target)
    snap = objckpt.snapshot(target)
    held = {p: tf.identity(v) for p, v in objckpt.tree(target).items()}  # another reader
    objckpt.restore(target, prefix)
    assert_bits(values(Zoo(1)), values(target))
    assert_bits(before, snap.numpy())
    assert_bits(before, {p: v.numpy() for p, v in held.items()})
    objckpt.restore(target, snap)
    assert_bits(before, values(target))
    objckpt.restore(target, prefix)  # over buffers the snapshot may share
    assert_bits(values(Zoo(1)), values(target))
    assert_bits(before, snap.numpy())


# --- the generic path: devices, mixed precision, at=, rules, strict=False ---------------


def test_restore_into_variables_on_another_device(tmp_path, streamed):
    prefix = objckpt.save(Zoo(1), str(tmp_path / "zoo"))
    for device in (None, "/cpu:1"):
        target = Zoo(2, device=device)
        objckpt.restore(target, prefix)
        assert_bits(values(Zoo(1)), values(target), str(device))
        if device:
            assert all(v.device.endswith("CPU:1") for v in objckpt.tree(target).values())


@pytest.mark.parametrize("flavour", [f for f in FLAVOURS if f != "module"])
def test_restore_into_keras_model_on_another_device(flavour, tmp_path, streamed):
    keras_for(flavour)
    source = build(flavour)
    prefix = objckpt.save(source, str(tmp_path / "ck"))
    with tf.device("/cpu:1"):
        target = build(flavour)
    perturb(target)
    objckpt.restore(target, prefix)
    assert_bits(values(source), values(target))


def _mixed(keras):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        rng = np.random.default_rng(0)
        model.fit(rng.normal(size=(8, 6)).astype("float32"),
                  rng.normal(size=(8, 2)).astype("float32"), epochs=1, batch_size=4,
                  verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


@pytest.mark.parametrize("flavour", [f for f in FLAVOURS if f != "module"])
def test_mixed_precision_model_round_trip(flavour, tmp_path, streamed):
    keras = keras_for(flavour)
    source = _mixed(keras)
    assert any(v.dtype == tf.float32 for v in source.trainable_variables)
    prefix = objckpt.save(source, str(tmp_path / "ck"))
    assert assert_layout(prefix) == 1
    target = _mixed(keras)
    perturb(target)
    objckpt.restore(target, prefix)
    assert_bits(values(source), values(target))


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def wrapped(request, tmp_path_factory):
    """(case, obj, prefix of tf.train.Checkpoint(wrapper=obj) + a stray variable), written as
    SaveV2 parts (K data shards: restores read several shards)."""
    obj = build(*request.param)
    root = tf.train.Checkpoint(wrapper=obj, stray=tf.Variable([1.0, 2.0, 3.0]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_bundlewrite, "supported", lambda tensors: False)
        prefix = objckpt.save(root, str(tmp_path_factory.mktemp("wrapped") / "ck"))
    return request.param, obj, prefix


def test_restore_at_a_subtree(wrapped, streamed):
    case, obj, prefix = wrapped
    assert assert_layout(prefix) > 1
    target = target_for(case)
    report = objckpt.restore(target, prefix, at="wrapper")
    assert_bits(values(obj), values(target))
    assert report.at == "wrapper" and set(report.restored) == set(values(obj))


def test_restore_with_rules_and_not_strict(wrapped, streamed):
    case, obj, prefix = wrapped
    target = target_for(case)
    perturbed = values(target)
    report = objckpt.restore(target, prefix, rules=[(r"^wrapper/", "")], strict=False)
    assert "stray" in report.unexpected
    got, want = values(target), values(obj)
    left = set(got) - set(report.restored)  # only what the report says it skipped
    assert all(any(s.startswith(path + " ") for s in report.skipped) for path in left), (
        left, report.skipped)
    for path in got:
        expected = want[path] if path in report.restored else perturbed[path]
        assert bits(got[path]) == bits(expected), path


def test_restore_not_strict_with_a_missing_entry(saved, tmp_path, streamed):
    case, obj, saved_values, _ = saved
    items = dict(objckpt.snapshot(obj).items())
    dropped = next(p for p in items if not p.startswith("optimizer") and "OPTIMIZER" not in p)
    del items[dropped]
    prefix = objckpt.save(objckpt.Snapshot(items), str(tmp_path / "partial"))
    assert assert_layout(prefix) == 1
    target = target_for(case)
    perturbed = values(target)
    report = objckpt.restore(target, prefix, strict=False)
    assert dropped in report.missing
    got = values(target)
    for path in got:
        expected = saved_values[path] if path in report.restored else perturbed[path]
        assert bits(got[path]) == bits(expected), path
    assert bits(got[dropped]) == bits(perturbed[dropped])


# --- ensembles and migration read sharded checkpoints ------------------------------------


def test_load_ensemble_of_three_parallel_written_checkpoints(saved, tmp_path, streamed):
    case, obj, _, _ = saved
    net = network(obj)
    original, prefixes, expected = values(net), [], []
    try:
        for k in range(3):
            for variable in objckpt.tree(net).values():
                if variable.dtype.is_floating:
                    variable.assign(variable * (1.0 + 0.25 * k) + 0.5 * k)
            prefixes.append(objckpt.save(net, str(tmp_path / f"m{k}" / "ck")))
            expected.append({p: v.numpy() for p, v in _compat.network_variable_paths(net)})
    finally:
        objckpt.restore(net, objckpt.Snapshot(original))
    assert all(assert_layout(p) == 1 for p in prefixes)
    ensemble = objckpt.load_ensemble(network(target_for(case)), prefixes, strict=False)
    for k, (member, want) in enumerate(zip(ensemble.members, expected)):
        got = dict(_compat.network_variable_paths(member))
        assert set(got) == set(want)
        for path in want:
            assert bits(got[path].numpy()) == bits(want[path]), (k, path)


def test_migrate_from_a_parallel_written_checkpoint(saved, tmp_path, streamed):
    case, _, saved_values, prefix = saved
    out = objckpt.migrate(target_for(case), prefix, str(tmp_path / "out" / "ck"),
                          optimizer_state=True)
    assert objckpt.verify(out).ok
    target = target_for(case)
    objckpt.restore(target, out)
    assert_bits(saved_values, values(target))


# --- durable mode ------------------------------------------------------------------------


@pytest.fixture
def fsynced(monkeypatch):
    """The real paths fsynced (os.fsync / os.fdatasync), in order."""
    paths: list[str] = []
    real_fsync, real_fdatasync = os.fsync, getattr(os, "fdatasync", None)

    def record(real):
        def sync(fd):
            paths.append(os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}"))
            return real(fd)
        return sync

    monkeypatch.setattr(os, "fsync", record(real_fsync))
    if real_fdatasync is not None:
        monkeypatch.setattr(os, "fdatasync", record(real_fdatasync))
    return paths


def assert_durable(paths: list[str], prefix: str) -> None:
    """Every data shard, the index and the directory of prefix were fsynced: the files
    under their temporary names (before the commit renames) or their own; the directory
    before the renames and once more after them (last)."""
    directory, name = os.path.split(os.path.realpath(prefix))
    k = _bundle.read_index(prefix).num_shards
    temp = re.compile(rf"(\.{re.escape(name)}\.tmp-[0-9a-f]+|{re.escape(name)})")
    files = [os.path.basename(p) for p in paths if os.path.dirname(p) == directory]
    for i in range(k):
        suffix = f".data-{i:05d}-of-{k:05d}"
        assert any(re.fullmatch(temp.pattern + re.escape(suffix), f) for f in files), (
            suffix, files)
    assert any(re.fullmatch(temp.pattern + r"\.index", f) for f in files), files
    assert paths.count(directory) >= 2, paths
    assert paths[-1] == directory, paths


def test_durable_save_fsyncs_every_shard_the_index_and_the_directory(tmp_path, fsynced, parts):
    prefix = objckpt.save(Zoo(1), str(tmp_path / "ck"), durable=True)
    assert assert_layout(prefix) > 1
    assert_durable(fsynced, prefix)


def test_durable_save_by_objckpts_writer(tmp_path, fsynced):
    prefix = objckpt.save(Zoo(1), str(tmp_path / "ck"), durable=True)
    assert assert_layout(prefix) == 1
    assert_durable(fsynced, prefix)


def test_not_durable_save_fsyncs_nothing(tmp_path, fsynced):
    for writer in ("own", "parts"):
        with pytest.MonkeyPatch.context() as patch:
            if writer == "parts":
                patch.setattr(_bundlewrite, "supported", lambda tensors: False)
            prefix = objckpt.save(Zoo(1), str(tmp_path / writer), durable=False)
        assert assert_layout(prefix) == (1 if writer == "own" else THREADS)
    assert fsynced == []


@pytest.mark.parametrize("default", [False, True])
def test_durable_none_follows_the_library_default(tmp_path, fsynced, monkeypatch, default):
    monkeypatch.setattr(_fastio, "DURABLE_DEFAULT", default)
    for durable in ({}, {"durable": None}):
        fsynced.clear()
        prefix = objckpt.save(Zoo(1), str(tmp_path / "ck"), **durable)
        if default:
            assert_durable(fsynced, prefix)
        else:
            assert fsynced == []


def test_durable_save_of_a_snapshot_and_of_a_keras_model(tmp_path, fsynced):
    for i, obj in enumerate([objckpt.snapshot(Zoo(1)), build(session_flavour())]):
        fsynced.clear()
        prefix = objckpt.save(obj, str(tmp_path / f"ck{i}"), durable=True)
        assert_durable(fsynced, prefix)


@pytest.mark.parametrize("durable", [False, True])
def test_checkpoint_manager_passes_durable_through(tmp_path, fsynced, durable):
    zoo = Zoo(1)
    with objckpt.CheckpointManager(zoo, str(tmp_path / "run"), durable=durable) as manager:
        prefix = manager.save(1)
    assert prefix is not None
    if durable:
        assert_durable(fsynced, prefix)
    else:
        assert fsynced == []
    target = Zoo(2)
    objckpt.restore(target, prefix, strict=False)
    assert_bits(values(zoo), {p: v for p, v in values(target).items()})


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("durable", [False, True])
def test_checkpointing_passes_durable_through(tmp_path, fsynced, durable, async_save):
    model = build(session_flavour(), train=False)
    callback = objckpt.callbacks.Checkpointing(str(tmp_path / "run"), durable=durable,
                                               async_save=async_save, verbose=0)
    images, tokens, targets = _data()
    model.fit([images, tokens], targets, epochs=2, batch_size=4, verbose=0,
              callbacks=[callback])
    assert len(callback.saved) == 2
    if durable:
        for prefix in callback.saved:
            assert os.path.exists(prefix + ".index")
        assert_durable(fsynced, callback.saved[-1])
        directory = os.path.realpath(str(tmp_path / "run"))
        # both checkpoints' shards went to disk, whatever the order
        for prefix in callback.saved:
            k = _bundle.read_index(prefix).num_shards
            name = os.path.basename(prefix)
            for i in range(k):
                suffix = f".data-{i:05d}-of-{k:05d}"
                assert any(os.path.dirname(p) == directory and p.endswith(suffix)
                           and name in os.path.basename(p) for p in fsynced), (prefix, suffix)
    else:
        assert fsynced == []


@pytest.mark.parametrize("durable", ["yes", 1, 0.0])
def test_durable_must_be_a_bool_or_none(tmp_path, durable):
    with pytest.raises(errors.InvalidArgumentError, match="durable"):
        objckpt.save(Zoo(1), str(tmp_path / "ck"), durable=durable)
    with pytest.raises(errors.InvalidArgumentError, match="durable"):
        objckpt.CheckpointManager(Zoo(1), str(tmp_path / "run"), durable=durable)
    with pytest.raises(errors.InvalidArgumentError, match="durable"):
        objckpt.callbacks.Checkpointing(str(tmp_path / "run2"), durable=durable)
    assert sorted(os.listdir(tmp_path)) == []
