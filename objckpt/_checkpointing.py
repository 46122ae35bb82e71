"""A crash-safe directory of checkpoints: commit protocol, retention, resume, async writes.

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
checkpoints; whatever it does not name (temporary files, a written but
uncommitted `ckpt-N`, half-deleted old ones) is debris that the next `open()`
removes. Everything written is a standard object-based checkpoint, so
`tf.train.latest_checkpoint(directory)` and `objckpt.restore` find it.
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings

import tensorflow as tf

from objckpt import (
    _asyncwrite,
    _compat,
    _dirlock,
    _files,
    _paths,
    _render,
    _snapshot,
    _tree,
    errors,
)

__all__ = ["CheckpointDirectory", "Kept"]

STATE_FILE = _files.STATE_FILE
_NAME = re.compile(r"^ckpt-(\d+)\.(index|data-\d{5}-of-\d{5})$")
_DEBRIS = re.compile(r"^\.(ckpt-\d+|checkpoint)\.tmp-[0-9a-f]{12}")
COUNTERS = ("epoch", "step", "batch")
METRIC = "monitor_value"

# Tests set this to a callable(stage) to crash or fail at a stage of a save:
# "write" (nothing written yet), "data" (temporary files complete), "index"
# (ckpt-N renamed into place, not yet committed), "state" (committed), "delete"
# (between the deletions of old checkpoints).
fault_hook = None


def _stage(name: str) -> None:
    if fault_hook is not None:
        fault_hook(name)


class Kept:
    """One committed checkpoint: its number, prefix and monitored value (NaN: none)."""

    __slots__ = ("metric", "number", "prefix")

    def __init__(self, number: int, prefix: str, metric: float):
        self.number, self.prefix, self.metric = number, prefix, metric

    def __repr__(self) -> str:
        return f"Kept(ckpt-{self.number}, metric={self.metric})"


class CheckpointDirectory:
    """Saves and resumes one obj in a directory of managed checkpoints.

    The checkpoints hold `tf.train.Checkpoint(model=obj, epoch=, step=, batch=,
    monitor_value=)`: obj's variables (a Keras model's include its optimizer's)
    and int64 counters, plus the float64 value of the monitored metric.

    Args:
      directory: a local directory; created if missing.
      obj: the trackable to save and restore.
      max_to_keep: how many of the newest checkpoints to keep (>= 1).
      keep_best: how many of the best checkpoints by metric to keep as well.
      mode: "min" or "max": which metric value is better.
      async_save: write in a background thread (see `save`).
      on_error: "raise" a `CheckpointWriteError` when a write fails, or "warn"
        and go on; the earlier checkpoints are untouched either way.
      fingerprint: a callable giving a cheap identity of obj's variables, for
        caching obj's tree between saves; None walks obj on every save.
    """

    def __init__(self, directory, obj, *, max_to_keep=5, keep_best=0, mode="min",
                 async_save=False, on_error="raise", fingerprint=None):
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_to_keep, self.keep_best, self.mode = max_to_keep, keep_best, mode
        self.async_save, self.on_error = async_save, on_error
        self.counters = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                         for name in COUNTERS}
        self.metric = tf.Variable(math.nan, dtype=tf.float64, trainable=False, name=METRIC)
        self.root = tf.train.Checkpoint(model=obj, **self.counters, **{METRIC: self.metric})
        self.kept: list[Kept] = []
        self.notes: list[str] = []
        self.superseded = 0
        self.failures = 0
        self._fingerprint = fingerprint
        self._layout = None  # (fingerprint, tree, keys, graph bytes)
        self._next = 1
        self._lock = _dirlock.DirectoryLock(self.directory)
        self._writer = (_asyncwrite.Writer(self._write, self._superseded) if async_save
                        else None)

    # --- opening and resuming ---------------------------------------------------

    def open(self) -> Kept | None:
        """Locks the directory, removes debris and returns the newest intact checkpoint.

        Returns None when the directory holds no checkpoint yet. A state file
        that cannot be read, or a newest checkpoint that is missing or damaged,
        falls back to the newest intact older one, with a warning.

        Raises:
          DirectoryLockedError: another writer uses the directory.
        """
        self._lock.acquire()
        names = _files.listdir(self.directory)
        for name in names:
            if _DEBRIS.match(name):
                _files.remove(os.path.join(self.directory, name))
        on_disk = sorted({int(m.group(1)) for m in map(_NAME.match, names) if m})
        listed, state_ok = self._read_state(on_disk)
        kept, damaged = [], []
        for number in listed:
            prefix = self._prefix(number)
            problem = _files.check_intact(prefix)
            if problem is None:
                metric = self._read_metric(prefix) if self.keep_best else math.nan
                kept.append(Kept(number, prefix, metric))
            else:
                damaged.append(f"`{prefix}`: {problem}")
        if damaged:
            self._warn(f"Checkpoint directory `{self.directory}`: skipped {len(damaged)} "
                       "checkpoint(s) named by the state file that are not intact:\n  "
                       + "\n  ".join(damaged) + "\n" + (
                           f"Resuming from the newest intact one, `{kept[-1].prefix}`."
                           if kept else "No intact checkpoint is left: training starts fresh."))
        self.kept = kept
        for number in on_disk:  # uncommitted, half-deleted or damaged: debris
            if all(k.number != number for k in kept):
                self._delete_files(number, hook=False)
        self._next = max([*on_disk, *listed], default=0) + 1  # never reuse a number
        if kept and (not state_ok or listed != [k.number for k in kept]):
            self._write_state()
        return kept[-1] if kept else None

    def _read_state(self, on_disk: list[int]) -> tuple[list[int], bool]:
        """(numbers the state file lists, oldest first; whether it could be read).

        Without a readable state file, every checkpoint on disk is a candidate
        (with a warning when there are any).
        """
        path = os.path.join(self.directory, STATE_FILE)
        try:
            names = _files.read_state(self.directory)
            numbers = []
            for name in names:
                match = _NAME.match(os.path.basename(name) + ".index")
                if not name or match is None:
                    raise ValueError(f"`{name}` is not a ckpt-N checkpoint of this directory")
                numbers.append(int(match.group(1)))
            return sorted(set(numbers)), True
        except FileNotFoundError:
            if on_disk:
                self._warn(f"Checkpoint directory `{self.directory}` has checkpoint files but no "
                           f"`{STATE_FILE}` state file; using every intact one found on disk.")
            return on_disk, not on_disk
        except Exception as err:  # unreadable state: never a silent fresh start
            self._warn(f"The checkpoint state file `{path}` cannot be read "
                       f"({_render.first_line(err)}); using the intact checkpoints found on disk "
                       f"instead ({len(on_disk)} candidates) and writing a new state file.")
            return on_disk, False

    def _read_metric(self, prefix: str) -> float:
        try:
            value = tf.train.load_checkpoint(prefix).get_tensor(
                METRIC + _paths.ATTRIBUTES + _paths.VARIABLE_VALUE)
            return float(value)
        except Exception:  # written by something else: no metric, never "best"
            return math.nan

    def restore(self, kept: Kept) -> None:
        """Restores obj and the counters from a checkpoint, all or nothing."""
        _snapshot.restore(self.root, kept.prefix)

    # --- saving -------------------------------------------------------------------

    def save(self, metric: float | None = None) -> str | None:
        """Writes the current values as the next checkpoint; returns its prefix.

        With `async_save`, only the in-memory copy (a Snapshot: no bytes
        copied) happens here; a background thread writes and commits it. A
        newer save supersedes one still waiting to start.
        """
        if not self._lock.held:
            raise errors.DirectoryLockedError(
                f"Cannot save to `{self.directory}`: this writer no longer holds the directory's "
                "lock (a newer Checkpointing in this process took it over, or open() was not "
                "called). Nothing was written. Fix: use one Checkpointing per directory.",
                directory=self.directory)
        self.metric.assign(math.nan if metric is None else float(metric))
        layout = self._current_layout()
        values = layout[1].fused.read_all()
        number, self._next = self._next, self._next + 1
        metric = float(self.metric.numpy())
        if self._writer is not None:
            self._check_writer()
            self._writer.submit((number, metric, layout, values))
            return self._prefix(number)
        try:
            self._write(number, metric, layout, values)
        except errors.CheckpointWriteError as err:
            self._failed(err)
            return None
        return self._prefix(number)

    def _check_writer(self) -> None:
        try:
            self._writer.raise_pending()
        except errors.CheckpointWriteError as err:
            self._failed(err)

    def _failed(self, err: errors.CheckpointWriteError) -> None:
        self.failures += 1
        if self.on_error == "raise":
            raise err
        self._warn(f"{err} Training goes on (on_error='warn').")

    def _current_layout(self):
        key = self._fingerprint() if self._fingerprint is not None else None
        if self._layout is None or key is None or self._layout[0] != key:
            variables = _tree.tree(self.root)
            if not variables:
                raise errors.UnbuiltModelError(
                    f"Nothing to save to `{self.directory}`: the model has no variables. "
                    "Build it (call it on a batch) before saving.")
            names = [_compat.variable_name(v) for v in variables.values()]
            graph = _tree.build_object_graph(list(variables), names, variables.graph_aliases())
            keys = [_paths.checkpoint_key(p) for p in variables] + [_compat.OBJECT_GRAPH_KEY]
            self._layout = (key, variables, keys, tf.constant(graph.SerializeToString()))
        return self._layout

    def _write(self, number: int, metric: float, layout, values) -> None:
        prefix = self._prefix(number)
        committed = False
        try:
            _files.write_tensors(prefix, layout[2], [*values, layout[3]], stage=_stage)
            previous = list(self.kept)
            self.kept = [*previous, Kept(number, prefix, metric)]
            dropped = self._retain()
            try:
                self._write_state()
            except BaseException:
                self.kept = previous
                raise
            committed = True
            _stage("state")
        except (OSError, tf.errors.OpError) as err:
            raise errors.CheckpointWriteError(
                f"Could not write checkpoint `{prefix}`: {_render.first_line(err)}. The earlier "
                f"checkpoints in `{self.directory}` are untouched and `latest` still names "
                f"{self._latest_name()}. Fix: free disk space or check the directory's "
                "permissions; pass on_error='warn' to keep training when a save fails.",
                prefix) from err
        finally:
            if not committed:
                self._delete_files(number, hook=False)
        for kept in dropped:
            try:
                self._delete_files(kept.number, hook=True)
            except OSError as err:  # committed already; the next open() removes the rest
                self._warn(f"Could not delete the old checkpoint `{kept.prefix}`: "
                           f"{_render.first_line(err)}. It is no longer listed; it will be "
                           "removed when the directory is next opened.")

    def _retain(self) -> list[Kept]:
        """Drops checkpoints beyond the newest max_to_keep and best keep_best; returns them."""
        keep = {k.number for k in self.kept[-self.max_to_keep:]}
        keep.update(k.number for k in self.best()[:self.keep_best])
        dropped = [k for k in self.kept if k.number not in keep]
        self.kept = [k for k in self.kept if k.number in keep]
        return dropped

    def best(self) -> list[Kept]:
        """The kept checkpoints with a metric, best first (ties: the older first)."""
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted((k for k in self.kept if not math.isnan(k.metric)),
                      key=lambda k: (sign * k.metric, k.number))

    def _write_state(self) -> None:
        _files.write_state(self.directory, [os.path.basename(k.prefix) for k in self.kept],
                           time.time())

    def _delete_files(self, number: int, hook: bool) -> None:
        prefix = self._prefix(number)
        _files.remove(prefix + ".index")  # first: without its index, no one reads the rest
        if hook:
            _stage("delete")
        for name in _files.listdir(self.directory):
            if name.startswith(f"ckpt-{number}.data-"):
                _files.remove(os.path.join(self.directory, name))

    # --- life cycle -----------------------------------------------------------------

    def wait(self) -> None:
        """Blocks until every pending async write is committed; raises its error."""
        if self._writer is not None:
            self._writer.wait()
            self._check_writer()

    def close(self) -> None:
        """Waits for pending writes, then releases the directory's lock."""
        try:
            self.wait()
        finally:
            self.release()

    def _superseded(self) -> None:
        self.superseded += 1

    def release(self) -> None:
        """Releases the directory's lock (without waiting for pending writes)."""
        self._lock.release()

    def _prefix(self, number: int) -> str:
        return os.path.join(self.directory, f"ckpt-{number}")

    def _latest_name(self) -> str:
        return f"`{self.kept[-1].prefix}`" if self.kept else "no checkpoint"

    def _warn(self, message: str) -> None:
        self.notes.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
