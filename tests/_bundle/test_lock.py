"""The lock of a local checkpoint directory (`objckpt._bundle.lock.DirectoryLock`): its file
names the holder, a lock held elsewhere is refused naming that holder and changing nothing, a
newer lock of the same process takes over, and a lock file that is no regular file is a
typed write error. (A lock held by another process: _training/test_checkpointing.py.)"""

from __future__ import annotations

import os
import socket

import pytest

from objckpt import errors
from objckpt._bundle import lock as _lock

fcntl = pytest.importorskip("fcntl", reason="advisory locks need fcntl (not on Windows)")


def test_the_lock_file_names_its_holder_and_release_frees_it(tmp_path):
    directory = tmp_path / "run"  # created by the lock
    lock = _lock.DirectoryLock(str(directory))
    lock.acquire()
    assert lock.held
    holder = (directory / _lock.LOCK_FILE).read_text()
    assert holder == f"pid {os.getpid()} on {socket.gethostname()}\n"
    lock.release()
    assert not lock.held
    again = _lock.DirectoryLock(str(directory))
    again.acquire()
    assert again.held
    again.release()


def test_a_newer_lock_of_this_process_takes_over_from_an_older_one(tmp_path):
    older, newer = _lock.DirectoryLock(str(tmp_path)), _lock.DirectoryLock(str(tmp_path))
    older.acquire()
    newer.acquire()
    assert newer.held and not older.held
    older.release()  # no longer its lock: changes nothing
    assert newer.held
    newer.release()
    assert not newer.held


def test_a_lock_held_elsewhere_is_refused_naming_its_holder(tmp_path):
    path = tmp_path / _lock.LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # another open file: another holder
    try:
        os.write(fd, b"pid 4242 on elsewhere\n")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock = _lock.DirectoryLock(str(tmp_path))
        with pytest.raises(errors.DirectoryLockedError) as info:
            lock.acquire()
        assert not lock.held
        assert isinstance(info.value, BlockingIOError)
        assert info.value.holder == "pid 4242 on elsewhere"
        message = str(info.value)
        assert f"`{tmp_path}` is in use by another writer (pid 4242 on elsewhere)" in message
        assert "Nothing was written or changed" in message and "own directory" in message
        assert path.read_text() == "pid 4242 on elsewhere\n"  # the holder's record stays
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def test_a_lock_file_that_is_no_regular_file_is_a_write_error(tmp_path):
    os.mkfifo(tmp_path / _lock.LOCK_FILE)  # opening a FIFO would block: it must not
    lock = _lock.DirectoryLock(str(tmp_path))
    with pytest.raises(errors.CheckpointWriteError, match="not a regular file") as info:
        lock.acquire()
    assert not lock.held
    assert str(tmp_path / _lock.LOCK_FILE) in str(info.value)
