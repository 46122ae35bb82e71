"""The callbacks and CheckpointManager under tf.distribute.

(a) MirroredStrategy with two replicas in this process (`flavours.mirrored()`, two logical
    CPUs): Checkpointing resumes an interrupted fit exactly as an uninterrupted one,
    BestSnapshot, TwinSync and FreezeSchedule keep the replicas identical, CheckpointManager
    in a custom loop under `strategy.run`.
(b) MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1 (`mw_fit_worker.py`,
    CPU only, each bounded in time and killed on failure): the chief alone commits, the other
    worker writes nothing and the workers stay identical; a run whose non-chief is SIGKILLed
    mid-training (then the chief stopped) resumes on both workers from the same checkpoint
    and ends where an uninterrupted run ends. Three runs of two workers per session.

Keras 3's TF trainer cannot `fit` under MultiWorkerMirroredStrategy (see
`KERAS3_MULTIWORKER_FIT`): in the keras3 and tf216 sessions the multi-worker fit tests skip
saying so, and the kill-and-resume test trains in a custom loop with CheckpointManager.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._bundle import lock as _dirlock
from objckpt._training import checkpointing as _checkpointing
from objckpt.callbacks import BestSnapshot, Checkpointing, FreezeSchedule, TwinSync

import flavours
from support import HELPERS, free_ports

FLAVOUR = flavours.session_flavour()
MW_TIMEOUT = 120  # seconds for one run of two workers (each usually takes 10-25 s)
KERAS3_MULTIWORKER_FIT = (
    "Keras 3's TF trainer cannot run model.fit under MultiWorkerMirroredStrategy: before any "
    "callback runs, Trainer._maybe_symbolic_build calls strategy.reduce('MEAN', batch) on the "
    "first batch, a tuple of PerReplica values, and with more than one worker TF's collective "
    "reduce takes one tensor only, so fit raises ValueError ('Attempt to convert a value "
    "(PerReplica:...) with an unsupported type'; keras-team/keras#20585, "
    "tensorflow/tensorflow#72388). Multi-worker training with Keras 3 models works in custom "
    "loops (strategy.run); CheckpointManager covers them in this session.")

# BatchNormalization's moving statistics: SyncOnRead variables in tf_keras and Keras 2 (one
# value per replica by design; a checkpoint holds their mean over all replicas, as
# tf.train.Checkpoint writes it). Keras 3 creates them as MirroredVariables (ON_WRITE,
# aggregation NONE) yet each replica assigns its own batch statistics to them, so their
# replicas, and workers, differ in every Keras 3 run under a strategy, with objckpt or without
# (UNSYNCED); a checkpoint holds the first replica's (the chief's), as tf.train.Checkpoint does.
STATISTICS = frozenset({"bn/moving_mean", "bn/moving_variance"})
UNSYNCED = STATISTICS if FLAVOUR == "keras3" else frozenset()

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 4)).astype("float32")
Y = RNG.normal(size=(32, 2)).astype("float32")


# --- (a) MirroredStrategy, two replicas in this process ------------------------------------


def net(keras, strategy):
    """encoder (Dense) -> bn (BatchNormalization) -> head (Dense), compiled with Adam and a
    metric, created and built under `strategy` (None: no strategy)."""

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.encoder = keras.layers.Dense(8, activation="relu")
            self.bn = keras.layers.BatchNormalization()
            self.head = keras.layers.Dense(2)

        def call(self, x, training=False):
            return self.head(self.bn(self.encoder(x), training=training))

    keras.utils.set_random_seed(0)
    with strategy.scope() if strategy is not None else _nothing():
        model = Net()
        model(X[:2])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def cross(obj) -> dict:
    """Each variable's value as a checkpoint holds it (read in cross-replica context)."""
    return {p: np.array(v.numpy()) for p, v in objckpt.tree(obj).items()}


def on_read(obj) -> set:
    return {p for p, v in objckpt.tree(obj).items()
            if v.synchronization == tf.VariableSynchronization.ON_READ}


def replicas_differ(obj) -> set:
    """Paths of mirrored variables whose replicas are not bit-identical (SyncOnRead
    variables hold one value per replica by design and are left out)."""
    out = []
    for path, variable in objckpt.tree(obj).items():
        if variable.synchronization == tf.VariableSynchronization.ON_READ:
            continue
        parts = [np.array(c.numpy()).tobytes() for c in variable.values]
        assert len(parts) == 2, f"{path}: {len(parts)} replicas, expected 2"
        if len(set(parts)) != 1:
            out.append(path)
    return set(out)


def assert_like(actual: dict, expected: dict, approx=frozenset(), skip=frozenset()):
    """Bit-identical, except the paths in `approx` (SyncOnRead statistics: equal up to float
    rounding, see test_checkpointing_under_mirrored_resumes_like_an_uninterrupted_run) and
    in `skip` (UNSYNCED, compared across replicas or workers)."""
    assert sorted(actual) == sorted(expected)
    different = [p for p in actual if p not in approx and p not in skip
                 and actual[p].tobytes() != expected[p].tobytes()]
    assert not different, f"{len(different)} variables differ: {different[:6]}"
    for path in approx:
        np.testing.assert_allclose(actual[path], expected[path], rtol=1e-5, atol=1e-6,
                                   err_msg=path)


def checkpoint_values(prefix, paths, at="model") -> dict:
    """{object path under `at`: its value in the checkpoint}, read by TF's own reader."""
    reader = tf.train.load_checkpoint(prefix)

    def key(path):
        slot = _paths.split_slot(path)  # a slot names its variable and optimizer from the root
        rooted = (f"{at}/{path}" if slot is None
                  else _paths.slot_path(f"{at}/{slot[0]}", f"{at}/{slot[1]}", slot[2]))
        return _paths.checkpoint_key(rooted)

    return {p: reader.get_tensor(key(p)) for p in paths}


def fit(model, callbacks, epochs=3, **kwargs):
    return model.fit(X, Y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks, **kwargs)


@pytest.fixture(scope="module")
def keras():
    return flavours.keras_for(FLAVOUR)


@pytest.mark.slow
def test_checkpointing_under_mirrored_resumes_like_an_uninterrupted_run(tmp_path, keras):
    """An interrupted fit under MirroredStrategy, resumed into a fresh model under the same
    strategy, ends bit-identical to an uninterrupted one (the SyncOnRead BatchNorm statistics
    of tf_keras and Keras 2: a checkpoint holds their mean over the replicas and resuming sets
    every replica to it, as tf.train.Checkpoint does; their mean then differs from the
    uninterrupted run's by float rounding only). A FreezeSchedule listed after Checkpointing
    (it makes a new train function when training begins) does not undo the resume in the
    middle of an epoch. The checkpoints are standard: TF reads them, `objckpt verify` passes,
    and a one-device model restores them."""
    strategy = flavours.mirrored()
    reference = net(keras, strategy)

    def freeze():  # the encoder frozen from epoch 1 on: the resume lands in that phase
        return FreezeSchedule({0: None, 1: "^encoder/"})

    fit(reference, [Checkpointing(tmp_path / "reference", save_freq=3, verbose=0), freeze()])
    expected = cross(reference)
    assert replicas_differ(reference) == UNSYNCED

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2 and self.model.optimizer.iterations.numpy() > 6:
                raise RuntimeError("interrupted on purpose")

    directory = tmp_path / "run"
    with pytest.raises(RuntimeError, match="on purpose"):
        fit(net(keras, strategy), [Checkpointing(directory, save_freq=3, verbose=0),
                                   freeze(), Interrupt()])
    assert tf.train.latest_checkpoint(str(directory)).endswith("ckpt-2")  # steps 3 and 6
    model = net(keras, strategy)
    ckpt = Checkpointing(directory, save_freq=3, verbose=0)
    fit(model, [ckpt, freeze()])
    assert ckpt.resumed_from == str(directory / "ckpt-2")
    assert ckpt.manager.cluster is None  # one process
    assert replicas_differ(model) <= UNSYNCED
    statistics = on_read(model)
    assert statistics == (STATISTICS - UNSYNCED)
    assert_like(cross(model), expected, approx=statistics)

    latest = tf.train.latest_checkpoint(str(directory))
    assert latest == ckpt.saved[-1]  # step 12: the end of training
    assert_like(checkpoint_values(latest, expected), cross(model))
    assert objckpt.verify(directory).ok
    single = net(keras, None)  # one device, no strategy
    with objckpt.CheckpointManager(single, directory, verbose=0) as manager:
        assert manager.restore_latest() == 12
    assert_like(cross(single), cross(model))


@pytest.mark.slow
def test_best_snapshot_twin_sync_and_freeze_schedule_under_mirrored(keras):
    """The three in-memory callbacks under MirroredStrategy: every replica stays identical;
    FreezeSchedule keeps the frozen variables bit-identical; TwinSync's Polyak update of a
    past network created under the strategy; BestSnapshot restores the best epoch into every
    replica."""
    strategy = flavours.mirrored()
    model = net(keras, strategy)
    with strategy.scope():
        twins = objckpt.Twins(model)
    seen = {}

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen[epoch] = cross(model), cross(twins.past), replicas_differ(twins.past)
            assert replicas_differ(model) <= UNSYNCED, epoch

        def on_train_end(self, logs=None):
            seen["trained"] = cross(model)

    freeze = FreezeSchedule({0: None, 1: "^encoder/"})
    sync = TwinSync(twins, tau=0.5, on="epoch")
    best = BestSnapshot("loss", mode="max")  # the first epoch's loss is the highest
    past_before = cross(twins.past)
    fit(model, [freeze, sync, Record(), best])

    state = sorted(p for p in cross(model) if p.startswith("encoder/"))  # Keras 2: slots too
    encoder = [p for p in state if _paths.split_slot(p) is None]
    assert len(encoder) == 2
    assert [(e, sorted(f)) for e, f in freeze.history] == [(0, []), (1, encoder), (2, encoder)]
    for path in state:  # frozen from epoch 1 on
        assert seen["trained"][path].tobytes() == seen[0][0][path].tobytes(), path
    assert any(seen["trained"][p].tobytes() != seen[0][0][p].tobytes() for p in seen[0][0]
               if p.startswith("head/"))

    assert sync.syncs == 3
    past = past_before
    for epoch in range(3):
        current, synced, differ = seen[epoch]
        assert differ <= UNSYNCED, f"past replicas differ after epoch {epoch}: {differ}"
        for path, value in synced.items():  # weights: past = 0.5 * current + 0.5 * past
            if path.startswith("optimizer/") or _paths.split_slot(path) is not None:
                continue
            np.testing.assert_allclose(value, 0.5 * current[path] + 0.5 * past[path],
                                       rtol=1e-6, atol=1e-7, err_msg=path)
        past = synced
    assert {type(v).__name__ for v in objckpt.tree(twins.past).values()} <= {
        "MirroredVariable", "SyncOnReadVariable"}

    assert best.best_epoch == 0
    assert_like(cross(model), seen[0][0])
    assert not replicas_differ(model)


def test_checkpoint_manager_in_a_custom_loop_under_mirrored(tmp_path, keras):
    """CheckpointManager in a custom loop (`strategy.run`): what it commits is the mirrored
    model's values; restore_latest into a fresh model under the strategy sets every replica."""
    strategy = flavours.mirrored()
    model = net(keras, strategy)
    if hasattr(model.optimizer, "build"):  # Keras 2's (legacy) Adam: slots when it applies
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(8))

    @tf.function
    def train_step(x, y):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    tf.reduce_mean(tf.square(model(x, training=True) - y), axis=-1),
                    global_batch_size=8)
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(x, y)),
                               axis=None)

    with objckpt.CheckpointManager(model, tmp_path, keep_best=1, monitor="loss",
                                   verbose=0) as manager:
        for step, (x, y) in enumerate(batches, 1):
            manager.save(step, {"loss": float(train_step(x, y))})
        assert [k.number for k in manager.kept][-1] == 4
    trained = cross(model)
    assert replicas_differ(model) <= UNSYNCED
    assert_like(checkpoint_values(str(tmp_path / "ckpt-4"), trained), trained)

    fresh = net(keras, strategy)
    with objckpt.CheckpointManager(fresh, tmp_path, verbose=0) as manager:
        assert manager.restore_latest() == 4
    assert_like(cross(fresh), trained)
    assert not replicas_differ(fresh)
    for path, variable in objckpt.tree(fresh).items():  # SyncOnRead too: every replica set
        for component in variable.values:
            assert np.array(component.numpy()).tobytes() == trained[path].tobytes(), path


# --- the workers' agreements, played in one process ------------------------------------


class Scripted(_checkpointing.Cluster):
    """A two-worker Cluster whose other worker is played by `replies`: the rows it sends,
    in order (what this worker sends is kept in `sent`)."""

    def __init__(self, chief: bool, *replies):
        super().__init__(None, chief, 0 if chief else 1, 2, "worker 0" if chief else
                         "worker 1", 0)
        self.replies, self.sent = list(replies), []

    def gather(self, row):
        self.sent.append([float(x) for x in row])
        rows = [None, None]
        rows[self.index], rows[1 - self.index] = self.sent[-1], list(self.replies.pop(0))
        return rows


def directory_of(path, cluster, **kwargs):
    """A CheckpointDirectory of a one-variable module that believes it runs in `cluster`."""
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    manager = _checkpointing.CheckpointDirectory(path, module, **kwargs)
    original = _checkpointing.Cluster.of
    _checkpointing.Cluster.of = staticmethod(lambda variables: cluster)
    try:
        latest = manager.open()
    finally:
        _checkpointing.Cluster.of = original
    return module, manager, latest


def chief_wrote(path, count=2):
    """ckpt-1..count committed by a one-process writer (the chief of an earlier run)."""
    module, manager, _ = directory_of(path, None)
    for _ in range(count):
        module.v.assign_add([1.0, 1.0])
        manager.save(0.5)
    manager.close()
    return sorted(os.listdir(path))


def test_a_worker_that_is_not_the_chief_follows_the_chief_and_writes_nothing(tmp_path):
    files = chief_wrote(tmp_path)
    # The chief says: no error, resume from ckpt-2, the next number is 3. No one failed.
    cluster = Scripted(False, [0, 2, 3], [0])
    module, manager, latest = directory_of(
        tmp_path, cluster, retention=_checkpointing.RetentionPolicy(max_to_keep=2, keep_best=1))
    assert cluster.sent == [[0, 0, 0], [0]]
    assert latest.prefix == str(tmp_path / "ckpt-2") and not manager.commits.lock.held
    assert [k.number for k in manager.kept] == [1, 2]
    cluster.replies.append([0])  # the chief restored too
    assert manager.restore(latest) == {"epoch": 0, "step": 0, "batch": 0}
    assert module.v.numpy().tolist() == [3.0, 4.0]
    cluster.replies += [[0], [0]]  # the chief committed ckpt-3, then ckpt-4
    assert manager.save(0.25) == str(tmp_path / "ckpt-3")
    assert manager.save(0.75) == str(tmp_path / "ckpt-4")
    assert [k.number for k in manager.kept] == [3, 4]  # as the chief keeps them
    assert [k.number for k in manager.best()] == [3, 4]
    assert sorted(os.listdir(tmp_path)) == files  # nothing written, locked or deleted here
    cluster.replies.append([2])  # the chief's write failed: CheckpointWriteError
    with pytest.raises(errors.CheckpointWriteError, match=r"the chief .* failed to write"):
        manager.save(0.1)
    manager.close()


def test_a_worker_that_cannot_read_the_chiefs_checkpoint_makes_every_worker_raise(tmp_path):
    chief_wrote(tmp_path)
    cluster = Scripted(False, [0, 5, 6], [0])  # the chief resumes from ckpt-5: not here
    with pytest.raises(errors.CheckpointDirectoryError, match=r"ckpt-5`, which this worker "
                       r"\(worker 1\) cannot read.*shared file system") as info:
        directory_of(tmp_path, cluster)
    assert info.value.directory == str(tmp_path)
    assert cluster.sent[-1] == [3]  # the others learn it was a CheckpointDirectoryError
    # The chief, told so, raises the same type and releases the directory.
    chief = Scripted(True, [0, 0, 0], [3])
    with pytest.raises(errors.CheckpointDirectoryError, match=r"another worker .*worker #1 "
                       r"of 2.* failed to read the checkpoint the chief resumes from"):
        directory_of(tmp_path, chief)
    assert chief.sent == [[0, 2, 3], [0]]
    _, manager, _ = directory_of(tmp_path, None)  # the lock was released
    manager.close()


def test_a_chief_that_cannot_open_the_directory_makes_every_worker_raise(tmp_path):
    foreign = tf.train.Checkpoint(v=tf.Variable(1.0))
    foreign.write(str(tmp_path / "theirs" / "model"))  # not ours: no fresh start beside it
    chief = Scripted(True, [0, 0, 0])
    with pytest.raises(errors.CheckpointDirectoryError, match="did not write"):
        directory_of(tmp_path / "theirs", chief)
    assert chief.sent == [[3, 0, 1]]  # it says so, then raises: no second agreement
    cluster = Scripted(False, [1, 0, 0])  # told the chief raised DirectoryLockedError
    with pytest.raises(errors.DirectoryLockedError, match=r"the chief \(worker #0 of 2\) "
                       r"failed to open it with DirectoryLockedError.*\(worker 1\) stops "
                       "too") as info:
        directory_of(tmp_path, cluster)
    assert info.value.directory == str(tmp_path)
    assert cluster.sent == [[0, 0, 0]]  # nothing more: every worker stopped there


def test_a_chief_whose_write_fails_tells_the_others(tmp_path):
    chief = Scripted(True, [0, 0, 0], [0])
    _, manager, _ = directory_of(tmp_path, chief)

    def disk_full(stage):
        if stage == "data":
            raise OSError(errno.ENOSPC, "No space left on device")

    chief.replies.append([0])
    _checkpointing.fault_hook = disk_full
    try:
        with pytest.raises(errors.CheckpointWriteError, match="No space left"):
            manager.save(1.0)
    finally:
        _checkpointing.fault_hook = None
    assert chief.sent[-1] == [2]  # CheckpointWriteError
    chief.replies.append([0])
    assert manager.save(1.0) == str(tmp_path / "ckpt-2")
    assert chief.sent[-1] == [0]
    manager.close()


def test_cluster_gather_takes_one_row_per_worker_not_per_replica():
    """Cluster.gather's all-reduce counts each worker's row once, whatever its number of
    local replicas (here: one worker of a two-replica MirroredStrategy)."""
    cluster = _checkpointing.Cluster(flavours.mirrored(), True, 0, 1, "worker 0", 0)
    assert cluster.gather([3, -7.25, 2.0**52 + 1]) == [[3.0, -7.25, 2.0**52 + 1]]
    assert _checkpointing.Cluster.of(objckpt.tree(net(flavours.keras_for(FLAVOUR),
                                                      flavours.mirrored())).values()) is None


# --- (b) MultiWorkerMirroredStrategy, two worker processes ---------------------------------


PORT_TAKEN = "Could not start gRPC server"  # TF's error when a worker's port is in use


class Workers:
    """Two `mw_fit_worker.py` processes of one job; every wait is bounded, and when one
    worker fails the other is killed (left alone, it would wait forever in a collective).
    A worker whose port was taken after `free_ports` found it free makes both start once
    more on other ports."""

    def __init__(self, base, **job):
        self.base, self.job = base, dict(job, flavour=FLAVOUR, out=str(base))
        base.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.retried = False
        self._start()

    def _start(self) -> None:
        self.job["ports"] = free_ports(2)
        (self.base / "job.json").write_text(json.dumps(self.job))
        env = {k: v for k, v in os.environ.items()
               if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
        self.processes = []
        for task in range(2):
            with open(self.base / f"log-{task}.txt", "w") as log:
                self.processes.append(subprocess.Popen(
                    [sys.executable, os.path.join(HELPERS, "mw_fit_worker.py"),
                     str(self.base / "job.json"), str(task)],
                    stdout=log, stderr=subprocess.STDOUT, env=env))

    def left(self) -> float:
        return MW_TIMEOUT - (time.monotonic() - self.started)

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(f"--- worker {task} (exit {p.returncode}):\n"
                         + (self.base / f"log-{task}.txt").read_text()[-3000:]
                         for task, p in enumerate(self.processes))

    def _failed_alone(self) -> bool:
        """True when a worker failed while the other still runs; then both are ended (and
        started again once when a port was taken: False)."""
        codes = [p.poll() for p in self.processes]
        if None not in codes or not any(code not in (None, 0) for code in codes):
            return False
        self.kill_all()
        if not self.retried and PORT_TAKEN in self.logs():
            self.retried = True
            self._start()
            return False
        return True

    def wait(self) -> list[int]:
        while None in [p.poll() for p in self.processes]:
            if self._failed_alone():
                break
            if self.left() < 0:
                self.kill_all()
                pytest.fail(f"workers still running after {MW_TIMEOUT} s; killed\n"
                            f"{self.logs()}")
            time.sleep(0.05)
        return [p.returncode for p in self.processes]

    def until(self, condition, what: str) -> None:
        while not condition():
            if (self._failed_alone() or None not in [p.poll() for p in self.processes]
                    or self.left() < 0):
                self.kill_all()
                pytest.fail(f"gave up waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    def results(self) -> list[tuple[dict, dict]]:
        codes = self.wait()
        if codes != [0, 0]:
            pytest.fail(f"workers exited with {codes}\n{self.logs()}")
        out = []
        for task in range(2):
            result = json.loads((self.base / f"task-{task}.json").read_text())
            with np.load(self.base / f"task-{task}.npz", allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
            out.append((result, arrays))
        return out


def stage(arrays: dict, name: str, local: bool = False) -> dict:
    """{object path: value} recorded by a worker at a stage (see mw_fit_worker.py)."""
    out = {}
    for key, value in arrays.items():
        parts = key.split("|")
        if parts[0] == name and (parts[-1] == "local") == local:
            out["/".join(parts[1:-1] if local else parts[1:])] = value
    return out


def numbers(directory) -> list[int]:
    latest = tf.train.latest_checkpoint(str(directory))
    return [] if latest is None else [int(latest.rsplit("-", 1)[1])]


def assert_chief_only(directory, chief_pid: int, kept: list[str]):
    """Only what the chief commits is in the directory (no worker temp directory, no
    debris), the lock file names the chief, and the checkpoints are intact."""
    names = sorted(os.listdir(directory))
    expected = sorted(["checkpoint", _dirlock.LOCK_FILE] + [
        f"{os.path.basename(p)}.{suffix}" for p in kept
        for suffix in ("index", "data-00000-of-00001")])
    assert names == expected
    for root, dirs, _ in os.walk(os.path.dirname(directory)):
        assert not [d for d in dirs if d.startswith("workertemp")], root
    holder = (directory / _dirlock.LOCK_FILE).read_text()
    assert holder.startswith(f"pid {chief_pid} on "), holder
    for prefix in kept:
        report = objckpt.verify(prefix)
        assert report.ok, report.describe()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One run of two workers: fit with all four callbacks (4 epochs of 4 global batches,
    Checkpointing every 2 batches), then a custom loop of 12 steps with CheckpointManager."""
    base = tmp_path_factory.mktemp("uninterrupted")
    workers = Workers(base, dir=str(base / "fit"), epochs=4, save_freq=2, fit=True,
                      loop=str(base / "loop"), loop_steps=12)
    (r0, a0), (r1, a1) = workers.results()
    return {"base": base, "results": (r0, r1), "arrays": (a0, a1)}


def fit_supported(run) -> None:
    r0, r1 = run["results"]
    if "fit_unsupported" in r0:
        assert FLAVOUR == "keras3" and "fit_unsupported" in r1, r0["fit_unsupported"]
        pytest.skip(KERAS3_MULTIWORKER_FIT + f" Seen here: {r0['fit_unsupported']}")


@pytest.mark.multiworker
def test_multiworker_fit_chief_commits_and_workers_agree(uninterrupted):
    fit_supported(uninterrupted)
    (r0, r1), (a0, a1) = uninterrupted["results"], uninterrupted["arrays"]
    directory = uninterrupted["base"] / "fit"
    assert (r0["chief"], r1["chief"]) == (True, False)
    prefixes = [str(directory / f"ckpt-{n}") for n in range(1, 9)]  # 16 steps, every 2
    assert r0["saved"] == r1["saved"] == prefixes
    assert r0["kept"] == r1["kept"] and r0["kept"][-2:] == prefixes[-2:]
    assert r0["best_kept"] == r1["best_kept"]
    assert_chief_only(directory, r0["pid"], r0["kept"])
    trained = stage(a0, "trained")
    assert_like(stage(a1, "trained"), trained, skip=UNSYNCED)  # the same on every worker
    assert_like(checkpoint_values(prefixes[-1], trained), trained)
    reader = tf.train.load_checkpoint(prefixes[-1])
    assert int(reader.get_tensor(_paths.checkpoint_key("step"))) == 16
    assert "MirroredVariable" in r0["model_types"]
    if FLAVOUR != "keras3":
        assert r0["on_read"] == ["bn/moving_mean", "bn/moving_variance"]


@pytest.mark.multiworker
def test_multiworker_callbacks_keep_the_workers_identical(uninterrupted):
    fit_supported(uninterrupted)
    (r0, r1), (a0, a1) = uninterrupted["results"], uninterrupted["arrays"]
    statistics = set(r0["on_read"])
    for name in ["epoch0", "epoch1", "epoch2", "epoch3", "past3", "trained", "final"]:
        assert_like(stage(a1, name), stage(a0, name), skip=UNSYNCED)
        for arrays in (a0, a1):  # each worker's own replica of a mirrored variable
            local, value = stage(arrays, name, local=True), stage(arrays, name)
            assert_like({p: v for p, v in local.items() if p not in statistics},
                        {p: v for p, v in value.items() if p not in statistics},
                        skip=UNSYNCED)
    # TwinSync (hard copy after each epoch) into a past network distributed like the model.
    assert r0["syncs"] == r1["syncs"] == 4
    assert set(r0["past_types"]) == set(r0["model_types"])
    for epoch in range(4):  # the past network's weights: the model's (not its optimizer's)
        weights = {p: v for p, v in stage(a0, f"epoch{epoch}").items()
                   if not p.startswith("optimizer/") and _paths.split_slot(p) is None}
        past = stage(a0, f"past{epoch}")
        assert_like({p: v for p, v in past.items() if p in weights}, weights)
    # FreezeSchedule: the encoder frozen from epoch 2 on.
    state = sorted(p for p in stage(a0, "trained") if p.startswith("encoder/"))
    encoder = [p for p in state if _paths.split_slot(p) is None]
    assert r0["freeze_history"] == r1["freeze_history"]
    assert [[e, sorted(f)] for e, f in r0["freeze_history"]] == [
        [0, []], [1, []], [2, encoder], [3, encoder]]
    for path in state:
        assert stage(a0, "trained")[path].tobytes() == stage(a0, "epoch1")[path].tobytes()
    assert any(value.tobytes() != stage(a0, "epoch1")[path].tobytes()
               for path, value in stage(a0, "trained").items() if path.startswith("head/"))
    # BestSnapshot: the chief's logs pick the epoch; every worker restores it.
    assert r0["best_epoch"] == r1["best_epoch"] is not None
    assert r0["best"] == r1["best"]
    assert_like(stage(a0, "final"), stage(a0, f"epoch{r0['best_epoch']}"))


@pytest.mark.multiworker
def test_multiworker_checkpoint_manager_in_a_custom_loop(uninterrupted):
    (r0, r1), (a0, a1) = uninterrupted["results"], uninterrupted["arrays"]
    directory = uninterrupted["base"] / "loop"
    assert (r0["loop_chief"], r1["loop_chief"]) == (True, False)
    prefixes = [str(directory / f"ckpt-{n}") for n in range(1, 13)]
    assert r0["loop_saved"] == r1["loop_saved"] == prefixes
    assert r0["loop_kept"] == r1["loop_kept"]
    assert r0["loop_latest"] == prefixes[-1]
    assert_chief_only(directory, r0["pid"], r0["loop_kept"])
    final = stage(a0, "loop_final")
    assert_like(stage(a1, "loop_final"), final, skip=UNSYNCED)
    assert_like(checkpoint_values(prefixes[-1], final), final)


@pytest.mark.multiworker
def test_multiworker_run_killed_and_restarted_resumes_on_every_worker(uninterrupted, tmp_path):
    """The non-chief is SIGKILLed mid-training, then the chief is stopped (SIGTERM, as a
    cluster manager does); both restart and resume from the newest intact checkpoint: the
    same one, the same step, bit-identical values on both workers equal to the checkpoint's,
    and they end where the uninterrupted run ended."""
    r_ref, a_ref = uninterrupted["results"][0], uninterrupted["arrays"][0]
    use_fit = "fit_unsupported" not in r_ref
    directory = tmp_path / "run"
    if use_fit:
        job = dict(dir=str(directory), epochs=4, save_freq=2, fit=True)
        begin, end, expected = "begin", "trained", stage(a_ref, "trained")
    else:  # Keras 3: a custom loop with CheckpointManager
        job = dict(loop=str(directory), loop_steps=12)
        begin, end, expected = "loop_begin", "loop_final", stage(a_ref, "loop_final")
    statistics = set(r_ref["on_read"])

    workers = Workers(tmp_path / "killed", sleep=0.25, **job)
    workers.until(lambda: numbers(directory) and numbers(directory)[0] >= 3,
                  "the chief to commit ckpt-3")
    chief, other = workers.processes
    with pytest.raises(errors.DirectoryLockedError) as locked:
        _dirlock.DirectoryLock(str(directory)).acquire()
    assert locked.value.holder.startswith(f"pid {chief.pid} on ")
    other.send_signal(signal.SIGKILL)
    time.sleep(0.5)
    if chief.poll() is None:
        chief.send_signal(signal.SIGTERM)
    codes = workers.wait()
    assert codes[1] == -signal.SIGKILL, workers.logs()
    assert codes[0] != 0, workers.logs()  # stopped, or failed without its peer
    assert not (tmp_path / "killed" / "task-0.json").exists()
    prefix = tf.train.latest_checkpoint(str(directory))  # the newest committed
    saved = checkpoint_values(prefix, expected)
    step = int(tf.train.load_checkpoint(prefix).get_tensor(_paths.checkpoint_key("step")))
    assert 3 <= step < 16 if use_fit else 3 <= step < 12

    (r0, a0), (r1, a1) = Workers(tmp_path / "restarted", **job).results()
    if use_fit:
        assert r0["resumed_from"] == r1["resumed_from"] == prefix
        assert r0["begin_counters"] == r1["begin_counters"]
        assert r0["begin_counters"][1] == step
    else:
        assert r0["loop_start"] == r1["loop_start"] == step
    for arrays in (a0, a1):  # every replica of every variable, SyncOnRead ones too
        assert_like(stage(arrays, begin), saved)
        assert_like(stage(arrays, begin, local=True), saved)
    assert_like(stage(a0, end), expected, approx=statistics)
    assert_like(stage(a1, end), stage(a0, end), skip=UNSYNCED)
    kept = r0["kept"] if use_fit else r0["loop_kept"]
    assert kept == (r1["kept"] if use_fit else r1["loop_kept"])
    assert_chief_only(directory, r0["pid"], kept)
