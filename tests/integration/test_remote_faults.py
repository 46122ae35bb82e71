"""The hard guarantees of remote checkpoint directories, against real servers:
fake-gcs-server and moto (tests/helpers/storage_servers.py), each test run against both.

A training process SIGKILLed mid-upload resumes bit-exact and its orphans are tidied; the
server stopped mid-upload is a typed error that `on_error="warn"` trains through; 503s, 429s
and dropped connections are retried; two writers never both commit; hostile object names
and state objects are never followed out of the directory; the simulated day of retention
keeps what it keeps on disk; and the bytes uploaded are the bytes TF writes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from urllib.parse import unquote

import numpy as np
import pytest
import tensorflow as tf
from storage_servers import (  # noqa: F401  (fixtures: gcs_server, s3_server, proxy, sleeps, _quiet_gcsfs)
    FakeSleeps,
    FaultProxy,
    gcs_server_fixture,
    proxy_fixture,
    quiet_gcsfs_fixture,
    s3_server_fixture,
    sleeps_fixture,
    use_env,
)

import objckpt
from objckpt import errors
from objckpt._bundle import lock as _dirlock
from objckpt._bundle import remote as _remote
from objckpt._bundle import state as _ckptstate
from objckpt._training import checkpointing as _checkpointing
from objckpt._training import retention as _retention

from support import HELPERS, ROOT

BUCKET = "faults"
OTHER_BUCKET = "faults-other"
SCHEME = {"gcs": "gs", "s3": "s3"}


# --- the models ------------------------------------------------------------------------------

def fit_data():
    """32 fixed samples for the Keras model (x: 4 features, y: 1 target)."""
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")


def small_model(seed: int = 0):
    """A compiled Keras 3 Dense + BatchNormalization model with Adam, built (its optimizer's
    slots too, once it has trained). `seed` picks its initial values."""
    from flavours import keras_for

    keras = keras_for("keras3")
    init = keras.initializers.GlorotUniform(seed=seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, kernel_initializer=init),
                              keras.layers.BatchNormalization(),
                              keras.layers.Dense(1, kernel_initializer=init)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


class Net(tf.Module):
    """A plain tf.Module: a matrix, a vector and a nested module, of several dtypes."""

    def __init__(self, seed: int = 0):
        super().__init__(name="net")
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.normal(size=(64, 32)).astype("float32"))
        self.b = tf.Variable(rng.integers(0, 1000, size=7), dtype=tf.int64)
        self.inner = tf.Module()
        self.inner.v = tf.Variable(rng.normal(size=5))


def values(obj) -> dict:
    """{object path: the value's bytes} of a live obj (bit-for-bit comparisons)."""
    return {path: v.numpy().tobytes() for path, v in objckpt.tree(obj).items()}


# --- the servers -----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["gcs", "s3"])
def server(request):
    """Each emulator in turn, with buckets BUCKET and OTHER_BUCKET."""
    server = request.getfixturevalue(f"{request.param}_server")
    server.make_bucket(BUCKET)
    server.make_bucket(OTHER_BUCKET)
    return server




@pytest.fixture
def base(server):
    """A fresh folder of the bucket for the test: `<scheme>://faults/<unique>`."""
    return f"{SCHEME[server.kind]}://{BUCKET}/{uuid.uuid4().hex[:10]}"


def new_fs(kind: str):
    """A fresh client for the environment in force (never a cached instance)."""
    if kind == "gcs":
        import gcsfs

        return gcsfs.GCSFileSystem(skip_instance_cache=True)
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def direct(server, function):
    """`function(fs)` with a fresh client of `server` itself, not through the proxy (so its
    requests are not among those objckpt made)."""
    with use_env(server.env):
        return function(new_fs(server.kind))


def key(url: str) -> str:
    """`bucket/key` of a URL."""
    return url.split("://", 1)[1]


def objects(server, *buckets: str) -> dict:
    """{`bucket/key`: bytes} of every object in the buckets, read with the client."""
    def read(fs):
        return {name: fs.cat_file(name) for bucket in buckets or (BUCKET, OTHER_BUCKET)
                for name in fs.find(bucket)}

    return direct(server, read)


def under(found: dict, url: str) -> dict:
    root = key(url).rstrip("/") + "/"
    return {k[len(root):]: v for k, v in found.items() if k.startswith(root)}


def touched(proxy: FaultProxy) -> list[str]:
    """`bucket/key` (or `bucket/prefix` of a listing) of each request the proxy saw (a
    GCS upload names its object in its body: those are left out)."""
    names = []
    for _, target, _ in proxy.log:
        path, _, query = target.partition("?")
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        if proxy.kind == "gcs":
            parts = path.split("/")
            if "b" not in parts:
                continue
            bucket = parts[parts.index("b") + 1]
            rest = path.split(f"/b/{bucket}/o", 1)[1] if f"/b/{bucket}/o" in path else ""
            if rest.startswith("/"):
                names.append(f"{bucket}/{unquote(rest[1:])}")
            elif "prefix" in params:
                names.append(f"{bucket}/{unquote(params['prefix'])}")
        else:
            bucket, _, rest = path.lstrip("/").partition("/")
            if rest:
                names.append(f"{bucket}/{unquote(rest)}")
            elif "prefix" in params:
                names.append(f"{bucket}/{unquote(params['prefix'])}")
    return names


# --- 1. SIGKILL during an upload, then resume -------------------------------------------------

def kill_in_flight(proxy: FaultProxy, monkeypatch, child: list) -> None:
    """SIGKILLs `child[0]` when its 3rd save's index upload reaches the proxy, which then
    drops that request: the process dies with the upload in flight (the index never lands;
    the data before it did). A GCS upload names its object in its body: the 6th plain
    upload is that index (each save uploads its data, then its index)."""
    gcs = proxy.kind == "gcs"
    method, upload = ("POST", r"uploadType=multipart$") if gcs else ("PUT", r"ckpt-3\.index$")
    count, real = [0], proxy._decide

    def decide(request_method: str, target: str):
        if request_method == method and re.search(upload, target):
            count[0] += 1
            if count[0] == (6 if gcs else 1):
                os.kill(child[0].pid, signal.SIGKILL)
                proxy.drop_next(1, method=method, path=upload)
        return real(request_method, target)

    monkeypatch.setattr(proxy, "_decide", decide)


@pytest.mark.subprocess
@pytest.mark.parametrize("kill", ["after-data", "index-in-flight"])
def test_sigkill_mid_upload_resumes_bit_exact_and_tidies_the_orphans(
        server, proxy, base, tmp_path, kill, monkeypatch):
    from flavours import keras_for

    keras = keras_for("keras3")  # the child trains a Keras 3 model
    run = base + "/run"
    # Beside the directory, a sibling whose name starts like it (`run-2`, an orphan-like
    # ckpt-3 in it): none of it may be read as a checkpoint nor deleted.
    outside = {key(base) + "/run-2/ckpt-3.data-00000-of-00001": b"sibling",
               key(base) + "/run-2/ckpt-3.index": b"sibling index"}
    direct(server, lambda fs: fs.pipe(outside))

    # The child saves every epoch. It is killed during its 3rd save: by itself once the
    # data is uploaded (fault_hook), or by this process while its index upload is in flight.
    env = {**os.environ, **proxy.env, "PYTHONPATH": os.pathsep.join(
        [ROOT, HELPERS, os.environ.get("PYTHONPATH", "")])}
    child = []
    if kill == "index-in-flight":
        kill_in_flight(proxy, monkeypatch, child)
    child.append(subprocess.Popen(
        [sys.executable, os.path.join(HELPERS, "remote_kill_worker.py"), run, str(tmp_path),
         "3" if kill == "after-data" else "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    _, stderr = child[0].communicate(timeout=300)
    assert child[0].returncode == -signal.SIGKILL, stderr.decode()[-3000:]
    left = under(objects(server), run)
    assert sorted(left) == [".objckpt.lock", "checkpoint", "ckpt-1.data-00000-of-00001",
                            "ckpt-1.index", "ckpt-2.data-00000-of-00001", "ckpt-2.index",
                            "ckpt-3.data-00000-of-00001"]  # the orphan: data, no index
    assert left[".objckpt.lock"].startswith(b"pid ")  # the dead child's, with a lease
    committed = dict(np.load(tmp_path / "committed-2.npz"))
    assert not (tmp_path / "committed-3.npz").exists()

    # A new process (here) resumes under fit: its lock is the dead child's (taken over at
    # once: same host, no such process), the orphan goes, ckpt-2's values come back.
    seen = {}

    class Recorder(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["values"] = {p.replace("/", "|"): v.numpy()
                              for p, v in objckpt.tree(self.model).items()}
            seen["objects"] = sorted(under(objects(server), run))

    model = small_model(seed=2)
    x, y = fit_data()
    proxy.reset()
    model.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0,
              callbacks=[objckpt.callbacks.Checkpointing(run, max_to_keep=5, verbose=0),
                         Recorder()])
    assert seen["objects"] == [".objckpt.lock", "checkpoint", "ckpt-1.data-00000-of-00001",
                               "ckpt-1.index", "ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    assert sorted(seen["values"]) == sorted(committed)
    for path, value in committed.items():
        assert seen["values"][path].tobytes() == value.tobytes(), path
    # Epochs 3-5 were saved as ckpt-4..6 (a number in use on disk is never reused).
    final = under(objects(server), run)
    assert sorted(n for n in final if n.endswith(".index")) == [
        f"ckpt-{n}.index" for n in (1, 2, 4, 5, 6)]
    found = objects(server)
    for name, data in outside.items():
        assert found[name] == data
    assert not any(".." in name or "/run-2/" in name for name in touched(proxy))


# --- 2. the server stopped mid-upload ---------------------------------------------------------

def stop_at(proxy: FaultProxy, stage: str, save: int):
    """A fault_hook: refuses connections (the server stopped) at `stage` of save number
    `save` (1: the first save once it is installed)."""
    count = {}

    def hook(name: str) -> None:
        count[name] = count.get(name, 0) + 1
        if name == stage and count[name] == save:
            proxy.refuse()

    return hook


def test_server_stopped_mid_upload_is_a_typed_error_and_the_previous_checkpoint_stays(
        server, proxy, base, sleeps, monkeypatch):
    run = base + "/run"
    net = Net(1)
    manager = objckpt.CheckpointManager(net, run, verbose=0)
    try:
        manager.save(1)
        saved = values(net)
        net.w.assign(net.w + 1.0)
        # Data uploaded, then the server goes away before the index.
        monkeypatch.setattr(_checkpointing, "fault_hook", stop_at(proxy, "data", 1))
        with pytest.raises(errors.CheckpointWriteError) as caught:
            manager.save(2)
        monkeypatch.setattr(_checkpointing, "fault_hook", None)
        assert caught.value.prefix == run + "/ckpt-2"
        message = str(caught.value)
        assert f"`{run}/ckpt-2`" in message and f"`{run}/ckpt-1`" in message, message
        assert "Fix:" in message
        assert manager.latest == run + "/ckpt-1"
    finally:
        proxy.resume()
        manager.close()
    # The orphan data object is there until the next open tidies it; ckpt-1 restores exactly.
    assert "ckpt-2.data-00000-of-00001" in under(objects(server), run)
    fresh = Net(2)
    with objckpt.CheckpointManager(fresh, run, verbose=0) as again:
        assert again.restore_latest() == 1
        assert sorted(under(objects(server), run)) == [
            ".objckpt.lock", "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    assert values(fresh) == saved


def test_on_error_warn_trains_through_a_stopped_server_and_saves_again(
        server, proxy, base, sleeps, monkeypatch):
    run = base + "/run"
    # Epoch 2's save loses the server after its data; it is back when epoch 3 begins.
    monkeypatch.setattr(_checkpointing, "fault_hook", stop_at(proxy, "data", 2))
    model = small_model(seed=3)
    keras = pytest.importorskip("keras")

    class Restart(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                proxy.resume()

    x, y = fit_data()
    callback = objckpt.callbacks.Checkpointing(run, max_to_keep=5, on_error="warn", verbose=0)
    with pytest.warns(RuntimeWarning) as record:
        history = model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0,
                            callbacks=[callback, Restart()])
    monkeypatch.setattr(_checkpointing, "fault_hook", None)
    assert len(history.history["loss"]) == 4  # fit went on
    failed = [str(w.message) for w in record if f"`{run}/ckpt-2`" in str(w.message)]
    assert len(failed) == 1, [str(w.message) for w in record]
    assert "Could not write checkpoint" in failed[0] and "on_error='warn'" in failed[0]
    left = under(objects(server), run)
    assert sorted(n for n in left if n.endswith(".index")) == [
        "ckpt-1.index", "ckpt-3.index", "ckpt-4.index"]
    state = _ckptstate.parse_state(left["checkpoint"])
    assert list(state.all_model_checkpoint_paths) == ["ckpt-1", "ckpt-3", "ckpt-4"]
    trained = values(model)
    fresh = small_model(seed=4)
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0)  # built, its optimizer too
    with objckpt.CheckpointManager(fresh, run, verbose=0) as manager:
        assert manager.restore_latest() is not None
    assert values(fresh) == trained


# --- 3. transient failures are retried ----------------------------------------------------------

def test_503_429_and_dropped_connections_are_retried_on_save_and_restore(
        server, proxy, base, sleeps, monkeypatch):
    run = base + "/run"
    net = Net(5)
    data = r"ckpt-1\.data-00000-of-00001"
    with objckpt.CheckpointManager(net, run, verbose=0) as manager:
        proxy.reset()
        if server.kind == "gcs":  # an upload names its object in its body: the data goes first
            proxy.fail_next(2, 503, method="POST", path=r"uploadType=multipart$")
            proxy.fail_next(2, 429, method="POST", path=r"ifGenerationMatch=[1-9]")
        else:
            proxy.fail_next(2, 503, method="PUT", path=data)
            proxy.fail_next(2, 429, method="PUT", path=r"/checkpoint$")
        proxy.drop_next(2, method="GET", path=r"delimiter")  # listings
        assert manager.save(1) == run + "/ckpt-1"
        assert proxy.failed == 6, proxy.log
    saved_failures = [entry for entry in proxy.log if entry[2] in ("503", "429", "dropped")]
    assert len(saved_failures) == 6

    proxy.reset()
    # S3: the data object (8 KiB) is downloaded in 1 KiB ranged parts, several at a time;
    # GCS: by gcsfs's own (concurrent) get_file.
    monkeypatch.setattr(_remote, "PART_BYTES", 1024)
    proxy.drop_next(2, method="GET", path=data)
    proxy.fail_next(2, 429, method="GET", path=r"ckpt-1\.index")
    proxy.fail_next(2, 503, method="GET", path=r"checkpoint")
    fresh = Net(6)
    objckpt.restore(fresh, run, at="model")
    assert proxy.failed == 6, proxy.log
    ranged = [e for e in proxy.log if e[0] == "GET" and re.search(data, e[1])]
    assert len([e for e in ranged if e[2] in ("200", "206")]) >= (
        8 if server.kind == "s3" else 1), ranged
    assert values(fresh) == values(net)
    assert sleeps.delays  # the clients backed off (on the fake clock) and tried again


def test_a_lost_answer_of_a_conditional_write_is_read_back(server, proxy, base, sleeps):
    # The server applies the write but its answer is lost; the client's own retry then fails
    # the precondition. objckpt reads the object back and finds its own bytes: committed.
    run = base + "/run"
    net = Net(7)
    with objckpt.CheckpointManager(net, run, verbose=0) as manager:
        manager.save(1)
        proxy.reset()
        if server.kind == "gcs":  # the lock's renewal, the first conditional replace
            proxy.fail_next(1, 503, method="POST", path=r"ifGenerationMatch=[1-9]", after=True)
        else:  # the state object, the commit point
            proxy.fail_next(1, 503, method="PUT", path=r"/checkpoint$", after=True)
        assert manager.save(2) == run + "/ckpt-2"
        assert [e[2] for e in proxy.log if e[2].startswith("503")] == ["503 after 200"]
        assert manager.save(3) == run + "/ckpt-3"  # the versions it holds are the real ones
    state = _ckptstate.parse_state(under(objects(server), run)["checkpoint"])
    assert state.model_checkpoint_path == "ckpt-3"


def test_a_lost_answer_that_cannot_be_read_back_does_not_lose_the_lock(
        server, proxy, base, sleeps):
    # The lease renewal lands, its answer is lost, and the lock cannot be read back either
    # (the store fails for a while): the outcome is unknown, the save fails, but the writer
    # still holds its lock (its record has its id) and saves once the store is back.
    run = base + "/run"
    net = Net(7)
    with objckpt.CheckpointManager(net, run, verbose=0) as manager:
        manager.save(1)
        proxy.reset()
        if server.kind == "gcs":  # the lease's renewal: the first conditional replace
            proxy.fail_next(1, 503, method="POST", path=r"ifGenerationMatch=[1-9]", after=True)
        else:
            proxy.fail_next(1, 503, method="PUT", path=r"/\.objckpt\.lock$", after=True)
        proxy.fail_next(1000, 503, method="GET", path=r"\.objckpt\.lock")
        proxy.fail_next(1000, 503, method="HEAD", path=r"\.objckpt\.lock")
        with pytest.raises(errors.CheckpointWriteError) as caught:
            manager.save(2)
        assert "another writer" not in str(caught.value), str(caught.value)
        proxy.reset()  # the store is back
        assert manager.save(3) == run + "/ckpt-3"
        assert manager.save(4) == run + "/ckpt-4"
    state = _ckptstate.parse_state(under(objects(server), run)["checkpoint"])
    assert list(state.all_model_checkpoint_paths) == ["ckpt-1", "ckpt-3", "ckpt-4"]


def test_a_commit_whose_outcome_is_unknown_is_neither_undone_nor_taken_for_a_conflict(
        server, proxy, base, sleeps, monkeypatch):
    # The state object is written, its answer is lost and it cannot be read back: the save
    # fails, ckpt-2 is left for the next open to judge (the state object may list it), and
    # the next saves commit (the version there is this writer's own).
    run = base + "/run"
    net = Net(7)
    with objckpt.CheckpointManager(net, run, max_to_keep=5, verbose=0) as manager:
        manager.save(1)
        lock = manager._directory.commits.lock
        # No renewal for this save: the state object's write is its first conditional one
        # (a GCS upload names its object in its body, not in its URL).
        renew = [False]
        monkeypatch.setattr(lock, "refresh", lambda real=lock.refresh: renew[0] and real())
        proxy.reset()
        if server.kind == "gcs":
            proxy.fail_next(1, 503, method="POST", path=r"ifGenerationMatch=[1-9]", after=True)
        else:
            proxy.fail_next(1, 503, method="PUT", path=r"/checkpoint$", after=True)
        proxy.fail_next(1000, 503, method="GET", path=r"/checkpoint|%2Fcheckpoint")
        proxy.fail_next(1000, 503, method="HEAD", path=r"/checkpoint$")
        with pytest.raises(errors.CheckpointWriteError) as caught:
            manager.save(2)
        assert "another writer" not in str(caught.value), str(caught.value)
        renew[0] = True
        proxy.reset()  # the store is back
        left = under(objects(server), run)
        assert list(_ckptstate.parse_state(left["checkpoint"]).all_model_checkpoint_paths) == [
            "ckpt-1", "ckpt-2"]  # it had landed
        assert "ckpt-2.index" in left  # so ckpt-2 was not deleted under it
        assert manager.save(3) == run + "/ckpt-3"
    state = _ckptstate.parse_state(under(objects(server), run)["checkpoint"])
    assert list(state.all_model_checkpoint_paths) == ["ckpt-1", "ckpt-3"]
    with objckpt.CheckpointManager(Net(8), run, verbose=0) as manager:  # tidies ckpt-2
        assert [k.number for k in manager.kept] == [1, 3]
    assert sorted(n for n in under(objects(server), run) if n.endswith(".index")) == [
        "ckpt-1.index", "ckpt-3.index"]


# --- 4. two writers ---------------------------------------------------------------------------

def lock_record(pid: int, host: str, until: float) -> bytes:
    return f"pid {pid} on {host}, id 0123456789abcdef, lease until {until:.3f}\n".encode()


def test_a_second_writer_is_refused_naming_the_holder_until_its_lease_ends(
        server, proxy, base, monkeypatch):
    run = base + "/run"
    clock = [1_700_000_000.0]
    monkeypatch.setattr(_dirlock, "now", lambda: clock[0])
    record = lock_record(4242, "trainer-7", clock[0] + 60)
    direct(server, lambda fs: fs.pipe_file(key(run) + "/.objckpt.lock", record))
    with pytest.raises(errors.DirectoryLockedError) as caught:
        objckpt.CheckpointManager(Net(), run, verbose=0)
    assert caught.value.holder.startswith("pid 4242 on trainer-7")
    assert "pid 4242 on trainer-7" in str(caught.value) and "Fix:" in str(caught.value)
    assert under(objects(server), run) == {".objckpt.lock": record}  # nothing written
    clock[0] += 61  # its lease ended: taken over
    with objckpt.CheckpointManager(Net(), run, verbose=0) as manager:
        mine = under(objects(server), run)[".objckpt.lock"]
        assert mine.startswith(f"pid {os.getpid()} on ".encode())
        assert manager.save(1) == run + "/ckpt-1"


def test_a_dead_process_of_this_host_does_not_hold_the_lock(server, proxy, base):
    import socket

    run = base + "/run"
    child = subprocess.Popen(["true"])  # a process of this host that ran and exited
    child.wait()
    record = lock_record(child.pid, socket.gethostname(), _dirlock.now() + 900)
    direct(server, lambda fs: fs.pipe_file(key(run) + "/.objckpt.lock", record))
    with objckpt.CheckpointManager(Net(), run, verbose=0) as manager:
        assert manager.save(1) == run + "/ckpt-1"
        assert under(objects(server), run)[".objckpt.lock"] != record


def test_a_writer_whose_lease_was_taken_over_commits_nothing_and_deletes_nothing(
        server, proxy, base, monkeypatch):
    run = base + "/run"
    clock = [1_700_000_000.0]
    monkeypatch.setattr(_dirlock, "now", lambda: clock[0])
    first_net = Net(1)
    first = objckpt.CheckpointManager(first_net, run, verbose=0)
    try:
        first.save(1)
        clock[0] += _dirlock.LEASE_SECONDS + 1  # the first writer stalls past its lease
        # The second writer is another process: this process's hand-over between its own
        # writers does not apply.
        monkeypatch.setattr(_dirlock, "_HELD", {})
        second_net = Net(2)
        with objckpt.CheckpointManager(second_net, run, verbose=0) as second:
            assert second.restore_latest() == 1
            second_net.w.assign(second_net.w * 2.0)
            assert second.save(2) == run + "/ckpt-2"
            committed = values(second_net)
            before = under(objects(server), run)
            first_net.w.assign(first_net.w - 5.0)
            with pytest.raises(errors.CheckpointWriteError) as caught:  # the lock, lost
                first.save(2)
            assert "another writer" in str(caught.value) and "Fix:" in str(caught.value)
            assert under(objects(server), run) == before  # its state object, ckpt-2: intact
    finally:
        first.close()
    fresh = Net(3)
    objckpt.restore(fresh, run, at="model")
    assert values(fresh) == committed


@pytest.mark.subprocess
def test_another_process_takes_over_a_stalled_writers_lock_and_its_commit_stands(
        server, proxy, base, monkeypatch):
    run = base + "/run"
    clock = [1_700_000_000.0]
    monkeypatch.setattr(_dirlock, "now", lambda: clock[0])
    net = Net(1)
    with objckpt.CheckpointManager(net, run, max_to_keep=5, verbose=0) as first:
        first.save(1)
        first.save(2)
        # This process stalls past its lease; another process takes the directory over and
        # commits a state object of its own (listing ckpt-1 only).
        later = clock[0] + _dirlock.LEASE_SECONDS + 1
        env = {**os.environ, **proxy.env}
        done = subprocess.run([sys.executable, os.path.join(HELPERS, "remote_lock_child.py"),
                               run, repr(later)], env=env, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        assert done.stdout.decode().startswith("pid ")
        theirs = under(objects(server), run)
        clock[0] = later
        with pytest.raises(errors.CheckpointWriteError) as caught:
            first.save(3)
        assert "another writer took over" in str(caught.value)
        with pytest.raises(errors.DirectoryLockedError):  # and it stays out
            first.save(4)
        assert under(objects(server), run) == theirs  # their state, lock and ckpt-1, 2
    assert under(objects(server), run) == theirs  # closing releases nothing of theirs
    state = _ckptstate.parse_state(theirs["checkpoint"])
    assert list(state.all_model_checkpoint_paths) == ["ckpt-1"]


def test_a_state_object_another_writer_changed_is_not_overwritten(server, proxy, base):
    run = base + "/run"
    net = Net(1)
    with objckpt.CheckpointManager(net, run, verbose=0) as manager:
        manager.save(1)
        theirs = (b'model_checkpoint_path: "ckpt-1"\nall_model_checkpoint_paths: "ckpt-1"\n'
                  b"last_preserved_timestamp: 1.5\n")
        direct(server, lambda fs: fs.pipe_file(key(run) + "/checkpoint", theirs))
        for step in (2, 3):  # and not on the next save either
            with pytest.raises(errors.CheckpointWriteError) as caught:
                manager.save(step)
            assert "changed by another writer" in str(caught.value)
        left = under(objects(server), run)
    assert left["checkpoint"] == theirs
    assert "ckpt-2.index" not in left and "ckpt-2.data-00000-of-00001" not in left
    assert "ckpt-3.index" not in left


# --- 5. hostile object names ------------------------------------------------------------------

def test_hostile_names_and_state_objects_are_never_followed_out_of_the_directory(
        server, proxy, base):
    run = base + "/run"
    net = Net(8)
    with objckpt.CheckpointManager(net, run, max_to_keep=5, verbose=0) as manager:
        manager.save(1)
        net.w.assign(net.w + 1.0)
        manager.save(2)
    saved = values(net)
    # Intact checkpoints outside the directory: a sibling folder, and another bucket.
    foreign = f"{SCHEME[server.kind]}://{OTHER_BUCKET}/{key(base).split('/')[1]}/ckpt-1"
    for prefix in (base + "/other/ckpt-1", foreign):
        objckpt.save(tf.train.Checkpoint(model=Net(9)), prefix)
    hostile = {f"{key(run)}/../x.index": b"dot-dot", f"{key(run)}/ckpt-3.index/evil": b"nested",
               f"{key(run)}/ckpt-4.index\x01": b"control character",
               f"{key(run)}/../other/ckpt-1.data-00000-of-00001": b"dot-dot data"}
    if server.kind == "gcs":  # moto refuses a key with a newline (404)
        hostile[f"{key(run)}/ckpt-5.index\n"] = b"newline"
    state = (f'model_checkpoint_path: "{foreign}"\n'
             'all_model_checkpoint_paths: "../other/ckpt-1"\n'
             f'all_model_checkpoint_paths: "{foreign}"\n').encode()
    direct(server, lambda fs: fs.pipe({**hostile, key(run) + "/checkpoint": state}))
    before = objects(server)
    assert set(hostile) <= set(before)
    proxy.reset()

    # A restore from the directory skips both names (outside it) and says so: nothing it
    # names is inside, so it refuses, listing the directory's own intact checkpoints.
    with pytest.raises(errors.CheckpointCorruptError) as caught:
        objckpt.restore(Net(), run, at="model")
    message = str(caught.value)
    assert "skipped `../other/ckpt-1`" in message and f"skipped `{foreign}`" in message
    assert f"`{run}/ckpt-2`" in message and "Fix:" in message

    # The manager resumes from the newest intact checkpoint of its own, with a warning
    # naming what it skipped, and rewrites the state object.
    fresh = Net(10)
    with (pytest.warns(RuntimeWarning) as record,
          objckpt.CheckpointManager(fresh, run, verbose=0) as manager):
        assert manager.restore_latest() == 2
    assert values(fresh) == saved
    notes = [str(w.message) for w in record if "not a `ckpt-N` checkpoint" in str(w.message)]
    assert len(notes) == 1 and "`../other/ckpt-1`" in notes[0] and foreign in notes[0], notes

    # Nothing outside the directory (nor any hostile name in it) was read, listed, written
    # or deleted: every request named a plain name of the directory.
    after = objects(server)
    managed = {key(run) + "/checkpoint", key(run) + "/.objckpt.lock"}
    for name, data in before.items():
        if name not in managed:
            assert after.get(name) == data, name
    assert set(after) - set(before) <= managed
    root = key(run) + "/"
    for name in touched(proxy):
        if name.rstrip("/") == key(run) + ".index":  # restore(source) asks: is it a prefix?
            continue
        assert name.startswith(root), name
        rest = name[len(root):]
        assert "/.." not in name and "evil" not in rest and rest.isprintable(), name
    state = _ckptstate.parse_state(after[key(run) + "/checkpoint"])
    assert list(state.all_model_checkpoint_paths) == ["ckpt-1", "ckpt-2"]
    again = Net(11)
    objckpt.restore(again, run, at="model")
    assert values(again) == saved


# --- 6. the simulated day of retention ------------------------------------------------------------

@pytest.mark.slow  # 144 saves and two restarts against each server
def test_the_simulated_day_keeps_on_object_storage_what_it_keeps_on_disk(
        server, proxy, base, monkeypatch):
    from tests._training.test_retention_policies import (
        DAY_KEPT,
        DAY_START,
        FakeClock,
        simulated_day,
    )

    clock = FakeClock()
    monkeypatch.setattr(_retention, "now", clock)
    run = base + "/day"
    # Two restarts, as the on-disk test (test_retention_policies) does; DAY_KEPT is its result.
    assert simulated_day(run, clock, restarts=(74, 110)) == DAY_KEPT
    left = under(objects(server), run)
    assert sorted(left) == sorted(["checkpoint"] + [
        f"ckpt-{n}{suffix}" for n in DAY_KEPT
        for suffix in (".index", ".data-00000-of-00001")])
    state = _ckptstate.parse_state(left["checkpoint"])
    assert list(state.all_model_checkpoint_paths) == [f"ckpt-{n}" for n in DAY_KEPT]
    assert list(state.all_model_checkpoint_timestamps) == [
        DAY_START + 600.0 * n for n in DAY_KEPT]
    assert state.last_preserved_timestamp == DAY_START + 600.0 * 108


# --- 7. what TF writes, objckpt uploads ---------------------------------------------------------

def test_the_uploaded_bundle_is_byte_identical_to_tfs_own_write(server, proxy, base, tmp_path):
    root = tf.train.Checkpoint(model=Net(12))  # the layout CheckpointManager writes
    prefix = base + "/bundle/ckpt-1"
    objckpt.save(root, prefix)
    uploaded = under(objects(server), base + "/bundle")
    assert sorted(uploaded) == ["ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    local = root.write(str(tmp_path / "tf" / "ckpt-1"))
    for suffix in (".index", ".data-00000-of-00001"):
        with open(local + suffix, "rb") as f:
            assert uploaded["ckpt-1" + suffix] == f.read(), suffix

    # The objects downloaded back with the client are what TF reads.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data in uploaded.items():
        (copy / name).write_bytes(data)
    target = tf.train.Checkpoint(model=Net(13))
    target.read(str(copy / "ckpt-1")).assert_consumed()
    assert values(target.model) == values(root.model)
    reader = tf.train.load_checkpoint(str(copy / "ckpt-1"))
    assert reader.get_tensor("model/inner/v/.ATTRIBUTES/VARIABLE_VALUE").tobytes() == (
        root.model.inner.v.numpy().tobytes())
