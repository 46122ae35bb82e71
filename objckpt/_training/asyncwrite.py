"""The background writer of `Checkpointing(async_save=True)`: one thread, newest wins."""

from __future__ import annotations

import threading


class Writer:
    """One background thread that writes and commits snapshots, newest wins.

    At most one write runs and one waits; a newer save replaces the waiting
    one (it is superseded: never written). Errors are kept for the training
    thread, which raises or warns at its next save or at `wait()`.
    """

    def __init__(self, write):
        """write(*job) writes and commits one job."""
        self._write = write
        self.superseded = 0  # jobs replaced by a newer one before they started
        self._cond = threading.Condition()
        self._waiting = None
        self._busy = False
        self._error: BaseException | None = None
        self._thread = None

    def submit(self, job) -> None:
        with self._cond:
            if self._waiting is not None:
                self.superseded += 1
            self._waiting = job
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="objckpt-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        from objckpt._bundle import fastio as _fastio

        _fastio.lower_priority()
        while True:
            with self._cond:
                if self._waiting is None:
                    self._thread = None
                    self._cond.notify_all()
                    return
                job, self._waiting, self._busy = self._waiting, None, True
            try:
                self._write(*job)
            except BaseException as err:  # handed to the training thread
                with self._cond:
                    self._error = err
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            while self._busy or self._waiting is not None:
                self._cond.wait()

    def raise_pending(self) -> None:
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error
