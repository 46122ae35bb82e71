"""The Callback interface of every Keras flavour: one flavour-free base whose hooks are
no-ops that Keras skips, driven by each flavour's own `fit`."""

import numpy as np
import pytest

from objckpt import callbacks
from objckpt._training import callbackbase

from flavours import KERAS_FLAVOURS, keras_for

HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end",
         "on_test_batch_begin", "on_test_batch_end", "on_predict_batch_begin",
         "on_predict_batch_end", "on_epoch_begin", "on_epoch_end", "on_train_begin",
         "on_train_end", "on_test_begin", "on_test_end", "on_predict_begin", "on_predict_end")


def test_every_hook_is_a_marked_no_op():
    base = callbackbase.FlavourFreeCallback()
    for hook in HOOKS:
        method = getattr(base, hook)
        args = (0,) if "batch" in hook or "epoch" in hook else ()
        assert method(*args, logs={}) is None, hook
        assert getattr(type(base), hook)._is_default is True, hook  # Keras skips it
    assert base.model is None and base.params == {}
    base.set_params({"epochs": 3})
    assert base.params == {"epochs": 3}
    assert not base._implements_train_batch_hooks()


def test_the_public_callbacks_share_the_one_base():
    for cls in (callbacks.FreezeSchedule, callbacks.Checkpointing, callbacks.BestSnapshot,
                callbacks.SWA, callbacks.EMA):
        assert issubclass(cls, callbackbase.FlavourFreeCallback), cls


class _Counter(callbackbase.FlavourFreeCallback):
    def __init__(self):
        super().__init__()
        self.epochs, self.batches = [], 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)
        assert not getattr(type(self).on_epoch_end, "_is_default", False)

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def _implements_train_batch_hooks(self):
        return True


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_fit_of_each_flavour_drives_a_subclass(flavour):
    keras = keras_for(flavour)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    counter = _Counter()
    x = np.ones((8, 3), np.float32)
    model.fit(x, np.zeros((8, 2), np.float32), batch_size=4, epochs=2, verbose=0,
              callbacks=[counter])
    assert counter.epochs == [0, 1]
    assert counter.batches == 4
    assert counter.model is model
