"""Which of a model's variables are frozen: patterns, layers and variables compiled to a mask.

A `FrozenMask` knows a model's trainable variables (object paths, names, the variables
themselves and their replicas) and keeps the frozen set twice: as a NumPy array (what
`Freezer.frozen` reports, decided eagerly) and as a boolean TF variable that a traced step
reads when it runs, so that changing it never retraces.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors

__all__ = ["FrozenMask", "compile_patterns"]


def compile_patterns(patterns, action: str) -> list[re.Pattern]:
    """The regular expressions of `patterns`, for `action` ("freeze", "unfreeze").

    Raises:
      InvalidArgumentError: a pattern that is not a valid regular expression.
    """
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except (TypeError, re.error) as err:
            raise errors.InvalidArgumentError(
                f"{action}() takes regular expressions searched in object paths. Received: "
                f"{pattern!r} ({err}). Fix: pass valid regular expressions, e.g. "
                f"{action}('^encoder/', 'kernel$').") from err
    return compiled


def _name(variable) -> str:
    """The variable's name; a sharded variable's is its shards' (`embed/embeddings` of
    `embed/embeddings/part_0`): TF names the `ShardedVariable` itself generically."""
    if _compat.is_sharded(variable):
        return re.sub(r"/part_\d+$", "", _compat.variable_name(_compat.shards(variable)[0]))
    return _compat.variable_name(variable)


def _trains(path: str, variable) -> bool:
    """`variable.trainable`; a sharded variable's is its shards' (it has none of its own).

    Raises:
      DistributedVariableError: a sharded variable whose shards disagree: it cannot be frozen
        (or trained) as one logical variable.
    """
    if not _compat.is_sharded(variable):
        return variable.trainable
    trains = _compat.sharded_trainable(variable)
    if trains is None:
        flags = ", ".join(f"shard {i} {'trainable' if getattr(p, 'trainable', True) else 'not'}"
                          for i, p in enumerate(_compat.shards(variable)))
        raise errors.DistributedVariableError(
            f"`{path}` ({_name(variable)}) is a sharded variable "
            f"[{_compat.shard_layout(variable).describe()}] whose shards disagree on "
            f"`trainable` ({flags}). Freezer freezes a sharded variable whole, as one logical "
            "variable, so it needs one flag for all its shards. Fix: create its shards all "
            "trainable or all not (trainable=... when the variable is made).",
            path=path, variable_type=type(variable).__name__)
    return trains


class FrozenMask:
    """A model's trainable variables and which of them are frozen.

    Attributes:
      model: the model.
      paths: the object paths of its trainable variables, in tree order.
      names: their variable names (e.g. `conv/kernel`, the same in every Keras flavour).
      variables: the variables themselves.
      index: id of a variable (or of one of its replicas) -> its position in `paths`.
      frozen: a NumPy bool per variable: frozen now.
      mask: the same as a bool TF variable, read by traced steps when they run.
      any: a bool TF variable: whether any variable is frozen.
    """

    def __init__(self, model):
        everything = _compat.network_variable_paths(model)
        trainable = [(p, v) for p, v in everything if _trains(p, v)]
        if not trainable:
            raise errors.UnbuiltModelError(
                f"{type(model).__name__} has no trainable variables yet, so there is nothing "
                "to freeze. Fix: build it first (call it on a batch, or model.build(shape)).")
        self.model = model
        self.paths = tuple(p for p, _ in trainable)
        self.variables = tuple(v for _, v in trainable)
        # Patterns also match variable names (`conv/kernel` in every Keras flavour),
        # since Keras 3 functional object paths (`_operations/1/_kernel`) lack layer names.
        self.names = tuple(_name(v) for v in self.variables)
        self.untrainable = tuple((p, _name(v)) for p, v in everything if not _trains(p, v))
        # A sharded variable is frozen whole; optimizers update its shards, each by itself.
        self.shards = tuple(_compat.shards(v) if _compat.is_sharded(v) else ()
                            for v in self.variables)
        # id -> object path of every variable of the model's network (trainable or not,
        # replicas and shards included): how a layer or variable passed to `freeze` is
        # placed in it.
        self.owned = {}
        for path, variable in everything:
            for part in (variable, *(_compat.replica_parts(variable) or ()),
                         *_compat.shard_aliases(variable)):
                self.owned[id(part)] = path
        self.index = {id(v): i for i, v in enumerate(self.variables)}
        for i, variable in enumerate(self.variables):
            # Under tf.distribute, optimizers update each replica's (or shard's) variable
            # by itself.
            for part in (*(_compat.replica_parts(variable) or ()),
                         *_compat.shard_aliases(variable)):
                self.index[id(part)] = i
        # Under ParameterServerStrategy the workers' steps read the frozen set: it lives on
        # a parameter server there.
        device = _compat.mask_device(self.variables)
        with tf.init_scope(), (contextlib.nullcontext() if device is None else tf.device(device)):
            self.mask = tf.Variable(tf.zeros([len(self.paths)], tf.bool), trainable=False,
                                    name="objckpt_frozen")
            self.any = tf.Variable(False, trainable=False, name="objckpt_any_frozen")
        self.frozen = np.zeros(len(self.paths), bool)

    def index_of(self, variable) -> int | None:
        """The position of `variable` (or of a replica or shard of it) in `paths`, or None."""
        inner = _compat.as_variable(variable)
        return self.index.get(id(variable if inner is None else inner))

    def units(self, index: int) -> tuple:
        """The variables optimizers update for `paths[index]`: its shards (sharded), or
        itself."""
        return self.shards[index] or (self.variables[index],)

    def frozen_paths(self) -> tuple[str, ...]:
        """The object paths frozen now, in tree order."""
        return tuple(p for p, f in zip(self.paths, self.frozen) if f)

    def flags(self) -> list:
        """The frozen flag of every variable, read from the mask when the step runs (one
        Unpack for all of them, not a StridedSlice and three constants each)."""
        return tf.unstack(self.mask.read_value(), len(self.paths))

    def assign(self, frozen: np.ndarray) -> None:
        """Makes `frozen` the frozen set (the TF variables only when it changes)."""
        if not np.array_equal(frozen, self.frozen):
            self.mask.assign(frozen)
            self.any.assign(bool(frozen.any()))
            self.frozen = frozen

    def none(self) -> np.ndarray:
        """A selection of no variable."""
        return np.zeros(len(self.paths), bool)

    # --- patterns, layers and variables to a selection -------------------------------------

    @staticmethod
    def is_object(item) -> bool:
        """A layer, module or variable (not a pattern)."""
        return _compat.as_variable(item) is not None or _compat.is_trackable(item)

    def _check_whole(self, objects, action: str) -> None:
        """Refuses some but not all shards of a sharded variable given as variables: it is
        frozen whole, as one logical variable."""
        given: dict = {}
        for item in objects:
            variable = _compat.as_variable(item)
            index = None if variable is None else self.index.get(id(variable))
            if index is not None and self.shards[index]:
                given.setdefault(index, set()).add(id(variable))
        for index, ids in given.items():
            parts = self.shards[index]
            covered = sum(1 for part in parts
                          if ids & {id(a) for a in _compat.part_aliases(part)})
            if covered < len(parts):
                variable = self.variables[index]
                raise errors.DistributedVariableError(
                    f"{action}() was given {covered} of the {len(parts)} shards of "
                    f"`{self.paths[index]}` ({self.names[index]}), a sharded variable "
                    f"[{_compat.shard_layout(variable).describe()}]. A sharded variable is "
                    f"one logical variable: it is frozen and unfrozen whole, all its shards. "
                    f"Fix: pass the sharded variable itself, all its shards, its layer, or "
                    f"a pattern of its object path ({action}({self.paths[index]!r})).",
                    path=self.paths[index], variable_type=type(variable).__name__)

    def select(self, patterns, action: str) -> np.ndarray:
        """The variables that patterns, layers or variables select (all with none).

        Raises:
          InvalidArgumentError: a bad pattern, or one that matches nothing; a layer or
            variable that is not the model's (or has no trainable variable).
        """
        if len(patterns) == 1 and not isinstance(patterns[0], str) and \
                isinstance(patterns[0], Iterable) and not self.is_object(patterns[0]):
            patterns = tuple(patterns[0])  # freeze(["a", "b"]) as well as freeze("a", "b")
        if not patterns:
            return np.ones(len(self.paths), bool)
        chosen = self.none()
        objects = [p for p in patterns if self.is_object(p)]
        patterns = [p for p in patterns if not self.is_object(p)]
        self._check_whole(objects, action)
        for item in objects:
            chosen |= self._select_object(item, action)
        for pattern, regex in zip(patterns, compile_patterns(patterns, action)):
            hits = np.array([bool(regex.search(p) or regex.search(n))
                             for p, n in zip(self.paths, self.names)])
            if not hits.any():
                raise errors.InvalidArgumentError(
                    f"{action}({pattern!r}): {self._why_nothing(regex)}. Patterns are regular "
                    "expressions searched in object paths and variable names. Fix: pass a "
                    "pattern that matches one of objckpt.Freezer(model).paths or .names.")
            chosen |= hits
        return chosen

    def _why_nothing(self, regex) -> str:
        untrainable = [p for p, n in self.untrainable if regex.search(p) or regex.search(n)]
        if untrainable:
            return (f"it matches only variables that are not trainable (e.g. "
                    f"`{untrainable[0]}`): no optimizer updates them. BatchNorm "
                    "moving statistics follow the layer's training mode; call the "
                    "layer with training=False to keep them")
        return ("it matches no trainable variable; object paths and variable "
                "names look like " + ", ".join(
                    f"`{p}` ({n})" for p, n in zip(self.paths[:3], self.names)))

    def _select_object(self, item, action: str) -> np.ndarray:
        """The trainable variables of a layer or tf.Module inside the model (all of
        them), or that variable of the model."""
        variable = _compat.as_variable(item)
        if _compat.is_sharded(item):
            variables, what = [item], f"sharded variable {_name(item)!r}"
        elif variable is not None:
            variables, what = [variable], f"variable {_compat.variable_name(variable)!r}"
        else:
            try:
                variables = [v for _, v in _compat.network_variable_paths(item)]
            except errors.ObjckptError:
                variables = []
            name = getattr(item, "name", None)
            what = type(item).__name__ + (f" {name!r}" if isinstance(name, str) and name else "")
        owner = type(self.model).__name__
        outside = [v for v in variables if id(v) not in self.owned]
        if not variables or outside:
            detail = ("it has no variables yet (build it first)" if not variables else
                      f"its variable {_compat.variable_name(outside[0])!r} is not one of "
                      f"{owner}'s")
            raise errors.InvalidArgumentError(
                f"{action}({what}): {detail}. {action}() takes regular expressions, and layers, "
                f"modules or variables of the Freezer's model ({owner}). Fix: pass a layer "
                f"or variable of that model (e.g. model.get_layer(name)), or a pattern of its "
                "object paths (objckpt.Freezer(model).paths lists them).")
        chosen = self.none()
        for v in variables:
            index = self.index.get(id(v))
            if index is not None:
                chosen[index] = True
        if not chosen.any():
            raise errors.InvalidArgumentError(
                f"{action}({what}): none of its variables is trainable (e.g. "
                f"`{self.owned[id(variables[0])]}`): no optimizer updates them. BatchNorm "
                "moving statistics follow the layer's training mode. Fix: pass trainable "
                "layers or variables; to keep moving statistics, call the layer with "
                "training=False.")
        return chosen
