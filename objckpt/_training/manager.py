"""`objckpt.CheckpointManager`: the directory behind `callbacks.Checkpointing`, for custom loops.

A thin public face on `_checkpointing.CheckpointDirectory` (its retention policy:
keep-N newest, best-K by a metric, every N steps or hours, a predicate; the
crash-safe commit, resume from the newest intact checkpoint, the directory
lock, on_error, async writes): the same files, the same layout, the same
guarantees, driven by `save(step, metrics)` instead of the hooks of `model.fit`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import numpy as np

from objckpt import _compat, errors
from objckpt._base import options as _options
from objckpt._training import checkpointing as _checkpointing
from objckpt._training import retention as _retention

__all__ = ["CheckpointManager"]

DEFAULT = _retention.DEFAULT  # a retention keyword not passed


class CheckpointManager:
    """Keeps crash-safe, object-based checkpoints of obj in a directory, for custom loops.

    The keep-N/best-K machinery of `callbacks.Checkpointing`, as a class:
    each `save(step, metrics)` writes the next `ckpt-N` (a standard TF
    checkpoint of `tf.train.Checkpoint(model=obj, epoch=, step=, batch=,
    monitor_value=)`, committed through TF's `checkpoint` state file, which
    records when each was saved), then deletes the checkpoints no retention
    rule keeps: the newest `max_to_keep`, the best `keep_best` by
    `metrics[monitor]`, and those below (every N steps, every N hours, a
    predicate); `checkpoint_interval` and `min_interval_seconds` skip saves
    that come too soon (docs/retention.md). A SIGKILL at any moment leaves the newest committed
    checkpoint intact; `restore_latest()` in the next process restores obj
    from it, all or nothing, and returns its step. `tf.train.latest_checkpoint
    (directory)`, `objckpt.restore(obj, directory, at="model")` and
    `tf.train.Checkpoint(model=obj).read(prefix)` all read what it writes, and
    a `Checkpointing` directory can be resumed by it (and the other way round).

    Creating the manager locks the directory (one writer at a time; another
    process gets `DirectoryLockedError`) and tidies it: debris of interrupted
    saves is removed and the newest intact checkpoint found, exactly as
    `Checkpointing` does at the start of fit. Release it with `close()` or a
    `with` block.

    obj holds everything to save: a Keras model compiled with its optimizer,
    or e.g. `tf.train.Checkpoint(model=model, optimizer=optimizer)`. Keras
    creates optimizer slots lazily: a model's own optimizer is built by
    `restore_latest()`; build one held beside the model yourself first
    (`optimizer.build(model.trainable_variables)`), or the restore names the
    slots it has no variable for.

    Under `tf.distribute` create obj (and the manager's first `save`) as usual:
    MirroredStrategy needs nothing more. With MultiWorkerMirroredStrategy on several
    workers, every worker creates the manager and calls `save`, `restore_latest` and
    `close` at the same points, as with `tf.train.CheckpointManager`: the chief (task 0)
    alone locks the directory, writes and commits; the others take part in reading the
    values (a collective for SyncOnRead variables), write nothing, and resume from the
    checkpoint the chief chose. The directory must be one every worker sees (a shared
    file system). A worker that skips a call leaves the others waiting for it.

    Args:
      obj: the trackable to save and restore (built: it must have its variables).
      directory: a directory of checkpoints (created if missing): a local path, or a
        `gs://` or `s3://` URL (docs/storage.md).
      retention: an `objckpt.RetentionPolicy`: which checkpoints stay and which saves are
        skipped, given once. The keywords below, up to `min_interval_seconds` (and
        `mode`), are shortcuts that build one; passing both is an `InvalidArgumentError`.
        Neither: `RetentionPolicy()` (the newest 5).
      max_to_keep: keep the newest this many checkpoints (>= 1; None: keep all).
      keep_best: also keep this many best checkpoints by `monitor` (their metric
        is read back from the checkpoints on restart).
      keep_every_n_steps: also keep forever every checkpoint whose training step is a
        multiple of this (Orbax's keep_period); None: off.
      keep_every_n_hours: TF CheckpointManager's `keep_checkpoint_every_n_hours`: a
        checkpoint leaving the newest `max_to_keep` is kept forever when it was saved at
        least this many hours after the last one so kept (TF's `last_preserved_timestamp`
        in the `checkpoint` state file, so it survives restarts); None: off.
      keep: a callable `(Kept) -> bool` (`Kept`: `.number`, `.prefix`, `.step`, `.metric`,
        `.timestamp`); True keeps that checkpoint forever. It is asked about each
        checkpoint no other rule keeps, so it must answer from the `Kept` alone; if it
        raises, the save raises `InvalidArgumentError` naming the checkpoint, with nothing
        written or deleted.
      checkpoint_interval: skip a save less than this many steps after the last one
        saved (TF's name; the step counter decides, also after a restart); None: off.
      min_interval_seconds: skip a save less than this many seconds after the last one
        saved (its timestamp, also after a restart); None: off.
        A checkpoint stays when any of these rules keeps it (docs/retention.md).
      monitor: the key of `save`'s `metrics` saved with each checkpoint and
        ranked for `keep_best`.
      mode: "min" or "max": which value of `monitor` is better.
      async_save: write in a background thread; `save` blocks only for the
        in-memory copy, and a save still waiting when a newer one comes is
        superseded (never written).
      on_error: "raise" a `CheckpointWriteError` when a save fails, or "warn" and
        go on (`save` returns None); earlier checkpoints are untouched either way.
      durable: True: fsync each checkpoint's files and the directory before it
        is committed (it survives a power cut); False: do not; None (default):
        the library default (see `objckpt.save`).
      verbose: 1 (the default) prints one line to stdout when `restore_latest()`
        resumes (`CheckpointManager: resumed from /tmp/run/ckpt-7 (step 700).`);
        0 prints nothing.

    Raises:
      InvalidArgumentError: an argument out of range (named, with what was received).
      DirectoryLockedError: another writer uses the directory.
      CheckpointDirectoryError: the directory holds intact checkpoints of other names
        and none of ours.

    Example:
      >>> state = tf.train.Checkpoint(model=model, optimizer=optimizer)
      >>> optimizer.build(model.trainable_variables)  # Keras 3: slots exist before restore
      >>> with objckpt.CheckpointManager(state, "/tmp/run", max_to_keep=3, keep_best=2,
      ...                                monitor="val_loss") as manager:
      ...     start = manager.restore_latest() or 0  # None: a fresh directory
      ...     for step in range(start, 1000):
      ...         train_step(batches[step])
      ...         if (step + 1) % 100 == 0:
      ...             manager.save(step + 1, {"val_loss": evaluate()})
      ...     best = manager.best()[0]  # .prefix, .metric, .number, .timestamp
    """

    @errors.about_arguments(source="directory", obj="obj")
    def __init__(self, obj, directory, *, retention: _retention.RetentionPolicy | None = None,
                 max_to_keep: int | None = DEFAULT, keep_best: int = DEFAULT,
                 monitor: str = "val_loss", mode: str = DEFAULT,
                 keep_every_n_steps: int | None = DEFAULT,
                 keep_every_n_hours: float | None = DEFAULT, keep=DEFAULT,
                 checkpoint_interval: int | None = DEFAULT,
                 min_interval_seconds: float | None = DEFAULT, async_save: bool = False,
                 on_error: str = "raise", verbose: int = 1, durable: bool | None = None):
        directory = _options.directory_path("CheckpointManager", directory)
        retention = _retention.RetentionPolicy.of("CheckpointManager", retention, dict(
            max_to_keep=max_to_keep, keep_best=keep_best, mode=mode,
            keep_every_n_steps=keep_every_n_steps, keep_every_n_hours=keep_every_n_hours,
            keep=keep, checkpoint_interval=checkpoint_interval,
            min_interval_seconds=min_interval_seconds))
        _options.writer_options(monitor=monitor, async_save=async_save, on_error=on_error,
                                verbose=verbose, durable=durable)
        self.obj, self.monitor, self.verbose = obj, monitor, int(verbose)
        self._directory = _checkpointing.CheckpointDirectory(
            directory, obj, retention=retention, async_save=async_save, on_error=on_error,
            durable=durable, fingerprint=lambda: _compat.fingerprint(obj))
        self._directory.open()

    @property
    def directory(self) -> str:
        """The absolute path of the directory."""
        return self._directory.directory

    @property
    def latest(self) -> str | None:
        """The prefix of the newest committed checkpoint, or None."""
        kept = self._directory.kept
        return kept[-1].prefix if kept else None

    @property
    def kept(self) -> list:
        """The checkpoints kept, oldest first: each has `.prefix`, `.number` (N of
        `ckpt-N`), `.metric` (NaN: none), `.timestamp` (when it was saved) and `.step`
        (the step saved with it; after a restart read back only when a rule needs it,
        else None)."""
        return list(self._directory.kept)

    @property
    def retention(self) -> _retention.RetentionPolicy:
        """The `RetentionPolicy` in use (built from the keywords when they were given)."""
        return self._directory.retention

    @property
    def skipped(self) -> int:
        """How many saves were skipped as too soon (checkpoint_interval,
        min_interval_seconds)."""
        return self._directory.skipped

    def best(self) -> list:
        """The kept checkpoints that have a metric, best first (ties: the older first); as
        `kept` lists them. After a restart, metrics are read back only with keep_best >= 1."""
        return self._directory.best()

    def save(self, step: int, metrics: Mapping | None = None) -> str | None:
        """Writes obj's current values as the next checkpoint; returns its prefix.

        Args:
          step: the training step (an int >= 0), saved with the checkpoint and
            returned by `restore_latest()`.
          metrics: a mapping of name -> number; `metrics[monitor]` is saved with the
            checkpoint and ranks it for `keep_best` (NaN never ranks). Other keys
            are ignored.

        Returns:
          The prefix written (with async_save: submitted); None when the save came too
          soon (`checkpoint_interval`, `min_interval_seconds`: nothing is written), or the
          write failed and on_error="warn".

        Raises:
          InvalidArgumentError: step or metrics are not as above, `metrics` lacks
            `monitor` while keep_best >= 1, or the `keep` predicate raised; nothing is
            written.
          CheckpointWriteError: the write failed (on_error="raise"); earlier
            checkpoints are untouched.
          DirectoryLockedError: the manager was closed.
        """
        step = _step(step)
        value = self._monitored(metrics)
        self._directory.counters["step"].assign(step)
        return self._directory.save(value)

    def _monitored(self, metrics) -> float | None:
        keep_best = self._directory.retention.keep_best
        if metrics is not None and not isinstance(metrics, Mapping):
            raise errors.InvalidArgumentError(
                "metrics must be a dict of name -> number, e.g. {'val_loss': 0.25}. "
                f"Received: a {type(metrics).__name__}. Nothing was saved. Fix: pass "
                "metrics={'name': value}, or no metrics.")
        if metrics is None or self.monitor not in metrics:
            if keep_best:
                received = ("metrics=None" if metrics is None
                            else f"metrics keys {sorted(map(str, metrics))}")
                raise errors.InvalidArgumentError(
                    f"save() needs metrics[{self.monitor!r}]: keep_best={keep_best} ranks "
                    f"checkpoints by it. Received: {received}. Nothing was saved. "
                    f"Fix: pass metrics={{{self.monitor!r}: value}}, or give the manager "
                    "monitor= one of the keys you pass.")
            return None
        value = metrics[self.monitor]
        if hasattr(value, "numpy"):
            value = value.numpy()
        array = np.asarray(value) if not isinstance(value, (bool, np.bool_)) else None
        if array is None or array.shape != () or array.dtype.kind not in "iuf":
            raise errors.InvalidArgumentError(
                f"metrics[{self.monitor!r}] must be one real number (a float, or a scalar "
                f"tensor or array). Received: {value!r}. Nothing was saved. Fix: pass a scalar, "
                f"e.g. metrics={{{self.monitor!r}: float(value)}}.")
        return float(array)

    def restore_latest(self) -> int | None:
        """Restores obj from the newest committed checkpoint, all or nothing.

        Returns:
          The step saved with it, or None when the directory holds no checkpoint
          (obj is left as it is: a fresh start).

        Raises:
          UnbuiltModelError: obj is a Keras model that is not built yet.
          as `objckpt.restore`: the checkpoint does not fit obj; nothing is changed.
        """
        self._directory.wait()
        kept = self._directory.kept
        if not kept:
            return None
        counters = self._directory.restore(kept[-1], "CheckpointManager",
                                           "before restore_latest()")
        if self.verbose:
            print(f"CheckpointManager: resumed from {kept[-1].prefix} "
                  f"(step {counters['step']}).", flush=True)
        return counters["step"]

    def wait(self) -> None:
        """Blocks until every pending async write is committed; raises its error."""
        self._directory.wait()

    def close(self) -> None:
        """Waits for pending writes, then releases the directory's lock."""
        self._directory.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CheckpointManager({self.directory!r}, kept={len(self._directory.kept)}, "
                f"latest={self.latest!r})")


def _step(step) -> int:
    """`step` as an int >= 0 (a Python or NumPy int, or a scalar integer tensor)."""
    value = step.numpy() if hasattr(step, "numpy") else step
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 0:
        raise errors.InvalidArgumentError(
            f"step must be an int >= 0 (the training step). Received: step={step!r}. "
            "Nothing was saved. Fix: pass the training step as an int >= 0, e.g. "
            "step=int(step).")
    return number
