"""TF1 partitioned variables (`tf.compat.v1.PartitionedVariable`) as one logical variable.

`tf.compat.v1.get_variable(..., partitioner=...)` (or a `variable_scope` with a partitioner)
makes one, in a `tf.compat.v1` graph and, in TF 2, eagerly too: a list of part variables that
split the full shape along one axis (`fixed_size_partitioner(n, axis=0)`,
`min_max_variable_partitioner`, `variable_axis_size_partitioner`), each part carrying its
`SaveSliceInfo` (the slice of the full tensor it holds). `tf.compat.v1.train.Saver` writes it
as ONE key, one slice per part: the same layout as a `ShardedVariable` saved by
`tf.train.Checkpoint`, so objckpt treats it as one (`_compat.sharded` asks here).

A `PartitionedVariable` is not a trackable: TF's object graph never reaches it, so
`tf.Module.variables`, Keras's `variables` and `tf.train.Checkpoint` leave it out silently
(the checkpoint holds nothing of it). objckpt finds it as an attribute of an object its walk
reaches (`partitioned_children`) and gives it the object path of that attribute.
`tf.compat.v1.make_template` is the exception: the template tracks its parts itself, and TF's
checkpoint (and objckpt's tree) has each part as a variable of its own (`e.Spart_0`, ...).
"""

from __future__ import annotations

import tensorflow as tf

from objckpt import errors

__all__ = ["assign_whole", "is_partitioned", "part_of", "partition_axis",
           "partitioned_children", "parts"]

_TYPE = None


def _type():
    global _TYPE
    if _TYPE is None:
        from tensorflow.python.ops import variables

        _TYPE = variables.PartitionedVariable
    return _TYPE


def is_partitioned(value) -> bool:
    """True for a TF1 `PartitionedVariable`."""
    return isinstance(value, _type())


def parts(variable) -> tuple:
    """The part variables, in the order of their offsets (TF keeps them sorted)."""
    return tuple(variable._get_variable_list())


def partition_axis(variable, path: str = "") -> int:
    """The one axis the parts split.

    Raises:
      DistributedVariableError: the parts split more than one axis (a custom partitioner):
        TF itself can neither read nor assign such a variable whole.
    """
    axes = variable._partition_axes()
    if len(axes) > 1:
        raise errors.DistributedVariableError(
            f"`{path or variable.name}` is a tf.compat.v1 PartitionedVariable split along "
            f"{len(axes)} axes ({list(variable._partitions)} parts per axis of shape "
            f"{tuple(int(d) for d in variable.shape)}); TF itself reads and assigns a "
            "partitioned variable whole only when its parts split one axis. Expected: parts "
            "along one axis. Fix: create it with a partitioner that splits one axis, e.g. "
            "tf.compat.v1.fixed_size_partitioner(n, axis=0).",
            path=path or variable.name, variable_type="PartitionedVariable")
    return axes[0]


def partitioned_children(node) -> list[tuple[str, object]]:
    """(edge name, variable) of the `PartitionedVariable`s an object holds directly (TF's
    object graph does not list them): as attributes, or as items of a list (by index) or a
    dict (by string key) that TF tracks (`self.tables = [...]` on a `tf.Module`)."""
    kind = _type()
    if isinstance(node, (list, tuple)):
        return [(str(i), value) for i, value in enumerate(node) if isinstance(value, kind)]
    if isinstance(node, dict):
        return [(key, value) for key, value in list(node.items())
                if isinstance(key, str) and isinstance(value, kind)]
    try:
        attributes = vars(node)
    except TypeError:
        return []
    return [(name, value) for name, value in list(attributes.items())
            if isinstance(value, kind)]


def assign_whole(variable, value) -> None:
    """`variable.assign(value, read_value=False)`; a partitioned variable's parts each get
    their slice of `value` (TF's own `PartitionedVariable.assign` fails with
    `read_value=False`). A Snapshot's value of a sharded variable (`sharded.ShardedValue`)
    is assigned shard by shard (`sharded.assign_sharded`): never joined on this host for a
    sharded variable."""
    from objckpt._compat.sharded import assign_sharded, is_sharded_value

    if is_sharded_value(value):
        assign_sharded(variable, value)
        return
    if not is_partitioned(variable):
        variable.assign(value, read_value=False)
        return
    axis = partition_axis(variable)
    pieces = parts(variable)
    for part, piece in zip(pieces, tf.split(value, [int(p.shape[axis]) for p in pieces],
                                            axis=axis)):
        part.assign(piece, read_value=False)


def part_of(variable):
    """(full name, full shape, offsets, shape) of the slice a plain variable holds when it is
    one part of a TF1 partitioned variable tracked part by part (`tf.compat.v1.make_template`
    tracks its parts as variables of their own, each with its `SaveSliceInfo`); else None."""
    info = getattr(variable, "_save_slice_info", None)
    if info is None or not getattr(info, "full_name", None):
        return None
    return (info.full_name, tuple(int(d) for d in info.full_shape),
            tuple(int(d) for d in info.var_offset), tuple(int(d) for d in info.var_shape))
