"""The TF checkpoint's `verify` role: every tensor of each checkpoint read once (TF checks
each one's CRC32C as it reads it), one tensor at a time, and the object graph checked
against the index by the checks every reader makes (`_bundle.graph_problems`), each problem
listed rather than refused at the first, plus what only `verify` asks: every object
reachable from the root, every tensor of the index owned by the graph. A directory means
every checkpoint its `checkpoint` state file names (and the state file itself), or, without
one, every checkpoint in it. A URL is listed remotely and each checkpoint downloaded into a
private local copy, checked as on disk.
"""

from __future__ import annotations

import bisect
import os
from typing import NamedTuple

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._bundle import index as _bundle
from objckpt._bundle import objgraph as _objgraph
from objckpt._bundle import remote as _remote

__all__ = ["TENSOR", "Problem", "check_prefixes", "tensor_problems", "verify"]

# What `verify` says of a tensor that cannot be read, before the reader's own words.
TENSOR = "tensor unreadable or checksum mismatch: "
_TENSOR = TENSOR
_GRAPH_KEY = _bundle.OBJECT_GRAPH_KEY


class Problem(NamedTuple):
    """One thing wrong: the prefix (or state file), the object path, key or file concerned
    ("" for the whole checkpoint), and what is wrong, in one line."""

    prefix: str
    where: str
    message: str


class Checked(NamedTuple):
    """What the checks of some prefixes found (the registry's `Checked` fields)."""

    tensors: int
    nbytes: int
    problems: tuple
    notes: tuple
    checked: str
    prefixes: tuple


def verify(source: str) -> Checked:
    """The `verify` role: the checkpoints of a prefix or directory, local or remote."""
    prefixes, problems = _prefixes(source)
    return check_prefixes(prefixes, problems)


def check_prefixes(prefixes, problems=(), notes=()) -> Checked:
    """Every prefix checked (`_verify_prefix`); `problems` and `notes` found before (a
    state file's, a SavedModel's) come first. `checked` says what an intact report checked:
    "object graph consistent" only of graphs that were checked (a TF1 Saver checkpoint has
    none: its note says so)."""
    problems, notes = list(problems), list(notes)
    total, nbytes, graphs = 0, 0, 0
    for prefix in prefixes:
        count, size, bad, remarks, graph = _verify_prefix(prefix)
        total += count
        nbytes += size
        problems.extend(bad)
        notes.extend(remarks)
        graphs += graph
    checked = ("passed their checksums; object graph consistent" if graphs == len(prefixes)
               else "passed their checksums (name-based: no object graph)" if not graphs
               else f"passed their checksums; object graph consistent in the {graphs} "
                    f"object-based checkpoint{'s' * (graphs != 1)}")
    return Checked(total, nbytes, tuple(tuple(p) for p in problems), tuple(notes), checked,
                   tuple(prefixes))


def tensor_problems(reader, keys, *, stop_at_first: bool = False):
    """Reads each key's tensor once (TF checks its CRC32C); yields (key, error line) per failure.

    One tensor at a time, so memory stays near the largest tensor. Shared by
    `verify` and `migrate`'s read-back check.
    """

    for key in keys:
        try:
            reader.get_tensor(key)
        except Exception as err:  # DataLossError, OutOfRangeError, ...: damage
            yield key, _render.first_line(err)
            if stop_at_first:
                return


def _prefixes(source: str) -> tuple[list[str], list[Problem]]:
    if _remote.is_remote(source):
        return _remote_prefixes(source)
    if source.endswith(".index") and os.path.isfile(source):
        source = source[: -len(".index")]
    if not os.path.isdir(source):
        _files.resolve_prefix(source)  # raises CheckpointNotFoundError with its hints
        return [source], []
    return _directory_prefixes(source, os.path.lexists(os.path.join(source, _files.STATE_FILE)))


def _remote_prefixes(source: str) -> tuple[list[str], list[Problem]]:
    """`_prefixes` of a URL: a prefix (its index object exists), else a directory (objects
    under it), else the resolver's "not found" error."""
    try:
        if source.endswith(".index") and _remote.exists(source):
            source = source[: -len(".index")]
        source = source.rstrip("/")
        if _remote.exists(source + ".index"):
            return [source], []
        names = _files.listdir(source)
    except OSError as err:
        if isinstance(err, errors.ObjckptError):
            raise
        raise _unreachable(source, err) from err
    if not names:
        _files.resolve_prefix(source)  # raises CheckpointNotFoundError with its hints
    return _directory_prefixes(source, _files.STATE_FILE in names)


def _unreachable(url: str, err: BaseException) -> errors.CheckpointNotFoundError:
    return errors.CheckpointNotFoundError(
        f"Remote checkpoint `{_render.safe(url)}` could not be verified: its storage did not "
        f"answer ({_render.first_line(err)}). Expected the storage to answer (the client "
        "retried transient errors). Fix: check the URL, the network and the credentials (the "
        "client's standard settings, e.g. STORAGE_EMULATOR_HOST or AWS_ENDPOINT_URL), then "
        "verify again.", source=url)


def _directory_prefixes(source: str, has_state: bool) -> tuple[list[str], list[Problem]]:
    """The checkpoints of a directory to check, and the problems of its state file."""
    state = os.path.join(source, _files.STATE_FILE)
    if not has_state:  # checkpoints written by objckpt.save: every one there
        found, _ = _files.directory_prefixes(source)
        if not found:
            _files.resolve_prefix(source)  # raises CheckpointNotFoundError, saying what it expected
        return list(reversed(found)), []
    try:
        names, outside = _files.state_prefixes(source)
    except errors.CheckpointCorruptError as err:
        found = _files.nearby_prefixes(source, limit=1000)
        if not found:
            raise
        return found, [Problem(state, "", str(err).splitlines()[0])]
    # A name outside the directory is not followed (restore would not either): a problem of
    # the state file.
    return list(reversed(names)), [Problem(state, "", note) for note in outside]


def _verify_prefix(prefix: str):
    """(tensors read intact, their bytes, problems, notes, whether an object graph was
    checked) for one prefix."""
    if _remote.is_remote(prefix):
        return _verify_remote(prefix)
    problems: list[Problem] = []
    if not os.path.exists(prefix + ".index"):
        return 0, 0, [Problem(prefix, prefix + ".index", "the index file is missing")], [], False
    missing = _files.data_files_problem(prefix)
    if missing:
        return 0, 0, [Problem(prefix, "", missing)], [
            f"{prefix}: tensors and object graph not read (data files incomplete)"], False
    try:
        reader, index = _files.open_checked(prefix, data=False)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
    except errors.CheckpointCorruptError as err:
        return 0, 0, [*problems, Problem(prefix, prefix + ".index", str(err))], [], False
    import tensorflow as tf  # the tensors are read by TF's reader, which checks them

    notes = []
    paths = {}
    if _GRAPH_KEY in shapes:
        graph_problems, paths = _check_graph(prefix, index, shapes)
        problems.extend(graph_problems)
    else:
        notes.append(f"{prefix}: name-based (TF1 Saver) checkpoint: no object graph to check; "
                     "tensors checked by variable name")

    keys = [k for k in sorted(shapes) if k != _GRAPH_KEY]
    bad = dict(index.beyond)  # past the end of a truncated shard: not read at all
    variant = {k for k in keys if dtypes[k] == tf.variant}  # not convertible to NumPy
    bad.update(tensor_problems(reader, [k for k in keys if k not in bad and k not in variant]))
    for key in sorted(variant - set(bad)):
        try:  # the op checks the checksum as the reader would
            with tf.device("/cpu:0"):
                tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key], shape_and_slices=[""],
                                     dtypes=[tf.variant])
        except tf.errors.OpError as err:
            bad[key] = _render.first_line(err)
    problems.extend(Problem(prefix, paths.get(key, key), _TENSOR + bad[key])
                    for key in keys if key in bad)
    intact = [k for k in keys if k not in bad]
    nbytes = 0
    for key in intact:
        count = 1
        for dim in shapes[key]:
            count *= dim
        nbytes += count * tf.as_dtype(dtypes[key]).size
    return len(intact), nbytes, problems, notes, _GRAPH_KEY in shapes


def _verify_remote(prefix: str):
    """`_verify_prefix` of a URL: its objects listed and sized remotely, then downloaded
    into a private local copy (removed after), which is checked as on disk; the problems
    and notes name the URL."""
    try:
        if not _remote.exists(prefix + ".index"):
            return 0, 0, [Problem(prefix, prefix + ".index", "the index object is missing")], \
                [], False
        missing = _files.data_files_problem(prefix)
        if missing:
            return 0, 0, [Problem(prefix, "", missing)], [
                f"{prefix}: tensors and object graph not read (data objects incomplete)"], False
        shards = [(path, _remote.size(path)) for path, _, _ in _files.data_shards(prefix)]
        local = _remote.stage(prefix, shards)
    except FileNotFoundError as err:  # deleted while it was listed
        return 0, 0, [Problem(prefix, "", f"an object vanished while it was read "
                                          f"({_render.first_line(err)})")], [], False
    except OSError as err:
        if isinstance(err, errors.ObjckptError):
            raise
        raise _unreachable(prefix, err) from err
    count, size, problems, notes, graph = _verify_prefix(local)
    problems = [Problem(prefix, _remote.unstaged(p.where), _remote.unstaged(p.message))
                for p in problems]
    return count, size, problems, [_remote.unstaged(note) for note in notes], graph


def _check_graph(prefix: str, index, shapes):
    """Problems of the object graph against the index, and {checkpoint key: object path}.

    The graph is decoded by `_objgraph` and checked by `_bundle.graph_problems`, the one
    reader and the checks restore, `read_tree` and `inspect` make (which refuse at the
    first problem, worded as here); every problem is listed. Then what only `verify` asks:
    every node reachable from the root, every tensor of the index owned by the graph.
    """
    if _GRAPH_KEY in index.beyond:  # past the end of a truncated shard
        return [Problem(prefix, _GRAPH_KEY,
                        _TENSOR + index.beyond[_GRAPH_KEY])], {}
    try:
        graph = _objgraph.read_object_graph(index, check=False)
    except errors.ObjckptError as err:  # damaged bytes or encoding: one problem, as restore
        damage = str(err).split(" Nothing was read")[0].split(" Fix:")[0]  # words it
        return [Problem(prefix, _GRAPH_KEY, _render.first_line(damage))], {}
    problems = [Problem(prefix, where or _GRAPH_KEY, problem)
                for _, where, problem in _bundle.graph_problems(graph, shapes)]
    count = len(graph.nodes)
    if count == 0:
        return problems, {}
    order = [0] + [node for _, _, node in _paths.graph_walk(graph, slots=True)]
    reachable = set(order)
    unreachable = [i for i in range(count) if i not in reachable]
    if unreachable:
        problems.append(Problem(prefix, "", f"{len(unreachable)} object graph node(s) are not "
                                            f"reachable from the root: {unreachable[:10]}"))
    referenced: dict[str, str] = {}
    for node in graph.nodes:
        for attribute in node.attributes:
            referenced[attribute.checkpoint_key] = _paths.path_of_key(attribute.checkpoint_key)
    if not any(node.registered for node in graph.nodes):
        prefixes = sorted(referenced)  # a saveable's tensors: its key plus a suffix
        for key in sorted(shapes):
            at = bisect.bisect_right(prefixes, key) - 1
            if key != _GRAPH_KEY and key not in referenced and not (
                    at >= 0 and key.startswith(prefixes[at])):
                problems.append(Problem(prefix, key, "tensor in the index that no object of the "
                                                     "object graph refers to"))
    return problems, referenced
