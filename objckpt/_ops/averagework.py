"""What `objckpt.average` (`_ops.average`) does with each variable once every source is
planned: `Work.decide` sorts the variables (averaged, taken from one source, skipped, fresh slots) and
checks the plans against each other; `Work` then computes each mean (streamed from local
TF checkpoints through `meanstream.stream_mean`, else added whole into a float64
`meanstream.Mean`) and assigns it, held for a small model or one variable at a time behind
the undo log for a large one. A sharded variable's mean (ParameterServerStrategy) is computed
and assigned there one shard at a time from local TF checkpoints (`_shard_means`: each
source's rows of that shard read by TF, whatever shard count wrote them).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._ops import averaging as _averaging
from objckpt._ops import meanstream as _meanstream
from objckpt._bundle import undolog as _undolog
from objckpt._planning import sharded as _sharded
from objckpt._planning import targets as _targets

__all__ = ["Work"]


def _is_weight(path: str, variable, the_plan, optimizer_ids) -> bool:
    """A floating-point variable of the network: not an optimizer's, not an integer."""
    if not variable.dtype.base_dtype.is_floating:
        return False
    # By the path people know: a trained Keras 3 model's weight may sit canonically under
    # its optimizer's list of the variables it trains, but is shown through its layer.
    shown = the_plan.display(path)[0]
    return not (the_plan.slot_of(path) is not None or id(variable) in optimizer_ids
                or _targets.is_optimizer_key(shown) or _averaging.is_optimizer_path(shown))


def _optimizer_ids(obj) -> set:
    found = set()
    for optimizer in _compat.optimizers_of(obj):
        owned = getattr(optimizer, "variables", ())
        try:
            owned = owned() if callable(owned) else owned
            found.update(id(v) for v in owned)
        except (TypeError, ValueError, AttributeError):
            continue
    return found


class Work:
    """What each variable of obj gets: the mean of its matches (`means`: target -> one match
    per source), or one source's value (`taken`: target -> match), or nothing (`skipped`)."""

    def __init__(self, plans, means, taken, taken_from, skipped, shares, notes, fresh):
        self._plans = plans  # [(source, plan)]
        self.means, self.taken, self.taken_from = means, taken, taken_from
        self.skipped, self.shares, self.notes, self.fresh = skipped, shares, notes, fresh
        self.nbytes = 0
        self.files: dict = {}  # source index -> averaging.BundleFile (checked)
        self.keys: dict = {}  # (source index, target) -> checkpoint key in that file
        self.dtypes: dict = {}  # (source index, target) -> NumPy dtype stored in that file
        # (source index, sharded target) -> (prefix, key): a local TF checkpoint's entry read
        # by TF a shard's rows at a time (`_shard_means`)
        self.row_keys: dict = {}
        self.batchnorm_averaged = False
        self.workspace = _meanstream.Workspace()
        self.reading = [None]  # the source being read, for its error
        self.labels = [f"Source {k}" for k in range(len(plans))]  # each source, for errors
        self.log = None  # the undo log of the streamed route (None: held, or none written)
        self.check = True  # file windows' checksums checked as read (False: checked first)
        self.assigned = 0  # variables assigned on the streamed route so far

    @classmethod
    def decide(cls, obj, variables, plans, shares, non_weights) -> Work:
        """Sorts every variable, and checks the plans against each other."""
        taken_from = (None if non_weights == "keep"
                      else len(plans) - 1 if non_weights == "last" else 0)
        by_target = [{m.target: m for m in the_plan.matches} for _, the_plan in plans]
        first_plan = plans[0][1]
        optimizer_ids = _optimizer_ids(obj)
        means, taken, skipped, problems = {}, {}, [], []
        for path, variable in variables.items():
            fed = [k for k, matches in enumerate(by_target) if path in matches]
            the_plan = plans[fed[0]][1] if fed else first_plan
            if _is_weight(path, variable, the_plan, optimizer_ids):
                if len(fed) == len(plans):
                    means[path] = [matches[path] for matches in by_target]
                elif fed:
                    lacking = [k for k in range(len(plans)) if k not in fed]
                    problems.append(
                        f"{the_plan.label(path)}: fed by source(s) {_list(fed)} but not by "
                        f"source(s) {_list(lacking)} "
                        f"({', '.join(plans[k][0].description for k in lacking)[:300]})")
                else:
                    skipped.append(f"{path}: no source has it (strict=False): left as it was")
            elif taken_from is None:
                if fed:
                    skipped.append(f"{path}: not a weight, non_weights='keep': left as it was")
            elif path in by_target[taken_from]:
                taken[path] = by_target[taken_from][path]
            elif fed:
                skipped.append(f"{path}: not a weight, and source {taken_from} (non_weights="
                               f"{non_weights!r}) has none: left as it was")
        if problems:
            raise errors.StructureMismatchError(
                f"The sources do not feed the same weights ({len(problems)} problem(s)); "
                "nothing was changed:\n" + "\n".join(_render.listed(problems))
                + "\nFix: average sources of one structure, pass rules that map every source "
                "onto obj, or pass strict=True to see each source's own problems.",
                tuple(problems))
        notes = []
        for k, (_, the_plan) in enumerate(plans):
            notes.extend(f"source {k}: {note}" for note in the_plan.notes)
            skipped.extend(f"source {k}: {item}" for item in the_plan.skipped)
        batchnorm_averaged = any(
            p.rsplit("/", 1)[-1].lstrip("_") in ("moving_mean", "moving_variance")
            for p in means)
        if batchnorm_averaged:
            notes.append("BatchNorm moving statistics were averaged like the other weights: "
                         "for an average of different runs, recompute them from data.")
        fresh = plans[taken_from][1].fresh if taken_from is not None else ()
        fresh = tuple(item for item in fresh if item[0] not in means)
        work = cls(plans, means, taken, taken_from, tuple(skipped), shares, tuple(notes),
                   fresh)
        work.batchnorm_averaged = batchnorm_averaged
        work.nbytes = sum(variables[p].shape.num_elements() * variables[p].dtype.size
                          for p in means if variables[p].shape.is_fully_defined())
        return work

    def prepare(self, variables, k, cast: str = "lossless") -> None:
        """Opens the local TF checkpoints among the sources and checks, from their index,
        each entry that is read in pieces (`files`, `keys`, `dtypes`); reads no value."""
        from objckpt._bundle import index as _bundle

        crc = _crc32c()
        for index, (src, the_plan) in enumerate(self._plans):
            if src.bundle_keys is None or not src.prefix or "://" in src.prefix:
                continue
            matches = [m for m in the_plan.matches if m.transform is None and (
                m.target in self.means or (index == self.taken_from and m.target in self.taken))]
            if not matches:
                continue
            k[0] = index
            file = _meanstream.BundleFile(_bundle.read_index(src.prefix), self.labels[index],
                                         crc, self.workspace.read_buffer())
            self.files[index] = file
            keys = src.bundle_keys([m.source for m in matches])
            for key, match in zip(keys, matches):
                variable, entry = variables[match.target], file.index.entries.get(key)
                if not variable.shape.is_fully_defined():
                    continue  # a relaxed variable (tf_keras lookups): fetched whole
                stored = None if entry is None else _averaging.stored_float(entry.dtype)
                if entry is not None and tuple(entry.shape) == tuple(variable.shape) \
                        and entry.dtype != variable.dtype.base_dtype.as_datatype_enum \
                        and (stored is None or match.target not in self.means):
                    continue  # cast by the fetch stage, as restore casts it (checked there)
                if entry is None or tuple(entry.shape) != tuple(variable.shape) \
                        or not _compat.fits((entry.shape, tf.as_dtype(entry.dtype)), variable,
                                            cast):
                    raise errors.CheckpointCorruptError(
                        f"Checkpoint `{_render.safe(src.prefix)}` changed while it was read: "
                        f"entry `{_render.safe(key)}` for {the_plan.label(match.target)} is "
                        "not what its metadata said. Nothing was changed. Fix: average "
                        "checkpoints that are not being written.", source=src.prefix)
                if _compat.is_sharded(variable) or entry.slices:
                    # A sharded variable's mean is computed a shard's rows at a time, each
                    # source's rows read by TF (whatever shards wrote them); a partitioned
                    # entry into a whole variable is read whole by TF (the fetch stage).
                    if _compat.is_sharded(variable) and \
                            entry.dtype == variable.dtype.base_dtype.as_datatype_enum:
                        self.row_keys[(index, match.target)] = (src.prefix, key)
                    continue
                self.keys[(index, match.target)] = key
                self.dtypes[(index, match.target)] = stored  # None: the variable's dtype
        k[0] = None

    def stream_into(self, obj, pipe, variables, k) -> None:
        """The streamed route: each variable's mean (or taken value, or fresh slot value)
        computed and assigned one at a time, every file window's checksum checked as it is
        read and each stream's whole checksum before its mean is assigned. Each variable's
        old value goes to the undo log first (`undo` puts them back). Without a log (no
        temporary file can be written), every TF checkpoint's checksums are checked first
        instead, in a pass of their own."""
        self.prepare(variables, k, pipe.cast)
        try:
            self.log = _undolog.UndoLog()
        except OSError as err:
            self._checked_first(err)
        try:
            self._assign_each(obj, pipe, variables)
        except _undolog.LogFailed as err:
            self.undo(err)  # nothing else failed: no message to change
            self._checked_first(err.__cause__)
            self._assign_each(obj, pipe, variables)

    def _checked_first(self, reason) -> None:
        """Without an undo log: every checksum of the TF checkpoints checked before the
        first assignment, in a pass of their own; the report's notes say so."""
        self.log, self.check = None, False
        self.notes = (*self.notes, (
            f"No undo log could be written ({_render.safe_text(str(reason))[:200]}): every TF "
            "checkpoint's checksums were checked in a pass of their own before the first "
            "assignment; a value of another format failing to read half way would have left "
            "the variables before it averaged."))
        for file in self.files.values():
            file.verify([key for (index, _), key in self.keys.items()
                         if self.files.get(index) is file])

    def _assign_each(self, obj, pipe, variables) -> None:
        for path, value in self.each(pipe, variables, by_shard=True):
            self._assign(variables[path], path, value)
            del value
        for path, role in self.fresh:
            variable = variables[path]
            self._assign(variable, path, _compat.fresh_slot_value(obj, role, variable))

    def _assign(self, variable, path, value) -> None:
        if _compat.is_sharded(variable):
            if _assign_shards(self.log, variable, path, value):
                self.assigned += 1
            return
        if self.log is not None:  # first: the old value safe on disk
            # a distributed variable's replicas one by one (a SyncOnRead one's replicas
            # differ: its value read whole is their aggregate)
            parts = _compat.replica_parts(variable)
            for i, part in enumerate(parts or (variable,)):
                # a plain variable logged from a view of its buffer (`numpy()` copies it)
                logged = _undolog.Viewed(part) if parts is None else part
                self.log.record(logged, path if parts is None else f"{path} (replica {i})")
        _compat.assign_whole(variable, value)
        self.assigned += 1

    def undo(self, err) -> None:
        """After a failure on the streamed route: every variable assigned so far gets its
        old value back from the undo log, and err's message says that nothing was changed.
        Raises an ObjckptError naming the variables that could not be put back."""
        log, self.log = self.log, None
        if log is None:
            return
        count, self.assigned = self.assigned, 0
        _undolog.undo_after(log, err, count, "objckpt.average", "their average",
                            "restore obj from a checkpoint.")

    def close(self) -> None:
        for file in self.files.values():
            file.close()

    def drop_log(self) -> None:
        """After success: the undo log's write in flight stopped, its files deleted."""
        log, self.log = self.log, None
        if log is not None:
            log.close()

    def _add(self, mean, k, pipe, variables, path, match):
        """Adds source k's value of `path` to `mean` (made here on the first value, in the
        variable's shape, or the value's for a relaxed variable); returns it."""
        key = self.keys.get((k, path))
        variable = variables[path]
        if key is not None and variable.shape.is_fully_defined():
            # read in pieces, the checksum checked at the end (unless checked first)
            mean = mean or _meanstream.Mean(variable.shape, self.shares, self.workspace)
            dtype = self._stored(k, path, variable)
            for start, values in self.files[k].pieces(key, dtype, check=self.check):
                mean.add(k, values, start)
            return mean
        self.reading[0] = k
        (value,) = pipe.fetch(self._plans[k][1], _Widened.of(variables, path, match), [match])
        self.reading[0] = None
        mean = mean or _meanstream.Mean(value.shape, self.shares, self.workspace)
        if tuple(value.shape) != mean.shape:
            raise errors.StructureMismatchError(
                f"{self._plans[k][1].label(path)}: source {k} "
                f"({self._plans[k][0].description}) has shape {tuple(value.shape)} where "
                f"another source has {mean.shape}. Fix: average sources of one structure.")
        mean.add(k, value.numpy())
        return mean

    def _stored(self, k, path, variable):
        """The NumPy dtype source k stores `path` in: read as stored, converted exactly into
        the float64 accumulator (bfloat16 and float16 sources of a float32 variable)."""
        stored = self.dtypes.get((k, path))
        return variable.dtype.base_dtype.as_numpy_dtype if stored is None else stored

    def _mean(self, pipe, variables, path):
        variable = variables[path]
        dtype = variable.dtype.base_dtype
        weighted = [k for k in range(len(self.shares)) if self.shares[k]]
        size = variable.shape.num_elements()  # None: a relaxed shape (tf_keras lookups)
        value = out = None
        if size is not None and dtype.as_datatype_enum in _DIRECT \
                and _compat.plain_cpu_variable(variable) and size * dtype.size >= _DIRECT_BYTES:
            # Written straight into a tensor TF allocated, which the variable then adopts
            # (AssignVariableOp shares its input): no second copy of the mean.
            value, out = _empty_tensor(dtype, variable.shape)
        if size is not None and all((k, path) in self.keys for k in weighted):
            # Every source a local file: a window of every source at a time, in the cache,
            # each checksum checked as it is read (unless checked first).
            if out is None:
                out = value = np.empty(tuple(variable.shape), dtype.as_numpy_dtype)
            streams = [(self.shares[k], self.files[k].stream(
                self.keys[(k, path)], self._stored(k, path, variable), self.workspace,
                check=self.check))
                for k in weighted]
            _meanstream.stream_mean(streams, size, out.reshape(-1))
            return value
        mean = None
        for k in weighted:  # a weight of 0 adds nothing (its plan was checked)
            mean = self._add(mean, k, pipe, variables, path, self.means[path][k])
        if out is not None:
            mean.result(dtype.as_numpy_dtype, out)
            return value
        return mean.result(dtype.as_numpy_dtype)

    def each(self, pipe, variables, by_shard: bool = False):
        """(path, value) for every variable that gets one (but fresh slots), computed one at
        a time; with `by_shard`, a sharded variable's mean from local TF checkpoints one
        shard at a time (`_Rows`, several per path)."""
        weighted = [k for k in range(len(self.shares)) if self.shares[k]]
        for path in self.means:
            if by_shard and all((k, path) in self.row_keys for k in weighted):
                yield from ((path, rows) for rows in _shard_means(
                    self.row_keys, self.shares, self.workspace, self.reading, variables, path))
            else:
                yield path, self._mean(pipe, variables, path)
        for path, match in self.taken.items():
            self.reading[0] = self.taken_from
            (value,) = pipe.fetch(self._plans[self.taken_from][1], variables, [match])
            self.reading[0] = None
            yield path, value

    def compute_all(self, pipe, variables) -> list:
        return list(self.each(pipe, variables))

    def start_fresh(self, obj, variables) -> None:
        """The optimizer slots the taken source has no state for get a fresh optimizer's
        value, as `objckpt.restore` gives them."""
        for path, role in self.fresh:
            variable = variables[path]
            _compat.assign_whole(variable, _compat.fresh_slot_value(obj, role, variable))

    def averaged_paths(self):
        return list(self.means)

    def taken_paths(self):
        return list(self.taken)

    def report_fields(self, plans) -> tuple:
        """AverageReport's fields, in order."""
        return (tuple(self.means), tuple(self.taken), self.skipped, tuple(self.shares),
                tuple(src.description for src, _ in plans), self.taken_from, self.notes)


def _assign_shards(log, variable, path, value) -> bool:
    """A sharded variable's value (whole, or one shard's rows: `_Rows`) assigned shard by
    shard, each shard's old value logged first (read where it lives). Returns whether its
    first shard was assigned (the variable counts as assigned)."""
    parts = _compat.shards(variable)
    if isinstance(value, _Rows):
        given = [(value.shard, value.value)]
    else:
        layout = _compat.shard_layout(variable)
        given = [(j, value[o:o + r]) for j, (o, r) in enumerate(zip(layout.offsets, layout.rows))]
    for j, rows in given:
        if log is not None:
            log.record(parts[j], f"{path} (shard {j})")
        parts[j].assign(rows, read_value=False)
    return given[0][0] == 0


def _shard_means(row_keys, shares, workspace, reading, variables, path):
    """`_Rows` of a sharded variable's mean, one shard at a time: every source's rows of it
    read by TF (`RestoreV2` of that slice, whatever shard count wrote them, each slice's
    checksum checked by TF's reader), added in float64 and rounded once. `row_keys`:
    (source index, path) -> (prefix, key); `reading[0]` names the source being read."""
    variable = variables[path]
    dtype = variable.dtype.base_dtype
    weighted = [k for k in range(len(shares)) if shares[k]]
    jobs = {k: _sharded.jobs([row_keys[(k, path)][1]], [dtype], [variable], [path])
            for k in weighted}
    for j, part in enumerate(_compat.shards(variable)):
        mean = _meanstream.Mean(tuple(part.shape), shares, workspace)
        for k in weighted:
            reading[0] = k
            rows = _sharded.read_slice(row_keys[(k, path)][0], jobs[k][j])
            reading[0] = None
            mean.add(k, rows.numpy())
            del rows
        yield _Rows(j, mean.result(dtype.as_numpy_dtype))


class _Rows:
    """One shard's rows of a sharded variable's value: `shard` (its index), `value`."""

    __slots__ = ("shard", "value")

    def __init__(self, shard: int, value):
        self.shard, self.value = shard, value


class _Widened(tuple):
    """A variable's `(shape, float64)`, as the fetch stage takes a variable: a value that a
    lossy cast (`cast="lossy"`, float64 into float32) would round is fetched in float64 and
    rounded once, with the mean. A widening cast (bfloat16 into float32) is exact: fetched
    into the variable's dtype, as restore does."""

    shape = property(lambda self: self[0])
    dtype = property(lambda self: self[1])

    @classmethod
    def of(cls, variables, path, match):
        variable = variables[path]
        source, _, target = match.cast.partition(" -> ")
        if not target or not variable.dtype.is_floating or _compat.lossless(
                tf.as_dtype(source), variable.dtype.base_dtype):
            return variables
        return {path: cls((variable.shape, tf.float64))}


def _crc32c():
    """The fastest crc32c there is: the `crc32c` package's (without the GIL) or google-crc32c's,
    else TF's own, else objckpt's NumPy one."""
    from objckpt._bundle import fastio as _fastio

    return (_meanstream.crc32c(fallback=False) or _fastio.native_crc32c()
            or _meanstream.crc32c())


# float32, float64, float16: dtypes NumPy writes into a tensor TF allocated; means at least
# this large are written that way.
_DIRECT = frozenset({1, 2, 19})
_DIRECT_BYTES = 1 << 20


def _empty_tensor(dtype, shape):
    """(a new CPU tensor TF allocated, uninitialized; a writable NumPy view of its buffer).
    The buffer is shared with nothing else until the tensor is used."""
    from objckpt._bundle import fastio as _fastio

    value, buffer = _fastio.empty_tensor(dtype, shape)
    return value, np.frombuffer(buffer, dtype.as_numpy_dtype).reshape(tuple(shape))


def _list(indices) -> str:
    return ", ".join(str(i) for i in indices)
