"""The files of one directory of `ckpt-N`: how a checkpoint is written, committed, deleted
and recovered after a crash (the commit protocol, steps 1-4 of `checkpointing`'s docstring).

One writer, the holder of the directory's lock, calls it; which checkpoints to keep is a
`RetentionPolicy`'s decision and who writes among several workers the `MultiWorker`
protocol's. The state file itself is `_bundle.state`'s; the checkpoint files `_bundle.files`'.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
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
from objckpt._planning import tree as _tree
from objckpt._training.retention import Kept

__all__ = ["METRIC", "STATE_FILE", "CommitProtocol", "Layout", "Recovered", "read_counter",
           "read_metric"]

STATE_FILE = _ckptstate.STATE_FILE
_NAME = _ckptstate.NAME  # files of ckpt-N, by TF's exact names
_DEBRIS = re.compile(r"^\.(ckpt-\d+|checkpoint)\.tmp-[0-9a-f]{12}")
METRIC = "monitor_value"  # the name of the monitored value saved in each checkpoint


def _no_stage(name: str) -> None:
    """A stage of a save reached (see `CommitProtocol`'s `stage`): nothing to do."""


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
      stage: called with the name of each stage of a save reached ("write", "data",
        "index", "state", "delete"), where tests crash or fail it.
    """

    def __init__(self, directory: str, durable: bool | None = None,
                 stage: Callable[[str], None] = _no_stage):
        self.directory, self.durable, self.stage = directory, durable, stage
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
        # A sharded variable's value (a `ShardedValue`) as TF writes it: a slice per shard.
        keys, tensors, slices = _compat.sliced_entries(layout[2], [*values, layout[3]])
        _files.write_tensors(self.prefix(number), keys, tensors, stage=self.stage,
                             durable=self.durable, workers=workers, slices=slices)

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
            self.stage("delete")
        for path, _, _ in _files.data_shards(prefix):  # by TF's exact names: no stray file
            _files.remove(path)

    def save(self, new: Kept, layout, values, decide, *, latest: Callable[[], str],
             warn: Callable[[str], None], workers: int | None = None) -> None:
        """Steps 1-4 for one checkpoint: writes `new`, commits the checkpoints `decide`
        keeps, then deletes those it drops.

        Args:
          new: the checkpoint to write.
          layout, values: what `write` writes.
          decide: `decide(new)` -> (the checkpoints kept, those dropped, a function that
            undoes the decision: called when the commit fails).
          latest: words the newest checkpoint kept, for the error of a failed write.
          warn: called with the message of an old checkpoint that could not be deleted.
          workers: threads writing (None: the default; 1 for a background write).

        Raises:
          CheckpointWriteError: the write or the commit failed; what it wrote is removed,
            the earlier checkpoints are untouched.
        """
        committed = attempted = False
        try:
            self.write(new.number, layout, values, workers=workers)
            kept, dropped, undo = decide(new)
            try:
                attempted = True
                self.commit(kept)
            except BaseException:
                undo()
                raise
            committed = True
            self.stage("state")
        except (OSError, tf.errors.OpError) as err:
            own = err.fix if isinstance(err, errors.ObjckptError) else None
            fix = (own.rstrip(".") if own else
                   "check the network, the credentials and the bucket"
                   if _remote.is_remote(self.directory)
                   else "free disk space or check the directory's permissions")
            raise errors.CheckpointWriteError(
                f"Could not write checkpoint `{new.prefix}`: {_render.first_line(err)}. The "
                f"earlier checkpoints in `{self.directory}` are untouched and `latest` still "
                f"names {latest()}. Fix: {fix}; pass on_error='warn' to keep training "
                "when a save fails.", new.prefix) from err
        finally:
            # Not when another writer took the directory over (ckpt-N may be its own), nor
            # after a remote commit whose outcome is unknown (its state object may list
            # ckpt-N: open() decides); and a store that is gone does not replace the error
            # above with its own (what is left is not listed; the next open() removes it).
            if not committed and self.lock.held and not (
                    attempted and _ckptstate.outcome_unknown(self.directory)):
                with contextlib.suppress(OSError):
                    self.delete(new.number)
        for old in dropped:
            try:
                self.delete(old.number, hook=True)
            except OSError as err:  # committed already; the next open() removes the rest
                warn(f"Could not delete the old checkpoint `{old.prefix}`: "
                     f"{_render.first_line(err)}. It is no longer listed; it will be "
                     "removed when the directory is next opened.")

    # --- recovering after a crash -------------------------------------------------------

    def kept_of(self, numbers: list[int], reads_metrics: bool) -> list[Kept]:
        """The intact checkpoints `numbers` as `Kept`, with their timestamps from the state
        file (which also sets `preserved`) and, when `reads_metrics`, their metric."""
        times, self.preserved = _ckptstate.timestamps(self.directory, numbers)
        return [Kept(n, self.prefix(n), read_metric(self.prefix(n)) if reads_metrics
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


def read_metric(prefix: str) -> float:
    """The monitored value saved in a checkpoint (NaN: none)."""
    value = _read_scalar(prefix, METRIC)
    return math.nan if value is None else float(value)  # none: never "best"


def read_counter(prefix: str, name: str = "step") -> int | None:
    """A counter (`epoch`, `step`, `batch`) saved in a checkpoint (None: none)."""
    value = _read_scalar(prefix, name)
    return None if value is None else int(value)  # none: never kept for it


class Layout:
    """What a save writes of `root` (its variables, their checkpoint keys and the object
    graph), cached while `fingerprint()` gives the same identity (None: walked every save)."""

    def __init__(self, root, directory: str, fingerprint=None):
        self.root, self.directory, self.fingerprint = root, directory, fingerprint
        self.cached = None  # (fingerprint, tree, keys, graph bytes)

    def current(self) -> tuple:
        """(fingerprint, tree, keys, graph bytes) of root now.

        Raises:
          UnbuiltModelError: root holds no variables.
        """
        key = self.fingerprint() if self.fingerprint is not None else None
        if self.cached is None or key is None or self.cached[0] != key:
            variables = _tree.tree(self.root)
            if not variables:
                raise errors.UnbuiltModelError(
                    f"Nothing to save to `{self.directory}`: the model has no variables. "
                    "Fix: build it (call it on a batch) before saving.",
                    source=self.directory)
            names = [_compat.variable_name(v) for v in variables.values()]
            graph = _tree.build_object_graph(list(variables), names, variables.graph_aliases())
            keys = [_paths.checkpoint_key(p) for p in variables] + [_compat.OBJECT_GRAPH_KEY]
            self.cached = (key, variables, keys, tf.constant(graph.SerializeToString()))
        return self.cached

