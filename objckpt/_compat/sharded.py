"""Sharded variables (`ShardedVariable`, ParameterServerStrategy with a `variable_partitioner`)
as one logical variable: their shards and layout, the logical value read, and the slices
`tf.train.Checkpoint` saves them as (`ShardedVariable.assign` gives each shard its rows).

A `ShardedVariable` of shape (rows, ...) is a list of variables (its shards, usually one on each
parameter server) that split the rows: shard i holds rows [offset_i, offset_i + rows_i). TF saves
it as one tensor of the full shape, written as one slice per shard (`Variable.SaveSliceInfo`),
so a checkpoint does not depend on the number of shards: a value restores into any layout.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from objckpt._compat.partitioned import is_partitioned, partition_axis, parts

__all__ = [
    "HeldLoader",
    "Layout",
    "ShardedValue",
    "assign_sharded",
    "io_device",
    "io_devices",
    "is_caching_type",
    "is_sharded",
    "is_sharded_type",
    "is_sharded_value",
    "new_sharded",
    "read_sharded",
    "read_shards",
    "save_order",
    "shard_layout",
    "shard_rows",
    "shard_slices",
    "shards",
    "slice_specs",
    "sliced_entries",
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


def slice_specs(layout: Layout) -> list[str]:
    """The slice spec of each shard of `layout`, as `tf.train.Checkpoint` saves a sharded
    variable: `Variable.SaveSliceInfo(...).spec` (e.g. "10 4 6,4:0,4")."""
    full = list(layout.shape)
    return [tf.Variable.SaveSliceInfo(
        full_name="", full_shape=full,
        var_offset=[offset if axis == layout.axis else 0 for axis in range(len(full))],
        var_shape=[rows if axis == layout.axis else full[axis] for axis in range(len(full))]).spec
        for offset, rows in zip(layout.offsets, layout.rows)]


def shard_slices(variable, value) -> list[tuple[str, object]]:
    """`(slice spec, tensor)` for each shard of a sharded variable (`slice_specs`), the
    tensor its rows of `value` (a logical value read before, e.g. a Snapshot's taken in a
    `tf.function`)."""
    layout = shard_layout(variable)  # a partitioned variable's parts may split another axis
    lead = (slice(None),) * layout.axis
    return [(spec, value[(*lead, slice(offset, offset + rows))])
            for spec, offset, rows in zip(slice_specs(layout), layout.offsets, layout.rows)]


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
    return read_shards(variable).join()


# --- a sharded variable's value held shard by shard (a Snapshot's) ------------------------


class ShardedValue:
    """The value of a sharded variable held as its shards' values, each where its shard
    lives: what `objckpt.snapshot` holds for a `ShardedVariable` (or a TF1
    `PartitionedVariable`), so a snapshot costs no memory on this host (the coordinator).

    It stands for one tensor of the logical (full) shape: `shape` (a `tf.TensorShape`),
    `dtype` (a `tf.DType`), `nbytes`, `ndim` and `len()` are the whole variable's, and
    `tf.convert_to_tensor(value)`, `np.asarray(value)`, `numpy()` and every TF op given it
    join the shards into one tensor on this host (the whole variable's memory: only what
    needs one tensor pays for it). `rows(start, stop)` and indexing by a run of rows
    (`value[6:10]`) join only the shards that hold those rows; a run that is exactly one
    shard is that shard's tensor, not a copy.

    Attributes:
      shards: the shards' values (tensors), in order along `layout.axis`, each on the
        device of its shard.
      layout: the `Layout` they split the logical shape by.
    """

    __slots__ = ("layout", "shards")

    def __init__(self, shards, layout: Layout):
        _register_conversion()
        self.shards = tuple(shards)
        self.layout = layout

    @property
    def shape(self) -> tf.TensorShape:
        return tf.TensorShape(self.layout.shape)

    @property
    def dtype(self) -> tf.DType:
        return self.shards[0].dtype

    @property
    def ndim(self) -> int:
        return len(self.layout.shape)

    @property
    def nbytes(self) -> int:
        return self.shape.num_elements() * self.dtype.size

    def get_shape(self) -> tf.TensorShape:
        return self.shape

    def __len__(self) -> int:
        if not self.layout.shape:
            raise TypeError("len() of a scalar")
        return self.layout.shape[0]

    def join(self, device: str | None = None):
        """The logical value as one tensor (on `device`; None: this host's default): the
        whole variable's memory there."""
        if len(self.shards) == 1:
            return self.shards[0]
        with _on(device):
            return tf.concat(list(self.shards), axis=self.layout.axis)

    def numpy(self):
        """The logical value as one NumPy array on this host (the whole variable)."""
        return np.concatenate([np.asarray(s) for s in self.shards], axis=self.layout.axis) \
            if len(self.shards) > 1 else np.asarray(self.shards[0])

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def rows(self, start: int, stop: int, device: str | None = None):
        """Rows [start, stop) along `layout.axis` as one tensor: each shard holding some of
        them sliced on its own device, the pieces joined on `device` (None: this host's
        default); a run that is exactly one shard is its tensor (no copy)."""
        return shard_rows(self, start, stop, device)

    def slices(self) -> list[tuple[str, object]]:
        """`(slice spec, tensor)` of each shard, as `tf.train.Checkpoint` saves a sharded
        variable (`shard_slices`), from the shards held."""
        return list(zip(slice_specs(self.layout), self.shards))

    def __getitem__(self, key):
        run = _row_run(key, self.layout)
        if run is not None:
            return self.rows(*run)
        return self.join()[key]

    def __repr__(self) -> str:
        return (f"<ShardedValue shape={tuple(self.layout.shape)} dtype={self.dtype.name} "
                f"{self.layout.describe()}>")


def _joined(name: str):
    def method(self, *args):
        return getattr(self.join(), name)(*args)

    method.__name__ = name
    method.__doc__ = f"`tf.Tensor.{name}` of the shards joined (the whole variable here)."
    return method


# Arithmetic as a tensor's (`snap["table"] * 2`): on the shards joined, one tensor here.
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
              "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__neg__", "__abs__",
              "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(ShardedValue, _name, _joined(_name))
del _name


def sliced_entries(keys, values) -> tuple[list, list, list | None]:
    """(keys, tensors, slice specs or None) to write `values` under `keys` as
    `tf.train.Checkpoint` writes them: a `ShardedValue` as one slice per shard under its key
    (each shard's tensor where it lives), every other value whole (spec ""); None for the
    specs when nothing is sliced."""
    out_keys, tensors, specs = [], [], []
    for key, value in zip(keys, values):
        for spec, part in (value.slices() if is_sharded_value(value) else (("", value),)):
            out_keys.append(key)
            tensors.append(part)
            specs.append(spec)
    return out_keys, tensors, (specs if any(specs) else None)


def is_sharded_value(value) -> bool:
    """True for a `ShardedValue` (a Snapshot's value of a sharded variable)."""
    return isinstance(value, ShardedValue)


def read_shards(variable) -> ShardedValue:
    """A sharded variable's value as a `ShardedValue`: each shard read on its own device
    without a copy (its buffer shared until the shard is next written)."""
    values = [part.value() if hasattr(part, "value") else tf.convert_to_tensor(part)
              for part in shards(variable)]
    layout = shard_layout(variable)
    return ShardedValue(values, Layout(layout.shape, layout.rows, tuple(v.device for v in values),
                                       layout.axis, layout.unit))


def shard_rows(value, start: int, stop: int, device: str | None = None, axis: int = 0):
    """Rows [start, stop) along the split axis of a logical value: of a `ShardedValue`,
    only the shards holding them (each sliced on its own device, the pieces joined on
    `device`; split along another axis than `axis`, each shard's part of those rows);
    of a tensor, its slice (taken on its own device). Never the whole value joined."""
    if not is_sharded_value(value):
        lead = (slice(None),) * axis
        if start == 0 and stop == int(value.shape[axis]):
            return value
        with _on(getattr(value, "device", None) or None):
            return value[(*lead, slice(start, stop))]
    layout, pieces = value.layout, []
    if layout.axis != axis:  # split along another axis: every shard's part of those rows
        for shard in value.shards:
            with _on(shard.device):
                pieces.append(shard[(slice(None),) * axis + (slice(start, stop),)])
        with _on(device):
            return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=layout.axis)
    lead = (slice(None),) * layout.axis
    for offset, count, shard in zip(layout.offsets, layout.rows, value.shards):
        first, last = max(start, offset), min(stop, offset + count)
        if first >= last:
            continue
        if (first, last) == (offset, offset + count):
            pieces.append(shard)
            continue
        with _on(shard.device):
            pieces.append(shard[(*lead, slice(first - offset, last - offset))])
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        shape = list(layout.shape)
        shape[layout.axis] = 0
        with _on(device):
            return tf.zeros(shape, value.dtype)
    with _on(device):
        return tf.concat(pieces, axis=layout.axis)


def assign_sharded(variable, value, assign=None) -> None:
    """Assigns a logical value (a tensor or a `ShardedValue`) to `variable` without joining
    it on this host unless `variable` is itself one variable here: a sharded variable's
    shards one at a time, each given its rows (`shard_rows`, assembled on the shard's own
    device; at most one shard's rows at a time); any other variable the value joined on its
    device. `assign(variable, value)` assigns one (default: `variable.assign`)."""
    assign = assign or _assign
    if not is_sharded(variable):
        whole = value.join(getattr(variable, "device", None) or None) \
            if is_sharded_value(value) else value
        assign(variable, whole)
        return
    layout = shard_layout(variable)
    for offset, count, part in zip(layout.offsets, layout.rows, shards(variable)):
        rows = shard_rows(value, offset, offset + count, getattr(part, "device", None) or None,
                          layout.axis)
        assign(part, rows)
        del rows  # one shard's rows at a time


def _assign(variable, value) -> None:
    variable.assign(value, read_value=False)


def _on(device):
    """`tf.device(device)`, or no scope for None or ""."""
    return tf.device(device) if device else contextlib.nullcontext()


def _row_run(key, layout: Layout):
    """(start, stop) when `key` selects one run of rows along the layout's axis with every
    other axis whole (`value[a:b]`, `value[:, a:b]` for axis 1), else None."""
    key = key if isinstance(key, tuple) else (key,)
    if len(key) > len(layout.shape) or len(key) <= layout.axis:
        return None
    if any(k != slice(None) for i, k in enumerate(key) if i != layout.axis):
        return None
    run = key[layout.axis]
    if not isinstance(run, slice) or run.step not in (None, 1):
        return None
    start, stop, _ = run.indices(layout.shape[layout.axis])
    return start, max(start, stop)


_CONVERSION = []


def _register_conversion() -> None:
    """`tf.convert_to_tensor(ShardedValue)` (and any TF op given one) joins its shards;
    registered once, when the first one is made."""
    if _CONVERSION:
        return
    _CONVERSION.append(True)

    def convert(value, dtype=None, name=None, as_ref=False):
        del dtype, name, as_ref  # TF checks the dtype asked for against the result
        return value.join()

    tf.register_tensor_conversion_function(ShardedValue, convert)


class HeldLoader:
    """Assigns values held in memory (a Snapshot's: tensors and `ShardedValue`s) to their
    variables, sharded ones first, a shard at a time (`assign_sharded`: each shard its rows,
    cast to its dtype where they differ, on the device that reads and writes it), then the
    others; every one through `assign_to(variable, value)` (the restore pipeline's recorder,
    which keeps each old value first). A loader as the pipeline's streamed routes drive it
    (`verify`, `assign`, `close`).

    Args:
      pairs: `(value, variable, label)` of each variable to assign.
      assign_to: `assign_to(variable, value)` assigns one variable (a shard).
    """

    def __init__(self, pairs, assign_to):
        self.pairs = list(pairs)
        self._assign_to = assign_to
        self._device = {}

    @staticmethod
    def targets(pairs) -> list[tuple[object, str]]:
        """`(variable, label)` of every variable `HeldLoader(pairs, ...)` assigns: each shard
        of a sharded one ("table (rows [0:5))"), each other one."""
        out = []
        for _, variable, label in pairs:
            if not is_sharded(variable):
                out.append((variable, label))
                continue
            layout = shard_layout(variable)
            out.extend((part, f"{label} (rows [{offset}:{offset + count}))")
                       for part, offset, count in zip(shards(variable), layout.offsets,
                                                      layout.rows))
        return out

    def verify(self) -> None:
        """Nothing to read: the plan checked every shape and dtype of the values held."""

    def assign(self) -> None:
        """Every pair assigned: the sharded variables first, then the others."""
        targets = [v for v, _ in self.targets(self.pairs)]
        self._device = dict(zip((id(v) for v in targets),
                                io_devices([getattr(v, "device", "") or "" for v in targets])))
        ordered = sorted(self.pairs, key=lambda pair: not is_sharded(pair[1]))
        for value, variable, _ in ordered:
            assign_sharded(variable, value, self._one)

    def _one(self, variable, value) -> None:
        """One variable (a shard) given its value: cast where it lives, then assigned."""
        if value.dtype.base_dtype != variable.dtype.base_dtype:
            with _on(self._device.get(id(variable))):
                value = tf.cast(value, variable.dtype.base_dtype)
        self._assign_to(variable, value)

    def close(self) -> None:
        self.pairs = []
