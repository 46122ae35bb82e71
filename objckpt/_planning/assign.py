"""The assign and refresh stages of the one restore pipeline: checked values into variables.

Nothing here checks: the stages before (plan, check, fetch, agree) did, so every value
assigned here fits its variable. Then state Keras layers derive from variables
(Normalization's cached mean, a LoRA layer's factors) is refreshed (`refresh`).
"""

from __future__ import annotations

import tensorflow as tf

from objckpt import _compat
from objckpt._planning import match as _match

__all__ = ["assign_pairs", "assign_plan", "start_fresh"]


def assign_plan(variables, the_plan: _match.Plan | None, values) -> None:
    """Assigns a plan's values (None: the whole tree, in order), fused into one grouped
    assign when they cover the whole tree in its order."""
    if the_plan is None or (len(the_plan.matches) == len(variables) and all(
            m.target == p for m, p in zip(the_plan.matches, variables))):
        variables.fused.assign_all(values)
    else:
        for match, value in zip(the_plan.matches, values):
            _compat.assign_whole(variables[match.target], value)


def assign_pairs(pairs) -> None:
    """Assigns `(variable, value)` pairs eagerly, each replica as `tf.train.Checkpoint`
    restores it, also for a variable created inside `strategy.run` (a replica context,
    where a distributed variable's own assign writes one replica, or a SUM variable's
    value in full) or while a tf.function is being traced."""
    for variable, value in pairs:
        if not _compat.restore_components(variable, value):
            with tf.init_scope():
                _compat.assign_whole(variable, value)


def start_fresh(obj, variables, the_plan: _match.Plan | None) -> None:
    """Gives the optimizer slots of `the_plan.fresh` a fresh optimizer's value: their variable
    was restored, but the source's optimizer held no state for it."""
    for path, role in () if the_plan is None else the_plan.fresh:
        variable = variables[path]
        variable.assign(_compat.fresh_slot_value(obj, role, variable), read_value=False)
