"""The Callback interface of every Keras flavour, for callbacks created without a model.

Keras 3, tf_keras and Keras 2 drive callbacks by duck typing: `FlavourFreeCallback` has every
hook they call (each a no-op unless overridden, and marked as such so Keras skips it), so one
object works in `fit` of any flavour. No TensorFlow is imported here.
"""

from __future__ import annotations

__all__ = ["FlavourFreeCallback"]


def _default(function):
    from objckpt import _compat  # loads only _compat.hooks: no TensorFlow

    return _compat.mark_default_hook(function)


class FlavourFreeCallback:
    """The Callback interface of every Keras flavour; subclasses override the hooks they use."""

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
    setattr(FlavourFreeCallback, _hook, _default(lambda self, batch, logs=None: None))
for _hook in ("on_epoch_begin", "on_epoch_end"):
    setattr(FlavourFreeCallback, _hook, _default(lambda self, epoch, logs=None: None))
for _hook in ("on_train_begin", "on_train_end", "on_test_begin", "on_test_end",
              "on_predict_begin", "on_predict_end"):
    setattr(FlavourFreeCallback, _hook, _default(lambda self, logs=None: None))
