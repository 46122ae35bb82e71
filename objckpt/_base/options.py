"""Argument checks shared by `callbacks.Checkpointing` and `CheckpointManager` (no TF import).

Both are created before anything heavy runs (a callback before `fit`), so the
checks live here, below TensorFlow, and give the same messages for both.
"""

from __future__ import annotations

import math
import os

from objckpt import errors

__all__ = ["check_choice", "check_count", "check_number", "checkpoint_directory"]


def check_choice(name, value, choices):
    """Raises InvalidArgumentError unless `value` is one of `choices`."""
    if value not in choices:
        raise errors.InvalidArgumentError(
            f"{name} must be one of {', '.join(repr(c) for c in choices)}. "
            f"Received: {name}={value!r}. Fix: pass one of them.")


def check_count(name, value, minimum, what):
    """Raises InvalidArgumentError unless `value` is an int (not a bool) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise errors.InvalidArgumentError(
            f"{name} must be an int >= {minimum} ({what}). Received: {name}={value!r}. "
            f"Fix: pass a whole number >= {minimum}.")


def check_number(name, value, what):
    """Raises InvalidArgumentError unless `value` is None or a finite real number > 0 (not a
    bool)."""
    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise errors.InvalidArgumentError(
            f"{name} must be None or a number > 0 ({what}). Received: {name}={value!r}. "
            f"Fix: pass a finite number > 0, e.g. {name}=6, or None to turn it off.")


def checkpoint_directory(who: str, directory, *, max_to_keep, keep_best, monitor, mode,
                         async_save, on_error, verbose, durable=None, keep_every_n_steps=None,
                         keep_every_n_hours=None, keep=None, checkpoint_interval=None,
                         min_interval_seconds=None) -> str:
    """Checks the arguments of a managed checkpoint directory; returns the directory as a str.

    Args:
      who: the class, for the messages ("Checkpointing", "CheckpointManager").
      directory, max_to_keep, keep_best, monitor, mode, async_save, on_error, verbose,
        durable, keep_every_n_steps, keep_every_n_hours, keep, checkpoint_interval,
        min_interval_seconds: as `callbacks.Checkpointing` documents them.

    Raises:
      InvalidArgumentError: naming the argument, what it must be and what was received.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise errors.InvalidArgumentError(
            f"{who} needs a directory: a local path or a URL such as gs://bucket/run or "
            f"s3://bucket/run. Received: directory={directory!r}. Fix: pass a path or a URL "
            "string.")
    if max_to_keep is not None:
        check_count("max_to_keep", max_to_keep, 1, "the newest checkpoints to keep; None: all")
    for name, value, what in (
            ("keep_every_n_steps", keep_every_n_steps,
             "keep forever each checkpoint whose step is a multiple of it; None: off"),
            ("checkpoint_interval", checkpoint_interval,
             "skip a save less than this many steps after the last one; None: off")):
        if value is not None:
            check_count(name, value, 1, what)
    check_number("keep_every_n_hours", keep_every_n_hours,
                 "preserve a checkpoint leaving the newest max_to_keep every this many hours")
    check_number("min_interval_seconds", min_interval_seconds,
                 "skip a save less than this many seconds after the last one")
    if keep is not None and not callable(keep):
        raise errors.InvalidArgumentError(
            f"keep must be None or a callable (Kept) -> bool that returns True for each "
            f"checkpoint to keep forever. Received: keep={keep!r}. Fix: pass a function, "
            "e.g. keep=lambda kept: kept.step % 10_000 == 0.")
    check_count("keep_best", keep_best, 0, "the best checkpoints to keep as well")
    check_choice("mode", mode, ("min", "max"))
    check_choice("on_error", on_error, ("raise", "warn"))
    if not isinstance(monitor, str) or not monitor:
        raise errors.InvalidArgumentError(
            f"monitor must be a logs key such as 'val_loss'. Received: monitor={monitor!r}. "
            "Fix: pass the name of a metric training logs, e.g. monitor='val_loss'.")
    if not isinstance(async_save, bool):
        raise errors.InvalidArgumentError(
            f"async_save must be True or False. Received: async_save={async_save!r}. "
            "Fix: pass async_save=True or async_save=False.")
    check_choice("verbose", verbose, (0, 1))
    if durable is not None and not isinstance(durable, bool):
        raise errors.InvalidArgumentError(
            f"durable must be True, False or None (the library default). Received: "
            f"durable={durable!r}. Fix: pass durable=True to fsync each checkpoint before "
            "it is committed.")
    return os.fspath(directory)
