"""Another writer's process for tests/integration/test_remote_faults.py, TF-free.

  python remote_lock_child.py DIRECTORY NOW

With its lease clock at NOW (seconds since the epoch) it takes the remote DIRECTORY's lock
as any writer does (over a holder whose lease ended), reads the state object, commits one
listing only `ckpt-1`, and exits holding the lock. Prints its lock record. The storage is
reached through the standard settings in the environment.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from objckpt._bundle import lock as _dirlock
from objckpt._bundle import remote as _remote
from objckpt._bundle import state as _ckptstate


def main(directory: str, clock: str) -> None:
    _dirlock.now = lambda: float(clock)
    lock = _dirlock.RemoteLock(directory)
    lock.acquire()
    _ckptstate.read_state(directory)  # the version it commits over
    lock.refresh()
    _ckptstate.write_state(directory, ["ckpt-1"], [float(clock)])
    print(_remote.read_bytes(lock.path, 4096).decode().strip())
    os._exit(0)  # holding the lock, as a process that goes on training


if __name__ == "__main__":
    main(*sys.argv[1:])
