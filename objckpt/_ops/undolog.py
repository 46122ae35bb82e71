"""An undo log: the values variables had before an operation assigned them, kept on disk.

An operation that assigns one variable at a time (`objckpt.average` of a large model, to keep
its memory about the largest tensor) stays all or nothing with it: before a variable is
assigned, `record` takes its current value to append to an anonymous temporary file
(`tempfile.TemporaryFile`: no name, gone when closed or when the process ends); on any
failure after the first assignment, `undo` gives every recorded variable its old value back,
bit for bit, one at a time.

The log costs disk (one copy of what was assigned), not memory: a value is written from the
variable's own buffer (a CPU variable's `numpy()` is a view of it, which also keeps that
buffer alive and unchanged when the variable is assigned a new tensor) and read back one at
a time. The write runs in a background thread while the caller computes the next value; one
write at most is in flight (one old value held beyond the variables), and `undo` puts that
one back from memory when its write failed. No TensorFlow here: a variable is anything with
`numpy()` and `assign(value, read_value=False)`.
"""

from __future__ import annotations

import os
import tempfile
import threading

import numpy as np

__all__ = ["ASYNC_BYTES", "LogFailed", "UndoLog"]

# Values at least this large are written by a background thread while the caller goes on;
# smaller ones at once.
ASYNC_BYTES = 1 << 20


class LogFailed(Exception):
    """The log could not be written (its `__cause__`: the OSError). Every variable recorded
    can still be undone (the one whose write failed, from memory)."""


class UndoLog:
    """Old values of variables, appended to an anonymous temporary file.

    Raises OSError from the constructor when no temporary file can be made (a read-only or
    missing temporary directory); `record` raises `LogFailed` when an earlier write failed
    (no space left): call `undo` then.
    """

    def __init__(self, directory: str | None = None):
        self._file = tempfile.TemporaryFile(dir=directory)
        self._fd = self._file.fileno()
        self._end = 0
        # [name, variable, offset, dtype, shape, held]: `held` is the old value itself while
        # its write is in flight, when the write failed, or for values without fixed-size
        # bytes (strings: small), else None (read back from `offset`)
        self._entries: list = []
        self._pending = None  # (thread, entry, [error]) of the write in flight

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._end

    def record(self, variable, name: str = "") -> None:
        """Takes `variable`'s current value to append (`name`: how `undo` names it); call
        it before assigning the variable. Raises `LogFailed` when an earlier write failed."""
        self._settle(raising=True)
        value = np.asarray(variable.numpy())
        if value.dtype.hasobject or value.dtype.kind in "SUV":
            self._entries.append([name, variable, None, value.dtype, value.shape, value.copy()])
            return
        if not value.flags.c_contiguous:
            value = value.copy(order="C")  # (np.ascontiguousarray makes a scalar 1-d)
        raw = memoryview(value.reshape(-1).view(np.uint8))
        entry = [name, variable, self._end, value.dtype, value.shape, value]
        if raw.nbytes < ASYNC_BYTES:  # small: written now (a thread costs more)
            try:
                _write_all(self._fd, raw, entry[2])
            except OSError as err:
                raise LogFailed(f"the undo log could not be written: {err}") from err
            entry[5] = None
            self._entries.append(entry)
            self._end += raw.nbytes
            return
        self._entries.append(entry)
        self._end += raw.nbytes
        failure: list = []
        thread = threading.Thread(target=_write_into, args=(self._fd, raw, entry[2], failure),
                                  name="objckpt-undo-log", daemon=True)
        self._pending = (thread, entry, failure)
        thread.start()

    def _settle(self, raising: bool) -> None:
        """Waits for the write in flight; its entry then reads back from disk, or keeps its
        value in memory when the write failed (`LogFailed` when `raising`)."""
        if self._pending is None:
            return
        thread, entry, failure = self._pending
        thread.join()
        self._pending = None
        if failure:
            if raising:
                raise LogFailed(f"the undo log could not be written: {failure[0]}") \
                    from failure[0]
            return
        entry[5] = None  # on disk: the old buffer is let go

    def undo(self) -> list:
        """Gives every recorded variable its old value back, the last recorded first, one at
        a time; returns `[(name, exception)]` for those that could not be (none: all were)."""
        failed = []
        self._settle(raising=False)
        for name, variable, offset, dtype, shape, held in reversed(self._entries):
            try:
                if held is not None:
                    value = held
                else:
                    value = np.empty(shape, dtype)
                    _read_all(self._fd, memoryview(value.reshape(-1).view(np.uint8)), offset)
                variable.assign(value, read_value=False)
                del value
            except BaseException as err:  # noqa: BLE001 (every other one still undone)
                failed.append((name, err))
        self._entries.clear()
        return failed

    def close(self) -> None:
        """Waits for the write in flight, drops every entry and deletes the file."""
        try:
            self._settle(raising=False)
        finally:
            self._entries.clear()
            self._file.close()


def _write_into(fd: int, view, offset: int, failure: list) -> None:
    """`_write_all` in the background thread; its error kept in `failure`."""
    try:
        _write_all(fd, view, offset)
    except BaseException as err:  # noqa: BLE001 (the caller raises it)
        failure.append(err)


def _write_all(fd: int, view, offset: int) -> None:
    while len(view):
        done = os.pwrite(fd, view, offset)
        if done <= 0:
            raise OSError(f"pwrite wrote {done} bytes")
        view, offset = view[done:], offset + done


def _read_all(fd: int, view, offset: int) -> None:
    got = 0
    while got < len(view):
        count = os.preadv(fd, [view[got:]], offset + got)
        if count <= 0:
            raise OSError(f"the undo log is {offset + got} bytes long, shorter than it was "
                          "written")
        got += count
