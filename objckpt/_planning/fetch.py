"""The fetch stage of the one restore pipeline: a plan's values read and checked.

Every value is read (a rule's transform applied) and checked against the variable it will
be assigned to (`_compat.misfit`, the one rule) before anything is assigned or written. A
large local TF checkpoint is not read into memory at all: `streamed` gives a loader that
checks every checksum now and reads each tensor into its variable at the assign stage.

A streamed loader (`Streamed`) stays all or nothing past its checks: before each variable
is assigned its old value goes to an undo log (`_bundle.undolog`, written before the
assignment: no old value held in memory), and any failure after the first assignment (a
file cut short or changed while read, an I/O error, MemoryError, KeyboardInterrupt) puts
every variable back, bit for bit, and says so in the error.
"""

from __future__ import annotations

import threading
import warnings

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._bundle import undolog as _undolog
from objckpt._planning import match as _match
from objckpt._planning import sharded as _sharded

__all__ = ["Batch", "Streamed", "converted", "fetch_entries", "fetch_values", "held",
           "streamed", "streamed_pairs"]


def fetch_values(the_plan: _match.Plan, variables, matches=None,
                 cast: str = "lossless") -> list:
    """Reads the source values of a plan's matches, transforms applied, checks them and
    casts each to its variable's dtype where the casting policy (`cast`) lets it.

    A transform's output shape is known from tracing only as far as the
    transform lets TF infer it; every value is checked against its variable
    again here, before anything is assigned or written.
    """
    matches = the_plan.matches if matches is None else matches
    values = the_plan.fetch([m.source for m in matches])
    out, problems, corrupt = [], [], []
    for match, value in zip(matches, values):
        if match.transform is not None:
            value = match.transform(value)
        variable = variables[match.target]
        if (not value.shape.is_fully_defined() and variable.shape.is_fully_defined()
                and value.shape.is_compatible_with(variable.shape)):
            # read in a tf.function being traced: the shape is checked when it runs
            value = tf.ensure_shape(value, variable.shape)
        if _compat.misfit(value, variable, cast):
            got = (f"{value.dtype.name}{tuple(value.shape)} but the obj has "
                   f"{variable.dtype.base_dtype.name}{tuple(variable.shape)}")
            if match.transform is not None:
                problems.append(f"{the_plan.label(match.target)}: the transform of "
                                f"`{_render.safe(match.source)}` gave {got}")
            else:  # the plan checked the metadata: the data disagrees with it
                corrupt.append(f"{the_plan.label(match.target)}: `{_render.safe(match.source)}`"
                               f" read as {got}")
        else:
            value = _compat.cast_value(value, variable)
        out.append(value)
    if corrupt:
        raise errors.CheckpointCorruptError(
            f"{the_plan.source}: {len(corrupt)} value(s) read do not have the shape or dtype "
            "its metadata promised (an inconsistent or crafted checkpoint); nothing was "
            "changed or written:\n" + "\n".join(_render.listed(corrupt))
            + "\nFix: restore from another checkpoint, or write this one again.")
    if problems:
        raise errors.StructureMismatchError(
            f"{len(problems)} transformed value(s) from {the_plan.source} do not fit; nothing "
            "was changed or written:\n" + "\n".join(_render.listed(problems))
            + "\nFix: make the rule's transform return the variable's shape and dtype.",
            tuple(problems))
    return out


def fetch_entries(src, entries) -> list:
    """The values of `(source key, transform or None)` pairs, read (and transformed)
    eagerly, outside any tf.function being traced (a variable created while one is)."""
    with tf.init_scope():
        values = src.fetch([key for key, _ in entries]) if entries else []
        return [value if transform is None else transform(value)
                for (_, transform), value in zip(entries, values)]


def converted(value, variable):
    """A value just before it is assigned to `variable` on a streamed route: the one place
    a value is converted to its variable, by the casting policy (`_compat.cast_value`: the
    plan admitted only lossless widening here; lossy casts take the fetched route)."""
    return _compat.cast_value(value, variable)


def streamed(src, the_plan: _match.Plan, variables):
    """A `_fastio.Loader` restoring the plan from a local TF checkpoint one tensor at a
    time after checking every checksum, or None (then values are fetched as a whole):
    inside a `tf.function`, with a rule's transform or a dtype cast, for distributed
    variables, and below
    `_fastio.STREAM_BYTES` (where reading everything at once and one fused assign is faster
    and holding a second copy costs little)."""
    opened = getattr(the_plan, "opened", None)  # a Plan: entries a Stack makes one, as one
    if src is not None and opened is not None:
        src = opened(src)
    if getattr(src, "kind", None) == "snapshot":  # values in memory: shards where they live
        if not the_plan.matches or any(m.transform is not None for m in the_plan.matches):
            return None
        return held(variables, the_plan, src.fetch([m.source for m in the_plan.matches]))
    if src is not None and src.stream is not None:
        return _streamed_by_tensor(src, the_plan, variables)
    if (src is None or src.bundle_keys is None or not src.prefix or "://" in src.prefix
            or not tf.executing_eagerly() or not the_plan.matches):
        return None
    targets = [variables[m.target] for m in the_plan.matches]
    if any(_compat.is_sharded(v) for v in targets):
        return _sliced(src, the_plan, targets)
    if any(m.transform is not None or m.cast for m in the_plan.matches) or any(
            _compat.replica_parts(v) is not None or not v.shape.is_fully_defined()
            or _compat.is_distributed_variable(type(v)) for v in targets):
        return None
    from objckpt._bundle import fastio as _fastio

    total = sum(v.shape.num_elements() * v.dtype.size for v in targets)
    if total < _fastio.STREAM_BYTES:
        return None
    keys = src.bundle_keys([m.source for m in the_plan.matches])
    label_of = {key: the_plan.label(m.target) for key, m in zip(keys, the_plan.matches)}
    recorder = _Recorder([(v, label_of[key]) for key, v in zip(keys, targets)])
    return Streamed(_fastio.Loader(
        src.prefix, [(key, v, label_of[key]) for key, v in zip(keys, targets)], recorder,
        lambda key: f"for {label_of.get(key, key)}"), recorder, checked=True)


def held(variables, the_plan: _match.Plan | None, values):
    """The loader of a plan's values held in memory (a Snapshot's; `the_plan` None: the
    whole tree of `variables`, in order) where a value or a variable is sharded, or None
    (then assigned whole): eagerly, `_compat.HeldLoader` assigns shard by shard (each shard
    its rows, assembled on its own device: a sharded variable's value is never joined on
    this host), all or nothing (`_sharded.Recorder` keeps every old value first)."""
    if the_plan is None:
        pairs = [(value, variable, path)
                 for (path, variable), value in zip(variables.items(), values)]
    else:
        pairs = [(value, variables[m.target], the_plan.label(m.target))
                 for m, value in zip(the_plan.matches, values)]
    if not tf.executing_eagerly() or not any(
            _compat.is_sharded_value(value) or _compat.is_sharded(variable)
            for value, variable, _ in pairs):
        return None
    targets = _compat.HeldLoader.targets(pairs)
    devices = _compat.io_devices([getattr(v, "device", "") or "" for v, _ in targets])
    recorder = _sharded.Recorder([_sharded.Job(label, "", v.dtype.base_dtype, v, label, device)
                                  for (v, label), device in zip(targets, devices)])
    return Streamed(_compat.HeldLoader(pairs, recorder), recorder)


def _sliced(src, the_plan: _match.Plan, targets):
    """The loader of a plan with sharded variables from a local TF checkpoint: every shard
    read as its slice of the stored tensor and assigned before the next is read
    (`_sharded.SlicedLoader`; a lossless cast done shard by shard), or None (then fetched
    whole) where a rule's transform or a lossy cast needs the whole value."""
    sources = [m.source for m in the_plan.matches]
    if any(m.transform is not None or (m.cast and not _compat.lossless(
            src.specs[m.source][1], v.dtype.base_dtype))
            for m, v in zip(the_plan.matches, targets)) or any(
            _compat.replica_parts(v) is not None for v in targets):
        return None
    job_list = _sharded.jobs(src.bundle_keys(sources), [src.specs[k][1] for k in sources],
                             targets, [the_plan.label(m.target) for m in the_plan.matches])
    recorder = _sharded.Recorder(job_list)
    return Streamed(_sharded.SlicedLoader(src.prefix, job_list, recorder, converted), recorder)


def _streamed_by_tensor(src, the_plan: _match.Plan, variables):
    """The loader of a format that reads one tensor at a time (safetensors: metadata
    checked now, each tensor read, transformed, converted and assigned at the assign stage,
    so no more than the largest tensor and a bounded slack is held beyond the model), or
    None: inside a `tf.function`, for distributed variables or ones of unknown shape, below
    `_fastio.STREAM_BYTES`, or when a rule's transform cannot be traced on its input's
    spec (a transform that needs values: they are fetched whole then)."""
    if not tf.executing_eagerly() or not the_plan.matches:
        return None
    targets = [variables[m.target] for m in the_plan.matches]
    if any(m.cast and not _compat.lossless(src.specs[m.source][1], v.dtype.base_dtype)
           for m, v in zip(the_plan.matches, targets)):  # lossy: fetched whole
        return None
    if any(_compat.replica_parts(v) is not None or not v.shape.is_fully_defined()
           or _compat.is_distributed_variable(type(v)) for v in targets):
        return None
    from objckpt._bundle import fastio as _fastio

    if sum(v.shape.num_elements() * v.dtype.size for v in targets) < _fastio.STREAM_BYTES:
        return None
    labels = [the_plan.label(m.target) for m in the_plan.matches]
    recorder = _Recorder(list(zip(targets, labels)))
    loader = src.stream(
        [(m.source, v, label, m.transform)
         for m, v, label in zip(the_plan.matches, targets, labels)], recorder, converted)
    if loader.specs is None:
        loader.close()
        return None
    return Streamed(loader, recorder)


def streamed_pairs(src, pairs):
    """A loader (not yet checked) restoring `(source key, variable, label)` pairs one tensor
    at a time (`restore_on_create`'s variables, existing or just created) from a format that
    reads so, or from a local TF checkpoint (checksums checked first, as `streamed` reads
    it), or None (then values are fetched whole): inside a `tf.function`, for distributed
    variables or ones of unknown shape, below `_fastio.STREAM_BYTES`, or when any entry's
    shape differs from its variable's or its dtype widens into it only by a lossy cast (a
    TF checkpoint's: by any cast; the fetched route reports those as it always has)."""
    if src is None or not pairs or not tf.executing_eagerly():
        return None
    bundle = (src.stream is None and src.bundle_keys is not None and bool(src.prefix)
              and "://" not in src.prefix)
    if src.stream is None and not bundle:
        return None
    for key, v, _ in pairs:
        shape, dtype = src.specs[key][:2]
        if (_compat.replica_parts(v) is not None or not v.shape.is_fully_defined()
                or _compat.is_distributed_variable(type(v))
                or tuple(shape) != tuple(v.shape)
                or not _compat.lossless(dtype, v.dtype.base_dtype)
                or (bundle and dtype != v.dtype.base_dtype)):
            return None
    from objckpt._bundle import fastio as _fastio

    if sum(v.shape.num_elements() * v.dtype.size for _, v, _ in pairs) < _fastio.STREAM_BYTES:
        return None

    recorder = _Recorder([(v, label) for _, v, label in pairs])
    if bundle:
        keys = src.bundle_keys([key for key, _, _ in pairs])
        label_of = dict(zip(keys, (label for _, _, label in pairs)))
        return Streamed(_fastio.Loader(src.prefix, [(key, v, label) for key, (_, v, label)
                                                    in zip(keys, pairs)], recorder,
                                       lambda key: f"for {label_of.get(key, key)}"),
                        recorder, checked=True)
    loader = src.stream([(key, v, label, None) for key, v, label in pairs], recorder,
                        converted)
    if loader.specs is None:
        loader.close()
        return None
    return Streamed(loader, recorder)


class Streamed:
    """A checked streamed loader (`loader`: `verify()`, then `assign()`, `close()`) whose
    assignments are undone when one fails: `assign(operation)` logs each variable's old
    value before it is assigned (`_Recorder`) and, on any exception after the first
    assignment, gives every variable assigned its old value back and says in the error that
    nothing was changed (`Batch`: one log across several loaders and values read whole).
    Where no undo log can be written (no temporary file; the disk full), the values are
    assigned without one, as before, with a RuntimeWarning that says so (`checked`: every
    checksum was checked before, a local TF checkpoint's)."""

    def __init__(self, loader, recorder, checked: bool = False):
        self.loader = loader
        self.checked = checked
        self._recorder = recorder

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def verify(self) -> None:
        self.loader.verify()

    def close(self) -> None:
        self.loader.close()

    @property
    def assigned(self) -> int:
        """Variables its last `assign_logged` assigned."""
        return self._recorder.assigned

    def assign(self, operation: str = "objckpt.restore") -> None:
        """Reads and assigns every value, all or nothing (`operation` names the call in
        the error)."""
        Batch(operation, (self,)).assign()

    def assign_logged(self, log) -> None:
        """Reads and assigns every value, each old value into `log` first (None: none).
        Raises LogFailed (its write failed: every variable it logged can be undone)."""
        recorder = self._recorder
        recorder.start(log)
        try:
            self.loader.assign()
        except BaseException as err:
            recorder.stop()  # no assignment after this (threads of a KeyboardInterrupt)
            if isinstance(err, _Stopped):  # (the writing thread's failure stopped them)
                failed = recorder.log_failed or recorder.writer_error
                if failed is not None:
                    raise failed from failed.__cause__
            raise
        finally:
            recorder.join()
            recorder.log = None


class Batch:
    """Stage 6 of several streamed loaders (and of `(variable, value)` pairs read whole,
    `pairs`, assigned first by `assign_pairs(pairs)`), all or nothing: one undo log across
    them (`_bundle.undolog`, each value written before its variable is assigned: no old
    value held in memory), created when there is a loader. Any exception after the first
    assignment gives every variable assigned its old value back and says so in the error;
    an undo log that cannot be written (no temporary file, the disk full) is given up, what
    it logged put back and everything assigned again without one, with a RuntimeWarning."""

    def __init__(self, operation: str, loaders, pairs=(), assign_pairs=None):
        self.operation = operation
        self.loaders = list(loaders)
        self.pairs = list(pairs)
        self._assign_pairs = assign_pairs
        self.assigned = 0  # variables assigned so far (the error says how many)

    def assign(self) -> None:
        if not self.loaders:
            self._assign_all(None)
            return
        try:
            log = _undolog.UndoLog(background=False)
        except OSError as err:
            self._without_log(err)
            return
        try:
            self._assign_all(log)
        except _undolog.LogFailed as err:
            self._undo(log, None)
            self._without_log(err.__cause__ or err)
            return
        except BaseException as err:
            self._undo(log, err)
            raise
        log.close()

    def _assign_all(self, log) -> None:
        if self.pairs:
            if log is not None:
                for variable, _ in self.pairs:
                    parts = _compat.replica_parts(variable)
                    for part in parts or (variable,):
                        log.record(_undolog.Viewed(part), variable.name)
            self._assign_pairs(self.pairs)
            self.assigned += len(self.pairs)
        for loader in self.loaders:
            try:
                loader.assign_logged(log)
            finally:
                self.assigned += loader.assigned

    def _without_log(self, reason) -> None:
        warnings.warn(
            f"{self.operation}: no undo log could be written "
            f"({_render.safe_text(str(reason))[:200]}): the values were assigned one at a "
            "time without one" + (", every checksum checked first"
                                  if all(loader.checked for loader in self.loaders) else "")
            + "; a value failing to read half way would have left the variables before it "
            "restored. Fix: give the temporary directory (TMPDIR) room for one copy of the "
            "variables restored.", RuntimeWarning, stacklevel=5)
        self.assigned = 0
        self._assign_all(None)

    def _undo(self, log, err) -> None:
        """Every variable logged gets its old value back; err's message (None: none) says
        that nothing was changed. Raises an ObjckptError naming the variables that could
        not be put back."""
        count, self.assigned = self.assigned, 0
        _undolog.undo_after(log, err, count, self.operation, "their new values",
                            "restore obj again.")


class _Stopped(Exception):
    """Raised in a loader's thread that would assign after the assignments were stopped."""


class _Recorder:
    """A streamed loader's `assign_to(variable, value)`, safe across the loader's threads:
    when a log is started, a thread of its own writes every variable's old value to it
    ahead of the loader, in the plan's order (from the variable's own buffer: nothing held),
    while the loader reads; a variable is assigned once its old value is logged. After
    `stop()` no variable is assigned (`_Stopped`)."""

    def __init__(self, pairs):
        self._pairs = list(pairs)  # [(variable, label)], in the plan's order
        self._lock = threading.Condition()
        self.log = None
        self.log_failed = None  # the LogFailed of a write that failed
        self.writer_error = None  # any other error of the writing thread
        self.assigned = 0
        self._busy = 0
        self._stopped = False
        self._logged: dict = {}  # id(variable) -> threading.Event, set once logged
        self._writer = None

    def start(self, log) -> None:
        """Starts assigning: with `log` (None: none), its writing thread started."""
        self.log, self.log_failed, self.writer_error, self.assigned = log, None, None, 0
        self._busy, self._stopped = 0, False
        self._logged, self._writer = {}, None
        if log is not None:
            self._logged = {id(v): threading.Event() for v, _ in self._pairs}
            self._writer = threading.Thread(target=self._write_ahead, daemon=True,
                                            name="objckpt-undo-log")
            self._writer.start()

    def _write_ahead(self) -> None:
        try:
            for variable, label in self._pairs:
                if self._stopped:
                    return
                self.log.record(_undolog.Viewed(variable), label)
                self._logged[id(variable)].set()
        except _undolog.LogFailed as err:
            self.log_failed = err
        except BaseException as err:  # noqa: BLE001 (raised by the loader's assign)
            self.writer_error = err
        finally:
            if self.log_failed is not None or self.writer_error is not None:
                self._stopped = True
            for event in self._logged.values():
                event.set()  # the waiting assignments see `_stopped`

    def __call__(self, variable, value) -> None:
        logged = self._logged.get(id(variable))
        if logged is not None:
            logged.wait()
        with self._lock:
            if self._stopped:
                raise _Stopped()
            self._busy += 1
        try:
            variable.assign(value, read_value=False)
        finally:
            with self._lock:
                self._busy -= 1
                self.assigned += 1
                self._lock.notify_all()

    def stop(self) -> None:
        """No assignment after this one: waits for those under way, and the writing
        thread."""
        with self._lock:
            self._stopped = True
            self._lock.wait_for(lambda: self._busy == 0)
        self.join()

    def join(self) -> None:
        """Waits for the writing thread (none: returns)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()
