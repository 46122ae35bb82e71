"""An exclusive, crash-released lock on a directory of checkpoints (no TF import).

The lock is an advisory `flock` on `<directory>/.objckpt.lock`: the kernel
drops it when the holder exits for any reason (SIGKILL included), so a crash
never leaves a stale lock behind. The file holds the holder's pid and host,
for the error message of whoever is refused.
"""

from __future__ import annotations

import os
import socket

from objckpt import errors

LOCK_FILE = ".objckpt.lock"

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
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_holder(fd)
            os.close(fd)
            raise errors.DirectoryLockedError(
                f"Checkpoint directory `{self.directory}` is in use by another writer "
                f"({holder}): expected to hold its lock `{self.path}` alone. Nothing was "
                "written or changed. Fix: stop the other training run, or give this run its "
                "own directory.", directory=self.directory, holder=holder) from err
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        _HELD[key] = self

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
