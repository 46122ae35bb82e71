"""`Freezer`: the public face of freezing, composing the parts that do the work.

Which variables are frozen (`selection.FrozenMask`), an optimizer's update that honours it
(`guard.GuardedApply`), the optimizers routed through that update (`routes.OptimizerRoutes`)
and the frozen set held under `model.fit` (`fit.FitHold`). The package's docstring says how
a frozen variable stays bit-identical.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import api as _api
from objckpt._ops.freeze.fit import FitHold
from objckpt._ops.freeze.guard import GuardedApply
from objckpt._ops.freeze.routes import OptimizerRoutes
from objckpt._ops.freeze.selection import FrozenMask

__all__ = ["Freezer"]


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
        self._selection = FrozenMask(model)  # which variables are frozen, eagerly and when run
        self._mask = self._selection.mask  # the bool TF variable a traced step reads
        self._guard = GuardedApply(self._selection)  # an optimizer's update that honours it
        self._routes = OptimizerRoutes(self._guard)  # optimizers routed through the guard
        self._fit = None  # a FitHold once the frozen set holds under model.fit
        self.model = model
        self.paths = self._selection.paths
        self.names = self._selection.names
        self._variables = self._selection.variables

    def __repr__(self) -> str:
        return f"Freezer({len(self.frozen)} of {len(self.paths)} variables frozen)"

    @property
    def traces(self) -> int:
        """How many times `apply_gradients` was traced into a `tf.function`."""
        return self._guard.traces

    @property
    def hooked_traces(self) -> int:
        """How many traces skip frozen variables' per-variable updates."""
        return self._guard.hooked_traces

    # --- choosing ------------------------------------------------------------------

    @property
    def frozen(self) -> tuple[str, ...]:
        """The object paths frozen now, in tree order."""
        return self._selection.frozen_paths()

    def _set(self, frozen: np.ndarray) -> None:
        if frozen.any() and FitHold.applies(self.model):
            self.attach()  # raises, changing nothing, where fit cannot honour it
        self._selection.assign(frozen)

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
        self._set(self._selection.frozen | self._selection.select(patterns, "freeze"))
        return self.frozen

    def unfreeze(self, *patterns) -> tuple[str, ...]:
        """Unfreezes the variables matching one of the patterns (all with none); layers
        and variables of the model as in `freeze`."""
        self._set(self._selection.frozen & ~self._selection.select(patterns, "unfreeze"))
        return self.frozen

    def set_frozen(self, patterns) -> tuple[str, ...]:
        """Freezes exactly the variables matching `patterns` (None or () for none): a
        pattern, layer or variable, or a list of them (as `freeze` takes them); under
        `model.fit` as `freeze`."""
        selection = self._selection
        if patterns is None or (not isinstance(patterns, str) and not selection.is_object(patterns)
                                and not list(patterns)):
            self._set(selection.none())
        else:
            if isinstance(patterns, str) or selection.is_object(patterns):
                patterns = (patterns,)
            self._set(selection.select(tuple(patterns), "freeze"))
        return self.frozen

    def matching(self, *patterns) -> tuple[str, ...]:
        """The object paths `freeze(*patterns)` would freeze, changing nothing (patterns,
        layers and variables as `freeze` takes them).

        Raises InvalidArgumentError for a bad pattern or one that matches nothing.
        """
        chosen = self._selection.select(patterns, "freeze")
        return tuple(p for p, c in zip(self.paths, chosen) if c)

    # --- applying ------------------------------------------------------------------

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
        return self._guard.apply(optimizer, optimizer.apply_gradients, grads_and_vars,
                                 **kwargs)

    def _state_of(self, optimizer, indices: list[int], trained=None) -> dict:
        """Freezer index -> the optimizer's state variables for it (built if needed)."""
        return self._guard.state_of(optimizer, indices, trained)

    def hook(self, optimizer) -> None:
        """Routes every `optimizer.apply_gradients(...)` call (and a Keras 3 optimizer's
        `apply(grads, variables)`) through this Freezer; `unhook` undoes it.

        For `model.fit` this is not needed: `freeze` on a compiled Keras model
        hooks its optimizer by itself (see `attach`). Hooking the model's own
        optimizer attaches too, so a train function traced before holds as well.
        Hooking an optimizer twice changes nothing.
        """
        self._routes.hook(optimizer)
        if optimizer is getattr(self.model, "optimizer", None) and FitHold.applies(self.model):
            self.attach()

    def unhook(self, optimizer) -> None:
        """Undoes `hook(optimizer)`; an optimizer never hooked is left as it is."""
        self._routes.unhook(optimizer)

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
        if not FitHold.applies(self.model):
            raise errors.InvalidArgumentError(
                f"Freezer.attach() makes frozen variables hold under model.fit; "
                f"{type(self.model).__name__} has no fit (not a Keras model). Fix: in your "
                "training step call freezer.apply_gradients(optimizer, zip(grads, variables)).")
        if self._fit is None:
            self._fit = FitHold(self, self._routes, self._guard)
        self._fit.attach()

    def detach(self) -> None:
        """Undoes `attach`: the model's train function is made afresh, and the next `fit`
        traces it without this Freezer (frozen variables train again)."""
        if self._fit is not None:
            self._fit.detach()
