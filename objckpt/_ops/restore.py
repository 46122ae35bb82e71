"""All-or-nothing restore by object path, and the plan it follows (`objckpt.plan`).

`restore` runs the one pipeline (`_planning/pipeline.py`: open, plan, check, fetch, agree,
assign, refresh derived state; each stage in its own module) and words what it did as a
`RestoreReport`; `plan` runs its first stages without assigning anything, so it shows
exactly what `restore` would do.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from objckpt._base import api as _api
from objckpt._base import render as _render
from objckpt._ops import snapshot as _snapshot
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import tree as _tree

__all__ = ["RestoreReport", "plan", "restore"]


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
      cast: {object path: "bfloat16 -> float32"} of the values cast to their
        variable's dtype on the way in (the casting policy, see `restore`'s `cast`).
    """

    restored: tuple[str, ...]
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    source: str = ""
    at: str | None = None
    notes: tuple[str, ...] = ()
    plan: _match.Plan | None = dataclasses.field(default=None, repr=False, compare=False)
    skipped: tuple[str, ...] = ()
    cast: dict = dataclasses.field(default_factory=dict, compare=False)

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
        if self.cast:  # values cast on the way in, one line per pair of dtypes
            kinds: dict = {}
            for made in self.cast.values():
                kinds[made] = kinds.get(made, 0) + 1
            lines.append("cast: " + ", ".join(f"{n} {text(k)}" for k, n in kinds.items()))
        lines.extend(map(text, self.notes))
        return "\n".join(lines)


@tf.autograph.experimental.do_not_convert
def restore(obj, source, *, rules=None, strict: bool = True, at: str | None = None,
            optimizer_state="auto", cast: str = "lossless") -> RestoreReport:
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
      cast: the casting policy for values whose dtype differs from their variable's:
        "lossless" (default) casts only where no value changes (bfloat16 or float16 to
        float32, float32 to float64, integer widening), lists each cast in the plan and
        report, and refuses a narrowing one with a StructureMismatchError naming this
        argument; "lossy" also casts to narrower dtypes (float32 to bfloat16, float to
        integer), as `tf.cast` does. Shapes are never cast.

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
    `ShardedVariable` (ParameterServerStrategy with a partitioner) is one
    variable: a checkpoint of any shard count (or none) restores into it, each
    parameter server reading and assigning its shards' rows, every slice read
    before any shard is assigned, and it restores into unsharded variables.

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
    _snapshot.check_cross_replica(variables, "restore")
    pipe = _pipeline.Pipeline("objckpt.restore", obj, source, rules=rules, at=at,
                              strict=strict, optimizer_state=optimizer_state, cast=cast)
    done = pipe.restore(variables)
    if done.plan is None:  # the whole tree, from a Snapshot of it
        return RestoreReport(tuple(done.variables), source=done.description)
    if done.memo is not None and "report" in done.memo:  # a cached plan: its report
        return done.memo["report"]
    the_plan = done.plan
    report = RestoreReport(tuple(m.target for m in the_plan.matches),
                           the_plan.unmatched_variables, the_plan.unmatched_source,
                           done.description, the_plan.at, the_plan.notes, the_plan,
                           the_plan.skipped, the_plan.casts)
    if done.memo is not None:
        # Kept without the source (its tensors and origin tree stay the caller's), and
        # returned as is on every hit: the report is the same for every snapshot of it.
        report = done.memo["report"] = dataclasses.replace(report, plan=the_plan.detached())
    return report


def plan(obj, source, *, rules=None, at: str | None = None, strict: bool = True,
         optimizer_state="auto", cast: str = "lossless") -> _match.Plan:
    """Plans a restore of obj from source without changing anything.

    The arguments are those of `objckpt.restore`, with the same meaning. The old order
    `plan(source, obj)` still works until objckpt 0.2, with a `DeprecationWarning`.

    Args:
      obj: the trackable that would receive the values; it must be built.
      source: a `Snapshot`, an object-based prefix or directory, or a
        name-based (TF1 `Saver`) prefix.
      rules: None or ordered `(regex, replacement)` or `(regex, replacement,
        transform)` rewrites of source keys. Each source key is rewritten by
        the FIRST rule whose regex matches it, `re.sub(regex, replacement,
        key, count=1)`, once: rules never chain, so a later rule never sees
        what an earlier one made of a key. A replacement of None drops the
        entry; keys no rule matches stay as they are. The rewritten key then
        matches a variable by object path, by object path with leading
        underscores stripped (`hidden/kernel` ~ `hidden/_kernel`), or by
        variable name; such rows say strategy "rule". To chain, write one
        rule whose regex does the whole rewrite (`("^model_001/dense/",
        "hidden/")`, not `("^model_001/", "")` then `("^dense/", "hidden/")`),
        or several rules that each match the full original key. A rule that
        rewrote no key warns and is listed: in `shadowed_rules` when other
        rules took every key it matches (naming them), else in
        `unused_rules`. A transform (tensor -> tensor, e.g. `tf.transpose`)
        changes the values of the entries its rule rewrote.
      at: plan from this subtree of the source (e.g. "model").
      strict: as for `objckpt.restore`: the plan is the same either way; when the plan
        has variables without a value or entries without a variable, its notes say
        whether `objckpt.restore` with this `strict` would refuse it (True) or skip and
        list them (False).
      optimizer_state: "auto" (default): like True when obj has an
        optimizer, else optimizer entries are skipped and listed. True:
        optimizer slots (Keras 3 `momentum`/`velocity`, Keras 2/tf_keras
        `m`, `v`; TF1 `Adam`/`Adam_1`, `adam_m`/`adam_v`, `Momentum`,
        `RMSProp`, `Adagrad`, `Ftrl`, ...) and step counters (`iterations`,
        `global_step`) move into obj's optimizer variables by the variable
        they belong to, never by position; obj must have an optimizer. False:
        optimizer entries are ignored on both sides. `plan` assigns nothing;
        an optimizer not built yet is built first, as `restore` builds it (and
        Keras's first training step would), so the plan shows the optimizer
        state `restore` moves, and its notes say so.
      cast: as for `objckpt.restore`; the plan lists each cast (`Plan.casts`, the
        "dtype casts" section of `describe()`) and a refused one among its mismatches.

    Where no rule fits (`rules` not given, entries and variables left over), the plan's
    `proposed` holds a `objckpt.rules.RuleSet` proposed from names and shapes, shown as Python
    in its text: review it, then pass `rules=plan.proposed`. It is never applied on its own.

    Returns:
      A frozen `Plan`; `print(plan.describe())` shows it as a table.

    Example:
      >>> p = objckpt.plan(model, "old/model.ckpt", rules=[("^model_001/", "")])
      >>> print(p.describe())
    """
    obj, source = _api.obj_first("plan", obj, source)
    return _pipeline.Pipeline("objckpt.plan", obj, source, rules=rules, at=at, strict=strict,
                              optimizer_state=optimizer_state, action="plan",
                              cast=cast).dry_run()
