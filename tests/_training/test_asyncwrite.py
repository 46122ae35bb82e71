"""objckpt.save(..., blocking=False): a SaveHandle, the values at the call, call order,
errors raised by result()."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._bundle import fastio as _fastio
from objckpt._bundle import files as _files
from objckpt._bundle import index as _bundle
from objckpt._bundle import write as _bundlewrite

from flavours import CASES, _data, build, case_id, session_flavour, train_more
from support import assert_bits, bits, perturb, values


class Gate:
    """Holds every background write (`_files.write_tensors` on a thread that is not the
    main one) until `open()`; counts the writes it held."""

    def __init__(self, monkeypatch):
        self._event = threading.Event()
        self.held = 0
        original = _files.write_tensors

        def gated(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                self.held += 1
                assert self._event.wait(60), "the gate was never opened"
            return original(*args, **kwargs)

        monkeypatch.setattr(_files, "write_tensors", gated)

    def open(self):
        self._event.set()


@pytest.fixture
def gate(monkeypatch):
    gate = Gate(monkeypatch)
    yield gate
    gate.open()  # never leave the background thread waiting


@pytest.fixture(scope="module", params=CASES, ids=case_id)
def case(request):
    return request.param


@pytest.fixture(scope="module")
def trained(case):
    return build(*case)


def test_save_without_blocking_returns_a_handle_to_a_valid_checkpoint(case, trained,
                                                                      tmp_path):
    before = values(trained)
    prefix = str(tmp_path / "ck")
    handle = objckpt.save(trained, prefix, blocking=False)
    assert isinstance(handle, objckpt.SaveHandle)
    assert handle.prefix == prefix
    assert handle.result() == prefix
    assert handle.done()
    assert handle.result() == prefix  # again: the same
    assert objckpt.verify(prefix).ok
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    fresh = build(*case)
    perturb(fresh)
    tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
    assert_bits(before, values(fresh), "tf.train.Checkpoint.read")
    fresh = build(*case)
    perturb(fresh)
    objckpt.restore(fresh, prefix)
    assert_bits(before, values(fresh), "objckpt.restore")
    # a blocking save of the same values writes the same tensors
    blocking = objckpt.save(trained, str(tmp_path / "blocking"))
    assert blocking == str(tmp_path / "blocking")
    reader, other = tf.train.load_checkpoint(prefix), tf.train.load_checkpoint(blocking)
    for path in before:
        key = _paths.checkpoint_key(path)
        assert bits(reader.get_tensor(key)) == bits(other.get_tensor(key)), path


def test_values_written_are_those_at_the_call(case, tmp_path, gate):
    obj = build(*case)
    at_call = values(obj)
    prefix = str(tmp_path / "ck")
    handle = objckpt.save(obj, prefix, blocking=False)
    # training goes on before the write: assignments and an optimizer step
    perturb(obj, 0.5)
    train_more(obj)
    perturb(obj, 0.25)
    changed = values(obj)
    assert all(bits(changed[p]) != bits(at_call[p]) for p in at_call
               if at_call[p].dtype.kind == "f" and at_call[p].size)
    assert not handle.done()
    assert not os.path.exists(prefix + ".index")
    gate.open()
    assert handle.result() == prefix
    assert gate.held == 1
    fresh = build(*case)
    objckpt.restore(fresh, prefix)
    assert_bits(at_call, values(fresh), "restored")
    assert_bits(changed, values(obj), "the obj itself")  # the save changed nothing


def test_values_at_the_call_even_without_a_gate(case, tmp_path):
    obj = build(*case)
    handles, at_call = [], []
    for k in range(3):
        at_call.append(values(obj))
        handles.append(objckpt.save(obj, str(tmp_path / f"ck{k}"), blocking=False))
        train_more(obj)  # right after the call
        perturb(obj, 0.125)
    fresh = build(*case)
    for handle, expected in zip(handles, at_call):
        objckpt.restore(fresh, handle.result())
        assert_bits(expected, values(fresh), handle.prefix)


@pytest.mark.parametrize("how", ["in-place", "streamed", "whole", "snapshot"])
def test_values_at_the_call_survive_a_restore_before_the_write(case, trained, tmp_path,
                                                                monkeypatch, gate, how):
    """A restore right after a save without blocking (in place into the variables' buffers,
    through copies, or from a Snapshot) changes nothing the pending save writes."""
    if how != "whole":
        monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)
    if how == "in-place":
        monkeypatch.setattr(_fastio, "MAP_BYTES", 1)
    other = objckpt.save(trained, str(tmp_path / "other"))  # written before the gate
    other_values = values(trained)
    obj = build(*case)
    perturb(obj)
    at_call = values(obj)
    handle = objckpt.save(obj, str(tmp_path / "ck"), blocking=False)
    source = objckpt.snapshot(trained) if how == "snapshot" else other
    objckpt.restore(obj, source)
    assert_bits(other_values, values(obj), "restored")
    assert not handle.done()
    gate.open()
    fresh = build(*case)
    objckpt.restore(fresh, handle.result())
    assert_bits(at_call, values(fresh), "written")


def test_several_saves_complete_in_call_order(tmp_path, gate):
    class Counter(tf.Module):
        def __init__(self):
            super().__init__()
            self.value = tf.Variable(np.zeros((64, 64), "float32"))
            self.step = tf.Variable(0, dtype=tf.int64)

    counter = Counter()
    handles = []
    for k in range(5):
        counter.value.assign(tf.fill((64, 64), float(k)))
        counter.step.assign(k)
        handles.append(objckpt.save(counter, str(tmp_path / f"ck-{k}"), blocking=False))
    assert not any(h.done() for h in handles)
    gate.open()
    for k, handle in enumerate(handles):
        assert handle.result() == str(tmp_path / f"ck-{k}")
        assert all(h.done() for h in handles[:k + 1])  # the earlier ones ended before
    assert gate.held == 5
    for k, handle in enumerate(handles):
        reader = tf.train.load_checkpoint(handle.prefix)
        assert float(reader.get_tensor("value/.ATTRIBUTES/VARIABLE_VALUE")[3, 5]) == k
        assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == k


def test_saves_to_one_prefix_in_order_leave_the_last(tmp_path):
    module = tf.Module()
    module.v = tf.Variable(0.0)
    prefix = str(tmp_path / "ck")
    handles = []
    for k in range(6):
        module.v.assign(float(k))
        handles.append(objckpt.save(module, prefix, blocking=False))
    assert [h.result() for h in handles] == [prefix] * 6
    assert float(tf.train.load_checkpoint(prefix).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")) \
        == 5.0
    assert sorted(os.listdir(tmp_path)) == ["ck.data-00000-of-00001", "ck.index"]


def _blocked_prefixes(tmp_path):
    """Prefixes no save can write: under a regular file, and (not as root) in a read-only
    directory."""
    (tmp_path / "file").write_text("not a directory")
    found = [("under a file", str(tmp_path / "file" / "ck")),
             ("under a file, deeper", str(tmp_path / "file" / "sub" / "ck"))]
    if os.geteuid() != 0:
        readonly = tmp_path / "readonly"
        readonly.mkdir()
        readonly.chmod(0o500)
        found.append(("read-only directory", str(readonly / "ck")))
    return found


def test_error_is_raised_by_result_with_the_blocking_type(tmp_path):
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    for what, prefix in _blocked_prefixes(tmp_path):
        with pytest.raises(Exception) as blocking:
            objckpt.save(module, prefix)
        handle = objckpt.save(module, prefix, blocking=False)  # the call itself does not raise
        assert isinstance(handle, objckpt.SaveHandle)
        with pytest.raises(type(blocking.value)) as info:
            handle.result()
        assert type(info.value) is type(blocking.value), what
        assert handle.done()
        with pytest.raises(type(blocking.value)):
            handle.result()  # again: the same error
    # the background writer goes on after a failure
    after = objckpt.save(module, str(tmp_path / "fine" / "ck"), blocking=False)
    assert after.result() == str(tmp_path / "fine" / "ck")
    assert objckpt.verify(after.prefix).ok


def test_a_failed_save_between_good_ones(tmp_path):
    module = tf.Module()
    module.v = tf.Variable(0.0)
    (tmp_path / "file").write_text("x")
    handles = []
    for k, prefix in enumerate([tmp_path / "a", tmp_path / "file" / "b", tmp_path / "c"]):
        module.v.assign(float(k))
        handles.append(objckpt.save(module, str(prefix), blocking=False))
    assert handles[0].result() == str(tmp_path / "a")
    with pytest.raises(Exception):  # noqa: B017 - its type is the blocking save's (above)
        handles[1].result()
    assert handles[2].result() == str(tmp_path / "c")
    for k, name in ((0, "a"), (2, "c")):
        reader = tf.train.load_checkpoint(str(tmp_path / name))
        assert float(reader.get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")) == k


def test_failed_save_over_an_existing_checkpoint_leaves_it(tmp_path, monkeypatch):
    module = tf.Module()
    module.v = tf.Variable(1.0)
    prefix = objckpt.save(module, str(tmp_path / "ck"))
    module.v.assign(2.0)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_fastio, "write_bundle", full)
    handle = objckpt.save(module, prefix, blocking=False)
    with pytest.raises(OSError, match="No space left"):
        handle.result()
    assert handle.done()
    assert float(tf.train.load_checkpoint(prefix).get_tensor(
        "v/.ATTRIBUTES/VARIABLE_VALUE")) == 1.0
    assert sorted(os.listdir(tmp_path)) == ["ck.data-00000-of-00001", "ck.index"]


def test_snapshot_saved_without_blocking(case, trained, tmp_path):
    snap = objckpt.snapshot(trained)
    handle = objckpt.save(snap, str(tmp_path / "snap"), blocking=False)
    assert handle.result() == str(tmp_path / "snap")
    fresh = build(*case)
    perturb(fresh)
    objckpt.restore(fresh, handle.prefix)
    assert_bits(snap.numpy(), values(fresh))


def test_timeout_then_result(tmp_path, gate):
    module = tf.Module()
    module.v = tf.Variable(3.0)
    handle = objckpt.save(module, str(tmp_path / "ck"), blocking=False)
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.01)
    assert not handle.done()
    assert "running" in repr(handle)
    gate.open()
    assert handle.result(timeout=60) == str(tmp_path / "ck")
    assert handle.done() and "done" in repr(handle)


@pytest.mark.parametrize("blocking", [None, 0, "no"])
def test_blocking_must_be_a_bool(tmp_path, blocking):
    module = tf.Module()
    module.v = tf.Variable(3.0)
    with pytest.raises(errors.InvalidArgumentError, match="blocking"):
        objckpt.save(module, str(tmp_path / "ck"), blocking=blocking)
    assert not os.path.exists(tmp_path / "ck.index")


def test_durable_background_save(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    module = tf.Module()
    module.v = tf.Variable(np.arange(100, dtype="float32"))
    handle = objckpt.save(module, str(tmp_path / "ck"), blocking=False, durable=True)
    handle.result()
    directory = os.path.realpath(tmp_path)
    k = _bundle.read_index(handle.prefix).num_shards
    names = [os.path.basename(p) for p in synced]
    for i in range(k):
        assert any(n.endswith(f".data-{i:05d}-of-{k:05d}") for n in names), names
    assert any(n.endswith(".index") for n in names)
    assert synced[-1] == directory and synced.count(directory) >= 2
    synced.clear()
    objckpt.save(module, str(tmp_path / "ck2"), blocking=False, durable=False).result()
    assert synced == []


@pytest.mark.parametrize("writer", ["own", "savev2"])
def test_checkpointing_async_save_writes_the_values_of_each_save(tmp_path, monkeypatch, writer):
    """Exact resume with async_save=True is test_checkpointing's; here: what each async save
    of the callback wrote is the model at that save, by objckpt's writer or SaveV2."""
    if writer == "savev2":
        monkeypatch.setattr(_bundlewrite, "supported", lambda tensors: False)
    monkeypatch.setenv("OBJCKPT_IO_THREADS", "3")
    model = build(session_flavour(), train=False)
    images, tokens, targets = _data()
    seen = []

    callback = objckpt.callbacks.Checkpointing(str(tmp_path / "run"), async_save=True,
                                               max_to_keep=5, verbose=0)
    keras = __import__("tf_keras" if session_flavour() == "tf_keras" else "keras")

    class AtEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(values(model))
            # Newest wins: a save still waiting when the next comes is superseded (never
            # written; on a loaded machine it happens). Each epoch's save is asserted here.
            callback.manager.wait()

    model.fit([images, tokens], targets, epochs=3, batch_size=4, verbose=0,
              callbacks=[callback, AtEpochEnd()])
    callback.manager.wait()
    assert len(callback.saved) == 3 and callback.manager.superseded == 0
    assert objckpt.verify(str(tmp_path / "run")).ok
    target = build(session_flavour())
    for prefix, expected in zip(callback.saved, seen):
        perturb(target)
        objckpt.restore(target, prefix, at="model")  # the callback saves the model at model/
        assert_bits(expected, values(target), prefix)


def test_a_path_like_prefix(tmp_path):
    module = tf.Module()
    module.v = tf.Variable([4.0])
    handle = objckpt.save(module, tmp_path / "ck", blocking=False)
    assert handle.prefix == str(tmp_path / "ck")
    assert handle.result() == str(tmp_path / "ck")
    assert isinstance(handle.result(), str)
