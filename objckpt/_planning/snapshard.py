"""A Snapshot's values restored where sharded variables are involved, a shard at a time.

A Snapshot holds a sharded variable's value as a `ShardedValue` (`_compat.sharded`): its
shards' values, each left where its shard lives (a parameter server). Restoring it never
joins the shards on this host (the coordinator) unless the target is itself one variable
here: each target shard gets its rows (`_compat.shard_rows`): with the same layout, the
source shard itself, on the shard's own device; with another layout (or from a whole value
of a plain model's Snapshot), the pieces of the source shards holding those rows, joined on
the target shard's device, one target shard at a time.

All or nothing as on the streamed routes: `HeldLoader.assign` gives every variable to the
recorder (`_sharded.Recorder`), which keeps its old value first (on the parameter server
holding it, or written to the undo log's file for a variable of this host), so a failure
half way puts every shard and every other variable back (`_fetch.Streamed`).
"""

from __future__ import annotations

import tensorflow as tf

from objckpt import _compat
from objckpt._planning import sharded as _sharded

__all__ = ["HeldLoader", "held_pairs", "loader"]


def held_pairs(variables, the_plan, values) -> list:
    """`(value, variable, label)` of a Snapshot's values for a plan (None: the whole tree
    of `variables`, in order)."""
    if the_plan is None:
        return [(value, variable, path)
                for (path, variable), value in zip(variables.items(), values)]
    return [(value, variables[m.target], the_plan.label(m.target))
            for m, value in zip(the_plan.matches, values)]


def loader(pairs) -> tuple | None:
    """(a `HeldLoader`, its recorder) restoring `(value, variable, label)` pairs of values
    in memory (a Snapshot's), or None (then assigned as before, whole) where no value is a
    `ShardedValue` and no variable is sharded, or inside a `tf.function` being traced."""
    if not tf.executing_eagerly() or not any(
            _compat.is_sharded_value(value) or _compat.is_sharded(variable)
            for value, variable, _ in pairs):
        return None
    job_list = _jobs(pairs)
    recorder = _sharded.Recorder(job_list)
    return HeldLoader(pairs, job_list, recorder), recorder


def _jobs(pairs) -> list:
    """One `_sharded.Job` per variable assigned (each shard of a sharded one), for the
    recorder: where it lives (`_compat.io_device`) and how errors name it."""
    out = []
    for _, variable, label in pairs:
        if _compat.is_sharded(variable):
            layout = _compat.shard_layout(variable)
            for part, offset, count in zip(_compat.shards(variable), layout.offsets,
                                           layout.rows):
                out.append((part, f"{label} (rows [{offset}:{offset + count}))"))
        else:
            out.append((variable, label))
    devices = _compat.io_devices([getattr(v, "device", "") or "" for v, _ in out])
    return [_sharded.Job(label, "", v.dtype.base_dtype, v, label, device)
            for (v, label), device in zip(out, devices)]


class HeldLoader:
    """A loader (`verify`, `assign`, `close`, as `_fetch.Streamed` drives it) of values in
    memory into their variables: sharded variables first, a shard at a time (each its rows,
    cast to its dtype where the plan admitted a cast, on its own device), then the others,
    every one through `assign_to(variable, value)` (the recorder)."""

    def __init__(self, pairs, job_list, assign_to):
        self.pairs = list(pairs)
        self._device = {id(job.variable): job.device for job in job_list}
        self._assign_to = assign_to

    def verify(self) -> None:
        """Nothing to read: the plan checked every shape and dtype of the values held."""

    def assign(self) -> None:
        first = [p for p in self.pairs if _compat.is_sharded(p[1])]
        rest = [p for p in self.pairs if not _compat.is_sharded(p[1])]
        for value, variable, _ in first + rest:
            _compat.assign_sharded(variable, value, self._one)

    def _one(self, variable, value) -> None:
        """One variable (a shard) given its value: cast where it lives, then assigned."""
        if value.dtype.base_dtype != variable.dtype.base_dtype:
            with tf.device(self._device[id(variable)]):
                value = _compat.cast_value(value, variable)
        self._assign_to(variable, value)

    def close(self) -> None:
        self.pairs = []
