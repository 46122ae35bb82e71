"""What the `checkpoint` state file of a managed directory says, read as untrusted input.

`_checkpointing.CheckpointDirectory` resumes from what this module makes of the
state file: which of the directory's own `ckpt-N` it lists, and when each was
saved (TF's `all_model_checkpoint_timestamps` and `last_preserved_timestamp`).
Nothing here raises on a bad file: problems come back as notes for a warning,
and implausible times are replaced by the index file's modification time.
"""

from __future__ import annotations

import math
import os
import re
import time

from objckpt import _files, _render

__all__ = ["NAME", "listed", "number", "timestamps"]

# Files of ckpt-N, by TF's exact names (fullmatch; ASCII digits, no leading zeros).
NAME = re.compile(r"ckpt-(0|[1-9][0-9]*)\.(index|data-[0-9]{5}-of-[0-9]{5})")


def number(directory: str, name: str) -> int | None:
    """N when `name` (from the state file) is `ckpt-N` of `directory`, else None.

    Accepted: `ckpt-N`, or an absolute path whose folder is this directory. Never a
    relative path with folders (`../x/ckpt-5`), nor another directory's `ckpt-N`.
    """
    if "\x00" in name:
        return None
    if os.path.isabs(name):
        folder, name = os.path.split(name)
        try:
            if os.path.realpath(folder) != os.path.realpath(directory):
                return None
        except (OSError, ValueError):
            return None
    elif os.sep in name or (os.altsep and os.altsep in name):
        return None
    match = NAME.fullmatch(name + ".index")
    return int(match.group(1)) if match else None


def listed(directory: str, files: bool) -> tuple[list[int] | None, str | None]:
    """(the numbers the state file lists, oldest first; a note for a warning, or None).

    The numbers are None when the file is missing, cannot be read, or names anything but
    `ckpt-N` of this directory (`files`: whether checkpoint files are on disk, for the note).
    """
    path = os.path.join(directory, _files.STATE_FILE)
    try:
        names = _files.read_state(directory)
    except FileNotFoundError:
        return None, (f"Checkpoint directory `{directory}` has checkpoint files but no "
                      f"`{_files.STATE_FILE}` state file; using every intact one found on "
                      "disk." if files else None)
    except Exception as err:  # unreadable state: never a silent fresh start
        return None, (f"The checkpoint state file `{path}` cannot be read "
                      f"({_render.first_line(err)}); using the intact checkpoints found on "
                      "disk instead and writing a new state file.")
    numbers, wrong = set(), []
    for name in names:
        found = number(directory, name)
        if found is None:
            wrong.append(name)
        else:
            numbers.add(found)
    if wrong:
        return None, (
            f"The checkpoint state file `{path}` names "
            + ", ".join(f"`{_render.safe(n)}`" for n in wrong[:5])
            + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
            + f", which is not a `ckpt-N` checkpoint of `{directory}` (expected names "
            "like `ckpt-3`); such names are neither used nor deleted. Using the intact "
            "checkpoints found on disk instead and writing a new state file.")
    return sorted(numbers), None


def timestamps(directory: str, numbers: list[int]) -> tuple[dict[int, float], float]:
    """({N: when ckpt-N was saved} for `numbers`, TF's `last_preserved_timestamp`).

    A time comes from the state file where it lists a plausible one (finite, after 1970,
    not in the future), else from the index file's modification time (now if that cannot
    be read). An implausible `last_preserved_timestamp` becomes the oldest of those times.
    """
    now = time.time()
    stated, preserved = _files.state_timestamps(directory)
    stamps = {}
    for name, stamp in stated.items():
        found = number(directory, name)
        if found is not None and math.isfinite(stamp) and 0 < stamp <= now:
            stamps[found] = stamp
    for n in numbers:
        if n not in stamps:
            try:
                index = os.path.join(directory, f"ckpt-{n}.index")
                stamps[n] = min(os.stat(index).st_mtime, now)
            except OSError:
                stamps[n] = now
    stamps = {n: stamps[n] for n in numbers}
    if preserved is None or not (math.isfinite(preserved) and 0 < preserved <= now):
        preserved = min([*stamps.values(), now])
    return stamps, preserved
