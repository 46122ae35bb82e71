"""The weighted mean of N sources assigned into a live obj, matched like `restore`, streamed.

Every source goes through the one restore pipeline (`_planning.pipeline`): opened, planned
onto the obj (rules, at, strict, optimizer_state, every strategy) and checked from its
metadata; then the plans are checked against each other (each weight fed by every source),
all before anything is read into a variable. Values are then read one variable at a time.
Where every source is a local TF checkpoint, a window of the variable's elements is read
from each source in turn (its checksum extended as it is read) and added into a float64
window that stays in the cache (`meanstream.stream_mean`), and the mean is written straight
into the new tensor the variable adopts; other sources' values are added whole into a
float64 `meanstream.Mean`. Memory beyond the obj stays about the largest tensor (files) or a
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

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._ops import averagework as _averagework
from objckpt._ops import averaging as _averaging
from objckpt._ops import batchnorm as _batchnorm
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
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
            work = _averagework.Work.decide(obj, variables, plans, shares, non_weights)
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
            _compat.assign_whole(variables[target], value)
        del held
        work.start_fresh(obj, variables)
    written = [*work.averaged_paths(), *work.taken_paths()]
    _compat.refresh_derived_state(obj, lambda: [variables[p] for p in written], key=variables,
                                  merged=not all(src.keyed_by_path for src, _ in plans))
    if work.batchnorm_averaged:
        _batchnorm.warn_averaged_statistics(
            obj, "objckpt.average: the obj", "call objckpt.recalibrate_batchnorm(model, data) "
            "with the training inputs after averaging", stacklevel=4)
    return AverageReport(*work.report_fields(plans))


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
