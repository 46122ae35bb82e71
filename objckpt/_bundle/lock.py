"""An exclusive, crash-released lock on a directory of checkpoints (no TF import).

The lock is an advisory `flock` on `<directory>/.objckpt.lock`: the kernel
drops it when the holder exits for any reason (SIGKILL included), so a crash
never leaves a stale lock behind. The file holds the holder's pid and host,
for the error message of whoever is refused.
"""

from __future__ import annotations

import atexit
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

    def refresh(self) -> None:
        """Nothing to renew: the kernel holds a local lock until its holder exits."""

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


# --- remote directories (`gs://`, `s3://`) ----------------------------------------------------

# How long a remote lock holds without being renewed: its holder renews it every
# RENEW_SECONDS (a daemon thread) and at each commit; a lock not renewed for this long, or
# one whose holder was a process on this host that no longer runs, may be taken over (a
# preempted TPU job resumes elsewhere within LEASE_SECONDS).
LEASE_SECONDS = 120.0
RENEW_SECONDS = 30.0
_LOCK_LIMIT = 4096  # bytes of a lock object read


def now() -> float:
    """The clock of remote leases (tests replace it)."""
    import time

    return time.time()


class RemoteLock:
    """The lock of a remote directory: the object `<directory>/.objckpt.lock`, created only
    if absent (a GCS generation or S3 If-None-Match precondition), holding its holder (pid,
    host, a random id) and when its lease ends. Object stores cannot drop a lock when its
    holder dies, so a lock is taken over (a conditional replace of the version read) when its
    lease ended or its holder was a process on this host that no longer runs; each commit
    renews the lease (`refresh`) and finds out if it was taken over meanwhile."""

    def __init__(self, directory: str):
        import threading

        self.directory = directory.rstrip("/")
        self.path = self.directory + "/" + LOCK_FILE
        self._version = None
        self._id = os.urandom(8).hex()
        self._mutex = threading.Lock()  # renewals (the daemon thread) and commits
        self._stop = None

    @property
    def held(self) -> bool:
        return self._version is not None

    def _record(self) -> bytes:
        return (f"pid {os.getpid()} on {socket.gethostname()}, id {self._id}, lease until "
                f"{now() + LEASE_SECONDS:.3f}\n").encode()

    def acquire(self) -> None:
        """Takes the lock or raises `DirectoryLockedError` (`CheckpointWriteError`: the store
        failed). A newer lock of this process takes it over from an older one, as on disk."""
        from objckpt._bundle import remote as _remote

        if self._version is not None:
            return
        other = _HELD.get(self.path)
        if other is not None and other is not self and other._version is not None:
            with other._mutex:
                self._version, other._version, self._id = other._version, None, other._id
            if other._stop is not None:
                other._stop.set()
            _HELD[self.path] = self
            self._start_renewing()
            return
        try:
            try:
                self._version = _remote.write_bytes(self.path, self._record(),
                                                    expect=_remote.ABSENT) or "?"
            except _remote.PreconditionFailed:
                try:
                    data, version = _remote.read_versioned(self.path, _LOCK_LIMIT)
                except (FileNotFoundError, ValueError):  # released meanwhile, or not ours
                    data, version = b"", None
                holder = data.decode("utf-8", "replace").strip() or "holder unknown"
                if version is None or not _stale(holder):
                    raise errors.DirectoryLockedError(
                        f"Checkpoint directory `{self.directory}` is in use by another writer "
                        f"({_render_holder(holder)}): expected to hold its lock `{self.path}` "
                        "alone. Nothing was written or changed. Fix: stop the other training "
                        "run, or give this run its own directory; a lock whose holder died "
                        f"is taken over once its lease ends ({LEASE_SECONDS:.0f} s after its "
                        "last renewal), or at once from the same host.",
                        directory=self.directory, holder=_render_holder(holder)) from None
                try:
                    self._version = _remote.write_bytes(self.path, self._record(),
                                                        expect=version) or "?"
                except _remote.PreconditionFailed:
                    raise errors.DirectoryLockedError(
                        f"Checkpoint directory `{self.directory}` was taken by another writer "
                        f"while this one took over its stale lock `{self.path}`. Nothing was "
                        "written or changed. Fix: run one writer per directory.",
                        directory=self.directory, holder="another writer") from None
        except errors.ObjckptError:
            raise
        except OSError as err:
            raise errors.CheckpointWriteError(
                f"Cannot write to checkpoint directory `{self.directory}`: creating its lock "
                f"`{self.path}` failed: {err}. Expected a bucket this process can write "
                "objects in. Nothing was written or changed. Fix: check the URL, the "
                "credentials and the network; with on_error='warn' training goes on without "
                "saving.", source=self.directory) from err
        _HELD[self.path] = self
        self._start_renewing()

    def _start_renewing(self) -> None:
        """A daemon thread renews the lease every RENEW_SECONDS until `release`; a renewal
        that fails is left to the next commit, whose `refresh` raises if it was taken over."""
        import threading

        stop = self._stop = threading.Event()

        def renew():
            while not stop.wait(RENEW_SECONDS):
                try:
                    self.refresh()
                except Exception:
                    if self._version is None:
                        return

        threading.Thread(target=renew, name="objckpt-lock-lease", daemon=True).start()

    def refresh(self) -> None:
        """Renews the lease before a commit; raises DirectoryLockedError when another writer
        took the lock over meanwhile (its lease had ended)."""
        from objckpt._bundle import remote as _remote

        with self._mutex:
            if self._version is None:
                return
            try:
                self._version = _remote.write_bytes(self.path, self._record(),
                                                    expect=self._version) or "?"
                return
            except _remote.PreconditionFailed:
                pass
            # An earlier renewal may have landed with its answer lost and not been read back
            # (the version held is then stale): the lock is still this writer's while its
            # record has this writer's id. Cannot read it: OSError, still held.
            try:
                data, version = _remote.read_versioned(self.path, _LOCK_LIMIT)
            except (FileNotFoundError, ValueError):
                data, version = b"", None
            if version is not None and f", id {self._id}, " in data.decode("utf-8", "replace"):
                try:
                    self._version = _remote.write_bytes(self.path, self._record(),
                                                        expect=version) or "?"
                    return
                except _remote.PreconditionFailed:
                    pass
            self._version = None
            if self._stop is not None:
                self._stop.set()
            raise errors.DirectoryLockedError(
                f"Cannot commit to `{self.directory}`: another writer took over its lock "
                f"`{self.path}` (this writer's lease of {LEASE_SECONDS:.0f} s had ended "
                "unrenewed). Nothing was committed. Fix: run one writer per directory.",
                directory=self.directory, holder="another writer")

    def release(self) -> None:
        from objckpt._bundle import remote as _remote

        if self._stop is not None:
            self._stop.set()
        with self._mutex:
            if self._version is None:
                return
            version, self._version = self._version, None
        if _HELD.get(self.path) is self:
            del _HELD[self.path]
        try:
            _, current = _remote.read_versioned(self.path, _LOCK_LIMIT)
            if current == version or version == "?":
                _remote.remove(self.path)
        except (OSError, ValueError):
            pass  # gone, or not reachable: its lease ends on its own


def _render_holder(holder: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in holder)[:200]


def _stale(holder: str) -> bool:
    """Whether a remote lock's holder (its record) may be taken over: its lease ended, or it
    was a process of this host that no longer runs."""
    import re

    match = re.fullmatch(r"pid (\d+) on (.+?), id [0-9a-f]+, lease until ([0-9.]+)", holder)
    if match is None:
        return True  # not a lock objckpt wrote: nothing holds it
    pid, host, until = int(match.group(1)), match.group(2), float(match.group(3))
    if until < now():
        return True
    if host == socket.gethostname() and pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
    return host == socket.gethostname() and pid == os.getpid()


def lock_for(directory: str):
    """The lock of a directory: a `RemoteLock` for a URL, else a `DirectoryLock`."""
    from objckpt._bundle import remote as _remote

    return RemoteLock(directory) if _remote.is_remote(directory) else DirectoryLock(directory)


def _release_remote_locks() -> None:
    """At exit: a process that ends without closing its writers frees their remote locks
    (the kernel does it for local ones); a killed one's lease ends on its own."""
    for held in list(_HELD.values()):
        if isinstance(held, RemoteLock):
            held.release()


atexit.register(_release_remote_locks)
