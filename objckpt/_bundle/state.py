"""The `checkpoint` state file of a directory, in one place: format, reader, writer, meaning.

TF's `CheckpointState` text file lists a directory's checkpoints (the newest last) and when
each was saved. It is untrusted input: `read_state` is its one reader (a regular file of at
most `STATE_FILE_LIMIT` bytes, parsed without TensorFlow) and `write_state` its one writer
(atomic: a temporary file, then a rename). `listed`, `number` and `timestamps` say what it
means for a managed directory (`_checkpointing.CheckpointDirectory`): which of the
directory's own `ckpt-N` it lists, and when each was saved. Those never raise on a bad file:
problems come back as notes for a warning, and implausible times are replaced by the index
file's modification time. `_files.state_prefixes` resolves what it lists as sources.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
import uuid
from typing import NamedTuple

from objckpt import errors
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._bundle import remote as _remote

__all__ = ["NAME", "STATE_FILE", "STATE_FILE_LIMIT", "State", "listed", "number",
           "outcome_unknown", "parse_state", "read_state", "timestamps", "write_state"]

STATE_FILE = "checkpoint"
STATE_FILE_LIMIT = 1 << 20  # bytes; a real state file has about 100 per checkpoint

# Files of ckpt-N, by TF's exact names (fullmatch; ASCII digits, no leading zeros).
NAME = re.compile(r"ckpt-(0|[1-9][0-9]*)\.(index|data-[0-9]{5}-of-[0-9]{5})")


class State(NamedTuple):
    """What a state file says (see `read_state`).

    Attributes:
      names: the checkpoints listed, oldest first, the newest last, as written.
      timestamps: {name: when it was saved}, as written; empty unless the file gives one
        timestamp per listed name (else TF's own CheckpointManager ignores them too).
      preserved: TF's `last_preserved_timestamp`, or None.
    """

    names: list[str]
    timestamps: dict[str, float]
    preserved: float | None


def _read_small(path: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; never blocks on a FIFO.

    Raises:
      FileNotFoundError: no such file.
      ValueError: what is there is not such a file (the message says what it is).
      OSError: it cannot be read.
    """
    if _remote.is_remote(path):
        directory = path.rsplit("/", 1)[0]
        try:
            data, token = _remote.read_versioned(path, limit)
        except FileNotFoundError:
            _VERSIONS[directory] = _remote.ABSENT
            raise
        _VERSIONS[directory] = token
        return data
    problem = _bundle.regular_file_problem(path, limit)
    if problem is not None:
        if problem.endswith("does not exist"):
            raise FileNotFoundError(problem)
        raise ValueError(problem)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        problem = _bundle.stat_problem(path, os.fstat(fd), limit)  # what was opened, not a swap
        if problem is not None:
            raise ValueError(problem)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(limit + 1 - total, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:
        raise ValueError(f"`{_render.safe(path)}` grew past {limit:,} bytes while it was read")
    return b"".join(chunks)


# Remote directories: the version of the state object this process last read or wrote
# (`_remote.ABSENT`: none was there), the precondition of the next write.
_VERSIONS: dict = {}
_UNKNOWN = object()  # a write whose outcome is unknown: read the version before the next


def _hinted(hint) -> str:
    return hint() if hint is not None else ""


def read_state(directory: str, *, hint=None, empty_ok: bool = False) -> State:
    """What a directory's `checkpoint` state file says: the one reader of it.

    `State.names` are the checkpoints it lists, oldest first (its `model_checkpoint_path`
    last), as written (relative or absolute); `State.timestamps` and `State.preserved` are
    as written too (untrusted: the caller checks each value).

    The state file is untrusted: it must be a regular file of at most `STATE_FILE_LIMIT`
    bytes (a FIFO or a link to a device is refused, never opened for reading). It is parsed
    without TF. `hint`: a callable giving a sentence for the errors (the intact checkpoints
    found beside it, see `_files.state_prefixes`). `empty_ok`: a file that names no
    checkpoint is read (its names are empty) instead of refused.

    Raises:
      CheckpointNotFoundError (a FileNotFoundError): no state file.
      CheckpointCorruptError: it is not a regular file, too large, cannot be parsed, or
        names no checkpoint (unless `empty_ok`).
    """
    state_path = os.path.join(directory, STATE_FILE)
    try:
        text = _read_small(state_path, STATE_FILE_LIMIT)
    except FileNotFoundError:
        raise errors.CheckpointNotFoundError(
            f"Directory `{directory}` holds no managed checkpoints: expected a TF `checkpoint` "
            f"state file in it, found none.{_hinted(hint)} Fix: pass a checkpoint "
            "prefix, or a directory that objckpt.save or a CheckpointManager wrote to.",
            source=directory) from None
    except (OSError, ValueError) as err:
        raise errors.CheckpointCorruptError(
            f"The checkpoint state file `{state_path}` was not read: {err}. Expected a "
            f"regular text file of at most {_render.size(STATE_FILE_LIMIT)}. Fix: delete it, "
            f"or replace it with the state file of the directory."
            f"{_hinted(hint)}", source=state_path) from err
    try:
        state = parse_state(text)
    except Exception as err:
        raise errors.CheckpointCorruptError(
            f"The checkpoint state file `{state_path}` cannot be parsed: "
            f"{_render.safe(_render.first_line(err))}. Expected lines like "
            f"`model_checkpoint_path: \"ckpt-3\"`.{_hinted(hint)} Fix: delete the "
            "state file and write a new checkpoint.", source=state_path) from err
    names = [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
    names = list(reversed(dict.fromkeys(n for n in reversed(names) if n)))
    if not names and not empty_ok:
        raise errors.CheckpointCorruptError(
            f"The checkpoint state file `{state_path}` names no checkpoint (it is empty or "
            f"has no `model_checkpoint_path`).{_hinted(hint)} Fix: pass a "
            "checkpoint prefix, or delete the state file so that the directory's newest "
            "intact checkpoint is used.", source=state_path)
    listed = list(state.all_model_checkpoint_paths)
    stamps = [float(t) for t in state.all_model_checkpoint_timestamps]
    return State(names, dict(zip(listed, stamps)) if len(stamps) == len(listed) else {},
                 float(state.last_preserved_timestamp) or None)


_STATE_FIELDS = (("model_checkpoint_path", 1, "string", False),
                 ("all_model_checkpoint_paths", 2, "string", True),
                 ("all_model_checkpoint_timestamps", 3, "double", True),
                 ("last_preserved_timestamp", 4, "double", False))
_STATE_MESSAGE = []  # the message class, built on first use


def parse_state(data: bytes):
    """Parses the text of a TF `checkpoint` state file into a `CheckpointState` message.

    The message class is built from the same fields as TF's `CheckpointState` proto in a
    private descriptor pool, and parsed with protobuf's `text_format` as TF parses it, so no
    TensorFlow import is needed (nor clashes with TF's own proto when TF is loaded).

    Raises:
      google.protobuf.text_format.ParseError, UnicodeDecodeError: not a state file.
    """
    from google.protobuf import text_format

    if not _STATE_MESSAGE:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        file = descriptor_pb2.FileDescriptorProto(
            name="objckpt/checkpoint_state.proto", package="objckpt", syntax="proto3")
        message = file.message_type.add(name="CheckpointState")
        field = descriptor_pb2.FieldDescriptorProto
        for name, number, kind, repeated in _STATE_FIELDS:
            message.field.add(
                name=name, number=number,
                type=field.TYPE_STRING if kind == "string" else field.TYPE_DOUBLE,
                label=field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(file)
        _STATE_MESSAGE.append(message_factory.GetMessageClass(
            pool.FindMessageTypeByName("objckpt.CheckpointState")))
    state = _STATE_MESSAGE[0]()
    text_format.Merge(data.decode("utf-8"), state)
    return state


def write_state(directory: str, names: list[str], timestamps, last_preserved=None, *,
                durable: bool = False) -> None:
    """Writes TF's `checkpoint` state file atomically: `names` oldest first, the last newest.

    Args:
      directory: the directory the state file is written in.
      names: the checkpoints, oldest first.
      timestamps: when each checkpoint was saved (seconds since the epoch), one per name
        (as `tf.train.CheckpointManager` writes them); one float gives all names that time.
      last_preserved: TF's `last_preserved_timestamp`; None: the newest timestamp.
      durable: fsync the file before it replaces the old one, and the directory after.
    """
    if isinstance(timestamps, (int, float)):
        timestamps = [timestamps] * len(names)
    if len(timestamps) != len(names):
        raise ValueError(f"{len(names)} checkpoint names but {len(timestamps)} timestamps")
    quoted = [n.replace("\\", "\\\\").replace('"', '\\"') for n in names]
    text = [f'model_checkpoint_path: "{quoted[-1]}"']
    text += [f'all_model_checkpoint_paths: "{n}"' for n in quoted]
    text += [f"all_model_checkpoint_timestamps: {float(t)!r}" for t in timestamps]
    preserved = float(timestamps[-1] if last_preserved is None else last_preserved)
    text.append(f"last_preserved_timestamp: {preserved!r}")
    if _remote.is_remote(directory):
        _write_remote(directory, ("\n".join(text) + "\n").encode())
        return
    temp = os.path.join(directory, f".{STATE_FILE}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        with open(temp, "w") as f:
            f.write("\n".join(text) + "\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(temp, os.path.join(directory, STATE_FILE))
        if durable:
            from objckpt._bundle import fastio as _fastio

            _fastio.fsync_paths([], directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)


def _write_remote(directory: str, data: bytes) -> None:
    """The commit point of a remote directory: the state object written whole (an object is
    replaced atomically), only if it is still the version this process last saw (a GCS
    generation or S3 ETag precondition), so two writers cannot both commit over each other.

    Raises:
      CheckpointWriteError: another writer changed it, or the store failed.
    """
    url = directory.rstrip("/") + "/" + STATE_FILE
    try:
        expect = _VERSIONS.get(directory)
        if expect is _UNKNOWN:  # the last write's outcome: the version there now is ours
            try:
                expect = _remote.read_versioned(url, STATE_FILE_LIMIT)[1]
            except FileNotFoundError:
                expect = _remote.ABSENT
        _VERSIONS[directory] = _remote.write_bytes(url, data, expect=expect)
    except _remote.PreconditionFailed as err:  # the version expected stays: so do later saves
        raise errors.CheckpointWriteError(
            f"Cannot commit to `{directory}`: its state object `{url}` was changed by another "
            "writer since this one read it (expected the version it read). Nothing was "
            "committed; the other writer's checkpoints are intact. Fix: use one writer per "
            "directory (stop the other training run, or give this run its own directory).",
            source=directory) from err
    except (OSError, ValueError) as err:
        # It may have landed (its answer lost, and not read back). The caller holds the
        # directory's lock, renewed just before: the next write takes the version it finds.
        _VERSIONS[directory] = _UNKNOWN
        raise errors.CheckpointWriteError(
            f"Cannot commit to `{directory}`: writing its state object `{url}` failed: "
            f"{_render.first_line(err)}. Expected the storage to accept it (the client retried "
            "transient errors). The new checkpoint is not committed; earlier ones are intact. "
            "Fix: check the network, credentials and bucket, then save again.",
            source=directory) from err


def outcome_unknown(directory: str) -> bool:
    """Whether the last write of a remote directory's state object failed without telling
    whether it landed (its answer lost, and it could not be read back)."""
    return _VERSIONS.get(directory) is _UNKNOWN


def number(directory: str, name: str) -> int | None:
    """N when `name` (from the state file) is `ckpt-N` of `directory`, else None.

    Accepted: `ckpt-N`, or an absolute path whose folder is this directory. Never a
    relative path with folders (`../x/ckpt-5`), nor another directory's `ckpt-N`.
    """
    if "\x00" in name:
        return None
    if _remote.is_remote(directory) or _remote.is_remote(name):
        root = directory.rstrip("/") + "/"
        name = name[len(root):] if name.startswith(root) else name
        if "/" in name:
            return None
        match = NAME.fullmatch(name + ".index")
        return int(match.group(1)) if match else None
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
    path = os.path.join(directory, STATE_FILE)
    try:
        names = read_state(directory).names
    except FileNotFoundError:
        return None, (f"Checkpoint directory `{directory}` has checkpoint files but no "
                      f"`{STATE_FILE}` state file; using every intact one found on "
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
    try:
        _, stated, preserved = read_state(directory, empty_ok=True)
    except Exception:  # what `listed` reports; here: no timestamps
        stated, preserved = {}, None
    stamps = {}
    for name, stamp in stated.items():
        found = number(directory, name)
        if found is not None and math.isfinite(stamp) and 0 < stamp <= now:
            stamps[found] = stamp
    for n in numbers:
        if n not in stamps:
            try:
                index = os.path.join(directory, f"ckpt-{n}.index")
                stamps[n] = min(_remote.modified(index) or now if _remote.is_remote(index)
                                else os.stat(index).st_mtime, now)
            except OSError:
                stamps[n] = now
    stamps = {n: stamps[n] for n in numbers}
    if preserved is None or not (math.isfinite(preserved) and 0 < preserved <= now):
        preserved = min([*stamps.values(), now])
    return stamps, preserved
