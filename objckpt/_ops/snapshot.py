"""In-memory snapshots, saving, and all-or-nothing restore by object path."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import weakref
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._bundle import files as _files
from objckpt._planning import checks as _checks
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import sources as _sources
from objckpt._planning import tree as _tree

# The pipeline's stages, under the names other modules and tests know them by.
from objckpt._planning.pipeline import AGREED_BYTES as _AGREED_BYTES  # noqa: F401
from objckpt._planning.pipeline import agree_across_workers, fetch_values  # noqa: F401

__all__ = ["RestoreReport", "Snapshot", "restore", "save", "snapshot"]



class Snapshot(_tree.FrozenMapping):
    """An immutable mapping object path -> tensor: the values of an obj at one time.

    Tensors stay on the variables' devices and share memory with the values
    they were read from; TF copies on the next write to a variable, so later
    training never changes a Snapshot. `numpy()` gives host copies.

    A Snapshot can also be built from any mapping of object path -> array:
    `Snapshot({"hidden/_kernel": np.ones((3, 4))})`.
    """

    __slots__ = ("_keep", "_origin")

    def __init__(self, values: Mapping):
        super().__init__({str(path): tf.convert_to_tensor(value) for path, value in values.items()})
        self._origin = None
        self._keep = None

    @classmethod
    def _of_tree(cls, variables: _tree.VariableTree, values: list) -> Snapshot:
        result = cls.__new__(cls)
        _tree.FrozenMapping.__init__(result, dict(zip(variables, values)))
        result._origin = weakref.ref(variables)
        result._keep = None
        return result

    def origin(self) -> _tree.VariableTree | None:
        """The live tree this snapshot was taken from, while it exists unchanged."""
        return self._origin() if self._origin is not None else None

    def numpy(self) -> dict[str, np.ndarray]:
        """Returns host (NumPy) copies of every value, keyed by object path."""
        return {path: np.array(value) for path, value in self.as_dict().items()}

    @property
    def nbytes(self) -> int:
        return sum(value.shape.num_elements() * value.dtype.size
                   for value in self.as_dict().values())

    def __repr__(self) -> str:
        return f"Snapshot({len(self)} variables, {_render.mb(self.nbytes)})"

    def as_source(self) -> _sources.Source:
        """This snapshot as a plan source (its network paths and slot owners included)."""
        origin = self.origin()
        # Taken from a live obj whose canonical paths run through its optimizer (a
        # trained Keras 3 model): its network paths feed untrained models too.
        if origin is None:
            return _sources.snapshot_source(self.as_dict())
        return _sources.snapshot_source(self.as_dict(), origin.network_aliases(),
                                        origin.slot_owners)


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What a restore did.

    Attributes:
      restored: object paths (of the obj) that received a value.
      missing: object paths of the obj that the source has no value for.
      unexpected: source paths (after `at`) that match no variable of the obj.
      source: the source, described (prefix, or "Snapshot").
      at: the source subtree that was used, or None for its root.
      notes: anything worth knowing: an `at` picked automatically, an older
        checkpoint used because the newest is damaged.
      plan: the `Plan` that was applied (None for the fast path of a Snapshot
        restored into the obj it was taken from).
      skipped: source entries and variables left out on purpose, with why:
        optimizer state with nowhere to go (`optimizer_state="auto"` into an obj
        without an optimizer), or belonging to a variable that was not restored,
        random generator state the source lacks, entries dropped by rules.
    """

    restored: tuple[str, ...]
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    source: str = ""
    at: str | None = None
    notes: tuple[str, ...] = ()
    plan: _match.Plan | None = dataclasses.field(default=None, repr=False, compare=False)
    skipped: tuple[str, ...] = ()

    def __str__(self) -> str:
        # Paths through `safe`, messages through `safe_text`: the source's names are data.
        safe, text = _render.safe, _render.safe_text
        lines = [f"restored {len(self.restored)} variables from {text(self.source)}"
                 + (f" (at={self.at!r})" if self.at else "")]
        if self.missing:
            shown = (self.plan.label if self.plan is not None
                     else lambda path: f"`{safe(path)}`")
            lines.append(f"missing from the source ({len(self.missing)}): "
                         + ", ".join(map(shown, self.missing)))
        if self.unexpected:
            lines.append(f"not in the obj ({len(self.unexpected)}): "
                         + ", ".join(map(safe, self.unexpected)))
        if self.skipped:  # entries skipped for one reason share one line
            lines.append(f"skipped ({len(self.skipped)}):")
            lines.extend(_render.listed(map(text, _render.grouped(self.skipped)), limit=5))
        lines.extend(map(text, self.notes))
        return "\n".join(lines)


# Called inside a user's tf.function: run as Python, never converted by AutoGraph (its
# errors stay objckpt's own, and nothing is converted on every trace).
@tf.autograph.experimental.do_not_convert
@errors.about_arguments(obj="obj")
def snapshot(obj) -> Snapshot:
    """Takes an immutable in-memory Snapshot of every variable of obj.

    No bytes are copied and nothing goes through NumPy: each value shares the
    variable's current buffer until the variable is next written.

    Under `tf.distribute` (MirroredStrategy, MultiWorkerMirroredStrategy) each
    value is the one `tf.train.Checkpoint` saves: a `MirroredVariable`'s
    (replica 0's component; its replicas hold the same value), and a
    SyncOnRead variable's aggregate across all replicas: the sum for
    aggregation SUM (metric totals and counts), the mean for MEAN (tf_keras
    and Keras 2 BatchNormalization statistics), replica 0's component for
    ONLY_FIRST_REPLICA. Reading a SUM or MEAN one is a reduction across the
    replicas (a collective under MultiWorkerMirroredStrategy: every worker
    must take the snapshot). A `ShardedVariable` raises
    `DistributedVariableError`.

    Args:
      obj: any trackable (Keras model or layer of any flavour, `tf.Module`,
        `tf.train.Checkpoint`, optimizer).

    Returns:
      A `Snapshot` with the keys of `objckpt.tree(obj)`.

    Example:
      >>> best = objckpt.snapshot(model)
      >>> ...  # train on
      >>> objckpt.restore(model, best)
    """
    variables = _tree.tree(obj)
    _check_cross_replica(variables, "snapshot")
    snap = Snapshot._of_tree(variables, variables.fused.read_all())
    if not _tree.is_cached(obj, variables):
        # Nothing else keeps this tree (an obj without a cheap fingerprint, such as a
        # tf.train.Checkpoint): the Snapshot does, for what saving it needs to know.
        snap._keep = variables
    return snap


def _check_cross_replica(variables, operation: str) -> None:
    """Refuses to read or assign distributed variables inside `strategy.run`.

    In a replica context a SyncOnRead variable reads as its own replica's component (not
    the aggregate TF saves) and assigns to that component only, and a MirroredVariable
    cannot be assigned without an aggregation: values would be wrong without an error.
    """
    running = _compat.replica_context_strategy()
    if running is None:
        return
    for path, variable in variables.items():
        if isinstance(variable, tf.distribute.DistributedValues):
            kind = type(variable).__name__
            raise errors.DistributedVariableError(
                f"objckpt.{operation} was called inside `strategy.run` of a "
                f"{type(running).__name__} (a replica context), where `{_render.safe(path)}` "
                f"({kind}) and every other distributed variable show only this replica's "
                "component. Expected: a cross-replica context. Fix: call "
                f"objckpt.{operation} outside strategy.run (inside or outside "
                "`strategy.scope()`), e.g. between training steps; to copy weights inside a "
                "step use objckpt.Twins.", path=path, variable_type=kind)


@tf.autograph.experimental.do_not_convert
def restore(obj, source, *, rules=None, strict: bool = True, at: str | None = None,
            optimizer_state="auto") -> RestoreReport:
    """Restores obj's variables from a source, all or nothing.

    Source entries are matched to variables by `objckpt.plan` (object path,
    rules, variable name, structure). Every shape, dtype, missing, unexpected
    and ambiguous entry is checked from metadata before a single variable is
    assigned, and every value is read before the first assignment: when
    anything is wrong, an error is raised and every variable keeps its exact
    previous value.

    Args:
      obj: the trackable to restore into; it must be built.
      source: a `Snapshot`, a checkpoint prefix, a directory (its newest
        intact checkpoint; older ones are used when the newest is damaged), or
        a name-based (TF1 `Saver`) prefix, usually with rules. A directory's
        `checkpoint` state file (Checkpointing, CheckpointManager, TF) says
        which is newest; without one (checkpoints from `objckpt.save`), a
        numbered series (`ckpt`, `ckpt-2`, `ckpt-3`) by number, other names
        by when their index was written; the report's notes say which.
      rules: ordered `(regex, replacement)` or `(regex, replacement,
        transform)` rewrites of source keys. Each key is rewritten by the
        first rule whose regex matches it (`re.sub(regex, replacement, key,
        count=1)`), once: rules never chain. A None replacement drops the
        entry; keys no rule matches stay as they are. The rewritten key then
        matches a variable by object path, by object path with leading
        underscores stripped, or by variable name. To chain, write one rule
        with a combined regex, or rules that each match the full original
        key. See `objckpt.plan`.
      strict: if True (default), entries missing from the source or extra in it
        are errors. If False they are skipped and listed in the report. A shape
        or dtype mismatch, or an ambiguous match, is an error either way.
      at: restore from this subtree of the source, e.g. at="model" for a
        checkpoint written by `tf.train.Checkpoint(model=m, optimizer=o)`.
        When None (and no rules) and the source's root does not match obj but
        exactly one child subtree does, that subtree is used and the report
        says so.
      optimizer_state: "auto" (default): when obj has an optimizer,
        optimizer slots and counters move by the variable they belong to
        (e.g. tf_keras Adam `m`/`v` into a Keras 3 Adam); an optimizer not
        built yet (a model compiled in a new process) is built first as
        Keras's first training step builds it (a model's own optimizer on its
        `trainable_variables`), so the next step equals the uninterrupted
        run's; when obj has no optimizer (an uncompiled model), they are
        skipped and listed in the report's `skipped`, as `load_weights` does.
        True: the same, but an obj without an optimizer is an error. False:
        optimizer entries are ignored on both sides (obj's optimizer keeps its
        values). Optimizer state never moves by position between different
        optimizer layouts: an entry whose owner feeds no variable is skipped
        and listed; a slot of a variable the source holds no state for gets a
        fresh optimizer's value (zeros, or Adagrad's initial accumulator), listed.

    Returns:
      A frozen `RestoreReport`; its `plan` says which entry fed which variable.

    Raises:
      StructureMismatchError: shapes, dtypes, ambiguous, missing or unexpected
        entries.
      UnbuiltModelError: obj has no variables yet.
      InvalidArgumentError: malformed rules.
      CheckpointNotFoundError, CheckpointCorruptError: the source cannot be used.

    Example:
      >>> objckpt.restore(model, "/tmp/run/ckpt-3", at="model")
      >>> objckpt.restore(model, "tf1/model.ckpt", rules=[("^model_001/", "")])

    Under `tf.distribute` every replica receives the value as
    `tf.train.Checkpoint` restores it (TF's `values_util`), so an objckpt round
    trip and a TF one leave the same bits in every replica: a
    `MirroredVariable`'s replicas all get the value; a SyncOnRead variable with
    aggregation SUM gets `value / num_replicas_in_sync` in each replica, cast
    to its dtype (integers truncate), so its aggregate is the saved value;
    MEAN and ONLY_FIRST_REPLICA ones get the value in each replica. The source
    may come from any strategy and number of replicas (or none): a checkpoint
    holds one value per variable. All or nothing holds across replicas: when
    the restore fails, every replica's component keeps its exact bits. A
    `ShardedVariable` in obj raises `DistributedVariableError`; checkpoints TF
    wrote from one restore into unsharded variables.

    Under `MultiWorkerMirroredStrategy` (obj's) every worker must call
    `restore`, with the same obj and source, as with `save`, even for a
    `Snapshot` and for obj without SyncOnRead variables (unlike
    `tf.train.Checkpoint.restore`, which a chief may call alone): all or
    nothing holds across workers, so each worker's checks are agreed by one
    small collective before anything is assigned. A restore called on one
    worker only waits for the others (until the strategy's collective
    timeout, if one is set). When it fails on one worker, every worker
    raises and nothing changes anywhere: the failing worker its own error,
    the others an error of the same objckpt type (`ObjckptError` for any
    other error) naming the failing worker's task, error type and message.
    Inside a `tf.function` the agreement runs while the function is traced
    (every worker traces it).
    """
    variables = _tree.tree(obj)
    _check_cross_replica(variables, "restore")
    pipe = _pipeline.Pipeline("objckpt.restore", obj, source, rules=rules, at=at,
                              strict=strict, optimizer_state=optimizer_state)
    # Taken from this very obj, and its structure is unchanged: the paths, shapes and
    # dtypes are the ones just read, so there is nothing to check.
    fast = (isinstance(source, Snapshot) and at is None and not rules
            and optimizer_state in (None, "auto") and source.origin() is variables)
    cache_key = _plan_cache_key(source, rules, strict, at, optimizer_state)
    # A Snapshot of a tree planned into this tree before: the same paths, shapes and
    # dtypes on both sides (each tree is immutable), so the same checked plan.
    cached = None if fast else _cached_plan(variables, source, cache_key)
    src = the_plan = loader = values = None

    def failed(err):
        if loader is not None:
            loader.close()
        pipe.about(err)

    with pipe.decided(lambda: variables, about=failed):
        if fast:
            values = list(source.as_dict().values())
        elif cached is not None:
            items = source.as_dict()
            values = [items[key] for key in cached[1]]
        else:
            src = pipe.open()
            variables, the_plan = pipe.plan(variables, src)
            loader = _streamed(src, the_plan, variables)
            if loader is not None:  # every checksum checked, nothing read into memory
                loader.verify()
            else:
                values = pipe.fetch(the_plan, variables)
    if fast:  # the whole tree, fused
        variables.fused.assign_all(values)
        _compat.refresh_derived_state(obj, key=variables)  # Normalization's cached mean
        return RestoreReport(tuple(variables), source="Snapshot")
    if cached is not None:
        report = cached[2]
        _assign(variables, report.plan, values)
        _start_fresh(obj, variables, report.plan)
        _compat.refresh_derived_state(obj, lambda: map(variables.get, report.restored),
                                      key=variables, merged=False)
        return report
    if loader is not None:
        try:
            loader.assign()
        finally:
            loader.close()
    else:
        _assign(variables, the_plan, values)
    _start_fresh(obj, variables, the_plan)
    _compat.refresh_derived_state(obj, lambda: [variables[m.target] for m in the_plan.matches],
                                  key=variables, merged=not src.keyed_by_path)
    # (Normalization's cached mean; a Keras weights file's merged kernel: zero LoRA factors)
    report = RestoreReport(tuple(m.target for m in the_plan.matches),
                           the_plan.unmatched_variables, the_plan.unmatched_source,
                           src.description, the_plan.at, the_plan.notes, the_plan,
                           the_plan.skipped)
    if cache_key is not None:
        # Kept without the source (its tensors and origin tree stay the caller's), and
        # returned as is on every hit: the report is the same for every snapshot of it.
        report = dataclasses.replace(report, plan=the_plan.detached())
        if len(variables.plans) >= _PLAN_CACHE_SIZE:
            variables.plans.pop(next(iter(variables.plans)))
        aliases = src.aliases
        variables.plans[cache_key] = (
            weakref.ref(source.origin()),
            tuple(aliases.get(m.source, m.source) for m in the_plan.matches), report)
    return report


# Plans kept per target tree, for Snapshots of this many other trees.
_PLAN_CACHE_SIZE = 8


def _plan_cache_key(source, rules, strict, at, optimizer_state):
    """The key a checked plan of this restore is cached under, or None (not cached).

    Only Snapshots taken from a live tree, without rules: the origin tree's identity
    stands for its paths, shapes and dtypes, as the target tree's does for its own.
    """
    if not isinstance(source, Snapshot) or rules or source.origin() is None:
        return None
    return (id(source.origin()), bool(strict), at, _match.optimizer_mode(optimizer_state))


def _cached_plan(variables, source, cache_key):
    """(origin tree's ref, source keys, report) cached for this restore, or None."""
    cached = variables.plans.get(cache_key) if cache_key is not None else None
    if cached is None or cached[0]() is not source.origin():
        return None
    return cached


def _streamed(src, the_plan: _match.Plan, variables):
    """A `_fastio.Loader` restoring the plan from a local TF checkpoint one tensor at a
    time after checking every checksum, or None (then values are fetched as a whole):
    inside a `tf.function`, with a rule's transform, for distributed variables, and below
    `_fastio.STREAM_BYTES` (where reading everything at once and one fused assign is faster
    and holding a second copy costs little)."""
    if (src.bundle_keys is None or not src.prefix or "://" in src.prefix
            or not tf.executing_eagerly() or not the_plan.matches):
        return None
    targets = [variables[m.target] for m in the_plan.matches]
    if any(m.transform is not None for m in the_plan.matches) or any(
            _compat.replica_parts(v) is not None or not v.shape.is_fully_defined()
            or _compat.is_distributed_variable(type(v)) for v in targets):
        return None
    from objckpt._bundle import fastio as _fastio

    total = sum(v.shape.num_elements() * v.dtype.size for v in targets)
    if total < _fastio.STREAM_BYTES:
        return None
    keys = src.bundle_keys([m.source for m in the_plan.matches])
    label_of = {key: the_plan.label(m.target) for key, m in zip(keys, the_plan.matches)}
    return _fastio.Loader(
        src.prefix, [(key, v, label_of[key]) for key, v in zip(keys, targets)],
        lambda variable, value: variable.assign(value, read_value=False),
        lambda key: f"for {label_of.get(key, key)}")


def _start_fresh(obj, variables, the_plan: _match.Plan) -> None:
    """Gives the optimizer slots of `the_plan.fresh` a fresh optimizer's value: their variable
    was restored, but the source's optimizer held no state for it."""
    for path, role in the_plan.fresh:
        variable = variables[path]
        variable.assign(_compat.fresh_slot_value(obj, role, variable), read_value=False)


def _assign(variables, the_plan: _match.Plan, values) -> None:
    if len(the_plan.matches) == len(variables) and all(
            m.target == p for m, p in zip(the_plan.matches, variables)):
        variables.fused.assign_all(values)
    else:
        for match, value in zip(the_plan.matches, values):
            variables[match.target].assign(value, read_value=False)


# --- saving --------------------------------------------------------------------


@tf.autograph.experimental.do_not_convert
@errors.about_arguments(source="prefix", obj="obj_or_snapshot")
def save(obj_or_snapshot, prefix: str | os.PathLike, *, blocking: bool = True,
         durable: bool | None = None):
    """Writes a standard TF object-based checkpoint with obj as its root.

    `tf.train.Checkpoint(root=same_structure).read(prefix)` loads it, and so
    does `objckpt.restore`. Saving a Snapshot gives the same layout as saving
    the obj it was taken from. The write is atomic: files are written under a
    temporary name and renamed, the index last, so a crash never leaves a
    half-written checkpoint under `prefix`: an existing checkpoint there stays
    readable while the new one is written; a crash during the final renames
    leaves the old one, none, or the new one, never a mix.

    Large checkpoints are written by several threads (sized to the machine;
    the environment variable OBJCKPT_IO_THREADS overrides): each checksums
    its tensors and writes them straight from their buffers at their
    offsets in one data file, whose bytes, like the index's, are those TF's
    `SaveV2` writes, so `tf.train.Checkpoint`, `tf.train.load_checkpoint`
    and `objckpt verify` read it. (Variant tensors go through `SaveV2` parts
    on several threads instead: `prefix.data-0000k-of-0000K` under one
    index, TF's sharded layout.) Values are read without copying them (TF
    copies a variable's buffer only when it is next updated), so saving
    needs no second copy of the model in memory.

    With `blocking=False` the values are taken at the call and written on a
    background thread: the call returns a `SaveHandle` at once, and training
    may go on; `handle.result()` waits for the write and returns the prefix
    or raises what a blocking save would have raised. Saves without blocking
    are written one at a time, in call order.

    Under `tf.distribute` it writes what `tf.train.Checkpoint` writes: one
    value per variable, a `MirroredVariable`'s (its replicas are equal) and a
    SyncOnRead variable's aggregate across replicas (the sum of a SUM
    variable, such as a metric's total; the mean of a MEAN one, such as
    tf_keras BatchNormalization statistics; replica 0's for
    ONLY_FIRST_REPLICA). `objckpt.restore` puts them back as TF does.

    Under `MultiWorkerMirroredStrategy` every worker must call `save` with
    the same obj, as with `tf.train.Checkpoint.save`: reading a SyncOnRead
    variable is a collective operation across the workers. Only the chief
    (TF's `strategy.extended.should_checkpoint`: task 0 of the "chief" job,
    or of "worker" when there is no chief) writes `prefix`; the other
    workers read the same values and write nothing, and every worker returns
    `prefix`. Saving a `Snapshot` reads nothing (`snapshot` did, on every
    worker) and writes on the chief only (one built from a mapping, with no
    live obj behind it, follows the strategy in scope: outside
    `strategy.scope()` every worker writes it). `prefix` should be on storage
    the workers share when they restore from it.

    Args:
      obj_or_snapshot: a trackable obj or a `Snapshot`.
      prefix: where to write (`prefix.index`, `prefix.data-00000-of-00001`, or
        several data shards when variant tensors are written by `SaveV2` parts);
        missing folders are created. An existing directory is refused
        (InvalidArgumentError): pass a prefix inside it (`run/ckpt`), and
        `restore(obj, "run")` reads the newest checkpoint there.
      blocking: False: write on a background thread and return a `SaveHandle`.
      durable: True: fsync every file written and the directory before the
        final renames, and the directory after them, so the checkpoint
        survives a power cut once `save` returns (TF does not). False: leave
        that to the operating system. None (default): the library default,
        `objckpt._bundle.fastio.DURABLE_DEFAULT` (see the README for its cost).

    Returns:
      The prefix written (on a non-chief worker: the chief's prefix); with
      `blocking=False`, a `SaveHandle` whose `result()` returns it.

    Raises:
      UnbuiltModelError: there is nothing to save.
      DistributedVariableError: obj has a `ShardedVariable`.
      InvalidArgumentError: `prefix` is an existing directory.
    """
    if not isinstance(blocking, bool):
        raise errors.InvalidArgumentError(
            f"blocking must be True or False. Received: blocking={blocking!r}. Fix: pass "
            "blocking=False to write on a background thread.")
    if durable is not None and not isinstance(durable, bool):
        raise errors.InvalidArgumentError(
            f"durable must be True, False or None. Received: durable={durable!r}. Fix: pass "
            "durable=True to fsync before the checkpoint is committed.")
    if isinstance(obj_or_snapshot, Snapshot):
        snap = obj_or_snapshot
        origin = snap.origin()
    else:  # the tree held here: an obj's tree may be cached nowhere (a tf.train.Checkpoint)
        origin = _tree.tree(obj_or_snapshot)
        _check_cross_replica(origin, "save")
        # On every worker of a multi-worker strategy: SyncOnRead reads are collectives.
        snap = Snapshot._of_tree(origin, origin.fused.read_all())
    prefix = os.fspath(prefix)
    _files.check_prefix(prefix)  # never `<dir>.index` beside an existing directory
    if not snap:
        raise errors.UnbuiltModelError(
            f"Nothing to save to `{prefix}`: {_checks.describe_obj(obj_or_snapshot)} has no "
            "variables. Fix: build the model (call it on a batch, or model.build(shape)) "
            "before saving it.", source=prefix, obj=_checks.describe_obj(obj_or_snapshot))
    if not _compat.writes_checkpoints(origin.values() if origin is not None else ()):
        # a worker that is not the chief: the chief writes `prefix`
        return prefix if blocking else SaveHandle._finished(prefix)
    names = ([_compat.variable_name(v) for v in origin.values()] if origin is not None
             else [""] * len(snap))
    paths = list(snap)
    aliases = origin.graph_aliases() if origin is not None else None
    values = list(snap.as_dict().values())

    def write(workers=None) -> None:
        # The object graph is built here, on the writing thread of a background save: the
        # paths, names and aliases were taken at the call.
        graph = _tree.build_object_graph(paths, names, aliases)
        keys = [_paths.checkpoint_key(path) for path in paths] + [_compat.OBJECT_GRAPH_KEY]
        with tf.device("/cpu:0"):
            tensors = [*values, tf.constant(graph.SerializeToString())]
        _files.write_tensors(prefix, keys, tensors, durable=durable, workers=workers)

    if blocking:
        write()
        return prefix
    return SaveHandle._submit(prefix, write)


class SaveHandle:
    """A save running in the background (`objckpt.save(..., blocking=False)`).

    `result(timeout=None)` waits for it and returns the prefix written, or
    raises the error the save raised (the same a blocking save raises: the
    checkpoint at the prefix, if any, is then untouched); `done()` says
    whether it ended. The values written are the ones the obj held when
    `save` was called.
    """

    _executor = None
    _lock = threading.Lock()

    def __init__(self, prefix: str, future):
        self.prefix = prefix
        self._future = future

    @classmethod
    def _submit(cls, prefix, write) -> SaveHandle:
        from objckpt._bundle import fastio as _fastio

        with cls._lock:
            if cls._executor is None:
                cls._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="objckpt-save", initializer=_fastio.lower_priority)
            future = cls._executor.submit(write, workers=1)
        return cls(prefix, future)

    @classmethod
    def _finished(cls, prefix: str) -> SaveHandle:
        future = concurrent.futures.Future()
        future.set_result(None)
        return cls(prefix, future)

    def result(self, timeout: float | None = None) -> str:
        """Waits for the save (at most `timeout` seconds) and returns the prefix.

        Raises:
          TimeoutError: the save did not end within `timeout`.
          The save's own error, when it failed.
        """
        try:
            self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"The save to `{_render.safe(self.prefix)}` did not end within {timeout} s; it "
                "goes on in the background. Fix: call result() again, without a timeout to "
                "wait until it ends.") from None
        return self.prefix

    def done(self) -> bool:
        """Whether the save ended (written, or failed)."""
        return self._future.done()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"SaveHandle(prefix={self.prefix!r}, {state})"
