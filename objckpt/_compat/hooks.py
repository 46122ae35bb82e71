"""TF-free Keras conventions: instance method overrides (Freezer's optimizer hooks, deferred
restore's build hook), Keras 3's "default hook" mark, weight-decay and cached-state names.

Imports no TensorFlow: `callbacks` marks its hooks at import time and stays cheap.
"""

from __future__ import annotations

__all__ = ["KERAS_CACHED_ATTRS", "WEIGHT_DECAY_METHOD", "mark_default_hook", "override_methods",
           "past_autograph", "restore_methods", "weight_decay_method"]


# --- instance method overrides (Freezer's optimizer hooks, deferred restore's build hook) --

def override_methods(obj, methods: dict) -> list:
    """Installs `methods` ({name: callable}) as instance attributes of obj, shadowing its
    class's (bypassing Keras' attribute tracking); returns what `restore_methods` undoes."""
    own = vars(obj)
    undo = []
    for name, method in methods.items():
        undo.append((name, method, name in own, own.get(name)))
        object.__setattr__(obj, name, method)
    return undo


def restore_methods(obj, undo: list) -> None:
    """Undoes `override_methods`; an override installed on top of ours stays in place."""
    own = vars(obj)
    for name, installed, had, previous in reversed(undo):
        if own.get(name) is not installed:
            continue
        if had:
            object.__setattr__(obj, name, previous)
        else:
            own.pop(name, None)


# Keras optimizers (3, tf_keras, Keras 2.11+) apply decoupled weight decay here.
WEIGHT_DECAY_METHOD = "_apply_weight_decay"


def weight_decay_method(optimizer):
    """The optimizer's bound weight-decay step, or None where it has none."""
    method = getattr(optimizer, WEIGHT_DECAY_METHOD, None)
    return method if callable(method) else None


def past_autograph(error: Exception) -> Exception:
    """Marks an error raised while a function is traced so that AutoGraph lets it through as
    it is (it would otherwise turn an exception class with its own constructor into a
    `StagingError`); returns it."""
    error.ag_pass_through = True
    return error


def mark_default_hook(function):
    """Marks a callback hook as one that does nothing: Keras 3 then keeps async dispatch."""
    function._is_default = True
    return function


# Cached per-instance state of Keras models (every flavour): traced train / test / predict
# functions and data iterators. They capture the original's variables, so a clone gets None
# and Keras makes new ones on first use.
KERAS_CACHED_ATTRS = frozenset({
    "train_function", "test_function", "predict_function",
    "train_tf_function",
    "_eval_epoch_iterator", "_predict_epoch_iterator", "_eval_data_handler",
})
