"""Freezing variables without recompiling or retracing.

A variable's `trainable` flag is read when a training step is traced, so
changing it means `compile()` again (Keras) or a retrace. `Freezer` keeps
the frozen set in a boolean TF variable instead; `Freezer.apply_gradients`
reads it inside the step, so the same traced step honours every later
`freeze`/`unfreeze`.

How a frozen variable stays bit-identical
-----------------------------------------
Optimizers update their state (momentum, Adam moments, weight decay, EMA)
even for a zero gradient, so a zero gradient alone moves a variable. Inside a
`tf.function`, the update runs in one of two branches of a conditional on "is
any variable frozen": the optimizer's plain update when none is. With up to
64 variables, the plain update is inlined in the step, where TF overlaps each
variable's update with the gradients still being computed (a conditional
there costs a Switch node per input); with more, either branch is one
function call. Otherwise:

* Keras optimizers (Keras 3, tf_keras, Keras 2, and their `legacy` ones)
  update each variable and its state in one method call (`update_step`, or
  `_resource_apply_dense`; weight decay in `_apply_weight_decay`); while the
  frozen branch is traced these are wrapped so that each variable's call runs
  only when it is not frozen. A frozen
  variable's update is skipped, not undone: it costs one conditional per
  variable, and freezing half the variables makes a step cheaper, not dearer.
* Other optimizers (TF1 `tf.compat.v1.train`, Keras optimizers with EMA,
  gradient accumulation, global-norm clipping or a loss-scale wrapper, whose
  state or scaling spans variables; variables with constraints, which Keras
  re-applies to every variable): for each variable, one conditional
  reads the variable and its optimizer state before the update, only when it
  is frozen, and hands the optimizer a zero gradient (so global-norm clipping
  ignores it); a second one writes the read values back after the update.
  The writes adopt the read buffers (no copy).

Under model.fit
---------------
Keras traces `model.train_step` once into a cached train function, capturing
the optimizer methods it calls. On a Keras model, the first `freeze` shadows
the model's `train_step` (an instance attribute, see `_FitHold`) with one
that routes the model's current optimizer (`apply_gradients`; a Keras 3
optimizer's `apply` too) through the Freezer while the step is traced, and
makes a train function traced before afresh, once. A recompile makes a new
train function, whose trace follows the new optimizer. One Freezer holds a model: a
second one's attach (the most recent `freeze`) displaces the first, whose frozen set then
no longer applies under fit (a Freezer made again in a notebook cell replaces the old
one, rather than nesting on it). A traced step that
passes none of the Freezer's variables through that optimizer (a custom
`train_step` updating them by hand) is refused while anything is frozen,
before any variable moves, and so is every later `freeze`.

Under tf.distribute
-------------------
Inside `strategy.run` (MirroredStrategy, MultiWorkerMirroredStrategy) the
optimizer all-reduces the gradients and updates each variable once per replica
in a cross-replica `merge_call`, which TF cannot run inside a conditional. There
the optimizer is called as it is, without the "is any variable frozen" branch:
Keras optimizers get their per-variable update skipped for each frozen
variable's replica (the hooks are installed once for all the replicas' calls);
other optimizers (and Keras ones with weight decay, which applies it in a
`merge_call` of its own) get the read-and-write-back of each frozen variable
and its state, each replica on its own copy. A MirroredVariable's replicas
start equal, get the same all-reduced update or none, and stay bit-identical.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import api as _api

__all__ = ["Freezer"]


def _compile(patterns, action: str) -> list[re.Pattern]:
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


class Freezer:
    """Freezes and unfreezes a model's variables by object path, without retracing.

    Two ways to train with it, both bit-exact (a frozen variable and its
    optimizer state keep their values) and both without retracing on
    `freeze` / `unfreeze`:

    * `model.fit` (a Keras model of any flavour): just `freeze`. The first
      `freeze` attaches the Freezer to the model (see `attach`): the next
      `fit` (or `train_on_batch`) traces its train step once more, with the
      model's optimizer routed through the Freezer, also after an earlier
      `fit`, after a recompile with a new optimizer, with `run_eagerly` and
      under tf.distribute. A custom `train_step` that updates the variables
      without the model's optimizer is refused (`UnsupportedObjectError`, by
      `fit` and then by `freeze`), never silently trained. One Freezer holds a
      model under `fit`: the most recent to freeze (see `attach`); a Freezer
      made again for the same model displaces the earlier one.
    * A custom training loop: call `freezer.apply_gradients(optimizer, ...)`
      where the loop calls the optimizer's (a plain `optimizer.apply_gradients`
      there is not routed, unless `hook(optimizer)`).

    Freezing a BatchNorm's gamma and beta leaves its moving statistics to the
    layer's training mode (they are not trainable), where `layer.trainable =
    False` would also run the layer in inference mode.

    Args:
      obj: a Keras model of any flavour or a tf.Module. Its trainable
        variables (by object path, optimizer state left out) can be frozen.
        (`model=` is its old name, accepted until objckpt 0.2 with a
        `DeprecationWarning`.)

    Attributes:
      model: obj, the very object passed in.
      paths: the object paths of the variables that can be frozen, in tree order.
      names: their variable names (e.g. `conv/kernel`, the same in every Keras
        flavour). A pattern selects a variable when it is found (re.search) in
        its object path or in its name.
      traces: how many times `apply_gradients` was traced into a `tf.function`.
      hooked_traces: how many of those skip frozen variables' per-variable
        updates (Keras optimizers) rather than restoring them afterwards.

    Example:
      >>> freezer = objckpt.Freezer(model)   # a compiled Keras model
      >>> freezer.freeze("^encoder/")
      >>> model.fit(x, y, epochs=3)          # the encoder and its Adam moments stay put
      >>> freezer.unfreeze()
      >>> model.fit(x, y, epochs=3)          # everything trains; nothing is retraced

      In a custom loop:

      >>> @tf.function
      ... def step(x, y):
      ...     with tf.GradientTape() as tape:
      ...         loss = loss_fn(y, model(x, training=True))
      ...     grads = tape.gradient(loss, model.trainable_variables)
      ...     freezer.apply_gradients(optimizer, zip(grads, model.trainable_variables))
      >>> freezer.freeze("^encoder/")   # the next steps leave the encoder alone
      >>> freezer.unfreeze()            # everything trains again; nothing is retraced
    """

    @_api.renamed("model", "obj", name="objckpt.Freezer")
    @errors.about_arguments(obj="obj")
    def __init__(self, obj):
        model = obj
        if not _compat.is_trackable(model):
            raise errors.UnsupportedObjectError(
                f"Freezer needs a trackable model (a Keras model of any flavour or a "
                f"tf.Module). Received: {type(model).__name__}. Fix: pass the model whose "
                "variables to freeze.")
        everything = _compat.network_variable_paths(model)
        trainable = [(p, v) for p, v in everything if v.trainable]
        if not trainable:
            raise errors.UnbuiltModelError(
                f"{type(model).__name__} has no trainable variables yet, so there is nothing "
                "to freeze. Fix: build it first (call it on a batch, or model.build(shape)).")
        self.model = model
        self.paths = tuple(p for p, _ in trainable)
        self._variables = tuple(v for _, v in trainable)
        # Patterns also match variable names (`conv/kernel` in every Keras flavour),
        # since Keras 3 functional object paths (`_operations/1/_kernel`) lack layer names.
        self.names = tuple(_compat.variable_name(v) for v in self._variables)
        self._untrainable = tuple((p, _compat.variable_name(v)) for p, v in everything
                                  if not v.trainable)
        # id -> object path of every variable of the model's network (trainable or not,
        # replicas included): how a layer or variable passed to `freeze` is placed in it.
        self._owned = {}
        for path, variable in everything:
            for part in (variable, *(_compat.replica_parts(variable) or ())):
                self._owned[id(part)] = path
        self._index = {id(v): i for i, v in enumerate(self._variables)}
        for i, variable in enumerate(self._variables):
            # Under tf.distribute, optimizers update each replica's variable by itself.
            for part in _compat.replica_parts(variable) or ():
                self._index[id(part)] = i
        self._replica_hooks: dict = {}  # id(optimizer) -> [hook, users, graph] in strategy.run
        self._replica_lock = threading.Lock()
        self._hooks: dict = {}  # id(optimizer) -> (optimizer, undo) of `hook`
        self._local = threading.local()  # per thread: inside `_apply`; steps routed through it
        self._fit = None  # a _FitHold once the frozen set holds under model.fit
        with tf.init_scope():
            self._mask = tf.Variable(tf.zeros([len(self.paths)], tf.bool), trainable=False,
                                     name="objckpt_frozen")
            self._any = tf.Variable(False, trainable=False, name="objckpt_any_frozen")
        self._frozen = np.zeros(len(self.paths), bool)
        self._state: dict = {}  # id(optimizer) -> id(variable) -> optimizer state variables
        self.traces = 0
        self.hooked_traces = 0  # traces whose frozen branch skips per-variable updates

    def __repr__(self) -> str:
        return f"Freezer({len(self.frozen)} of {len(self.paths)} variables frozen)"

    # --- choosing ------------------------------------------------------------------

    @property
    def frozen(self) -> tuple[str, ...]:
        """The object paths frozen now, in tree order."""
        return tuple(p for p, f in zip(self.paths, self._frozen) if f)

    def _select(self, patterns, action: str) -> np.ndarray:
        if len(patterns) == 1 and not isinstance(patterns[0], str) and \
                isinstance(patterns[0], Iterable) and not self._is_object(patterns[0]):
            patterns = tuple(patterns[0])  # freeze(["a", "b"]) as well as freeze("a", "b")
        if not patterns:
            return np.ones(len(self.paths), bool)
        chosen = np.zeros(len(self.paths), bool)
        objects = [p for p in patterns if self._is_object(p)]
        patterns = [p for p in patterns if not self._is_object(p)]
        for item in objects:
            chosen |= self._select_object(item, action)
        for pattern, regex in zip(patterns, _compile(patterns, action)):
            hits = np.array([bool(regex.search(p) or regex.search(n))
                             for p, n in zip(self.paths, self.names)])
            if not hits.any():
                untrainable = [p for p, n in self._untrainable
                               if regex.search(p) or regex.search(n)]
                if untrainable:
                    detail = (f"it matches only variables that are not trainable (e.g. "
                              f"`{untrainable[0]}`): no optimizer updates them. BatchNorm "
                              "moving statistics follow the layer's training mode; call the "
                              "layer with training=False to keep them")
                else:
                    detail = ("it matches no trainable variable; object paths and variable "
                              "names look like " + ", ".join(
                                  f"`{p}` ({n})" for p, n in zip(self.paths[:3], self.names)))
                raise errors.InvalidArgumentError(
                    f"{action}({pattern!r}): {detail}. Patterns are regular expressions "
                    "searched in object paths and variable names. Fix: pass a pattern that "
                    "matches one of objckpt.Freezer(model).paths or .names.")
            chosen |= hits
        return chosen

    @staticmethod
    def _is_object(item) -> bool:
        """A layer, module or variable (not a pattern)."""
        return _compat.as_variable(item) is not None or _compat.is_trackable(item)

    def _select_object(self, item, action: str) -> np.ndarray:
        """The trainable variables of a layer or tf.Module inside the model (all of
        them), or that variable of the model."""
        variable = _compat.as_variable(item)
        if variable is not None:
            variables, what = [variable], f"variable {_compat.variable_name(variable)!r}"
        else:
            try:
                variables = [v for _, v in _compat.network_variable_paths(item)]
            except errors.ObjckptError:
                variables = []
            name = getattr(item, "name", None)
            what = type(item).__name__ + (f" {name!r}" if isinstance(name, str) and name else "")
        owner = type(self.model).__name__
        outside = [v for v in variables if id(v) not in self._owned]
        if not variables or outside:
            detail = ("it has no variables yet (build it first)" if not variables else
                      f"its variable {_compat.variable_name(outside[0])!r} is not one of "
                      f"{owner}'s")
            raise errors.InvalidArgumentError(
                f"{action}({what}): {detail}. {action}() takes regular expressions, and layers, "
                f"modules or variables of the Freezer's model ({owner}). Fix: pass a layer "
                f"or variable of that model (e.g. model.get_layer(name)), or a pattern of its "
                "object paths (objckpt.Freezer(model).paths lists them).")
        chosen = np.zeros(len(self.paths), bool)
        for v in variables:
            index = self._index.get(id(v))
            if index is not None:
                chosen[index] = True
        if not chosen.any():
            raise errors.InvalidArgumentError(
                f"{action}({what}): none of its variables is trainable (e.g. "
                f"`{self._owned[id(variables[0])]}`): no optimizer updates them. BatchNorm "
                "moving statistics follow the layer's training mode. Fix: pass trainable "
                "layers or variables; to keep moving statistics, call the layer with "
                "training=False.")
        return chosen

    def _set(self, frozen: np.ndarray) -> None:
        if frozen.any() and _FitHold.applies(self.model):
            self.attach()  # raises, changing nothing, where fit cannot honour it
        if not np.array_equal(frozen, self._frozen):
            self._mask.assign(frozen)
            self._any.assign(bool(frozen.any()))
            self._frozen = frozen

    def freeze(self, *patterns) -> tuple[str, ...]:
        """Freezes the variables whose object path matches one of the patterns.

        With no pattern, every variable is frozen. Returns the frozen paths.
        Patterns are regular expressions searched in object paths and variable
        names (`freeze("^conv/")` selects layer `conv` in every flavour); one
        that matches nothing is an error, so a typo never silently trains.
        Layers and `tf.Module`s inside the model (all their trainable variables)
        and variables of the model may be given too, mixed with patterns:
        `freeze(model.get_layer("encoder"), "bias$")`.

        On a Keras model the frozen variables hold under `model.fit` too: the
        first `freeze` attaches the Freezer (`attach`), so the next `fit`
        traces the train step once more; later calls never retrace.

        Raises:
          InvalidArgumentError: a bad pattern, or one that matches nothing; a layer or
            variable that is not the model's (or has no trainable variable).
          UnsupportedObjectError: the model's train step was traced and passes
            none of these variables through the model's optimizer, so `fit`
            cannot hold them (the message names the fix:
            `freezer.apply_gradients` in that `train_step`). Nothing changes.
        """
        self._set(self._frozen | self._select(patterns, "freeze"))
        return self.frozen

    def unfreeze(self, *patterns) -> tuple[str, ...]:
        """Unfreezes the variables matching one of the patterns (all with none); layers
        and variables of the model as in `freeze`."""
        self._set(self._frozen & ~self._select(patterns, "unfreeze"))
        return self.frozen

    def set_frozen(self, patterns) -> tuple[str, ...]:
        """Freezes exactly the variables matching `patterns` (None or () for none): a
        pattern, layer or variable, or a list of them (as `freeze` takes them); under
        `model.fit` as `freeze`."""
        if patterns is None or (not isinstance(patterns, str) and not self._is_object(patterns)
                                and not list(patterns)):
            self._set(np.zeros(len(self.paths), bool))
        else:
            if isinstance(patterns, str) or self._is_object(patterns):
                patterns = (patterns,)
            self._set(self._select(tuple(patterns), "freeze"))
        return self.frozen

    # --- applying ------------------------------------------------------------------

    def _state_of(self, optimizer, indices: list[int], trained=None) -> dict:
        """Freezer index -> the optimizer's state variables for it (built if needed).

        trained: the variables as the caller passes them to the optimizer (Keras
        3 optimizers know them by those objects), to build it with.
        """
        known = self._state.get(id(optimizer), {})
        missing = [i for i in indices if i not in known]
        if missing:
            _compat.build_optimizer(optimizer, trained if trained is not None
                                    else [self._variables[i] for i in missing])
            state = _compat.optimizer_state(optimizer, [self._variables[i] for i in missing])
            for i in missing:
                known[i] = tuple(state[id(self._variables[i])])
            if any(known.values()):  # an optimizer without state may still be building
                self._state[id(optimizer)] = known
        return known

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, optimizer, grads_and_vars, **kwargs):
        """`optimizer.apply_gradients(grads_and_vars)`, leaving frozen variables alone.

        A frozen variable and all its optimizer state (momentum, Adam moments,
        ...) keep their exact values; the optimizer's step counter advances as
        usual. Works eagerly and inside a `tf.function`: the frozen set is read
        when the step runs, so toggling it never retraces. Variables the
        Freezer does not know (not in its model) are passed through untouched.

        Under tf.distribute, call it where the optimizer's own
        `apply_gradients` goes: in the function passed to `strategy.run`
        (traced or eagerly); the replicas of every variable stay identical.

        Returns what `optimizer.apply_gradients` returns eagerly; inside a
        `tf.function`, the optimizer's `iterations` (the update runs in one of
        two branches: the plain one while nothing is frozen; inside
        `strategy.run`, what the optimizer returns).

        Raises:
          DistributedVariableError: called in a strategy's cross-replica context
            (in `strategy.scope()`, outside `strategy.run`) for its variables.
        """
        return self._apply(optimizer, optimizer.apply_gradients, grads_and_vars, **kwargs)

    def matching(self, *patterns) -> tuple[str, ...]:
        """The object paths `freeze(*patterns)` would freeze, changing nothing (patterns,
        layers and variables as `freeze` takes them).

        Raises InvalidArgumentError for a bad pattern or one that matches nothing.
        """
        chosen = self._select(patterns, "freeze")
        return tuple(p for p, c in zip(self.paths, chosen) if c)

    def hook(self, optimizer) -> None:
        """Routes every `optimizer.apply_gradients(...)` call (and a Keras 3 optimizer's
        `apply(grads, variables)`) through this Freezer; `unhook` undoes it.

        For `model.fit` this is not needed: `freeze` on a compiled Keras model
        hooks its optimizer by itself (see `attach`). Hooking the model's own
        optimizer attaches too, so a train function traced before holds as well.
        Hooking an optimizer twice changes nothing.
        """
        if id(optimizer) not in self._hooks:
            self._hooks[id(optimizer)] = (optimizer, self._override(optimizer))
        if optimizer is getattr(self.model, "optimizer", None) and _FitHold.applies(self.model):
            self.attach()

    def unhook(self, optimizer) -> None:
        """Undoes `hook(optimizer)`; an optimizer never hooked is left as it is."""
        entry = self._hooks.pop(id(optimizer), None)
        if entry is not None:
            _compat.restore_methods(optimizer, entry[1])

    def _override(self, optimizer) -> list:
        """Shadows the optimizer's `apply_gradients` (and Keras 3's `apply`) with calls
        through `_apply`; returns what `_compat.restore_methods` undoes."""
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars, *args, **kwargs):
            return self._apply(optimizer, original, grads_and_vars, *args, **kwargs)

        methods = {"apply_gradients": apply_gradients}
        if callable(getattr(optimizer, "stateless_apply", None)) and \
                callable(getattr(optimizer, "apply", None)):
            # Keras 3: apply_gradients calls apply(grads, variables), which custom
            # train_steps also call themselves (Keras 3's guide does).
            original_apply = optimizer.apply

            def apply_pairs(pairs, *args, **kwargs):
                return original_apply([g for g, _ in pairs], [v for _, v in pairs],
                                      *args, **kwargs)

            def apply(grads, trainable_variables=None, *args, **kwargs):
                if trainable_variables is None:  # the optimizer's own list: not routed, so
                    return original_apply(grads, None, *args, **kwargs)  # fit refuses it
                return self._apply(optimizer, apply_pairs,
                                   zip(list(grads), list(trainable_variables)), *args, **kwargs)

            methods["apply"] = apply
        return _compat.override_methods(optimizer, methods)

    # --- model.fit -----------------------------------------------------------------

    def attach(self) -> None:
        """Makes the frozen set hold under `model.fit` of this Freezer's Keras model.

        `freeze` (and `set_frozen`, `hook(model.optimizer)`) call it on a Keras
        model of any flavour; call it yourself only to have the train function
        retraced before anything is frozen. From then on:

        * while a train step is traced (or run, with `run_eagerly`), the
          model's current optimizer is routed through this Freezer (its
          `apply_gradients`, and Keras 3's `apply`), also after a recompile
          with a new optimizer; frozen variables and their optimizer state
          stay bit-identical under `fit`, `train_on_batch`, `run_eagerly` and
          tf.distribute. (Outside the train step the optimizer is left alone:
          a custom loop calling its `apply_gradients` gets its own step.);
        * a train function traced before (by an earlier `fit`) is made afresh,
          once: the next `fit` traces it again with the Freezer in place.
          Later `freeze` / `unfreeze` calls never retrace;
        * a train step (a custom `train_step`) that updates none of the
          Freezer's variables through the model's optimizer cannot be held:
          its trace raises `UnsupportedObjectError` while anything is frozen,
          before any variable moves, and so does every later `freeze`. The
          fix it names: call `freezer.apply_gradients(self.optimizer, ...)`
          in that `train_step`. (A custom `train_step` that passes some
          variables through the model's optimizer and updates others by hand
          or with a second optimizer is not checked: those others need
          `freezer.apply_gradients` too.)

        `detach` undoes it. Does nothing on a model already attached.

        One Freezer acts on a model under `fit`: the most recent one to attach
        (to freeze something, or to `hook` the model's optimizer). Attaching
        displaces another Freezer attached to the same model: its frozen set no
        longer applies under `fit` (and its `hook` of the model's optimizer is
        undone), until it freezes again and displaces this one. So a notebook
        cell run again (`f = Freezer(m); f.freeze(...)`) leaves no earlier,
        unreachable Freezer holding variables. Its `apply_gradients` in a custom
        loop is unaffected.

        Raises:
          InvalidArgumentError: the model has no `fit` (a tf.Module).
          UnsupportedObjectError: a traced train step went around the optimizer.
        """
        if not _FitHold.applies(self.model):
            raise errors.InvalidArgumentError(
                f"Freezer.attach() makes frozen variables hold under model.fit; "
                f"{type(self.model).__name__} has no fit (not a Keras model). Fix: in your "
                "training step call freezer.apply_gradients(optimizer, zip(grads, variables)).")
        if self._fit is None:
            self._fit = _FitHold(self)
        self._fit.attach()

    def detach(self) -> None:
        """Undoes `attach`: the model's train function is made afresh, and the next `fit`
        traces it without this Freezer (frozen variables train again)."""
        if self._fit is not None:
            self._fit.detach()

    def _apply(self, optimizer, apply, grads_and_vars, *args, **kwargs):
        if getattr(self._local, "active", False):
            # Called again from within: `freezer.apply_gradients(opt)` of a hooked `opt`,
            # or a hooked Keras 3 `apply_gradients` calling its hooked `apply`.
            return apply(list(grads_and_vars), *args, **kwargs)
        self._local.active = True
        try:
            return self._guarded_apply(optimizer, apply, grads_and_vars, *args, **kwargs)
        finally:
            self._local.active = False

    def _guarded_apply(self, optimizer, apply, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        guarded = []  # (position in pairs, freezer index)
        for position, (gradient, variable) in enumerate(pairs):
            index = self._index.get(id(_compat.as_variable(variable)))
            if index is not None and gradient is not None:
                guarded.append((position, index))
        if not guarded:
            return apply(pairs, *args, **kwargs)
        self._local.routed = getattr(self._local, "routed", 0) + 1  # checked by _FitHold
        replica = _compat.replica_index()
        if replica is None:
            self._check_not_cross_replica(guarded)
        state = self._state_of(optimizer, [i for _, i in guarded],
                               [variable for _, variable in pairs])
        if tf.executing_eagerly():
            return self._apply_eagerly(apply, pairs, guarded, state, args, kwargs, replica)
        self.traces += 1
        if replica is not None:
            return self._apply_in_replica(optimizer, apply, pairs, guarded, state, args, kwargs,
                                          replica)

        def plain():
            apply(list(pairs), *args, **kwargs)

        def hooked_apply(cond):
            # Keras optimizers (Keras 3, tf_keras, Keras 2) update each variable in one
            # method call: skipping that call for frozen variables leaves them and their
            # state untouched at the cost of one conditional per variable.
            # One Unpack for all the flags (not a StridedSlice and three constants each).
            flags = tf.unstack(self._mask.read_value(), len(self.paths))
            with _SkipFrozenUpdates(self, optimizer, lambda i, _: flags[i], methods,
                                    cond) as hook:
                apply(list(pairs), *args, **kwargs)
            missing = {i for _, i in guarded} - hook.seen
            if missing:  # an optimizer that updates some variable another way
                raise _NotCovered(sorted(missing))
            self.hooked_traces += 1

        def guarded_apply():
            xla = _compat.in_xla_context()
            flags = tf.unstack(self._mask.read_value(), len(self.paths))
            guarded_pairs = list(pairs)
            backups = []
            for position, index in guarded:
                gradient, variable = guarded_pairs[position]
                tensors = (self._variables[index], *state[index])
                frozen = flags[index]
                if isinstance(gradient, tf.IndexedSlices):
                    values = tf.cond(
                        frozen, lambda t=tensors: [_compat.read_value(v) for v in t],
                        lambda t=tensors: _not_read(t, xla))
                else:
                    values, zeroed = tf.cond(
                        frozen,
                        lambda t=tensors, g=gradient: ([_compat.read_value(v) for v in t],
                                                       tf.zeros_like(g)),
                        lambda t=tensors, g=gradient: (_not_read(t, xla), g))
                    guarded_pairs[position] = (zeroed, variable)
                backups.append((frozen, tensors, values))
            # No explicit control edges (they would cost O(variables x update ops)): TF's
            # automatic control dependencies order ops by the variables they touch, so each
            # variable's read comes before its update and its restore after it.
            apply(guarded_pairs, *args, **kwargs)
            for frozen, tensors, values in backups:
                tf.cond(frozen, lambda t=tensors, x=values: _restore(t, x), tf.no_op)

        # Nothing frozen (the common case): the optimizer's plain update. With a few
        # variables it is inlined in the step (a lowered conditional: one Switch node per
        # input), so TF still overlaps each variable's update with the gradients computed
        # after it, and while something is frozen each variable's update is one small
        # function call. With many, a Switch per input costs more than one function call
        # for all of them (the plain or the frozen update), which is used instead.
        # (Any of the Freezer's variables: one frozen but not passed here only costs the
        # frozen branch, where each passed variable is updated as its own flag says.)
        any_frozen = self._any.read_value()
        few = len(guarded) <= _FEW
        methods = _SkipFrozenUpdates.methods(optimizer, [pairs[p][1] for p, _ in guarded])
        if methods:
            try:
                if few:
                    tf.cond(any_frozen, lambda: hooked_apply(_compat.called_cond), plain)
                else:
                    _compat.called_cond(any_frozen, lambda: hooked_apply(tf.cond), plain)
                return getattr(optimizer, "iterations", None)
            except _NotCovered:
                pass  # nothing was added to this graph: the branches are built first
        (_compat.switch if few else _compat.called_cond)(any_frozen, guarded_apply, plain)
        return getattr(optimizer, "iterations", None)

    def _check_not_cross_replica(self, guarded) -> None:
        """Refuses the cross-replica context of a strategy (in its scope, outside
        `strategy.run`), where optimizers cannot apply gradients to its variables."""
        if not (tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context()):
            return
        for _, index in guarded:
            variable = self._variables[index]
            if _compat.replica_parts(variable) is not None:
                strategy = type(tf.distribute.get_strategy()).__name__
                raise errors.DistributedVariableError(
                    f"Freezer.apply_gradients was called in the cross-replica context of "
                    f"{strategy} (inside strategy.scope(), outside strategy.run) for "
                    f"`{self.paths[index]}` ({self.names[index]}), a {type(variable).__name__}: "
                    "optimizers apply gradients to a strategy's variables in a replica "
                    "context, where they all-reduce the gradients. Fix: call it in the "
                    "function you pass to strategy.run, e.g. strategy.run(step, args=(x,)) "
                    "with freezer.apply_gradients(optimizer, zip(grads, variables)) in step.",
                    path=self.paths[index], variable_type=type(variable).__name__)

    def _apply_in_replica(self, optimizer, apply, pairs, guarded, state, args, kwargs,
                          replica: int):
        """Traced inside `strategy.run`: the optimizer's call is not put in a conditional
        (its all-reduce and `merge_call` cannot be); each variable's update is guarded."""
        variables = [pairs[p][1] for p, _ in guarded]
        methods = () if getattr(optimizer, "weight_decay", None) else \
            _SkipFrozenUpdates.methods(optimizer, variables)
        if methods:
            with self._shared_replica_hook(optimizer, methods) as hook:
                result = apply(list(pairs), *args, **kwargs)
            missing = {i for _, i in guarded} - hook.seen
            if missing:
                paths = ", ".join(f"`{self.paths[i]}`" for i in sorted(missing)[:5])
                raise errors.UnsupportedObjectError(
                    f"Freezer.apply_gradients inside strategy.run: {type(optimizer).__name__} "
                    f"updated {paths} without its per-variable update method, so frozen "
                    "variables may have moved in this traced step. Fix: call "
                    "freezer.apply_gradients outside a tf.function (eagerly) with this "
                    "optimizer, or use a Keras optimizer without EMA, gradient accumulation "
                    "or global clipping.")
            self.hooked_traces += 1
            return result
        xla = _compat.in_xla_context()
        flags = tf.unstack(self._mask.read_value(), len(self.paths))
        guarded_pairs = list(pairs)
        backups = []
        for position, index in guarded:
            gradient, variable = guarded_pairs[position]
            tensors = tuple(_on_replica(v, replica)
                            for v in (self._variables[index], *state[index]))
            frozen = flags[index]
            values = tf.cond(frozen, lambda t=tensors: [_compat.read_value(v) for v in t],
                             lambda t=tensors: _not_read(t, xla))
            if not isinstance(gradient, tf.IndexedSlices):
                guarded_pairs[position] = (tf.where(frozen, tf.zeros_like(gradient), gradient),
                                           variable)
            backups.append((frozen, tensors, values))
        result = apply(guarded_pairs, *args, **kwargs)
        for frozen, tensors, values in backups:
            tf.cond(frozen, lambda t=tensors, x=values: _restore(t, x), tf.no_op)
        return result

    def _shared_replica_hook(self, optimizer, methods):
        """One `_SkipFrozenUpdates` for the calls of every replica of one traced step.

        MirroredStrategy traces each replica's function in a thread of its own, one at a
        time, into one graph, and runs the optimizer's update for all of them once, after
        the last one called it: the hooks stay installed from the first replica's call to
        the last one's return. The frozen flags are read where each update runs. Hooks
        left by a trace that failed half-way (a replica that never returned) belong to
        another graph and are replaced.
        """
        freezer = self

        class Shared:
            def __enter__(self):
                graph = tf.compat.v1.get_default_graph()
                with freezer._replica_lock:
                    entry = freezer._replica_hooks.get(id(optimizer))
                    if entry is not None and entry[2] is not graph:
                        del freezer._replica_hooks[id(optimizer)]
                        entry[0].__exit__(None, None, None)
                        entry = None
                    if entry is None:
                        hook = _SkipFrozenUpdates(freezer, optimizer, _LazyFlags(freezer),
                                                  methods, tf.cond)
                        hook.__enter__()
                        entry = freezer._replica_hooks[id(optimizer)] = [hook, 0, graph]
                    entry[1] += 1
                    self.entry = entry
                    return entry[0]

            def __exit__(self, *exc):
                with freezer._replica_lock:
                    entry = self.entry
                    entry[1] -= 1
                    if entry[1] == 0 and freezer._replica_hooks.get(id(optimizer)) is entry:
                        del freezer._replica_hooks[id(optimizer)]
                        entry[0].__exit__(*exc)
                return False

        return Shared()

    def _apply_eagerly(self, apply, pairs, guarded, state, args, kwargs, replica=None):
        frozen = [(position, index) for position, index in guarded if self._frozen[index]]
        backups = []
        for position, index in frozen:
            tensors = tuple(_on_replica(v, replica)
                            for v in (self._variables[index], *state[index]))
            backups.append((tensors, [_compat.read_value(v) for v in tensors]))
            gradient, variable = pairs[position]
            if not isinstance(gradient, tf.IndexedSlices):
                pairs[position] = (tf.zeros_like(gradient), variable)
        result = apply(pairs, *args, **kwargs)
        for tensors, values in backups:
            _restore(tensors, values)
        return result


class _FitHold:
    """Makes a Freezer's frozen set hold under `model.fit` (every Keras flavour).

    Keras traces `model.train_step` into a cached `model.train_function`; the
    optimizer methods it calls are captured then. The model's `train_step` is
    shadowed (an instance attribute, as `hook` shadows the optimizer's
    `apply_gradients`) by one that, while it is traced (or run eagerly), routes
    the model's current optimizer (after a recompile: the new one) through the
    Freezer, and afterwards checks that some Freezer variable went through it.
    The optimizer is hooked only for that call: a custom loop calling its
    `apply_gradients` itself gets the optimizer's own step. Under
    tf.distribute every replica's trace runs between the first one's start and
    the last one's end, so the hook is shared and counted. A train function
    made before is made afresh once, at `attach`.
    """

    def __init__(self, freezer):
        self.freezer = freezer
        self.model = freezer.model
        self.attached = False
        self.undo: list = []  # the train_step override
        self.lock = threading.Lock()
        self.active = 0  # train_step calls in progress (one per replica under a strategy)
        self.hooked = None  # (optimizer, undo) while they are
        self.refusal: str | None = None  # why a traced step cannot be held

    @staticmethod
    def applies(model) -> bool:
        """Whether the model has Keras' `fit` machinery (any flavour)."""
        return callable(getattr(model, "make_train_function", None)) and \
            callable(getattr(model, "train_step", None))

    @staticmethod
    def current(model) -> _FitHold | None:
        """The hold attached to model now (its `train_step` is our wrapper), or None."""
        return getattr(vars(model).get("train_step"), "objckpt_hold", None)

    def attach(self) -> None:
        if self.refusal is not None:
            raise errors.UnsupportedObjectError(self.refusal)
        model, hold = self.model, self
        other = _FitHold.current(model)
        if self.attached and other in (self, None):
            return  # None: something shadowed train_step on top of ours, which it calls
        if other is not None:
            # One hold per model: the most recent Freezer to attach wins; the one it
            # displaces stops acting under fit (a notebook cell run again makes a new
            # Freezer: the old one, unreachable, must not keep its variables frozen).
            other.displace()
        if self.attached:  # displaced by another hold since, or overridden on top
            _compat.restore_methods(model, self.undo)
            self.attached = False
        original = model.train_step

        def train_step(*args, **kwargs):
            # Left to AutoGraph like the original (a custom train_step may need it); the
            # checks around the call are not converted.
            routed = hold.before()
            try:
                outputs = original(*args, **kwargs)
                hold.after(routed)
            finally:
                hold.release(routed)
            return outputs

        train_step.objckpt_hold = hold  # found by the next Freezer's attach
        self.undo = _compat.override_methods(model, {"train_step": train_step})
        self.attached = True
        if getattr(model, "train_function", None) is not None:
            # Traced (or made, capturing train_step) before the hooks: make it afresh,
            # to be traced on its first call (also in the middle of fit, which looks
            # model.train_function up for every step).
            model.make_train_function(force=True)

    def displace(self) -> None:
        """Another Freezer attaches to this model: this hold stops acting under fit, and so
        do this Freezer's hooks of the model's optimizer (the train function is made afresh
        by the attach that follows)."""
        if self.attached:
            _compat.restore_methods(self.model, self.undo)
            self.undo = []
            self.attached = False
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            self.freezer.unhook(optimizer)

    def detach(self) -> None:
        if self.attached:
            _compat.restore_methods(self.model, self.undo)
            self.undo = []
            self.attached = False
            if getattr(self.model, "train_function", None) is not None:
                self.model.make_train_function(force=True)  # traced with the Freezer

    @tf.autograph.experimental.do_not_convert
    def before(self):
        if not self.attached:
            return None
        with self.lock:
            if self.active == 0:
                optimizer = getattr(self.model, "optimizer", None)
                if optimizer is not None and id(optimizer) not in self.freezer._hooks and \
                        callable(getattr(optimizer, "apply_gradients", None)):
                    self.hooked = (optimizer, self.freezer._override(optimizer))
            self.active += 1
        return getattr(self.freezer._local, "routed", 0)

    @tf.autograph.experimental.do_not_convert
    def release(self, routed) -> None:
        if routed is None:
            return
        with self.lock:
            self.active -= 1
            if self.active == 0 and self.hooked is not None:
                _compat.restore_methods(*self.hooked)
                self.hooked = None

    @tf.autograph.experimental.do_not_convert
    def after(self, routed) -> None:
        if routed is None:
            return
        if getattr(self.freezer._local, "routed", 0) != routed:
            return
        freezer = self.freezer
        optimizer = getattr(self.model, "optimizer", None)
        example = freezer.paths.index(freezer.frozen[0]) if freezer.frozen else 0
        keras3 = callable(getattr(optimizer, "stateless_apply", None))
        self.refusal = (
            f"Freezer: {type(self.model).__name__}.train_step passed none of the Freezer's "
            f"variables (e.g. `{freezer.paths[example]}` ({freezer.names[example]})) to the "
            f"model's optimizer ({type(optimizer).__name__}.apply_gradients"
            f"{' or .apply(grads, variables)' if keras3 else ''}), so model.fit cannot "
            "keep frozen variables from moving. Fix: update them in train_step with "
            "freezer.apply_gradients(self.optimizer, zip(grads, variables)), which honours "
            "freeze/unfreeze without retracing.")
        if freezer._frozen.any():
            raise _compat.past_autograph(errors.UnsupportedObjectError(self.refusal))


# Up to this many variables, `Freezer.apply_gradients` inlines the plain update and,
# while something is frozen, calls one small function per variable (about 10 us each);
# above, one function call for all of them costs less than a Switch node per input.
# That call cannot start before every gradient is ready: measured on Adam steps, it
# added 12% to a 0.5 ms step of 6 variables and 9% to a 0.65 s step of 48, where the
# inlined update added 4% and 1%; with 500 small variables it was the faster one.
_FEW = 64


def _not_read(variables, xla: bool) -> list:
    """What the branch of a variable not frozen gives for the values the frozen branch reads:
    empty tensors; under XLA, which needs both branches' shapes equal, the values (a read is
    no copy there)."""
    if xla:
        return [_compat.read_value(v) for v in variables]
    return [tf.zeros([0], v.dtype) for v in variables]


def _on_replica(variable, replica):
    """The variable itself, or inside `strategy.run` its replica's own variable (read and
    assigned there without TF's cross-replica aggregation)."""
    if replica is None:
        return variable
    parts = _compat.replica_parts(_compat.as_variable(variable))
    return variable if parts is None else parts[replica]


class _LazyFlags:
    """`flag(index, variable)`: the frozen flag of a Freezer variable, read from the mask
    once per graph and device of the variables updated (each replica's update reads it on
    its own device)."""

    def __init__(self, freezer):
        self.freezer = freezer
        self.read: dict = {}

    def __call__(self, index, variable):
        graph = tf.compat.v1.get_default_graph()
        key = (id(graph), variable.device)
        entry = self.read.get(key)
        if entry is None or entry[0] is not graph:
            with tf.device(variable.device):
                mask = self.freezer._mask.read_value()
                entry = self.read[key] = (graph, tf.unstack(mask, len(self.freezer.paths)))
        return entry[1][index]


class _NotCovered(Exception):
    """The optimizer updated a guarded variable without its per-variable method."""


# The per-variable methods of OptimizerV2 (tf_keras and Keras 2 `optimizers.legacy`).
_LEGACY_METHODS = ("_resource_apply_dense", "_resource_apply_sparse_duplicate_indices")


class _SkipFrozenUpdates:
    """While tracing: the optimizer's per-variable update runs only if not frozen.

    Keras 3 and the tf_keras / Keras 2 optimizers call `update_step` once per
    variable (slots included) and `_apply_weight_decay` for all; their
    `optimizers.legacy` ones call `_resource_apply_dense` (or the sparse
    variant) per variable. Those methods are shadowed by instance attributes
    that wrap each variable's call in a conditional on its frozen flag.
    `seen` collects the Freezer indices that went through them.
    """

    def __init__(self, freezer, optimizer, flag, methods, cond=tf.cond):
        self.freezer, self.optimizer, self.flag = freezer, optimizer, flag
        self.methods, self.cond = methods, cond
        self.seen: set = set()
        self.undo: list = []

    @staticmethod
    def methods(optimizer, variables) -> tuple[str, ...]:
        """The per-variable update methods to wrap; () where skipping is not enough.

        Not with EMA, gradient accumulation or global-norm clipping (state or
        scaling shared across variables), loss-scale wrappers (the inner
        optimizer updates), XLA-compiled update steps (cached across traces)
        or variable constraints (re-applied to every variable after updates).
        """
        if (type(optimizer).__module__.split(".", 1)[0] not in ("keras", "tf_keras")
                or getattr(optimizer, "use_ema", False)
                or getattr(optimizer, "gradient_accumulation_steps", None)
                or getattr(optimizer, "global_clipnorm", None) is not None
                or hasattr(optimizer, "inner_optimizer")
                or getattr(optimizer, "jit_compile", False)
                or any(getattr(v, "constraint", None) is not None
                       or getattr(_compat.as_variable(v), "constraint", None) is not None
                       for v in variables)):
            return ()
        if callable(getattr(optimizer, "update_step", None)) and \
                _compat.weight_decay_method(optimizer) is not None:
            return ("update_step",)  # Keras 3; tf_keras and Keras 2 (2.11+) optimizers
        if all(callable(getattr(optimizer, name, None)) for name in _LEGACY_METHODS):
            return _LEGACY_METHODS  # tf_keras / Keras 2 `optimizers.legacy`
        return ()

    def _index(self, variable):
        return self.freezer._index.get(id(_compat.as_variable(variable)))

    def __enter__(self):
        optimizer = self.optimizer
        legacy = self.methods == _LEGACY_METHODS
        decay = _compat.weight_decay_method(optimizer)

        def guard(update):
            def update_one(gradient, variable, *args, **kwargs):
                index = self._index(variable)
                if index is None:
                    return update(gradient, variable, *args, **kwargs)
                self.seen.add(index)
                # Branches without outputs: the If is kept for its stateful ops alone.
                self.cond(self.flag(index, variable), lambda: None,
                          lambda: (update(gradient, variable, *args, **kwargs), None)[1])
                # Legacy optimizers group the update ops they get back.
                return tf.no_op() if legacy else None

            return update_one

        def apply_weight_decay(variables):
            for variable in variables:
                index = self._index(variable)
                if index is None:
                    decay([variable])
                else:
                    self.cond(self.flag(index, variable), lambda: None,
                              lambda v=variable: (decay([v]), None)[1])

        hooks = {name: guard(getattr(optimizer, name)) for name in self.methods}
        if not legacy and getattr(optimizer, "weight_decay", None):
            hooks[_compat.WEIGHT_DECAY_METHOD] = apply_weight_decay
        self.undo = _compat.override_methods(optimizer, hooks)
        self.hooks = hooks
        return self

    def __exit__(self, *exc):
        _compat.restore_methods(self.optimizer, self.undo)
        return False


def _restore(variables, values):
    for variable, value in zip(variables, values):
        variable.assign(value, read_value=False)
    return tf.no_op()
