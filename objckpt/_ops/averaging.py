"""Checkpoint averages without TensorFlow: weights, and the writer.

`objckpt.average` (`_ops.average`) and `average_checkpoints` (here, what `objckpt average`
runs) share this module's pieces and `_ops.meanstream`'s streamed mean:

- `normalized_weights`: N finite, non-negative weights with a positive sum, divided by it;
- `check_sources`, `check_non_weights`, `is_optimizer_path`: what is averaged and how;
- `average_checkpoints`: N TF checkpoints of one structure averaged into a new checkpoint
  laid out like the first (same keys, same object graph), read with the TF-free index and
  object-graph readers, each tensor's mean streamed (`meanstream.stream_mean`) and written
  one tensor at a time in TF's bundle format (`_bundle.write`), so the command line's
  `objckpt average` runs without importing TensorFlow. A partitioned entry (a sharded
  variable: one key, one slice per shard) is averaged a slice at a time into the first
  source's slices (`_ops.slicemean`).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Sequence

import numpy as np

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._bundle import objgraph as _objgraph
from objckpt._bundle import write as _bundlewrite
from objckpt._inspect import meta as _meta
from objckpt._ops import slicemean as _slicemean
from objckpt._ops.meanstream import BundleFile, Workspace, crc32c, stream_mean

__all__ = ["NON_WEIGHTS", "average_checkpoints", "check_non_weights", "check_sources",
           "is_optimizer_path", "normalized_weights", "stored_float"]

# What happens to what is not a weight (integers, counters, random-generator state, optimizer
# state): taken from the last source (default: the newest of a run, listed last), from the
# first, or left as the obj has it ("keep": `objckpt.average` only).
NON_WEIGHTS = ("last", "first", "keep")
# DataType enums of floating-point tensors, which are averaged.
_FLOATS = {1: "float32", 2: "float64", 14: "bfloat16", 19: "float16"}
_STRING = 7


def check_sources(sources, operation: str) -> list:
    """`sources` as a list of at least one source; a lone path or a non-sequence is refused."""
    if isinstance(sources, (str, bytes, os.PathLike)) or not isinstance(sources, Sequence):
        raise errors.InvalidArgumentError(
            f"{operation}: sources must be a list of sources (prefixes, directories, files, "
            f"Snapshots). Received: {_render.safe_text(repr(sources))[:200]}. Fix: pass a list, "
            f"e.g. {operation}(..., ['run/ckpt-8', 'run/ckpt-9']).")
    sources = list(sources)
    if not sources:
        raise errors.InvalidArgumentError(
            f"{operation}: sources is empty, so there is nothing to average. Fix: pass at least "
            "one source, e.g. ['run/ckpt-8', 'run/ckpt-9'].")
    return sources


def normalized_weights(weights, count: int) -> tuple[float, ...]:
    """The weights of `count` sources, divided by their sum: equal weights when None.

    Raises:
      InvalidArgumentError: not `count` weights, or one that is not a finite number >= 0, or
        weights whose sum is 0.
    """
    if weights is None:
        return (1.0 / count,) * count
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise errors.InvalidArgumentError(
            f"weights must be a list of {count} numbers, one per source. Received: "
            f"weights={_render.safe_text(repr(weights))[:200]}. Fix: pass e.g. "
            f"weights={[1] * count}, or None for equal weights.")
    weights = list(weights)
    if len(weights) != count:
        raise errors.InvalidArgumentError(
            f"weights must have one number per source: {count} sources but {len(weights)} "
            f"weights. Received: weights={_render.safe_text(repr(weights))[:200]}. Fix: pass "
            f"{count} weights, or None for equal weights.")
    values = []
    for k, weight in enumerate(weights):
        try:
            value = float(weight) if not isinstance(weight, bool) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise errors.InvalidArgumentError(
                f"weights[{k}] (of source {k}) must be a finite number >= 0. Received: "
                f"{_render.safe_text(repr(weight))[:80]}. Fix: pass finite, non-negative "
                "weights (they are divided by their sum).")
        values.append(value)
    total = math.fsum(values)
    if not total > 0:
        raise errors.InvalidArgumentError(
            f"weights sum to 0, so no source has any weight. Received: weights={values}. Fix: "
            "give at least one source a positive weight.")
    return tuple(v / total for v in values)


def check_non_weights(non_weights, *, keep: bool = True) -> str:
    """Validates `non_weights`: "last", "first", or (with a live obj) "keep"."""
    allowed = NON_WEIGHTS if keep else NON_WEIGHTS[:2]
    if isinstance(non_weights, str) and non_weights in allowed:
        return non_weights
    raise errors.InvalidArgumentError(
        f"non_weights must be one of {', '.join(map(repr, allowed))}. Received: "
        f"non_weights={_render.safe_text(repr(non_weights))[:80]}. It says where integer "
        "variables, counters, random-generator state and optimizer state come from, which are "
        "never averaged: the last source (default), the first"
        + (", or left as the obj has them." if keep else ".") + " Fix: pass one of them.")


def is_optimizer_path(path: str) -> bool:
    """Whether an object path (as people know it: through the network) is optimizer state:
    a slot, or a variable below an edge named `optimizer` (Keras, `tf.train.Checkpoint`)."""
    edges = path.split("/")
    return (_paths.OPTIMIZER_SLOT in edges or "optimizer" in edges or "_optimizer" in edges)


# --- the writer ---------------------------------------------------------------------------

def stored_float(enum: int):
    """The NumPy dtype of a checkpoint entry's float dtype enum (float16, bfloat16, float32,
    float64), or None for any other dtype."""
    return _numpy_dtype(enum) if enum in _FLOATS else None


def _numpy_dtype(enum: int):
    name = _FLOATS.get(enum) or _meta.dtype(enum).name
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name).newbyteorder("<")


class _Written:
    """One entry of the output (what `_bundle.write.index` reads of an item)."""

    __slots__ = ("crc", "dtype", "key", "offset", "shape", "size", "slices")

    def __init__(self, key, dtype: int, shape, offset: int, size: int, crc: int,
                 slices=()):
        self.key = key.encode("utf-8") if isinstance(key, str) else key
        self.dtype, self.shape, self.slices = dtype, list(shape), slices
        self.offset, self.size, self.crc = offset, size, crc


class _Reader:
    """One source checkpoint, read without TF: metadata, then entries' checked bytes."""

    def __init__(self, source, k: int, crc, buffer):
        self.given, self.k, self._crc = source, k, crc
        self.meta = _meta.read(source)
        if self.meta.index is None or self.meta.graph is None:
            what = self.meta.description or "a name-based (TF1 Saver) checkpoint"
            raise errors.UnsupportedFormatError(
                f"average_checkpoints: source {k} (`{_render.safe(str(source))}`) is {what}, "
                "not an object-based TF checkpoint, which is all the writer reads. Fix: load "
                "a model and call objckpt.average(model, sources) (it reads every format), "
                "then objckpt.save(model, out).", source=str(source))
        self.index = self.meta.index
        # checkpoint key -> path people know (through the network)
        self.shown = {v.key: v.shown for v in self.meta.values()}
        self.file = BundleFile(self.index, self.label, crc, buffer)

    @property
    def label(self) -> str:
        return f"source {self.k} (`{_render.safe(str(self.meta.prefix))}`)"

    def entry(self, key: str):
        return self.index.entries.get(key)

    def data(self, key: str):
        """The entry's bytes, their checksum checked (strings: as TF frames them)."""
        entry = self.index.entries[key]
        if entry.dtype == _STRING:
            _objgraph.read_strings(self.index, key)  # checks lengths and checksum
            return _objgraph.read_bytes(self.index, key, verify=False)
        out = np.empty(entry.size, np.uint8)
        for start, piece in self.file.pieces(key, np.uint8):
            out[start:start + piece.size] = piece
        return out


def _plan_writer(readers: list, taken_from: int):
    """[(key, "average" | "take")] for every entry of the first source; every problem among
    the sources (a key missing, another shape or dtype) raised before anything is written."""
    first = readers[0]
    jobs, problems = [], []
    for key, entry in first.index.entries.items():
        path = first.shown.get(key, _paths.path_of_key(key))
        averaged = (entry.dtype in _FLOATS and key in first.shown
                    and not is_optimizer_path(path))
        # the object graph is the first source's (the output is laid out like it)
        source = 0 if key == _bundle.OBJECT_GRAPH_KEY else taken_from
        others = readers if averaged else [readers[source]]
        for reader in others:
            if reader is first:
                continue
            found = reader.entry(key)
            if found is None:
                problems.append(f"{reader.label} has no `{_render.safe(path)}` (key "
                                f"`{_render.safe(key)}`)")
            elif tuple(found.shape) != tuple(entry.shape) or (
                    found.dtype != entry.dtype and not (averaged and found.dtype in _FLOATS)):
                problems.append(
                    f"{reader.label}: `{_render.safe(path)}` is "
                    f"{_meta.dtype(found.dtype).name}{tuple(found.shape)} but "
                    f"{_meta.dtype(entry.dtype).name}{tuple(entry.shape)} in "
                    f"{first.label}")
        for reader in others:
            found = reader.entry(key)
            if found is not None and found.slices:
                problems.extend(_slice_problems(reader, key, path))
        jobs.append((key, "average" if averaged else "take", source))
    if problems:
        raise errors.StructureMismatchError(
            f"average_checkpoints: the sources do not share one structure ({len(problems)} "
            "problem(s)); nothing was written:\n" + "\n".join(_render.listed(problems))
            + "\nFix: average checkpoints of one architecture; for renamed layers, load a model "
            "and call objckpt.average(model, sources, rules=...).", tuple(problems))
    return jobs


def _slice_problems(reader, key: str, path: str) -> list:
    """What keeps a source's partitioned entry from being read: a slice its index lists
    but does not hold, slices that do not cover the tensor once."""
    entry = reader.entry(key)
    stored = f"stored as {_meta.layout(entry.slices, entry.shape)}"
    lost = _slicemean.missing(reader.index, key)
    if lost:
        return [f"{reader.label}: `{_render.safe(path)}` ({stored}) lists {len(lost)} "
                f"slice(s) its index does not hold, e.g. {list(lost[0])}"]
    if not _slicemean.tiles(_slicemean.Layout(reader.index, key)):
        return [f"{reader.label}: the slices of `{_render.safe(path)}` ({stored}) do not "
                "cover it once"]
    return []


def average_checkpoints(sources, out_prefix, *, weights=None, non_weights: str = "last") -> dict:
    """Writes the weighted mean of N TF checkpoints as a checkpoint laid out like the first.

    Needs no model and no TensorFlow: the sources (object-based TF checkpoints: prefixes,
    directories (their newest intact checkpoint), `gs://`/`s3://` URLs) are read through
    their index and object graph, and the output has the first source's keys and object
    graph, so `tf.train.Checkpoint(...).read(out_prefix)` and `objckpt.restore` load it into
    the model the first source came from. Each floating-point variable of the network
    (float16, bfloat16, float32, float64) is the weighted mean of the sources' values,
    computed in float64 and rounded once into the first source's dtype; everything else
    (integer variables, counters such as `save_counter` and the optimizer's iterations,
    random-generator state, strings, and all optimizer state) is copied from one source:
    the last (`non_weights="last"`, default) or the first. Every source's metadata is
    checked first (same keys, shapes and dtypes as the first, for what is averaged or
    taken): nothing is written when one differs. Tensors are read (checksums checked) and
    written one at a time, a window of every source at a time: memory is about the largest
    tensor, whatever N.

    A partitioned variable (a sharded variable, a TF1 partitioned one: one key, stored in
    slices) is written in the first source's layout, as TF writes it (the whole tensor's
    entry listing the slices, one entry per slice): where every source has the same slices
    (in any order, whole counting as one slice), each slice's mean is streamed over the
    sources' matching slices; otherwise each output slice is gathered from the slices of
    each source that overlap it (a source's slice read whole, one at a time). Memory is
    about the largest slice either way, and the values are the same bits: each source's
    weighted values added in float64 in source order, rounded once. What is taken, not
    averaged, keeps its source's slices.

    The write is atomic: the data file and the index are written under temporary names and
    renamed into place, the index last.

    Args:
      sources: a list of N checkpoint prefixes, directories or URLs of one structure.
      out_prefix: the prefix to write (`out_prefix.index`, `out_prefix.data-00000-of-00001`).
      weights: N finite, non-negative numbers with a positive sum (divided by it); None:
        equal weights.
      non_weights: "last" or "first": the source non-weights are copied from.

    Returns:
      A dict: `prefix` (written), `averaged` and `taken` (object paths), `weights`
      (normalized), `sources` (each as read: a directory's resolved prefix).

    Raises:
      StructureMismatchError: the sources differ (names the source and the path).
      InvalidArgumentError: bad weights or non_weights.
      UnsupportedFormatError: a source is not an object-based TF checkpoint.
      CheckpointNotFoundError, CheckpointCorruptError: a source cannot be read.

    Example:
      >>> objckpt.average_checkpoints(["run/ckpt-8", "run/ckpt-9", "run/ckpt-10"], "avg/ckpt")
    """
    sources = check_sources(sources, "average_checkpoints")
    shares = normalized_weights(weights, len(sources))
    non_weights = check_non_weights(non_weights, keep=False)
    out_prefix = os.fspath(out_prefix)
    if "://" in out_prefix:
        raise errors.InvalidArgumentError(
            f"average_checkpoints writes a local prefix; received the URL "
            f"`{_render.safe(out_prefix)}`. Fix: write it locally, then copy the files.")
    if os.path.isdir(out_prefix):
        raise errors.InvalidArgumentError(
            f"average_checkpoints: `{_render.safe(out_prefix)}` is a directory. Fix: pass a "
            f"prefix inside it, e.g. `{_render.safe(os.path.join(out_prefix, 'ckpt'))}`.")
    crc = crc32c()
    workspace = Workspace()
    readers = [_Reader(source, k, crc, workspace.read_buffer())
               for k, source in enumerate(sources)]
    taken_from = len(readers) - 1 if non_weights == "last" else 0
    jobs = _plan_writer(readers, taken_from)
    directory = os.path.dirname(os.path.abspath(out_prefix))
    os.makedirs(directory, exist_ok=True)
    tag = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data_path = f"{out_prefix}.data-00000-of-00001"
    temp_data, temp_index = data_path + tag, f"{out_prefix}.index{tag}"
    written, averaged, taken = [], [], []
    first = readers[0]
    try:
        fd = os.open(temp_data, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            offset = 0
            for key, how, k in jobs:
                entry = first.entry(key)
                sliced = _sliced(readers if how == "average" else [readers[k]], key)
                if sliced:
                    offset = _write_sliced(fd, offset, written, readers, key, how, k, shares,
                                           workspace, crc)
                    (averaged if how == "average" else taken).extend(
                        [first.shown[key]] if key in first.shown else [])
                    continue
                if how == "average":
                    data = _averaged(readers, key, entry, shares, workspace)
                    averaged.append(first.shown[key])
                    value = _objgraph.masked_crc32c(crc(data)) if len(data) else 0
                else:
                    source = readers[k]
                    data = source.data(key)
                    value = source.entry(key).crc32c
                    if key in first.shown:
                        taken.append(first.shown[key])
                _write_all(fd, memoryview(data).cast("B"), offset)
                written.append(_Written(key, entry.dtype, entry.shape, offset, len(data), value))
                offset += len(data)
                del data
        finally:
            os.close(fd)
        with open(temp_index, "wb") as f:
            f.write(_bundlewrite.index(written, lambda b: crc(b)))
        os.replace(temp_data, data_path)
        os.replace(temp_index, out_prefix + ".index")
    finally:
        for reader in readers:
            reader.file.close()
        for path in (temp_data, temp_index):
            if os.path.exists(path):
                os.remove(path)
    return {"prefix": out_prefix, "averaged": tuple(averaged), "taken": tuple(taken),
            "weights": shares, "sources": tuple(str(r.meta.prefix) for r in readers),
            "taken_from": taken_from}


def _sliced(readers: list, key: str) -> bool:
    """Whether one of these sources stores `key` in slices."""
    return any(reader.entry(key).slices for reader in readers)


def _write_sliced(fd: int, offset: int, written: list, readers: list, key: str, how: str,
                  k: int, shares, workspace: Workspace, crc) -> int:
    """Writes `key`, which a source stores in slices, at `offset`; returns the next offset.

    Averaged: in the first source's layout (its slices, or whole), each slice the mean of
    the sources' values for it (streamed where every source has that slice, else gathered
    from the overlapping slices, `_ops.slicemean`). Taken: source `k`'s slices as they are.
    """
    entry = readers[0 if how == "average" else k].entry(key)
    out_layout = _slicemean.Layout(readers[0 if how == "average" else k].index, key)
    if how == "average":
        layouts = [_slicemean.Layout(reader.index, key) for reader in readers]
        dtypes = [_numpy_dtype(reader.entry(key).dtype) for reader in readers]
        dtype = dtypes[0]
        mean = (_slicemean.streamed_mean if _slicemean.same_layout(layouts)
                else _slicemean.resliced_mean)
        files = [reader.file for reader in readers]
    if entry.slices:  # the whole tensor's entry: its slices, no data (BundleWriter::AddSlice)
        written.append(_Written(key, entry.dtype, entry.shape, 0, 0, 0,
                                slices=tuple(extents for extents, _ in out_layout.parts)))
    for extents, read_key in out_layout.parts:
        span = _slicemean.bounds(extents, entry.shape)
        if how == "average":
            data = mean(files, layouts, span, shares, dtypes, dtype, workspace)
            value = _objgraph.masked_crc32c(crc(data)) if len(data) else 0
        else:
            data = np.empty(readers[k].file.entry_for(read_key).size, np.uint8)
            for start, piece in readers[k].file.pieces(read_key, np.uint8):
                data[start:start + piece.size] = piece
            value = readers[k].file.entry_for(read_key).crc32c
        name = _bundlewrite.slice_key(key, extents) if entry.slices else key
        _write_all(fd, memoryview(data).cast("B"), offset)
        written.append(_Written(name, entry.dtype, [stop - start for start, stop in span],
                                offset, len(data), value))
        offset += len(data)
        del data
    return offset


def _averaged(readers: list, key: str, entry, shares, workspace: Workspace):
    """The mean of `key` over the readers, as the bytes of the first's dtype (a view of the
    workspace's output buffer)."""
    dtype = _numpy_dtype(entry.dtype)
    streams = [(shares[k], reader.file.stream(key, _numpy_dtype(reader.entry(key).dtype),
                                              workspace))
               for k, reader in enumerate(readers) if shares[k]]
    size = int(np.prod(entry.shape, dtype=np.int64))
    out = workspace.out(size * dtype.itemsize)
    stream_mean(streams, size, out.view(dtype))
    return out


def _write_all(fd: int, view, offset: int) -> None:
    while len(view):
        done = os.pwrite(fd, view, offset)
        if done <= 0:
            raise OSError(f"pwrite wrote {done} bytes")
        view, offset = view[done:], offset + done
