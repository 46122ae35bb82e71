"""`clone` and `clone_with_values`: a walk (`walker`) over obj with the copiers of
`table.COPIERS`, then derived state refreshed (see the package's docstring)."""

from __future__ import annotations

import tensorflow as tf

from objckpt import _compat
from objckpt._ops.clone.table import COPIERS
from objckpt._ops.clone.walker import Walker
from objckpt.errors import CloneError, about_arguments

__all__ = ["clone", "clone_with_values"]


@about_arguments(obj="obj")
def clone(obj, *, copy_values: bool = True):
    """Returns an independent copy of obj: same object tree, new variables.

    The clone has the same object paths (`objckpt.tree(clone)` keys), shapes and
    dtypes as obj; no variable is shared, and a variable or layer reachable by
    two paths in obj is one object reachable by both paths in the clone.
    Keras models of every flavour are copied without `get_config`, so
    subclassed models need neither registration nor `get_config`; an unbuilt
    model clones unbuilt. An attached optimizer is cloned with the model and its
    slot variables point at the clone's variables; compiled train / predict
    functions are not copied but re-traced for the clone on first use.

    Under tf.distribute (MirroredStrategy, MultiWorkerMirroredStrategy) the
    clone's variables are created under the original's strategy, mirrored like
    the original (MirroredVariable or SyncOnReadVariable, same synchronization
    and aggregation, one component per replica on the same devices), whether
    clone is called inside or outside `strategy.scope()`; each replica starts
    with the value of the same replica of the original. Call it outside
    `strategy.run`, and on every worker of a multi-worker strategy.

    Args:
      obj: a Keras model or layer (any flavour), a tf.Module, a
        tf.train.Checkpoint, an optimizer, or any Python object holding them.
      copy_values: True: every variable starts with the original's value (every
        replica of a distributed variable with its own replica's), so the clone
        computes bit-identical outputs. False: every variable is a new variable
        of the same shape and dtype filled with zeros, on every replica
        (initializers are not re-run); restore values into it with objckpt.restore.

    Returns:
      The clone, of obj's type.

    Raises:
      CloneError (a TypeError): something in obj cannot be duplicated (open
        file, thread, traced ConcreteFunction, lookup table), or clone was
        called inside `strategy.run` or another strategy's scope; the message
        names its attribute path.
      DistributedVariableError (a TypeError): a tf.distribute variable clone
        cannot re-create faithfully (TPU or packed variables); the message
        names its attribute path and type.
    """
    result = clone_with_values(obj, copy_values=copy_values)[0]
    # Tensors a layer caches from its variables (an adapted Normalization's mean) were copied
    # as they are: computed again from the clone's own variables, as Keras's loaders do.
    _compat.refresh_derived_state(result)
    return result


def clone_with_values(obj, values: dict | None = None, *, copy_values: bool = False):
    """`clone`, where a variable whose id is in `values` starts with that value.

    Returns (the clone, a dict mapping id(original object) to its copy, for
    every object copied). The values must fit their variables (shape, dtype).
    """
    if not tf.executing_eagerly():
        raise CloneError("objckpt.clone needs eager execution; it was called inside a "
                         "tf.function or TF1 graph. Fix: call it eagerly, outside the "
                         "tf.function.")
    name = getattr(obj, "name", None)
    root = type(obj).__name__ if not isinstance(name, str) else f"{type(obj).__name__}({name!r})"
    walker = Walker(copy_values, root, values, table=COPIERS)
    return walker.run(obj), walker.memo
