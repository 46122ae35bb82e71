"""A checkpoint directory among the workers of a multi-worker strategy: the chief writes and
commits, every other worker follows (see `checkpointing`'s docstring).

Every worker calls `open`, `restore`, `save` and `wait` at the same points, in the same
order; the agreements are a `Cluster`'s small collectives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from objckpt import errors
from objckpt._bundle import files as _files
from objckpt._bundle import state as _ckptstate
from objckpt._ops import restore as _restore
from objckpt._training.cluster import Cluster, error_code
from objckpt._training.retention import Kept

if TYPE_CHECKING:
    from objckpt._training.checkpointing import CheckpointDirectory

__all__ = ["MultiWorker"]


class MultiWorker:
    """A `CheckpointDirectory`'s part in the multi-worker protocol (see the module's
    docstring): every worker calls `open`, `restore`, `save` and `wait` at the same points;
    the chief writes and commits through its directory and tells the others whether it
    could; a follower (any other worker) writes nothing, and keeps the list of checkpoints
    as the chief keeps it. It adds the agreements around its owner's one-process steps
    (`_open_alone`, `_take`, `_commit`), which it calls.

    Attributes:
      owner: the CheckpointDirectory.
      cluster: the workers (`Cluster`).
      following: open, on a worker that is not the chief.
    """

    def __init__(self, owner: CheckpointDirectory, cluster: Cluster):
        self.owner, self.cluster, self.following = owner, cluster, False

    def open(self) -> Kept | None:
        """`CheckpointDirectory.open` with several workers: the chief opens, says which
        checkpoint it resumes from, and learns whether every other worker can read it."""
        owner, cluster = self.owner, self.cluster
        if not cluster.chief:
            return self._open_as_follower()
        newest = err = None
        try:
            newest = owner.open_alone()
        except BaseException as caught:  # the others learn of it below, then all raise
            err = caught
        cluster.chief_row([error_code(err), newest.number if newest else 0, owner.next_number])
        if err is not None:
            raise err
        failed = cluster.failed(None)  # whether the others can read the chief's choice
        if failed:
            owner.release()
            cluster.raise_for(failed, None, "to read the checkpoint the chief resumes from",
                              owner.directory)
        return newest

    def _open_as_follower(self) -> Kept | None:
        """open() on a worker that is not the chief: no lock, nothing changed on disk."""
        cluster = self.cluster
        code, number, following = (int(x) for x in cluster.chief_row([0, 0, 0]))
        if code:
            cluster.raise_for({cluster.chief_index: code}, None, "to open it",
                              self.owner.directory)
        err = newest = None
        try:
            newest = self._follow(number, following)
        except Exception as caught:  # the others learn of it below, then all raise
            err = caught
        failed = cluster.failed(err)
        cluster.raise_for(failed, err, "to read the checkpoint the chief resumes from",
                          self.owner.directory)
        self.following = True
        return newest

    def _follow(self, number: int, following: int) -> Kept | None:
        """The checkpoints kept as the chief left them after its open(), read from the state
        file; `number` (0: none) is the one the chief resumes from and must be intact here."""
        owner, commits = self.owner, self.owner.commits
        owner.next_number = following
        owner.checkpoints.resumed([])
        if not number:
            return None
        problem = _files.check_intact(commits.prefix(number))
        if problem is not None:
            raise errors.CheckpointDirectoryError(
                f"Checkpoint directory `{owner.directory}`: the chief resumes from "
                f"`{commits.prefix(number)}`, which this worker ({self.cluster.name}) cannot "
                f"read: {problem}. Expected every worker to see the chief's checkpoints (TF's "
                "convention for multi-worker checkpoints: one directory on a file system all "
                "workers mount). Nothing was changed. Fix: put the directory on a shared file "
                "system (NFS, a network disk) and pass the same path on every worker.",
                directory=owner.directory, found=())
        listed, _ = _ckptstate.listed(owner.directory, True)
        use = sorted({n for n in listed or () if n < number
                      and _files.check_intact(commits.prefix(n)) is None} | {number})
        owner.checkpoints.resumed(commits.kept_of(use, owner.retention.reads_metrics))
        return owner.kept[-1]

    def restore(self, kept: Kept) -> None:
        """Every worker restores; all raise when any one fails."""
        err = None
        try:
            _restore.restore(self.owner.root, kept.prefix)
        except Exception as caught:
            err = caught
        self.cluster.raise_for(self.cluster.failed(err), err, f"to restore `{kept.prefix}`",
                               self.owner.directory)

    def save(self, metric: float | None, force: bool = False) -> str | None:
        """`CheckpointDirectory.save` with several workers. Whether a save comes too soon
        is decided on the step (the same on every worker) and, with rules on time, on the
        chief's clock, which every worker then uses."""
        owner, cluster = self.owner, self.cluster
        if cluster.chief:
            if owner.read_only is None:
                owner.commits.check_lock()
        elif not self.following:
            owner.commits.check_lock()  # raises: a follower closed, or never opened
        stamp, skip = owner.when(force)
        if owner.retention.uses_time:
            skip, stamp = cluster.chief_row([float(skip is not None), stamp])
            skip = "the chief skips it" if skip else None
        if skip is not None:
            owner.skipped += 1
            return None
        job = owner.take(metric, stamp)
        prefix = owner.commits.prefix(job[0])
        if not cluster.chief:
            failed = cluster.failed(None)
            if cluster.chief_index in failed:
                if owner.on_error == "raise":
                    cluster.raise_for(failed, None, f"to write `{prefix}`", owner.directory,
                                      prefix)
                return None
            # as the chief keeps
            owner.checkpoints.decide(Kept(job[0], prefix, job[1], job[2], job[5]))
            owner.note_saved(job)
            return prefix
        done, err = (False, owner.read_only) if owner.read_only is not None else (
            owner.hand_over(job))
        if done:
            owner.note_saved(job)
        cluster.failed(err)  # the others learn of it
        if err is not None:
            owner.failed(err)
        return prefix if done else None

    def wait(self) -> None:
        """`CheckpointDirectory.wait` with several workers (and async_save): all learn
        whether the chief's writes failed."""
        owner, cluster = self.owner, self.cluster
        err = None
        if cluster.chief:
            owner.writer.wait()
            try:
                owner.writer.raise_pending()
            except errors.CheckpointWriteError as caught:
                err = caught
        failed = cluster.failed(err)
        if err is not None:
            owner.failed(err)
        elif failed and owner.on_error == "raise":
            cluster.raise_for(failed, None, "to write a checkpoint", owner.directory)
