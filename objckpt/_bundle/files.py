"""Checkpoint files on disk: resolving a source (a directory through what its `checkpoint`
state file lists; the file itself is `_ckptstate`'s), intact checks, and the one atomic
write-and-commit every writer uses.

A prefix is a checkpoint when `prefix.index` exists beside all of its data shards; the index
is what makes it one, so it is written last and removed first. Every writer (`objckpt.save`,
`migrate`, `callbacks.Checkpointing`) writes under a temporary name in the same directory and
commits with renames, so a crash leaves the old checkpoint, none, or the new one; never a mix.

Resolving a local prefix or directory (`resolve_prefix(..., tf_reader=False)`, the state file,
intact checks) needs no TensorFlow: TF is imported only by the functions that read tensors
with TF's reader, write checkpoints, or reach a remote (`gs://`, `ram://`) path, so the
command line's `inspect`, `graph` and `diff` start without it.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid

from objckpt import errors
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._bundle import remote as _remote
from objckpt._bundle import state as _ckptstate

__all__ = ["DATA_SUFFIX", "STATE_FILE", "check_intact", "check_prefix", "commit",
           "data_files_problem", "data_shards", "directory_prefixes", "inside",
           "intact_prefixes", "listdir", "nearby_prefixes", "not_a_prefix", "open_checked",
           "open_reader", "regular_file_problem", "remove", "rename", "resolve_prefix",
           "state_candidates", "state_prefixes", "temp_prefix", "write_tensors"]

STATE_FILE = _ckptstate.STATE_FILE  # the state file itself is `_ckptstate`'s
DATA_SUFFIX = ".data-00000-of-00001"


# --- untrusted files ------------------------------------------------------------------

# Why a path is not a regular file that is safe to open (one definition, in the lowest layer
# that needs it: the index validator refuses FIFOs and devices too).
regular_file_problem = _bundle.regular_file_problem

_SHARD = re.compile(r"([0-9]{5,})-of-([0-9]{5,})")


def data_shards(prefix: str) -> list[tuple[str, int, int]]:
    """The data shards beside `prefix`: (path, shard, number of shards), sorted.

    A shard is only a file named exactly `<prefix>.data-NNNNN-of-MMMMM` as TF names them;
    anything else that merely starts with `<prefix>.data-` (`.bak` copies, TF's
    `.tempstate*` leftovers) is not one, so it neither completes nor spoils a checkpoint.
    The directory is listed, not globbed (its name may hold `[` or `*`).

    Raises:
      OSError: the directory cannot be listed.
    """
    directory = os.path.dirname(prefix)
    start = os.path.basename(prefix) + ".data-"
    names = _list_names(directory, remote=_remote.is_remote(prefix))
    shards = []
    for name in names:
        match = _SHARD.fullmatch(name[len(start):]) if name.startswith(start) else None
        if match is not None:
            shard, count = int(match.group(1)), int(match.group(2))
            path = _bundle.shard_name(prefix, shard, count)
            if os.path.basename(path) == name:  # TF's spelling, no other
                shards.append((path, shard, count))
    return sorted(shards)


def _list_names(directory: str, *, remote: bool) -> list[str]:
    """Names in a directory: local (`os.listdir`), or remote (`_remote.listdir`: only plain
    names; its failures are OSError)."""
    if not remote:
        return os.listdir(directory or ".")
    return _remote.listdir(directory)


def _exists(path: str) -> bool:
    """Whether a local path or a remote object exists."""
    if not _remote.is_remote(path):
        return os.path.exists(path)
    return _remote.exists(path)


def _is_directory(path: str) -> bool:
    """A local directory, or a remote prefix that holds objects (object stores have no
    folders: `gs://bucket/run` is one when `gs://bucket/run/...` objects exist)."""
    if not _remote.is_remote(path):
        return os.path.isdir(path)
    return bool(_remote.listdir(path))


# --- reading -------------------------------------------------------------------------

def open_reader(prefix: str, *, data: bool = True):
    """TF's checkpoint reader for `prefix`, after `open_checked`'s validation."""
    return open_checked(prefix, data=data)[0]


def open_checked(prefix: str, *, data: bool = True):
    """(TF's checkpoint reader, the validated `_bundle.Index`) for `prefix`.

    The index and its data shards' sizes are validated in Python first (TF's C++ reader
    aborts the process on some crafted files); a damaged index is a CheckpointCorruptError.
    `data=False` lets entries past the end of a truncated data shard through (TF reports
    them when read; `verify` names them).
    """
    import tensorflow as tf

    try:
        index = _bundle.read_index(prefix, data=data)
    except FileNotFoundError as err:
        raise errors.CheckpointNotFoundError(
            f"No checkpoint at prefix `{_render.safe(prefix)}`: `{_render.safe(prefix)}.index` "
            "does not exist. Fix: check the path, or pass the directory to use its newest "
            "checkpoint.", source=prefix) from err
    try:
        return tf.train.load_checkpoint(prefix), index
    except (tf.errors.OpError, ValueError) as err:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(prefix)}` cannot be read: its index file "
            f"`{_render.safe(prefix)}.index` is damaged or not a checkpoint index. Received from "
            f"TF: {_render.first_line(err)}. Fix: restore from another checkpoint, or write this "
            "one again.", source=prefix) from err


def data_files_problem(prefix: str) -> str | None:
    """Why the data shards of `prefix` are incomplete, or None.

    Complete: for a number of shards M, every shard 0..M-1 exists as a regular file. Shards
    named for another M (leftovers of another write) neither complete nor spoil that set;
    which M the checkpoint uses is its index's to say (`open_reader` checks it).
    """
    try:
        shards = data_shards(prefix)
    except OSError as err:
        return f"its directory cannot be listed ({_render.first_line(err)})"
    if not shards:
        return f"its data file `{prefix}{DATA_SUFFIX}` is missing"
    sets: dict[int, dict[int, str]] = {}
    for path, shard, count in shards:
        sets.setdefault(count, {})[shard] = path
    problems = []
    for count, present in sorted(sets.items(), key=lambda item: -len(item[1])):
        missing = next((i for i in range(count) if i not in present), None)
        if count == 0 or max(present) >= count:
            problems.append(f"its data shard names are not TF's "
                            f"(`{os.path.basename(present[max(present)])}`)")
        elif missing is not None:
            problems.append(f"it has {len(present)} of {count} data shards (`{prefix}.data-"
                            f"{missing:05d}-of-{count:05d}` is missing)")
        else:
            bad = None if _remote.is_remote(prefix) else next(
                filter(None, map(regular_file_problem, present.values())), None)
            if bad is None:
                return None
            problems.append(bad)
    return problems[0]


def check_intact(prefix: str, *, tf_reader: bool = True) -> str | None:
    """Why `prefix` is not an intact checkpoint, or None if it looks intact.

    `tf_reader=False` validates the index in Python only (`_bundle.read_index`), without
    opening TF's reader (which also checks the index blocks' checksums).
    """
    if _remote.is_remote(prefix):
        try:
            if not _exists(prefix + ".index"):
                return f"`{prefix}.index` does not exist"
            missing = data_files_problem(prefix)
        except OSError as err:
            return f"it cannot be read ({_render.first_line(err)})"
        if missing:
            return missing
        tf_reader = False  # TF reads the local copy (`resolve_prefix` stages it)
    else:
        problem = regular_file_problem(prefix + ".index")
        if problem is not None:
            return problem
        missing = data_files_problem(prefix)
        if missing:
            return missing
    try:
        if tf_reader:
            open_reader(prefix)
        else:
            _bundle.read_index(prefix)
    except FileNotFoundError:  # CheckpointNotFoundError is one
        return f"`{_render.safe(prefix)}.index` does not exist"
    except errors.CheckpointCorruptError as err:
        return str(err)
    return None


def nearby_prefixes(directory: str, limit: int = 5) -> list[str]:
    """Up to `limit` checkpoint prefixes in a directory (for "did you mean" hints)."""
    try:
        names = sorted(n[: -len(".index")] for n in listdir_or_raise(directory)
                       if n.endswith(".index"))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names[:limit]]


def intact_prefixes(directory: str, limit: int = 5, *, tf_reader: bool = True) -> list[str]:
    """Up to `limit` intact checkpoints in a directory, by name (for hints in errors)."""
    found = []
    for prefix in nearby_prefixes(directory, limit=1000):
        if check_intact(prefix, tf_reader=tf_reader) is None:
            found.append(prefix)
            if len(found) == limit:
                break
    return found


def _hint(directory: str, tf_reader: bool = True) -> str:
    found = intact_prefixes(directory, tf_reader=tf_reader)
    if not found:
        return ""
    return (" Intact checkpoints found in the directory: "
            + ", ".join(f"`{_render.safe(p)}`" for p in found)
            + "; pass one of them as the prefix to restore from it.")


def inside(directory: str, path: str) -> bool:
    """Whether `path` resolves (`os.path.realpath`: links followed) to a place strictly inside
    `directory` (remote: a plain name directly in it)."""
    if _remote.is_remote(directory) or _remote.is_remote(path):
        root = directory.rstrip("/") + "/"
        rest = path[len(root):] if path.startswith(root) else ""
        return bool(rest) and "/" not in rest and rest not in (".", "..")
    try:
        root, real = os.path.realpath(directory), os.path.realpath(path)
    except (OSError, ValueError):  # ValueError: a NUL in a name read from a file
        return False
    return real != root and os.path.commonpath([root, real]) == root


def state_prefixes(directory: str, *, tf_reader: bool = True) -> tuple[list[str], list[str]]:
    """(prefixes a directory's state file names inside the directory, newest first; notes on
    the names skipped because they resolve outside it).

    A directory is read only from inside it: a state file naming `/elsewhere/ckpt-5` or
    `../other/ckpt-5` does not make its reader open that checkpoint (pass it as a prefix).

    Raises:
      as `_ckptstate.read_state`.
    """
    prefixes, notes = [], []
    names = _ckptstate.read_state(directory, hint=lambda: _hint(directory, tf_reader)).names
    for name in reversed(names):
        prefix = (name if os.path.isabs(name) or _remote.is_remote(name)
                  else os.path.join(directory, name))
        if inside(directory, prefix):
            prefixes.append(prefix)
            continue
        try:
            where = ("" if _remote.is_remote(directory) else
                     f" (it resolves to `{_render.safe(os.path.realpath(prefix))}`)")
        except (OSError, ValueError):
            where = ""
        notes.append(
            f"skipped `{_render.safe(name)}`, named by the state file "
            f"`{os.path.join(directory, STATE_FILE)}`: it is outside the directory "
            f"`{directory}`{where}. A directory's checkpoints are read only from inside it; "
            "pass that checkpoint's prefix explicitly to restore from it.")
    return prefixes, notes


def state_candidates(directory: str) -> list[str]:
    """Checkpoint prefixes named by a directory's state file inside it, newest first."""
    return state_prefixes(directory)[0]


# A temporary name of an unfinished write (`temp_prefix`): never a checkpoint of a directory.
_TEMP = re.compile(r"\..*\.tmp-[0-9a-f]{12}")
# A numbered series: `ckpt`, `ckpt-2`, `ckpt-3` (Checkpointing's and TF's `ckpt-N`, a TF1
# Saver's `model.ckpt-1000`).
_SERIES = re.compile(r"(.*?)(?:-(0|[1-9][0-9]{0,17}))?")


def directory_prefixes(directory: str) -> tuple[list[str], str]:
    """(the checkpoint prefixes in a directory without a state file, newest first; how
    "newest" was decided, for notes).

    Newest: when every checkpoint there is one numbered series (`ckpt`, `ckpt-2`,
    `ckpt-3`: one name, with or without `-N`), the highest number, as `Checkpointing` and
    `tf.train.CheckpointManager` number them (no number counts as 0); else the one whose
    index file was modified last (an `objckpt.save` commits its index last), equal times by
    name. Temporary files of unfinished writes are not checkpoints, nor is an index that
    resolves outside the directory (a link elsewhere: read only when passed as a prefix).
    """
    try:
        names = [n[: -len(".index")] for n in listdir_or_raise(directory)
                 if n.endswith(".index") and not _TEMP.fullmatch(n[: -len(".index")])
                 and inside(directory, os.path.join(directory, n))]
    except OSError:
        return [], ""
    series = [_SERIES.fullmatch(n) for n in names]
    if names and len({m.group(1) for m in series}) == 1:
        order = sorted(zip(names, series), key=lambda item: (int(item[1].group(2) or 0),
                                                               item[0]), reverse=True)
        return [os.path.join(directory, n) for n, _ in order], "the highest number"

    def modified(name: str) -> float:
        try:
            if _remote.is_remote(directory):
                return _remote.modified(os.path.join(directory, name + ".index")) or -1
            return os.stat(os.path.join(directory, name + ".index")).st_mtime_ns
        except OSError:
            return -1

    order = sorted(names, key=lambda n: (modified(n), n), reverse=True)
    return [os.path.join(directory, n) for n in order], "the index file modified last"


def _newest_on_disk(directory: str, shown: str, tf_reader: bool) -> tuple[str, tuple[str, ...]]:
    """The newest intact checkpoint of a directory without a state file (`directory_prefixes`);
    raises CheckpointNotFoundError when it has none, CheckpointCorruptError when none of its
    checkpoints is intact."""
    prefixes, how = directory_prefixes(directory)
    if not prefixes:
        raise errors.CheckpointNotFoundError(
            f"Directory `{shown}` holds no checkpoint: expected a TF `{STATE_FILE}` state file "
            "or checkpoint files (`<prefix>.index` beside `<prefix>.data-*`) in it, found "
            "neither. Fix: check the path, or pass a checkpoint prefix.", source=directory)
    skipped = []
    for prefix in prefixes:
        problem = check_intact(prefix, tf_reader=tf_reader)
        if problem is None:
            notes = [f"`{shown}` has no `{STATE_FILE}` state file: used `{_render.safe(prefix)}`"
                     f", the newest intact one of its {len(prefixes)} checkpoint(s) "
                     f"(newest: {how})."]
            notes += [f"skipped `{_render.safe(p)}`: {why}" for p, why in skipped]
            return prefix, tuple(notes)
        skipped.append((prefix, problem))
    raise errors.CheckpointCorruptError(
        f"Directory `{shown}` has no intact checkpoint; expected at least one, found:\n  "
        + "\n  ".join(f"`{_render.safe(p)}`: {why}" for p, why in skipped)
        + "\nFix: restore from another copy, or write a new checkpoint.", source=directory)


def resolve_prefix(source: str | os.PathLike, *,
                   tf_reader: bool = True) -> tuple[str, tuple[str, ...]]:
    """Turns a prefix, `prefix.index` or directory into an intact prefix.

    A remote source (`gs://`, `s3://`: `_remote`) is resolved the same way, remotely (its
    listing, state object and index validated with the data objects' sizes), then the
    chosen checkpoint is downloaded into a private local folder: the prefix returned is
    that copy (a `_remote.StagedPrefix`, whose `remote` is the URL), read as on disk.
    """
    prefix, notes = _resolve(source, tf_reader=tf_reader)
    if not _remote.is_remote(prefix):
        return prefix, notes
    try:
        shards = [(path, _remote.size(path)) for path, _, _ in data_shards(prefix)]
        return _remote.stage(prefix, shards), notes
    except FileNotFoundError as err:
        raise errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(prefix)}` changed while it was read: "
            f"{_render.first_line(err)} vanished. Expected its objects to stay while they "
            "are read. Fix: read it again, or read from a checkpoint no one is deleting.",
            source=prefix) from err
    except OSError as err:
        raise _unreachable(prefix, err) from err


def _unreachable(source: str, err: BaseException) -> errors.CheckpointNotFoundError:
    return errors.CheckpointNotFoundError(
        f"Remote checkpoint `{_render.safe(source)}` could not be read: "
        f"{_render.first_line(err)}. Expected its storage to answer (the client retried "
        "transient errors). Fix: check the URL, the network and the credentials (the "
        "client's standard settings, e.g. STORAGE_EMULATOR_HOST or AWS_ENDPOINT_URL), then "
        "try again.", source=source)


def _resolve(source: str | os.PathLike, *,
             tf_reader: bool = True) -> tuple[str, tuple[str, ...]]:
    """`resolve_prefix` without the download of a remote checkpoint.

    A directory gives the newest intact checkpoint its state file names inside it (the
    state file, which `Checkpointing`, `CheckpointManager` and `tf.train.CheckpointManager`
    write, decides). A directory without one (checkpoints written by `objckpt.save` or
    `tf.train.Checkpoint.write`) gives the newest intact checkpoint in it, by
    `directory_prefixes`' order. `tf_reader=False` checks checkpoints without TF (see
    `check_intact`): a local source is then resolved without importing TensorFlow.

    Returns:
      (prefix, notes): notes say when an older checkpoint was used because the newest one
      is not intact, which checkpoint a directory without a state file gave, or when a name
      in the state file was skipped because it lies outside the directory.
    """
    source = os.fspath(source)
    shown = _render.safe(source)  # a path may hold any character: one line on a terminal
    if source.endswith(".index") and _exists(source):
        source = source[: -len(".index")]
    if _remote.is_remote(source):
        try:
            return _resolve_remote(source, shown, tf_reader)
        except OSError as err:
            if isinstance(err, errors.ObjckptError):
                raise
            raise _unreachable(source, err) from err
    if os.path.isdir(source):
        if not _exists(os.path.join(source, STATE_FILE)) and not os.path.islink(
                os.path.join(source, STATE_FILE)):
            return _newest_on_disk(source, shown, tf_reader)
        return _newest_listed(source, shown, tf_reader, "state file",
                              f", or fix the state file `{os.path.join(source, STATE_FILE)}` "
                              "so that it names them")
    if _exists(source + ".index"):
        problem = regular_file_problem(source + ".index")
        if problem is not None:
            raise errors.CheckpointCorruptError(
                f"Checkpoint `{shown}` cannot be read: {problem}. Expected its index "
                f"`{shown}.index` to be a regular file (not opened). Fix: pass another "
                "checkpoint, or replace the file with the checkpoint's real index.", source=source)
        return source, ()
    if os.path.isfile(source):  # the format registry words it first for every public door
        raise not_a_prefix(source)
    found = nearby_prefixes(os.path.dirname(source))
    hint = (f" Checkpoints found there: {', '.join(map(_render.safe, found))}." if found
            else "")
    raise errors.CheckpointNotFoundError(
        f"No checkpoint at prefix `{shown}`: expected `{shown}.index`, found nothing.{hint} "
        "Fix: check the path, or pass the directory to use its newest checkpoint.", source=source)


def not_a_prefix(path: str, others: str = "") -> errors.UnsupportedFormatError:
    """The error for a regular file where a checkpoint prefix was expected: the words of
    the format registry's "unsupported format" message, which passes `others`, the files
    of the other formats it reads (generated from its list)."""
    shown = _render.safe(path)
    also = f" Files objckpt also reads: {others}; this one is none of them." if others else ""
    return errors.UnsupportedFormatError(
        f"`{shown}` is a file, not a checkpoint prefix: expected `{shown}.index` and "
        f"`{shown}.data-*` beside it. Fix: pass the prefix (the path without `.index` or "
        f"`.data-*`).{also}", source=path)


def _resolve_remote(source: str, shown: str, tf_reader: bool) -> tuple[str, tuple[str, ...]]:
    """`_resolve` of a URL: a prefix (its index object exists), else a directory (a state
    object, else its newest intact checkpoint), as on disk."""
    source = source.rstrip("/") if not source.endswith("://") else source
    if _exists(source + ".index"):
        return source, ()
    if not _is_directory(source):
        found = nearby_prefixes(os.path.dirname(source))
        hint = (f" Checkpoints found there: {', '.join(map(_render.safe, found))}."
                if found else "")
        raise errors.CheckpointNotFoundError(
            f"No checkpoint at `{shown}`: expected `{shown}.index` (a prefix) or objects under "
            f"`{shown}/` (a directory), found neither.{hint} Fix: check the URL, or pass the "
            "directory to use its newest checkpoint.", source=source)
    if not _exists(os.path.join(source, STATE_FILE)):
        return _newest_on_disk(source, shown, tf_reader)
    return _newest_listed(source, shown, tf_reader, "state object")


def _newest_listed(source: str, shown: str, tf_reader: bool, what: str,
                   repair: str = "") -> tuple[str, tuple[str, ...]]:
    """The newest intact checkpoint a directory's state file (`what`: "state file", or a
    remote "state object") names; CheckpointCorruptError when it names none intact (the
    message lists what was skipped, the intact ones found beside it, and `repair`: how to
    fix the state file, where that is a fix)."""
    prefixes, notes = state_prefixes(source, tf_reader=tf_reader)
    for prefix in prefixes:
        problem = check_intact(prefix, tf_reader=tf_reader)
        if problem is None:
            return prefix, tuple(notes)
        notes.append(f"skipped `{_render.safe(prefix)}`: {problem}")
    found = intact_prefixes(source, tf_reader=tf_reader)
    fix = (f"\nIntact checkpoints found in the directory, which its {what} does not name: "
           + ", ".join(f"`{_render.safe(p)}`" for p in found) + ". Fix: pass one of them as "
           f"the prefix to restore from it{repair}." if found
           else "\nFix: restore from another copy, or write a new checkpoint.")
    raise errors.CheckpointCorruptError(
        f"Directory `{shown}` has no intact checkpoint that its {what} names; expected at "
        "least one, found:\n  " + "\n  ".join(notes) + fix, source=source)


# --- writing -------------------------------------------------------------------------

def check_prefix(prefix: str) -> None:
    """Raises InvalidArgumentError when `prefix` cannot name a checkpoint to write: an
    existing directory (its files would land beside it, `<dir>.index`, and reading `<dir>`
    would then take the directory's checkpoints instead), or a path ending in a separator."""
    shown = _render.safe(prefix)
    if _remote.is_remote(prefix):
        if prefix.endswith("/"):
            raise errors.InvalidArgumentError(
                f"`{shown}` ends in `/`: it names a folder, not a checkpoint. Fix: add the "
                f"checkpoint's name, such as `{_render.safe(prefix + 'ckpt')}`.", source=prefix)
        return
    if os.path.isdir(prefix):
        inside = os.path.join(prefix.rstrip("/" + os.sep) or prefix, "ckpt")
        raise errors.InvalidArgumentError(  # source=: where it was to be written
            f"`{shown}` is a directory; a checkpoint prefix names the checkpoint's files "
            f"(`<prefix>.index`, `<prefix>.data-*`), which would be written beside the "
            f"directory. Fix: pass a prefix inside it, such as `{_render.safe(inside)}`; "
            f"`objckpt.restore(obj, \"{shown}\")` then reads the newest checkpoint there.",
            source=prefix)
    if not os.path.basename(prefix):
        raise errors.InvalidArgumentError(
            f"`{shown}` ends in a path separator: it names a folder, not a checkpoint. Fix: "
            f"add the checkpoint's name, such as `{_render.safe(os.path.join(prefix, 'ckpt'))}`.",
            source=prefix)


def temp_prefix(prefix: str) -> str:
    """A fresh temporary name beside `prefix` (`.<name>.tmp-<12 hex>`)."""
    directory, name = os.path.split(prefix)
    return os.path.join(directory, f".{name}.tmp-{uuid.uuid4().hex[:12]}")


def _no_stage(name: str) -> None:
    del name


def write_tensors(prefix: str, keys: list, tensors: list, stage=_no_stage, *,
                  durable: bool | None = None, workers: int | None = None,
                  slices: list | None = None) -> None:
    """Writes one checkpoint atomically: tensors under a temporary name, then `commit`.

    Large checkpoints are written by several threads as several data shards (see
    `_fastio.write_bundle`). durable: fsync every file written and the directory before the
    commit renames, and the directory after them (None: `_fastio.DURABLE_DEFAULT`).
    workers: threads writing (None: `_fastio.threads()`). slices: a slice spec per tensor
    ("" for a whole one), for the shards of sharded variables (`_fastio.write_bundle`).

    `stage(name)` is called at "write" (nothing written yet), "data" (temporary files
    complete) and "index" (committed under `prefix`); tests crash there.
    """
    if _remote.is_remote(prefix):
        _write_remote(prefix, keys, tensors, stage, workers, slices)
        return
    import tensorflow as tf

    from objckpt._bundle import fastio as _fastio

    check_prefix(prefix)
    durable = _fastio.DURABLE_DEFAULT if durable is None else bool(durable)
    directory = os.path.dirname(prefix)
    if directory:
        tf.io.gfile.makedirs(directory)
    temp = temp_prefix(prefix)
    try:
        stage("write")
        _fastio.write_bundle(temp, keys, tensors, workers, slices)
        if durable:
            _fastio.fsync_paths([path for path, _, _ in data_shards(temp)] + [temp + ".index"],
                                directory)
        stage("data")
        commit(temp, prefix)
        if durable:
            _fastio.fsync_paths([], directory)
        stage("index")
    finally:
        for leftover in _starting_with(temp):
            remove(leftover)


def _write_remote(prefix: str, keys: list, tensors: list, stage, workers: int | None,
                  slices: list | None = None) -> None:
    """`write_tensors` to remote storage: the bundle is written locally by the same writer,
    then uploaded in the commit order (`_remote.upload_bundle`: old index, data, index)."""
    import shutil

    from objckpt._bundle import fastio as _fastio

    check_prefix(prefix)
    folder = _remote.new_folder("upload")
    try:
        temp = os.path.join(folder, "bundle")
        stage("write")
        _fastio.write_bundle(temp, keys, tensors, workers, slices, here=True)
        _upload(temp, prefix, stage)
        stage("index")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _upload(temp: str, prefix: str, stage=_no_stage) -> None:
    """The local bundle at `temp` uploaded to the remote `prefix` in the commit order
    (`_remote.upload_bundle`: old index, stale and new data, index)."""
    data = [path for path, _, _ in data_shards(temp)]
    targets = {prefix + path[len(temp):] for path in data}
    try:
        old_index = _remote.exists(prefix + ".index")
        stale = [url for url, _, _ in data_shards(prefix) if url not in targets]
        _remote.upload_bundle(temp, prefix, data, old_index, stale, stage)
    except OSError as err:
        if isinstance(err, errors.ObjckptError):
            raise
        raise errors.CheckpointWriteError(
            f"Cannot write checkpoint `{_render.safe(prefix)}` to remote storage: "
            f"{_render.first_line(err)}. Expected the storage to accept the upload (the "
            "client retried transient errors). Nothing was committed: without its index "
            "no partial upload is a checkpoint, and earlier checkpoints are intact. Fix: "
            "check the network, the credentials and the bucket, then save again; with "
            "on_error='warn' training goes on without saving.", source=prefix) from err


def _starting_with(temp: str) -> list[str]:
    """Files whose names start with the (unique, temporary) name `temp` (no glob: a directory
    name may hold `[` or `*`)."""
    directory, start = os.path.split(temp)
    try:
        names = _list_names(directory, remote=_remote.is_remote(temp))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if n.startswith(start)]


def commit(temp: str, prefix: str) -> None:
    """Moves the checkpoint written at `temp` (any number of data shards) to `prefix`.

    The old index goes first, so an old index never describes new data; then stale shards,
    then the data, the index last. A crash at any point leaves the old checkpoint, none, or
    the new one under `prefix`; never a mix. Files beside `prefix` that are not data shards
    by TF's exact names (say `prefix.data-00000-of-00001.bak`) are left alone. A remote
    `prefix` (a URL) gets the local `temp` uploaded in that order (CheckpointWriteError when
    the storage fails); `temp` stays.
    """
    check_prefix(prefix)
    if _remote.is_remote(prefix):
        _upload(temp, prefix)
        return
    import tensorflow as tf

    if tf.io.gfile.exists(prefix + ".index"):
        tf.io.gfile.remove(prefix + ".index")
    new_data = [path for path, _, _ in data_shards(temp)]
    targets = {prefix + name[len(temp):] for name in new_data}
    for stale, _, _ in data_shards(prefix):
        if stale not in targets:
            tf.io.gfile.remove(stale)
    for name in new_data:
        rename(name, prefix + name[len(temp):])
    rename(temp + ".index", prefix + ".index")


def rename(src: str, dst: str) -> None:
    """Renames a file over any existing one (atomic on one local file system)."""
    import tensorflow as tf

    tf.io.gfile.rename(src, dst, overwrite=True)


def listdir_or_raise(directory: str) -> list[str]:
    """Names in a local or remote directory (OSError when it cannot be listed)."""
    if _remote.is_remote(directory):
        return _remote.listdir(directory)
    return os.listdir(directory or ".")


def listdir(directory: str) -> list[str]:
    """Names in a directory; none when it does not exist."""
    try:
        return listdir_or_raise(directory)
    except FileNotFoundError:
        return []


def remove(path: str) -> None:
    """Removes a file or a remote object; a missing one is fine."""
    if _remote.is_remote(path):
        _remote.remove(path)
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
