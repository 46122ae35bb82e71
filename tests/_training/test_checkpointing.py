"""callbacks.Checkpointing and BestSnapshot: exact resume, retention, crash safety, locks.

In-process tests interrupt `fit` with a raising callback; crash tests fork
training workers from `ckpt_worker.py` (one TensorFlow import per flavour)
and SIGKILL them at fault-hook stages and at random moments.
"""

import contextlib
import errno
import functools
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._training import checkpointing as _checkpointing
from objckpt.callbacks import BestSnapshot, Checkpointing

from flavours import (
    KERAS_FLAVOURS,
    KINDS,
    TF_VERSION,
    _data,
    build_functional,
    build_subclassed,
    keras_for,
    session_flavour,
)
from support import HELPERS, ROOT, assert_bits, values


def make(flavour, kind="functional"):
    keras = keras_for(flavour)
    keras.utils.set_random_seed(0)
    builder = build_subclassed if kind == "subclassed" else build_functional
    return keras, builder(keras, train=False)


def inputs(model):
    images, tokens, targets = _data()
    return (images if model.name == "net" else [images, tokens]), targets


def weights(model) -> dict:
    """The network's weights (no optimizer state), by position."""
    return {str(i): np.array(w.numpy()) for i, w in enumerate(model.weights)}


def fit(model, callbacks, epochs=3, **kwargs):
    x, y = inputs(model)
    return model.fit(x, y, epochs=epochs, batch_size=2, shuffle=False, verbose=0,
                     callbacks=callbacks, **kwargs)


def interrupter(keras, after_batches):
    class Interrupt(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            Interrupt.seen += 1
            if Interrupt.seen == after_batches:
                raise RuntimeError("interrupted on purpose")

    return Interrupt()


@functools.cache
def reference(flavour, kind="functional", epochs=3):
    """The values of an uninterrupted fit (seeded: the same every time, so computed once for
    the sync and async resume tests)."""
    _, model = make(flavour, kind)
    fit(model, [], epochs=epochs)
    result = values(model)
    for array in result.values():
        array.flags.writeable = False
    return result


def said(capsys, who="Checkpointing") -> list[str]:
    """The lines `who` printed to stdout since the last call."""
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith(who)]


@pytest.fixture(autouse=True)
def no_fault_hook():
    yield
    _checkpointing.fault_hook = None


# --- exact resume --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_interrupted_fit_resumes_bit_identical(tmp_path, flavour, kind, async_save, capsys):
    if async_save and kind == "subclassed":
        pytest.skip("async resume is covered by the functional model")
    expected = reference(flavour, kind)
    keras, model = make(flavour, kind)
    first = Checkpointing(tmp_path, save_freq=3, max_to_keep=2, async_save=async_save)
    with pytest.raises(RuntimeError, match="interrupted on purpose"):
        fit(model, [first, interrupter(keras, 7)])  # epoch 1, batch 3 of 4
    first.manager.wait()
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")  # after batch 6
    keras, model = make(flavour, kind)  # a fresh process would build it the same way
    second = Checkpointing(tmp_path, save_freq=3, max_to_keep=2, async_save=async_save)
    fit(model, [second])
    assert second.resumed_from == os.path.join(str(tmp_path), "ckpt-2")
    assert said(capsys) == [  # the first fit started fresh: no line
        f"Checkpointing: resumed from {tmp_path}/ckpt-2 (epoch 2 of 3 at batch 2, step 6); "
        "training continues with batch 3 of that epoch."]
    assert_bits(expected, values(model))
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path)))
    counters = {name: int(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"))
                for name in ("epoch", "step", "batch")}
    assert counters == {"epoch": 2, "step": 12, "batch": 4}  # saved after the last batch
    assert [os.path.basename(p) for p in second.saved] == ["ckpt-3", "ckpt-4"]  # steps 9, 12


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_checkpoints_are_standard_and_finished_runs_do_not_retrain(tmp_path, flavour, capsys):
    _keras, model = make(flavour)
    callback = Checkpointing(tmp_path, max_to_keep=2, monitor="loss")
    history = fit(model, [callback], epochs=2)
    resumed = Checkpointing(tmp_path, max_to_keep=2, monitor="loss")
    history = fit(model, [resumed])
    assert said(capsys) == [  # fresh: nothing; then from the end of epoch 2
        f"Checkpointing: resumed from {tmp_path}/ckpt-2 (epoch 2 of 3 done, step 8); "
        "training continues with epoch 3."]
    trained = values(model)
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest == os.path.join(str(tmp_path), "ckpt-3")
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-2", "ckpt-3"]
    assert sorted(os.listdir(tmp_path)) == [
        ".objckpt.lock", "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index",
        "ckpt-3.data-00000-of-00001", "ckpt-3.index"]
    reader = tf.train.load_checkpoint(latest)
    assert int(reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE")) == 3
    assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 12
    assert float(reader.get_tensor("monitor_value/.ATTRIBUTES/VARIABLE_VALUE")) == \
        pytest.approx(history.history["loss"][-1])
    # objckpt.restore (strict, of the same layout) and TF's own reader both load it.
    _, fresh = make(flavour)
    probe_optimizer_built(fresh)
    report = objckpt.restore(layout_of(fresh), str(tmp_path))
    assert report.source.endswith("ckpt-3`") and not report.missing and not report.unexpected
    assert_bits(trained, values(fresh))
    _, fresh = make(flavour)
    tf.train.Checkpoint(model=fresh).read(latest).expect_partial()
    assert_bits(weights(model), weights(fresh))
    # Fitting again to the same number of epochs resumes at the end: no more training.
    again = Checkpointing(tmp_path, max_to_keep=2, monitor="loss")
    fit(model, [again])
    assert again.resumed_from == latest and again.saved == []
    assert_bits(trained, values(model))
    assert said(capsys) == [
        f"Checkpointing: training already finished: {tmp_path}/ckpt-3 holds 3 epoch(s) "
        "(step 12) and fit(epochs=3) counts all epochs, these included, so this fit trains "
        "no more. To train further, pass a larger epochs= to fit; to start over, give "
        "Checkpointing a new directory."]
    # Each checkpoint keeps its own time in the state file, read back on every restart.
    assert state.all_model_checkpoint_timestamps[0] < state.all_model_checkpoint_timestamps[1]
    assert list(tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_timestamps) \
        == list(state.all_model_checkpoint_timestamps)
    assert [k.timestamp for k in again.manager.kept] == list(
        state.all_model_checkpoint_timestamps)
    fit(model, [Checkpointing(tmp_path, max_to_keep=2, monitor="loss", verbose=0)])
    assert said(capsys) == []


# --- retention ----------------------------------------------------------------------------


def test_keeps_newest_and_best_and_the_best_set_survives_restarts(tmp_path):
    keras, model = make(session_flavour())
    losses = []

    class Loss(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            losses.append(logs["loss"])

    # Learning rate so high that the loss goes up and down: "best" is not "newest".
    model.optimizer.learning_rate.assign(0.3)
    callback = Checkpointing(tmp_path, max_to_keep=2, keep_best=2, monitor="loss", mode="min")
    fit(model, [callback, Loss()], epochs=6)
    best_two = sorted(range(6), key=lambda e: (losses[e], e))[:2]
    expected = sorted({4, 5} | set(best_two))  # ckpt-N holds epoch N-1
    assert [k.number - 1 for k in callback.manager.kept] == expected
    assert [k.number - 1 for k in callback.manager.best()][:2] == best_two
    listed = tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_paths
    assert [int(p.rsplit("-", 1)[1]) - 1 for p in listed] == expected
    # A restart reads each kept checkpoint's metric back: the best set survives.
    restarted = Checkpointing(tmp_path, max_to_keep=2, keep_best=2, monitor="loss")
    fit(model, [restarted, Loss()], epochs=8)
    all_best = sorted(range(8), key=lambda e: (losses[e], e))[:2]
    assert [k.number - 1 for k in restarted.manager.kept] == sorted({6, 7} | set(all_best))
    assert restarted.manager.best()[0].metric == pytest.approx(min(losses))


# --- damaged directories ----------------------------------------------------------------


def _three_checkpoints(tmp_path):
    keras, model = make(session_flavour())
    callback = Checkpointing(tmp_path, max_to_keep=3, save_freq=4)
    fit(model, [callback])
    return keras, model, callback


def test_unreadable_state_file_falls_back_with_a_warning(tmp_path):
    _, model, _ = _three_checkpoints(tmp_path)
    (tmp_path / "checkpoint").write_bytes(b"\x00garbage{{{")
    callback = Checkpointing(tmp_path, max_to_keep=3, save_freq=4)
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        fit(model, [callback])
    assert callback.resumed_from == os.path.join(str(tmp_path), "ckpt-3")
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-3")  # state rewritten


def test_missing_newest_checkpoint_falls_back_to_older_and_debris_is_cleaned(tmp_path):
    _, model, _ = _three_checkpoints(tmp_path)
    os.remove(tmp_path / "ckpt-3.data-00000-of-00001")
    debris = [".ckpt-4.tmp-0123456789ab.index", ".ckpt-4.tmp-0123456789ab.data-00000-of-00001",
              ".checkpoint.tmp-0123456789ab", "ckpt-9.index", "ckpt-9.data-00000-of-00001"]
    for name in debris:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not ours")
    callback = Checkpointing(tmp_path, max_to_keep=3, save_freq=4)
    callback.model = model
    with pytest.warns(RuntimeWarning, match="data file"):
        callback.on_train_begin()
    try:
        assert callback.resumed_from == os.path.join(str(tmp_path), "ckpt-2")
        assert sorted(os.listdir(tmp_path)) == [
            ".objckpt.lock", "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index",
            "ckpt-2.data-00000-of-00001", "ckpt-2.index", "notes.txt"]
        assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")
        # New checkpoints are numbered past every number seen on disk.
        assert callback.manager.save().endswith("ckpt-10")
    finally:
        callback.on_train_end()


# --- write failures ------------------------------------------------------------------------


def _disk_full(stage):
    def hook(name):
        if name == stage:
            raise OSError(errno.ENOSPC, "No space left on device")
    return hook


@pytest.mark.parametrize("stage", ["write", "data", "index"])
@pytest.mark.slow
def test_disk_full_raises_typed_error_and_leaves_earlier_checkpoints(tmp_path, stage):
    _, _model, callback = _three_checkpoints(tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    _checkpointing.fault_hook = _disk_full(stage)
    callback.manager.open()
    try:
        with pytest.raises(errors.CheckpointWriteError, match="No space left") as info:
            callback.manager.save(1.0)
    finally:
        callback.manager.close()
    assert isinstance(info.value, OSError) and info.value.prefix.endswith("ckpt-4")
    assert "untouched" in str(info.value) and "on_error='warn'" in str(info.value)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_on_error_warn_keeps_training(tmp_path, async_save):
    _keras, model = make(session_flavour())
    failing = [True]

    def hook(name):
        if name == "data" and failing[0]:
            failing[0] = False
            raise OSError(errno.EIO, "Input/output error")

    _checkpointing.fault_hook = hook
    callback = Checkpointing(tmp_path, save_freq=2, on_error="warn", async_save=async_save)
    with pytest.warns(RuntimeWarning, match="Input/output error.*Training goes on"):
        fit(model, [callback], epochs=2)
    assert callback.manager.failures == 1
    # ckpt-1 failed; an async save still waiting when a newer one comes is superseded.
    kept = [k.number for k in callback.manager.kept]
    assert kept[-1] == 4 and set(kept) <= {2, 3, 4}
    assert len(kept) + callback.manager.superseded == 3
    assert async_save or callback.manager.superseded == 0
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


# --- locks --------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_second_process_on_the_directory_gets_a_lock_error(tmp_path):
    _, model, _ = _three_checkpoints(tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if n != ".objckpt.lock"}
    code = ("import sys, time; sys.path.insert(0, sys.argv[2]); "
            "from objckpt._bundle import lock as _dirlock; "
            "_dirlock.DirectoryLock(sys.argv[1]).acquire(); print('locked', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), ROOT],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(errors.DirectoryLockedError) as info:
            fit(model, [Checkpointing(tmp_path, max_to_keep=3, save_freq=4)])
        assert isinstance(info.value, BlockingIOError)
        assert f"pid {holder.pid}" in str(info.value) and str(tmp_path) in str(info.value)
        assert "own directory" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    after = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if n != ".objckpt.lock"}
    assert after == before
    # The holder died: its lock went with it.
    fit(model, [Checkpointing(tmp_path, max_to_keep=3, save_freq=4)], epochs=4)


@pytest.mark.subprocess
def test_constructing_the_callbacks_does_not_import_tensorflow():
    code = ("import sys; from objckpt.callbacks import BestSnapshot, Checkpointing; "
            "Checkpointing('/tmp/objckpt-unused', keep_best=1); BestSnapshot(); "
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert out == ["False", "False"]
    assert not os.path.exists("/tmp/objckpt-unused")  # nothing is created before fit


def test_arguments_are_validated():
    cases = [({"max_to_keep": 0}, "max_to_keep must be an int >= 1"),
             ({"keep_best": -1}, "keep_best must be an int >= 0"),
             ({"mode": "auto"}, "mode must be one of 'min', 'max'"),
             ({"save_freq": "batch"}, "save_freq must be an int >= 1"),
             ({"on_error": "ignore"}, "on_error must be one of 'raise', 'warn'"),
             ({"async_save": 1}, "async_save must be True or False"),
             ({"verbose": 2}, "verbose must be one of 0, 1. Received: verbose=2.")]
    for kwargs, message in cases:
        with pytest.raises(errors.InvalidArgumentError, match=message):
            Checkpointing("/tmp/x", **kwargs)
    assert Checkpointing("gs://bucket/run").directory == "gs://bucket/run"  # a remote URL
    with pytest.raises(errors.InvalidArgumentError, match="mode must be"):
        BestSnapshot(mode="best")


# --- BestSnapshot ---------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("mode", ["min", "max"])
def test_best_snapshot_keeps_and_restores_the_best_epoch(flavour, mode):
    keras, model = make(flavour)
    model.optimizer.learning_rate.assign(0.3)
    per_epoch, losses = [], []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            per_epoch.append(values(self.model))
            losses.append(logs["loss"])

    best = BestSnapshot(monitor="loss", mode=mode)
    fit(model, [Record(), best], epochs=5)  # Record runs first: its values are the epoch's
    pick = (min if mode == "min" else max)(range(5), key=lambda e: (losses[e], e))
    assert best.best_epoch == pick and best.best == pytest.approx(losses[pick])
    assert isinstance(best.snapshot, objckpt.Snapshot)
    assert_bits(per_epoch[pick], values(model))


def test_best_snapshot_without_restore_at_end_leaves_the_last_weights():
    _keras, model = make(session_flavour())
    model.optimizer.learning_rate.assign(0.3)
    best = BestSnapshot(monitor="loss", restore_at_end=False)
    fit(model, [best], epochs=4)
    last = values(model)
    assert best.best_epoch is not None
    objckpt.restore(model, best.snapshot)
    restored = values(model)
    assert (best.best_epoch == 3) == all(last[p].tobytes() == restored[p].tobytes()
                                         for p in last)


def test_best_snapshot_warns_when_monitor_is_missing():
    _keras, model = make(session_flavour())
    best = BestSnapshot()  # val_loss: no validation data
    before = values(model)
    with pytest.warns(UserWarning, match="'val_loss' is not in the logs"):
        fit(model, [best], epochs=1)
    assert best.best is None and best.best_epoch is None
    assert any(before[p].tobytes() != v.tobytes() for p, v in values(model).items())


# --- crashes in child processes ---------------------------------------------------------------


class Server:
    """Drives ckpt_worker.py: one TF import, one forked worker per job."""

    def __init__(self, flavour, kind="functional"):
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HELPERS, "ckpt_worker.py"), flavour, kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def start(self, **job) -> int:
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline().split()
        assert line and line[0] == "pid", f"worker server failed: {line}"
        return int(line[1])

    def finish(self) -> int:
        line = self.process.stdout.readline().split()
        assert line and line[0] == "exit", f"worker server failed: {line}"
        return int(line[1])

    def run(self, **job) -> int:
        self.start(**job)
        return self.finish()

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def native(flavour):
    """Subprocess crash tests run each flavour in its own nox session only."""
    keras_for(flavour)
    if flavour != session_flavour():
        pytest.skip(f"{flavour} crash tests run in the {flavour} session")


def restorable(directory, probe):
    """The newest checkpoint's number after a crash (None: none yet), restored into probe."""
    latest = tf.train.latest_checkpoint(str(directory))
    if not os.path.exists(directory / "checkpoint"):
        return None  # killed before the first commit
    assert latest is not None, os.listdir(directory)
    objckpt.restore(layout_of(probe), latest)
    return int(latest.rsplit("-", 1)[1])


def layout_of(model):
    """A root with the layout Checkpointing writes: model plus counters."""
    return tf.train.Checkpoint(model=model, **{n: tf.Variable(0, dtype=tf.int64)
                                               for n in _checkpointing.COUNTERS},
                               monitor_value=tf.Variable(0.0, dtype=tf.float64))


def final_values(path):
    with np.load(path, allow_pickle=False) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


STAGES = [("write", 3, False), ("data", 3, False), ("index", 3, False), ("state", 3, False),
          ("delete", 2, False), ("data", 2, True), ("state", 2, True)]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.subprocess
def test_sigkill_at_every_stage_of_a_save_then_resume(tmp_path, flavour):
    native(flavour)
    _, probe = make(flavour)
    probe_optimizer_built(probe)
    server = Server(flavour)
    try:
        job = dict(epochs=6, save_freq=1, max_to_keep=2)
        assert server.run(dir=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **job) == 0
        directory, newest = tmp_path / "run", None
        for stage, hit, async_save in STAGES:
            code = server.run(dir=str(directory), out=str(tmp_path / "run.npz"),
                              fault=[stage, hit], **{**job, "async": async_save})
            assert code == -signal.SIGKILL, (stage, code)
            number = restorable(directory, probe)
            assert number is not None and number >= (newest or 0), (stage, number, newest)
            if stage in ("state", "delete"):  # the save in progress was committed
                assert number > (newest or 0), (stage, number, newest)
            assert not os.path.exists(str(tmp_path / "run.npz"))
            newest = number
        assert server.run(dir=str(directory), out=str(tmp_path / "run.npz"), **job) == 0
    finally:
        server.close()
    with open(tmp_path / "run.npz.json") as f:
        assert json.load(f)["resumed_from"].endswith(f"ckpt-{newest}")
    for a, b in zip(final_values(tmp_path / "ref.npz"), final_values(tmp_path / "run.npz")):
        assert a.tobytes() == b.tobytes()
    assert not [n for n in os.listdir(directory) if ".tmp-" in n]


def probe_optimizer_built(model):
    from objckpt import _compat

    _compat.build_optimizer(model.optimizer, model.trainable_variables)


@pytest.mark.subprocess
def test_sigterm_saves_once_more_then_stops(tmp_path):
    flavour = session_flavour()
    server = Server(flavour)
    try:
        job = dict(epochs=3, save_freq="epoch")
        assert server.run(dir=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **job) == 0
        directory = tmp_path / "run"
        pid = server.start(dir=str(directory), out=str(tmp_path / "run.npz"), sleep=0.15, **job)
        deadline = time.time() + 60
        while tf.train.latest_checkpoint(str(directory)) is None and time.time() < deadline:
            time.sleep(0.05)  # the end of epoch 0 has been saved
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        assert server.finish() == -signal.SIGTERM
        latest = tf.train.latest_checkpoint(str(directory))
        reader = tf.train.load_checkpoint(latest)
        assert int(reader.get_tensor("batch/.ATTRIBUTES/VARIABLE_VALUE")) > 0  # mid-epoch save
        assert latest.endswith("ckpt-2")
        assert server.run(dir=str(directory), out=str(tmp_path / "run.npz"), **job) == 0
    finally:
        server.close()
    for a, b in zip(final_values(tmp_path / "ref.npz"), final_values(tmp_path / "run.npz")):
        assert a.tobytes() == b.tobytes()


def wait_until_training(directory, pid, timeout=120.0):
    """Waits until worker `pid` holds the directory's lock (it is in fit)."""
    path, deadline = os.path.join(directory, ".objckpt.lock"), time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                if f.read().startswith(f"pid {pid} "):
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    raise AssertionError(f"worker {pid} did not start training within {timeout}s")


@pytest.mark.subprocess
def test_fifty_random_sigkills_never_lose_the_newest_checkpoint(tmp_path):
    native("keras3")
    if TF_VERSION <= (2, 16):
        pytest.skip("the 50-kill stress test runs in the keras3 session (latest TF); this TF "
                    "gets the kill at every stage of a save")
    _, probe = make("keras3")
    probe_optimizer_built(probe)
    rng = random.Random(6)
    server = Server("keras3")
    kills, newest, restarts = 0, None, 0
    try:
        job = dict(epochs=8, save_freq=1, max_to_keep=2)
        pid = server.start(dir=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **job)
        wait_until_training(tmp_path / "ref", pid)
        start = time.time()
        assert server.finish() == 0
        span = time.time() - start  # from the start of fit to the end of the process
        directory = tmp_path / "run"
        while kills < 50:
            pid = server.start(dir=str(directory), out=str(tmp_path / "run.npz"),
                               **{**job, "async": kills % 2 == 1})
            wait_until_training(directory, pid)
            time.sleep(rng.uniform(0.0, 0.9) * span)
            with contextlib.suppress(ProcessLookupError):  # finished already
                os.kill(pid, signal.SIGKILL)
            code = server.finish()
            if code == 0:  # it finished before the kill landed: start over in a new directory
                restarts += 1
                directory, newest = tmp_path / f"run{restarts}", None
                os.remove(tmp_path / "run.npz")
                continue
            assert code == -signal.SIGKILL
            kills += 1
            number = restorable(directory, probe)
            assert newest is None or (number is not None and number >= newest)
            newest = number
        assert server.run(dir=str(directory), out=str(tmp_path / "run.npz"), **job) == 0
    finally:
        server.close()
    assert kills == 50  # plus `restarts` runs that finished before their kill landed
    for a, b in zip(final_values(tmp_path / "ref.npz"), final_values(tmp_path / "run.npz")):
        assert a.tobytes() == b.tobytes()
