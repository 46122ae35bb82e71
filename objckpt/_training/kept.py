"""The checkpoints a managed directory keeps now, and the clock of its saves: its
`RetentionPolicy` applied, save after save, to what the directory holds.

`CheckpointDirectory` keeps one `KeptCheckpoints`: taken up from the directory when it opens
(`resumed`), asked whether a save comes too soon (`when`) and, after each write, which
checkpoints the commit lists (`decide`, undone when the commit fails).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from objckpt._training import commit as _commit
from objckpt._training import retention as _retention
from objckpt._training.retention import Kept, RetentionPolicy

__all__ = ["KeptCheckpoints"]


class KeptCheckpoints:
    """The checkpoints of one directory that stay, by its policy.

    Attributes:
      policy: the `RetentionPolicy`.
      commits: the directory's `CommitProtocol` (its `preserved` is TF's
        `last_preserved_timestamp`, which the state file records).
      kept: the checkpoints kept, oldest first.
      preserved: numbers of the checkpoints keep_every_n_hours preserved.
      last: the newest checkpoint saved (the intervals count from it), or None.
      clock: the newest timestamp given: timestamps never go back.
    """

    def __init__(self, policy: RetentionPolicy, commits: _commit.CommitProtocol):
        self.policy, self.commits = policy, commits
        self.kept: list[Kept] = []
        self.preserved: frozenset[int] = frozenset()
        self.last: Kept | None = None
        self.clock = 0.0

    def resumed(self, kept: list[Kept]) -> None:
        """Takes up the checkpoints found on opening: their steps (when a rule needs them),
        the newest as the last saved, TF's `last_preserved_timestamp` (as TF: the time of
        opening in a fresh directory, never later than now) and what it preserved."""
        if self.policy.reads_steps:
            for k in kept:
                k.step = _commit.read_counter(k.prefix)
        self.kept = kept
        self.last = kept[-1] if kept else None
        self.clock = max((k.timestamp for k in kept), default=0.0)
        commits, now = self.commits, _retention.now()
        if not kept or math.isnan(commits.preserved) or commits.preserved > now:
            commits.preserved = now
        self.preserved = self.policy.preserved_after_restart(kept, commits.preserved)

    def when(self, step: int, force: bool) -> tuple[float, str | None]:
        """(the timestamp of a save at `step` now, why it comes too soon or None)."""
        stamp = max(_retention.now(), self.clock)  # timestamps never go back
        return stamp, None if force else self.policy.too_soon(step, stamp, self.last)

    def decide(self, new: Kept) -> tuple[list[Kept], list[Kept], Callable[[], None]]:
        """Asks the policy about `kept` plus `new`, and takes its decision; returns (the
        checkpoints kept, those dropped, a function that undoes the decision)."""
        before = (self.kept, self.commits.preserved, self.preserved)
        decision = self.policy.decide([*self.kept, new], last_preserved=self.commits.preserved,
                                      preserved=self.preserved)
        self.kept, self.commits.preserved, self.preserved = (
            decision.kept, decision.last_preserved, decision.preserved)

        def undo() -> None:
            self.kept, self.commits.preserved, self.preserved = before

        return decision.kept, decision.dropped, undo

    def best(self) -> list[Kept]:
        """The kept checkpoints with a metric, best first (ties: the older first)."""
        return self.policy.best(self.kept)

    def latest_name(self) -> str:
        """The newest checkpoint kept, for messages ("no checkpoint" when none)."""
        return f"`{self.kept[-1].prefix}`" if self.kept else "no checkpoint"
