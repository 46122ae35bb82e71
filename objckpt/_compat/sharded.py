"""Sharded variables (`ShardedVariable`, ParameterServerStrategy with a `variable_partitioner`)
as one logical variable: their shards and layout, the logical value read, and the slices
`tf.train.Checkpoint` saves them as (`ShardedVariable.assign` gives each shard its rows).

A `ShardedVariable` of shape (rows, ...) is a list of variables (its shards, usually one on each
parameter server) that split the rows: shard i holds rows [offset_i, offset_i + rows_i). TF saves
it as one tensor of the full shape, written as one slice per shard (`Variable.SaveSliceInfo`),
so a checkpoint does not depend on the number of shards: a value restores into any layout.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from objckpt._compat.partitioned import is_partitioned, partition_axis, parts

__all__ = [
    "Layout",
    "io_device",
    "io_devices",
    "is_caching_type",
    "is_sharded",
    "is_sharded_type",
    "new_sharded",
    "read_sharded",
    "save_order",
    "shard_layout",
    "shard_slices",
    "shards",
]

_SHARDED = None


def _mixin():
    global _SHARDED
    if _SHARDED is None:
        from tensorflow.python.distribute import sharded_variable

        _SHARDED = sharded_variable.ShardedVariableMixin
    return _SHARDED


def is_sharded(value) -> bool:
    """True for a `ShardedVariable` (or another `ShardedVariableMixin`), and for a TF1
    `PartitionedVariable` (`_compat.partitioned`), saved the same way."""
    return isinstance(value, _mixin()) or is_partitioned(value)


def is_sharded_type(cls) -> bool:
    """True for the class of a sharded variable."""
    return issubclass(cls, _mixin())


def is_caching_type(cls) -> bool:
    """True for ParameterServerStrategy's `CachingVariable`: a variable on a parameter server
    (a shard, or a variable left whole) whose reads workers may cache; a plain resource
    variable on the same device holds its state."""
    return any(k.__name__ == "CachingVariable" and k.__module__.endswith("ps_values")
               for k in cls.__mro__)


def new_sharded(like, parts):
    """A `ShardedVariable` of the variables `parts` (shards of like's layout), named like
    `like`."""
    from tensorflow.python.distribute import sharded_variable

    return sharded_variable.ShardedVariable(list(parts), name=like.name)


def shards(variable) -> tuple:
    """The shard variables of a sharded variable, in row order (a partitioned one's parts)."""
    return parts(variable) if is_partitioned(variable) else tuple(variable.variables)


class Layout(NamedTuple):
    """How a sharded variable splits its rows.

    Attributes:
      shape: the logical (full) shape.
      rows: the first-axis length of each shard, in order (along `axis`).
      devices: the device of each shard ("" when unknown).
      axis: the axis the shards split (0; a TF1 partitioned variable's may be another).
      unit: "shard", or "part" for a TF1 partitioned variable.
    """

    shape: tuple
    rows: tuple
    devices: tuple
    axis: int = 0
    unit: str = "shard"

    @property
    def offsets(self) -> tuple:
        out, start = [], 0
        for count in self.rows:
            out.append(start)
            start += count
        return tuple(out)

    def describe(self) -> str:
        """e.g. "2 shards of rows [0:6) [6:10)"."""
        spans = " ".join(f"[{o}:{o + r})" for o, r in zip(self.offsets, self.rows))
        word = {0: "rows", 1: "columns"}.get(self.axis, f"axis {self.axis}")
        unit = self.unit + ("s" if len(self.rows) != 1 else "")
        return f"{len(self.rows)} {unit} of {word} {spans}"


def shard_layout(variable) -> Layout:
    """The `Layout` of a sharded variable."""
    pieces = shards(variable)
    axis = partition_axis(variable) if is_partitioned(variable) else 0
    return Layout(tuple(int(d) for d in variable.shape),
                  tuple(int(p.shape[axis]) for p in pieces),
                  tuple(getattr(p, "device", "") or "" for p in pieces),
                  axis, "part" if is_partitioned(variable) else "shard")


def shard_slices(variable, value=None) -> list[tuple[str, object]]:
    """`(slice spec, tensor)` for each shard, as `tf.train.Checkpoint` saves a sharded
    variable: the spec is `Variable.SaveSliceInfo(...).spec` (e.g. "10 4 6,4:0,4"), the
    tensor the shard's value read on its device, or its rows of `value` (a logical value
    read before, e.g. a Snapshot's) when given."""
    full = [int(d) for d in variable.shape]
    layout = shard_layout(variable)  # a partitioned variable's parts may split another axis
    out = []
    for offset, part in zip(layout.offsets, shards(variable)):
        info = tf.Variable.SaveSliceInfo(
            full_name=variable.name, full_shape=full,
            var_offset=[offset if axis == layout.axis else 0 for axis in range(len(full))],
            var_shape=[int(d) for d in part.shape])
        rows = int(part.shape[layout.axis])
        out.append((info.spec, part.value() if value is None else value[
            (slice(None),) * layout.axis + (slice(offset, offset + rows),)]))
    return out


def _task(spec) -> tuple:
    return (spec.job, spec.replica or 0, spec.task or 0)


def _host_task() -> tuple:
    """(job, replica, task) of this process (("localhost", 0, 0) outside a cluster)."""
    with tf.init_scope():
        with tf.device("/cpu:0"):
            here = tf.constant(0).device
    return _task(tf.DeviceSpec.from_string(here))


def io_device(device: str, host: tuple | None = None) -> str:
    """Where a value on `device` is read and written, as `tf.train.Checkpoint` does it: the
    CPU of the task holding it (a parameter server writes and reads its own shards, so
    their bytes never cross this host), or "/cpu:0" (this host) for a device of this
    process or one without a task. `host`: this process's `(job, replica, task)` when
    known (`io_devices` finds it once for many)."""
    if not device:
        return "/cpu:0"
    spec = tf.DeviceSpec.from_string(device)
    if spec.job is None or _task(spec) == (host or _host_task()):
        return "/cpu:0"
    return tf.DeviceSpec(job=spec.job, replica=spec.replica or 0, task=spec.task or 0,
                         device_type="CPU", device_index=0).to_string()


def io_devices(devices) -> list[str]:
    """`io_device` of each of `devices`."""
    host = _host_task()
    return [io_device(device, host) for device in devices]


def save_order(devices) -> list[int]:
    """The order in which `tf.train.Checkpoint` writes (and its index lists) the slices of
    sharded variables, given the devices of every tensor saved, in the order of the keys:
    grouped by task in the order the tasks first appear (TF 2.16 and later: its saver
    shards by task), else sorted by device (TF 2.12-2.15: one part per device, in sorted
    order)."""
    from tensorflow.python.checkpoint import functional_saver

    devices = list(devices)
    if hasattr(functional_saver.MultiDeviceSaver, "_get_shards_by_task"):
        first = {}
        for device in devices:
            spec = tf.DeviceSpec.from_string(device or "")
            first.setdefault(_task(spec), len(first))
        rank = [first[_task(tf.DeviceSpec.from_string(d or ""))] for d in devices]
        return sorted(range(len(devices)), key=lambda i: rank[i])
    return sorted(range(len(devices)), key=lambda i: devices[i])


def read_sharded(variable):
    """The logical value: every shard read (on its own device) and joined along rows."""
    values = [part.value() if hasattr(part, "value") else tf.convert_to_tensor(part)
              for part in shards(variable)]
    axis = partition_axis(variable) if is_partitioned(variable) else 0
    return values[0] if len(values) == 1 else tf.concat(values, axis=axis)
