"""The one restore pipeline: every operation that reads a source into variables.

`objckpt.restore`, `objckpt.plan` (and the CLI's `migrate --dry-run`), `objckpt.migrate`,
`objckpt.load_ensemble` and `objckpt.restore_on_create` each run one `Pipeline`, whose
stages come in one order, each in its own module:

1. open the source (`Pipeline.open`, `_sources.open_source`: a prefix, a directory, a
   Snapshot, any format);
2. plan it onto the obj (`Pipeline.plan`: rules, at, optimizer_state; without rules, a
   keras-hub obj and a Hugging Face folder get the shipped set its config.json names,
   `Pipeline.rules_for`, noted in the plan; an optimizer not
   built yet is built first, as Keras's first training step builds it,
   `_checks.ready_optimizers`, so `objckpt.plan` shows what `objckpt.restore` does;
   `_match.make_plan`);
3. check the plan (`Pipeline.check`, `_checks`: a plan that cannot be applied raises the
   one error; `objckpt.plan` lists the same problems and notes instead);
4. fetch the values and check each against its variable (`Pipeline.fetch`, `_fetch`, with
   the one rule `_compat.misfit`);
5. agree across the workers of a MultiWorkerMirroredStrategy, exactly once per decision
   point (`Pipeline.decided`, `_agree`: the stages above run inside it; a failure on any
   worker is raised on every worker, before anything changes);
6. assign (`Pipeline.assign`, `_assign`; migrate writes its checkpoint instead, and
   load_ensemble creates its members from the values);
7. refresh the state Keras layers derive from variables (`Pipeline.refresh`).

`Pipeline.restore` runs them for `objckpt.restore` and chooses its route: a Snapshot of
this very tree (nothing to open, plan or check: the whole tree assigned fused), a Snapshot
of a tree planned into this one before (the cached plan), a large local TF checkpoint
(streamed: checked now, read into the variables at the assign stage), or any other source
(values fetched whole). `Pipeline.dry_run` runs stages 1-3 for `objckpt.plan`. migrate
runs 1-3 and 5, then fetches one value at a time (small ones a few at a time) while it
writes them. load_ensemble runs 1-3 and 5 for every member before any exists, and 4 before
or, from a large file or checkpoint, as each member's variables are created.
`restore_on_create` runs 1-5 for the variables that exist and 4, 6 and 7 for each variable
when it is created (the same pipeline, in a "not yet created" state: `Pipeline.plan_paths`).

Nothing before stage 6 assigns a variable or writes a file (building an optimizer that
holds no state yet is the one change, as the next training step would make it anyway), so
a failure in any stage leaves every variable as it was. On the streamed routes stage 6
itself stays all or nothing: each old value goes to an undo log before its variable is
assigned, and a failure half way puts every variable back (`_fetch.Batch`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref

from objckpt import _compat, errors
from objckpt._bundle import remote as _remote
from objckpt._planning import agree as _agree
from objckpt._planning import assign as _assign
from objckpt._planning import checks as _checks
from objckpt._planning import fetch as _fetch
from objckpt._planning import match as _match
from objckpt._planning import rules as _rules
from objckpt._planning import sources as _sources
from objckpt._planning import tree as _tree
from objckpt.rules.core import RuleSet as _RuleSet
from objckpt.rules.huggingface import for_model as _shipped_rules

__all__ = ["STAGES", "Pipeline", "Restored"]

# The stages, in the order an operation that runs them all passes through them.
STAGES = ("open", "plan", "check", "fetch", "agree", "assign", "refresh")

# Plans kept per target tree, for Snapshots of this many other trees.
_PLAN_CACHE_SIZE = 8


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `Pipeline.restore` did: its route ("fast", "cached", "streamed", "fetched"),
    the source opened (None on the Snapshot routes), the plan applied (None: the whole
    tree, from a Snapshot of it), its description, and, for a plan cached for Snapshots of
    one tree, the dict kept with it (the caller keeps there what it made of the plan, its
    report, returned as is on every hit)."""

    route: str
    plan: _match.Plan | None
    description: str
    variables: object
    memo: dict | None = None


class Pipeline:
    """One read of `source` into `obj` by `operation` (e.g. "objckpt.restore"), with the
    calling convention's options (`rules`, `at`, `strict`, `optimizer_state`, `cast`: the
    casting policy, "lossless" or "lossy", `_compat.misfit`). `action` is
    the verb of a refusal ("Cannot restore/migrate ..."); "plan": a dry run, whose check
    stage notes problems instead of raising."""

    def __init__(self, operation: str, obj, source, *, rules=(), at: str | None = None,
                 strict: bool = True, optimizer_state="auto", action: str = "restore",
                 cast: str = "lossless"):
        self.operation = operation
        self.obj = obj
        self.source = source
        self.rules = rules
        self.at = at
        self.strict = strict
        self.optimizer_state = optimizer_state
        self.action = action
        self.cast = _compat.check_cast(cast)
        self.built: tuple[str, ...] = ()  # optimizers the plan stage built (their types)
        self._shipped: dict = {}  # id(opened source) -> (shipped rule set, note)
        self._loader = None  # the streamed route's loader, between fetch and assign

    def __repr__(self) -> str:
        return f"Pipeline({self.operation})"

    def _enter(self, stage: str) -> None:
        """Called as each stage starts (tests instrument it)."""

    # --- the stages ------------------------------------------------------------------

    def open(self, source=None) -> _sources.Source:
        """Stage 1: the source (this pipeline's, or one member's) opened as a plan source."""
        self._enter("open")
        given = self.source if source is None else source
        src = _sources.open_source(given)
        shipped = None if self.rules else _shipped_rules(self.obj, given)
        if shipped is not None:  # a keras-hub model and a Hugging Face folder: its set
            self._shipped[id(src)] = shipped
        return src

    def rules_for(self, src: _sources.Source, rules):
        """(the rules the plan stage uses, a note): those given, else the shipped Hugging
        Face set the source's config.json names when obj is a keras-hub model (`open`)."""
        if rules:  # a shipped set given for a backbone: made for this task model
            return (rules.for_model(self.obj) if isinstance(rules, _RuleSet) else rules), ""
        return self._shipped.get(id(src), (rules, ""))

    def plan(self, variables, src: _sources.Source, *, obj=None, rules=None,
             ready: bool = True):
        """Stage 2: `(variables, plan)`: obj's optimizers that hold no state yet built when
        the source has state for them (`ready`; the tree walked again then), and the plan,
        not checked yet."""
        self._enter("plan")
        obj = self.obj if obj is None else obj
        rules, note = self.rules_for(src, self.rules if rules is None else rules)
        if not variables:  # an obj not built yet: nothing to plan (the check refuses it)
            return variables, _match.Plan(src.description, ())
        if ready:
            variables = self.ready(variables, src, obj=obj, rules=rules)
        the_plan = _match.make_plan(src, obj, variables, rules=rules, at=self.at,
                                    optimizer_state=self.optimizer_state,
                                    cast=self.cast)
        if note:
            the_plan = dataclasses.replace(the_plan, notes=(note, *the_plan.notes))
        return variables, the_plan

    def ready(self, variables, src: _sources.Source, *, obj=None, rules=None,
              models_only: bool = False):
        """The plan stage's first step: obj's optimizers that hold no state yet built as
        Keras's first training step builds them, when the source has state for them
        (`_checks.ready_optimizers`; `models_only`: only Keras models' own); obj's tree,
        walked again when one was built."""
        obj = self.obj if obj is None else obj
        rules = self.rules if rules is None else rules
        unbuilt = (_compat.unbuilt_optimizers(obj) if variables
                   and _match.optimizer_mode(self.optimizer_state) is not False else ())
        ready = _checks.ready_optimizers(obj, variables, src, rules=rules, at=self.at,
                                         optimizer_state=self.optimizer_state,
                                         models_only=models_only)
        if ready is not variables:
            self.built = tuple(type(o).__name__ for o, _ in unbuilt)
        return ready

    def plan_paths(self, src: _sources.Source):
        """Stage 2 for variables that may not exist yet (`restore_on_create`): the
        source's entries under `at`, rewritten by the rules into the object paths they
        will land at: `(entries, skipped)`, entries as `(path, source key, transform)`."""
        self._enter("plan")
        parsed = _rules.parse_rules(self.rules_for(src, self.rules)[0])
        view = _match.view_at(src, self.at)
        rewritten = _rules.rewrite_view(view, parsed, note_bookkeeping=False)
        entries, seen = [], {}
        for _, full, new, rule in rewritten.entries:
            if new in seen:
                raise errors.StructureMismatchError(
                    f"restore_on_create: source entries `{seen[new]}` and `{full}` both map "
                    f"to `{new}`; nothing is guessed. Fix: drop one with a rule (regex, None).")
            seen[new] = full
            entries.append((new, full, rule.transform if rule is not None else None))
        _rules.warn_unused(rewritten.unused, src.description, stacklevel=3,
                           shadowed=rewritten.shadowed)
        return entries, list(rewritten.skipped)

    def check(self, variables, src: _sources.Source, the_plan: _match.Plan, *, obj=None,
              rules=None) -> _match.Plan:
        """Stage 3: the plan, or the one error for a plan that cannot be applied (nothing
        assigned, nothing written). A dry run (`action="plan"`) raises nothing: the plan
        comes back with notes on what restore would do, and rules proposed where none fit."""
        self._enter("check")
        obj = self.obj if obj is None else obj
        rules = self.rules_for(src, self.rules if rules is None else rules)[0]
        if self.action == "plan":
            return _checks.noted(self, variables, src, the_plan)
        if not variables:
            _checks.refuse(obj, variables, src, the_plan, self.strict, action=self.action)
        if (the_plan.mismatched or the_plan.ambiguous or not the_plan.matches
                or (self.strict and (the_plan.unmatched_variables
                                     or the_plan.unmatched_source))):
            _checks.refuse(obj, variables, src, the_plan, self.strict, action=self.action,
                           propose=not rules)
        return the_plan

    def misfits(self, pairs) -> list:
        """Stage 3 for values read before their plan was known (`restore_on_create`): the
        `(variable, value, what does not fit)` of every pair that does not fit
        (`_compat.misfit`, the one rule)."""
        if not pairs:
            return []
        self._enter("check")
        return [(variable, value, wrong) for variable, value in pairs
                for wrong in (_compat.misfit(value, variable, self.cast),) if wrong]

    def fetch(self, the_plan: _match.Plan, variables, matches=None) -> list:
        """Stage 4: the plan's values, read, transformed and checked (`_fetch`)."""
        self._enter("fetch")
        return _fetch.fetch_values(the_plan, variables, matches, self.cast)

    def fetch_entries(self, src: _sources.Source, entries) -> list:
        """Stage 4 for `(source key, transform)` pairs, read eagerly (`restore_on_create`)."""
        if not entries:
            return []
        self._enter("fetch")
        return _fetch.fetch_entries(src, entries)

    def fetch_streamed(self, src: _sources.Source, the_plan: _match.Plan, variables):
        """Stage 4 on the streamed route, where the source allows it (`_fetch.streamed`):
        a loader whose every entry was checked from metadata, nothing read or assigned
        (`assign_streamed` reads and assigns it later, one tensor at a time), or None
        (then `fetch`)."""
        return self.verify_streamed(_fetch.streamed(src, the_plan, variables))

    def fetch_streamed_pairs(self, src: _sources.Source, pairs):
        """Stage 4 on the streamed route for `(source key, variable, label)` pairs read
        before their plan was known (`restore_on_create`): a checked loader, or None (then
        `fetch_entries`)."""
        return self.verify_streamed(_fetch.streamed_pairs(src, pairs))

    def verify_streamed(self, loader):
        """Stage 4 for a streamed loader (None: none): every entry checked from metadata,
        nothing read or assigned; the loader is closed when a check fails."""
        if loader is not None:
            self._enter("fetch")
            try:
                loader.verify()
            except BaseException:
                loader.close()
                raise
        return loader

    def assign_streamed(self, loader) -> None:
        """Stage 6 on the streamed route: a checked loader's tensors read, converted and
        assigned one at a time; the loader is closed."""
        self._enter("assign")
        try:
            loader.assign(self.operation)  # all or nothing (`_fetch.Streamed`)
        finally:
            loader.close()

    @contextlib.contextmanager
    def decided(self, variables, *, about=None, then=None):
        """Stage 5, around the stages before it: the one agreement of a decision point.

        Runs the block; on any failure `about(err)` (default: `self.about`) names the
        source and obj (a remote source by its URL, not its local staged copy), the
        workers agree on the failure, and `then(err)` (default: `err`) is raised; when the
        block passed, the workers agree that it did (a worker whose
        checks passed raises there when another's failed). `variables` is a callable that
        gives the tree whose strategy decides (called at the agreement); None from it: no
        agreement (a replica context).
        """
        try:
            yield self
        except Exception as err:
            _remote.unstage(err)  # a remote source's staged copy: its URL named instead
            (about or self.about)(err)
            self.agree(variables, err)
            raised = err if then is None else then(err)
            if raised is err:
                raise
            raise raised from err
        self.agree(variables, None)

    def agree(self, variables, failure) -> None:
        """Stage 5: this worker's `failure` (None: its stages passed) agreed with every
        other worker's (`_agree.agree_across_workers`)."""
        self._enter("agree")
        tree = variables()
        if tree is not None:
            _agree.agree_across_workers(tree, failure, self.operation)

    def assign(self, variables, the_plan: _match.Plan | None, values, *, obj=None,
               loader=None) -> None:
        """Stage 6: the values into the plan's variables (None: the whole tree, fused), or
        the streamed loader's tensors (`loader`, else the one `restore` checked); slots the
        source holds no state for start fresh."""
        self._enter("assign")
        if loader is None:
            loader, self._loader = self._loader, None
        if loader is not None:
            try:
                loader.assign(self.operation)  # all or nothing (`_fetch.Streamed`)
            finally:
                loader.close()
        else:
            _assign.assign_plan(variables, the_plan, values)
        _assign.start_fresh(self.obj if obj is None else obj, variables, the_plan)

    def assign_batch(self, pairs, loaders) -> None:
        """Stage 6 for `(variable, value)` pairs read whole and checked streamed loaders
        (`restore_on_create`'s batch), all or nothing across them: one undo log
        (`_fetch.Batch`); the loaders are left open."""
        self._enter("assign")
        _fetch.Batch(self.operation, loaders,
                     [(variable, _compat.cast_value(value, variable)) for variable, value in pairs],
                     _assign.assign_pairs).assign()

    def assign_pairs(self, pairs) -> None:
        """Stage 6 for `(variable, value)` pairs, eagerly, each replica as
        `tf.train.Checkpoint` restores it (`restore_on_create`, load_ensemble's replicas)."""
        self._enter("assign")
        _assign.assign_pairs([(variable, _compat.cast_value(value, variable))
                              for variable, value in pairs])

    def refresh(self, written=None, *, obj=None, **options) -> None:
        """Stage 7: state Keras layers derive from the `written` variables (None: all of
        obj's) computed again, as Keras's own loader leaves it (Normalization's cached
        mean; a weights file's merged kernel: zero LoRA factors)."""
        self._enter("refresh")
        obj = self.obj if obj is None else obj
        if written is None:
            _compat.refresh_derived_state(obj, **options)
        else:
            _compat.refresh_derived_state(obj, written, **options)

    def about(self, err):
        """A failure's `source` and `obj`, where unset: this pipeline's."""
        return errors.about(err, source=self.source, obj=self.obj)

    # --- the operations' orders --------------------------------------------------------

    def dry_run(self) -> _match.Plan:
        """Stages 1-3 as `restore` runs them, nothing assigned (`objckpt.plan`, the CLI's
        `migrate --dry-run`): the plan restore would apply, with its notes."""
        try:
            self.strict = _match.check_strict(self.strict)
            variables = _tree.tree(self.obj)
            if not variables:
                raise errors.UnbuiltModelError(
                    f"Cannot plan a restore into {type(self.obj).__name__}: it has no "
                    "variables yet. Fix: build it first, or use "
                    "objckpt.restore_on_create(obj, source) to apply values as variables are "
                    "created.")
            src = self.open()
            variables, the_plan = self.plan(variables, src)
            return self.check(variables, src, the_plan)
        except errors.ObjckptError as err:
            self.about(err)  # as objckpt.restore sets them
            raise

    def restore(self, variables) -> Restored:
        """Every stage, in order, for `objckpt.restore`, on the route the source allows."""
        fast = _is_own_snapshot(self, variables)
        cached = None if fast else _cached_plan(self, variables)
        route = "fast" if fast else "cached" if cached is not None else "fetched"
        src = the_plan = values = None

        def failed(err):
            loader, self._loader = self._loader, None
            if loader is not None:
                loader.close()
            self.about(err)

        with self.decided(lambda: variables, about=failed):
            if route == "fetched":
                src = self.open()
                variables, the_plan = self.plan(variables, src)
                the_plan = self.check(variables, src, the_plan)
                self._loader = _fetch.streamed(src, the_plan, variables)
                if self._loader is not None:
                    route = "streamed"  # every checksum checked, nothing read into memory
                    self._enter("fetch")
                    self._loader.verify()
                else:
                    values = self.fetch(the_plan, variables)
            else:  # a Snapshot: its tensors in memory, planned already (or the tree's own)
                self._enter("fetch")
                the_plan = cached[1] if cached is not None else None
                items = self.source.as_dict()
                values = (list(items.values()) if the_plan is None
                          else [items[key] for key in cached[0]])
                # sharded values or variables: shard by shard, cast there (`_fetch.held`)
                self._loader = _fetch.held(variables, the_plan, values)
                if self._loader is None and the_plan is not None and the_plan.casts:
                    values = [_compat.cast_value(value, variables[m.target]) if m.cast
                              else value for m, value in zip(the_plan.matches, values)]
        self.assign(variables, the_plan, values)
        if the_plan is None:
            self.refresh(key=variables)
            return Restored(route, None, "Snapshot", variables)
        self.refresh(lambda: [variables[m.target] for m in the_plan.matches], key=variables,
                     merged=src is not None and not src.keyed_by_path)
        memo = cached[2] if route == "cached" else _cache_plan(self, variables, src, the_plan)
        return Restored(route, the_plan, the_plan.source, variables, memo)


# --- the Snapshot routes: a Snapshot of this tree, or of a tree planned into it before ---


def _is_own_snapshot(pipe, variables) -> bool:
    """A Snapshot taken from this very tree, its structure unchanged: the paths, shapes
    and dtypes are the ones just read, so there is nothing to open, plan or check."""
    origin = getattr(pipe.source, "origin", None)
    return (callable(origin) and callable(getattr(pipe.source, "as_dict", None))
            and pipe.at is None and not pipe.rules
            and pipe.optimizer_state in (None, "auto") and origin() is variables)


def _cache_key(pipe):
    """The key a checked plan of this restore is cached under, or None (not cached):
    only Snapshots taken from a live tree, without rules: the origin tree's identity
    stands for its paths, shapes and dtypes, as the target tree's does for its own."""
    origin = getattr(pipe.source, "origin", None)
    if not callable(origin) or pipe.rules or origin() is None:
        return None
    return (id(origin()), bool(pipe.strict), pipe.at,
            _match.optimizer_mode(pipe.optimizer_state), pipe.cast)


def _cached_plan(pipe, variables):
    """(source keys, detached plan) cached for a Snapshot of a tree planned into this
    tree before (the same paths, shapes and dtypes on both sides: each tree is
    immutable, so the same checked plan), or None."""
    key = _cache_key(pipe)
    cached = variables.plans.get(key) if key is not None else None
    if cached is None or cached[0]() is not pipe.source.origin():
        return None
    return cached[1:]


def _cache_plan(pipe, variables, src, the_plan) -> dict | None:
    """Keeps the checked plan of a Snapshot's restore for the next Snapshot of its tree;
    returns the dict kept with it (None: not cached)."""
    key = _cache_key(pipe)
    if key is None:
        return None
    # Kept without the source (its tensors and origin tree stay the caller's).
    if len(variables.plans) >= _PLAN_CACHE_SIZE:
        variables.plans.pop(next(iter(variables.plans)))
    aliases = src.aliases
    variables.plans[key] = (
        weakref.ref(pipe.source.origin()),
        tuple(aliases.get(m.source, m.source) for m in the_plan.matches),
        the_plan.detached(), {})
    return variables.plans[key][3]
