"""Keras hooks: the callback base class, deferred build hooks and resuming `model.fit`."""

from __future__ import annotations

__all__ = ["defer_on_attach", "keras_callback_base", "set_fit_start_epoch", "skip_fit_batches",
           "steps_per_execution", "unskip_fit_batches"]


def keras_callback_base(model):
    """The `Callback` base class of the Keras flavour `model` belongs to."""
    import importlib

    for cls in type(model).__mro__:
        root = cls.__module__.split(".", 1)[0]
        if root in ("keras", "tf_keras"):
            return importlib.import_module(root).callbacks.Callback
    return None


class _OnAttach:
    """Duck-types TF's CheckpointPosition in `_deferred_dependencies`.

    TF calls `restore(trackable)` when a child is attached under the awaited
    name (`Trackable._handle_deferred_dependencies`); Keras 2's `add_weight`
    asks `is_simple_variable()` first and, on False, creates the variable
    normally and then attaches it.
    """

    class _Checkpoint:
        restore_uid = -1

    checkpoint = _Checkpoint()

    def __init__(self, callback):
        self._callback = callback

    def is_simple_variable(self) -> bool:
        return False

    def restore(self, trackable, *args, **kwargs):
        self._callback(trackable)
        return []


def defer_on_attach(node, name: str, callback) -> bool:
    """Calls `callback(child)` when a child named `name` is attached to node."""
    initialize = getattr(node, "_maybe_initialize_trackable", None)
    if initialize is None:
        return False
    initialize()
    deferred = getattr(node, "_deferred_dependencies", None)
    if not isinstance(deferred, dict):
        return False
    deferred.setdefault(name, []).append(_OnAttach(callback))
    return True


# --- resuming model.fit (callbacks.Checkpointing) ---------------------------------


class _StartEpoch:
    """tf_keras / Keras 2 `model._training_state`: fit asks it where to start."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return max(self.epoch, initial_epoch), 0


def set_fit_start_epoch(model, epoch) -> None:
    """Makes the `fit` now in `on_train_begin` start at `epoch`; None undoes it.

    Keras 3 reads `model._initial_epoch` after `on_train_begin`; tf_keras and
    Keras 2 ask `model._training_state` (the hook of their BackupAndRestore).
    """
    if "_training_state" in vars(model):  # tf_keras, Keras 2
        model._training_state = None if epoch is None else _StartEpoch(int(epoch))
    else:  # Keras 3
        model._initial_epoch = None if epoch is None else int(epoch)


def steps_per_execution(model) -> int:
    value = getattr(model, "_steps_per_execution", None)  # tf_keras, Keras 2: a variable
    if value is not None and hasattr(value, "numpy"):
        return int(value.numpy())
    return int(getattr(model, "steps_per_execution", 1) or 1)


def skip_fit_batches(model, calls: int) -> None:
    """Makes the next `calls` calls of `model.train_function` consume data, not train.

    Resuming mid-epoch: fit starts the epoch from its first batch, so the
    batches the checkpoint already trained on are drawn and dropped. Keras 3
    hands the train function the batches it drew; tf_keras and Keras 2 hand it
    the iterator to draw them from. Each skipped call returns empty logs.
    """
    original = model.train_function
    remaining = [int(calls)]
    spe = steps_per_execution(model)

    def train_function(iterator):
        if remaining[0] <= 0:
            model.train_function = original
            return original(iterator)
        remaining[0] -= 1
        if not isinstance(iterator, (list, tuple)):
            for _ in range(spe):
                next(iterator)
        if remaining[0] <= 0:
            model.train_function = original
        return {}

    if calls > 0:
        train_function.objckpt_original = original
        model.train_function = train_function


def unskip_fit_batches(model) -> None:
    """Removes a `skip_fit_batches` wrapper still in place (a fit that raised early)."""
    original = getattr(getattr(model, "train_function", None), "objckpt_original", None)
    if original is not None:
        model.train_function = original
