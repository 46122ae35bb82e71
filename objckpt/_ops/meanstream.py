"""The streamed weighted mean of one tensor over N checkpoint files, without TensorFlow.

- `stream_mean`: the weighted mean of one tensor of N checkpoint files (`BundleFile`), a
  window of elements at a time over every source, in a float64 window that stays in the
  cache, rounded once into the target dtype, each source's checksum extended as its bytes
  are read and checked at the end; a large tensor's next window is read (and checked) ahead
  by a background thread while this one is added (memory: the output and a few small
  buffers);
- `Mean`: the same for whole values (other sources), accumulated in float64 one source at a
  time (memory: the float64 accumulator, the value being added, a small chunk);
- `Workspace`: the buffers both reuse from one tensor to the next;
- `crc32c`: the fastest checksum installed (the `crc32c` package's runs without the GIL).

`objckpt.average` (`_ops.average`) and the model-free writer (`_ops.averaging`) use them.
"""

from __future__ import annotations

import importlib
import math
import os
import queue
import threading

import numpy as np

from objckpt import errors
from objckpt._bundle import index as _bundle
from objckpt._bundle import objgraph as _objgraph

__all__ = ["CHUNK", "PREFETCH_BYTES", "PREFETCH_WINDOWS", "READ_BYTES", "WINDOW", "BundleFile",
           "Mean", "Stream", "Workspace", "crc32c", "stream_mean"]

# Elements converted and added at a time (128 KiB of float64: stays in the cache).
CHUNK = 1 << 14
_STRING = 7  # the DataType enum of strings (not read in pieces)


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

    def _entry(self, key):
        """The index entry of `key`: a tensor name, or (name, extents) for one slice of a
        partitioned tensor."""
        return self.index.sliced[key] if isinstance(key, tuple) else self.index.entries[key]

    def corrupt(self, key, problem: str) -> errors.CheckpointCorruptError:
        shown = f"{key[0]} (slice {list(key[1])})" if isinstance(key, tuple) else key
        err = _bundle.corrupt(self._path(self._entry(key)), shown, problem)
        err.args = (f"{self.label}: {err.args[0]}", *err.args[1:])
        return err

    def crc(self, data, crc: int = 0) -> int:
        return self._crc(data, crc)

    def entry_for(self, key):
        """The index entry of `key` (a tensor name, or (name, extents) for one slice of a
        partitioned tensor), refused where it cannot be read in pieces."""
        entry = self._entry(key)
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
        entry = self.entry_for(key)
        item, crc, done = np.dtype(dtype).itemsize, 0, 0
        step = READ_BYTES - READ_BYTES % item
        buffer = self._buffer if buffer is None else buffer
        while done < entry.size:
            want = min(step, entry.size - done)
            view = buffer[:want]
            self.read_into(key, entry, view, done)
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
