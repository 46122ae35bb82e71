"""An undo log: the values variables had before an operation assigned them, kept on disk.

An operation that assigns one variable at a time (`objckpt.average` of a large model, to keep
its memory about the largest tensor) stays all or nothing with it: before a variable is
assigned, `record` takes its current value to append to an anonymous temporary file
(`tempfile.TemporaryFile`: no name, gone when closed or when the process ends); on any
failure after the first assignment, `undo` gives every recorded variable its old value back,
bit for bit, one at a time.

The log costs disk (one copy of what was assigned), not memory: a value is written from what
the variable's `numpy()` gives and read back one at a time. TF's `Variable.numpy()` copies
the buffer; streamed restores and `average` pass a view of it instead (`Viewed`: the read
value's NumPy view, which keeps that buffer alive and unchanged while it is held, even when
the variable is assigned a new tensor). A large value is written by a background thread while the caller computes the next
one (one write at most in flight: one old value held beyond the variables; `undo` puts it
back from memory when its write failed), to a second file opened for direct I/O where the
file system allows it (through one aligned staging buffer): the log is written at the
disk's speed and neither fills the page cache nor waits on its write-back. With
`background=False` (a streamed restore, whose memory target leaves no room for a second old
value) the large value is written the same way before `record` returns, so nothing beyond the
variables and the staging buffer is held. No TensorFlow
here: a variable is anything with `numpy()` and `assign(value, read_value=False)`.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading

import numpy as np

from objckpt import errors
from objckpt._base import render as _render

__all__ = ["ASYNC_BYTES", "LogFailed", "UndoLog", "Viewed", "say_unchanged", "undo_after"]

# Values at least this large are written by a background thread while the caller goes on,
# to the direct-I/O file; smaller ones at once, through the page cache.
ASYNC_BYTES = 1 << 20
# Direct I/O: offsets, lengths and the staging buffer's address are multiples of this; the
# staging buffer's size.
_ALIGN = 4096
_STAGE = 8 << 20


class LogFailed(Exception):
    """The log could not be written (its `__cause__`: the OSError). Every variable recorded
    can still be undone (the one whose write failed, from memory)."""


class UndoLog:
    """Old values of variables, appended to anonymous temporary files.

    Raises OSError from the constructor when no temporary file can be made (a read-only or
    missing temporary directory); `record` raises `LogFailed` when an earlier write failed
    (no space left; with `background=False`, when its own write failed): call `undo` then.
    `background`: large values written by a background thread (True) or before `record`
    returns (False: no old value held beyond the variable's own buffer).
    """

    def __init__(self, directory: str | None = None, background: bool = True):
        self._small = tempfile.TemporaryFile(dir=directory)
        try:
            self._large = tempfile.TemporaryFile(dir=directory)
        except BaseException:
            self._small.close()
            raise
        self._direct = _set_direct(self._large.fileno(), True)
        self._stage = None  # the aligned staging buffer of direct writes (made on first use)
        self._ends = {self._small.fileno(): 0, self._large.fileno(): 0}
        # [name, variable, fd, offset, dtype, shape, held]: `held` is the old value itself
        # while its write is in flight, when the write failed, or for values without
        # fixed-size bytes (strings: small), else None (read back from `fd` at `offset`)
        self._entries: list = []
        self._pending = None  # (thread, entry, [error]) of the write in flight
        self._background = background
        self._closing = False  # set by `close`: the write in flight may stop (not needed)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes written (direct writes padded to whole blocks)."""
        return sum(self._ends.values())

    def record(self, variable, name: str = "") -> None:
        """Takes `variable`'s current value to append (`name`: how `undo` names it); call
        it before assigning the variable. Raises `LogFailed` when an earlier write failed."""
        self._settle(raising=True)
        value = np.asarray(variable.numpy())
        # strings and structured values kept as they are; bfloat16 and float8 (ml_dtypes'
        # types, of kind "V" with no fields) are plain bytes, written like any number
        if value.dtype.hasobject or value.dtype.kind in "SU" or value.dtype.fields:
            self._entries.append([name, variable, None, None, value.dtype, value.shape,
                                  value.copy()])
            return
        if not value.flags.c_contiguous:
            value = value.copy(order="C")  # (np.ascontiguousarray makes a scalar 1-d)
        raw = memoryview(value.reshape(-1).view(np.uint8))
        if raw.nbytes < ASYNC_BYTES:  # small: written now (a thread costs more)
            fd = self._small.fileno()
            offset = self._ends[fd]
            try:
                _write_all(fd, raw, offset)
            except OSError as err:
                raise LogFailed(f"the undo log could not be written: {err}") from err
            self._ends[fd] = offset + raw.nbytes
            self._entries.append([name, variable, fd, offset, value.dtype, value.shape, None])
            return
        fd = self._large.fileno()
        offset = self._ends[fd]
        self._ends[fd] = offset + -(-raw.nbytes // _ALIGN) * _ALIGN  # the next one aligned
        entry = [name, variable, fd, offset, value.dtype, value.shape, value]
        failure: list = []
        if not self._background:  # written now: the old value is not held past `record`
            self._write_large(raw, offset, failure)
            if failure:
                self._ends[fd] = offset  # (not recorded: the caller has not assigned it)
                if not isinstance(failure[0], Exception):
                    raise failure[0]  # KeyboardInterrupt: as it came
                raise LogFailed(f"the undo log could not be written: {failure[0]}") \
                    from failure[0]
            entry[6] = None
            self._entries.append(entry)
            return
        self._entries.append(entry)
        thread = threading.Thread(target=self._write_large, args=(raw, offset, failure),
                                  name="objckpt-undo-log", daemon=True)
        self._pending = (thread, entry, failure)
        thread.start()

    def keep(self, variable, value, name: str = "") -> None:
        """Records `value`, `variable`'s current value held elsewhere (read where the
        variable lives, e.g. on a parameter server, and unchanged by its assignment):
        nothing written here; `undo` assigns it back."""
        self._entries.append([name, variable, None, None, None, None, value])

    def _write_large(self, raw, offset: int, failure: list) -> None:
        """The background thread: `raw` at `offset` of the large file, direct where it can
        be (falls back to the page cache where the file system refuses a direct write)."""
        fd = self._large.fileno()
        try:
            if self._direct:
                try:
                    self._write_direct(fd, raw, offset)
                    return
                except OSError as err:
                    if err.errno != errno.EINVAL:  # (EINVAL: refused, not failed)
                        raise
                    self._direct = _set_direct(fd, False)  # written again, plainly
            _write_all(fd, raw, offset)
        except BaseException as err:  # noqa: BLE001 (the caller raises it)
            failure.append(err)

    def _write_direct(self, fd: int, raw, offset: int) -> None:
        if self._stage is None:
            block = np.empty(_STAGE + _ALIGN, np.uint8)
            start = (-block.ctypes.data) % _ALIGN
            self._stage = block[start:start + _STAGE]
        source = np.frombuffer(raw, np.uint8)
        for done in range(0, source.size, _STAGE):
            if self._closing:  # the log is being dropped: the rest is never read
                return
            count = min(_STAGE, source.size - done)
            self._stage[:count] = source[done:done + count]
            padded = -(-count // _ALIGN) * _ALIGN  # the tail's padding: never read back
            _write_all(fd, memoryview(self._stage[:padded]), offset + done)

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
        entry[6] = None  # on disk: the old buffer is let go

    def undo(self) -> list:
        """Gives every recorded variable its old value back, the last recorded first, one at
        a time; returns `[(name, exception)]` for those that could not be (none: all were)."""
        failed = []
        self._settle(raising=False)
        if self._direct:  # read back through the page cache (no alignment needed)
            self._direct = _set_direct(self._large.fileno(), False)
        for name, variable, fd, offset, dtype, shape, held in reversed(self._entries):
            try:
                if held is not None:
                    value = held
                else:
                    value = np.empty(shape, dtype)
                    _read_all(fd, memoryview(value.reshape(-1).view(np.uint8)), offset)
                variable.assign(value, read_value=False)
                del value
            except BaseException as err:  # noqa: BLE001 (every other one still undone)
                failed.append((name, err))
        self._entries.clear()
        return failed

    def close(self) -> None:
        """Stops the write in flight (at its next staged piece: the log is not read again),
        drops every entry and deletes the files."""
        self._closing = True
        try:
            self._settle(raising=False)
        finally:
            self._entries.clear()
            self._small.close()
            self._large.close()


def _set_direct(fd: int, on: bool) -> bool:
    """Turns direct I/O on or off for `fd`; whether it is on (False where the platform or
    the file system has none: tmpfs, macOS, Windows)."""
    direct = getattr(os, "O_DIRECT", 0)
    try:
        import fcntl
    except ImportError:
        return False
    if not direct:
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | direct) if on else (flags & ~direct))
    except OSError:
        return False
    return on


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


class Viewed:
    """A variable as the undo log takes it: `numpy()` a view of its buffer (a CPU
    variable's: its read value's NumPy view, where `variable.numpy()` copies), so that
    logging an old value holds no copy of it; `assign` the variable's."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        self.variable = variable

    def numpy(self):
        return np.asarray(self.variable.read_value())

    def assign(self, value, read_value: bool = False) -> None:
        self.variable.assign(value, read_value=read_value)


def undo_after(log: UndoLog, err, count: int, operation: str, holding: str,
               fix: str) -> None:
    """After `err` (None: none) ended an operation that had assigned `count` variables: every
    variable in `log` gets its old value back, the log is closed, and err's message says
    that nothing was changed. Raises an ObjckptError naming the variables that could not be
    put back (`holding`: what they hold then; `fix`: what to do)."""
    try:
        failed = log.undo()
    finally:
        log.close()
    if failed:
        names = ", ".join(f"`{_render.safe(name)}`" for name, _ in failed[:10])
        raise errors.ObjckptError(
            f"{operation} failed ({type(err).__name__}: "
            f"{_render.safe_text(str(err))[:300]}) after assigning {count} variable(s), "
            f"and {len(failed)} of them could not be given their old values back: "
            f"{names}. They hold {holding}; every other variable is as it was. Fix: {fix}",
            obj=failed[0][0]) from failed[0][1]
    if err is not None and not isinstance(err, LogFailed):
        say_unchanged(err, count, operation)


def say_unchanged(err, count: int, operation: str) -> None:
    """Says in err's message (before its fix), or a note of it, that nothing was changed."""
    text = (f"Nothing was changed: the {count} variable(s) {operation} had assigned were "
            "given their old values back." if count else "Nothing was changed.")
    if isinstance(err, errors.ObjckptError) and err.args and isinstance(err.args[0], str):
        message = err.args[0]
        if not count and "othing was changed" in message:
            return
        at = message.rfind("Fix:")
        message = (f"{message[:at]}{text} {message[at:]}" if at > 0
                   else f"{message.rstrip()} {text}")
        err.args = (message, *err.args[1:])
    elif hasattr(err, "add_note"):  # Python 3.11
        err.add_note(f"{operation}: {text}")
