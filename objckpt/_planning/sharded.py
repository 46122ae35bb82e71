"""Sharded variables restored from a local TF checkpoint one shard at a time.

A `ShardedVariable` (ParameterServerStrategy with a partitioner) is one logical variable in a
plan. Restored whole, its value would be assembled on this host (the coordinator): the whole
table in memory. `SlicedLoader` reads each shard's rows of the checkpoint's tensor with one
`RestoreV2` of that slice (TF's reader takes the stored slices that overlap it, whatever
shard count wrote them) and assigns them to that shard before it reads the next, so beyond
the model this host holds one shard at a time. The fetch stage wraps it in its undo log
(`_fetch.Streamed`): each shard's old value is logged before it is assigned and a failure
half way puts every shard (and every other variable) back.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from objckpt import _compat

__all__ = ["Job", "SlicedLoader", "jobs"]


class Job(NamedTuple):
    """One read and one assign: `key` (its `spec`: a slice, "" for the whole tensor) of
    stored dtype `dtype` into `variable` (a shard, or a whole variable)."""

    key: str
    spec: str
    dtype: object
    variable: object
    label: str


def jobs(keys, dtypes, targets, labels) -> list[Job]:
    """The reads of a plan's entries: one per shard of a sharded target, one per other."""
    out = []
    for key, dtype, target, label in zip(keys, dtypes, targets, labels):
        if _compat.is_sharded(target):
            for (spec, _), part in zip(_compat.shard_slices(target, value=_NO_VALUE),
                                       _compat.shards(target)):
                out.append(Job(key, spec, dtype, part, f"{label} (rows {_rows(spec)})"))
        else:
            out.append(Job(key, "", dtype, target, label))
    return out


class _NoValue:
    """Stands for a logical value not read: `shard_slices` then gives only the specs."""

    def __getitem__(self, rows):
        return None


_NO_VALUE = _NoValue()


def _rows(spec: str) -> str:
    """The rows of a slice spec ("10 4 6,4:0,4" -> "[6:10)")."""
    first = spec.split(" ")[-1].split(":")[0]
    start, length = (int(n) for n in first.split(","))
    return f"[{start}:{start + length})"


def read_slice(prefix: str, job: Job):
    """The stored values of one job, read on this host's CPU."""
    with tf.device("/cpu:0"):
        return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[job.key],
                                    shape_and_slices=[job.spec], dtypes=[job.dtype])[0]


class SlicedLoader:
    """A streamed loader (`verify`, `assign`, `close`) of `jobs` from the local TF checkpoint
    `prefix`: each value read (`read_slice`) just before `assign_to(variable, value)` assigns
    it, one at a time. The plan checked every shape and dtype from the index before."""

    def __init__(self, prefix: str, job_list: list[Job], assign_to):
        self.prefix = prefix
        self.jobs = list(job_list)
        self._assign_to = assign_to

    def verify(self) -> None:
        """Nothing more to check: TF's reader checks each slice's checksum as it reads it."""

    def assign(self) -> None:
        for job in self.jobs:
            value = read_slice(self.prefix, job)
            self._assign_to(job.variable, value)
            del value  # one shard at a time

    def close(self) -> None:
        self.jobs = []
