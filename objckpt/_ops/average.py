"""The weighted mean of N sources assigned into a live obj, matched like `restore`, streamed.

Every source goes through the one restore pipeline (`_planning.pipeline`): opened, planned
onto the obj (rules, at, strict, optimizer_state, every strategy) and checked from its
metadata; then the plans are checked against each other (each weight fed by every source),
all before anything is read into a variable. Values are then read one variable at a time.
Where every source is a local TF checkpoint, a window of the variable's elements is read
from each source in turn (its checksum extended as it is read) and added into a float64
window that stays in the cache (`averaging.stream_mean`), and the mean is written straight
into the new tensor the variable adopts; other sources' values are added whole into a
float64 `averaging.Mean`. Memory beyond the obj stays about the largest tensor (files) or a
few times it (other sources), whatever the number of sources.

Small models (below HELD_BYTES) have every mean computed before the first assignment. Larger
ones are assigned one variable at a time, in one pass over the files, and stay all or
nothing through an undo log (`undolog`): each variable's old value is appended to an
anonymous temporary file before it is assigned, and any failure after that (a checksum
checked at the end of a variable's streams, a read error of any format, an interrupt) gives
every assigned variable its old value back before the error propagates. Without a log (no
temporary file can be written), every TF checkpoint's checksums are checked in a pass of
their own first, as the report's notes say.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._ops import averaging as _averaging
from objckpt._ops import batchnorm as _batchnorm
from objckpt._ops import meanstream as _meanstream
from objckpt._bundle import undolog as _undolog
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import targets as _targets
from objckpt._planning import tree as _tree

__all__ = ["AverageReport", "average"]

# Below this many bytes of averaged values, every mean is computed before the first
# assignment (a second copy of a small model costs little); above, each mean is assigned as
# soon as it is computed, the variable's old value logged first (`undolog`).
HELD_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class AverageReport:
    """What `objckpt.average` did.

    Attributes:
      averaged: object paths (of the obj) that received the weighted mean of the sources.
      taken: object paths that are not weights (integer variables, counters, random-generator
        state, optimizer state) and received the value of one source, `taken_from`.
      skipped: paths left as the obj had them, each with why (`non_weights="keep"`, no source
        has it with `strict=False`, the plan skipped it).
      weights: the weights used, normalized to sum to 1, one per source.
      sources: the sources, described.
      taken_from: the index in `sources` of the source `taken` came from (None: "keep").
      notes: anything worth knowing (BatchNorm statistics averaged, the plans' notes).
    """

    averaged: tuple[str, ...]
    taken: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    sources: tuple[str, ...] = ()
    taken_from: int | None = None
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = _render.safe_text
        weights = ", ".join(f"{w:.4g}" for w in self.weights)
        lines = [f"averaged {len(self.averaged)} variables over {len(self.sources)} sources "
                 f"(weights {weights})"]
        if self.taken:
            shown = ", ".join(map(_render.safe, self.taken[:5]))
            more = f", ... ({len(self.taken) - 5} more)" if len(self.taken) > 5 else ""
            lines.append(f"taken from source {self.taken_from} ({len(self.taken)}): "
                         f"{shown}{more}")
        if self.skipped:
            lines.append(f"skipped ({len(self.skipped)}):")
            lines.extend(_render.listed(map(text, _render.grouped(self.skipped)), limit=5))
        lines.extend(map(text, self.notes))
        return "\n".join(lines)


@tf.autograph.experimental.do_not_convert
@errors.about_arguments(obj="obj")
def average(obj, sources, *, weights=None, rules=None, at: str | None = None,
            strict: bool = True, optimizer_state="auto", non_weights: str = "last",
            cast: str = "lossless") -> AverageReport:
    """Assigns into obj the weighted mean of N sources, matched like `restore`.

    Each source is any source `objckpt.restore` reads (a prefix, a directory, a Snapshot,
    a `.keras` / `.weights.h5` file, safetensors, a `gs://` / `s3://` URL) and is matched
    to obj's variables by the same plan (`objckpt.plan`: rules, at, strict,
    optimizer_state, every strategy). Every source is opened, planned and checked from its
    metadata, and the plans against each other, before any variable is assigned: a source
    with another shape for a variable raises an error naming that source and the path, and
    every variable keeps its value. Values are then streamed one variable at a time into a
    float64 accumulator and rounded once into the variable's dtype (float16 and bfloat16
    included), so memory beyond obj is about the largest tensor for TF checkpoints (read a
    window of every source at a time, checksums checked as the bytes are read) and a few
    times it for other sources, whatever N. Below 16 MiB of weights every mean is computed
    before the first assignment. Above, each variable is assigned as soon as its mean is
    computed and its checksums checked, its old value first appended to an undo log (an
    anonymous temporary file: disk, not memory, one copy of what is assigned); any failure
    after the first assignment (a checksum, a read error of any format, an interrupt) gives
    every assigned variable its old value back, bit for bit, and the error, saying that
    nothing was changed, propagates. Where no temporary file can be written, every TF
    checkpoint's checksums are checked first instead, and the report's notes say so.

    Only weights are averaged: the floating-point variables of the network. What is not a
    weight (integer variables, counters such as the optimizer's iterations, random-generator
    state, and all optimizer state: slots, learning rate) is never averaged: by default it
    is taken from the last source (the newest checkpoint of a run, listed last), as
    `non_weights` says, and listed in the report's `taken`. BatchNorm moving statistics are
    floating-point weights and are averaged; the report notes it and a
    `BatchNormStatisticsWarning` names the layers (recompute them from data with
    `objckpt.recalibrate_batchnorm(model, data)` for an average of different runs).

    Dtypes follow the casting policy of `objckpt.restore`: a source of a narrower float
    dtype (bfloat16, float16 into a float32 obj) is widened exactly, each value converted
    into the float64 accumulator from the dtype it is stored in; a narrowing cast (float32
    into bfloat16) is refused before anything is assigned unless `cast="lossy"`.

    Args:
      obj: the built trackable to assign into (any flavour).
      sources: a list of N sources.
      weights: N finite, non-negative numbers with a positive sum (divided by it); None:
        equal weights.
      rules: as `objckpt.restore`, applied to every source.
      at: as `objckpt.restore`, for every source.
      strict: as `objckpt.restore`. With False, a variable no source has keeps its value
        (listed in `skipped`); a weight some sources have and others lack is an error.
      optimizer_state: as `objckpt.restore` ("auto", True, False). False: obj's optimizer
        keeps its state.
      non_weights: "last" (default) or "first": the source non-weights are taken from;
        "keep": they keep obj's values.
      cast: as `objckpt.restore`: "lossless" (default: widening casts only) or "lossy".

    Returns:
      A frozen `AverageReport` (averaged, taken, skipped, weights, sources, notes).

    Raises:
      StructureMismatchError: a source does not fit obj (names the source and the path),
        or the sources disagree.
      InvalidArgumentError: bad weights, non_weights or other arguments.
      UnbuiltModelError: obj has no variables yet.
      CheckpointNotFoundError, CheckpointCorruptError: a source cannot be used.

    Example:
      >>> objckpt.average(model, ["run/ckpt-8", "run/ckpt-9", "run/ckpt-10"])
      >>> objckpt.average(model, [a, b], weights=[0.25, 0.75])

    Warns:
      BatchNormStatisticsWarning: obj has BatchNormalization layers whose moving statistics
        were averaged.
    """
    sources = _averaging.check_sources(sources, "objckpt.average")
    shares = _averaging.normalized_weights(weights, len(sources))
    non_weights = _averaging.check_non_weights(non_weights)
    strict = _match.check_strict(strict)
    _match.optimizer_mode(optimizer_state)
    if _compat.replica_context_strategy() is not None:
        raise errors.DistributedVariableError(
            "objckpt.average was called inside `strategy.run` (a replica context), where "
            "distributed variables show only this replica's component. Fix: call it outside "
            "strategy.run.")
    variables = _tree.tree(obj)
    if not variables:
        raise errors.UnbuiltModelError(
            f"{type(obj).__name__} has no variables yet, so there is nothing to average into. "
            "Fix: build it first (call it on a batch, or model.build(shape)).")
    pipe = _pipeline.Pipeline("objckpt.average", obj, sources, rules=rules, at=at,
                              strict=strict, optimizer_state=optimizer_state,
                              action="average into", cast=cast)
    k = [0]  # the source being opened or planned, for its error

    def then(err):
        if not isinstance(err, errors.ObjckptError) or k[0] is None:
            return err
        new = copy.copy(err)
        label = _label(sources[k[0]])
        new.args = (f"Source {k[0]} of {len(sources)} ({label}): "
                    f"{err.args[0] if err.args else err}", *err.args[1:])
        new.source = errors.describe_source(sources[k[0]])
        return new

    held = work = None
    try:
        with pipe.decided(lambda: variables, then=then):
            variables, plans = _planned(pipe, variables, sources, k)
            k[0] = None  # the checks across sources name each source themselves
            work = _Work.decide(obj, variables, plans, shares, non_weights)
            work.reading = k  # a value that fails to read names its source
            work.labels = [f"Source {i} of {len(sources)} ({_label(s)})"
                           for i, s in enumerate(sources)]
            if work.nbytes < HELD_BYTES:
                held = work.compute_all(pipe, variables)
            else:  # assigned one at a time, each old value logged first
                work.stream_into(obj, pipe, variables, k)
    except BaseException as err:
        if work is not None:
            work.close()
            work.undo(err)  # every variable assigned gets its old value back
        raise
    work.close()
    work.drop_log()  # every mean assigned: the old values are not needed
    if held is not None:
        for target, value in held:
            variables[target].assign(value, read_value=False)
        del held
        work.start_fresh(obj, variables)
    written = [*work.averaged_paths(), *work.taken_paths()]
    _compat.refresh_derived_state(obj, lambda: [variables[p] for p in written], key=variables,
                                  merged=not all(src.keyed_by_path for src, _ in plans))
    if work.batchnorm_averaged:
        _batchnorm.warn_averaged_statistics(
            obj, "objckpt.average: the obj", "call objckpt.recalibrate_batchnorm(model, data) "
            "with the training inputs after averaging", stacklevel=4)
    return work.report(plans)


def _planned(pipe, variables, sources, k) -> tuple:
    """Stages 1 to 3 of the pipeline for every source: `(variables, [(source, plan)])`.

    Each source opened and its plan checked (an error names the source by `k[0]`); the
    obj's optimizers are built first where a source has their state. The one place this
    module calls the pipeline's stages.
    """
    plans = []
    for index, source in enumerate(sources):
        k[0] = index
        src = pipe.open(source)
        variables, the_plan = pipe.plan(variables, src)
        # another shape, a dtype the casting policy refuses, with strict=True anything
        # unmatched: refused here, naming the source
        the_plan = pipe.check(variables, src, the_plan)
        plans.append((src, the_plan))
    return variables, plans


def _label(source) -> str:
    return f"`{errors.describe_source(source)}`"


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


class _Work:
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
        self.batchnorm_averaged = False
        self.workspace = _meanstream.Workspace()
        self.reading = [None]  # the source being read, for its error
        self.labels = [f"Source {k}" for k in range(len(plans))]  # each source, for errors
        self.log = None  # the undo log of the streamed route (None: held, or none written)
        self.check = True  # file windows' checksums checked as read (False: checked first)
        self.assigned = 0  # variables assigned on the streamed route so far

    @classmethod
    def decide(cls, obj, variables, plans, shares, non_weights) -> _Work:
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
        for path, value in self.each(pipe, variables):
            self._assign(variables[path], path, value)
            del value
        for path, role in self.fresh:
            variable = variables[path]
            self._assign(variable, path, _compat.fresh_slot_value(obj, role, variable))

    def _assign(self, variable, path, value) -> None:
        if self.log is not None:  # first: the old value safe on disk
            # a distributed variable's replicas one by one (a SyncOnRead one's replicas
            # differ: its value read whole is their aggregate)
            parts = _compat.replica_parts(variable)
            for i, part in enumerate(parts or (variable,)):
                # a plain variable logged from a view of its buffer (`numpy()` copies it)
                logged = _undolog.Viewed(part) if parts is None else part
                self.log.record(logged, path if parts is None else f"{path} (replica {i})")
        variable.assign(value, read_value=False)
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

    def each(self, pipe, variables):
        """(path, value) for every variable that gets one (but fresh slots), computed one at
        a time."""
        for path in self.means:
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
            variable.assign(_compat.fresh_slot_value(obj, role, variable), read_value=False)

    def averaged_paths(self):
        return list(self.means)

    def taken_paths(self):
        return list(self.taken)

    def report(self, plans) -> AverageReport:
        return AverageReport(tuple(self.means), tuple(self.taken), self.skipped,
                             tuple(self.shares), tuple(src.description for src, _ in plans),
                             self.taken_from, self.notes)


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
