"""State that callbacks keep beside a model, saved and restored with it by `Checkpointing`.

A callback that keeps trackable state of its own for the model it trains (the SWA and EMA
averages of `_training.averaging`) registers a `Companion` here under a name, for that model.
`callbacks.Checkpointing` saves what is registered for its model beside it, as
`tf.train.Checkpoint(model=model, <name>=companion.state(), epoch=, step=, ...)`, restores it
on resume with the rest (all or nothing), and calls each companion's `before_save` just before
it reads the values of a save, so that what is written is the state of that very position of
training, whatever the order of the callbacks in `fit`. No TensorFlow is imported here.
"""

from __future__ import annotations

import weakref

from objckpt import errors

__all__ = ["Companion", "check_name", "reconcile", "register", "saved_with", "before_save", "unregister"]

# model -> {name: Companion}; a model that goes away takes its entries with it.
_REGISTERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Names Checkpointing's own root uses (`model` and its counters).
RESERVED = frozenset({"model", "epoch", "step", "batch", "monitor_value"})


class Companion:
    """What a callback hands the registry: overridden by the callbacks that keep state."""

    def state(self):
        """The trackable to save beside the model (created on the first call, then the same)."""
        raise NotImplementedError

    def before_save(self, epoch_end: bool) -> None:
        """Brings the state up to the current position before a save reads it.

        Args:
          epoch_end: the save comes at the end of an epoch (else after a batch).
        """


def register(model, name: str, companion: Companion) -> None:
    """Registers `companion` under `name` for `model`; a newer one of that name replaces it.

    Raises:
      InvalidArgumentError: `name` is not an identifier, or one Checkpointing uses itself.
    """
    check_name(name)
    _REGISTERED.setdefault(model, {})[name] = companion


def check_name(name) -> None:
    """Raises InvalidArgumentError unless `name` can name a companion's state."""
    if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
        raise errors.InvalidArgumentError(
            f"name must be an identifier other than {', '.join(sorted(RESERVED))} (it names "
            f"the state in the checkpoint: `<name>/...`). Received: name={name!r}. Fix: pass "
            "e.g. name='swa'.")


def unregister(model, name: str, companion: Companion) -> None:
    """Removes `companion` from `model`'s entries, if it is still the one under `name`."""
    entries = _REGISTERED.get(model)
    if entries is not None and entries.get(name) is companion:
        del entries[name]


def saved_with(model) -> dict:
    """{name: trackable} of the state registered for `model` (empty when there is none)."""
    return {name: companion.state()
            for name, companion in sorted(_REGISTERED.get(model, {}).items())}


def before_save(model, epoch_end: bool) -> None:
    """Calls `before_save` of every companion registered for `model`."""
    for _, companion in sorted(_REGISTERED.get(model, {}).items()):
        companion.before_save(epoch_end)


def reconcile(paths, registered) -> tuple[list[str], list[str]]:
    """Which companions a checkpoint and the fit disagree about, from the checkpoint's object
    paths: (names registered now whose state it lacks, names of companion state it holds that
    nothing registered now). A companion's state is recognised by its `<name>/seen` entry."""
    held = {path.split("/", 1)[0] for path in paths
            if path.count("/") == 1 and path.endswith("/seen")} - RESERVED
    return sorted(set(registered) - held), sorted(held - set(registered))
