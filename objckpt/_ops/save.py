"""Saving: a standard TF object-based checkpoint with obj as its root, in the foreground
or on a background thread (`SaveHandle`)."""

from __future__ import annotations

import concurrent.futures
import os
import threading

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._ops import snapshot as _snapshot
from objckpt._planning import checks as _checks
from objckpt._planning import tree as _tree

__all__ = ["SaveHandle", "save"]


@tf.autograph.experimental.do_not_convert
@errors.about_arguments(source="prefix", obj="obj_or_snapshot")
def save(obj_or_snapshot, prefix: str | os.PathLike, *, blocking: bool = True,
         durable: bool | None = None):
    """Writes a standard TF object-based checkpoint with obj as its root.

    `tf.train.Checkpoint(root=same_structure).read(prefix)` loads it, and so
    does `objckpt.restore`. Saving a Snapshot gives the same layout as saving
    the obj it was taken from. The write is atomic: files are written under a
    temporary name and renamed, the index last, so a crash never leaves a
    half-written checkpoint under `prefix`: an existing checkpoint there stays
    readable while the new one is written; a crash during the final renames
    leaves the old one, none, or the new one, never a mix.

    Large checkpoints are written by several threads (sized to the machine;
    the environment variable OBJCKPT_IO_THREADS overrides): each checksums
    its tensors and writes them straight from their buffers at their
    offsets in one data file, whose bytes, like the index's, are those TF's
    `SaveV2` writes, so `tf.train.Checkpoint`, `tf.train.load_checkpoint`
    and `objckpt verify` read it. (Variant tensors go through `SaveV2` parts
    on several threads instead: `prefix.data-0000k-of-0000K` under one
    index, TF's sharded layout.) Values are read without copying them (TF
    copies a variable's buffer only when it is next updated), so saving
    needs no second copy of the model in memory.

    With `blocking=False` the values are taken at the call and written on a
    background thread: the call returns a `SaveHandle` at once, and training
    may go on; `handle.result()` waits for the write and returns the prefix
    or raises what a blocking save would have raised. Saves without blocking
    are written one at a time, in call order.

    Under `tf.distribute` it writes what `tf.train.Checkpoint` writes: one
    value per variable, a `MirroredVariable`'s (its replicas are equal) and a
    SyncOnRead variable's aggregate across replicas (the sum of a SUM
    variable, such as a metric's total; the mean of a MEAN one, such as
    tf_keras BatchNormalization statistics; replica 0's for
    ONLY_FIRST_REPLICA). `objckpt.restore` puts them back as TF does.

    Under `MultiWorkerMirroredStrategy` every worker must call `save` with
    the same obj, as with `tf.train.Checkpoint.save`: reading a SyncOnRead
    variable is a collective operation across the workers. Only the chief
    (TF's `strategy.extended.should_checkpoint`: task 0 of the "chief" job,
    or of "worker" when there is no chief) writes `prefix`; the other
    workers read the same values and write nothing, and every worker returns
    `prefix`. Saving a `Snapshot` reads nothing (`snapshot` did, on every
    worker) and writes on the chief only (one built from a mapping, with no
    live obj behind it, follows the strategy in scope: outside
    `strategy.scope()` every worker writes it). `prefix` should be on storage
    the workers share when they restore from it.

    Args:
      obj_or_snapshot: a trackable obj or a `Snapshot`.
      prefix: where to write (`prefix.index`, `prefix.data-00000-of-00001`, or
        several data shards when variant tensors are written by `SaveV2` parts);
        missing folders are created. An existing directory is refused
        (InvalidArgumentError): pass a prefix inside it (`run/ckpt`), and
        `restore(obj, "run")` reads the newest checkpoint there.
      blocking: False: write on a background thread and return a `SaveHandle`.
      durable: True: fsync every file written and the directory before the
        final renames, and the directory after them, so the checkpoint
        survives a power cut once `save` returns (TF does not). False: leave
        that to the operating system. None (default): the library default,
        `objckpt._bundle.fastio.DURABLE_DEFAULT` (see the README for its cost).

    Returns:
      The prefix written (on a non-chief worker: the chief's prefix); with
      `blocking=False`, a `SaveHandle` whose `result()` returns it.

    Raises:
      UnbuiltModelError: there is nothing to save.
      InvalidArgumentError: `prefix` is an existing directory.
    """
    if not isinstance(blocking, bool):
        raise errors.InvalidArgumentError(
            f"blocking must be True or False. Received: blocking={blocking!r}. Fix: pass "
            "blocking=False to write on a background thread.")
    if durable is not None and not isinstance(durable, bool):
        raise errors.InvalidArgumentError(
            f"durable must be True, False or None. Received: durable={durable!r}. Fix: pass "
            "durable=True to fsync before the checkpoint is committed.")
    if isinstance(obj_or_snapshot, _snapshot.Snapshot):
        snap = obj_or_snapshot
        origin = snap.origin()
    else:  # the tree held here: an obj's tree may be cached nowhere (a tf.train.Checkpoint)
        origin = _tree.tree(obj_or_snapshot)
        _snapshot.check_cross_replica(origin, "save")
        # On every worker of a multi-worker strategy: SyncOnRead reads are collectives. A
        # sharded variable is read shard by shard where it lives (a `ShardedValue`).
        snap = _snapshot.of_tree(origin, _snapshot.read_values(origin))
    prefix = os.fspath(prefix)
    _files.check_prefix(prefix)  # never `<dir>.index` beside an existing directory
    if not snap:
        raise errors.UnbuiltModelError(
            f"Nothing to save to `{prefix}`: {_checks.describe_obj(obj_or_snapshot)} has no "
            "variables. Fix: build the model (call it on a batch, or model.build(shape)) "
            "before saving it.", source=prefix, obj=_checks.describe_obj(obj_or_snapshot))
    if not _compat.writes_checkpoints(origin.values() if origin is not None else ()):
        # a worker that is not the chief: the chief writes `prefix`
        return prefix if blocking else SaveHandle._finished(prefix)
    names = ([_compat.variable_name(v) for v in origin.values()] if origin is not None
             else [""] * len(snap))
    paths = list(snap)
    aliases = origin.graph_aliases() if origin is not None else None
    keys, values, slices = _keyed(paths, list(snap.as_dict().values()), origin)

    def write(workers=None) -> None:
        # The object graph is built here, on the writing thread of a background save: the
        # paths, names and aliases were taken at the call.
        graph = _tree.build_object_graph(paths, names, aliases)
        with tf.device("/cpu:0"):
            tensors = [*values, tf.constant(graph.SerializeToString())]
        _files.write_tensors(prefix, [*keys, _compat.OBJECT_GRAPH_KEY], tensors,
                             durable=durable, workers=workers,
                             slices=[*slices, ""] if any(slices) else None)

    if blocking:
        write()
        return prefix
    return SaveHandle._submit(prefix, write)


def _keyed(paths: list, values: list, origin) -> tuple[list, list, list]:
    """(checkpoint keys, tensors, slice specs) to write: a sharded variable as
    `tf.train.Checkpoint` saves it, one slice per shard under its one key (a `ShardedValue`'s
    shards, else the rows of the logical value read before)."""
    keys, tensors, slices = [], [], []
    for path, value in zip(paths, values):
        variable = origin.get(path) if origin is not None else None
        pieces = (value.slices() if _compat.is_sharded_value(value)  # obj gone or not
                  else _compat.shard_slices(variable, value)  # (read in a tf.function)
                  if variable is not None and _compat.is_sharded(variable) else None)
        if pieces is not None:
            for spec, part in pieces:
                keys.append(_paths.checkpoint_key(path))
                tensors.append(part)
                slices.append(spec)
        else:
            keys.append(_paths.checkpoint_key(path))
            tensors.append(value)
            slices.append("")
    return keys, tensors, slices


class SaveHandle:
    """A save running in the background (`objckpt.save(..., blocking=False)`).

    `result(timeout=None)` waits for it and returns the prefix written, or
    raises the error the save raised (the same a blocking save raises: the
    checkpoint at the prefix, if any, is then untouched); `done()` says
    whether it ended. The values written are the ones the obj held when
    `save` was called.
    """

    _executor = None
    _lock = threading.Lock()

    def __init__(self, prefix: str, future):
        self.prefix = prefix
        self._future = future

    @classmethod
    def _submit(cls, prefix, write) -> SaveHandle:
        from objckpt._bundle import fastio as _fastio

        with cls._lock:
            if cls._executor is None:
                cls._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="objckpt-save", initializer=_fastio.lower_priority)
            future = cls._executor.submit(write, workers=1)
        return cls(prefix, future)

    @classmethod
    def _finished(cls, prefix: str) -> SaveHandle:
        future = concurrent.futures.Future()
        future.set_result(None)
        return cls(prefix, future)

    def result(self, timeout: float | None = None) -> str:
        """Waits for the save (at most `timeout` seconds) and returns the prefix.

        Raises:
          TimeoutError: the save did not end within `timeout`.
          The save's own error, when it failed.
        """
        try:
            self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"The save to `{_render.safe(self.prefix)}` did not end within {timeout} s; it "
                "goes on in the background. Fix: call result() again, without a timeout to "
                "wait until it ends.") from None
        return self.prefix

    def done(self) -> bool:
        """Whether the save ended (written, or failed)."""
        return self._future.done()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"SaveHandle(prefix={self.prefix!r}, {state})"
