"""Checkpoint files on disk: resolving a source, the `checkpoint` state file, intact checks,
and the one atomic write-and-commit every writer uses.

A prefix is a checkpoint when `prefix.index` exists beside all of its data shards; the index
is what makes it one, so it is written last and removed first. Every writer (`objckpt.save`,
`migrate`, `callbacks.Checkpointing`) writes under a temporary name in the same directory and
commits with renames, so a crash leaves the old checkpoint, none, or the new one; never a mix.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import tensorflow as tf

from objckpt import _compat, _render, errors

__all__ = ["DATA_SUFFIX", "STATE_FILE", "check_intact", "commit", "data_files_problem",
           "listdir", "nearby_prefixes", "open_reader", "read_state", "remove", "rename",
           "resolve_prefix", "state_candidates", "temp_prefix", "write_state",
           "write_tensors"]

STATE_FILE = "checkpoint"
DATA_SUFFIX = ".data-00000-of-00001"


# --- reading -------------------------------------------------------------------------

def open_reader(prefix: str):
    """TF's checkpoint reader for `prefix`; a damaged index is a CheckpointCorruptError."""
    try:
        return tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as err:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{prefix}` cannot be read: its index file `{prefix}.index` is damaged "
            f"or not a checkpoint index. Received from TF: {_render.first_line(err)}. Restore "
            "from another checkpoint, or write this one again.") from err


def data_files_problem(prefix: str) -> str | None:
    """Why the data shards of `prefix` are incomplete, or None."""
    directory = os.path.dirname(prefix) or "."
    base = os.path.basename(prefix) + ".data-"
    try:
        shards = [name for name in os.listdir(directory) if name.startswith(base)]
    except OSError as err:
        return str(err)
    if not shards:
        return f"its data file `{prefix}{DATA_SUFFIX}` is missing"
    total = int(shards[0].rsplit("-of-", 1)[1])
    if len(shards) != total:
        return f"it has {len(shards)} of {total} data shards"
    return None


def check_intact(prefix: str) -> str | None:
    """Why `prefix` is not an intact checkpoint, or None if it looks intact."""
    if not tf.io.gfile.exists(prefix + ".index"):
        return f"`{prefix}.index` does not exist"
    missing = data_files_problem(prefix) if "://" not in prefix else None
    if missing:
        return missing
    try:
        open_reader(prefix)
    except errors.CheckpointCorruptError as err:
        return str(err)
    return None


def nearby_prefixes(directory: str, limit: int = 5) -> list[str]:
    """Up to `limit` checkpoint prefixes in a directory (for "did you mean" hints)."""
    try:
        names = sorted(n[: -len(".index")] for n in os.listdir(directory or ".")
                       if n.endswith(".index"))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names[:limit]]


def read_state(directory: str) -> list[str]:
    """The checkpoint names a directory's `checkpoint` state file lists, oldest first (its
    `model_checkpoint_path` last), as written (relative or absolute).

    Raises:
      CheckpointNotFoundError (a FileNotFoundError): no state file.
      CheckpointCorruptError: it cannot be parsed, or names no checkpoint.
    """
    state_path = os.path.join(directory, STATE_FILE)
    found = nearby_prefixes(directory)
    hint = (f" Prefixes found in the directory: {', '.join(found)}; pass one of them directly."
            if found else "")
    if not os.path.exists(state_path):
        raise errors.CheckpointNotFoundError(
            f"Directory `{directory}` holds no managed checkpoints: expected a TF `checkpoint` "
            f"state file in it, found none.{hint}")
    try:
        with open(state_path, "rb") as f:
            state = _compat.parse_checkpoint_state(f.read())
    except Exception as err:
        raise errors.CheckpointCorruptError(
            f"The checkpoint state file `{state_path}` cannot be parsed: "
            f"{_render.first_line(err)}. Expected lines like `model_checkpoint_path: "
            f"\"ckpt-3\"`.{hint} Or delete the state file and write a new checkpoint.") from err
    names = [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
    names = list(reversed(dict.fromkeys(n for n in reversed(names) if n)))
    if not names:
        raise errors.CheckpointCorruptError(
            f"The checkpoint state file `{state_path}` names no checkpoint (it is empty or "
            f"has no `model_checkpoint_path`).{hint}")
    return names


def state_candidates(directory: str) -> list[str]:
    """Checkpoint prefixes named by a directory's state file, newest first."""
    names = reversed(read_state(directory))
    return [n if os.path.isabs(n) else os.path.join(directory, n) for n in names]


def resolve_prefix(source: str | os.PathLike) -> tuple[str, tuple[str, ...]]:
    """Turns a prefix, `prefix.index` or directory into an intact prefix.

    Returns:
      (prefix, notes): notes say when an older checkpoint was used because the
      newest one named by a directory's state file is not intact.
    """
    source = os.fspath(source)
    if source.endswith(".index") and tf.io.gfile.exists(source):
        source = source[: -len(".index")]
    if os.path.isdir(source):
        notes = []
        for prefix in state_candidates(source):
            problem = check_intact(prefix)
            if problem is None:
                return prefix, tuple(notes)
            notes.append(f"skipped `{prefix}`: {problem}")
        raise errors.CheckpointCorruptError(
            f"Directory `{source}` has no intact checkpoint; every one its state file names is "
            "damaged or missing:\n  " + "\n  ".join(notes) +
            "\nRestore from another copy, or write a new checkpoint.")
    if tf.io.gfile.exists(source + ".index"):
        return source, ()
    if os.path.isfile(source):
        raise errors.CheckpointNotFoundError(
            f"`{source}` is a file, not a checkpoint prefix: expected `{source}.index` and "
            f"`{source}.data-*` beside it. Pass the prefix (the path without `.index` or "
            "`.data-*`); for a Keras `.weights.h5`/`.keras` file use model.load_weights.")
    found = nearby_prefixes(os.path.dirname(source))
    hint = f" Checkpoints found there: {', '.join(found)}." if found else ""
    raise errors.CheckpointNotFoundError(
        f"No checkpoint at prefix `{source}`: expected `{source}.index`, found nothing.{hint} "
        "Check the path, or pass the directory to use its newest checkpoint.")


# --- writing -------------------------------------------------------------------------

def temp_prefix(prefix: str) -> str:
    """A fresh temporary name beside `prefix` (`.<name>.tmp-<12 hex>`)."""
    directory, name = os.path.split(prefix)
    return os.path.join(directory, f".{name}.tmp-{uuid.uuid4().hex[:12]}")


def _no_stage(name: str) -> None:
    del name


def write_tensors(prefix: str, keys: list, tensors: list, stage=_no_stage) -> None:
    """Writes one checkpoint atomically: tensors under a temporary name, then `commit`.

    `stage(name)` is called at "write" (nothing written yet), "data" (temporary files
    complete) and "index" (committed under `prefix`); tests crash there.
    """
    directory = os.path.dirname(prefix)
    if directory:
        tf.io.gfile.makedirs(directory)
    temp = temp_prefix(prefix)
    try:
        stage("write")
        with tf.device("/cpu:0"):
            tf.raw_ops.SaveV2(prefix=temp, tensor_names=keys, shape_and_slices=[""] * len(keys),
                              tensors=tensors)
        stage("data")
        commit(temp, prefix)
        stage("index")
    finally:
        for leftover in tf.io.gfile.glob(temp + "*"):
            remove(leftover)


def commit(temp: str, prefix: str) -> None:
    """Moves the checkpoint written at `temp` (any number of data shards) to `prefix`.

    The old index goes first, so an old index never describes new data; then stale shards,
    then the data, the index last. A crash at any point leaves the old checkpoint, none, or
    the new one under `prefix`; never a mix.
    """
    if tf.io.gfile.exists(prefix + ".index"):
        tf.io.gfile.remove(prefix + ".index")
    new_data = sorted(tf.io.gfile.glob(temp + ".data-*"))
    targets = {prefix + name[len(temp):] for name in new_data}
    for stale in tf.io.gfile.glob(prefix + ".data-*"):
        if stale not in targets:
            tf.io.gfile.remove(stale)
    for name in new_data:
        rename(name, prefix + name[len(temp):])
    rename(temp + ".index", prefix + ".index")


def rename(src: str, dst: str) -> None:
    """Renames a file over any existing one (atomic on one local file system)."""
    tf.io.gfile.rename(src, dst, overwrite=True)


def write_state(directory: str, names: list[str], timestamp: float) -> None:
    """Writes TF's `checkpoint` state file atomically: `names` oldest first, the last newest."""
    text = [f'model_checkpoint_path: "{names[-1]}"']
    text += [f'all_model_checkpoint_paths: "{n}"' for n in names]
    text += [f"all_model_checkpoint_timestamps: {timestamp!r}" for _ in names]
    text.append(f"last_preserved_timestamp: {timestamp!r}")
    temp = temp_prefix(os.path.join(directory, STATE_FILE))
    try:
        with open(temp, "w") as f:
            f.write("\n".join(text) + "\n")
        os.replace(temp, os.path.join(directory, STATE_FILE))
    finally:
        remove(temp)


def listdir(directory: str) -> list[str]:
    """Names in a directory; none when it does not exist."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def remove(path: str) -> None:
    """Removes a file; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
