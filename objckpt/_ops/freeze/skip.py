"""Frozen variables' updates skipped inside a Keras optimizer, while a step is traced.

Keras optimizers (Keras 3, tf_keras, Keras 2, and their `legacy` ones) update each variable
and its state in one method call; `SkipFrozenUpdates` wraps that call in a conditional on the
variable's frozen flag, so a frozen variable's update is skipped, not undone. Where that is
not enough (`SkipFrozenUpdates.methods` is empty) `guard` reads and writes back instead.
"""

from __future__ import annotations

import tensorflow as tf

from objckpt import _compat

__all__ = ["LEGACY_METHODS", "LazyFlags", "NotCovered", "SkipFrozenUpdates"]


class LazyFlags:
    """`flag(index, variable)`: the frozen flag of a Freezer variable, read from the mask
    once per graph and device of the variables updated (each replica's update reads it on
    its own device)."""

    def __init__(self, mask):
        self.mask = mask  # a FrozenMask
        self.read: dict = {}

    def __call__(self, index, variable):
        graph = tf.compat.v1.get_default_graph()
        key = (id(graph), variable.device)
        entry = self.read.get(key)
        if entry is None or entry[0] is not graph:
            with tf.device(variable.device):
                entry = self.read[key] = (graph, self.mask.flags())
        return entry[1][index]


class NotCovered(Exception):
    """The optimizer updated a guarded variable without its per-variable method."""


# The per-variable methods of OptimizerV2 (tf_keras and Keras 2 `optimizers.legacy`).
LEGACY_METHODS = ("_resource_apply_dense", "_resource_apply_sparse_duplicate_indices")


class SkipFrozenUpdates:
    """While tracing: the optimizer's per-variable update runs only if not frozen.

    Keras 3 and the tf_keras / Keras 2 optimizers call `update_step` once per
    variable (slots included) and `_apply_weight_decay` for all; their
    `optimizers.legacy` ones call `_resource_apply_dense` (or the sparse
    variant) per variable. Those methods are shadowed by instance attributes
    that wrap each variable's call in a conditional on its frozen flag.
    `seen` collects the Freezer indices that went through them.
    """

    def __init__(self, mask, optimizer, flag, methods, cond=tf.cond):
        self.mask, self.optimizer, self.flag = mask, optimizer, flag
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
        if all(callable(getattr(optimizer, name, None)) for name in LEGACY_METHODS):
            return LEGACY_METHODS  # tf_keras / Keras 2 `optimizers.legacy`
        return ()

    def __enter__(self):
        optimizer = self.optimizer
        legacy = self.methods == LEGACY_METHODS
        decay = _compat.weight_decay_method(optimizer)

        def guard(update):
            def update_one(gradient, variable, *args, **kwargs):
                index = self.mask.index_of(variable)
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
                index = self.mask.index_of(variable)
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
