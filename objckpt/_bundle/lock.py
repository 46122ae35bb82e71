"""An exclusive, crash-released lock on a directory of checkpoints (no TF import).

The lock is an advisory `flock` on `<directory>/.objckpt.lock`: the kernel
drops it when the holder exits for any reason (SIGKILL included), so a crash
never leaves a stale lock behind. The file holds the holder's pid and host,
for the error message of whoever is refused.
"""

from __future__ import annotations

import errno
import os
import socket
import stat

from objckpt import errors

LOCK_FILE = ".objckpt.lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

# realpath -> the DirectoryLock of this process that holds it.
_HELD: dict = {}

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, no lock
    fcntl = None


class DirectoryLock:
    """Holds the lock of one directory until `release()` (or process exit)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the lock at once or raises `DirectoryLockedError`.

        Within one process a newer lock on the same directory takes it over
        from an older one (say, of a callback whose `fit` raised and never
        reached `on_train_end`); the older one then reports `held` False.
        """
        if self._fd is not None or fcntl is None:
            return
        key = os.path.realpath(self.directory)
        other = _HELD.get(key)
        if other is not None and other is not self and other._fd is not None:
            self._fd, other._fd = other._fd, None
            _HELD[key] = self
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
            # Untrusted directory: never follow a link or block on a FIFO named like the lock.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK, 0o644)
        except OSError as err:
            raise self._write_error("creating or opening its lock file", err) from err
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "the lock file is not a regular file (delete it)")
        except OSError as err:
            os.close(fd)
            raise self._write_error("opening its lock file", err) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)  # locking unsupported (some network file systems), not "in use"
                raise self._write_error("locking its lock file", err) from err
            holder = _read_holder(fd)
            os.close(fd)
            raise errors.DirectoryLockedError(
                f"Checkpoint directory `{self.directory}` is in use by another writer "
                f"({holder}): expected to hold its lock `{self.path}` alone. Nothing was "
                "written or changed. Fix: stop the other training run, or give this run its "
                "own directory.", directory=self.directory, holder=holder) from err
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        except OSError as err:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise self._write_error("writing its lock file", err) from err
        self._fd = fd
        _HELD[key] = self

    def _write_error(self, doing: str, err: OSError) -> errors.CheckpointWriteError:
        cause = err.strerror or str(err)
        if err.filename is not None:
            cause += f" (`{err.filename}`)"
        return errors.CheckpointWriteError(
            f"Cannot write to checkpoint directory `{self.directory}`: {doing} `{self.path}` "
            f"failed: {cause}. Expected a directory this process can create and replace "
            "files in. Nothing was written or changed. Fix: make the directory writable "
            "(e.g. `chmod u+w`), mount it read-write, or pass another directory; with "
            "on_error='warn' training goes on without saving (resuming from what can be "
            "read).", source=self.directory)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        key = os.path.realpath(self.directory)
        if _HELD.get(key) is self:
            del _HELD[key]
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
