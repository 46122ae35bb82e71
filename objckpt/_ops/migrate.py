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

A sharded variable of obj (a `ShardedVariable`, ParameterServerStrategy with a partitioner) is
written as `tf.train.Checkpoint` writes it: its key's entry lists one slice per shard (in the
order TF's saver writes them) and each shard's rows are a slice entry of their own. From a
local TF checkpoint, without a rule's transform or a lossy cast, each shard's rows are read
alone, so memory holds a shard's rows, not the table: where they are byte ranges of the
stored entries (a tensor stored whole, or in slices of rows: a sharded variable of any shard
count, a TF1 variable partitioned by rows), read in order without TF straight into the
shard's buffer, each entry's checksum checked after its last byte; otherwise (a TF1 variable
partitioned by columns) one `RestoreV2` of the shard's slice (TF reads the stored slices it
overlaps, one at a time).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import api as _api
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import fastio as _fastio
from objckpt._bundle import files as _files
from objckpt._bundle import index as _index
from objckpt._bundle import remote as _remote
from objckpt._bundle import write as _bundlewrite
from objckpt._inspect.verify import tensor_problems
from objckpt._ops import meanstream as _meanstream
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import sharded as _sharded
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
    A sharded variable of obj (a `ShardedVariable`: ParameterServerStrategy with a
    partitioner, or a model built with one) is written as `tf.train.Checkpoint` writes it:
    its key lists one slice per shard, in the order TF's saver writes them, and each
    shard's rows are an entry of their own; TF and `objckpt.restore` read the result into
    any shard count or a plain variable. From a local TF checkpoint (whatever layout wrote
    it: a whole tensor, any shard count, a TF1 `Saver`'s partitioned variable) each shard's
    rows are read alone, so this host holds about one shard's rows, not the table
    (several small shards at once, up to 64 MiB; from a source partitioned by columns,
    TF's read of a shard also holds one stored slice it overlaps). A rule's transform, a
    lossy cast, or a source of another kind (a Snapshot, safetensors, a remote prefix)
    fetches the value whole on this host, then writes it shard by shard.
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
    # obj's sharded variables: written in slices, one per shard, as TF writes them, each
    # shard's rows read alone where the source allows it.
    sliced = _Sliced(paths, variables, src, the_plan, fed)
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
                               meter, graph, sliced):
            parts = _write_parts(pipe, src, work, paths, specs, fed, variables, the_plan,
                                 meter, graph, sliced)
            with tf.device("/cpu:0"):
                tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts,
                                              destination_prefix=merged, delete_old_dirs=False)
        _verify(merged, prefix, specs, sliced)  # before it replaces anything at `prefix`
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


class _Part(NamedTuple):
    """One shard of a sharded variable as its checkpoint entry lists it."""

    spec: str  # TF's slice spec, e.g. "10 4 6,4:0,4" (`Variable.SaveSliceInfo`)
    extents: tuple  # (start, length) per axis, as the index stores it
    shard: object  # the shard variable


def _extents(spec: str) -> tuple:
    """The (start, length) of each axis of a slice spec ("10 4 6,4:0,4" -> ((6, 4), (0, 4));
    "-" is a whole axis: (0, -1)), as TF's `TensorSlice` parses it."""
    return tuple((0, -1) if axis == "-" else tuple(int(n) for n in axis.split(","))
                 for axis in spec.split(" ")[-1].split(":"))


def _device(variable) -> str:
    try:
        return getattr(variable, "device", "") or ""
    except (AttributeError, RuntimeError, ValueError):  # a wrapper with no one device
        return ""


class _Sliced:
    """obj's sharded variables as `tf.train.Checkpoint` writes them, and how their rows are
    read.

    `parts`: {path: [_Part, ...]}, each variable's shards in the order TF's saver writes
    them and its index lists them (`_compat.save_order` over the devices of every tensor
    saved). From a local TF checkpoint, with no rule's transform and no lossy cast, each
    shard's rows are read alone on this host: `byrows` ({path: (checkpoint key, stored
    dtype, the index entries holding its rows in order)}) where they are byte ranges of
    the stored entries (the tensor stored whole, or in slices of rows: a sharded
    variable's of any shard count, a TF1 variable partitioned by rows), read in order
    without TF (`read_rows`); `reads` ({path: [`_sharded.Job`, ...]}, one per part, in the
    listed order) otherwise (slices of columns, say): TF's `RestoreV2` of the shard's
    slice, which reads the stored slices it overlaps. The others are fetched whole and
    split."""

    def __init__(self, paths, variables, src, the_plan, fed):
        self.parts, self.reads, self.byrows = {}, {}, {}
        self._index, self._index_read = None, False
        if not any(_compat.is_sharded(variables[p]) for p in paths):
            return
        units, devices = [], []
        for path in paths:
            variable = variables[path]
            if not _compat.is_sharded(variable):
                units.append(None)
                devices.append(_device(variable))
                continue
            for job in _sharded.jobs([""], [variable.dtype.base_dtype], [variable], [path]):
                units.append((path, _Part(job.spec, _extents(job.spec), job.variable)))
                devices.append(_device(job.variable))
        for i in _compat.save_order(devices):
            if units[i] is not None:
                self.parts.setdefault(units[i][0], []).append(units[i][1])
        self.parts = {p: self.parts[p] for p in paths if p in self.parts}
        opened = getattr(the_plan, "opened", None)  # stacked entries are no slices to read
        if (src.bundle_keys is None or not src.prefix or "://" in src.prefix
                or not tf.executing_eagerly() or (opened is not None and opened(src) is not src)):
            return
        for path, parts in self.parts.items():
            match, variable = fed.get(path), variables[path]
            if match is None or match.transform is not None:
                continue
            stored = src.specs[match.source][1]
            if (match.cast and not _compat.lossless(stored, variable.dtype.base_dtype)
                    or _compat.replica_parts(variable) is not None):
                continue
            key = src.bundle_keys([match.source])[0]
            entries = self._row_entries(src.prefix, key, variable)
            if entries:
                self.byrows[path] = (key, stored, entries)
                continue
            job_of = {id(job.variable): job for job in _sharded.jobs(
                [key], [stored], [variable], [the_plan.label(path)])}
            # read here (device "/cpu:0"), where the slice is written
            self.reads[path] = [_sharded.Job(job.key, job.spec, job.dtype, job.variable,
                                             job.label)
                                for job in (job_of[id(part.shard)] for part in parts)]

    def _row_entries(self, prefix: str, key: str, variable) -> list:
        """The index entries holding `key`'s rows in order, where each shard's rows are byte
        ranges of them: the tensor stored whole, or in slices of rows only that tile it (a
        sharded variable's, a TF1 variable partitioned by rows), of a dtype stored as its
        raw bytes, the variable's shards splitting rows. Otherwise [] (TF reads it)."""
        if not self._index_read:
            self._index_read = True
            try:
                self._index = _index.read_index(prefix)
            except (OSError, ValueError, errors.ObjckptError):  # TF reads it, or says why
                self._index = None
        entry = None if self._index is None else self._index.entries.get(key)
        if (entry is None or key in self._index.beyond or not _raw(entry.dtype)
                or len(entry.shape) < 1 or _compat.shard_layout(variable).axis != 0):
            return []
        if not entry.slices:
            return [key]
        rows, start = sorted(entry.slices, key=lambda extents: extents[0][0]), 0
        for extents in rows:
            if (extents[0][0] != start or extents[0][1] < 0 or (key, extents)
                    not in self._index.sliced or any(
                        length != -1 and (first, length) != (0, dim)
                        for (first, length), dim in zip(extents[1:], entry.shape[1:]))):
                return []  # another axis split, a gap or overlap: TF reads the slices
            start += extents[0][1]
        return [(key, extents) for extents in rows] if start == entry.shape[0] else []

    def read_rows(self, prefix: str, path: str, write_unit) -> None:
        """Each shard's rows of the stored tensor of `path` given to `write_unit` as they
        are read: the entries holding its rows read in order without TF, each shard's
        bytes straight into a tensor of its own (no copy); each entry's checksum checked
        after its last byte (a mismatch raises before the migration commits anything)."""
        key, stored, entries = self.byrows[path]
        parts = self.parts[path]
        sizes = [_nbytes((tuple(int(d) for d in part.shard.shape), stored)) for part in parts]
        reader = _meanstream.BundleFile(self._index, "objckpt.migrate", _meanstream.crc32c())
        try:
            stored_bytes = sum(reader.entry_for(entry).size for entry in entries)
            if sum(sizes) != stored_bytes:
                raise reader.corrupt(key, f"holds {stored_bytes} bytes where its shape "
                                          f"{tuple(self._index.entries[key].shape)} needs "
                                          f"{sum(sizes)}")
            pieces = (piece for entry in entries for _, piece in reader.pieces(entry, np.uint8))
            piece, used = np.empty(0, np.uint8), 0
            for k in sorted(range(len(parts)), key=lambda k: parts[k].extents[0][0]):
                value, buffer = _empty(stored, tuple(int(d) for d in parts[k].shard.shape))
                target = np.frombuffer(buffer, np.uint8)
                filled = 0
                while filled < sizes[k]:
                    while used == piece.size:
                        piece, used = next(pieces), 0
                    count = min(piece.size - used, sizes[k] - filled)
                    target[filled:filled + count] = piece[used:used + count]
                    filled, used = filled + count, used + count
                del target, buffer
                if value.dtype != stored:  # bytes of a dtype DLPack does not export
                    value = _bitcast(value, stored, parts[k].shard.shape)
                write_unit((path, k), value)
                del value  # one shard's rows at a time
            for _ in pieces:  # past the last byte: the last checksum is checked
                pass
        finally:
            reader.close()

    def __contains__(self, path) -> bool:
        return path in self.parts

    @property
    def read(self) -> set:
        """The paths whose shards are read here one at a time (not fetched whole)."""
        return set(self.reads) | set(self.byrows)

    def units(self, paths) -> list:
        """What the data file holds, in path order: (path, None) for a whole variable,
        (path, k) for the k-th listed part of a sharded one."""
        return [(p, k) for p in paths
                for k in (range(len(self.parts[p])) if p in self.parts else (None,))]

    def key(self, unit) -> str:
        path, k = unit
        key = _paths.checkpoint_key(path)
        return key if k is None else _bundlewrite.slice_key(key, self.parts[path][k].extents)

    def shape(self, unit, specs) -> tuple:
        path, k = unit
        return specs[path][0] if k is None else tuple(
            int(d) for d in self.parts[path][k].shard.shape)

    def rows(self, path: str, value) -> list:
        """Each part's rows of a whole value of `path`, in the listed order."""
        return [value[tuple(slice(None) if length == -1 else slice(start, start + length)
                            for start, length in part.extents)]
                for part in self.parts[path]]

    def own(self, path: str, variable) -> list:
        """obj's own value of `path` (strict=False): a sharded variable's part by part."""
        if path in self.parts:
            return [_compat.read_value(part.shard) for part in self.parts[path]]
        return [_compat.read_value(variable)]

    def wholes(self, specs) -> list:
        """The index entries of the sharded variables' whole tensors: dtype, shape and
        slices, no data (TF's `BundleWriter::AddSlice`)."""
        return [_Whole(_paths.checkpoint_key(path), specs[path][1].as_datatype_enum,
                       specs[path][0], tuple(part.extents for part in parts))
                for path, parts in self.parts.items()]


def _empty(dtype, shape):
    """A new CPU tensor of `dtype` and `shape` and its buffer to fill (`_fastio.empty_tensor`);
    for a dtype DLPack does not export (bfloat16, float8, bool), a uint8 tensor of its bytes
    (`_bitcast` makes it the dtype)."""
    try:
        return _fastio.empty_tensor(dtype, shape)
    except (RuntimeError, TypeError, ValueError):  # "Unsupported dtype in DLTensor"
        count = _render.elements(shape)
        return _fastio.empty_tensor(tf.uint8, (count, tf.as_dtype(dtype).size))


def _bitcast(value, dtype, shape):
    """The uint8 tensor of `_empty`'s fallback as `dtype` of `shape` (its bytes as they are)."""
    dtype = tf.as_dtype(dtype)
    if dtype == tf.bool:  # stored as one byte each, 0 or 1
        return tf.reshape(tf.cast(value, tf.bool), shape)
    return tf.reshape(tf.bitcast(value, dtype), shape)


def _raw(enum: int) -> bool:
    """Whether a dtype's tensors are stored as their raw bytes (numbers, bool; no strings)."""
    try:
        dtype = tf.as_dtype(enum)
    except TypeError:
        return False
    return dtype != tf.string and _bundlewrite.supported([tf.TensorSpec((), dtype)])


class _Whole:
    """The entry of a tensor stored in slices (what `_bundlewrite.index` reads of an item)."""

    __slots__ = ("crc", "dtype", "key", "offset", "shape", "size", "slices")

    def __init__(self, key: str, dtype: int, shape, slices):
        self.key, self.dtype, self.shape, self.slices = key.encode("utf-8"), dtype, \
            list(shape), slices
        self.offset = self.size = self.crc = 0


def _read_slice(prefix: str, job):
    """One shard's rows of the source (`_sharded.read_slice`), a failed read a
    `CheckpointCorruptError` naming the entry, its rows and the variable."""
    try:
        return _sharded.read_slice(prefix, job)
    except tf.errors.OpError as err:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(prefix)}` could not be read: its data is damaged, "
            f"truncated or missing. The entry that fails is `{_render.safe(job.key)}` (the "
            f"slice {job.spec!r}, for {job.label}). Received from TF: "
            f"{_render.first_line(err)}. Nothing was written. Fix: use another checkpoint.",
            source=prefix) from err


def _write_streamed(pipe, src, merged, paths, specs, fed, variables, the_plan, meter,
                    graph, sliced) -> bool:
    """Writes the checkpoint at the prefix `merged` one tensor (a sharded variable: one
    shard's slice) at a time with objckpt's bundle writer (one data file, one index); False
    where it cannot (nothing written then): no native crc32c, a graph being built, or a
    variable of a dtype it does not write (strings)."""
    crc = _fastio.native_crc32c()
    units = sliced.units(paths)
    placeholders = [tf.TensorSpec(sliced.shape(u, specs), specs[u[0]][1]) for u in units]
    if (crc is None or not tf.executing_eagerly() or any(s.dtype == tf.string
                                                         for s in placeholders)
            or not _bundlewrite.supported(placeholders)):
        return False
    keys = [sliced.key(u) for u in units] + [_compat.OBJECT_GRAPH_KEY]
    items = _bundlewrite.plan(keys, [*placeholders, tf.constant(graph.SerializeToString())],
                              crc)
    item_of = dict(zip(units, items))
    fd = os.open(f"{merged}.data-00000-of-00001", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, _bundlewrite.data_bytes(items))

        def write_unit(unit, value) -> None:
            item = item_of[unit]
            if value.dtype != specs[unit[0]][1]:
                value = tf.cast(value, specs[unit[0]][1])
            item.tensor = value
            try:
                _bundlewrite.write_item(fd, item, crc)
            finally:
                item.tensor = None
            meter.add(item.size)

        def write(path, value) -> None:
            if tuple(value.shape) != tuple(specs[path][0]):  # the fetch stage checked it
                raise errors.StructureMismatchError(
                    f"objckpt.migrate: the value for `{path}` has shape "
                    f"{tuple(value.shape)}, not the {tuple(specs[path][0])} planned for it. "
                    "Nothing was written. Fix: make the rule's transform return the "
                    "variable's shape.", (path,))
            if path in sliced:  # fetched whole (a transform, a lossy cast): split
                for k, rows in enumerate(sliced.rows(path, value)):
                    write_unit((path, k), rows)
            else:
                write_unit((path, None), value)

        _bundlewrite.write_item(fd, items[-1], crc)  # the object graph
        _stream_matches(pipe, src, [fed[p] for p in paths if p in fed and p not in sliced.read],
                        specs, variables, the_plan, write, sliced, write_unit)
        for path in paths:  # obj's own values (strict=False), in order (a collective each
            if path not in fed:  # for a SyncOnRead variable under a multi-worker strategy)
                for k, value in enumerate(sliced.own(path, variables[path])):
                    write_unit((path, k if path in sliced else None), value)
    finally:
        os.close(fd)
    with open(f"{merged}.index", "wb") as f:
        f.write(_bundlewrite.index([*items, *sliced.wholes(specs)], crc))
    return True


def _stream_matches(pipe, src, matches, specs, variables, the_plan, write, sliced,
                    write_unit) -> None:
    """Every match's value fetched (read, transformed, checked and cast by the pipeline's
    fetch stage) and passed to `write(path, value)`, then dropped, and every shard of
    `sliced.reads` read alone (its rows of the source) and passed to `write_unit`: one large
    tensor (one shard) at a time, small ones a few MiB at a time; on several threads for a
    local TF checkpoint or a format read one tensor at a time, the bytes read and not yet
    written bounded by the largest tensor or shard read (or `_STREAM_SLACK`). The first
    failure stops the jobs not started."""
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
    for path in sliced.byrows:  # one job: the entries read in order, a shard at a time
        shapes = [sliced.shape((path, k), specs) for k in range(len(sliced.parts[path]))]
        stored = sliced.byrows[path][1]
        size = max(_nbytes((shape, stored)) + (_nbytes((shape, specs[path][1]))
                                                if stored != specs[path][1] else 0)
                   for shape in shapes) + _meanstream.READ_BYTES
        jobs.append((path, size))
        sizes.append(size)
    for path, reads in sliced.reads.items():
        for k, read in enumerate(reads):
            shape = sliced.shape((path, k), specs)
            size = _nbytes((shape, read.dtype)) + (
                _nbytes((shape, specs[path][1])) if read.dtype != specs[path][1] else 0)
            jobs.append(((path, k, read), size))
            sizes.append(size)
    if not jobs:
        return
    gate = _fastio.Budget(max(max(sizes), _STREAM_SLACK))
    failed = threading.Event()

    def run(entry) -> None:
        group, nbytes = entry
        if failed.is_set():
            return
        try:
            with gate.hold(nbytes):
                if isinstance(group, str):  # a whole stored tensor, shard by shard
                    sliced.read_rows(src.prefix, group, write_unit)
                    return
                if isinstance(group, tuple):  # one shard's rows
                    path, k, read = group
                    value = _read_slice(src.prefix, read)
                    write_unit((path, k), value)
                    del value
                    return
                for match, value in zip(group, pipe.fetch(the_plan, variables, group)):
                    write(match.target, value)
                    del value
        except BaseException:
            failed.set()
            raise

    parallel = src.stream is not None or (src.bundle_keys is not None and src.prefix
                                          and not _remote.is_remote(src.prefix))
    _fastio.run_all(run, jobs, _fastio.threads() if parallel else 1)


def _write_parts(pipe, src, work, paths, specs, fed, variables, the_plan, meter, graph,
                 sliced) -> list[str]:
    """The checkpoint written by `SaveV2` as parts (merged by `MergeV2Checkpoints` in the
    order returned): whole tensors in groups, the object graph with the first part; each
    shard of a sharded variable a part of its own, in the order TF's saver writes them."""
    parts, group, group_bytes = [], [], 0

    def save(keys, tensors, shape_and_slices) -> None:
        if not parts:  # the object graph goes with the first shard
            keys, tensors = [*keys, _compat.OBJECT_GRAPH_KEY], [
                *tensors, tf.constant(graph.SerializeToString())]
            shape_and_slices = [*shape_and_slices, ""]
        part = os.path.join(work, f"part-{len(parts):05d}")
        with tf.device("/cpu:0"):
            tf.raw_ops.SaveV2(prefix=part, tensor_names=keys,
                              shape_and_slices=shape_and_slices, tensors=tensors)
        parts.append(part)

    def cast(value, path):
        return tf.cast(value, specs[path][1]) if value.dtype != specs[path][1] else value

    def flush():
        nonlocal group, group_bytes
        if not group:
            return
        from_source = [fed[p] for p in group if p in fed]
        values = dict(zip((m.target for m in from_source),
                          pipe.fetch(the_plan, variables, from_source)))
        tensors = [cast(values[path] if path in values
                        else _compat.read_value(variables[path]), path) for path in group]
        save([_paths.checkpoint_key(p) for p in group], tensors, [""] * len(group))
        meter.add(group_bytes)
        group, group_bytes = [], 0

    for path in paths:
        if path in sliced:
            continue
        size = _nbytes(specs[path])
        if group and group_bytes + size > _GROUP_BYTES:
            flush()
        group.append(path)
        group_bytes += size
    flush()
    for path, listed in sliced.parts.items():
        if path in sliced.byrows:  # read in row order, each shard saved as it comes
            first, order = len(parts), []

            def save_rows(unit, value, path=path) -> None:
                order.append(unit[1])
                save([_paths.checkpoint_key(path)], [cast(value, path)],
                     [sliced.parts[path][unit[1]].spec])
                meter.add(_nbytes((tuple(value.shape), specs[path][1])))

            sliced.read_rows(src.prefix, path, save_rows)
            # merged in the listed order (TF's), whatever order they were read in
            parts[first:] = [p for _, p in sorted(zip(order, parts[first:]))]
            continue
        if path in sliced.reads:
            values = (_read_slice(src.prefix, read) for read in sliced.reads[path])
        elif path in fed:
            values = iter(sliced.rows(path, pipe.fetch(the_plan, variables, [fed[path]])[0]))
        else:
            values = iter(sliced.own(path, variables[path]))
        for part, value in zip(listed, values):
            save([_paths.checkpoint_key(path)], [cast(value, path)], [part.spec])
            meter.add(_nbytes((tuple(value.shape), specs[path][1])))
            del value
    if not parts:
        save([], [], [])
    return parts


def _verify(prefix: str, final: str, specs: dict, sliced) -> None:
    """Reads the result back: its tree must be obj's, and every tensor must read (a
    sharded variable's one slice at a time, with the slices listed as planned)."""
    written = _tree.read_tree_at(prefix)
    problems = [f"`{p}`: missing" for p in specs if p not in written]
    problems += [f"`{p}`: {written[p].dtype.name}{written[p].shape} written, "
                 f"{dtype.name}{shape} expected"
                 for p, (shape, dtype) in specs.items()
                 if p in written and (written[p].shape != shape or written[p].dtype != dtype)]
    if not problems and sliced.parts:
        entries = _index.read_index(prefix).entries
        for path, parts in sliced.parts.items():
            key = written[path].key
            listed = tuple(entries[key].slices) if key in entries else ()
            if listed != tuple(part.extents for part in parts):
                problems.append(f"`{path}`: slices {listed} listed, "
                                f"{tuple(part.extents for part in parts)} expected")
                continue
            for part in parts:
                try:
                    with tf.device("/cpu:0"):
                        tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key],
                                             shape_and_slices=[part.spec],
                                             dtypes=[specs[path][1]])
                except tf.errors.OpError as err:
                    problems.append(f"`{path}` (slice {part.spec!r}): "
                                    f"{_render.first_line(err)}")
                    break
    if not problems:
        reader = _files.open_reader(prefix)
        path_of = {written[path].key: path for path in specs if path not in sliced}
        problems += [f"`{path_of[key]}`: {error}" for key, error in tensor_problems(
            reader, list(path_of), stop_at_first=True)]
    if problems:
        raise errors.CheckpointCorruptError(
            f"The migrated checkpoint for `{final}` failed verification when read back: "
            + "; ".join(problems[:10]) + ". Nothing was written at that prefix. The disk may "
            "be full or failing. Fix: free space or use another disk, and migrate again.",
            source=final)
