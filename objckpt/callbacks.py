"""Keras callbacks over objckpt, for `model.fit` in every Keras flavour.

Each callback is a real `Callback` of the Keras that its model belongs to
(Keras 3, tf_keras or Keras 2): the right base class is picked when the
callback is created, so `model.fit(callbacks=[...])` accepts it everywhere.
"""

from __future__ import annotations

from objckpt import errors

__all__ = ["TwinSync"]

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
