"""Which checkpoints of a managed directory to keep, and when to save: the retention policy
(pure, no TF).

`CheckpointDirectory` asks its policy after each commit which of its checkpoints stay;
the others are deleted once the state file no longer lists them. A policy sees only what
the state file and the checkpoints record (`Kept`: number, prefix, step, metric, timestamp)
and TF's `last_preserved_timestamp`, so it is a pure function of them, tested without
TensorFlow. A checkpoint stays when ANY rule keeps it:

- the newest `max_to_keep` (None: all);
- the best `keep_best` by metric;
- every checkpoint whose step is a multiple of `keep_every_n_steps` (Orbax's keep_period);
- `keep_every_n_hours`, as TF's CheckpointManager's `keep_checkpoint_every_n_hours`: a
  checkpoint leaving the newest-`max_to_keep` window is preserved forever when its timestamp
  is at least `last_preserved + hours * 3600`, and `last_preserved` moves to it;
- `keep(kept) -> bool`, a user predicate: True keeps that checkpoint forever.

It also says whether a save comes too soon after the previous one (`checkpoint_interval`
steps, `min_interval_seconds`): such a save is skipped (writes nothing).

`now` is the one clock `CheckpointDirectory` reads for timestamps and intervals: tests
replace it (`retention.now = fake`) instead of sleeping.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from objckpt import errors
from objckpt._base import options as _options
from objckpt._base import render as _render

__all__ = ["DEFAULT", "KEYWORDS", "Decision", "Kept", "RetentionPolicy", "now"]

now = time.time  # the clock of managed directories (seconds since the epoch); tests patch it


class Kept:
    """One committed checkpoint.

    Attributes:
      number: N of `ckpt-N`.
      prefix: its path prefix.
      metric: its monitored value (NaN: none; never counts as best).
      timestamp: when it was saved (seconds since the epoch), as the state file lists it.
      step: the training step saved with it (None: unknown, e.g. written by something else).
    """

    __slots__ = ("metric", "number", "prefix", "step", "timestamp")

    def __init__(self, number: int, prefix: str, metric: float, timestamp: float = math.nan,
                 step: int | None = None):
        self.number, self.prefix, self.metric = number, prefix, metric
        self.timestamp, self.step = timestamp, step

    def __repr__(self) -> str:
        step = "" if self.step is None else f", step={self.step}"
        return f"Kept(ckpt-{self.number}, metric={self.metric}{step})"


class Decision(NamedTuple):
    """What `RetentionPolicy.decide` decided.

    Attributes:
      kept: the checkpoints that stay, in the order given.
      dropped: the others, in the order given.
      last_preserved: TF's `last_preserved_timestamp` after this decision.
      preserved: numbers of the checkpoints `keep_every_n_hours` preserved (forever).
    """

    kept: list[Kept]
    dropped: list[Kept]
    last_preserved: float
    preserved: frozenset[int]


# The keywords `CheckpointManager` and `callbacks.Checkpointing` take as shortcuts for a
# `RetentionPolicy`, in its order.
KEYWORDS = ("max_to_keep", "keep_best", "mode", "keep_every_n_steps", "keep_every_n_hours",
            "keep", "checkpoint_interval", "min_interval_seconds")


class _Default:
    """A retention keyword not passed (its value comes from `retention=`, else the policy's
    default)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<RetentionPolicy's default>"


DEFAULT = _Default()


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class RetentionPolicy:
    """Which checkpoints of a directory stay, and which saves come too soon: one validated
    option object (see docs/retention.md and the module's docstring).

    A checkpoint stays when ANY rule keeps it. Pass it once, as `retention=`, to
    `objckpt.CheckpointManager` or `objckpt.callbacks.Checkpointing` (their keywords of the
    same names are shortcuts that build one).

    Args:
      max_to_keep: how many of the newest checkpoints to keep (>= 1; None: all of them).
      keep_best: how many of the best checkpoints by metric to keep as well (>= 0).
      mode: "min" or "max": which metric value is better.
      keep_every_n_steps: keep forever each checkpoint whose step is a multiple of it.
      keep_every_n_hours: TF's `keep_checkpoint_every_n_hours` (see the module's docstring).
      keep: a callable `(Kept) -> bool`; True keeps that checkpoint forever. It is asked
        about each checkpoint no other rule keeps, whenever the kept set is decided, so it
        must answer from the `Kept` alone (the same answer every time).
      checkpoint_interval: a save less than this many steps after the last one is skipped.
      min_interval_seconds: a save less than this many seconds after the last one is skipped.

    Raises:
      InvalidArgumentError: a field out of range, naming it, what it must be, what was
        received and the fix.

    Example:
      >>> policy = objckpt.RetentionPolicy(max_to_keep=3, keep_every_n_steps=10_000)
      >>> manager = objckpt.CheckpointManager(model, "/tmp/run", retention=policy)
    """

    max_to_keep: int | None = 5
    keep_best: int = 0
    mode: str = "min"
    keep_every_n_steps: int | None = None
    keep_every_n_hours: float | None = None
    keep: Callable[[Kept], bool] | None = None
    checkpoint_interval: int | None = None
    min_interval_seconds: float | None = None

    def __init__(self, *, max_to_keep: int | None = 5, keep_best: int = 0, mode: str = "min",
                 keep_every_n_steps: int | None = None, keep_every_n_hours: float | None = None,
                 keep: Callable[[Kept], bool] | None = None,
                 checkpoint_interval: int | None = None,
                 min_interval_seconds: float | None = None):
        # Keyword-only (a dataclass's own __init__ is keyword-only from Python 3.10 on).
        for name, value in (("max_to_keep", max_to_keep), ("keep_best", keep_best),
                            ("mode", mode), ("keep_every_n_steps", keep_every_n_steps),
                            ("keep_every_n_hours", keep_every_n_hours), ("keep", keep),
                            ("checkpoint_interval", checkpoint_interval),
                            ("min_interval_seconds", min_interval_seconds)):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.max_to_keep is not None:
            _options.check_count("max_to_keep", self.max_to_keep, 1,
                                 "the newest checkpoints to keep; None: all")
        for name, what in (
                ("keep_every_n_steps",
                 "keep forever each checkpoint whose step is a multiple of it; None: off"),
                ("checkpoint_interval",
                 "skip a save less than this many steps after the last one; None: off")):
            if getattr(self, name) is not None:
                _options.check_count(name, getattr(self, name), 1, what)
        _options.check_number(
            "keep_every_n_hours", self.keep_every_n_hours,
            "preserve a checkpoint leaving the newest max_to_keep every this many hours")
        _options.check_number("min_interval_seconds", self.min_interval_seconds,
                              "skip a save less than this many seconds after the last one")
        if self.keep is not None and not callable(self.keep):
            raise errors.InvalidArgumentError(
                f"keep must be None or a callable (Kept) -> bool that returns True for each "
                f"checkpoint to keep forever. Received: keep={self.keep!r}. Fix: pass a "
                "function, e.g. keep=lambda kept: kept.step % 10_000 == 0.")
        _options.check_count("keep_best", self.keep_best, 0,
                             "the best checkpoints to keep as well")
        _options.check_choice("mode", self.mode, ("min", "max"))

    @classmethod
    def of(cls, who: str, retention, keywords: dict) -> RetentionPolicy:
        """The policy of a class that takes `retention=` and the keywords as shortcuts.

        Args:
          who: the class, for the messages ("Checkpointing", "CheckpointManager").
          retention: what was passed as `retention=` (None: not passed).
          keywords: {keyword: value} of `KEYWORDS` as passed (`DEFAULT`: not passed).

        Raises:
          InvalidArgumentError: `retention` is not a RetentionPolicy, or comes with one of
            the keywords, or a keyword is out of range (as `RetentionPolicy` checks it).
        """
        given = {name: value for name, value in keywords.items() if value is not DEFAULT}
        if retention is None:
            return cls(**given)
        if not isinstance(retention, cls):
            raise errors.InvalidArgumentError(
                f"{who}: retention must be an objckpt.RetentionPolicy. Received: "
                f"retention={retention!r}. Fix: pass retention=objckpt.RetentionPolicy("
                "max_to_keep=..., ...), or the retention keywords alone.")
        if given:
            shown = ", ".join(f"{name}={value!r}" for name, value in given.items())
            raise errors.InvalidArgumentError(
                f"{who} takes the retention rules once: as retention= or as keywords, not "
                f"both. Received: retention={retention!r} and {shown}. Fix: put "
                f"{', '.join(given)} in the RetentionPolicy (e.g. "
                f"dataclasses.replace(policy, {shown})), or pass the keywords alone.")
        return retention

    @property
    def reads_metrics(self) -> bool:
        """Whether the policy needs each checkpoint's metric (so a resumed directory reads
        them back): it ranks by metric, or a predicate sees them."""
        return self.keep_best > 0 or self.keep is not None

    @property
    def reads_steps(self) -> bool:
        """Whether the policy needs each checkpoint's step (read back on resume)."""
        return (self.keep_every_n_steps is not None or self.checkpoint_interval is not None
                or self.keep is not None)

    @property
    def uses_time(self) -> bool:
        """Whether a decision depends on timestamps (several workers take the chief's)."""
        return self.keep_every_n_hours is not None or self.min_interval_seconds is not None

    def newest(self, checkpoints: Sequence[Kept]) -> list[Kept]:
        """The newest-`max_to_keep` window: the end of `checkpoints` (oldest first)."""
        if self.max_to_keep is None:
            return list(checkpoints)
        return list(checkpoints[len(checkpoints) - self.max_to_keep:]) if (
            len(checkpoints) > self.max_to_keep) else list(checkpoints)

    def best(self, checkpoints: Sequence[Kept]) -> list[Kept]:
        """The checkpoints with a metric, best first (ties: the lower number first)."""
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted((k for k in checkpoints if not math.isnan(k.metric)),
                      key=lambda k: (sign * k.metric, k.number))

    def decide(self, checkpoints: Sequence[Kept], *, last_preserved: float = math.nan,
               preserved=frozenset()) -> Decision:
        """Which of `checkpoints` (oldest first, the newest last) stay.

        Args:
          checkpoints: every checkpoint of the directory, the one just saved last.
          last_preserved: TF's `last_preserved_timestamp` (the time the directory was first
            opened, then the timestamp of each checkpoint preserved by keep_every_n_hours;
            NaN: none, so nothing is preserved).
          preserved: numbers of the checkpoints keep_every_n_hours preserved before.

        Raises:
          InvalidArgumentError: the `keep` predicate raised (naming the checkpoint).
        """
        window = self.newest(checkpoints)
        older = checkpoints[:len(checkpoints) - len(window)]
        numbers = {k.number for k in checkpoints}
        preserved = set(preserved) & numbers
        if self.keep_every_n_hours is not None:
            period = self.keep_every_n_hours * 3600.0
            for k in older:  # leaving the window, oldest first: TF's _sweep
                if k.number not in preserved and k.timestamp - period >= last_preserved:
                    preserved.add(k.number)
                    last_preserved = k.timestamp
        keep = {k.number for k in window} | preserved
        keep.update(k.number for k in self.best(checkpoints)[:self.keep_best])
        if self.keep_every_n_steps is not None:
            keep.update(k.number for k in checkpoints
                        if k.step is not None and k.step % self.keep_every_n_steps == 0)
        if self.keep is not None:
            keep.update(k.number for k in older if k.number not in keep and self.asks(k))
        return Decision([k for k in checkpoints if k.number in keep],
                        [k for k in checkpoints if k.number not in keep],
                        last_preserved, frozenset(preserved))

    def kept_numbers(self, checkpoints: Sequence[Kept], *, last_preserved: float = math.nan,
                     preserved=frozenset()) -> set[int]:
        """The numbers of `checkpoints` (oldest first) that stay (see `decide`)."""
        return {k.number for k in self.decide(checkpoints, last_preserved=last_preserved,
                                              preserved=preserved).kept}

    def split(self, checkpoints: Sequence[Kept], *, last_preserved: float = math.nan,
              preserved=frozenset()) -> tuple[list[Kept], list[Kept]]:
        """(the checkpoints kept, those dropped), each in the order given (see `decide`)."""
        decision = self.decide(checkpoints, last_preserved=last_preserved, preserved=preserved)
        return decision.kept, decision.dropped

    def asks(self, kept: Kept) -> bool:
        """The `keep` predicate's answer for `kept` (False without a predicate).

        Raises:
          InvalidArgumentError: the predicate raised; the message names the checkpoint.
        """
        if self.keep is None:
            return False
        try:
            return bool(self.keep(kept))
        except Exception as err:
            raise errors.InvalidArgumentError(
                f"The keep= predicate raised {type(err).__name__} "
                f"({_render.first_line(err)}) for checkpoint `{_render.safe(kept.prefix)}` "
                f"({kept!r}, timestamp {kept.timestamp}). Expected True (keep it forever) or "
                "False for every checkpoint. Nothing was deleted and this checkpoint was not "
                "committed. Fix: make keep= answer from the Kept alone; its step is None and "
                "its metric NaN where the checkpoint has none.") from err

    def preserved_after_restart(self, checkpoints: Sequence[Kept],
                                last_preserved: float) -> frozenset[int]:
        """The checkpoints keep_every_n_hours had preserved, as far as a resumed directory
        can tell: the state file records only TF's `last_preserved_timestamp`.

        Outside the newest window, the checkpoint saved at `last_preserved` was preserved,
        and so may be any at least `keep_every_n_hours` older (kept forever too); one saved
        less than that before it cannot have been (the next preserved one would be later).
        Exact unless keep_best kept such an older checkpoint (then it stays forever).
        """
        if self.keep_every_n_hours is None or math.isnan(last_preserved):
            return frozenset()
        period = self.keep_every_n_hours * 3600.0
        window = self.newest(checkpoints)
        return frozenset(k.number for k in checkpoints[:len(checkpoints) - len(window)]
                         if k.timestamp == last_preserved
                         or k.timestamp <= last_preserved - period)

    def too_soon(self, step: int | None, stamp: float, last: Kept | None) -> str | None:
        """Why a save at `step` and time `stamp` comes too soon after `last` (the newest
        checkpoint saved), or None when it does not (nothing saved yet: never too soon)."""
        if last is None:
            return None
        if (self.checkpoint_interval is not None and step is not None
                and last.step is not None and step < last.step + self.checkpoint_interval):
            return (f"step {step} is less than checkpoint_interval={self.checkpoint_interval} "
                    f"steps after step {last.step} of `{last.prefix}`")
        if (self.min_interval_seconds is not None
                and stamp < last.timestamp + self.min_interval_seconds):
            return (f"{stamp - last.timestamp:.3f} s since `{last.prefix}` is less than "
                    f"min_interval_seconds={self.min_interval_seconds}")
        return None

    def __repr__(self) -> str:
        extra = "".join(f", {name}={getattr(self, name)!r}" for name in KEYWORDS[3:]
                        if getattr(self, name) is not None)
        return (f"RetentionPolicy(max_to_keep={self.max_to_keep}, keep_best={self.keep_best}, "
                f"mode={self.mode!r}{extra})")
