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
    _ckptstate,
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
_NAME = _ckptstate.NAME  # files of ckpt-N, by TF's exact names
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
    """One committed checkpoint.

    Attributes:
      number: N of `ckpt-N`.
      prefix: its path prefix.
      metric: its monitored value (NaN: none; never counts as best).
      timestamp: when it was saved (seconds since the epoch), as the state file lists it.
    """

    __slots__ = ("metric", "number", "prefix", "timestamp")

    def __init__(self, number: int, prefix: str, metric: float, timestamp: float = math.nan):
        self.number, self.prefix, self.metric = number, prefix, metric
        self.timestamp = timestamp

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
        self.preserved = math.nan  # TF's last_preserved_timestamp
        self._clock = 0.0  # the newest timestamp given: they never go back
        self.notes: list[str] = []
        self.superseded = 0
        self.failures = 0
        self._fingerprint = fingerprint
        self._layout = None  # (fingerprint, tree, keys, graph bytes)
        self._next = 1
        self._read_only = None  # the CheckpointWriteError of an unwritable directory
        self._lock = _dirlock.DirectoryLock(self.directory)
        self._writer = (_asyncwrite.Writer(self._write, self._superseded) if async_save
                        else None)

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
        """
        self._read_only = None
        try:
            self._lock.acquire()
        except errors.CheckpointWriteError as err:
            if self.on_error == "raise":
                raise
            self._read_only = err
            self._warn(f"{err} Training goes on without saving (on_error='warn').")
        try:
            return self._open()
        except BaseException:
            self.release()
            raise

    def _open(self) -> Kept | None:
        names = _files.listdir(self.directory)
        on_disk = {int(m.group(1)) for m in map(_NAME.fullmatch, names) if m}
        listed, note = _ckptstate.listed(self.directory, bool(on_disk))
        if note:
            self._warn(note)
        numbers = sorted(on_disk.union(listed or ()))
        problems = {n: _files.check_intact(self._prefix(n)) for n in numbers}
        intact = [n for n in numbers if problems[n] is None]
        damaged = [f"`{self._prefix(n)}`: {problems[n]}" for n in listed or () if problems[n]]
        use = [n for n in listed or () if problems[n] is None]
        if not use:  # no usable state file, or it names nothing intact: what is on disk
            listed, use = None, intact
        if not use:
            self._refuse_fresh_start(names)
        if damaged:
            self._warn(
                f"Checkpoint directory `{self.directory}`: skipped {len(damaged)} "
                "checkpoint(s) named by the state file that are not intact:\n  "
                + "\n  ".join(damaged) + "\n" + (
                    f"Resuming from the newest intact one, `{self._prefix(use[-1])}`."
                    if listed else "The state file names no intact checkpoint; resuming from "
                    f"the newest of the {len(use)} intact one(s) found on disk, "
                    f"`{self._prefix(use[-1])}`." if use
                    else "No intact checkpoint is left: training starts fresh."))
        newest = max(use, default=0)
        times, self.preserved = _ckptstate.timestamps(self.directory, use)
        self._clock = max(times.values(), default=0.0)
        kept = [Kept(n, self._prefix(n), self._read_metric(self._prefix(n))
                     if self.keep_best else math.nan, times[n]) for n in use]
        superseded = [n for n in intact if n not in use and n < newest]
        uncommitted = [n for n in intact if n not in use and n > newest]
        if uncommitted:
            self._warn(
                f"Checkpoint directory `{self.directory}`: "
                + ", ".join(f"`{self._prefix(n)}`" for n in uncommitted) + " is intact but "
                "not listed by the state file (a save interrupted before its commit, or a copy "
                f"from elsewhere). Resuming from `{self._prefix(newest)}`, the newest listed; "
                "the unlisted checkpoint is left in place and is removed only once a newer "
                "checkpoint has been committed here.")
        self.kept = kept
        self._next = max(numbers, default=0) + 1  # never reuse a number
        if self._read_only is None:
            try:
                self._tidy(names, [n for n in numbers if problems[n] is not None] + superseded,
                           rewrite=bool(kept) and listed != use)
            except OSError as err:
                self._failed(errors.CheckpointWriteError(
                    f"Cannot tidy checkpoint directory `{self.directory}`: "
                    f"{_render.first_line(err)}. Nothing of what it holds was lost; the newest "
                    f"checkpoint is {self._latest_name()}. Fix: check the directory's "
                    "permissions; pass on_error='warn' to train on regardless."))
        return kept[-1] if kept else None

    def _tidy(self, names: list[str], delete: list[int], rewrite: bool) -> None:
        """Removes our writers' temporary files and the files of checkpoints `delete`, and
        rewrites the state file when `rewrite`."""
        for name in names:
            if _DEBRIS.match(name):
                _files.remove(os.path.join(self.directory, name))
        for number in delete:  # not intact, or superseded
            self._delete_files(number, hook=False)
        if rewrite:
            self._write_state()

    def _refuse_fresh_start(self, names: list[str]) -> None:
        """Raises CheckpointDirectoryError when intact checkpoints of other names are here."""
        candidates = sorted(n[: -len(".index")] for n in names
                            if n.endswith(".index") and not (n.startswith(".") and ".tmp-" in n))
        found = [p for p in (os.path.join(self.directory, c) for c in candidates)
                 if _files.check_intact(p) is None]
        if not found:
            return
        shown = _render.listed([f"`{_render.safe(p)}`" for p in found], limit=10)
        raise errors.CheckpointDirectoryError(
            f"Checkpoint directory `{self.directory}` holds {len(found)} intact checkpoint(s) "
            "that Checkpointing did not write (it writes and resumes from `ckpt-N` listed in "
            f"the `{STATE_FILE}` state file):\n" + "\n".join(shown) + "\nExpected none, or "
            "checkpoints of its own to resume from; refusing to start training fresh beside "
            "them. Nothing was changed. Fix: to start over, pass another directory or move "
            "those checkpoints away; to continue from one of them, restore it first "
            "(objckpt.restore(model, prefix)) and give Checkpointing another directory.",
            directory=self.directory, found=tuple(found))

    def _number(self, name: str) -> int | None:
        """N when `name` (from the state file) is `ckpt-N` of this directory, else None."""
        return _ckptstate.number(self.directory, name)

    def _read_metric(self, prefix: str) -> float:
        try:
            value = tf.train.load_checkpoint(prefix).get_tensor(
                METRIC + _paths.ATTRIBUTES + _paths.VARIABLE_VALUE)
            return float(value)
        except Exception:  # written by something else: no metric, never "best"
            return math.nan

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
        obj = self.root.model
        if _compat.is_unbuilt(obj):
            raise errors.UnbuiltModelError(
                f"{who}: cannot resume from `{kept.prefix}` into {type(obj).__name__} because "
                f"it is not built yet. Expected a built model {when}. Fix: build it first "
                "(call it on a batch, or model.build(input_shape)).")
        optimizer = getattr(obj, "optimizer", None)
        variables = getattr(obj, "trainable_variables", None)  # a Keras model's own optimizer
        if variables is not None and callable(getattr(optimizer, "apply_gradients", None)):
            _compat.build_optimizer(optimizer, variables)
        _snapshot.restore(self.root, kept.prefix)
        return {name: int(v.numpy()) for name, v in self.counters.items()}

    # --- saving -------------------------------------------------------------------

    def save(self, metric: float | None = None) -> str | None:
        """Writes the current values as the next checkpoint; returns its prefix.

        With `async_save`, only the in-memory copy (a Snapshot: no bytes
        copied) happens here; a background thread writes and commits it. A
        newer save supersedes one still waiting to start.
        """
        if self._read_only is not None:
            self._failed(self._read_only)
            return None
        if not self._lock.held:
            raise errors.DirectoryLockedError(
                f"Cannot save to `{self.directory}`: this writer no longer holds the directory's "
                "lock (a newer Checkpointing or CheckpointManager in this process took it over, "
                "it was closed, or open() was not called). Nothing was written. Fix: use one "
                "writer per directory, and save before closing it.",
                directory=self.directory)
        self.metric.assign(math.nan if metric is None else float(metric))
        layout = self._current_layout()
        values = layout[1].fused.read_all()
        number, self._next = self._next, self._next + 1
        metric = float(self.metric.numpy())
        self._clock = stamp = max(time.time(), self._clock)  # the time of these values
        if self._writer is not None:
            self._check_writer()
            self._writer.submit((number, metric, stamp, layout, values))
            return self._prefix(number)
        try:
            self._write(number, metric, stamp, layout, values)
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

    def _write(self, number: int, metric: float, stamp: float, layout, values) -> None:
        prefix = self._prefix(number)
        committed = False
        try:
            _files.write_tensors(prefix, layout[2], [*values, layout[3]], stage=_stage)
            previous = list(self.kept)
            self.kept = [*previous, Kept(number, prefix, metric, stamp)]
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
        """Lists the kept checkpoints, each with its own timestamp (as TF's CheckpointManager)."""
        if math.isnan(self.preserved):  # never opened (a test's direct save): now
            self.preserved = time.time()
        _files.write_state(self.directory, [os.path.basename(k.prefix) for k in self.kept],
                           [k.timestamp for k in self.kept], self.preserved)

    def _delete_files(self, number: int, hook: bool) -> None:
        prefix = self._prefix(number)
        _files.remove(prefix + ".index")  # first: without its index, no one reads the rest
        if hook:
            _stage("delete")
        for path, _, _ in _files.data_shards(prefix):  # by TF's exact names: no stray file
            _files.remove(path)

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
