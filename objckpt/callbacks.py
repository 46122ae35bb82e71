"""Keras callbacks over objckpt, for `model.fit` in every Keras flavour.

Each callback is a real `Callback` of the Keras that its model belongs to
(Keras 3, tf_keras or Keras 2): the right base class is picked when the
callback is created, so `model.fit(callbacks=[...])` accepts it everywhere.
"""

from __future__ import annotations

import contextlib

from objckpt import errors

__all__ = ["FreezeSchedule", "TwinSync"]

_BASES: dict = {}


def _with_keras_base(cls, model):
    """Returns a subclass of `cls` that also subclasses model's Keras Callback."""
    from objckpt import _compat

    base = _compat.keras_callback_base(model)
    if base is None:
        raise errors.InvalidArgumentError(
            f"{cls.__name__} drives model.fit, so it needs a Keras model (Keras 3, tf_keras or "
            f"Keras 2). Received: a {type(model).__name__}. In a custom loop call the objckpt "
            "API directly instead (e.g. twins.sync() after each step).")
    key = (cls, base)
    if key not in _BASES:
        _BASES[key] = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
    return _BASES[key]


class TwinSync:
    """Syncs `twins.past` from `twins.current` during `model.fit`.

    Args:
      twins: an `objckpt.Twins` whose `current` is the model being fit.
      every: sync after every `every`-th batch (or epoch).
      tau: 1.0 for a hard copy, < 1 for a Polyak update (see `Twins.sync`).
      on: "batch" or "epoch".

    Example:
      >>> twins = objckpt.Twins(model)
      >>> model.fit(x, y, callbacks=[objckpt.callbacks.TwinSync(twins, every=10, tau=0.01)])
    """

    def __new__(cls, twins, every: int = 1, tau: float = 1.0, on: str = "batch"):
        if not hasattr(twins, "sync") or not hasattr(twins, "current"):
            raise errors.InvalidArgumentError(
                "TwinSync needs an objckpt.Twins. Received: twins of type "
                f"{type(twins).__name__}. Fix: TwinSync(objckpt.Twins(model)).")
        return super().__new__(_with_keras_base(cls, twins.current))

    def __init__(self, twins, every: int = 1, tau: float = 1.0, on: str = "batch"):
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise errors.InvalidArgumentError(
                f"every must be a positive int (sync after every N batches or epochs). "
                f"Received: every={every!r}.")
        if on not in ("batch", "epoch"):
            raise errors.InvalidArgumentError(
                f'on must be "batch" or "epoch". Received: on={on!r}.')
        from objckpt._twins import _check_tau

        _check_tau(tau)
        self.twins, self.every, self.tau, self.on = twins, every, tau, on
        self.syncs = 0
        self._count = 0

    def _tick(self) -> None:
        self._count += 1
        if self._count % self.every == 0:
            self.twins.sync(self.tau)
            self.syncs += 1

    def on_train_batch_end(self, batch, logs=None):
        if self.on == "batch":
            self._tick()

    def on_epoch_end(self, epoch, logs=None):
        if self.on == "epoch":
            self._tick()


def _default(function):
    function._is_default = True  # Keras 3: a hook that does nothing (keeps async dispatch)
    return function


class _FlavourFreeCallback:
    """The Callback interface of every Keras flavour, for callbacks created without a model.

    Keras 3, tf_keras and Keras 2 drive callbacks by duck typing; this class
    has every hook they call (each a no-op unless overridden), so one object
    works in `fit` of any flavour.
    """

    _supports_tf_logs = False
    async_safe = False

    def __init__(self):
        self.model = None
        self.params = {}
        self.validation_data = None

    def set_params(self, params):
        self.params = params

    def set_model(self, model):
        self.model = model

    def _implements_train_batch_hooks(self):
        return False

    def _implements_test_batch_hooks(self):
        return False

    def _implements_predict_batch_hooks(self):
        return False


for _hook in ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end",
              "on_test_batch_begin", "on_test_batch_end", "on_predict_batch_begin",
              "on_predict_batch_end"):
    setattr(_FlavourFreeCallback, _hook, _default(lambda self, batch, logs=None: None))
for _hook in ("on_epoch_begin", "on_epoch_end"):
    setattr(_FlavourFreeCallback, _hook, _default(lambda self, epoch, logs=None: None))
for _hook in ("on_train_begin", "on_train_end", "on_test_begin", "on_test_end",
              "on_predict_begin", "on_predict_end"):
    setattr(_FlavourFreeCallback, _hook, _default(lambda self, logs=None: None))


class FreezeSchedule(_FlavourFreeCallback):
    """Freezes and unfreezes variables at epoch boundaries during `model.fit`.

    No `compile()` again and no retrace: the model's optimizer goes through an
    `objckpt.Freezer` for the duration of `fit`, so frozen variables and their
    optimizer state (momentum, Adam moments) stay bit-identical while the
    traced train step keeps running.

    Args:
      schedule: {epoch: patterns}: from that epoch on (until the next entry),
        exactly the variables whose object path matches one of the patterns
        (regular expressions; a string or a list) are frozen; None or [] for
        none. Before the first entry nothing is frozen.

    Attributes:
      freezer: the `objckpt.Freezer` in use (after training began).
      history: [(epoch, frozen object paths)] for every epoch trained.

    Example:
      >>> model.fit(x, y, epochs=6, callbacks=[objckpt.callbacks.FreezeSchedule(
      ...     {0: "^encoder/", 3: None})])   # encoder frozen for epochs 0-2
    """

    def __init__(self, schedule):
        super().__init__()
        if not isinstance(schedule, dict) or not schedule:
            raise errors.InvalidArgumentError(
                "FreezeSchedule takes a non-empty dict {epoch: patterns}, e.g. "
                f"{{0: '^encoder/', 3: None}}. Received: {schedule!r}.")
        cleaned = {}
        for epoch, patterns in schedule.items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise errors.InvalidArgumentError(
                    f"FreezeSchedule epochs must be ints >= 0 (0 is the first epoch). "
                    f"Received: {epoch!r}.")
            if patterns is None:
                patterns = ()
            elif isinstance(patterns, str):
                patterns = (patterns,)
            else:
                patterns = tuple(patterns)
                if not all(isinstance(p, str) for p in patterns):
                    raise errors.InvalidArgumentError(
                        f"FreezeSchedule[{epoch}] must be a regex string, a list of them or "
                        f"None. Received: {schedule[epoch]!r}.")
            cleaned[epoch] = patterns
        self.schedule = dict(sorted(cleaned.items()))
        self.freezer = None
        self.history: list[tuple[int, tuple[str, ...]]] = []
        self._optimizer = None

    def _patterns_at(self, epoch: int) -> tuple[str, ...]:
        current = ()
        for start, patterns in self.schedule.items():
            if start <= epoch:
                current = patterns
        return current

    def on_train_begin(self, logs=None):
        from objckpt._freeze import Freezer

        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None or not callable(getattr(optimizer, "apply_gradients", None)):
            raise errors.InvalidArgumentError(
                "FreezeSchedule needs a compiled model with an optimizer. Received: "
                f"{type(model).__name__} with optimizer={optimizer!r}. Fix: model.compile("
                "optimizer=..., loss=...) before fit.")
        if self.freezer is None or self.freezer.model is not model:
            self.freezer = Freezer(model)
        for epoch, patterns in self.schedule.items():  # every pattern checked before training
            try:
                if patterns:
                    self.freezer._select(patterns, "freeze")
            except errors.InvalidArgumentError as err:
                raise errors.InvalidArgumentError(f"FreezeSchedule[{epoch}]: {err}") from err
        freezer, original = self.freezer, optimizer.apply_gradients

        def apply_gradients(grads_and_vars, *args, **kwargs):
            return freezer._apply(optimizer, original, grads_and_vars, *args, **kwargs)

        optimizer.apply_gradients = apply_gradients
        self._optimizer = optimizer
        # The train function may have been traced by an earlier fit, before this hook:
        # make a fresh one (traced once, on the first batch).
        model.make_train_function(force=True)

    def on_epoch_begin(self, epoch, logs=None):
        self.freezer.set_frozen(self._patterns_at(epoch))
        self.history.append((epoch, self.freezer.frozen))

    def on_train_end(self, logs=None):
        if self._optimizer is not None:
            with contextlib.suppress(AttributeError):
                del self._optimizer.apply_gradients
            self._optimizer = None
        self.freezer.set_frozen(None)
