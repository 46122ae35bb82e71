"""Ensembles: N independent members of one architecture, each from its own source.

`load_ensemble(template, sources)` clones the template once per source, each
clone's variables created from its source's values (every source checked from
metadata before any member exists; a large one read one tensor at a time as the
clone's variables are created). Calling the `Ensemble` evaluates every member on
the same input and stacks the outputs on a new leading axis.

Batched evaluation
------------------
Members are clones, so they share one architecture. The template's call is
traced once into a graph; every read of one of its variables
(`ReadVariableOp`) is replaced by an input, which turns the call into a
function of the weights. `tf.vectorized_map` then runs that function once
over the members' weights stacked on a leading axis (matmuls become batched
matmuls, and so on). Where that is impossible (the call writes a variable,
reads one inside a nested function, or uses an op `vectorized_map` cannot
batch), the members are called one after the other inside one traced
function instead; both paths give the same numbers up to float rounding.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import os
from collections.abc import Sequence

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._ops import clone as _clone
from objckpt._planning import match as _match
from objckpt._planning import pipeline as _pipeline
from objckpt._planning import rules as _rules
from objckpt._planning import tree as _tree

__all__ = ["Ensemble", "load_ensemble"]

_MODES = ("auto", "batched", "loop")


def _is_rule_list(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in value)


def _rules_per_member(rules, count: int) -> list:
    """One rules sequence for all members, or one per member: a list of lists."""
    if rules is None or (isinstance(rules, (list, tuple)) and not rules):
        return [()] * count
    if isinstance(rules, (list, tuple)) and all(_is_rule_list(r) for r in rules):
        if len(rules) != count:
            raise errors.InvalidArgumentError(
                f"rules holds {len(rules)} lists of rules (one per member) but there are "
                f"{count} sources. Fix: give one list of rules per source, or one list of "
                "(regex, replacement) pairs for all, e.g. rules=[(r'^model_\\d+/', '')].")
        for member_rules in rules:
            _rules.parse_rules(member_rules)
        return list(rules)
    _rules.parse_rules(rules)
    return [rules] * count


def _describe_source(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return f"`{os.fspath(source)}`"
    return type(source).__name__


def _with_context(err: errors.ObjckptError, context: str) -> errors.ObjckptError:
    """The same error (type and attributes) with `context` in front of its message."""
    new = copy.copy(err)
    new.args = (f"{context}: {err.args[0] if err.args else err}", *err.args[1:])
    return new


def _about_errors(load):
    """load_ensemble's objckpt errors get `source` (the sources) and `obj` (the template)
    where they are unset, as `objckpt.restore`'s get them; a failing member's error has
    that member's source already."""

    @functools.wraps(load)
    def wrapper(template, sources, *args, **kwargs):
        try:
            return load(template, sources, *args, **kwargs)
        except errors.ObjckptError as err:
            errors.about(err, source=sources, obj=template)
            raise

    return wrapper


def _about_member(err, given, template, opened=None, member=None):
    """A member's error names the source as given (not the opened one `restore` was
    handed) and the template (not its clone)."""
    if isinstance(err, errors.ObjckptError):
        if opened is not None and err.source == errors.describe_source(opened):
            err.source = None
        if member is not None and err.obj == errors.describe_obj(member):
            err.obj = None
    return errors.about(err, source=given, obj=template)


@_about_errors
def load_ensemble(template, sources: Sequence, *, rules=None, at: str | None = None,
                  strict: bool = True, optimizer_state="auto",
                  cast: str = "lossless") -> Ensemble:
    """Loads N independent members of one architecture from N sources.

    Each member is an `objckpt.clone` of the template (its own variables; the
    template is not changed) filled from its source through the stages
    `objckpt.restore` runs (one pipeline: the same plan, checks and messages).
    Every source is opened, planned and checked from metadata before any member
    is made, so a bad source is reported (naming the member and the source)
    before any work on the others. A large file or checkpoint is read one
    tensor at a time as its member's variables are created (each variable
    adopts the tensor read: memory beyond the members stays near the largest
    tensor); a value that cannot be read then raises, naming the member, and no
    ensemble is returned (the template is never changed).

    Args:
      template: a built obj of the architecture: a Keras model of any flavour
        or a tf.Module. Its values do not matter.
      sources: one source per member: Snapshots, checkpoint prefixes,
        directories, or name-based (TF1 Saver) prefixes with rules.
      rules: one sequence of `(regex, replacement)` rules for all members,
        or a list holding one such sequence per member. Each source key is
        rewritten by the first rule whose regex matches it (`re.sub(regex,
        replacement, key, count=1)`), once: rules never chain. A None
        replacement drops the entry; keys no rule matches stay as they are.
        The rewritten key then matches a variable by object path, by object
        path with leading underscores stripped, or by variable name. To
        chain, write one rule with a combined regex, or rules that each
        match the full original key. See `objckpt.plan`.
      at, strict: as in `objckpt.restore`, for every member.
      optimizer_state: as in `objckpt.restore`, for every member. "auto" (default):
        a template without an optimizer (an uncompiled model, a tf.Module: an ensemble
        that evaluates) skips the sources' optimizer state and lists it; a compiled
        template's members each get their optimizer state by owner (each member
        planned on its own, its optimizer built first when the template's is compiled
        but not built). True: the same, but a template without an optimizer is an
        error. False: optimizer state in the sources and in the template is left alone.
      cast: as in `objckpt.restore`, for every member.

    Returns:
      An `Ensemble`: `.members`, `ensemble(x)` stacks the members' outputs on a
      new leading axis, `ensemble.mean(x)` averages them.

    Under `MultiWorkerMirroredStrategy` (the template's) every worker must
    call `load_ensemble` with the same template and sources: creating a
    member's variables is a collective, and the workers agree (one small
    collective) after opening and planning every source, before any member
    exists. When a source fails on one worker (any error, a rule's transform
    raising included), every worker raises: that worker its own error, the
    others an objckpt error naming its task, error type and message.

    Example:
      >>> ensemble = objckpt.load_ensemble(Net(), ["run1/ckpt-9", "run2/ckpt-9"])
      >>> ensemble.mean(x)
      >>> # three TF1 checkpoints whose variables live under model_001/ .. model_003/:
      >>> objckpt.load_ensemble(net, prefixes, rules=[(r"^model_\\d+/", "")])
    """
    if isinstance(sources, (str, bytes, os.PathLike)) or not isinstance(sources, Sequence):
        raise errors.InvalidArgumentError(
            "sources must be a list with one source per member (prefixes, directories or "
            f"Snapshots). Received: {sources!r}. Fix: load_ensemble(template, [source]) for "
            "one member.")
    if not sources:
        raise errors.InvalidArgumentError(
            "sources is empty, so the ensemble would have no member. Fix: pass one source per "
            "member, e.g. load_ensemble(template, ['run1/ckpt-9', 'run2/ckpt-9']).")
    if not _compat.is_trackable(template):
        raise errors.UnsupportedObjectError(
            "The template must be a trackable model (a Keras model of any flavour or a "
            f"tf.Module). Received: {type(template).__name__}. Fix: pass a model built like "
            "the members, e.g. a fresh instance of their architecture.")
    if not _tree.tree(template):
        raise errors.UnbuiltModelError(
            f"The template ({type(template).__name__}) has no variables yet, so there is "
            "nothing to load. Fix: build it first (call it on a batch, or model.build(shape)).")
    strict = _match.check_strict(strict)
    mode = _match.optimizer_mode(optimizer_state)
    member_rules = _rules_per_member(rules, len(sources))
    pipe = _pipeline.Pipeline("objckpt.load_ensemble", template, sources, at=at,
                              strict=strict, optimizer_state=optimizer_state, cast=cast)
    variables = _tree.tree(template)
    failing = [0]  # the member whose source failed, for its error

    def about(err):  # a member's error names its source as given, and the template
        return _about_member(err, sources[failing[0]], template)

    def then(err):  # any error: the other workers must not wait for this one
        if not isinstance(err, errors.ObjckptError):
            return err
        k = failing[0]
        return _with_context(err, f"member {k} (source {_describe_source(sources[k])})")

    if mode is True or (mode == "auto" and _compat.optimizers_of(template)):
        return Ensemble(_load_with_optimizers(pipe, template, sources, member_rules, failing,
                                              about, then))
    # Clones share the template's paths, so every source is opened, then planned against
    # the template (once per distinct source structure) and checked from metadata before
    # any member exists, and the workers agree once; each member's variables are then
    # created with their values. A large source (a file or checkpoint) is read as each
    # variable of the member is created, one tensor at a time, the variable adopting the
    # tensor read (`_ReadOnCreate`): nothing is held beyond the members but the tensor being
    # read. Smaller ones, Snapshots and distributed variables: values fetched first.
    plans: dict = {}
    loaded = []  # per member: {id(template variable): value}, or a _ReadOnCreate
    with pipe.decided(lambda: variables, about=about, then=then):
        opened = []
        for failing[0], source in enumerate(sources):
            opened.append(pipe.open(source))
        for failing[0], (source, member_rule) in enumerate(zip(opened, member_rules)):
            the_plan = _plan_for(pipe, variables, source, member_rule, plans)
            if _read_on_create(source, the_plan, variables):
                loaded.append(_ReadOnCreate(pipe, the_plan, variables))
                continue
            values = pipe.fetch(the_plan, variables)
            loaded.append({id(variables[m.target]): v for m, v in zip(the_plan.matches, values)})
    network = _compat.network_variable_paths(template)
    members, trees = [], []
    for failing[0], value_of in enumerate(loaded):
        loaded[failing[0]] = None  # the member's values go with it
        try:
            member, copies = _member(pipe, template, value_of)
        except errors.ObjckptError as err:
            about(err)
            raise then(err) from err
        members.append(member)
        trees.append({path: copies[id(v)] for path, v in network})
    return Ensemble._of_clones(members, trees)


class _ReadOnCreate:
    """A member's values by id(template variable), each read from its source (the fetch
    stage: read, transformed, checked and cast) when the clone's variable is created
    (`pop`, as `clone_with_values` takes it), so the variable adopts the tensor read and
    no other value is held. A read that fails is kept (`failure`) and raised once the
    walk ends (the clone, never returned, is dropped); later variables start as zeros."""

    def __init__(self, pipe, the_plan, variables):
        self._pipe, self._plan, self._variables = pipe, the_plan, variables
        self._match_of = {id(variables[m.target]): m for m in the_plan.matches}
        self.failure = None

    def __len__(self) -> int:
        return len(self._match_of)

    def __contains__(self, key) -> bool:
        return key in self._match_of

    def keys(self) -> list:
        return list(self._match_of)

    def read(self, key):
        """The value of the variable of id `key`, read now (kept in the mapping)."""
        (value,) = self._pipe.fetch(self._plan, self._variables, [self._match_of[key]])
        return value

    def pop(self, key, default=None):
        if key not in self._match_of or self.failure is not None:
            self._match_of.pop(key, None)
            return default
        try:
            value = self.read(key)
        except Exception as err:  # noqa: BLE001 - raised by _member, after the walk
            self.failure = err
            return default
        del self._match_of[key]
        return value


def _read_on_create(source, the_plan, variables) -> bool:
    """Whether a member's values are read as its variables are created (`_ReadOnCreate`):
    eagerly, from a file or checkpoint (not a Snapshot, whose values are in memory) of at
    least `_fastio.STREAM_BYTES` (below it, one read of everything is faster), into plain
    variables (distributed ones are created with their values on every replica, and
    SyncOnRead ones assigned after as `objckpt.restore` does: values fetched first)."""
    from objckpt._bundle import fastio as _fastio

    if not tf.executing_eagerly() or source.kind == "snapshot" or not the_plan.matches:
        return False
    targets = [variables[m.target] for m in the_plan.matches]
    if any(_compat.replica_parts(v) is not None or _compat.is_distributed_variable(type(v))
           for v in targets):
        return False
    return sum(_nbytes(v) for v in targets) >= _fastio.STREAM_BYTES


def _nbytes(variable) -> int:
    return (variable.shape.num_elements() or 0) * variable.dtype.size


def _member(pipe, template, value_of):
    """(member, copies): a clone of the template whose variables are created from
    `value_of` (a dict of values, or a `_ReadOnCreate`); what was not created from its
    value (a wrapper) is assigned after, and so are SyncOnRead variables under a strategy,
    which TF creates with the value on every replica but restores as a checkpoint's
    aggregate (a SUM variable's replicas get value / replicas), as objckpt.restore does.
    Then the state Keras layers derive from variables is refreshed."""
    ids = list(value_of.keys())
    lazy = isinstance(value_of, _ReadOnCreate)  # plain variables only: no strategy
    read = value_of.read if lazy else dict(value_of).__getitem__
    member, copies = _clone.clone_with_values(template, value_of)
    if lazy and value_of.failure is not None:
        raise value_of.failure
    pipe.assign_pairs([(copies[key], read(key)) for key in ids
                       if key in value_of or (not lazy and copies[key].synchronization
                                              == tf.VariableSynchronization.ON_READ)])
    # Tensors cached from variables (Normalization's mean) come from the template's:
    # computed from this member's values; LoRA factors the source lacks are zeroed.
    pipe.refresh([copies[key] for key in ids], obj=member)
    return member, copies


def _load_with_optimizers(pipe, template, sources, member_rules, failing, about,
                          then) -> list:
    """Members whose optimizer state moves by owner into their own optimizers (built first
    where the template's is compiled but not built): every source is opened on every worker
    (one agreement) before the members exist (creating them is a collective), then each
    member is planned, checked and fetched (a second agreement) before any is assigned."""
    def about_member(err):  # names the source as given and the template, not the clone
        k = failing[0]
        return _about_member(err, sources[k], template, opened=opened[k], member=members[k])

    opened = []
    with pipe.decided(lambda: _tree.tree(template), about=about, then=then):
        for failing[0], source in enumerate(sources):
            opened.append(pipe.open(source))
    members = [_clone.clone(template, copy_values=False) for _ in sources]
    staged = []  # per member: its plan and values, or a checked loader (values None)
    try:
        with pipe.decided(lambda: _tree.tree(template), about=about_member, then=then):
            for failing[0], (member, source, rules) in enumerate(
                    zip(members, opened, member_rules)):
                variables = _tree.tree(member)
                variables, the_plan = pipe.plan(variables, source, obj=member, rules=rules)
                the_plan = pipe.check(variables, source, the_plan, obj=member, rules=rules)
                loader = pipe.fetch_streamed(source, the_plan, variables)
                staged.append([member, variables, source, the_plan, loader,
                               None if loader is not None
                               else pipe.fetch(the_plan, variables)])
        for entry in staged:
            member, variables, source, the_plan, loader, values = entry
            entry[4] = None  # closed by the assign stage, whatever happens there
            pipe.assign(variables, the_plan, values, obj=member, loader=loader)
            pipe.refresh([variables[m.target] for m in the_plan.matches], obj=member,
                         key=variables, merged=not source.keyed_by_path)
    finally:  # a failure: the loaders not yet assigned let their files go
        for entry in staged:
            if entry[4] is not None:
                entry[4].close()
    return members


def _plan_for(pipe, variables, source, rules, plans: dict):
    """The checked plan of source into the template, reused for equal structures."""
    key = None
    if source.structure is not None:
        key = (source.structure(), tuple(tuple(rule) for rule in rules))
        try:
            hash(key)
        except TypeError:
            key = None
    cached = plans.get(key) if key is not None else None
    if cached is not None:
        return dataclasses.replace(cached, source=source.description, _source=source)
    variables, the_plan = pipe.plan(variables, source, rules=rules)
    the_plan = pipe.check(variables, source, the_plan, rules=rules)
    if key is not None:
        plans[key] = the_plan
    return the_plan


def _is_keras(obj) -> bool:
    return _compat.keras_callback_base(obj) is not None


def _relaxed_spec(value):
    """A TensorSpec of value with an unknown leading (batch) dimension."""
    value = tf.convert_to_tensor(value)
    shape = value.shape
    if shape.rank:
        shape = tf.TensorShape([None]).concatenate(shape[1:])
    return tf.TensorSpec(shape, value.dtype)


class Ensemble:
    """N members of one architecture evaluated together.

    Args:
      members: the member objs (usually from `objckpt.load_ensemble`); each a
        Keras model of any flavour or a callable tf.Module, all with the same
        object tree (paths, shapes, dtypes) and their own variables.

    Calling the ensemble calls every member on the same input (Keras models
    with training=False unless given) and returns the outputs stacked on a
    new leading axis of size N (nested outputs: every leaf stacked).
    """

    def __init__(self, members: Sequence):
        members = tuple(members)
        if not members:
            raise errors.InvalidArgumentError(
                "An Ensemble needs at least one member. Received: no members. Fix: pass a "
                "list of models, or use objckpt.load_ensemble(template, sources).")
        trees = [dict(_compat.network_variable_paths(m)) for m in members]
        reference = {p: (tuple(v.shape), v.dtype) for p, v in trees[0].items()}
        for k, member_tree in enumerate(trees[1:], start=1):
            got = {p: (tuple(v.shape), v.dtype) for p, v in member_tree.items()}
            if got != reference:
                differ = sorted(p for p in reference.keys() | got.keys()
                                if reference.get(p) != got.get(p))
                raise errors.StructureMismatchError(
                    f"Ensemble members must share one architecture: member {k} differs from "
                    f"member 0 at {len(differ)} path(s), e.g. "
                    + ", ".join(f"`{p}` ({_spec(reference.get(p))} vs {_spec(got.get(p))})"
                                for p in differ[:3])
                    + ". Fix: build every member with the same code (or objckpt.clone).",
                    tuple(differ))
        seen = {}
        for k, member_tree in enumerate(trees):
            for path, variable in member_tree.items():
                other = seen.setdefault(id(variable), (k, path))
                if other[0] != k:
                    raise errors.StructureMismatchError(
                        f"Ensemble members must have their own variables: `{path}` of member "
                        f"{k} is the variable `{other[1]}` of member {other[0]}. Fix: "
                        "objckpt.clone(model) for each member.", (path,))
        self._init(members, trees)

    @classmethod
    def _of_clones(cls, members: tuple, trees: list) -> Ensemble:
        """Members cloned from one template: one architecture, own variables (no check)."""
        ensemble = cls.__new__(cls)
        ensemble._init(tuple(members), trees)
        return ensemble

    def _init(self, members: tuple, trees: list) -> None:
        self._members = members
        self._trees = trees
        self._keras = _is_keras(members[0])
        self._functions: dict = {}
        self.last_mode: str | None = None
        self.fallback_reason: str | None = None

    @property
    def members(self) -> tuple:
        """The member objs, in source order."""
        return self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self):
        return iter(self._members)

    def __repr__(self) -> str:
        return (f"Ensemble({len(self._members)} x {type(self._members[0]).__name__}, "
                f"{len(self._trees[0])} variables each)")

    def __call__(self, inputs, *, mode: str = "auto", **kwargs):
        """Every member's output on `inputs`, stacked on a new leading axis.

        Args:
          inputs: what one member takes (a tensor or a nested structure).
          mode: "auto" (batched where possible, else a loop), "batched" (raise
            if impossible) or "loop" (the members one after the other, in one
            traced function).
          **kwargs: passed to every member's call (Keras: training=False by
            default).
        """
        if mode not in _MODES:
            raise errors.InvalidArgumentError(
                f'mode must be one of {", ".join(_MODES)}. Received: mode={mode!r}. Fix: pass '
                f'mode={_MODES[0]!r} or another of those.')
        if self._keras:
            kwargs.setdefault("training", False)
        specs = tf.nest.map_structure(_relaxed_spec, inputs)
        try:
            key = (mode, repr(specs), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        except Exception:  # an unprintable argument: no caching
            key = None
        entry = self._functions.get(key) if key is not None else None
        if entry is None:
            entry = self._function(mode, specs, kwargs)
            if key is not None:
                self._functions[key] = entry
        used, function, reason = entry
        self.last_mode, self.fallback_reason = used, reason
        return function(*tf.nest.flatten(inputs))

    def mean(self, inputs, **kwargs):
        """The members' outputs averaged (every leaf of nested outputs)."""
        return tf.nest.map_structure(lambda t: tf.reduce_mean(t, axis=0),
                                     self(inputs, **kwargs))

    def _function(self, mode: str, specs, kwargs: dict):
        flat_specs = tf.nest.flatten(specs)
        if mode != "loop":
            try:
                function = self._batched_function(specs, kwargs)
                with _quiet_tf_logger():  # pfor logs the op it cannot batch as an ERROR
                    function.get_concrete_function(*flat_specs)  # vectorizes now, or raises
                return "batched", function, None
            except (_compat.Unbatchable, ValueError, TypeError, NotImplementedError,
                    tf.errors.OpError) as err:
                reason = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                if mode == "batched":
                    raise errors.InvalidArgumentError(
                        f"mode='batched': the members of this ensemble cannot be evaluated as "
                        f"one batched computation: {reason}. Fix: mode='auto' or 'loop'.") \
                        from err
        else:
            reason = "mode='loop'"
        members = self._members

        def loop(*flat):
            inputs = tf.nest.pack_sequence_as(specs, list(flat))
            outputs = [m(inputs, **kwargs) for m in members]
            return tf.nest.map_structure(lambda *leaves: tf.stack(leaves), *outputs)

        return "loop", tf.function(loop, input_signature=flat_specs), reason

    def _batched_function(self, specs, kwargs: dict):
        template, trees = self._members[0], self._trees
        cached = [h.name for h in _compat.derived_hooks(template) if h.action != "lora"]
        if cached:  # constants in the traced graph, the same for every member
            raise _compat.Unbatchable(
                f"layer(s) {', '.join(cached[:3])} compute from tensors cached from their "
                "variables (finalize_state), which a batched graph would share across members")
        sharded = [path for path, v in trees[0].items() if _compat.is_sharded(v)]
        if sharded:  # its shards are read one by one where they live (lookups, concats)
            raise _compat.Unbatchable(
                f"`{sharded[0]}` is a sharded variable, read shard by shard (each on its own "
                "device), which a batched graph of the members' weights cannot stack")
        graph_def, input_names, output_names, structure, reads, others = _compat.stateless_graph(
            template, kwargs, specs, trees[0])
        paths = list(dict.fromkeys(path for _, path in reads))  # a variable read twice: once
        column_of = {path: i for i, path in enumerate(paths)}
        stacks = [[tree[path] for tree in trees] for path in paths]
        flat_specs = tf.nest.flatten(specs)

        def batched(*flat):
            weights = [tf.stack(_compat.read_values(column)) for column in stacks]

            def one(member_weights):
                input_map = dict(zip(input_names, flat))
                input_map.update(others)
                input_map.update({name: member_weights[column_of[path]]
                                  for name, path in reads})
                return tf.graph_util.import_graph_def(
                    graph_def, input_map=input_map, return_elements=output_names,
                    name="member")

            outputs = tf.vectorized_map(one, weights, fallback_to_while_loop=False)
            return tf.nest.pack_sequence_as(structure, list(outputs), expand_composites=True)

        return tf.function(batched, input_signature=flat_specs)


@contextlib.contextmanager
def _quiet_tf_logger():
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _spec(spec) -> str:
    if spec is None:
        return "absent"
    shape, dtype = spec
    return f"{dtype.name}{list(shape)}"
