"""Argument checks shared by `callbacks.Checkpointing`, `CheckpointManager` and their
`RetentionPolicy` (no TF import).

Both are created before anything heavy runs (a callback before `fit`), so the
checks live here, below TensorFlow, and give the same messages for both.
"""

from __future__ import annotations

import math
import os

from objckpt import errors

__all__ = ["check_choice", "check_count", "check_number", "directory_path", "writer_options"]


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


def directory_path(who: str, directory) -> str:
    """Checks the directory of a managed checkpoint directory; returns it as a str.

    Raises:
      InvalidArgumentError: not a path or URL string.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise errors.InvalidArgumentError(
            f"{who} needs a directory: a local path or a URL such as gs://bucket/run or "
            f"s3://bucket/run. Received: directory={directory!r}. Fix: pass a path or a URL "
            "string.")
    return os.fspath(directory)


def writer_options(*, monitor, async_save, on_error, verbose, durable=None) -> None:
    """Checks the options of a managed directory's writer beside its retention policy (which
    `RetentionPolicy` checks itself).

    Args:
      monitor, async_save, on_error, verbose, durable: as `callbacks.Checkpointing`
        documents them.

    Raises:
      InvalidArgumentError: naming the argument, what it must be and what was received.
    """
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
