"""Checking a checkpoint on disk without loading a model.

`verify(source)` reads every tensor of a checkpoint once (TF checks each
one's CRC32C as it reads it), one tensor at a time, and checks the object
graph against the index: every node an edge or slot reference names exists,
every tensor the graph lists is in the index, every tensor in the index
belongs to the graph, and every object is reachable from the root. A
directory means every checkpoint its TF `checkpoint` state file names, or,
without a state file, every checkpoint in it.
Nothing is restored and no model is built. A URL (`gs://`, `s3://`) is listed remotely
and each checkpoint downloaded into a private local copy, checked as on disk.
"""

from __future__ import annotations

import bisect
import dataclasses
import os

from objckpt import errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._bundle import remote as _remote
from objckpt._formats import registry as _formats

__all__ = ["Problem", "VerifyReport", "tensor_problems", "verify"]


# What `verify` says of a tensor that cannot be read, before the reader's own words.
_TENSOR = "tensor unreadable or checksum mismatch: "


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint.

    Attributes:
      prefix: the checkpoint prefix (or the state file) it is about.
      where: the object path, checkpoint key or file concerned ("" for the
        whole checkpoint).
      message: what is wrong, in one line.
    """

    prefix: str
    where: str
    message: str

    @property
    def reason(self) -> str:
        """What is wrong in the words a restore refusing the checkpoint uses (its error
        message holds them): the message without the lead `verify` gives a tensor's."""
        return self.message[len(_TENSOR):] if self.message.startswith(_TENSOR) else self.message

    def __str__(self) -> str:
        # One line whatever the checkpoint's names hold: names through `safe`, the message
        # (which may quote names) through `safe_text`.
        where = f"`{_render.safe(self.where)}`: " if self.where else ""
        return f"{_render.safe(self.prefix)}: {where}{_render.safe_text(self.message)}"


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What `objckpt.verify` found (see there).

    Attributes:
      source: the prefix or directory given.
      prefixes: the checkpoints checked.
      tensors: how many tensors were read and passed their checksum.
      nbytes: the bytes of those tensors.
      problems: every problem found, in file order; empty when intact.
      notes: remarks that are not problems (e.g. a name-based checkpoint has
        no object graph to check).
    """

    source: str
    prefixes: tuple[str, ...]
    tensors: int
    nbytes: int
    problems: tuple[Problem, ...]
    notes: tuple[str, ...] = ()
    # What an intact report says was checked: TF checkpoints have checksums and a graph;
    # HDF5 files have neither (every dataset read, its shape and dtype as declared).
    checked: str = "passed their checksums; object graph consistent"

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        """One line per problem, then a summary line."""
        lines = [f"problem: {p}" for p in self.problems]
        lines += [f"note: {_render.safe_text(note)}" for note in self.notes]
        checked = _render.safe(", ".join(self.prefixes) or self.source)
        mb = _render.mb(self.nbytes)
        if self.ok:
            lines.append(f"OK: {checked}: {self.tensors:,} tensors ({mb}) {self.checked}")
        else:
            lines.append(f"FAILED: {checked}: {len(self.problems)} problem"
                         f"{'s' * (len(self.problems) != 1)}; {self.tensors:,} tensors "
                         f"({mb}) read intact. Fix: restore from an intact copy or an "
                         "older checkpoint, or write this one again.")
        return "\n".join(lines)


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


@errors.about_arguments(source="source")
def verify(source) -> VerifyReport:
    """Checks every tensor's checksum and the object graph of a checkpoint on disk.

    Args:
      source: a checkpoint prefix (object-based or name-based) or a directory
        of managed checkpoints (every checkpoint its state file names is
        checked, and the state file itself; without a state file, every
        checkpoint in it, as `objckpt.save` writes them), or a SavedModel directory (its
        `saved_model.pb` against its checkpoint `variables/variables`, then
        that checkpoint), or a file of another format: Keras HDF5 files and
        safetensors files (a `.safetensors`, a `model.safetensors.index.json` and
        its shards, or a folder holding either) have no checksums: their headers
        are checked and every tensor read once (`VerifyReport.checked` says so).

    Returns:
      A `VerifyReport`; `.ok` is True when nothing is wrong, `.problems` lists
      each problem with the object path or key it concerns.

    Raises:
      CheckpointNotFoundError: nothing at `source` (no `prefix.index`, or a
        directory without a state file and without checkpoints).

    Example:
      >>> report = objckpt.verify("/tmp/run")
      >>> report.ok, [str(p) for p in report.problems]
    """
    source = os.fspath(source)
    found = _formats.dispatch("verify", source, _checkpoints)
    problems = [Problem(*problem) for problem in found.problems]
    if found.checked:  # a file of another format, checked whole (HDF5: every dataset read)
        return VerifyReport(source, (source,), found.tensors, found.nbytes, tuple(problems),
                            tuple(found.notes), found.checked)
    prefixes = list(found.prefixes)
    total, nbytes, notes, graphs = 0, 0, list(found.notes), 0
    for prefix in prefixes:
        count, size, bad, remarks, graph = _verify_prefix(prefix)
        total += count
        nbytes += size
        problems.extend(bad)
        notes.extend(remarks)
        graphs += graph
    # Say "object graph consistent" only of graphs that were checked (a TF1 Saver checkpoint
    # has none: its note says so).
    checked = ("passed their checksums; object graph consistent" if graphs == len(prefixes)
               else "passed their checksums (name-based: no object graph)" if not graphs
               else f"passed their checksums; object graph consistent in the {graphs} "
                    f"object-based checkpoint{'s' * (graphs != 1)}")
    return VerifyReport(source, tuple(prefixes), total, nbytes, tuple(problems), tuple(notes),
                        checked)


def _checkpoints(source: str) -> _formats.Checked:
    """The TF checkpoint format's `verify` role (see `_formats`): the checkpoints to check
    (`_verify_prefix`) and the problems of a directory's state file."""
    prefixes, problems = _prefixes(source)
    return _formats.Checked(0, 0, tuple((p.prefix, p.where, p.message) for p in problems), (),
                            "", tuple(prefixes))


def _prefixes(source: str) -> tuple[list[str], list[Problem]]:
    from objckpt._bundle import files as _files

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
    from objckpt._bundle import files as _files

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
    from objckpt._bundle import files as _files

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
    from objckpt import _compat
    from objckpt._bundle import files as _files

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
    import tensorflow as tf

    notes = []
    paths = {}
    if _compat.OBJECT_GRAPH_KEY in shapes:
        graph_problems, paths = _check_graph(prefix, index, shapes)
        problems.extend(graph_problems)
    else:
        notes.append(f"{prefix}: name-based (TF1 Saver) checkpoint: no object graph to check; "
                     "tensors checked by variable name")

    keys = [k for k in sorted(shapes) if k != _compat.OBJECT_GRAPH_KEY]
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
    return len(intact), nbytes, problems, notes, _compat.OBJECT_GRAPH_KEY in shapes


def _verify_remote(prefix: str):
    """`_verify_prefix` of a URL: its objects listed and sized remotely, then downloaded
    into a private local copy (removed after), which is checked as on disk; the problems
    and notes name the URL."""
    from objckpt._bundle import files as _files

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
    from objckpt import _compat
    from objckpt._bundle import objgraph as _objgraph

    if _compat.OBJECT_GRAPH_KEY in index.beyond:  # past the end of a truncated shard
        return [Problem(prefix, _compat.OBJECT_GRAPH_KEY,
                        _TENSOR + index.beyond[_compat.OBJECT_GRAPH_KEY])], {}
    try:
        graph = _objgraph.read_object_graph(index, check=False)
    except errors.ObjckptError as err:  # damaged bytes or encoding: one problem, as restore
        damage = str(err).split(" Nothing was read")[0].split(" Fix:")[0]  # words it
        return [Problem(prefix, _compat.OBJECT_GRAPH_KEY, _render.first_line(damage))], {}
    problems = [Problem(prefix, where or _compat.OBJECT_GRAPH_KEY, problem)
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
            if key != _compat.OBJECT_GRAPH_KEY and key not in referenced and not (
                    at >= 0 and key.startswith(prefixes[at])):
                problems.append(Problem(prefix, key, "tensor in the index that no object of the "
                                                     "object graph refers to"))
    return problems, referenced
