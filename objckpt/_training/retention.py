"""Which checkpoints of a managed directory to keep: the retention policy (pure, no TF).

`CheckpointDirectory` asks its policy after each commit which of its checkpoints stay;
the others are deleted once the state file no longer lists them. A policy sees only what
the state file and the checkpoints record (`Kept`: number, prefix, metric, timestamp), so
it is a pure function of that list, tested without TensorFlow. Today's policy keeps the
newest `max_to_keep` and the best `keep_best` by a metric; a policy is any object with
`keep(checkpoints) -> set of numbers` (and `best`, `reads_metrics`), which is where rules
such as "keep one every N hours" would go.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["Kept", "RetentionPolicy"]


class Kept:
    """One committed checkpoint.

    Attributes:
      number: N of `ckpt-N`.
      prefix: its path prefix.
      metric: its monitored value (NaN: none; never counts as best).
      timestamp: when it was saved (seconds since the epoch), as the state file lists it.
    """

    __slots__ = ("metric", "number", "prefix", "timestamp")

    def __init__(self, number: int, prefix: str, metric: float, timestamp: float = math.nan):
        self.number, self.prefix, self.metric = number, prefix, metric
        self.timestamp = timestamp

    def __repr__(self) -> str:
        return f"Kept(ckpt-{self.number}, metric={self.metric})"


class RetentionPolicy:
    """Keeps the newest `max_to_keep` checkpoints and the best `keep_best` by metric.

    Args:
      max_to_keep: how many of the newest checkpoints to keep (>= 1).
      keep_best: how many of the best checkpoints by metric to keep as well (>= 0).
      mode: "min" or "max": which metric value is better.
    """

    def __init__(self, max_to_keep: int = 5, keep_best: int = 0, mode: str = "min"):
        self.max_to_keep, self.keep_best, self.mode = max_to_keep, keep_best, mode

    @property
    def reads_metrics(self) -> bool:
        """Whether the policy ranks by metric (so a resumed directory reads them back)."""
        return self.keep_best > 0

    def best(self, checkpoints: Sequence[Kept]) -> list[Kept]:
        """The checkpoints with a metric, best first (ties: the lower number first)."""
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted((k for k in checkpoints if not math.isnan(k.metric)),
                      key=lambda k: (sign * k.metric, k.number))

    def keep(self, checkpoints: Sequence[Kept]) -> set[int]:
        """The numbers of `checkpoints` (oldest first) that stay."""
        keep = {k.number for k in checkpoints[-self.max_to_keep:]}
        keep.update(k.number for k in self.best(checkpoints)[:self.keep_best])
        return keep

    def split(self, checkpoints: Sequence[Kept]) -> tuple[list[Kept], list[Kept]]:
        """(the checkpoints kept, those dropped), each in the order given."""
        keep = self.keep(checkpoints)
        return ([k for k in checkpoints if k.number in keep],
                [k for k in checkpoints if k.number not in keep])

    def __repr__(self) -> str:
        return (f"RetentionPolicy(max_to_keep={self.max_to_keep}, keep_best={self.keep_best}, "
                f"mode={self.mode!r})")
