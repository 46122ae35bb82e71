"""A crash-safe directory of checkpoints: commit protocol, retention, resume, async writes.

`CheckpointDirectory` composes one part per job, each in a module of its own: a
`RetentionPolicy` (`retention`: which checkpoints stay), the `CommitProtocol` (`commit`:
the lock; write, commit, delete, recover after a crash; the state file itself is
`_bundle.state`'s), an `asyncwrite.Writer` (async_save) and, with several workers, the
`MultiWorker` protocol (`multiworker`: the chief writes, the others follow) over a
`Cluster` (`cluster`: who is who, and their collectives).

A checkpoint `ckpt-N` is committed in this order, and the TF `checkpoint`
state file is the commit point:

1. every tensor is written under a temporary name (`.ckpt-N.tmp-*`);
2. the data file is renamed to `ckpt-N.data-00000-of-00001`, then the
   index to `ckpt-N.index` (the index last: it is what makes a prefix a
   checkpoint);
3. the state file is rewritten atomically (temporary file, then rename)
   to name `ckpt-N` as the newest and to list every checkpoint kept;
4. the files of checkpoints no longer kept are deleted, index first.

A SIGKILL anywhere leaves the state file naming only fully written
checkpoints; the next `open()` removes our temporary files, half-deleted old
ones and every `ckpt-N` that is not intact. An intact checkpoint is deleted
only when provably superseded (DESIGN.md, invariant 10): dropped by retention,
or unlisted and older than the newest intact one the state file lists. One
written but not committed (a crash between the index rename and the state
file) is left in place until a newer one is committed. Every file is
untrusted: a stray file beside a checkpoint (`ckpt-3.data-00000-of-00001.bak`)
is never taken for a shard nor deleted; a state file naming anything but this
directory's `ckpt-N`, or nothing intact, falls back to the intact `ckpt-N` on
disk; intact checkpoints of other names and none of ours make `open()` refuse
a fresh start. Everything written is a standard object-based checkpoint, so
`tf.train.latest_checkpoint(directory)` and `objckpt.restore` find it.

Under `MultiWorkerMirroredStrategy` with more than one worker every worker
runs the same `open`, `restore`, `save` and `close`, in the same order (a
`Cluster` says who is who): the chief (task 0, TF's `should_checkpoint`) alone
takes the lock, tidies, writes and commits; the others read the values too
(reading a SyncOnRead variable in cross-replica context is a collective, as
in TF's own save), write nothing (their values are the chief's: mirrored
variables are identical, SyncOnRead ones are reduced across all workers) and
so leave no `workertemp_<task>` directory behind. Small collectives keep them
in step: the chief's choice of checkpoint to resume from is broadcast, and
every worker learns whether any other failed to open, restore, write or close,
so all raise together instead of one waiting forever for the others.
"""

from __future__ import annotations

import math
import os
import re
import warnings

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._bundle import remote as _remote
from objckpt._ops import restore as _restore
from objckpt._ops import snapshot as _snapshot
from objckpt._planning import checks as _checks
from objckpt._planning import tree as _tree
from objckpt._training import asyncwrite as _asyncwrite
from objckpt._training import commit as _commit
from objckpt._training.cluster import Cluster, error_code
from objckpt._training.commit import METRIC, STATE_FILE, CommitProtocol, Recovered
from objckpt._training.kept import KeptCheckpoints
from objckpt._training.multiworker import MultiWorker
from objckpt._training.retention import Kept, RetentionPolicy

__all__ = ["COUNTERS", "METRIC", "STATE_FILE", "CheckpointDirectory", "Cluster",
           "CommitProtocol", "Kept", "MultiWorker", "Recovered", "RetentionPolicy",
           "error_code"]

COUNTERS = ("epoch", "step", "batch")

# Tests set this to a callable(stage) to crash or fail at a stage of a save:
# "write" (nothing written yet), "data" (temporary files complete), "index"
# (ckpt-N renamed into place, not yet committed), "state" (committed), "delete"
# (between the deletions of old checkpoints).
fault_hook = None


def _stage(name: str) -> None:
    if fault_hook is not None:
        fault_hook(name)


class CheckpointDirectory:
    """Saves and resumes one obj in a directory of managed checkpoints.

    The checkpoints hold `tf.train.Checkpoint(model=obj, epoch=, step=, batch=,
    monitor_value=)`: obj's variables (a Keras model's include its optimizer's)
    and int64 counters, plus the float64 value of the monitored metric.

    It composes the parts that do the work: a `RetentionPolicy` (`retention`: which
    checkpoints stay), the `CommitProtocol` (`commits`: the lock, writing, committing,
    deleting, recovering), an `_asyncwrite.Writer` (with async_save) and, with several
    workers, the `MultiWorker` protocol. What it keeps itself: obj and the counters, the
    checkpoints kept, the numbering, and what to do on a failed write.

    Args:
      directory: a local path or a `gs://` / `s3://` URL; created if missing.
      obj: the trackable to save and restore.
      retention: the `RetentionPolicy` (None: `RetentionPolicy()`, the newest 5).
      async_save: write in a background thread (see `save`).
      on_error: "raise" a `CheckpointWriteError` when a write fails, or "warn"
        and go on; the earlier checkpoints are untouched either way.
      durable: fsync each checkpoint before it is committed (None: the library
        default, `_fastio.DURABLE_DEFAULT`).
      fingerprint: a callable giving a cheap identity of obj's variables, for
        caching obj's tree between saves; None walks obj on every save.
      extras: {name: trackable} saved and restored beside obj and the counters, as
        `root.<name>` (the state callbacks keep for the model: `_training.companions`).

    Attributes:
      directory: the absolute path.
      root: the `tf.train.Checkpoint` saved (`root.model` is obj).
      counters: {"epoch", "step", "batch"}: int64 variables saved with obj.
      metric: the float64 variable of the monitored value.
      kept: the checkpoints kept, oldest first (`Kept`).
      notes: the warnings given.
      failures: how many writes failed.
      skipped: how many saves were skipped as too soon (checkpoint_interval,
        min_interval_seconds).
      preserved: numbers of the checkpoints keep_every_n_hours preserved (TF's
        `last_preserved_timestamp` is `commits.preserved`).
    """

    def __init__(self, directory, obj, *, retention: RetentionPolicy | None = None,
                 async_save=False, on_error="raise", fingerprint=None, durable=None,
                 extras=None):
        directory = os.fspath(directory)
        self.directory = (directory.rstrip("/") if _remote.is_remote(directory)
                          else os.path.abspath(directory))
        self.retention = RetentionPolicy() if retention is None else retention
        self.commits = CommitProtocol(self.directory, durable, _stage)
        self.on_error = on_error
        self.counters = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                         for name in COUNTERS}
        self.metric = tf.Variable(math.nan, dtype=tf.float64, trainable=False, name=METRIC)
        self.extras = dict(extras or {})
        self.root = tf.train.Checkpoint(model=obj, **self.counters, **{METRIC: self.metric},
                                        **self.extras)
        self.notes: list[str] = []
        self.failures = self.skipped = 0
        self.checkpoints = KeptCheckpoints(self.retention, self.commits)
        self._workers: MultiWorker | None = None  # set by open(), when several workers train
        self._layout = _commit.Layout(self.root, self.directory, fingerprint)
        self.next_number = 1  # of the next checkpoint
        self.read_only = None  # the CheckpointWriteError of an unwritable directory
        self.writer = _asyncwrite.Writer(self._write) if async_save else None

    @property
    def cluster(self) -> Cluster | None:
        """The workers (set by open()), or None in a single process."""
        return self._workers.cluster if self._workers is not None else None

    @property
    def superseded(self) -> int:
        """How many async saves were superseded by a newer one before they started."""
        return self.writer.superseded if self.writer is not None else 0

    @property
    def kept(self) -> list[Kept]:
        """The checkpoints kept, oldest first."""
        return self.checkpoints.kept

    @property
    def preserved(self) -> frozenset[int]:
        """Numbers of the checkpoints keep_every_n_hours preserved."""
        return self.checkpoints.preserved

    def best(self) -> list[Kept]:
        """The kept checkpoints with a metric, best first (ties: the older first)."""
        return self.checkpoints.best()

    # --- opening and resuming ---------------------------------------------------

    def open(self) -> Kept | None:
        """Locks the directory, removes debris and returns the newest intact checkpoint.

        Returns None when the directory holds no checkpoint yet. A state file that is
        missing, cannot be read or names anything but this directory's `ckpt-N`, or whose
        checkpoints are all missing or damaged, falls back to the intact `ckpt-N` found on
        disk, with a warning. What is deleted here: temporary files of our writers, files of
        `ckpt-N` that are not intact, and intact ones the state file no longer lists that are
        older than the newest intact one it lists (superseded). An intact `ckpt-N` newer
        than that (written, but not committed before a crash) is left in place, unused.

        Raises:
          DirectoryLockedError: another writer uses the directory.
          CheckpointWriteError: the directory cannot be written (with on_error="warn", a
            warning instead: nothing is saved, the newest checkpoint is still returned).
          CheckpointDirectoryError: the directory holds intact checkpoints of other names
            and none of ours: a fresh start there is refused.

        With several workers (see the module's docstring) only the chief locks and tidies;
        every worker returns the checkpoint the chief chose, or all raise: the same error
        type as the worker that failed (a worker that cannot read the chief's choice raises
        `CheckpointDirectoryError`: the directory must be one all workers see).
        """
        self.read_only = None
        cluster = Cluster.of(_tree.tree(self.root).values())
        self._workers = None if cluster is None else MultiWorker(self, cluster)
        if self._workers is None:
            return self.open_alone()
        return self._workers.open()

    def open_alone(self) -> Kept | None:
        """open() of the one writer: lock, recover, tidy."""
        try:
            self.commits.lock.acquire()
        except errors.CheckpointWriteError as err:
            if self.on_error == "raise":
                raise
            self.read_only = err
            self._warn(f"{err} Training goes on without saving (on_error='warn').")
        try:
            return self._recover()
        except BaseException:
            self.release()
            raise

    def _recover(self) -> Kept | None:
        found = self.commits.recover(self.retention.reads_metrics, self._warn)
        self.next_number = found.next
        self.checkpoints.resumed(found.kept)
        if self.read_only is None:
            try:
                self.commits.tidy(found)
            except OSError as err:
                self.failed(errors.CheckpointWriteError(
                    f"Cannot tidy checkpoint directory `{self.directory}`: "
                    f"{_render.first_line(err)}. Nothing of what it holds was lost; the newest "
                    f"checkpoint is {self.checkpoints.latest_name()}. Fix: check the directory's "
                    "permissions; pass on_error='warn' to train on regardless.",
                    source=self.directory))
        return self.kept[-1] if self.kept else None

    def restore(self, kept: Kept, who: str = "Checkpointing",
                when: str = "at the start of fit") -> dict[str, int]:
        """Restores obj and the counters from a checkpoint, all or nothing; returns the counters.

        A Keras model's own optimizer is built first (Keras creates its slots lazily).
        `who` and `when` word the error for an unbuilt model ("Checkpointing", "at the
        start of fit").

        Raises:
          UnbuiltModelError: obj is a Keras model that is not built yet.
          as `objckpt.restore`: the checkpoint does not fit obj (nothing is changed).
        """
        _ready_to_restore(self.root.model, kept, who, when)
        if self._workers is None:
            root, rules = _root_for(self, kept)
            _restore.restore(root, kept.prefix, rules=rules)
        else:
            self._workers.restore(kept)
        return {name: int(v.numpy()) for name, v in self.counters.items()}

    # --- saving -------------------------------------------------------------------

    def save(self, metric: float | None = None, force: bool = False) -> str | None:
        """Writes the current values as the next checkpoint; returns its prefix.

        A save too soon after the last one (`checkpoint_interval` steps by the `step`
        counter, `min_interval_seconds` by `retention.now`) is skipped unless `force`:
        nothing is written, and it returns None.

        With `async_save`, only the in-memory copy (a Snapshot: no bytes
        copied) happens here; a background thread writes and commits it. A
        newer save supersedes one still waiting to start.

        With several workers every worker calls it: all read the values (a collective for
        SyncOnRead variables), the chief alone writes and commits, and the others learn
        whether it could (with on_error="raise" they raise too when it could not). On the
        others the prefix returned, `kept` and `best()` are the chief's.
        """
        if self._workers is not None:
            return self._workers.save(metric, force)
        stamp, skip = self.when(force)
        if skip is not None:
            self.skipped += 1
            return None
        if self.read_only is not None:
            self.failed(self.read_only)
            return None
        self.commits.check_lock()
        job = self.take(metric, stamp)
        done, err = self.hand_over(job)
        if done:
            self.note_saved(job)
        if err is not None:
            self.failed(err)
        return self.commits.prefix(job[0]) if done else None

    def when(self, force: bool) -> tuple[float, str | None]:
        """(the timestamp of a save now, why it comes too soon or None)."""
        return self.checkpoints.when(int(self.counters["step"].numpy()), force)

    def take(self, metric: float | None, stamp: float) -> tuple:
        """Reads the values to save (a Snapshot: no bytes copied); returns the write job:
        (number, metric, timestamp, layout, values, step). The `keep` predicate is asked
        about it first, so that its error comes here, with nothing written."""
        self.metric.assign(math.nan if metric is None else float(metric))
        step = int(self.counters["step"].numpy())
        number = self.next_number
        metric = float(self.metric.numpy())
        kept = Kept(number, self.commits.prefix(number), metric, stamp, step)
        self.retention.asks(kept)
        layout = self._layout.current()
        values = _snapshot.read_values(layout[1])  # a sharded variable's shards where they live
        self.next_number = number + 1
        self.checkpoints.clock = stamp  # the time of these values
        return number, metric, stamp, layout, values, step

    def note_saved(self, job: tuple) -> None:
        """Notes `job` (written, or handed to the async writer) as the last save."""
        self.checkpoints.last = Kept(job[0], self.commits.prefix(job[0]), job[1], job[2], job[5])

    def hand_over(self, job: tuple) -> tuple[bool, errors.CheckpointWriteError | None]:
        """Writes and commits `job` (with async_save: hands it to the writer); returns
        (whether it was written or handed over, the CheckpointWriteError of this write or,
        with async_save, of an earlier one). With on_error="raise" a job is not handed over
        behind an earlier failure."""
        if self.writer is None:
            try:
                self._write(*job)
            except errors.CheckpointWriteError as err:
                return False, err
            return True, None
        try:
            self.writer.raise_pending()
            err = None
        except errors.CheckpointWriteError as caught:
            err = caught
        if err is not None and self.on_error == "raise":
            return False, err
        self.writer.submit(job)
        return True, err

    def failed(self, err: errors.CheckpointWriteError) -> None:
        """Counts a failed write; raises it (on_error="raise") or warns and goes on."""
        self.failures += 1
        if self.on_error == "raise":
            raise err
        self._warn(f"{err} Training goes on (on_error='warn').")

    def _write(self, number: int, metric: float, stamp: float, layout, values,
               step: int | None = None) -> None:
        """Writes and commits one checkpoint, then deletes those retention drops (in the
        background thread with async_save, on one thread: training keeps the other cores)."""
        self.commits.save(Kept(number, self.commits.prefix(number), metric, stamp, step),
                          layout, values, self.checkpoints.decide,
                          latest=self.checkpoints.latest_name,
                          warn=self._warn, workers=1 if self.writer is not None else None)

    # --- life cycle -----------------------------------------------------------------

    def wait(self) -> None:
        """Blocks until every pending async write is committed; raises its error.

        With several workers (and async_save) every worker calls it, and all learn whether
        the chief's writes failed."""
        if self.writer is None:
            return
        if self._workers is not None:
            self._workers.wait()
            return
        self.writer.wait()
        try:
            self.writer.raise_pending()
        except errors.CheckpointWriteError as err:
            self.failed(err)

    def close(self) -> None:
        """Waits for pending writes, then releases the directory's lock."""
        try:
            self.wait()
        finally:
            self.release()

    def release(self) -> None:
        """Releases the directory's lock (without waiting for pending writes)."""
        if self._workers is not None:
            self._workers.following = False
        self.commits.lock.release()

    def _warn(self, message: str) -> None:
        self.notes.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _ready_to_restore(obj, kept: Kept, who: str, when: str) -> None:
    """Refuses an unbuilt Keras model; builds a Keras model's own optimizer (Keras creates its
    slots lazily) before `kept` is restored into it."""
    if _compat.is_unbuilt(obj):
        raise errors.UnbuiltModelError(
            f"{who}: cannot resume from `{kept.prefix}` into {type(obj).__name__} because "
            f"it is not built yet. Expected a built model {when}. Fix: build it first "
            "(call it on a batch, or model.build(input_shape)).")
    optimizer = getattr(obj, "optimizer", None)
    variables = getattr(obj, "trainable_variables", None)  # a Keras model's own optimizer
    if variables is not None and callable(getattr(optimizer, "apply_gradients", None)):
        with _checks.creation_scope(_tree.tree(obj).values()):  # slots mirrored too
            _compat.build_optimizer(optimizer, variables)


def _root_for(self: CheckpointDirectory, kept: Kept) -> tuple:
    """(the root to restore `kept` into, rules dropping what it cannot take): the state of
    a callback added since `kept` was written starts afresh, and that of a callback not
    in this fit stays in the file (`_training.companions`), each with a warning."""
    from objckpt._training import companions as _companions

    missing, unused = _companions.reconcile(list(_tree.read_tree(kept.prefix)), self.extras)
    if not missing and not unused:
        return self.root, ()
    for name in missing:
        self._warn(f"Checkpointing: {kept.prefix} holds no state of `{name}` (a callback "
                   "added since it was written): it starts afresh from the resumed model.")
    for name in unused:
        self._warn(f"Checkpointing: {kept.prefix} holds the state of `{name}` and no "
                   "callback of this fit keeps it: it is left unused. Fix: pass that "
                   "callback to fit (e.g. objckpt.callbacks.SWA) to continue it.")
    if not missing:
        return self.root, tuple((f"^{re.escape(name)}/", None) for name in unused)
    extras = {n: v for n, v in self.extras.items() if n not in missing}
    root = tf.train.Checkpoint(model=self.root.model, **self.counters,
                               **{METRIC: self.metric}, **extras)
    return root, tuple((f"^{re.escape(name)}/", None) for name in unused)
