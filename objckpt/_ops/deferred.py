"""Deferred restore: values land as each variable is created, before its first use.

`restore_on_create(obj, source)` rewrites the source's keys with the rules and
treats each result as the object path of a variable that will exist. Values
whose variable already exists are assigned at once (checked first, all or
nothing). For the rest, a hook waits at the deepest object of the path that
exists: TF calls it when the next object on the path is attached (the moment
`self.kernel = ...` runs inside a layer's `build`, before `call`), and Keras
layers of every flavour also check after each `build`. Each value is read
from the source only when its variable appears, checked, and assigned eagerly
(outside any `tf.function` being traced). Optimizer slots
(`<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>`: Keras 2 / tf_keras legacy and TF1
optimizers) are no attachments: the optimizer's slot creation is watched instead, and each
value lands as its slot is created, before the update that first uses it (as TF's own
deferred slot restore does).

It is the one restore pipeline (`_planning/pipeline.py`) with a "not yet created" state:
the source is opened and its entries planned by path (`Pipeline.plan_paths`; existing
variables no key names by path through `Pipeline.plan`, as `restore` plans them), and every
value, at the call or when its variable appears, goes through the pipeline's fetch, check
(`_compat.misfit`, the one rule), assign and refresh stages. `_CreationWatch` holds the
hooks that wait; `PendingRestore` what has landed and what still waits.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

from objckpt import _compat, errors
from objckpt._base import paths as _paths
from objckpt._base import render as _render
from objckpt._planning import checks as _checks
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import rules as _rules
from objckpt._planning import sources as _sources
from objckpt._planning import tree as _tree
from objckpt._planning.targets import is_optimizer_key

__all__ = ["PendingRestore", "restore_on_create"]


@dataclasses.dataclass
class _Entry:
    path: str  # object path in obj (after rules)
    source: str  # source key
    transform: object = None


class _CreationWatch:
    """The hooks of a `PendingRestore` (its subclass) on obj, and how far each waiting
    entry got along its path. The subclass provides `_entries`, `_failed`, `done`,
    `_source`, `_obj` and `_apply_all`."""

    def poll(self, scope=None, edge=None) -> None:
        """Assigns every pending value whose variable now exists; hooks the rest.

        Each entry remembers how far along its path it got (the object it
        waits at), so a poll costs one child lookup per entry it looks at.
        With `scope` (ids of a layer being built and its sublayers, or of the
        object something was just attached to), entries waiting at an unbuilt
        Keras layer outside it are skipped: nothing appears under an unbuilt
        layer before its own build, whose wrapper looks then. Entries waiting
        at built objects are always looked at (a layer built inside a built
        tf_keras model adds `layer_with_weights-N` edges to the model).
        """
        ready, cache = [], {}
        for path, entry in list(self._entries.items()):
            if path in self._failed:  # raised once at creation; listed by assert_done
                continue
            slot = _paths.split_slot(path)
            if slot is not None:  # lands when its optimizer creates the slot (_slot_created)
                if path not in self._slot_waiting:
                    variable = self._watch_slot(path, slot, cache)
                    if variable is not None:
                        ready.append((entry, variable))
                continue
            node, depth = self._progress.get(path, (self._obj, 0))
            if _compat.as_variable(node) is not None and depth < len(path.split("/")):
                continue  # a path through a variable (a slot's): nothing attaches under it
            if scope is not None and id(node) not in scope and _compat.is_unbuilt(node):
                continue  # nothing appears under an unbuilt layer before its own build
            if edge is not None and (id(node) not in scope or _edge_name(path, depth) != edge):
                continue  # something else was attached: this entry waits on
            node, depth, missing = _walk(node, depth, path, self._attached, cache)
            self._progress[path] = (node, depth)
            variable = _as_target(node) if not missing else None
            if variable is not None:
                ready.append((entry, variable))
            elif missing:
                self._hook(node, missing[0])
        self._apply_all([(entry, variable, None) for entry, variable in ready])
        if self.done:
            self._unwrap()
    def _note_layers(self, node) -> None:
        """node (built or attached just now) and its sublayers may be new to obj."""
        self._new_layers.extend(_compat.keras_layers(node))
    def _hook(self, node, edge: str) -> None:
        if not self._source.keyed_by_path:
            return  # its keys are no paths to wait on: Keras builds are watched instead
        if _compat.as_variable(node) is not None:
            # Nothing is attached under a variable (a slot's path runs through one); and a
            # SyncOnRead variable answers attribute probes with a cross-replica reduction.
            return
        key = (id(node), edge)
        if key in self._hooked:
            return
        self._hooked.add(key)
        name = _paths.unescape(edge)

        def attached(child):  # TF attaches `child` as node.<name>: look again from it
            self._hooked.discard(key)
            self._note_layers(child)
            self._attached[key] = child
            try:
                self.poll(scope={id(node)}, edge=name.lstrip("_") or name)
            finally:
                self._attached.pop(key, None)

        # The edge as written, and with a leading underscore added or removed
        # (`w` in the source reaches `self._w`).
        for variant in dict.fromkeys((name, "_" + name, name.lstrip("_") or name)):
            _compat.defer_on_attach(node, variant, attached)
        if id(node) not in self._layers_seen:
            self._layers_seen.add(id(node))
            for layer in _compat.keras_layers(node):
                self._wrap_build(layer)
    def _wrap_build(self, layer) -> None:
        if id(layer) in self._wrapped_ids:
            return
        self._wrapped_ids.add(id(layer))
        original = layer.build  # Keras 3 keeps its own build wrapper in the instance dict
        pending = self

        @functools.wraps(original)  # Keras 3 reads build's signature to pass shapes
        def build(*args, **kwargs):
            result = original(*args, **kwargs)
            if not pending.done:
                layers = _compat.keras_layers(layer)
                pending._new_layers.extend(layers)  # a build may create layers: see _note_layers
                pending.poll(scope={id(each) for each in layers})
            if not pending.done and not pending._source.keyed_by_path:
                pending._apply_all(pending.planned())
            return result

        self._wrapped.append((layer, _compat.override_methods(layer, {"build": build})))
    def _lands_later(self, path: str) -> bool:
        """Whether an entry the plan leaves out still lands by its path: state of an optimizer
        of obj that creates it lazily (Keras 2 / tf_keras legacy, TF1): a slot (when the
        optimizer creates it) or a variable attached to the optimizer by name (`iter`,
        `beta1_power`: TF's attach hook)."""
        if not self._source.keyed_by_path:
            return False
        slot = _paths.split_slot(path)
        owner = slot[1] if slot is not None else path.rpartition("/")[0]
        node, _, missing = _walk(self._obj, 0, owner)
        return bool(owner) and not missing and _compat.has_slot_variables(node)
    def _watch_slot(self, path: str, slot: tuple, cache):
        """An optimizer slot's entry (`<variable>/.OPTIMIZER_SLOT/<optimizer>/<slot>`; Keras 2
        / tf_keras legacy optimizers, TF1 optimizers): nothing is attached under a variable,
        so the optimizer is watched: its slot creation calls `_slot_created`, which lands the
        value before the slot's first use, as TF's own deferred slot restore does. Returns
        the slot variable when it exists already."""
        variable_path, optimizer_path, name = slot
        optimizer, _, missing = _walk(self._obj, 0, optimizer_path, self._attached, cache)
        if missing:
            self._hook(optimizer, missing[0])  # the optimizer is attached later (compile)
            return None
        if id(optimizer) not in self._slot_hooked:
            undo = _compat.on_slot_created(
                optimizer, functools.partial(self._slot_created, optimizer))
            if not undo:
                self._failed[path] = (
                    f"`{optimizer_path}` is a {type(optimizer).__name__}, which keeps no slot "
                    "variables (fix: map the entry to its optimizer state with rules=[...])")
                return None
            self._slot_hooked.add(id(optimizer))
            self._wrapped.extend(undo)
        self._slot_waiting.add(path)
        self._slot_index.clear()  # rebuilt on the next slot creation
        variable, _, missing = _walk(self._obj, 0, variable_path, self._attached, cache)
        if missing or _compat.as_variable(variable) is None:
            return None
        existing = _compat.existing_slot(optimizer, variable, _paths.unescape(name))
        if existing is not None:
            self._slot_waiting.discard(path)
        return existing
    def _slot_created(self, optimizer, slot_name, variable, slot_variable) -> None:
        """`optimizer` just created `slot_variable` (its slot `slot_name` of `variable`):
        the waiting entry for it lands now, eagerly, before the slot's first use."""
        owner = _compat.slot_owner(variable)
        key = (id(optimizer), slot_name, id(owner))
        if key not in self._slot_index:  # variables created since: index the waiting again
            self._slot_index.clear()
            cache: dict = {}
            for path in self._slot_waiting:
                if path not in self._entries or path in self._failed:
                    continue
                variable_path, optimizer_path, name = _paths.split_slot(path)
                node, _, missing = _walk(self._obj, 0, optimizer_path, None, cache)
                held, _, missing_variable = _walk(self._obj, 0, variable_path, None, cache)
                if missing or missing_variable or _compat.as_variable(held) is None:
                    continue
                self._slot_index[(id(node), _paths.unescape(name),
                                  id(_compat.slot_owner(held)))] = path
        path = self._slot_index.pop(key, None)
        if path is None or path not in self._entries:
            return
        self._slot_waiting.discard(path)
        self._apply_all([(self._entries[path], slot_variable, None)])
        if self.done:
            self._unwrap()
    def _unwrap(self) -> None:
        self._slot_hooked = set()
        for layer, undo in self._wrapped:
            _compat.restore_methods(layer, undo)  # one wrapped on top of ours stays
        self._wrapped = []
        self._wrapped_ids = set()


class PendingRestore(_CreationWatch):
    """The state of a `restore_on_create`: what has landed and what still waits.

    Attributes:
      pending: object paths whose variables do not exist yet (or failed). Optimizer state
        waiting while obj has no optimizer (an uncompiled model) is not pending: it lands if
        an optimizer appears (a compile), and is listed under skipped until then.
      applied: object paths that received their value.
      cast: {object path: "bfloat16 -> float32"} of the values cast to their variable's
        dtype as they landed (the casting policy; see `restore_on_create`'s `cast`).
      done: True once every entry has landed (but optimizer state with no optimizer).
      skipped: source entries dropped by rules or bookkeeping, or left out on purpose.
      strict: `restore_on_create`'s strict: False lets `assert_done` pass while entries
        wait for variables that were never created.
    """

    def __init__(self, obj, source: _sources.Source, entries: list[_Entry], skipped, at,
                 pipe=None):
        self._pipe = pipe if pipe is not None else _pipeline.Pipeline(
            "objckpt.restore_on_create", obj, source, at=at)
        self._obj = obj
        self._source = source
        self._entries = {e.path: e for e in entries}
        self._applied: list[str] = []
        self.cast: dict[str, str] = {}  # path -> "bfloat16 -> float32", as values land
        self._failed: dict[str, str] = {}
        self._hooked: set = set()
        self._wrapped: list = []
        self._wrapped_ids: set = set()
        self._layers_seen: set = set()
        self._progress: dict = {}  # path -> (deepest object reached, edges consumed)
        self._attached: dict = {}  # (id(node), name) -> child being attached right now
        self._skipped = tuple(skipped)
        self._optional: dict = {}  # path -> why: optimizer state while obj has no optimizer
        self.at = at
        self.strict = True  # restore_on_create's strict: what assert_done tolerates
        self._rules: tuple = ()  # the parsed rules, for plans of existing variables
        self._fed: set = set()  # ids of variables that received a value
        self._used: set = set()  # source keys whose value landed
        self._slot_hooked: set = set()  # ids of optimizers whose slot creation is watched
        self._slot_waiting: set = set()  # slot entries waiting for their optimizer's slot
        self._slot_index: dict = {}  # (id(optimizer), slot name, id(owner)) -> entry path
        # Keras layers built or attached since the last write, searched then for state derived
        # from variables (a Normalization a subclassed model creates in its build()); the
        # hooks found so, beyond those of the walk made at the first write.
        self._new_layers: list = []
        self._more_hooks: dict = {}  # id(layer) -> derived-state hook
        self._given = None  # the source as the caller gave it: errors' `source`
        self._loaders: list = []  # checked streamed loaders of values not yet assigned

    def _about(self, err):
        """err with its `source` (the source as given) and `obj` (obj's type and name) set, as
        `objckpt.restore` sets them."""
        given = self._given if self._given is not None else self._source.description
        return errors.about(err, source=given, obj=self._obj)

    def _waiting_optional(self) -> list:
        """Optional entries not landed while obj has no optimizer (they do not count)."""
        if not self._optional or _compat.optimizers_of(self._obj):
            return []
        return [path for path in self._entries if path in self._optional]

    @property
    def pending(self) -> tuple[str, ...]:
        optional = set(self._waiting_optional())
        return tuple(path for path in self._entries if path not in optional)

    @property
    def skipped(self) -> tuple[str, ...]:
        return self._skipped + tuple(self._optional[path] for path in self._waiting_optional())

    @property
    def applied(self) -> tuple[str, ...]:
        return tuple(self._applied)

    @property
    def done(self) -> bool:
        return not self.pending

    def assert_done(self) -> None:
        """Raises `StructureMismatchError` listing every entry that has not landed.

        It never assigns anything itself: a value that did not land before its
        variable was first used is reported, not applied late. With
        `restore_on_create(..., strict=False)` entries whose variable was never created
        are tolerated (they stay in `pending`); one that failed (a shape or dtype that
        does not fit) still raises.
        """
        if self.done:
            return
        lines = [f"`{path}` (from `{entry.source}`)"
                 + (f": {self._failed[path]}" if path in self._failed else ": not created yet")
                 for path, entry in self._entries.items() if path in self.pending
                 and (self.strict or path in self._failed)]
        if not lines:
            return
        raise self._about(errors.StructureMismatchError(
            f"restore_on_create from {self._source.description}: {len(lines)} of "
            f"{len(lines) + len(self._applied)} values have not landed:\n"
            + "\n".join(_render.listed(lines))
            + "\nFix: call the model on a batch (or build it) so its variables are created; "
            "check the object paths with objckpt.tree(obj) and map them with rules=[...].",
            tuple(lines)))

    def cancel(self) -> None:
        """Stops waiting: nothing more lands; the hooks on obj's layers are removed.

        A PendingRestore that never completes otherwise keeps its source (a
        Snapshot's tensors) alive as long as obj.
        """
        self._entries.clear()
        self._failed.clear()
        self._unwrap()

    def __repr__(self) -> str:
        return (f"PendingRestore({len(self._applied)} applied, {len(self.pending)} pending, "
                f"from {self._source.description})")


    def planned(self) -> list:
        """(entry, variable, value) for variables that exist but no key names by path.

        Keys that are no object paths of obj (a Keras 3 export's `variables/N`, a weights
        file's `layers/dense/vars/0`, a TF1 name) reach existing variables through the plan,
        with every strategy `objckpt.restore` uses (names, layouts, structure); each value is
        read and checked here, before anything is assigned. The entries it feeds are no
        longer pending. Nothing is assigned here.
        """
        obj, src = self._obj, self._source
        variables = _tree.tree(obj)
        if not self._entries or not variables:
            return []
        with warnings.catch_warnings():  # the rules were reported once, at the start
            warnings.simplefilter("ignore")
            # (obj's optimizers are readied once, at the start: `_optimizer_entries`)
            _, the_plan = self._pipe.plan(variables, src, rules=self._rules, ready=False)
        entries = {e.source: e for e in self._entries.values()}
        chosen = [m for m in the_plan.matches if m.source in entries and
                  m.source not in self._used and id(variables[m.target]) not in self._fed]
        problems = [p for p in the_plan.mismatched if any(
            f"`{_render.safe(m)}`" in p for m in entries)] if the_plan.mismatched else []
        if problems:
            raise self._about(errors.StructureMismatchError(
                f"restore_on_create: the variables obj has do not fit "
                f"{_render.safe_text(src.description)}: {len(problems)} problem(s). Nothing "
                "more was restored.\n" + "\n".join(_render.listed(problems))
                + "\nFix: build obj with the source's shapes, or map entries with rules.",
                tuple(problems)))
        out = []
        fresh = [_Entry(m.target, m.source, m.transform) for m in chosen]
        values = self._values(fresh, [variables[e.path] for e in fresh])
        wrong = {id(v) for v, _, _ in self._pipe.misfits(
            [(variables[e.path], value) for e, value in zip(fresh, values)])}
        for match, entry, value in zip(chosen, fresh, values):
            variable = variables[match.target]
            if id(variable) in wrong:
                problem = _problem(variable, value)
                raise self._about(errors.StructureMismatchError(
                    f"restore_on_create: {the_plan.label(match.target)} (from "
                    f"`{_render.safe(match.source)}`): {problem}. Nothing more was restored. Fix: "
                    "build obj with the source's shapes and dtypes, or map the entry to "
                    "another variable with rules.",
                    (problem,)))
            out.append((entries[match.source], entry, variable, value))
        for old, entry, _, _ in out:  # pending now under the variable's own path
            del self._entries[old.path]
            self._entries[entry.path] = entry
        # What the plan leaves out on purpose (optimizer state with no optimizer to go to,
        # say) is skipped, as `restore` skips it, not pending forever.
        taken = {m.source for m in chosen} | self._used
        left_out = [why for why in the_plan.skipped
                    if why.split(": ", 1)[0] in entries and why.split(": ", 1)[0] not in taken
                    and not self._lands_later(entries[why.split(": ", 1)[0]].path)]
        for why in left_out:
            self._entries.pop(entries[why.split(": ", 1)[0]].path, None)
        self._skipped += tuple(left_out)
        return [(entry, variable, value) for _, entry, variable, value in out]

    def _values(self, entries, variables=None) -> list:
        """The entries' values, read (and transformed) eagerly, outside any tf.function (the
        pipeline's fetch stage). Given the entries' `variables` (that exist now) and a
        source read one tensor at a time (safetensors, a local TF checkpoint above the
        streaming size), no value is read: each is a `_Streamed`
        placeholder (its source shape and dtype) whose checked loader reads it into its
        variable at the assign stage (`_apply_all`)."""
        if variables is not None and entries and all(e.transform is None for e in entries):
            loader = self._pipe.fetch_streamed_pairs(
                self._source, [(entry.source, variable, f"`{_render.safe(entry.path)}`")
                               for entry, variable in zip(entries, variables)])
            if loader is not None:
                self._loaders.append(loader)
                return [_Streamed(*self._source.specs[entry.source][:2], loader)
                        for entry in entries]
        return self._pipe.fetch_entries(self._source,
                                        [(entry.source, entry.transform) for entry in entries])

    def _close_loaders(self) -> None:
        """The streamed loaders not assigned let their files go (a failure)."""
        loaders, self._loaders = self._loaders, []
        for loader in loaders:
            loader.close()

    def _apply_all(self, ready) -> None:
        """Assigns (entry, variable, value-or-None) triples, all or nothing: every value is
        read and checked first; one that does not fit fails them all (each is listed by
        `assert_done`) and nothing of the batch is assigned."""
        if not ready:
            return
        # Values of variables just created: streamed into them (checked from metadata
        # first) where the source allows it, as those of the variables that existed.
        unread = [(entry, variable) for entry, variable, value in ready if value is None]
        read = iter(self._values([entry for entry, _ in unread],
                                 [variable for _, variable in unread]))
        checked = [(entry, variable, next(read) if value is None else value)
                   for entry, variable, value in ready]
        wrong = {id(v) for v, _, _ in self._pipe.misfits([(v, value)
                                                          for _, v, value in checked])}
        bad = [(entry, variable, value, _problem(variable, value))
               for entry, variable, value in checked if id(variable) in wrong]
        if bad:
            self._close_loaders()
            for entry, _, _, problem in bad:
                self._failed[entry.path] = problem
            entry, variable, value, _ = bad[0]
            safe = _render.safe
            raise self._about(errors.StructureMismatchError(
                f"restore_on_create: `{safe(entry.path)}` was created as "
                f"{variable.dtype.base_dtype.name}{tuple(variable.shape)}, but the source "
                f"{_render.safe_text(self._source.description)} holds {value.dtype.name}"
                f"{tuple(value.shape)} for it (entry `{safe(entry.source)}`"
                f"{', transformed' if entry.transform else ''}){_lossy(variable, value)}"
                + (f", and {len(bad) - 1} more created with it do not fit either"
                   if len(bad) > 1 else "")
                + f". {'These variables were' if len(bad) > 1 else 'The variable was'} left "
                "unassigned, and so were the others created with them. Fix: build the model "
                "with the source's shapes, or drop the entry with a rule (regex, None).",
                tuple(f"`{safe(e.path)}`: {p}" for e, _, _, p in bad)))
        # Each replica as tf.train.Checkpoint restores it, also when the variable was
        # created inside `strategy.run`, eagerly even while a tf.function is being traced.
        loaders, self._loaders = self._loaders, []
        whole = [(variable, value) for _, variable, value in checked
                 if not isinstance(value, _Streamed)]
        try:  # the placeholders' values one tensor at a time; all or nothing across them
            self._pipe.assign_batch(whole, loaders)
        finally:
            for loader in loaders:
                loader.close()
        for entry, variable, value in checked:
            made = _compat.cast_of(value, variable)
            if made:
                self.cast[entry.path] = made
            self._fed.add(id(variable))
            self._used.add(entry.source)
            del self._entries[entry.path]
            self._failed.pop(entry.path, None)
            self._applied.append(entry.path)
        self._pipe.refresh([v for _, v, _ in checked], hooks=self._derived_hooks(),
                           eager=True, merged=not self._source.keyed_by_path)
        self._drop_twins(checked)

    def _derived_hooks(self) -> tuple:
        """The layers of obj with state derived from variables: one walk, at the first write
        (cached under this PendingRestore), and the layers built or attached since, which
        are searched without walking obj (`_note_layers`)."""
        hooks = _compat.derived_hooks(self._obj, key=self)
        if self._new_layers:
            layers, self._new_layers = self._new_layers, []
            for hook in _compat.layer_hooks(layers):
                self._more_hooks.setdefault(id(hook.layer()), hook)
        if not self._more_hooks:
            return hooks
        walked = {id(hook.layer()) for hook in hooks}
        return hooks + tuple(h for i, h in self._more_hooks.items() if i not in walked)


    def _drop_twins(self, landed) -> None:
        """Marks landed the entries of a value that just landed by another path of the same
        source entry, rather than waiting for them.

        A trained Keras 3 model's checkpoint has some weights under their optimizer's
        `optimizer/_trainable_variables/N` (TF's canonical, shortest path) and reaches them
        through the layers too (the source's aliases). The layers' path lands at build,
        before the first call; the optimizer's list holds the same variables once the
        optimizer is built, which may be never (inference) or after the first call.
        """
        aliases = self._source.aliases
        canonical = {aliases.get(entry.source, entry.source): entry.transform
                     for entry, _, _ in landed}
        for path, entry in list(self._entries.items()):
            key = aliases.get(entry.source, entry.source)
            if key in canonical and canonical[key] is entry.transform:
                del self._entries[path]
                self._failed.pop(path, None)
                self._used.add(entry.source)
                self._applied.append(path)


@dataclasses.dataclass(frozen=True)
class _Streamed:
    """A value not read yet: its source shape and dtype (what the checks and messages
    use), and the checked loader that reads it into its variable at the assign stage."""

    shape: tuple
    dtype: object
    loader: object


def _problem(variable, value) -> str:
    """What `_compat.misfit` found, worded: the source's value against the variable."""
    return (f"{value.dtype.name}{tuple(value.shape)} in the source but "
            f"{variable.dtype.base_dtype.name}{tuple(variable.shape)} in the obj"
            + _lossy(variable, value))


def _lossy(variable, value) -> str:
    """The fix for a dtype that only a lossy cast fits (the casting policy), or ""."""
    if _compat.misfit(value, variable) == "dtype" and _compat.fits(value, variable, "lossy"):
        return " (a lossy cast: pass cast='lossy' to allow it)"
    return ""


def _as_target(node):
    """The variable a value lands in: a variable's own (`_compat.as_variable`), or a sharded
    variable whole (each shard gets its rows), else None."""
    variable = _compat.as_variable(node)
    return node if variable is None and _compat.is_sharded(node) else variable


def _agreeing(obj):
    """The tree whose strategy the workers agree under: under MultiWorkerMirroredStrategy
    (obj's, or the one in scope for an obj with no variables yet), every worker raises when
    opening, planning or checking the source failed on one: the others would go on into
    collectives (creating variables, SyncOnRead reads) the failing worker never joins.
    None (nothing to agree) in a replica context."""
    if _compat.replica_context_strategy() is not None:
        return None
    try:
        return _tree.tree(obj)
    except Exception:  # a refused obj: the strategy in scope decides
        return {}


def _optimizer_entries(pipe, obj, src, entries, skipped):
    """(entries that wait, {path: why} of those that wait optionally), after
    `optimizer_state`: optimizer entries are skipped (and listed in `skipped`) with False;
    with "auto" when obj has no optimizer they wait without counting as pending (they land
    if the model is compiled later); True without an optimizer is an error. An optimizer of
    obj that is not built yet is built now when obj is (as Keras's first training step
    builds it), so its state lands."""
    mode = _match.optimizer_mode(pipe.optimizer_state)
    of_optimizer = _match.optimizer_entries(src, {e.source for e in entries})
    state = [e for e in entries if is_optimizer_key(e.path) and e.source in of_optimizer]
    if not state:
        return entries, {}
    has_optimizer = bool(_compat.optimizers_of(obj))
    if mode is True and not has_optimizer:
        raise errors.StructureMismatchError(
            f"restore_on_create: optimizer_state=True, but {_checks.describe_obj(obj)} has no "
            f"optimizer to move the source's {len(state)} optimizer entries into (e.g. "
            f"`{_render.safe(state[0].source)}`). Nothing was restored. Fix: compile the "
            "model first, or pass optimizer_state='auto' or False to skip them.")
    if mode is False:
        skipped.extend(f"{e.source}: optimizer state, not moved (optimizer_state=False)"
                       for e in state)
        dropped = {id(e) for e in state}
        return [e for e in entries if id(e) not in dropped], {}
    if not has_optimizer:
        return entries, {e.path: f"{e.source}: optimizer state; the obj has no optimizer to "
                                 "put it in (compile the model to move it: it lands then)"
                         for e in state}
    if not _compat.is_unbuilt(obj):  # the plan stage readies them, as restore's does
        pipe.ready(_tree.tree(obj), src, models_only=True)
    return entries, {}


def restore_on_create(obj, source, *, rules=None, at: str | None = None, strict: bool = True,
                      optimizer_state="auto", cast: str = "lossless") -> PendingRestore:
    """Restores values into obj as its variables are created, before their first use.

    For a model whose variables do not exist yet (a Keras model before its
    first call or build, a `tf.Module` that creates variables lazily). Source
    keys, after `rules` and `at`, are object paths of obj (leading
    underscores of each edge optional, so `dense/kernel` reaches Keras 3's
    `dense/_kernel`). Variables that already exist get their values now.

    A SavedModel, a Keras `.weights.h5`/`.keras`/`.h5` file keys its values otherwise
    (`variables/3`, `layers/dense/vars/0`, `dense/kernel`): its values reach variables
    through the plan, with the strategies `objckpt.restore` uses (names, Keras layouts,
    structure), at once for the variables that exist and, for a Keras model built later,
    at the end of each layer's build, before the first call uses them. Entries the plan
    leaves out on purpose (optimizer state with no optimizer to go to) are `skipped`.

    Args:
      obj: the trackable to restore into, built or not.
      source: a `Snapshot`, an object-based prefix or directory, or a
        name-based prefix (with rules that map names to object paths).
      rules: ordered `(regex, replacement[, transform])` rewrites of source
        keys. Each key is rewritten by the first rule whose regex matches it
        (`re.sub(regex, replacement, key, count=1)`), once: rules never
        chain. A None replacement drops the entry; keys no rule matches stay
        as they are. The rewritten key must be an object path of obj
        (leading underscores of each edge optional). To chain, write one
        rule with a combined regex, or rules that each match the full
        original key. See `objckpt.plan`.
      at: take values from this subtree of the source (e.g. "model").
      strict: as for `objckpt.restore`, applied when you ask: True (default):
        `assert_done()` raises while a source entry has not landed (its variable was
        never created). False: entries whose variable was never created are tolerated:
        `assert_done()` passes and lists them in `pending` (no variable will take them
        yet); a value whose shape or dtype does not fit its variable is an error either
        way, as in `restore`. Variables of obj the source does not feed are never waited
        for, with either value.
      optimizer_state: as for `objckpt.restore`. "auto" (default): optimizer entries wait
        for obj's optimizer when obj has one (a compiled model: they land as Keras builds
        it; an optimizer not built yet of a model that is built now is built at once, as
        Keras's first training step would) and are skipped and listed when it has none
        (an uncompiled model), as `load_weights` does. True: obj must have an optimizer.
        False: optimizer entries are skipped.
      cast: as for `objckpt.restore`: each value is checked and cast when its variable
        exists (a refused cast raises there, nothing assigned).

    Returns:
      A `PendingRestore`: `.pending`, `.applied`, `.done`, `.assert_done()`.

    Raises:
      StructureMismatchError: an existing variable (now) or a newly created
        one (at its creation) does not have the source's shape or dtype; that
        variable is left unassigned.

    Under `tf.distribute`, a value lands on every replica as
    `tf.train.Checkpoint` restores it (see `objckpt.restore`; a `ShardedVariable`
    gets its rows of the value in each shard, whatever its shard count), also for
    variables created inside `strategy.run` (eagerly or in a `tf.function`):
    every replica of a MirroredVariable gets the value, each replica of a
    SyncOnRead SUM variable `value / num_replicas_in_sync`.

    Under `MultiWorkerMirroredStrategy` every worker must call
    `restore_on_create`, with the same obj and source, inside
    `strategy.scope()` (or with obj's variables under the strategy) and outside
    `strategy.run`: the workers agree (one small collective) after opening and
    checking the source, before anything is assigned or any variable waited
    for is created (a collective too). When that fails on one worker, every
    worker raises: that worker its own error, the others an objckpt error
    naming its task, error type and message.

    Example:
      >>> pending = objckpt.restore_on_create(model, "ckpt/run-3")
      >>> model.fit(x, y)          # values land as layers build
      >>> pending.assert_done()
    """
    strict = _match.check_strict(strict)
    pipe = _pipeline.Pipeline("objckpt.restore_on_create", obj, source, rules=rules, at=at,
                              strict=strict, optimizer_state=optimizer_state, cast=cast)
    made: list = []  # the PendingRestore, once made: its checked loaders closed on a failure
    try:
        with pipe.decided(lambda: _agreeing(obj)):
            src = pipe.open()
            # Planned by path: each entry's object path, whether its variable exists yet or not.
            planned, skipped = pipe.plan_paths(src)
            entries = [_Entry(path, key, transform) for path, key, transform in planned]
            entries, optional = _optimizer_entries(pipe, obj, src, entries, skipped)
            pending = PendingRestore(obj, src, entries, skipped, at, pipe)
            made.append(pending)
            pending._given = errors.describe_source(source)  # a str: holds no Snapshot
            pending.strict = strict
            pending._optional = optional
            # Existing variables: every value read and checked before any is assigned.
            existing = []
            for entry in entries:
                node, _, missing = _walk(obj, 0, entry.path)
                variable = _as_target(node) if not missing else None
                if variable is not None:
                    existing.append((entry, variable))
            values = pending._values([entry for entry, _ in existing],
                                     [variable for _, variable in existing])
            ready = [(entry, variable, value) for (entry, variable), value in zip(existing, values)]
            for variable, value, _ in pipe.misfits([(v, value) for _, v, value in ready])[:1]:
                entry = next(e for e, v, _ in ready if v is variable)
                raise errors.StructureMismatchError(
                    f"restore_on_create: `{_render.safe(entry.path)}` exists as "
                    f"{variable.dtype.base_dtype.name}{tuple(variable.shape)} but the source "
                    f"holds {value.dtype.name}{tuple(value.shape)} (entry "
                    f"`{_render.safe(entry.source)}`"
                    f"{', transformed' if entry.transform else ''}){_lossy(variable, value)}. "
                    "Nothing was restored. "
                    "Fix: build obj with the source's shapes, or drop the entry with a rule.")
            pending._rules = _rules.parse_rules(rules)
            if not src.keyed_by_path or not _compat.is_unbuilt(obj):
                # Existing variables that no key names by path: through the plan. Their values are
                # read and checked with the others' before anything is assigned.
                pending._fed.update(id(variable) for _, variable, _ in ready)
                pending._used.update(entry.source for entry, _, _ in ready)
                ready += pending.planned()
    except BaseException:
        for pending in made:
            pending._close_loaders()
        raise
    pending._apply_all(ready)
    for layer in _compat.keras_layers(obj):  # every Keras layer checks after its build
        pending._wrap_build(layer)
    pending.poll()
    return pending


def _child(node, edge: str, attached=None, cache=None):
    """The child of node at an (escaped) edge; leading underscores optional."""
    if attached and (id(node), edge) in attached:
        return attached[(id(node), edge)]
    index = cache.get(id(node)) if cache is not None else None
    if index is None:
        children = _compat.children_with_collections(node)
        stripped: dict = {}
        for child_name, child in children.items():
            stripped.setdefault(child_name.lstrip("_") or child_name, []).append(child)
        index = (children, stripped)
        if cache is not None:
            cache[id(node)] = index
    children, stripped = index
    name = _paths.unescape(edge)
    if name in children:
        return children[name]
    found = stripped.get(name.lstrip("_") or name, ())
    return found[0] if len(found) == 1 else None


def _edge_name(path: str, depth: int) -> str:
    edges = path.split("/")
    name = _paths.unescape(edges[depth]) if depth < len(edges) else ""
    return name.lstrip("_") or name


def _walk(node, depth: int, path: str, attached=None, cache=None):
    """Follows path's edges from `depth` on, starting at node.

    Returns (deepest object reached, its depth, edges still missing).
    """
    edges = path.split("/")
    for i in range(depth, len(edges)):
        child = _child(node, edges[i], attached, cache)
        if child is None:
            return node, i, edges[i:]
        node = child
    return node, len(edges), []
