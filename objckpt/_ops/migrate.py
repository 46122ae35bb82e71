"""Migration: a source's values written as an object-based checkpoint laid out for obj.

The plan is the one `objckpt.plan` shows, checked from metadata (every entry's shape and
dtype) before a byte is read. Values are streamed, one tensor at a time: the data file's
layout follows from the planned shapes and dtypes (`_bundle.write`), so each value is read
from the source (one large tensor alone, small ones a few MiB at a time), transformed,
cast, checked against its variable, checksummed and written at its offset, then dropped;
several threads read and write, the bytes in flight bounded by the largest tensor (or
`_STREAM_SLACK`, where that is more), so peak memory stays near the largest tensor, not the
checkpoint. Where objckpt's bundle writer cannot write (no native crc32c, a string
variable, a graph being built), groups of tensors are written by `SaveV2` as shards merged
by `MergeV2Checkpoints`, as TF's own sharded saver does.

All or nothing: everything is written under a temporary name, and a read that fails while
values stream (a damaged or truncated source, a rule's transform that raises or returns a
value that does not fit) removes it, so nothing at the prefix changes and obj's variables
are never written. The result is read back (object graph, shapes, dtypes and every
tensor's checksum) before it replaces anything at the prefix, the index last.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import api as _api
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import fastio as _fastio
from objckpt._bundle import files as _files
from objckpt._bundle import remote as _remote
from objckpt._bundle import write as _bundlewrite
from objckpt._inspect.verify import tensor_problems
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import tree as _tree

__all__ = ["migrate"]

_GROUP_BYTES = 32 << 20  # SaveV2's route: small tensors are written together up to this size
# The streamed route: source bytes in flight at once (the largest tensor's, or this many
# where that is more), and small tensors read together up to `_READ_BYTES`.
_STREAM_SLACK = 64 << 20
_READ_BYTES = 4 << 20
_PROGRESS_BYTES = 64 << 20  # inputs at least this big show progress on a terminal


def _written_shape(variable, match, src) -> tuple:
    """The shape written for a variable: its own, or where it is relaxed (a tf_keras lookup's
    `idf_weights` of shape (None,)) the value's: the source entry's, else its current one."""
    if variable.shape.is_fully_defined():
        return tuple(variable.shape)
    if match is not None and match.transform is None:
        return tuple(src.specs[match.source][0])
    return tuple(_compat.read_value(variable).shape)


def _nbytes(spec) -> int:
    shape, dtype = spec
    return _render.elements(shape) * tf.as_dtype(dtype).size


class _Progress:
    def __init__(self, total: int, enabled):
        if enabled is None:
            enabled = total >= _PROGRESS_BYTES and sys.stderr.isatty()
        self.enabled = bool(enabled)
        self.total = max(total, 1)
        self.done = 0
        self.start = time.perf_counter()
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self._add(nbytes)

    def _add(self, nbytes: int) -> None:
        self.done += nbytes
        if self.enabled:
            rate = self.done / max(time.perf_counter() - self.start, 1e-9) / 1e6
            sys.stderr.write(f"\rmigrate: {self.done / 1e6:,.0f} of {self.total / 1e6:,.0f} MB "
                             f"({100 * self.done / self.total:.0f}%), {rate:,.0f} MB/s")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def migrate(obj, source, prefix, *, rules=None, at: str | None = None, strict: bool = True,
            optimizer_state="auto", progress: bool | None = None,
            cast: str = "lossless") -> str:
    """Writes the source's values as an object-based checkpoint laid out for obj.

    `tf.train.Checkpoint(root=obj_like).read(prefix)` and `objckpt.restore`
    load the result directly. obj's variables are not changed: it only provides the
    layout (object paths, shapes, dtypes); an optimizer of obj not built yet is built
    (see optimizer_state), so that the layout holds its state. Nothing is written
    unless the plan is acceptable.

    The arguments are those of `objckpt.restore` (same meaning, same defaults), plus
    the destination `prefix`. The old order `migrate(source, obj, prefix)` still works
    until objckpt 0.2, with a `DeprecationWarning`.

    Args:
      obj: a built obj with the target layout (e.g. the Keras 3 rewrite).
      source: a name-based (TF1 `Saver`) or object-based prefix or directory,
        or a `Snapshot`.
      prefix: where to write: a local prefix, or a URL (`gs://bucket/run/ckpt`,
        `s3://...`: written locally, checked, then uploaded; the index last).
      rules: ordered `(regex, replacement[, transform])` rewrites of source
        keys. Each key is rewritten by the first rule whose regex matches it
        (`re.sub(regex, replacement, key, count=1)`), once: rules never
        chain. A None replacement drops the entry; keys no rule matches stay
        as they are. The rewritten key then matches a variable by object
        path, by object path with leading underscores stripped, or by
        variable name. To chain, write one rule with a combined regex, or
        rules that each match the full original key. Keep `global_step`
        (do not drop it) when moving optimizer state: it becomes the
        optimizer's `iterations`. See `objckpt.plan`.
      at: take values from this subtree of the source.
      optimizer_state: as for `objckpt.restore`. "auto" (default): TF1 Adam
        slots (`.../Adam`, `.../Adam_1`) and Keras 2/tf_keras optimizer
        variables move into obj's optimizer variables by the variable they
        belong to when obj has an optimizer (one not built yet is built first,
        as Keras's first training step would: the written checkpoint then
        holds its state), and are skipped and listed when it has none. True:
        obj must have an optimizer. False: optimizer entries are skipped.
      strict: if True, every variable of obj must get a value and every
        source entry must be used (or skipped by a rule). If False, variables
        without a source value are written with obj's current values.
      progress: show a progress line on stderr; None: only for inputs of
        64 MB or more when stderr is a terminal.

    Returns:
      The prefix written. Under `MultiWorkerMirroredStrategy` (obj's) every
      worker calls `migrate`, as for `objckpt.save`, and only the chief writes
      `prefix`; every worker returns it. The workers agree (one small
      collective) after opening and planning the source: when that fails on
      one worker, every worker raises (the others name the failing worker's
      task and error) and nothing is written. A rule's transform that fails
      on one worker only, later, while values stream, is not agreed on.

    Values stream one tensor at a time (memory beyond obj: about the largest tensor).
    Everything is checked from metadata before a byte is read; what only reading shows
    (a damaged or truncated source entry, a rule's transform that fails or gives a value
    that does not fit) raises while values stream, and nothing is written at `prefix`.

    Raises:
      StructureMismatchError: an incomplete, ambiguous or mismatched plan, or a rule's
        transform whose value does not fit; nothing is written.
      CheckpointCorruptError: a source entry that cannot be read, or the written
        checkpoint failed verification; nothing is written.

    Example:
      >>> objckpt.migrate(keras3_model, "tf1/model.ckpt-1000", "migrated/ckpt",
      ...                 rules=[("^model_001/", "")])
    """
    obj, source = _api.obj_first("migrate", obj, source, old="source, obj, prefix",
                                 new="obj, source, prefix")
    strict = _match.check_strict(strict)
    variables = _tree.tree(obj)
    prefix = os.fspath(prefix)
    pipe = _pipeline.Pipeline("objckpt.migrate", obj, source, rules=rules, at=at,
                              strict=strict, optimizer_state=optimizer_state, action="migrate",
                              cast=cast)
    # Under MultiWorkerMirroredStrategy every worker raises when the source cannot be
    # opened or planned on one (the others would wait in a SyncOnRead read's collective).
    with pipe.decided(lambda: variables):
        _files.check_prefix(prefix)  # an existing directory: refused before any work
        src = pipe.open()
        variables, the_plan = pipe.plan(variables, src)
        the_plan = pipe.check(variables, src, the_plan)
    # The values are fetched while the checkpoint is written, a group at a time.
    fed = {m.target: m for m in the_plan.matches}
    paths = list(variables)
    specs = {p: (_written_shape(variables[p], fed.get(p), src), variables[p].dtype.base_dtype)
             for p in paths}
    remote = _remote.is_remote(prefix)
    directory = os.path.dirname(prefix)
    created = bool(directory) and not remote and not tf.io.gfile.exists(directory)
    if directory and not remote:
        tf.io.gfile.makedirs(directory)
    # A URL's checkpoint is written in a private local folder, then uploaded in the commit
    # order (`_files.commit`: data objects first, the index last).
    work = _remote.new_folder("migrate") if remote else _files.temp_prefix(prefix)
    tf.io.gfile.makedirs(work)
    meter = _Progress(sum(_nbytes(specs[p]) for p in paths), progress)
    # With the edges TF writes besides each canonical path (a trained Keras 3 model's layers
    # reach weights its optimizer lists first), as `objckpt.save` writes them.
    graph = _tree.build_object_graph(paths, [_compat.variable_name(variables[p]) for p in paths],
                                     variables.graph_aliases())
    try:
        merged = os.path.join(work, "merged")
        if not _write_streamed(pipe, src, merged, paths, specs, fed, variables, the_plan,
                               meter, graph):
            parts = _write_parts(pipe, work, paths, specs, fed, variables, the_plan, meter,
                                 graph)
            with tf.device("/cpu:0"):
                tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts,
                                              destination_prefix=merged, delete_old_dirs=False)
        _verify(merged, prefix, specs)  # before it replaces anything at `prefix`
        # Under MultiWorkerMirroredStrategy the chief commits; the others, whose reads were
        # the same (collective) ones, drop their copy with `work`, as TF's non-chiefs do.
        if _compat.writes_checkpoints(variables.values()):
            _files.commit(merged, prefix)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if created and not os.listdir(directory):
            os.rmdir(directory)  # leave no empty folder behind a failed migrate
        raise
    finally:
        meter.close()
        shutil.rmtree(work, ignore_errors=True)
    return prefix


def _write_streamed(pipe, src, merged, paths, specs, fed, variables, the_plan, meter,
                    graph) -> bool:
    """Writes the checkpoint at the prefix `merged` one tensor at a time with objckpt's
    bundle writer (one data file, one index); False where it cannot (nothing written then):
    no native crc32c, a graph being built, or a variable of a dtype it does not write
    (strings)."""
    crc = _fastio.native_crc32c()
    placeholders = [tf.TensorSpec(specs[p][0], specs[p][1]) for p in paths]
    if (crc is None or not tf.executing_eagerly() or any(s.dtype == tf.string
                                                         for s in placeholders)
            or not _bundlewrite.supported(placeholders)):
        return False
    keys = [_paths.checkpoint_key(p) for p in paths] + [_compat.OBJECT_GRAPH_KEY]
    items = _bundlewrite.plan(keys, [*placeholders, tf.constant(graph.SerializeToString())],
                              crc)
    item_of = dict(zip(paths, items))
    fd = os.open(f"{merged}.data-00000-of-00001", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, _bundlewrite.data_bytes(items))

        def write(path, value) -> None:
            item = item_of[path]
            if value.dtype != specs[path][1]:
                value = tf.cast(value, specs[path][1])
            if tuple(value.shape) != tuple(specs[path][0]):  # the fetch stage checked it
                raise errors.StructureMismatchError(
                    f"objckpt.migrate: the value for `{path}` has shape "
                    f"{tuple(value.shape)}, not the {tuple(specs[path][0])} planned for it. "
                    "Nothing was written. Fix: make the rule's transform return the "
                    "variable's shape.", (path,))
            item.tensor = value
            try:
                _bundlewrite.write_item(fd, item, crc)
            finally:
                item.tensor = None
            meter.add(item.size)

        _bundlewrite.write_item(fd, items[-1], crc)  # the object graph
        _stream_matches(pipe, src, [fed[p] for p in paths if p in fed], specs, variables,
                        the_plan, write)
        for path in paths:  # obj's own values (strict=False), in order (a collective each
            if path not in fed:  # for a SyncOnRead variable under a multi-worker strategy)
                write(path, _compat.read_value(variables[path]))
    finally:
        os.close(fd)
    with open(f"{merged}.index", "wb") as f:
        f.write(_bundlewrite.index(items, crc))
    return True


def _stream_matches(pipe, src, matches, specs, variables, the_plan, write) -> None:
    """Every match's value fetched (read, transformed, checked and cast by the pipeline's
    fetch stage) and passed to `write(path, value)`, then dropped: one large tensor at a
    time, small ones a few MiB at a time; on several threads for a local TF checkpoint or a
    format read one tensor at a time, the bytes read and not yet written bounded by the
    largest tensor (or `_STREAM_SLACK`). The first failure stops the jobs not started."""
    if not matches:
        return
    # A transformed or cast value is held twice for a moment: as read and as it becomes.
    sizes = [_nbytes(specs[m.target]) * (2 if m.transform is not None or m.cast else 1)
             for m in matches]
    jobs, job, job_bytes = [], [], 0
    for m, size in zip(matches, sizes):
        if size >= _READ_BYTES:  # alone
            jobs.append(([m], size))
            continue
        if job and job_bytes + size > _READ_BYTES:
            jobs.append((job, job_bytes))
            job, job_bytes = [], 0
        job.append(m)
        job_bytes += size
    if job:
        jobs.append((job, job_bytes))
    gate = _fastio.Budget(max(max(sizes), _STREAM_SLACK))
    failed = threading.Event()

    def run(entry) -> None:
        group, nbytes = entry
        if failed.is_set():
            return
        try:
            with gate.hold(nbytes):
                for match, value in zip(group, pipe.fetch(the_plan, variables, group)):
                    write(match.target, value)
                    del value
        except BaseException:
            failed.set()
            raise

    parallel = src.stream is not None or (src.bundle_keys is not None and src.prefix
                                          and not _remote.is_remote(src.prefix))
    _fastio.run_all(run, jobs, _fastio.threads() if parallel else 1)


def _write_parts(pipe, work, paths, specs, fed, variables, the_plan, meter,
                 graph) -> list[str]:
    parts, group, group_bytes = [], [], 0

    def flush():
        nonlocal group, group_bytes
        if not group:
            return
        from_source = [fed[p] for p in group if p in fed]
        values = dict(zip((m.target for m in from_source),
                          pipe.fetch(the_plan, variables, from_source)))
        tensors = []
        for path in group:
            value = values[path] if path in values else _compat.read_value(variables[path])
            tensors.append(tf.cast(value, specs[path][1]) if value.dtype != specs[path][1]
                           else value)
        keys = [_paths.checkpoint_key(p) for p in group]
        if not parts:  # the object graph goes with the first shard
            keys.append(_compat.OBJECT_GRAPH_KEY)
            tensors.append(tf.constant(graph.SerializeToString()))
        part = os.path.join(work, f"part-{len(parts):05d}")
        with tf.device("/cpu:0"):
            tf.raw_ops.SaveV2(prefix=part, tensor_names=keys,
                              shape_and_slices=[""] * len(keys), tensors=tensors)
        parts.append(part)
        meter.add(group_bytes)
        group, group_bytes = [], 0

    for path in paths:
        size = _nbytes(specs[path])
        if group and group_bytes + size > _GROUP_BYTES:
            flush()
        group.append(path)
        group_bytes += size
    flush()
    return parts


def _verify(prefix: str, final: str, specs: dict) -> None:
    """Reads the result back: its tree must be obj's, and every tensor must read."""
    written = _tree.read_tree_at(prefix)
    problems = [f"`{p}`: missing" for p in specs if p not in written]
    problems += [f"`{p}`: {written[p].dtype.name}{written[p].shape} written, "
                 f"{dtype.name}{shape} expected"
                 for p, (shape, dtype) in specs.items()
                 if p in written and (written[p].shape != shape or written[p].dtype != dtype)]
    if not problems:
        reader = _files.open_reader(prefix)
        path_of = {written[path].key: path for path in specs}
        problems += [f"`{path_of[key]}`: {error}" for key, error in tensor_problems(
            reader, list(path_of), stop_at_first=True)]
    if problems:
        raise errors.CheckpointCorruptError(
            f"The migrated checkpoint for `{final}` failed verification when read back: "
            + "; ".join(problems[:10]) + ". Nothing was written at that prefix. The disk may "
            "be full or failing. Fix: free space or use another disk, and migrate again.",
            source=final)
