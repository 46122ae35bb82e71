"""What `Freezer` needs to know about the graph it is traced into, and about sharded variables.

XLA (a `tf.function(jit_compile=True)`, Keras' `compile(jit_compile=True)`) compiles a
conditional only when both branches return tensors of the same shapes.

A `ShardedVariable` (ParameterServerStrategy with a partitioner) has no `trainable` of its
own: its shards have, and optimizers train the shards (tf_keras keeps their state shard by
shard). A Freezer freezes it whole, so it knows every object that stands for one of its
shards, and keeps its frozen set on a parameter server, where the workers' steps read it.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import control_flow_util as _control_flow_util

from objckpt._compat.sharded import is_caching_type, is_sharded, shards

__all__ = ["in_xla_context", "mask_device", "part_aliases", "shard_aliases",
           "sharded_trainable"]


def in_xla_context() -> bool:
    """Whether the graph being built (or one it is nested in) will be compiled by XLA."""
    if tf.executing_eagerly():
        return False
    return bool(_control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def sharded_trainable(variable):
    """A sharded variable's `trainable`: its shards' one flag; None where they disagree."""
    flags = {bool(getattr(part, "trainable", True)) for part in shards(variable)}
    return flags.pop() if len(flags) == 1 else None


def shard_aliases(variable) -> tuple:
    """Every object that stands for one of a sharded variable's shards (optimizers get the
    shards, or the variables ParameterServerStrategy's `CachingVariable`s wrap); () for a
    variable that is not sharded."""
    if not is_sharded(variable):
        return ()
    return tuple(alias for part in shards(variable) for alias in part_aliases(part))


def part_aliases(part) -> tuple:
    """A shard, and the variable it wraps when it is a `CachingVariable`."""
    inner = part.__dict__.get("_v") if is_caching_type(type(part)) else None
    return (part,) if inner is None else (part, inner)


def mask_device(variables):
    """Where a Freezer's frozen set lives: None (this host) unless `variables` live on
    ParameterServerStrategy's parameter servers (a sharded variable, or any on a `ps` job),
    where the workers' traced steps read it: then the first such variable's device."""
    for variable in variables:
        parts = shards(variable) if is_sharded(variable) else (variable,)
        for part in parts:
            device = getattr(part, "device", "") or ""
            if "/job:ps" in device:
                return device
    return None
