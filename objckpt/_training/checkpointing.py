"""A crash-safe directory of checkpoints: commit protocol, retention, resume, async writes.

`CheckpointDirectory` composes one part per job: a `_retention.RetentionPolicy` (which
checkpoints stay), the `CommitProtocol` (the lock; write, commit, delete, recover after a
crash; the state file itself is `_ckptstate`'s), an `_asyncwrite.Writer` (async_save) and,
with several workers, the `MultiWorker` protocol (the chief writes, the others follow).

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

import contextlib
import math
import os
import re
import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._bundle import index as _bundle_index
from objckpt._bundle import lock as _dirlock
from objckpt._bundle import objgraph as _objgraph
from objckpt._bundle import remote as _remote
from objckpt._bundle import state as _ckptstate
from objckpt._ops import snapshot as _snapshot
from objckpt._planning import checks as _checks
from objckpt._planning import tree as _tree
from objckpt._training import asyncwrite as _asyncwrite
from objckpt._training import retention as _retention

__all__ = ["CheckpointDirectory", "Cluster", "CommitProtocol", "Kept", "MultiWorker",
           "Recovered"]

STATE_FILE = _ckptstate.STATE_FILE
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


Kept = _retention.Kept  # one committed checkpoint (number, prefix, metric, timestamp, step)


# The errors one worker learns another raised (by code; 0: none), and the type it raises then.
_CODES = (None, errors.DirectoryLockedError, errors.CheckpointWriteError,
          errors.CheckpointDirectoryError, errors.StructureMismatchError,
          errors.CheckpointCorruptError, errors.UnbuiltModelError)
_OTHER = len(_CODES)  # any other exception


def error_code(err: BaseException | None) -> int:
    """The code `Cluster.gather` carries for `err` (0 for None)."""
    if err is None:
        return 0
    for code, kind in enumerate(_CODES[1:], 1):
        if isinstance(err, kind):
            return code
    return _OTHER


class Cluster:
    """This process among the workers of a multi-worker strategy, and their agreements.

    Built by `Cluster.of(variables)`: None unless the variables' strategy runs on more than
    one worker (`MultiWorkerMirroredStrategy` with a cluster in TF_CONFIG). Every worker
    must call `gather` at the same points in the same order (it is a collective).

    Attributes:
      strategy: the strategy.
      chief: whether this worker writes checkpoints (TF's `should_checkpoint`).
      index: this worker's position among `workers` (the chief's task first).
      workers: how many workers train.
      name: this worker's task, e.g. "worker 1".
      chief_index: the chief's position.
    """

    def __init__(self, strategy, chief: bool, index: int, workers: int, name: str,
                 chief_index: int):
        self.strategy, self.chief, self.index, self.workers = strategy, chief, index, workers
        self.name, self.chief_index = name, chief_index

    @classmethod
    def of(cls, variables) -> Cluster | None:
        """The cluster the strategy of `variables` (else the strategy in scope) trains on,
        or None when it is a single process (no strategy, MirroredStrategy, one worker)."""
        variables = list(variables)
        strategy = _compat.variables_strategy(variables)
        resolver = getattr(strategy, "cluster_resolver", None)
        if resolver is None:
            return None
        spec = resolver.cluster_spec().as_dict()
        chiefs, workers = len(spec.get("chief", ())), len(spec.get("worker", ()))
        if chiefs + workers <= 1 or resolver.task_type not in ("chief", "worker"):
            return None
        task_id = int(resolver.task_id or 0)
        index = task_id if resolver.task_type == "chief" else chiefs + task_id
        return cls(strategy, _compat.writes_checkpoints(variables), index, chiefs + workers,
                   f"{resolver.task_type} {task_id}", 0)

    def gather(self, row) -> list[list[float]]:
        """Every worker's `row` (numbers, the same length on every worker), in worker order.

        One all-reduce of a small float64 matrix in which each worker fills its own row (a
        sum with zeros is exact: integers below 2**53 and every float come back unchanged).
        """
        matrix = np.zeros((self.workers, len(row)), np.float64)
        matrix[self.index] = row
        calls = [0]

        def value(context):  # this worker's first replica contributes, the others add zeros
            calls[0] += 1
            return tf.constant(matrix if calls[0] == 1 else np.zeros_like(matrix))

        strategy = self.strategy
        total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                                strategy.experimental_distribute_values_from_function(value),
                                axis=None)
        return np.asarray(total).tolist()

    def chief_row(self, row) -> list[float]:
        """The chief's `row`, on every worker (`row` is ignored elsewhere)."""
        return self.gather(row if self.chief else [0] * len(row))[self.chief_index]

    def failed(self, err: BaseException | None) -> dict[int, int]:
        """{worker index: error code} of the workers that failed (this one too, when `err`)."""
        codes = self.gather([error_code(err)])
        return {i: int(row[0]) for i, row in enumerate(codes) if row[0]}

    def raise_for(self, failed: dict[int, int], err: BaseException | None, what: str,
                  directory: str, prefix: str = "") -> None:
        """Raises `err` when this worker failed, else (when another did) an error of the type
        the first failed worker raised, saying which worker failed `what`."""
        if err is not None:
            raise err
        if not failed:
            return
        index, code = min(failed.items())
        known = code < len(_CODES)
        kind = _CODES[code] if known else errors.CheckpointDirectoryError
        who = "the chief" if index == self.chief_index else "another worker"
        message = (
            f"Checkpoint directory `{directory}`: {who} (worker #{index} of {self.workers}) "
            f"failed {what} with {kind.__name__ if known else 'an unexpected error'} (its log "
            f"has the details), so this worker ({self.name}) stops too instead of waiting for "
            "it. Fix: see that worker's error; every worker of a MultiWorkerMirroredStrategy "
            "must see the same checkpoint directory (one file system all of them mount).")
        if kind in (errors.DirectoryLockedError, errors.CheckpointDirectoryError):
            raise kind(message, directory=directory)
        if kind is errors.CheckpointWriteError:
            raise kind(message, prefix)
        if kind is errors.StructureMismatchError:
            raise kind(message, ())
        raise kind(message)


class Recovered(NamedTuple):
    """What `CommitProtocol.recover` found in a directory it opens.

    Attributes:
      kept: the checkpoints to resume with (oldest first; the last is resumed from).
      next: the number of the next checkpoint (never one in use on disk).
      names: the directory's file names (for `tidy`).
      delete: numbers of checkpoints not intact, or superseded (for `tidy`).
      rewrite: whether the state file must be rewritten to list `kept`.
    """

    kept: list[Kept]
    next: int
    names: list[str]
    delete: list[int]
    rewrite: bool


class CommitProtocol:
    """The files of one directory of `ckpt-N`: its lock, how a checkpoint is written and
    committed (steps 1-4 of the module's docstring), deleted, and recovered after a crash.

    It decides nothing about which checkpoints to keep (a `RetentionPolicy` does) and knows
    nothing of workers: one writer, the holder of the lock, calls it.

    Attributes:
      directory: the absolute path.
      durable: fsync each checkpoint before it is committed (None: the library default).
      lock: the directory's `DirectoryLock`.
      preserved: TF's `last_preserved_timestamp`, as the state file says.
    """

    def __init__(self, directory: str, durable: bool | None = None):
        self.directory, self.durable = directory, durable
        self.lock = _dirlock.lock_for(directory)
        self.preserved = math.nan

    def prefix(self, number: int) -> str:
        """The prefix of `ckpt-<number>` in this directory."""
        return os.path.join(self.directory, f"ckpt-{number}")

    def number(self, name: str) -> int | None:
        """N when `name` (from the state file) is `ckpt-N` of this directory, else None."""
        return _ckptstate.number(self.directory, name)

    def check_lock(self) -> None:
        """Raises DirectoryLockedError unless this writer holds the directory's lock."""
        if not self.lock.held:
            raise errors.DirectoryLockedError(
                f"Cannot save to `{self.directory}`: this writer no longer holds the directory's "
                "lock (a newer Checkpointing or CheckpointManager in this process took it over, "
                "it was closed, or open() was not called). Nothing was written. Fix: use one "
                "writer per directory, and save before closing it.",
                directory=self.directory)

    # --- writing and committing ---------------------------------------------------------

    def write(self, number: int, layout, values, workers: int | None = None) -> None:
        """Steps 1-2: writes ckpt-N's tensors under temporary names, then renames them into
        place (the index last). Not committed yet: see `commit`.

        A remote lock's lease is renewed first: a writer whose lease ended and whose
        directory another writer took over raises DirectoryLockedError here, before it
        writes over (or deletes) any object of the other writer's."""
        self.lock.refresh()
        _files.write_tensors(self.prefix(number), layout[2], [*values, layout[3]],
                             stage=_stage, durable=self.durable, workers=workers)

    def commit(self, kept: list[Kept]) -> None:
        """Step 3, the commit point: rewrites the state file atomically to list `kept`
        (oldest first, the newest last), each with its own timestamp (as TF's
        CheckpointManager)."""
        if math.isnan(self.preserved):  # never opened (a test's direct save): now
            self.preserved = time.time()
        from objckpt._bundle import fastio as _fastio

        durable = _fastio.DURABLE_DEFAULT if self.durable is None else self.durable
        self.lock.refresh()  # remote: renews the lease; raises if another writer took it
        _ckptstate.write_state(self.directory, [os.path.basename(k.prefix) for k in kept],
                               [k.timestamp for k in kept], self.preserved, durable=durable)

    def delete(self, number: int, hook: bool = False) -> None:
        """Step 4: removes ckpt-N's files, the index first (`hook`: the "delete" stage)."""
        prefix = self.prefix(number)
        _files.remove(prefix + ".index")  # first: without its index, no one reads the rest
        if hook:
            _stage("delete")
        for path, _, _ in _files.data_shards(prefix):  # by TF's exact names: no stray file
            _files.remove(path)

    # --- recovering after a crash -------------------------------------------------------

    def kept_of(self, numbers: list[int], reads_metrics: bool) -> list[Kept]:
        """The intact checkpoints `numbers` as `Kept`, with their timestamps from the state
        file (which also sets `preserved`) and, when `reads_metrics`, their metric."""
        times, self.preserved = _ckptstate.timestamps(self.directory, numbers)
        return [Kept(n, self.prefix(n), _read_metric(self.prefix(n)) if reads_metrics
                     else math.nan, times[n]) for n in numbers]

    def recover(self, reads_metrics: bool, warn) -> Recovered:
        """Which checkpoints the directory holds after whatever happened to it (see
        `CheckpointDirectory.open`); problems are passed to `warn(message)`. Changes
        nothing on disk (see `tidy`).

        Raises:
          CheckpointDirectoryError: intact checkpoints of other names and none of ours.
        """
        names = _files.listdir(self.directory)
        on_disk = {int(m.group(1)) for m in map(_NAME.fullmatch, names) if m}
        listed, note = _ckptstate.listed(self.directory, bool(on_disk))
        if note:
            warn(note)
        numbers = sorted(on_disk.union(listed or ()))
        problems = {n: _files.check_intact(self.prefix(n)) for n in numbers}
        intact = [n for n in numbers if problems[n] is None]
        damaged = [f"`{self.prefix(n)}`: {problems[n]}" for n in listed or () if problems[n]]
        use = [n for n in listed or () if problems[n] is None]
        if not use:  # no usable state file, or it names nothing intact: what is on disk
            listed, use = None, intact
        if not use:
            self.refuse_fresh_start(names)
        if damaged:
            warn(
                f"Checkpoint directory `{self.directory}`: skipped {len(damaged)} "
                "checkpoint(s) named by the state file that are not intact:\n  "
                + "\n  ".join(damaged) + "\n" + (
                    f"Resuming from the newest intact one, `{self.prefix(use[-1])}`."
                    if listed else "The state file names no intact checkpoint; resuming from "
                    f"the newest of the {len(use)} intact one(s) found on disk, "
                    f"`{self.prefix(use[-1])}`." if use
                    else "No intact checkpoint is left: training starts fresh."))
        newest = max(use, default=0)
        kept = self.kept_of(use, reads_metrics)
        superseded = [n for n in intact if n not in use and n < newest]
        uncommitted = [n for n in intact if n not in use and n > newest]
        if uncommitted:
            warn(
                f"Checkpoint directory `{self.directory}`: "
                + ", ".join(f"`{self.prefix(n)}`" for n in uncommitted) + " is intact but "
                "not listed by the state file (a save interrupted before its commit, or a copy "
                f"from elsewhere). Resuming from `{self.prefix(newest)}`, the newest listed; "
                "the unlisted checkpoint is left in place and is removed only once a newer "
                "checkpoint has been committed here.")
        return Recovered(kept, max(numbers, default=0) + 1,  # never reuse a number
                         names, [n for n in numbers if problems[n] is not None] + superseded,
                         bool(kept) and listed != use)

    def tidy(self, recovered: Recovered) -> None:
        """Removes our writers' temporary files and the files of the checkpoints `recover`
        found damaged or superseded, and rewrites the state file when it must."""
        for name in recovered.names:
            if _DEBRIS.match(name):
                _files.remove(os.path.join(self.directory, name))
        for number in recovered.delete:  # not intact, or superseded
            self.delete(number)
        if recovered.rewrite:
            self.commit(recovered.kept)

    def refuse_fresh_start(self, names: list[str]) -> None:
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


# The dtypes of the scalars read back (TF's DataType numbers): float, double, int32, int64.
_SCALARS = {1: "<f4", 2: "<f8", 3: "<i4", 9: "<i8"}


def _read_scalar(prefix: str, name: str):
    """The scalar `name` saved in a checkpoint, read TF-free through its validated index and
    checksummed bytes (a local or remote prefix: only the index and those bytes are read);
    None when it has none or it cannot be read."""
    try:
        index = _bundle_index.read_index(prefix)
        entry = index.entries.get(name + _paths.ATTRIBUTES + _paths.VARIABLE_VALUE)
        if entry is None or entry.shape != () or entry.dtype not in _SCALARS:
            return None
        return np.frombuffer(_objgraph.read_bytes(index, name + _paths.ATTRIBUTES
                                                  + _paths.VARIABLE_VALUE),
                             _SCALARS[entry.dtype])[0].item()
    except Exception:  # written by something else, or damaged: no value
        return None


def _read_metric(prefix: str) -> float:
    """The monitored value saved in a checkpoint (NaN: none)."""
    value = _read_scalar(prefix, METRIC)
    return math.nan if value is None else float(value)  # none: never "best"


def _read_counter(prefix: str, name: str = "step") -> int | None:
    """A counter (`epoch`, `step`, `batch`) saved in a checkpoint (None: none)."""
    value = _read_scalar(prefix, name)
    return None if value is None else int(value)  # none: never kept for it


class MultiWorker:
    """A `CheckpointDirectory`'s part in the multi-worker protocol (see the module's
    docstring): every worker calls `open`, `restore`, `save` and `wait` at the same points;
    the chief writes and commits through its directory and tells the others whether it
    could; a follower (any other worker) writes nothing, and keeps the list of checkpoints
    as the chief keeps it. It adds the agreements around its owner's one-process steps
    (`_open_alone`, `_take`, `_commit`), which it calls.

    Attributes:
      owner: the CheckpointDirectory.
      cluster: the workers (`Cluster`).
      following: open, on a worker that is not the chief.
    """

    def __init__(self, owner: CheckpointDirectory, cluster: Cluster):
        self.owner, self.cluster, self.following = owner, cluster, False

    def open(self) -> Kept | None:
        """`CheckpointDirectory.open` with several workers: the chief opens, says which
        checkpoint it resumes from, and learns whether every other worker can read it."""
        owner, cluster = self.owner, self.cluster
        if not cluster.chief:
            return self._open_as_follower()
        newest = err = None
        try:
            newest = owner._open_alone()
        except BaseException as caught:  # the others learn of it below, then all raise
            err = caught
        cluster.chief_row([error_code(err), newest.number if newest else 0, owner._next])
        if err is not None:
            raise err
        failed = cluster.failed(None)  # whether the others can read the chief's choice
        if failed:
            owner.release()
            cluster.raise_for(failed, None, "to read the checkpoint the chief resumes from",
                              owner.directory)
        return newest

    def _open_as_follower(self) -> Kept | None:
        """open() on a worker that is not the chief: no lock, nothing changed on disk."""
        cluster = self.cluster
        code, number, following = (int(x) for x in cluster.chief_row([0, 0, 0]))
        if code:
            cluster.raise_for({cluster.chief_index: code}, None, "to open it",
                              self.owner.directory)
        err = newest = None
        try:
            newest = self._follow(number, following)
        except Exception as caught:  # the others learn of it below, then all raise
            err = caught
        failed = cluster.failed(err)
        cluster.raise_for(failed, err, "to read the checkpoint the chief resumes from",
                          self.owner.directory)
        self.following = True
        return newest

    def _follow(self, number: int, following: int) -> Kept | None:
        """The checkpoints kept as the chief left them after its open(), read from the state
        file; `number` (0: none) is the one the chief resumes from and must be intact here."""
        owner, commits = self.owner, self.owner.commits
        owner._next = following
        owner._resumed([])
        if not number:
            return None
        problem = _files.check_intact(commits.prefix(number))
        if problem is not None:
            raise errors.CheckpointDirectoryError(
                f"Checkpoint directory `{owner.directory}`: the chief resumes from "
                f"`{commits.prefix(number)}`, which this worker ({self.cluster.name}) cannot "
                f"read: {problem}. Expected every worker to see the chief's checkpoints (TF's "
                "convention for multi-worker checkpoints: one directory on a file system all "
                "workers mount). Nothing was changed. Fix: put the directory on a shared file "
                "system (NFS, a network disk) and pass the same path on every worker.",
                directory=owner.directory, found=())
        listed, _ = _ckptstate.listed(owner.directory, True)
        use = sorted({n for n in listed or () if n < number
                      and _files.check_intact(commits.prefix(n)) is None} | {number})
        owner._resumed(commits.kept_of(use, owner.retention.reads_metrics))
        return owner.kept[-1]

    def restore(self, kept: Kept) -> None:
        """Every worker restores; all raise when any one fails."""
        err = None
        try:
            _snapshot.restore(self.owner.root, kept.prefix)
        except Exception as caught:
            err = caught
        self.cluster.raise_for(self.cluster.failed(err), err, f"to restore `{kept.prefix}`",
                               self.owner.directory)

    def save(self, metric: float | None, force: bool = False) -> str | None:
        """`CheckpointDirectory.save` with several workers. Whether a save comes too soon
        is decided on the step (the same on every worker) and, with rules on time, on the
        chief's clock, which every worker then uses."""
        owner, cluster = self.owner, self.cluster
        if cluster.chief:
            if owner._read_only is None:
                owner.commits.check_lock()
        elif not self.following:
            owner.commits.check_lock()  # raises: a follower closed, or never opened
        stamp, skip = owner._when(force)
        if owner.retention.uses_time:
            skip, stamp = cluster.chief_row([float(skip is not None), stamp])
            skip = "the chief skips it" if skip else None
        if skip is not None:
            owner.skipped += 1
            return None
        job = owner._take(metric, stamp)
        prefix = owner.commits.prefix(job[0])
        if not cluster.chief:
            failed = cluster.failed(None)
            if cluster.chief_index in failed:
                if owner.on_error == "raise":
                    cluster.raise_for(failed, None, f"to write `{prefix}`", owner.directory,
                                      prefix)
                return None
            owner._decide(Kept(job[0], prefix, job[1], job[2], job[5]))  # as the chief keeps
            owner._saved(job)
            return prefix
        done, err = (False, owner._read_only) if owner._read_only is not None else (
            owner._commit(job))
        if done:
            owner._saved(job)
        cluster.failed(err)  # the others learn of it
        if err is not None:
            owner._failed(err)
        return prefix if done else None

    def wait(self) -> None:
        """`CheckpointDirectory.wait` with several workers (and async_save): all learn
        whether the chief's writes failed."""
        owner, cluster = self.owner, self.cluster
        err = None
        if cluster.chief:
            owner._writer.wait()
            try:
                owner._writer.raise_pending()
            except errors.CheckpointWriteError as caught:
                err = caught
        failed = cluster.failed(err)
        if err is not None:
            owner._failed(err)
        elif failed and owner.on_error == "raise":
            cluster.raise_for(failed, None, "to write a checkpoint", owner.directory)


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
      directory: a local directory; created if missing.
      obj: the trackable to save and restore.
      max_to_keep: how many of the newest checkpoints to keep (>= 1; None: all).
      keep_best: how many of the best checkpoints by metric to keep as well.
      mode: "min" or "max": which metric value is better.
      keep_every_n_steps, keep_every_n_hours, keep, checkpoint_interval,
        min_interval_seconds: the other rules of the `RetentionPolicy` (`retention`).
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

    def __init__(self, directory, obj, *, max_to_keep=5, keep_best=0, mode="min",
                 async_save=False, on_error="raise", fingerprint=None, durable=None,
                 keep_every_n_steps=None, keep_every_n_hours=None, keep=None,
                 checkpoint_interval=None, min_interval_seconds=None, extras=None):
        directory = os.fspath(directory)
        self.directory = (directory.rstrip("/") if _remote.is_remote(directory)
                          else os.path.abspath(directory))
        self.retention = _retention.RetentionPolicy(
            max_to_keep, keep_best, mode, keep_every_n_steps=keep_every_n_steps,
            keep_every_n_hours=keep_every_n_hours, keep=keep,
            checkpoint_interval=checkpoint_interval, min_interval_seconds=min_interval_seconds)
        self.commits = CommitProtocol(self.directory, durable)
        self.on_error = on_error
        self.counters = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                         for name in COUNTERS}
        self.metric = tf.Variable(math.nan, dtype=tf.float64, trainable=False, name=METRIC)
        self.extras = dict(extras or {})
        self.root = tf.train.Checkpoint(model=obj, **self.counters, **{METRIC: self.metric},
                                        **self.extras)
        self.kept: list[Kept] = []
        self.notes: list[str] = []
        self.failures = self.skipped = 0
        self.preserved: frozenset[int] = frozenset()
        self._last: Kept | None = None  # the newest checkpoint saved (for the intervals)
        self._workers: MultiWorker | None = None  # set by open(), when several workers train
        self._clock = 0.0  # the newest timestamp given: they never go back
        self._fingerprint = fingerprint
        self._layout = None  # (fingerprint, tree, keys, graph bytes)
        self._next = 1
        self._read_only = None  # the CheckpointWriteError of an unwritable directory
        self._writer = _asyncwrite.Writer(self._write) if async_save else None

    @property
    def cluster(self) -> Cluster | None:
        """The workers (set by open()), or None in a single process."""
        return self._workers.cluster if self._workers is not None else None

    @property
    def superseded(self) -> int:
        """How many async saves were superseded by a newer one before they started."""
        return self._writer.superseded if self._writer is not None else 0

    def best(self) -> list[Kept]:
        """The kept checkpoints with a metric, best first (ties: the older first)."""
        return self.retention.best(self.kept)

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
        self._read_only = None
        cluster = Cluster.of(_tree.tree(self.root).values())
        self._workers = None if cluster is None else MultiWorker(self, cluster)
        if self._workers is None:
            return self._open_alone()
        return self._workers.open()

    def _open_alone(self) -> Kept | None:
        """open() of the one writer: lock, recover, tidy."""
        try:
            self.commits.lock.acquire()
        except errors.CheckpointWriteError as err:
            if self.on_error == "raise":
                raise
            self._read_only = err
            self._warn(f"{err} Training goes on without saving (on_error='warn').")
        try:
            return self._recover()
        except BaseException:
            self.release()
            raise

    def _recover(self) -> Kept | None:
        found = self.commits.recover(self.retention.reads_metrics, self._warn)
        self._next = found.next
        self._resumed(found.kept)
        if self._read_only is None:
            try:
                self.commits.tidy(found)
            except OSError as err:
                self._failed(errors.CheckpointWriteError(
                    f"Cannot tidy checkpoint directory `{self.directory}`: "
                    f"{_render.first_line(err)}. Nothing of what it holds was lost; the newest "
                    f"checkpoint is {self._latest_name()}. Fix: check the directory's "
                    "permissions; pass on_error='warn' to train on regardless.",
                    source=self.directory))
        return self.kept[-1] if self.kept else None

    def _resumed(self, kept: list[Kept]) -> None:
        """Takes up the checkpoints found on opening: their steps (when a rule needs them),
        the newest as the last saved, TF's `last_preserved_timestamp` (as TF: the time of
        opening in a fresh directory, never later than now) and what it preserved."""
        if self.retention.reads_steps:
            for k in kept:
                k.step = _read_counter(k.prefix)
        self.kept = kept
        self._last = kept[-1] if kept else None
        self._clock = max((k.timestamp for k in kept), default=0.0)
        commits, now = self.commits, _retention.now()
        if not kept or math.isnan(commits.preserved) or commits.preserved > now:
            commits.preserved = now
        self.preserved = self.retention.preserved_after_restart(kept, commits.preserved)

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
            with _checks.creation_scope(_tree.tree(obj).values()):  # slots mirrored too
                _compat.build_optimizer(optimizer, variables)
        if self._workers is None:
            root, rules = self._root_for(kept)
            _snapshot.restore(root, kept.prefix, rules=rules)
        else:
            self._workers.restore(kept)
        return {name: int(v.numpy()) for name, v in self.counters.items()}

    def _root_for(self, kept: Kept) -> tuple:
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
        stamp, skip = self._when(force)
        if skip is not None:
            self.skipped += 1
            return None
        if self._read_only is not None:
            self._failed(self._read_only)
            return None
        self.commits.check_lock()
        job = self._take(metric, stamp)
        done, err = self._commit(job)
        if done:
            self._saved(job)
        if err is not None:
            self._failed(err)
        return self.commits.prefix(job[0]) if done else None

    def _when(self, force: bool) -> tuple[float, str | None]:
        """(the timestamp of a save now, why it comes too soon or None)."""
        stamp = max(_retention.now(), self._clock)  # timestamps never go back
        step = int(self.counters["step"].numpy())
        return stamp, None if force else self.retention.too_soon(step, stamp, self._last)

    def _take(self, metric: float | None, stamp: float) -> tuple:
        """Reads the values to save (a Snapshot: no bytes copied); returns the write job:
        (number, metric, timestamp, layout, values, step). The `keep` predicate is asked
        about it first, so that its error comes here, with nothing written."""
        self.metric.assign(math.nan if metric is None else float(metric))
        step = int(self.counters["step"].numpy())
        number = self._next
        metric = float(self.metric.numpy())
        kept = Kept(number, self.commits.prefix(number), metric, stamp, step)
        self.retention.asks(kept)
        layout = self._current_layout()
        values = layout[1].fused.read_all()
        self._next = number + 1
        self._clock = stamp  # the time of these values
        return number, metric, stamp, layout, values, step

    def _saved(self, job: tuple) -> None:
        """Notes `job` (written, or handed to the async writer) as the last save."""
        self._last = Kept(job[0], self.commits.prefix(job[0]), job[1], job[2], job[5])

    def _commit(self, job: tuple) -> tuple[bool, errors.CheckpointWriteError | None]:
        """Writes and commits `job` (with async_save: hands it to the writer); returns
        (whether it was written or handed over, the CheckpointWriteError of this write or,
        with async_save, of an earlier one). With on_error="raise" a job is not handed over
        behind an earlier failure."""
        if self._writer is None:
            try:
                self._write(*job)
            except errors.CheckpointWriteError as err:
                return False, err
            return True, None
        try:
            self._writer.raise_pending()
            err = None
        except errors.CheckpointWriteError as caught:
            err = caught
        if err is not None and self.on_error == "raise":
            return False, err
        self._writer.submit(job)
        return True, err

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
                    "Fix: build it (call it on a batch) before saving.",
                    source=self.directory)
            names = [_compat.variable_name(v) for v in variables.values()]
            graph = _tree.build_object_graph(list(variables), names, variables.graph_aliases())
            keys = [_paths.checkpoint_key(p) for p in variables] + [_compat.OBJECT_GRAPH_KEY]
            self._layout = (key, variables, keys, tf.constant(graph.SerializeToString()))
        return self._layout

    def _decide(self, new: Kept) -> tuple[list[Kept], Callable[[], None]]:
        """Asks the retention policy about `self.kept` plus `new`, and takes its decision;
        returns (the checkpoints dropped, a function that undoes the decision)."""
        before = (self.kept, self.commits.preserved, self.preserved)
        decision = self.retention.decide([*self.kept, new], self.commits.preserved,
                                         self.preserved)
        self.kept, self.commits.preserved, self.preserved = (
            decision.kept, decision.last_preserved, decision.preserved)

        def undo() -> None:
            self.kept, self.commits.preserved, self.preserved = before

        return decision.dropped, undo

    def _write(self, number: int, metric: float, stamp: float, layout, values,
               step: int | None = None) -> None:
        """Writes and commits one checkpoint, then deletes those retention drops (in the
        background thread with async_save)."""
        commits = self.commits
        prefix = commits.prefix(number)
        committed = attempted = False
        try:
            # A background write uses one thread: training keeps the other cores.
            commits.write(number, layout, values,
                          workers=1 if self._writer is not None else None)
            dropped, undo = self._decide(Kept(number, prefix, metric, stamp, step))
            try:
                attempted = True
                commits.commit(self.kept)
            except BaseException:
                undo()
                raise
            committed = True
            _stage("state")
        except (OSError, tf.errors.OpError) as err:
            own = err.fix if isinstance(err, errors.ObjckptError) else None
            fix = (own.rstrip(".") if own else
                   "check the network, the credentials and the bucket"
                   if _remote.is_remote(self.directory)
                   else "free disk space or check the directory's permissions")
            raise errors.CheckpointWriteError(
                f"Could not write checkpoint `{prefix}`: {_render.first_line(err)}. The earlier "
                f"checkpoints in `{self.directory}` are untouched and `latest` still names "
                f"{self._latest_name()}. Fix: {fix}; pass on_error='warn' to keep training "
                "when a save fails.", prefix) from err
        finally:
            # Not when another writer took the directory over (ckpt-N may be its own), nor
            # after a remote commit whose outcome is unknown (its state object may list
            # ckpt-N: open() decides); and a store that is gone does not replace the error
            # above with its own (what is left is not listed; the next open() removes it).
            if not committed and commits.lock.held and not (
                    attempted and _ckptstate.outcome_unknown(self.directory)):
                with contextlib.suppress(OSError):
                    commits.delete(number)
        for kept in dropped:
            try:
                commits.delete(kept.number, hook=True)
            except OSError as err:  # committed already; the next open() removes the rest
                self._warn(f"Could not delete the old checkpoint `{kept.prefix}`: "
                           f"{_render.first_line(err)}. It is no longer listed; it will be "
                           "removed when the directory is next opened.")

    # --- life cycle -----------------------------------------------------------------

    def wait(self) -> None:
        """Blocks until every pending async write is committed; raises its error.

        With several workers (and async_save) every worker calls it, and all learn whether
        the chief's writes failed."""
        if self._writer is None:
            return
        if self._workers is not None:
            self._workers.wait()
            return
        self._writer.wait()
        try:
            self._writer.raise_pending()
        except errors.CheckpointWriteError as err:
            self._failed(err)

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

    def _latest_name(self) -> str:
        return f"`{self.kept[-1].prefix}`" if self.kept else "no checkpoint"

    def _warn(self, message: str) -> None:
        self.notes.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
