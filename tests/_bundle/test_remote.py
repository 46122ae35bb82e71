"""Checkpoints in object storage: gs:// and s3:// against real emulators.

fake-gcs-server and moto in server mode are started by `storage_servers` (module scope) on
free ports; objckpt reaches them through the clients' standard settings only
(STORAGE_EMULATOR_HOST, AWS_ENDPOINT_URL). The fault cases (SIGKILL, a server stopped, 503s,
two writers, hostile names) are in test_remote_faults.py; the CLI and the other operations
in test_remote_cli.py and test_remote_ops.py.
"""

import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
import tensorflow as tf
from storage_servers import gcs_server_fixture, s3_server_fixture, use_env  # noqa: F401

import objckpt
from objckpt import errors
from objckpt._bundle import remote as _remote
from objckpt.callbacks import Checkpointing

from flavours import _data, build_functional, keras_for, session_flavour
from support import assert_bits, values

BUCKET = "objckpt-remote"


@pytest.fixture(scope="module", params=["gs", "s3"])
def store(request):
    """(scheme, a function giving a fresh URL folder), with the client settings pointing at
    the emulator of that scheme for the module."""
    server = request.getfixturevalue("gcs_server" if request.param == "gs" else "s3_server")
    server.make_bucket(BUCKET)
    with use_env(server.env):
        yield request.param, lambda: f"{request.param}://{BUCKET}/{uuid.uuid4().hex[:10]}"


class Block(tf.Module):
    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.kernel = tf.Variable(rng.standard_normal((64, 32)).astype(np.float32))
        self.bias = tf.Variable(rng.standard_normal(32).astype(np.float64))
        self.steps = tf.Variable(np.int64(seed))


def objects(url: str) -> list[str]:
    """The names of the objects under a URL folder, as the client lists them (recursive)."""
    fs, path = _remote.client(url)
    fs.invalidate_cache()
    return sorted(name[len(path) + 1:] for name in fs.find(path))


# --- save and restore -----------------------------------------------------------------------


def test_save_then_restore_a_prefix_is_bit_exact(store):
    _, folder = store
    prefix = folder() + "/ckpt"
    source = Block(seed=1)
    written = objckpt.save(source, prefix)
    assert objects(prefix.rsplit("/", 1)[0]) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    target = Block(seed=2)
    report = objckpt.restore(target, prefix)
    assert_bits(values(source), values(target))
    assert prefix in str(report)  # the report names the URL, not the local copy
    assert written is None or prefix in str(written)


def test_restore_of_a_directory_takes_its_newest_checkpoint(store):
    _, folder = store
    directory = folder()
    for seed in (3, 4):
        objckpt.save(Block(seed=seed), f"{directory}/ckpt-{seed}")
    target = Block(seed=9)
    objckpt.restore(target, directory)
    assert_bits(values(Block(seed=4)), values(target))
    assert objckpt.plan(Block(seed=9), directory).complete


def test_a_missing_remote_checkpoint_is_a_typed_error_naming_the_url(store):
    _, folder = store
    url = folder() + "/nothing"
    with pytest.raises(errors.CheckpointNotFoundError) as info:
        objckpt.restore(Block(), url)
    assert url in str(info.value) and "Fix:" in str(info.value)


def test_a_failed_restore_from_remote_changes_nothing(store):
    _, folder = store
    prefix = folder() + "/ckpt"
    objckpt.save(Block(seed=5), prefix)

    class Wider(tf.Module):
        def __init__(self):
            self.kernel = tf.Variable(np.zeros((64, 33), np.float32))
            self.bias = tf.Variable(np.zeros(32))
            self.steps = tf.Variable(np.int64(7))

    target = Wider()
    before = values(target)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(target, prefix)
    assert "kernel" in str(info.value)
    assert_bits(before, values(target))


def test_staged_copies_are_removed_once_unused(store):
    _, folder = store
    prefix = folder() + "/ckpt"
    objckpt.save(Block(seed=6), prefix)
    objckpt.restore(Block(), prefix)
    import gc

    gc.collect()
    assert not [f for f in _remote._STAGED if os.path.exists(f)]


# --- training directories -------------------------------------------------------------------


def test_checkpoint_manager_keeps_resumes_and_lists_standard_files(store):
    _, folder = store
    directory = folder()
    block = Block(seed=1)
    with objckpt.CheckpointManager(block, directory, max_to_keep=2, verbose=0) as manager:
        for step in range(1, 5):
            block.kernel.assign_add(tf.ones_like(block.kernel))
            manager.save(step)
        assert [k.number for k in manager.kept] == [3, 4]
    names = objects(directory)
    assert names == ["checkpoint", "ckpt-3.data-00000-of-00001", "ckpt-3.index",
                     "ckpt-4.data-00000-of-00001", "ckpt-4.index"]  # the lock was released
    fresh = Block(seed=8)
    with objckpt.CheckpointManager(fresh, directory, max_to_keep=2, verbose=0) as manager:
        assert manager.restore_latest() == 4
    assert_bits(values(block), values(fresh))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_interrupted_fit_resumes_bit_identical_from_remote(store, async_save):
    keras = keras_for(session_flavour())
    _, folder = store
    directory = folder()
    images, tokens, targets = _data()

    def make():
        keras.utils.set_random_seed(0)
        return build_functional(keras, train=False)

    def fit(model, callbacks):
        model.fit([images, tokens], targets, epochs=3, batch_size=2, shuffle=False, verbose=0,
                  callbacks=callbacks)

    reference = make()
    fit(reference, [])

    class Interrupt(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            Interrupt.seen += 1
            if Interrupt.seen == 7:
                raise RuntimeError("interrupted on purpose")

    model = make()
    first = Checkpointing(directory, save_freq=3, max_to_keep=2, async_save=async_save,
                          verbose=0)
    with pytest.raises(RuntimeError, match="interrupted on purpose"):
        fit(model, [first, Interrupt()])
    first.manager.wait()
    first.manager.close()
    assert "ckpt-2.index" in objects(directory)
    model = make()
    second = Checkpointing(directory, save_freq=3, max_to_keep=2, async_save=async_save,
                           verbose=0)
    fit(model, [second])
    assert second.resumed_from == f"{directory}/ckpt-2"
    assert_bits(values(reference), values(model))
    assert [os.path.basename(p) for p in second.saved] == ["ckpt-3", "ckpt-4"]


def test_a_remote_directory_with_another_writers_lock_is_refused(store):
    _, folder = store
    directory = folder()
    with objckpt.CheckpointManager(Block(), directory, verbose=0):
        record = _remote.read_bytes(directory + "/.objckpt.lock", 4096).decode()
        assert record.startswith(f"pid {os.getpid()} on ")
    assert ".objckpt.lock" not in objects(directory)
    # A live holder elsewhere (another host, its lease running): refused, nothing changed.
    _remote.write_bytes(directory + "/.objckpt.lock",
                        b"pid 1 on elsewhere, id 00ff, lease until 99999999999.000\n")
    with pytest.raises(errors.DirectoryLockedError) as info:
        objckpt.CheckpointManager(Block(), directory, verbose=0)
    assert "pid 1 on elsewhere" in str(info.value) and info.value.directory == directory


# --- what TF reads, TF can read --------------------------------------------------------------


def test_the_uploaded_bundle_is_byte_identical_to_tf_write(store, tmp_path):
    _, folder = store
    prefix = folder() + "/ckpt"
    block = Block(seed=3)
    root = tf.train.Checkpoint(block=block)
    objckpt.save(root, prefix)
    fs, path = _remote.client(prefix)
    local = str(tmp_path / "downloaded")
    for suffix in (".index", ".data-00000-of-00001"):
        fs.get_file(path + suffix, local + suffix)
    tf_prefix = root.write(str(tmp_path / "tf"))
    for suffix in (".index", ".data-00000-of-00001"):
        with open(local + suffix, "rb") as a, open(tf_prefix + suffix, "rb") as b:
            assert a.read() == b.read(), suffix
    target = Block(seed=0)
    tf.train.Checkpoint(block=target).read(local).assert_consumed()
    assert_bits(values(block), values(target))


# --- import stays cheap ----------------------------------------------------------------------


@pytest.mark.subprocess
def test_local_use_never_imports_a_storage_client(tmp_path):
    code = ("import sys, objckpt, objckpt.callbacks; "
            "bad = [m for m in ('fsspec', 'gcsfs', 's3fs', 'botocore') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]



def test_the_lease_is_renewed_and_an_unrenewed_lock_is_taken_over(store, monkeypatch):
    from objckpt._bundle import lock as _lock

    _, folder = store
    directory = folder()
    clock = [1_000_000.0]
    monkeypatch.setattr(_lock, "now", lambda: clock[0])
    monkeypatch.setattr(_lock, "RENEW_SECONDS", 3600.0)  # renewals by hand below
    holder = _lock.RemoteLock(directory)
    holder.acquire()
    first = _remote.read_bytes(holder.path, 4096).decode()
    assert first.endswith(f"lease until {clock[0] + _lock.LEASE_SECONDS:.3f}\n")
    clock[0] += 60
    holder.refresh()  # what the thread and each commit do
    assert _remote.read_bytes(holder.path, 4096).decode().endswith(
        f"lease until {clock[0] + _lock.LEASE_SECONDS:.3f}\n")
    # A holder on another host whose lease ran out: taken over; the old holder then learns it.
    _lock._HELD.pop(holder.path)
    _remote.write_bytes(holder.path, b"pid 7 on elsewhere, id 00aa, lease until 1000100.000\n")
    clock[0] = 1_000_101.0
    taker = _lock.RemoteLock(directory)
    taker.acquire()
    assert taker.held and f"id {taker._id}," in _remote.read_bytes(taker.path, 4096).decode()
    with pytest.raises(errors.DirectoryLockedError, match="another writer took over"):
        holder.refresh()
    # Exiting without close() frees the lock (atexit), as the kernel frees a local one.
    _lock._release_remote_locks()
    assert not _remote.exists(taker.path)
