"""An undo log: the values variables had before an operation assigned them, kept on disk.

An operation that assigns one variable at a time (`objckpt.average` of a large model, to keep
its memory about the largest tensor) stays all or nothing with it: before a variable is
assigned, `record` appends its current value to an anonymous temporary file
(`tempfile.TemporaryFile`: no name, gone when closed or when the process ends); on any
failure after the first assignment, `undo` gives every recorded variable its old value back,
bit for bit, one at a time. The log costs disk (one copy of what was assigned), not memory:
a value is written from the variable's own buffer (a CPU variable's `numpy()` is a view of
it) and read back one at a time. No TensorFlow here: a variable is anything with `numpy()`
and `assign(value, read_value=False)`.
"""

from __future__ import annotations

import errno
import os
import tempfile

import numpy as np

__all__ = ["LogFailed", "UndoLog"]


class LogFailed(Exception):
    """The log could not be written (its `__cause__`: the OSError): the variable being
    recorded was not assigned, and every variable recorded before it can still be undone."""


class UndoLog:
    """Old values of variables, appended to an anonymous temporary file.

    Raises OSError from the constructor when no temporary file can be made (a read-only or
    missing temporary directory); `record` raises `LogFailed` when one cannot be written
    (no space left).
    """

    def __init__(self, nbytes: int = 0, directory: str | None = None):
        """Makes the file and reserves `nbytes` of disk for it (what will be recorded, as far
        as known: writes into reserved blocks are faster, and a disk without that much room
        fails here, before anything is assigned)."""
        self._file = tempfile.TemporaryFile(dir=directory)
        self._fd = self._file.fileno()
        self._end = 0
        try:
            if nbytes > 0 and hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(self._fd, 0, nbytes)
                except OSError as err:
                    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                        raise
                    # a file system that cannot reserve (EOPNOTSUPP, EINVAL): written as it is
        except BaseException:
            self._file.close()
            raise
        # (name, variable, offset, dtype, shape); offset None: `dtype` is the old value
        # itself, for values without fixed-size bytes (strings: small, held in memory)
        self._entries: list = []

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._end

    def record(self, variable, name: str = "") -> None:
        """Appends `variable`'s current value (`name`: how `undo` names it); call it before
        assigning the variable."""
        value = np.asarray(variable.numpy())
        if value.dtype.hasobject or value.dtype.kind in "SUV":
            self._entries.append((name, variable, None, value.copy(), value.shape))
            return
        if not value.flags.c_contiguous:
            value = value.copy(order="C")  # (np.ascontiguousarray makes a scalar 1-d)
        raw = memoryview(value.reshape(-1).view(np.uint8))
        offset = self._end
        try:
            _write_all(self._fd, raw, offset)
        except OSError as err:
            raise LogFailed(f"the undo log could not be written: {err}") from err
        self._end = offset + raw.nbytes
        self._entries.append((name, variable, offset, value.dtype, value.shape))

    def undo(self) -> list:
        """Gives every recorded variable its old value back, the last recorded first, one at
        a time; returns `[(name, exception)]` for those that could not be (none: all were)."""
        failed = []
        for name, variable, offset, dtype, shape in reversed(self._entries):
            try:
                if offset is None:
                    value = dtype  # held: the old value itself
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
        self._entries.clear()
        self._file.close()


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
