"""Checkpoint averages without TensorFlow: weights, the streamed mean, and the writer.

`objckpt.average` (`_ops.average`) and `average_checkpoints` (here, what `objckpt average`
runs) share this module's pieces:

- `normalized_weights`: N finite, non-negative weights with a positive sum, divided by it;
- `stream_mean`: the weighted mean of one tensor of N checkpoint files (`BundleFile`), a
  window of elements at a time over every source, in a float64 window that stays in the
  cache, rounded once into the target dtype, each source's checksum extended as its bytes
  are read and checked at the end; a large tensor's next window is read ahead by a
  background thread while this one is added (memory: the output and a few small buffers);
- `Mean`: the same for whole values (other sources), accumulated in float64 one source at a
  time (memory: the float64 accumulator, the value being added, a small chunk);
- `average_checkpoints`: N TF checkpoints of one structure averaged into a new checkpoint
  laid out like the first (same keys, same object graph), read with the TF-free index and
  object-graph readers and written one tensor at a time in TF's bundle format
  (`_bundle.write`), so the command line's `objckpt average` runs without importing
  TensorFlow.
"""

from __future__ import annotations

import importlib
import math
import os
import queue
import threading
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

__all__ = ["NON_WEIGHTS", "BundleFile", "Mean", "Workspace", "average_checkpoints",
           "check_non_weights", "check_sources", "crc32c", "is_optimizer_path",
           "normalized_weights", "stored_float"]

# What happens to what is not a weight (integers, counters, random-generator state, optimizer
# state): taken from the last source (default: the newest of a run, listed last), from the
# first, or left as the obj has it ("keep": `objckpt.average` only).
NON_WEIGHTS = ("last", "first", "keep")
# Elements converted and added at a time (128 KiB of float64: stays in the cache).
CHUNK = 1 << 14
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


class Workspace:
    """Buffers reused from one tensor to the next (no fresh pages to fault in for each):
    the float64 accumulator and a small scratch chunk."""

    __slots__ = ("_acc", "_out", "_read", "_slots", "_window", "scratch")

    def __init__(self):
        self._acc = np.empty(0, np.float64)
        self.scratch = np.empty(CHUNK, np.float64)
        self._read = self._window = None
        self._out = np.empty(0, np.uint8)
        self._slots = (np.empty(0, np.uint8),) * 2

    def slots(self, nbytes: int):
        """Two buffers of at least `nbytes` for `stream_mean`'s reading ahead."""
        if self._slots[0].size < nbytes:
            self._slots = ()
            self._slots = (np.empty(nbytes, np.uint8), np.empty(nbytes, np.uint8))
        return self._slots

    def window(self):
        """(accumulator, scratch): WINDOW float64 elements each, for `stream_mean`."""
        if self._window is None:
            self._window = (np.empty(WINDOW, np.float64), np.empty(WINDOW, np.float64))
        return self._window

    def out(self, nbytes: int):
        """A reused output buffer of `nbytes` (the writer's: written out before the next)."""
        if self._out.size < nbytes:
            self._out = None
            self._out = np.empty(nbytes, np.uint8)
        return self._out[:nbytes]

    def read_buffer(self):
        """The one buffer every `BundleFile` of an average reads its pieces into."""
        if self._read is None:
            self._read = np.empty(READ_BYTES, np.uint8)
        return self._read

    def acc(self, size: int):
        if self._acc.size < size:
            self._acc = None  # the old one freed before the new one is made
            self._acc = np.empty(size, np.float64)
        return self._acc[:size]


class Mean:
    """The weighted mean of one tensor over N sources, streamed: `add(k, values, start)` for
    each source in turn (any float dtype NumPy or ml_dtypes reads; a whole tensor, or flat
    pieces of it at element offset `start`), then `result(dtype)`.

    The accumulator is float64: the first source's values times its weight fill it, the
    others' are converted and added `CHUNK` elements at a time, so memory is the
    accumulator (in `workspace`, reused, when given), the values being added and one small
    chunk.
    """

    __slots__ = ("_acc", "_first", "_scratch", "shape", "size", "weights")

    def __init__(self, shape, weights, workspace: Workspace | None = None):
        self.shape = tuple(int(d) for d in shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.weights = weights
        workspace = workspace or Workspace()
        self._acc, self._scratch = workspace.acc(self.size), workspace.scratch
        self._first = None  # the source whose values filled the accumulator

    def add(self, k: int, values, start: int = 0) -> None:
        """Adds `weights[k] * values` to the accumulator at flat offset `start`."""
        flat = np.asarray(values).reshape(-1)
        if start + flat.size > self.size:  # the callers check shapes from metadata first
            raise ValueError(f"{flat.size} values at {start} added to a mean of {self.shape}")
        weight = np.float64(self.weights[k])
        acc = self._acc[start:start + flat.size]
        if self._first is None or self._first == k:
            self._first = k  # (every element is converted exactly: floats fit float64)
            np.multiply(flat, weight, out=acc, dtype=np.float64)
            return
        for at in range(0, flat.size, CHUNK):
            stop = min(flat.size, at + CHUNK)
            part = self._scratch[:stop - at]
            np.multiply(flat[at:stop], weight, out=part, dtype=np.float64)
            acc[at:stop] += part

    def result(self, dtype, out=None):
        """The mean rounded once into `dtype` (a NumPy or ml_dtypes dtype): a new array, or
        written into `out` (C-contiguous, of this shape and dtype)."""
        out = np.empty(self.shape, dtype) if out is None else out
        flat = out.reshape(-1)
        if self._first is None:
            flat[...] = 0
            return out
        for start in range(0, self.size, CHUNK * 16):
            flat[start:start + CHUNK * 16] = self._acc[start:start + CHUNK * 16]
        return out


# Bytes read from a data file at a time, a multiple of every element size.
READ_BYTES = 8 << 20
# Elements of one tensor averaged at a time over every source (`stream_mean`): the float64
# window stays in the cache while each source's values for it are added.
WINDOW = 1 << 16
# A tensor of at least this many windows is read ahead by a background thread (the next
# window of every source read and checked while this one is added), when a window of every
# source takes at most PREFETCH_BYTES (two such slots are kept).
PREFETCH_WINDOWS = 2
PREFETCH_BYTES = 16 << 20


def stream_mean(streams: list, size: int, out) -> None:
    """Writes into `out` (flat, `size` elements of the target dtype) the weighted mean of
    `streams` ([(weight, Stream)], each giving its tensor's values in order), a window of
    WINDOW elements at a time: each source's values for the window are added into a float64
    accumulator that stays in the cache, then rounded once into `out`. A large tensor's
    windows are read ahead by a background thread (reads and checksums beside the sums).
    Each stream is finished (its whole checksum checked) at the end."""
    if not streams:
        out[...] = 0
        return
    acc, scratch = streams[0][1].workspace.window()
    weights = [np.float64(weight) for weight, _ in streams]
    # Equal weights that are a power of two (2, 4, 8 ... sources) over values of at most 32
    # bits: weighting each value is exact and commutes with every rounding of the sum (no
    # value comes near float64's limits), so the sum is weighted once, to the same bits.
    once = (len(set(weights)) == 1 and math.frexp(weights[0])[0] == 0.5
            and all(stream.itemsize <= 4 for _, stream in streams))
    windows = _windows([stream for _, stream in streams], size)
    try:
        for start, count, values in windows:
            total, part = acc[:count], scratch[:count]
            for i, weight in enumerate(weights):
                # converted exactly into float64 by a plain copy, then weighted: the bits of
                # `np.multiply(values, weight, dtype=np.float64)`, without its slow
                # buffered cast
                into = total if i == 0 else part
                into[...] = values(i)
                if not once:
                    np.multiply(into, weight, out=into)
                if i:
                    np.add(total, part, out=total)
            if once:
                np.multiply(total, weights[0], out=total)
            out[start:start + count] = total
    finally:
        windows.close()  # the reading thread stopped, whatever happened
    for _, stream in streams:
        stream.finish()


def _windows(streams: list, size: int):
    """(start, count, values) for each window: `values(i)` gives stream i's `count` values
    (valid until the next window), read here or by a background thread ahead."""
    itemsize = max(stream.itemsize for stream in streams)
    nbytes = len(streams) * (min(WINDOW, size) * itemsize + 64)  # each stream's 64-aligned
    if -(-size // WINDOW) < PREFETCH_WINDOWS or nbytes > PREFETCH_BYTES:
        for start in range(0, size, WINDOW):
            count = min(WINDOW, size - start)
            yield start, count, lambda i, count=count: streams[i].read(count)
        return
    free, full = queue.SimpleQueue(), queue.SimpleQueue()
    for slot in streams[0].workspace.slots(nbytes):
        free.put(slot)
    thread = threading.Thread(target=_read_ahead, args=(streams, size, free, full),
                              name="objckpt-average-reader", daemon=True)
    thread.start()
    try:
        for start in range(0, size, WINDOW):
            got = full.get()
            if isinstance(got, BaseException):
                raise got
            slot, views = got
            yield start, views[0].size, views.__getitem__
            free.put(slot)
    finally:
        free.put(None)  # stops the thread at its next window
        thread.join()


def _read_ahead(streams: list, size: int, free, full) -> None:
    """The background thread of `_windows`: each window of every stream read and checked
    into a free slot, handed over in order; an error handed over instead."""
    try:
        for start in range(0, size, WINDOW):
            slot = free.get()
            if slot is None:
                return
            count, at, views = min(WINDOW, size - start), 0, []
            for stream in streams:
                nbytes = count * stream.itemsize
                views.append(stream.read_into(slot[at:at + nbytes]))
                at += -(-nbytes // 64) * 64
            full.put((slot, views))
    except BaseException as err:  # noqa: BLE001 (raised by the caller)
        full.put(err)


class Stream:
    """One entry of a `BundleFile` read in order: `read(count)` elements at a time into the
    workspace's read buffer (valid until the next read), or `read_into(view)` a given
    buffer; `finish()` checks the checksum of everything read (with `check`), which must be
    the whole entry."""

    __slots__ = ("_crc", "_file", "check", "dtype", "entry", "itemsize", "key", "pos",
                 "workspace")

    def __init__(self, file, key: str, dtype, check: bool, workspace):
        self._file, self.key, self.check, self.workspace = file, key, check, workspace
        self.entry = file.entry_for(key)
        self.dtype = np.dtype(dtype)
        self.itemsize, self.pos, self._crc = self.dtype.itemsize, 0, 0

    def read(self, count: int):
        return self.read_into(self.workspace.read_buffer()[:count * self.itemsize])

    def read_into(self, view):
        """Fills `view` (uint8, a whole number of elements) with the next bytes, extends the
        checksum with them; returns them as values."""
        self._file.read_into(self.key, self.entry, view, self.pos)
        if self.check:
            self._crc = self._file.crc(view, self._crc)
        self.pos += view.nbytes
        return view.view(self.dtype)

    def finish(self) -> None:
        if self.pos != self.entry.size:
            raise self._file.corrupt(self.key, f"was read to {self.pos} of its "
                                               f"{self.entry.size} bytes")
        if self.check and _objgraph.masked_crc32c(self._crc) != self.entry.crc32c:
            raise self._file.corrupt(self.key, "its bytes do not match their checksum "
                                               "(crc32c)")


class BundleFile:
    """A local TF checkpoint's tensors read without TF, in pieces, through one small buffer:
    `pieces(key)` gives (element offset, values) of an entry in order, its checksum checked
    at the end (`check=False`: not, where it was checked before). `buffer` (READ_BYTES of
    uint8) may be shared by the files of one average, read one at a time."""

    def __init__(self, index, label: str, crc, buffer=None):
        self.index, self.label, self._crc = index, label, crc
        self._fds: dict = {}
        self._buffer = np.empty(READ_BYTES, np.uint8) if buffer is None else buffer

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _path(self, entry) -> str:
        return _bundle.shard_name(self.index.prefix, entry.shard, self.index.num_shards)

    def _fd(self, entry) -> int:
        fd = self._fds.get(entry.shard)
        if fd is None:
            fd = self._fds[entry.shard] = os.open(self._path(entry), os.O_RDONLY)
        return fd

    def corrupt(self, key: str, problem: str) -> errors.CheckpointCorruptError:
        err = _bundle.corrupt(self._path(self.index.entries[key]), key, problem)
        err.args = (f"{self.label}: {err.args[0]}", *err.args[1:])
        return err

    def crc(self, data, crc: int = 0) -> int:
        return self._crc(data, crc)

    def entry_for(self, key: str):
        """The index entry of `key`, refused where it cannot be read in pieces."""
        entry = self.index.entries[key]
        if entry.slices or entry.dtype == _STRING or key in self.index.beyond:
            raise self.corrupt(key, "cannot be read here (a partitioned, string or truncated "
                                    "entry)")
        return entry

    def read_into(self, key: str, entry, view, at: int) -> None:
        """Fills `view` (uint8) with the entry's bytes from byte `at` of it."""
        fd, got, want = self._fd(entry), 0, view.nbytes
        while got < want:
            n = os.preadv(fd, [memoryview(view[got:])], entry.offset + at + got)
            if n <= 0:
                raise self.corrupt(key, "is cut short (the data file is shorter than its "
                                        "index says)")
            got += n

    def stream(self, key: str, dtype, workspace, check: bool = True) -> Stream:
        return Stream(self, key, dtype, check, workspace)

    def pieces(self, key: str, dtype, check: bool = True, buffer=None):
        """(element offset, flat values of `dtype`) of entry `key`, READ_BYTES at a time;
        the values are a view of one buffer (this file's, or `buffer`), valid until the next
        piece."""
        entry = self.index.entries[key]
        if entry.slices or entry.dtype == _STRING or key in self.index.beyond:
            raise self.corrupt(key, "cannot be read here (a partitioned, string or truncated "
                                    "entry)")
        fd, item, crc, done = self._fd(entry), np.dtype(dtype).itemsize, 0, 0
        step = READ_BYTES - READ_BYTES % item
        buffer = self._buffer if buffer is None else buffer
        while done < entry.size:
            want = min(step, entry.size - done)
            view = buffer[:want]
            got = 0
            while got < want:
                n = os.preadv(fd, [memoryview(view[got:])], entry.offset + done + got)
                if n <= 0:
                    raise self.corrupt(key, "is cut short (the data file is shorter than its "
                                            "index says)")
                got += n
            if check:
                crc = self._crc(view, crc)
            yield done // item, view.view(dtype)
            done += want
        if check and _objgraph.masked_crc32c(crc) != entry.crc32c:
            raise self.corrupt(key, "its bytes do not match their checksum (crc32c)")

    def verify(self, keys, buffer=None) -> None:
        """Checks the checksums of these entries (reads every byte once), through `buffer`
        (READ_BYTES of uint8) when given."""
        for key in keys:
            for _ in self.pieces(key, np.uint8, buffer=buffer):
                pass


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


def crc32c(fallback: bool = True):
    """crc32c(buffer, crc=0) -> int, C and hardware accelerated where a package has it: the
    `crc32c` package's (which runs without the GIL, so a thread checking one buffer leaves
    another free to add), else google-crc32c's (which holds it), else objckpt's own NumPy one
    (slower; None when not `fallback`)."""
    try:
        fast = importlib.import_module("crc32c")
        extend = fast.crc32c
    except (ImportError, AttributeError):
        pass
    else:
        return lambda data, crc=0: extend(data, crc)
    try:
        import google_crc32c
    except ImportError:
        if not fallback:
            return None
        return lambda data, crc=0: _objgraph.crc32c(
            memoryview(data.reshape(-1).view(np.uint8)) if isinstance(data, np.ndarray)
            else data, crc)

    def checksum(data, crc: int = 0) -> int:
        if isinstance(data, np.ndarray):  # it takes read-only buffers only
            data = data.view()
            data.flags.writeable = False
        return google_crc32c.extend(crc, data)

    return checksum


class _Written:
    """One entry of the output (what `_bundle.write.index` reads of an item)."""

    __slots__ = ("crc", "dtype", "key", "offset", "shape", "size")

    def __init__(self, key: str, dtype: int, shape, offset: int, size: int, crc: int):
        self.key, self.dtype, self.shape = key.encode("utf-8"), dtype, list(shape)
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
        if entry.slices:
            raise errors.UnsupportedFormatError(
                f"average_checkpoints: {first.label} holds a partitioned variable (`"
                f"{_render.safe(key)}`), which the writer does not read. Fix: load a model and "
                "use objckpt.average.", source=str(first.meta.prefix))
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
        jobs.append((key, "average" if averaged else "take", source))
    if problems:
        raise errors.StructureMismatchError(
            f"average_checkpoints: the sources do not share one structure ({len(problems)} "
            "problem(s)); nothing was written:\n" + "\n".join(_render.listed(problems))
            + "\nFix: average checkpoints of one architecture; for renamed layers, load a model "
            "and call objckpt.average(model, sources, rules=...).", tuple(problems))
    return jobs


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
